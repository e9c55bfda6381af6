"""Ingest: broker log directories to the bronze ``records`` Delta table, exactly once.

Tables (under the lake directory): ``<lake>/records`` (one row per record, the ``logsegments``
source's ``records`` schema, partitioned by ``topic`` and ``date``) and ``<lake>/quarantine``
(one row per damaged batch, ``batches`` schema plus ``quarantined_at``, partitioned by topic).

Progress is per topic-partition and lives in the ``records`` table itself, as Delta app
transactions ``loglake-ingest/<topic>/<partition>`` whose version is the next offset to ingest.
A run:

1. reads progress ``P`` and each partition's log start offset ``L`` (``log-start-offset-
   checkpoint``, or the first segment's base offset); ``P < L`` is a **gap** (offsets removed
   by retention before they were ingested): reported, and the partition continues at ``L``;
2. scans batch headers (``kind=batches``, header and CRC checks) from there below the high
   watermark: the new progress ``N`` of a partition is the end of its last valid batch
   (capped at the high watermark); damaged batches are collected;
3. appends damaged batches not yet in ``quarantine`` to it (idempotent by file and position);
   with ``fail_on_corrupt`` the run stops here, before moving progress;
4. reads records ``[start, N)`` per partition (the ranges ``kind=records`` plans, explicit
   ``until``, so the data is exactly what step 2 measured) and appends them to ``records`` in
   **one commit carrying the new progress**, with the versions read in step 1 as expected
   versions. Each Spark task decodes one range and writes its Parquet files in the same
   Python worker (``pipelines.delta.direct``): records never cross into the JVM.

``verify = "full"`` (the default) guarantees that a batch whose CRC matches but whose records
cannot be decoded is quarantined, never dropped silently, while decoding every batch only once
when there is no such batch (measured: decoding in the scan too cost about a fifth of the run):
step 4 reads with ``onDecodeError=fail``, and when it meets such a batch the run, which has
committed nothing, starts again with a step 2 that decodes every batch (``verify=full``), so
the batch is quarantined and left out like any damaged one. ``verify = "crc"`` never decodes
in step 2 and step 4 skips undecodable batches without quarantining them.

Crash behaviour: a run killed anywhere before the commit leaves progress unchanged and only
unreferenced data files: the next run writes the same range again. A run whose commit
landed is not repeated (a re-run finds ``N == P``). Two runs at once: the later commit finds
progress moved and fails cleanly (``StaleTransactionError``), or finds exactly its own
versions there and is a no-op. Quarantine rows may precede the records commit; a re-run
finds them already there.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf

from logstore.errors import CorruptRecordError, LoglakeError
from logstore.storage.checkpoints import read_offset_checkpoint
from logstore.storage.files import offset_from_file_name, parse_partition_dir
from pipelines.delta import read_app_transactions, read_delta, write_delta
from pipelines.delta.commit import load_table
from pipelines.delta.direct import write_direct
from pipelines.sources import RECORDS_ARROW_SCHEMA, UNDECODABLE_BATCH, read_segments
from pipelines.sources.plan import SegmentRange, SourceOptions, parse_options, plan_ranges

__all__ = [
    "APP_PREFIX",
    "Gap",
    "IngestConfig",
    "IngestSummary",
    "app_id",
    "load_config",
    "read_progress",
    "run_ingest",
]

APP_PREFIX = "loglake-ingest"
RECORDS_TABLE = "records"
QUARANTINE_TABLE = "quarantine"
_QUARANTINE_KEY = ["topic", "partition", "file", "position"]
Log = Callable[[str], None]
TopicPartition = tuple[str, int]


INTERNAL_TOPIC_PREFIX = "__"


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
    verify: str = "full"
    fail_on_corrupt: bool = False
    max_partition_bytes: int = 128 << 20
    max_rows_per_file: int = 5_000_000
    progress_interval_s: float = 10.0
    spark_conf: dict[str, str] = field(default_factory=dict)

    @property
    def records_path(self) -> str:
        return str(Path(self.lake) / RECORDS_TABLE)

    @property
    def quarantine_path(self) -> str:
        return str(Path(self.lake) / QUARANTINE_TABLE)


def load_config(
    path: str | Path,
    *,
    log_dirs: Iterable[str] | None = None,
    lake: str | None = None,
    fail_on_corrupt: bool | None = None,
) -> IngestConfig:
    """Read ``[paths]``, ``[spark]`` and ``[ingest]`` of a pipeline TOML file, then overrides.

    Relative paths are taken relative to the current directory (as on a command line).
    """
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LoglakeError("config file not found", path=str(p)) from None
    except tomllib.TOMLDecodeError as exc:
        raise LoglakeError(f"config is not valid TOML: {exc}", path=str(p)) from None
    paths = data.get("paths", {})
    spark = data.get("spark", {})
    ingest = data.get("ingest", {})
    dirs = list(log_dirs) if log_dirs else paths.get("log_dirs", [])
    if isinstance(dirs, str):
        dirs = [dirs]
    lake_dir = lake or paths.get("lake")
    if not dirs or not lake_dir:
        raise LoglakeError(
            "[paths] log_dirs and lake must be set (or --log-dirs/--lake)", path=str(p)
        )
    verify = str(ingest.get("verify", "full"))
    if verify not in ("crc", "full"):
        raise LoglakeError(f"[ingest] verify must be 'crc' or 'full', got {verify!r}", path=str(p))
    topics = ingest.get("topics") or None
    return IngestConfig(
        log_dirs=tuple(str(Path(d).absolute()) for d in dirs),
        lake=str(Path(lake_dir).absolute()),
        app_name=str(spark.get("app_name", "loglake-ingest")),
        master=spark.get("master"),
        topics=tuple(topics) if topics else None,
        verify=verify,
        fail_on_corrupt=bool(ingest.get("fail_on_corrupt", False))
        if fail_on_corrupt is None
        else fail_on_corrupt,
        max_partition_bytes=int(ingest.get("max_partition_bytes", 128 << 20)),
        max_rows_per_file=int(ingest.get("max_rows_per_file", 5_000_000)),
        progress_interval_s=float(ingest.get("progress_interval_s", 10.0)),
        spark_conf={str(k): str(v) for k, v in spark.get("conf", {}).items()},
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
            f"seconds={self.seconds:.1f}"
        )


def _stderr(message: str) -> None:
    print(f"[ingest {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def read_progress(records_path: str | Path) -> dict[TopicPartition, int]:
    """``{(topic, partition): next offset to ingest}`` from the table's app transactions."""
    out: dict[TopicPartition, int] = {}
    for app, version in read_app_transactions(records_path).items():
        parts = app.split("/")
        if len(parts) == 3 and parts[0] == APP_PREFIX and parts[2].isdigit():
            out[(parts[1], int(parts[2]))] = version
    return out


def _partitions(
    log_dirs: Iterable[str], topics: Iterable[str] | None
) -> dict[TopicPartition, Path]:
    """The partition directories to ingest: ``topics``, or every topic but Kafka's internal ones.

    Internal topics (``__consumer_offsets``, ``__transaction_state``, ``__cluster_metadata``)
    hold the broker's own state, not application data; they are ingested only when named.
    """
    wanted = set(topics) if topics else None
    out: dict[TopicPartition, Path] = {}
    for d in log_dirs:
        root = Path(d)
        if not root.is_dir():
            raise LoglakeError("log dir does not exist", path=str(root))
        for entry in os.scandir(root):
            parsed = parse_partition_dir(entry.name)
            if parsed is None or not entry.is_dir():
                continue
            if wanted is None and parsed[0].startswith(INTERNAL_TOPIC_PREFIX):
                continue
            if wanted is not None and parsed[0] not in wanted:
                continue
            out[parsed] = Path(entry.path)
    return out


def _checkpoints(log_dirs: Iterable[str], name: str) -> dict[TopicPartition, int] | None:
    merged: dict[TopicPartition, int] = {}
    found = False
    for d in log_dirs:
        path = Path(d) / name
        if path.is_file():
            found = True
            merged.update(read_offset_checkpoint(path))
    return merged if found else None


def _log_start(part_dir: Path, checkpoint: Mapping[TopicPartition, int], tp: TopicPartition) -> int:
    bases = [
        parsed[0]
        for name in os.listdir(part_dir)
        if (parsed := offset_from_file_name(name)) is not None and parsed[1] == ".log"
    ]
    first = min(bases) if bases else 0
    return max(checkpoint.get(tp, 0), first)


class _ProgressReporter:
    """Prints the running Spark stages' task counts to stderr every ``interval`` seconds."""

    def __init__(self, spark: SparkSession, interval: float, log: Log) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.interval = interval
        self.log = log
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="ingest-progress", daemon=True)

    def __enter__(self) -> _ProgressReporter:
        if self.interval > 0:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()

    def _run(self) -> None:
        while not self.stop.wait(self.interval):
            try:
                for sid in self.tracker.getActiveStageIds():
                    info = self.tracker.getStageInfo(sid)
                    if info is not None:
                        self.log(
                            f"stage {sid} ({info.name}): {info.numCompletedTasks}/"
                            f"{info.numTasks} tasks done, {info.numActiveTasks} running"
                        )
            except Exception:  # progress output must never break the run
                return


def _offsets_option(entries: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in entries.items():
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def _quarantine(spark: SparkSession, errors: DataFrame, path: str, log: Log) -> int:
    """Append ``errors`` rows not yet in the quarantine table; returns how many were new."""
    rows = errors.withColumn("quarantined_at", sf.current_timestamp())
    if load_table(path) is not None:
        seen = read_delta(spark, path).select(*_QUARANTINE_KEY)
        rows = rows.join(seen, on=_QUARANTINE_KEY, how="left_anti")
    rows = rows.cache()
    try:
        if rows.count() == 0:
            return 0
        result = write_delta(rows, path, partition_by=["topic"])
    finally:
        rows.unpersist()
    log(f"quarantined {result.num_rows} new damaged batches into {path}")
    return result.num_rows


def _is_undecodable(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) is the source's ``onDecodeError=fail`` error."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if UNDECODABLE_BATCH in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def _read_records(rng: SegmentRange, *, options: SourceOptions) -> Iterator[pa.RecordBatch]:
    """Executor side of step 4: what the records source's ``read()`` yields for ``rng``."""
    # Imported here: the driver plans without loading the decoder (numba) at all.
    from pipelines.sources.read import read_range  # noqa: PLC0415

    return read_range(
        rng,
        kind="records",
        min_timestamp=options.min_timestamp,
        max_timestamp=options.max_timestamp,
        verify=options.verify,
        on_decode_error=options.on_decode_error,
    )


def run_ingest(spark: SparkSession, config: IngestConfig, *, log: Log = _stderr) -> IngestSummary:
    """One ingest run (see the module docstring). Raises ``LoglakeError`` on failure."""
    started = time.monotonic()
    if config.verify != "full":
        return _run(spark, config, IngestSummary(), started, decode_in_scan=False, log=log)
    first = IngestSummary()
    try:
        return _run(spark, config, first, started, decode_in_scan=False, log=log)
    except Exception as exc:
        if not _is_undecodable(exc):
            raise
        log(
            "a batch passed its CRC check but its records cannot be decoded; nothing was "
            "committed: scanning again, decoding every batch, to quarantine it"
        )
    # Quarantine rows the first attempt appended are found there by the second: count them once.
    retry = IngestSummary(quarantined=first.quarantined)
    return _run(spark, config, retry, started, decode_in_scan=True, log=log)


def _run(
    spark: SparkSession,
    config: IngestConfig,
    summary: IngestSummary,
    started: float,
    *,
    decode_in_scan: bool,
    log: Log,
) -> IngestSummary:
    """Steps 1-4 with the scan decoding (``verify=full``) or not; fills ``summary``."""
    records_path = config.records_path
    parts = _partitions(config.log_dirs, config.topics)
    progress = read_progress(records_path)
    log_starts = _checkpoints(config.log_dirs, "log-start-offset-checkpoint") or {}
    high_watermarks = _checkpoints(config.log_dirs, "replication-offset-checkpoint")
    log(
        f"{len(parts)} partitions in {', '.join(config.log_dirs)}; "
        f"progress known for {len(progress)}; lake {config.lake}"
    )

    starts: dict[TopicPartition, int] = {}
    for tp, part_dir in sorted(parts.items()):
        begin = _log_start(part_dir, log_starts, tp)
        done = progress.get(tp, 0)
        if done < begin:
            gap = Gap(tp[0], tp[1], done, begin)
            summary.gaps.append(gap)
            log(
                f"GAP {tp[0]}/{tp[1]}: offsets [{done}, {begin}) were removed from the log "
                "before they were ingested; continuing at the log start offset"
            )
        starts[tp] = max(done, begin)
    if not parts:
        summary.seconds = time.monotonic() - started
        log("no partitions to ingest")
        return summary

    options: dict[str, Any] = {
        "startingOffsets": _offsets_option(starts),
        "maxPartitionBytes": config.max_partition_bytes,
    }
    options["topics"] = sorted({topic for topic, _ in parts})
    log_dirs = ",".join(config.log_dirs)
    with _ProgressReporter(spark, config.progress_interval_s, log):
        verify = "full" if decode_in_scan else "crc"
        batches = read_segments(spark, log_dirs, kind="batches", verify=verify, **options)
        batches = batches.persist()
        try:
            valid = batches.filter(sf.col("error").isNull())
            stats = (
                valid.groupBy("topic", "partition")
                .agg(
                    sf.max(sf.col("last_offset") + 1).alias("next_offset"),
                    sf.sum("size").alias("bytes"),
                    sf.sum(sf.col("is_control").cast("int")).alias("control"),
                )
                .collect()
            )
            errors = batches.filter(sf.col("error").isNotNull())
            summary.corrupt_batches = errors.count()
            if summary.corrupt_batches:
                log(f"{summary.corrupt_batches} damaged batches found")
                summary.quarantined += _quarantine(spark, errors, config.quarantine_path, log)
        finally:
            batches.unpersist()
        if summary.corrupt_batches and config.fail_on_corrupt:
            raise CorruptRecordError(
                f"{summary.corrupt_batches} damaged batches (see {config.quarantine_path}); "
                "fail_on_corrupt is set, progress not moved"
            )

        new_progress: dict[TopicPartition, int] = {}
        for row in stats:
            tp = (row["topic"], row["partition"])
            if tp not in starts:
                continue
            end = row["next_offset"]
            if high_watermarks is not None and tp in high_watermarks:
                end = min(end, high_watermarks[tp])
            if end > starts[tp]:
                new_progress[tp] = end
                summary.bytes += int(row["bytes"] or 0)
                summary.control_batches += int(row["control"] or 0)
        # A partition that only skipped a gap still moves, so the gap is reported once.
        for tp, start in starts.items():
            if tp not in new_progress and start > progress.get(tp, 0):
                new_progress[tp] = start
        if not new_progress:
            summary.seconds = time.monotonic() - started
            log("nothing new to ingest")
            return summary

        until = {tp: new_progress.get(tp, starts[tp]) for tp in starts}
        log(
            f"ingesting {len(new_progress)} partitions: "
            + ", ".join(
                f"{t}/{p} [{starts[(t, p)]}, {until[(t, p)]})" for t, p in sorted(new_progress)
            )
        )
        # One pass in the Python workers: each task decodes one planned range (the ranges
        # the records source would read) and writes its Parquet files itself, so no record
        # crosses into the JVM; the driver commits all files with the new progress.
        source = parse_options(
            {
                "path": log_dirs,
                "kind": "records",
                "startingOffsets": json.dumps(_offsets_option(starts)),
                "until": json.dumps(_offsets_option(until)),
                "maxPartitionBytes": str(config.max_partition_bytes),
                "topics": ",".join(sorted({t for t, _ in new_progress})),
                # With verify=full and a scan that did not decode, an undecodable batch must
                # stop the run (to be quarantined by a decoding scan), not vanish.
                "onDecodeError": "fail"
                if config.verify == "full" and not decode_in_scan
                else "skip",
            }
        )
        apps = {app_id(t, p): v for (t, p), v in new_progress.items()}
        expected = {app_id(t, p): progress.get((t, p)) for (t, p) in new_progress}
        result = write_direct(
            spark,
            records_path,
            plan_ranges(source),
            functools.partial(_read_records, options=source),
            schema=RECORDS_ARROW_SCHEMA,
            partition_by=["topic", "date"],
            app_transactions=apps,
            expected_versions=expected,
            max_rows_per_file=config.max_rows_per_file,
        )
    summary.records = result.num_rows
    summary.partitions = sum(1 for tp in new_progress if until[tp] > starts[tp])
    summary.committed = result.committed
    summary.table_version = result.version
    summary.progress = dict(sorted(apps.items()))
    summary.seconds = time.monotonic() - started
    if not result.committed:
        log("another run already committed exactly this range: nothing written")
    return summary
