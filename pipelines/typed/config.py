"""What ``jobs/decode.py`` reads from ``conf/pipeline.toml``: ``[paths]``, ``[spark]`` and
``[decode]`` (the keys' types and ranges are checked by :mod:`pipelines.config` first).

Which topics are decoded (:func:`DecodeConfig.named_topics`): the topics of ``[decode]
topics``, ``[decode.subject]`` and ``[decode.cdc]``; with none named, every topic ingested
into ``records`` whose value subject ``<topic>-value`` the registry holds (the subject
Confluent's serializers register under by default, TopicNameStrategy).

Which typed tables are upsert tables: the compacted topics as ``jobs/compact.py`` sees them
(``pipelines.compaction.config.compacted_topics``: ``cleanup.policy=compact`` in the log dirs'
topic configs, ``[compact] topics``; each with its strategy), and the CDC topics of
``[decode.cdc]``. Log dirs that do not exist are skipped here (decode reads no log).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from logstore.objectstore import LakeLocation
from pipelines.compaction.config import compacted_topics, load_compact_config
from pipelines.compaction.model import Strategy
from pipelines.config import job_settings, read_pipeline_toml

__all__ = ["DecodeConfig", "load_decode_config"]


@dataclass(frozen=True)
class DecodeConfig:
    """A decode run's settings (see ``conf/pipeline.toml`` ``[decode]`` for each key)."""

    lake: str
    registry_url: str
    log_dirs: tuple[str, ...] = ()
    app_name: str = "loglake-decode"
    master: str | None = None
    spark_conf: dict[str, str] = field(default_factory=dict)
    topics: tuple[str, ...] = ()
    subjects: dict[str, str] = field(default_factory=dict)
    cdc: dict[str, str] = field(default_factory=dict)
    compacted: dict[str, Strategy] = field(default_factory=dict)
    on_error: str = "dead_letter"
    compression: str = "zstd"
    max_rows_per_file: int = 5_000_000
    max_dead_letter_rate: float = 0.01

    @property
    def records_path(self) -> str:
        return LakeLocation.parse(self.lake).join("records").uri

    @property
    def dead_letters_path(self) -> str:
        return LakeLocation.parse(self.lake).join("dead_letters").uri

    def table_path(self, topic: str) -> str:
        """``<lake>/tables/<topic>``."""
        return LakeLocation.parse(self.lake).join("tables", topic).uri

    def subject(self, topic: str) -> str:
        """The value subject of ``topic``."""
        return self.subjects.get(topic, f"{topic}-value")

    def named_topics(self) -> list[str]:
        """The topics the configuration names (none: every topic with a subject)."""
        return sorted({*self.topics, *self.subjects, *self.cdc})


def load_decode_config(
    path: str | Path,
    *,
    log_dirs: list[str] | None = None,
    lake: str | None = None,
    registry_url: str | None = None,
) -> DecodeConfig:
    """Read ``[paths]``, ``[spark]`` and ``[decode]`` of a pipeline TOML file, then overrides."""
    p = Path(path)
    data = read_pipeline_toml(p)
    decode = data.get("decode", {})
    common = job_settings(data, p, "decode", log_dirs=log_dirs, lake=lake, need_log_dirs=False)
    compact = load_compact_config(p, log_dirs=log_dirs, lake=lake)
    compact = dataclasses.replace(
        compact, log_dirs=tuple(d for d in compact.log_dirs if Path(d).is_dir())
    )
    return DecodeConfig(
        lake=common.lake,
        registry_url=registry_url
        if registry_url is not None
        else str(decode.get("schema_registry_url", "")),
        log_dirs=common.log_dirs,
        app_name=common.app_name,
        master=common.master,
        spark_conf=common.spark_conf,
        topics=tuple(str(t) for t in decode.get("topics", [])),
        subjects={str(k): str(v) for k, v in decode.get("subject", {}).items()},
        cdc={str(k): str(v) for k, v in decode.get("cdc", {}).items()},
        compacted=compacted_topics(compact),
        on_error=str(decode.get("on_error", "dead_letter")),
        compression=str(decode.get("compression", "zstd")),
        max_rows_per_file=int(decode.get("max_rows_per_file", 5_000_000)),
        max_dead_letter_rate=float(decode.get("max_dead_letter_rate", 0.01)),
    )
