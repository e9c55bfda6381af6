"""The ingest job's settings and results: :class:`IngestConfig` (``[paths]``, ``[spark]`` and
``[ingest]`` of ``conf/pipeline.toml``, read and checked by :func:`load_config`), the table
names and the app-transaction ids that carry progress (:func:`app_id`), and what a run reports
(:class:`IngestSummary`, :class:`Gap`). See :mod:`pipelines.ingest` for the run itself."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from logstore.errors import InvalidConfigError, LoglakeError
from logstore.objectstore import LakeLocation
from logstore.tools.client_config import ClientConfig
from pipelines.config import (
    ISOLATION_LEVELS,
    PARQUET_CODECS,
    job_settings,
    kafka_client_config,
    read_pipeline_toml,
)
from pipelines.divergence import (
    ON_DIVERGENCE,
    BatchId,
)
from pipelines.sources.damage import Skipped

__all__ = [
    "APP_PREFIX",
    "DIVERGED_TABLE",
    "INTERNAL_TOPIC_PREFIX",
    "QUARANTINE_TABLE",
    "RECORDS_TABLE",
    "BatchIdsOf",
    "Gap",
    "IngestConfig",
    "IngestSummary",
    "Log",
    "TopicPartition",
    "app_id",
    "load_config",
]

APP_PREFIX = "loglake-ingest"
RECORDS_TABLE = "records"
QUARANTINE_TABLE = "quarantine"
DIVERGED_TABLE = "diverged"
Log = Callable[[str], None]
TopicPartition = tuple[str, int]
BatchIdsOf = Callable[[Mapping[TopicPartition, int]], Mapping[TopicPartition, BatchId | None]]


INTERNAL_TOPIC_PREFIX = "__"
# Parquet codecs pyarrow writes and Spark, delta-rs and polars read ("lz4" is LZ4_RAW).


def app_id(topic: str, partition: int) -> str:
    """The app-transaction id carrying ``topic``/``partition``'s progress."""
    return f"{APP_PREFIX}/{topic}/{partition}"


@dataclass(frozen=True)
class IngestConfig:
    """What ``conf/pipeline.toml`` says about an ingest run (see that file for each key)."""

    log_dirs: tuple[str, ...]
    lake: str
    app_name: str = "loglake-ingest"
    master: str | None = None
    topics: tuple[str, ...] | None = None
    fail_on_corrupt: bool = False
    compression: str = "snappy"
    max_partition_bytes: int = 128 << 20
    max_rows_per_file: int = 5_000_000
    progress_interval_s: float = 10.0
    spark_conf: dict[str, str] = field(default_factory=dict)
    on_divergence: str = "fail"
    isolation: str = "read_committed"
    bootstrap_servers: str = ""  # "": the lake group is not committed (pipelines.lake_group)
    lake_group: str = "loglake-ingest"
    kafka: ClientConfig | None = None  # [kafka]: how to connect to bootstrap_servers
    remote_log_storage: str = ""  # [paths]: the cluster's tier, s3://... (pipelines.sources.tier)

    @property
    def records_path(self) -> str:
        return LakeLocation.parse(self.lake).join(RECORDS_TABLE).uri

    @property
    def quarantine_path(self) -> str:
        return LakeLocation.parse(self.lake).join(QUARANTINE_TABLE).uri

    @property
    def diverged_path(self) -> str:
        return LakeLocation.parse(self.lake).join(DIVERGED_TABLE).uri


def load_config(
    path: str | Path,
    *,
    log_dirs: Iterable[str] | None = None,
    lake: str | None = None,
    fail_on_corrupt: bool | None = None,
    on_divergence: str | None = None,
    bootstrap_servers: str | None = None,
    remote_log_storage: str | None = None,
) -> IngestConfig:
    """Read ``[paths]``, ``[spark]`` and ``[ingest]`` of a pipeline TOML file, then overrides.

    Relative paths are taken relative to the current directory (as on a command line).
    """
    p = Path(path)
    data = read_pipeline_toml(p)
    ingest = data.get("ingest", {})
    bootstrap = (
        bootstrap_servers
        if bootstrap_servers is not None
        else str(ingest.get("bootstrap_servers", ""))
    )
    # with a broker to Fetch from, no log dirs is allowed (pipelines.sources.fetch_ingest)
    common = job_settings(
        data, p, "ingest", log_dirs=log_dirs, lake=lake, need_log_dirs=not bootstrap
    )
    compression = str(ingest.get("compression", "snappy"))
    if compression not in PARQUET_CODECS:
        raise LoglakeError(
            f"[ingest] compression must be one of {', '.join(PARQUET_CODECS)}, got {compression!r}",
            path=str(p),
        )
    topics = ingest.get("topics") or None
    divergence = str(on_divergence or ingest.get("on_divergence", "fail"))
    if divergence not in ON_DIVERGENCE:
        raise LoglakeError(
            f"[ingest] on_divergence must be one of {', '.join(ON_DIVERGENCE)}, got {divergence!r}",
            path=str(p),
        )
    isolation = ingest.get("isolation", ISOLATION_LEVELS[0])
    if isolation not in ISOLATION_LEVELS:
        raise LoglakeError(
            f"[ingest] isolation must be one of {', '.join(ISOLATION_LEVELS)}, got {isolation!r}",
            path=str(p),
        )
    tier = str(
        remote_log_storage
        if remote_log_storage is not None
        else data.get("paths", {}).get("remote_log_storage", "")
    )
    if tier:
        tier = LakeLocation.parse(tier).uri
        if not bootstrap:  # the live remote segments are read from __remote_log_metadata
            raise InvalidConfigError(
                "[paths] remote_log_storage is read with [ingest] bootstrap_servers: the tier's "
                "live segments come from the cluster's __remote_log_metadata; then Fetch (no log "
                "dirs) or the log dirs from their log start on",
                path=str(p),
            )
    lake_group = str(ingest.get("lake_group", "loglake-ingest"))
    if not lake_group:
        raise LoglakeError("[ingest] lake_group must not be empty", path=str(p))
    return IngestConfig(
        log_dirs=common.log_dirs,
        lake=common.lake,
        app_name=common.app_name,
        master=common.master,
        topics=tuple(topics) if topics else None,
        compression=compression,
        fail_on_corrupt=bool(ingest.get("fail_on_corrupt", False))
        if fail_on_corrupt is None
        else fail_on_corrupt,
        max_partition_bytes=int(ingest.get("max_partition_bytes", 128 << 20)),
        max_rows_per_file=int(ingest.get("max_rows_per_file", 5_000_000)),
        progress_interval_s=float(ingest.get("progress_interval_s", 10.0)),
        spark_conf=common.spark_conf,
        on_divergence=divergence,
        isolation=isolation,
        bootstrap_servers=bootstrap,
        lake_group=lake_group,
        kafka=kafka_client_config(data, p),
        remote_log_storage=tier,
    )


@dataclass(frozen=True)
class Gap:
    """Offsets ``[from_offset, to_offset)`` of a partition that vanished before ingestion."""

    topic: str
    partition: int
    from_offset: int
    to_offset: int


@dataclass
class IngestSummary:
    """What a run did; ``committed`` is False when there was nothing new (or it was a no-op)."""

    records: int = 0
    bytes: int = 0
    partitions: int = 0
    quarantined: int = 0
    corrupt_batches: int = 0
    control_batches: int = 0
    gaps: list[Gap] = field(default_factory=list)
    seconds: float = 0.0
    committed: bool = False
    table_version: int | None = None
    progress: dict[str, int] = field(default_factory=dict)
    # Unreadable byte runs whose offsets the lake will not have (quarantined, progress past).
    skipped: list[Skipped] = field(default_factory=list)
    skipped_offsets: int = 0
    skipped_bytes: int = 0
    rewinds: list[str] = field(default_factory=list)  # "topic/partition from offset D"
    diverged_rows: int = 0  # rows moved from records to diverged by those rewinds
    # read_committed: transactions found in the window read ([progress, high watermark)),
    # and the partitions held at their last stable offset ("topic/partition": LSO).
    aborted_transactions: int = 0
    open_transactions: int = 0
    held_at_lso: dict[str, int] = field(default_factory=dict)
    # partitions read again because they hold aborted or open transactions, and the seconds
    # of that second Spark job (0: the run's one pass was exact; pipelines.ingest.committed)
    txn_reread_partitions: int = 0
    txn_reread_seconds: float = 0.0
    # partitions whose progress was committed to [ingest] lake_group (None: not committed)
    lake_group_partitions: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        gaps = (
            ", ".join(
                f"{g.topic}/{g.partition} [{g.from_offset}, {g.to_offset})" for g in self.gaps
            )
            or "none"
        )
        return (
            f"ingest summary: records={self.records} bytes={self.bytes} "
            f"partitions={self.partitions} quarantined={self.quarantined} "
            f"corrupt_batches={self.corrupt_batches} control_batches={self.control_batches} "
            f"gaps={len(self.gaps)} ({gaps}) table_version={self.table_version} "
            f"seconds={self.seconds:.1f} skipped_offsets={self.skipped_offsets} "
            f"skipped_bytes={self.skipped_bytes} ({len(self.skipped)} unreadable runs) "
            f"aborted_transactions={self.aborted_transactions} "
            f"open_transactions={self.open_transactions} held_at_lso={len(self.held_at_lso)} "
            f"txn_reread_partitions={self.txn_reread_partitions}"
        )
