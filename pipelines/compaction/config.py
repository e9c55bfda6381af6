"""What the compaction job reads from ``conf/pipeline.toml`` and the broker's topic configs.

Which topics are compacted (:func:`compacted_topics`): every topic whose topic config in a log
dir (``<log_dir>/topic-configs/<topic>.properties``) has ``cleanup.policy`` containing
``compact``, plus every topic named in ``[compact] topics``. With no log dirs (``[paths]
log_dirs = []``) the topic configs come from ``[ingest] bootstrap_servers`` (DescribeConfigs
over the topics Metadata lists, connecting as ``[kafka]`` says), so the tables are the same
as with log dirs; without either, only ``[compact] topics``. A topic's strategy: ``[compact.
strategy] <topic> = "..."``, else its topic config ``compaction.strategy`` (KIP-280's name),
else ``[compact] default_strategy`` (``offset``). Whether a topic's table is created with
deletion vectors (:meth:`CompactConfig.deletion_vectors_for`): ``[compact.deletion_vectors]
<topic> = false``, else ``[compact] default_deletion_vectors`` (true).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from logstore.errors import LoglakeError
from logstore.objectstore import LakeLocation
from logstore.storage.files import validate_topic
from logstore.storage.topic_config import is_compacted, read_topic_configs
from logstore.tools.client_config import ClientConfig
from pipelines.compaction.model import DEFAULT_STRATEGY, Strategy, parse_strategy
from pipelines.config import (
    PARQUET_CODECS,
    job_settings,
    kafka_client_config,
    read_pipeline_toml,
)

__all__ = ["CompactConfig", "compacted_topics", "load_compact_config"]


@dataclass(frozen=True)
class CompactConfig:
    """A compaction run's settings (see ``conf/pipeline.toml`` ``[compact]`` for each key)."""

    log_dirs: tuple[str, ...]
    lake: str
    app_name: str = "loglake-compact"
    master: str | None = None
    topics: tuple[str, ...] = ()
    default_strategy: Strategy = DEFAULT_STRATEGY
    strategies: dict[str, Strategy] = field(default_factory=dict)
    buckets: int = 16
    compression: str = "zstd"
    max_rows_per_file: int = 5_000_000
    spark_conf: dict[str, str] = field(default_factory=dict)
    bootstrap_servers: str = ""  # [ingest]: the topic configs when there is no log dir
    kafka: ClientConfig | None = None  # [kafka]: how to connect to it
    default_deletion_vectors: bool = True
    deletion_vectors: dict[str, bool] = field(default_factory=dict)

    def deletion_vectors_for(self, topic: str) -> bool:
        """Whether ``topic``'s table takes deletion vectors (``[compact.deletion_vectors]``,
        else ``default_deletion_vectors``)."""
        return self.deletion_vectors.get(topic, self.default_deletion_vectors)

    @property
    def records_path(self) -> str:
        return LakeLocation.parse(self.lake).join("records").uri


def _table(data: dict[str, Any], name: str, where: str) -> dict[str, Any]:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise LoglakeError(f"[{name}] must be a table", path=where)
    return value


def load_compact_config(
    path: str | Path,
    *,
    log_dirs: list[str] | None = None,
    lake: str | None = None,
) -> CompactConfig:
    """Read ``[paths]``, ``[spark]`` and ``[compact]`` of a pipeline TOML file, then overrides.

    Unknown ``[compact]`` keys, bad strategies, topic names and bucket counts are refused.
    """
    p = Path(path)
    where = str(p)
    data = read_pipeline_toml(p)
    compact = _table(data, "compact", where)
    common = job_settings(data, p, "compact", log_dirs=log_dirs, lake=lake, need_log_dirs=False)
    topics = [str(t) for t in compact.get("topics", [])]
    for t in topics:
        validate_topic(t)
    raw_strategies = compact.get("strategy", {})
    if not isinstance(raw_strategies, dict):
        raise LoglakeError("[compact.strategy] must be a table of topic = strategy", path=where)
    strategies = {validate_topic(str(t)): parse_strategy(str(s)) for t, s in raw_strategies.items()}
    buckets = compact.get("buckets", 16)
    if not isinstance(buckets, int) or not 1 <= buckets <= 65536:
        raise LoglakeError(f"[compact] buckets must be 1..65536, got {buckets!r}", path=where)
    raw_dvs = compact.get("deletion_vectors", {})
    if not isinstance(raw_dvs, dict) or not all(isinstance(v, bool) for v in raw_dvs.values()):
        raise LoglakeError(
            "[compact.deletion_vectors] must be a table of topic = true/false", path=where
        )
    default_dvs = compact.get("default_deletion_vectors", True)
    if not isinstance(default_dvs, bool):
        raise LoglakeError(
            f"[compact] default_deletion_vectors must be true or false, got {default_dvs!r}",
            path=where,
        )
    compression = str(compact.get("compression", "zstd"))
    if compression not in PARQUET_CODECS:
        raise LoglakeError(
            f"[compact] compression must be one of {', '.join(PARQUET_CODECS)}, "
            f"got {compression!r}",
            path=where,
        )
    return CompactConfig(
        log_dirs=common.log_dirs,
        lake=common.lake,
        app_name=common.app_name,
        master=common.master,
        topics=tuple(topics),
        default_strategy=parse_strategy(str(compact.get("default_strategy", "offset"))),
        strategies=strategies,
        buckets=buckets,
        compression=compression,
        max_rows_per_file=int(compact.get("max_rows_per_file", 5_000_000)),
        spark_conf=common.spark_conf,
        bootstrap_servers=str(_table(data, "ingest", where).get("bootstrap_servers", "")),
        kafka=kafka_client_config(data, p),
        default_deletion_vectors=default_dvs,
        deletion_vectors={validate_topic(str(t)): v for t, v in raw_dvs.items()},
    )


def compacted_topics(config: CompactConfig) -> dict[str, Strategy]:
    """``{topic: strategy}`` for every topic to compact (see the module docstring)."""
    found: dict[str, dict[str, str]] = {}
    if not config.log_dirs and config.bootstrap_servers:
        from pipelines.sources.fetch import cluster_topics, topic_configs  # noqa: PLC0415

        bootstrap, kafka = config.bootstrap_servers, config.kafka
        every = topic_configs(bootstrap, cluster_topics(bootstrap, config=kafka), config=kafka)
        for topic, props in every.items():
            if is_compacted(props):
                found[topic] = props
    for d in config.log_dirs:
        if not Path(d).is_dir():
            raise LoglakeError("log dir does not exist", path=d)
        for topic, props in read_topic_configs(d).items():
            if is_compacted(props):
                found[topic] = props
    for topic in config.topics:
        found.setdefault(topic, {})
    out: dict[str, Strategy] = {}
    for topic, props in sorted(found.items()):
        if topic in config.strategies:
            out[topic] = config.strategies[topic]
        elif "compaction.strategy" in props:
            out[topic] = parse_strategy(props["compaction.strategy"])
        else:
            out[topic] = config.default_strategy
    return out
