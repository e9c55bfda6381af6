"""Ingest: broker log directories to the bronze ``records`` Delta table, exactly once.

Tables (under the lake directory): ``<lake>/records`` (one row per record, the ``logsegments``
source's ``records`` schema, partitioned by ``topic`` and ``date``) and ``<lake>/quarantine``
(one row per damaged batch, ``batches`` schema plus ``quarantined_at``, partitioned by topic).

Progress is per topic-partition and lives in the ``records`` table itself, as Delta app
transactions ``loglake-ingest/<topic>/<partition>`` whose version is the next offset to ingest.
A run:

1. reads progress ``P`` and each partition's log start offset ``L`` (``log-start-offset-
   checkpoint``, or the first segment's base offset); ``P < L`` is a **gap** (offsets removed
   by retention before they were ingested): reported, and the partition continues at ``L``
   — but with ``[paths] remote_log_storage`` (and ``bootstrap_servers``) the part of
   ``[P, L)`` the cluster's tier holds is read from the object store on the executors
   (:mod:`pipelines.sources.tier`), in the same run and commit, and only the rest is a gap;
   then checks that each log still holds what the lake ingested (:mod:`pipelines.divergence`:
   the log's end and the batch at ``P - 1`` against the batch identity the last commit
   recorded); a log that went backwards fails the run (``DivergenceError``) or, with
   ``on_divergence="rewind"``, continues from the first differing offset ``D`` and the commit
   of step 4 also moves the lake's rows ``>= D`` to ``diverged`` and sets progress back;
2. reads every partition from there up to its high watermark in **one pass**: Spark tasks
   of planned ranges (``kind=records`` planning, cut into tasks by :func:`schedule_tasks`)
   check headers and CRCs, decode the records and write them as Parquet files in the same
   Python worker (``pipelines.delta.direct``: records never cross into the JVM), and report
   where their sound batches end, their bytes and control batches, and every damaged batch —
   CRC failures, impossible headers, torn frames and batches whose records cannot be decoded.
   With ``isolation="read_committed"`` (the default) a pre-pass over the same ranges first
   finds each partition's aborted transactions and its **last stable offset** (LSO, the
   first offset of the earliest transaction still open at the high watermark) from the batch
   headers and markers alone (:mod:`pipelines.sources.transactions`, which states its cost);
   the pass then reads each partition only below its LSO and leaves out the batches of
   aborted transactions, so ``records`` never holds an aborted record and an open
   transaction waits for a later run. ``"read_uncommitted"`` reads everything below the
   high watermark (control batches are never records);
3. appends damaged batches not yet in ``quarantine`` to it (idempotent by file and position);
   damage never ends a read (the reader resynchronises on the next sound batch), and each run
   of unreadable bytes is reported as **skipped** offsets — from the end of the sound batch
   before it to the base offset of the one after it (or the high watermark), with its bytes
   (:mod:`pipelines.sources.damage`; damage below progress, read again with its segment, is
   an earlier run's and not counted again). With ``fail_on_corrupt`` the run stops here: the
   written files are removed, progress does not move;
4. commits the files to ``records`` in **one commit carrying the new progress** ``N`` (per
   partition: the end of its last sound batch or of its last skipped run, capped at the
   high watermark — at the LSO with ``read_committed``: the next run starts at the open
   transaction and judges it again, so a transaction that straddles runs is written once,
   when it committed, or never), with the versions read in step 1 as expected versions.

Every batch that is ingested is decoded, so a batch whose CRC matches but whose records cannot
be decoded is quarantined like any damaged one, never dropped silently.

Retention racing a run: a segment deleted between the listing and its read (the broker's
retention, a DeleteRecords) fails the attempt before anything is staged or committed, and the
run plans again from step 1 (:func:`pipelines.sources.plan.replanned`: at most
``REPLAN_ATTEMPTS`` attempts, each logged): the offsets retention took unread are reported as a
gap and the run commits what it then reads, once. A broker with ``log.retention.lake.group``
holds every segment from the lake's progress on, so this happens only past its safety valves.

Crash behaviour: a run killed anywhere before the commit leaves progress unchanged and only
unreferenced data files, which the next run removes (run markers, :mod:`pipelines.delta.staging`)
before it writes the same range again. A run whose commit
landed is not repeated (a re-run finds ``N == P``). Two runs at once: the later commit finds
progress moved and fails cleanly (``StaleTransactionError``), or finds exactly its own
versions there and is a no-op. Quarantine rows precede the records commit; a re-run finds
them already there.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from logstore.errors import CorruptRecordError, InvalidConfigError, LoglakeError
from logstore.objectstore import LakeLocation
from logstore.tools.client_config import ClientConfig
from pipelines.config import (
    ISOLATION_LEVELS,
    PARQUET_CODECS,
    job_settings,
    kafka_client_config,
    read_pipeline_toml,
)
from pipelines.delta import read_app_transactions
from pipelines.delta.commit import ensure_table, load_table
from pipelines.delta.direct import StagedWrite, append_table, stage_files
from pipelines.delta.files import RECORDS_PARQUET_OPTIONS
from pipelines.divergence import (
    DIVERGED_ARROW_SCHEMA,
    DIVERGED_PARTITION_BY,
    ON_DIVERGENCE,
    BatchId,
    check_partition,
    commit_info,
    divergence_error,
    divergence_point,
    plan_rewind,
    read_fingerprints,
    rewind_id,
    write_diverged,
)
from pipelines.lake_group import commit_lake_offsets
from pipelines.logdir import (
    LOG_START_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    PartitionDir,
    log_start_offset,
    merged_checkpoint,
    partition_dirs,
)
from pipelines.sources import BATCHES_ARROW_SCHEMA, RECORDS_ARROW_SCHEMA
from pipelines.sources.damage import Skipped, skipped_offsets
from pipelines.sources.plan import (
    SegmentRange,
    SourceOptions,
    parse_options,
    plan_ranges,
    replanned,
)
from pipelines.sources.tier import (
    TierPlan,
    TierRange,
    plan_summary,
    plan_tier,
    read_tier_range,
    tier_tasks,
)
from pipelines.sources.transactions import AbortedRanges, PartitionTxns, scan_transactions

__all__ = [
    "APP_PREFIX",
    "ISOLATION_LEVELS",
    "Divergences",
    "Gap",
    "IngestConfig",
    "IngestSummary",
    "app_id",
    "finish_run",
    "load_config",
    "read_progress",
    "run_ingest",
    "schedule_tasks",
    "stage_records",
]

APP_PREFIX = "loglake-ingest"
RECORDS_TABLE = "records"
QUARANTINE_TABLE = "quarantine"
DIVERGED_TABLE = "diverged"
_QUARANTINE_KEY = ["topic", "partition", "file", "position"]
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
    txn_prepass_seconds: float = 0.0  # the read_committed pre-pass (a Spark job of its own)
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
            f"open_transactions={self.open_transactions} held_at_lso={len(self.held_at_lso)}"
        )


def _stderr(message: str) -> None:
    print(f"[ingest {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def read_progress(records_path: str | Path | LakeLocation) -> dict[TopicPartition, int]:
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
        for part in partition_dirs(d, topics=wanted):
            if wanted is None and part.topic.startswith(INTERNAL_TOPIC_PREFIX):
                continue
            out[part.tp] = part.path
    return out


def _log_start(part_dir: Path, checkpoint: Mapping[TopicPartition, int], tp: TopicPartition) -> int:
    return log_start_offset(PartitionDir(tp[0], tp[1], part_dir), checkpoint)


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


QUARANTINE_ARROW_SCHEMA: pa.Schema = BATCHES_ARROW_SCHEMA.append(
    pa.field("quarantined_at", pa.timestamp("us", tz="UTC"))
)


def _ensure_tables(config: IngestConfig) -> None:
    """``records``, ``quarantine`` and ``diverged`` exist from the first run on (empty)."""
    ensure_table(config.records_path, RECORDS_ARROW_SCHEMA, ["topic", "date"])
    ensure_table(config.quarantine_path, QUARANTINE_ARROW_SCHEMA, ["topic"])
    ensure_table(config.diverged_path, DIVERGED_ARROW_SCHEMA, DIVERGED_PARTITION_BY)


def _quarantine(rows: list[dict[str, Any]], path: str, log: Log, *, compression: str) -> int:
    """Append the damaged-batch ``rows`` not yet in the quarantine table; returns how many
    were new. Written from the driver (a handful of rows): no Spark job, and no Python data
    source whose planner worker could print pyspark's daemon traceback on the console."""
    new = pa.Table.from_pylist(rows, schema=BATCHES_ARROW_SCHEMA)
    dt = load_table(path)
    if dt is not None and new.num_rows:
        seen = dt.to_pyarrow_table(columns=_QUARANTINE_KEY)
        known = set(zip(*(seen.column(k).to_pylist() for k in _QUARANTINE_KEY), strict=True))
        keep = [tuple(r[k] for k in _QUARANTINE_KEY) not in known for r in new.to_pylist()]
        new = new.filter(pa.array(keep, pa.bool_()))
    if new.num_rows == 0:
        return 0
    stamp = QUARANTINE_ARROW_SCHEMA.field("quarantined_at").type
    new = new.append_column("quarantined_at", pa.array([datetime.now(UTC)] * new.num_rows, stamp))
    append_table(
        path, new, schema=QUARANTINE_ARROW_SCHEMA, partition_by=["topic"], compression=compression
    )
    log(f"quarantined {new.num_rows} new damaged batches into {path}")
    return int(new.num_rows)


def _read_ranges(
    ranges: list[tuple[SegmentRange, AbortedRanges | None] | TierRange], *, options: SourceOptions
) -> Iterator[Any]:
    """Executor side of step 2: per range, its records (without those of the aborted
    transactions given with it) then its :class:`RangeReport` (JSON). A :class:`TierRange`
    (offsets below the log dirs' start that the tier holds) is read from the object store."""
    # Imported here: the driver plans without loading the decoder (numba) at all.
    from pipelines.sources.read import RangeReport, read_records  # noqa: PLC0415

    for item in ranges:
        if isinstance(item, TierRange):
            report = RangeReport(item.topic, item.partition)
            yield from read_tier_range(
                item,
                min_timestamp=options.min_timestamp,
                max_timestamp=options.max_timestamp,
                report=report,
            )
            yield report.to_json()
            continue
        rng, aborted = item
        report = RangeReport(rng.topic, rng.partition)
        yield from read_records(
            rng,
            min_timestamp=options.min_timestamp,
            max_timestamp=options.max_timestamp,
            report=report,
            aborted=aborted,
        )
        yield report.to_json()


def _stable_ranges(
    spark: SparkSession,
    ranges: list[SegmentRange],
    tasks: list[list[SegmentRange]],
    summary: IngestSummary,
    log: Log,
) -> tuple[list[SegmentRange], dict[TopicPartition, PartitionTxns]]:
    """``read_committed``: the pre-pass over ``tasks``, then ``ranges`` cut at each
    partition's LSO (ranges wholly at or above it dropped)."""
    began = time.monotonic()
    txns = scan_transactions(spark, tasks)
    summary.txn_prepass_seconds = time.monotonic() - began
    out = []
    for r in ranges:
        lso = txns[(r.topic, r.partition)].lso(r.until)
        if r.start_offset >= lso or r.segment_base_offset >= lso:
            continue
        out.append(dataclasses.replace(r, until=lso) if lso < r.until else r)
    until = {(r.topic, r.partition): r.until for r in ranges}
    for tp, found in sorted(txns.items()):
        summary.aborted_transactions += len(found.aborted)
        summary.open_transactions += found.open
        if found.open_from is not None and found.open_from < until[tp]:
            summary.held_at_lso[f"{tp[0]}/{tp[1]}"] = found.open_from
    log(
        f"read_committed: {summary.aborted_transactions} aborted and {summary.open_transactions} "
        f"open transactions below the high watermarks (pre-pass "
        f"{summary.txn_prepass_seconds:.2f} s); "
        + (
            "held at their last stable offset: "
            + ", ".join(f"{k} at {v}" for k, v in summary.held_at_lso.items())
            if summary.held_at_lso
            else "no partition held below its high watermark"
        )
    )
    return out, txns


def _with_aborted(
    tasks: list[list[SegmentRange]], txns: Mapping[TopicPartition, PartitionTxns]
) -> list[list[tuple[SegmentRange, AbortedRanges | None]]]:
    """Each range with the aborted transactions that can reach its segment's offsets."""
    out = []
    for task in tasks:
        items: list[tuple[SegmentRange, AbortedRanges | None]] = []
        for r in task:
            found = txns.get((r.topic, r.partition))
            aborted = None
            if found is not None and len(found.aborted):
                high = r.until if r.next_base_offset is None else r.next_base_offset
                aborted = found.aborted.overlapping(
                    max(r.start_offset, r.segment_base_offset), min(r.until, high)
                )
            items.append((r, aborted if aborted is not None and len(aborted) else None))
        out.append(items)
    return out


# Segments are planned in pieces of max_partition_bytes / PIECES_PER_TASK, the smallest task
# schedule_tasks makes.
PIECES_PER_TASK = 8


def schedule_tasks(
    pieces: Sequence[SegmentRange], cores: int, max_bytes: int, min_bytes: int
) -> list[list[SegmentRange]]:
    """Cut ``pieces`` (planned ranges in file order) into tasks, largest first, so that
    ``cores`` cores running them in order finish together.

    Spark starts a stage's tasks in index order, each on the first free core. A task takes
    ``max_bytes`` while more than ``cores`` tasks of that size are left, then a core's share
    of the rest (``left / cores``), and so on down to ``min_bytes`` (guided self-scheduling);
    a run of less than ``min_bytes`` a core goes down to its share a core instead, so every
    core still gets some. A rest under half of that smallest task joins the last task.

    Tasks of equal bytes do not finish together: on a busy machine the same bytes cost one
    task up to 30% more than another, and a core that finished its last big task idled while
    the other still worked (up to 0.45 s of a 1.8 s run, measured). Tasks that run out small
    let the first free core take the next one. A task is consecutive pieces; pieces of one
    segment that meet are merged into one range (one sequential read).
    """
    cores = max(1, cores)
    left = sum(p.end - p.start for p in pieces)
    tasks: list[list[SegmentRange]] = []
    task: list[SegmentRange] = []
    size = 0
    # a run smaller than min_bytes a core is still spread over the cores
    smallest = min(min_bytes, -(-left // cores))
    target = max(smallest, min(max_bytes, -(-left // cores)))
    for piece in pieces:
        piece_size = piece.end - piece.start
        if task and size + piece_size > target and left - size > smallest // 2:
            tasks.append(task)
            left -= size
            task, size = [], 0
            target = max(smallest, min(max_bytes, -(-left // cores)))
        previous = task[-1] if task else None
        if previous is not None and previous.path == piece.path and previous.end == piece.start:
            task[-1] = dataclasses.replace(previous, end=piece.end, is_tail=piece.is_tail)
        else:
            task.append(piece)
        size += piece_size
    if task:
        tasks.append(task)
    return tasks


def run_ingest(spark: SparkSession, config: IngestConfig, *, log: Log = _stderr) -> IngestSummary:
    """One ingest run (see the module docstring). Raises ``LoglakeError`` on failure.

    After a run that did not fail, ``records``, ``quarantine`` and ``diverged`` exist, empty
    if nothing went there (a table's first commit is its first data when there is any).
    """
    # Retention may delete a segment under the run: plan again from the new log start (the
    # offsets it took unread are a gap); a failed attempt left nothing staged, so what the
    # last attempt read is committed once.
    summary = replanned(lambda: _run_ingest(spark, config, log=log), what="ingest", log=log)
    _ensure_tables(config)
    if config.bootstrap_servers:
        # after the Delta commit: the broker learns how far the lake has read (never fails
        # the run; see pipelines.lake_group)
        # only the partitions this run reads ([ingest] topics): a topic no longer ingested
        # is not held on the broker by a commit refreshed forever (its commit ages out)
        progress = read_progress(config.records_path)
        taken = set(_partitions(config.log_dirs, config.topics))
        if not config.log_dirs:  # read through Fetch: the partitions the lake has
            taken = {tp for tp in progress if config.topics is None or tp[0] in config.topics}
        summary.lake_group_partitions = commit_lake_offsets(
            config.bootstrap_servers,
            config.lake_group,
            {tp: v for tp, v in progress.items() if tp in taken},
            log=log,
            client=config.kafka,
        )
    return summary


def _run_ingest(spark: SparkSession, config: IngestConfig, *, log: Log) -> IngestSummary:
    if not config.log_dirs:  # no log dirs: everything through Fetch from bootstrap_servers
        from pipelines.sources.fetch_ingest import run_fetch_ingest  # noqa: PLC0415

        return run_fetch_ingest(spark, config, log=log)
    started = time.monotonic()
    summary = IngestSummary()
    records_path = config.records_path
    parts = _partitions(config.log_dirs, config.topics)
    progress = read_progress(records_path)
    log_starts = merged_checkpoint(config.log_dirs, LOG_START_OFFSET_CHECKPOINT) or {}
    high_watermarks = merged_checkpoint(config.log_dirs, REPLICATION_OFFSET_CHECKPOINT)
    log(
        f"{len(parts)} partitions in {', '.join(config.log_dirs)}; "
        f"progress known for {len(progress)}; lake {config.lake}"
    )

    starts: dict[TopicPartition, int] = {}  # where the log dirs are read from
    begins = {tp: _log_start(part_dir, log_starts, tp) for tp, part_dir in parts.items()}
    below = {tp: progress.get(tp, 0) for tp, b in begins.items() if progress.get(tp, 0) < b}
    tier = _tier_below(config, below, begins, log)
    firsts: dict[TopicPartition, int] = {}  # where the run reads from: the tier's part first
    for tp, begin in sorted(begins.items()):
        done = progress.get(tp, 0)
        held = tier.fetch_from.get(tp, done)  # the tier holds [done, held)
        if held < begin:
            gap = Gap(tp[0], tp[1], held, begin)
            summary.gaps.append(gap)
            log(
                f"GAP {tp[0]}/{tp[1]}: offsets [{held}, {begin}) were removed from the log "
                "before they were ingested; continuing at the log start offset"
            )
        starts[tp] = max(done, begin)
        firsts[tp] = done if held > done else starts[tp]
    divergence = _check_divergence(config, parts, progress, log_starts, high_watermarks, log)
    starts.update(divergence.starts)
    firsts.update(divergence.starts)
    if not parts:
        summary.seconds = time.monotonic() - started
        log("no partitions to ingest")
        return summary

    log_dirs = ",".join(config.log_dirs)
    piece = max(1, config.max_partition_bytes // PIECES_PER_TASK)
    options = {
        "path": log_dirs,
        "kind": "records",
        "startingOffsets": json.dumps(_offsets_option(starts)),
        "maxPartitionBytes": str(piece),
        "topics": ",".join(sorted({topic for topic, _ in parts})),
    }
    if high_watermarks is not None:
        # The plan reads up to the high watermarks this run read above, never its own later
        # read of the checkpoint: the broker rewrites it while the run plans, and rows read past
        # the run's high watermark would be ingested again by the next run (its progress ends
        # there). Found by the lake retention race test (one duplicated range in ~200 runs).
        options["until"] = json.dumps(_offsets_option(high_watermarks))
    source = parse_options(options)
    # A partition already ingested up to its high watermark has nothing committed to read:
    # no piece of it is planned (a re-run with nothing new starts no Spark job at all).
    caught_up = {
        tp for tp, start in starts.items()
        if high_watermarks is not None and tp in high_watermarks and start >= high_watermarks[tp]
    }  # fmt: skip
    ranges = [
        r
        for r in plan_ranges(source)
        if (r.topic, r.partition) in starts and (r.topic, r.partition) not in caught_up
    ]
    # Pieces of an eighth of max_partition_bytes, cut into tasks that run out small so the
    # cores finish together (equal tasks left a core idle for up to 15% of a run).
    cores = spark.sparkContext.defaultParallelism
    tasks = schedule_tasks(ranges, cores, config.max_partition_bytes, piece)
    txns: dict[TopicPartition, PartitionTxns] = {}
    if config.isolation == "read_committed" and ranges:
        ranges, txns = _stable_ranges(spark, ranges, tasks, summary, log)
        tasks = schedule_tasks(ranges, cores, config.max_partition_bytes, piece)
    # the offsets this run may ingest end at the high watermark, or the LSO below it
    limits = dict(high_watermarks) if high_watermarks is not None else None
    for tp, found in txns.items():
        if found.open_from is not None:
            limits = limits if limits is not None else {}
            limits[tp] = found.lso(limits.get(tp, found.open_from))
    total = sum(r.end - r.start for r in ranges)
    log(
        f"reading {len(ranges)} ranges ({total / 1e6:.1f} MB) of {len(starts)} partitions up to "
        f"their high watermarks in {len(tasks)} tasks"
    )
    with _ProgressReporter(spark, config.progress_interval_s, log):
        staged = stage_records(
            spark,
            config,
            [*tier_tasks(tier.ranges, cores), *_with_aborted(tasks, txns)],
            functools.partial(_read_ranges, options=source),
            log,
        )
    try:
        return finish_run(spark, config, summary, staged, firsts, progress, limits, log, divergence)
    finally:
        summary.seconds = time.monotonic() - started


def _tier_below(
    config: IngestConfig, below: Mapping[TopicPartition, int], begins: Mapping[TopicPartition, int],
    log: Log,
) -> TierPlan:  # fmt: skip
    """With ``remote_log_storage``: the tier's part of the offsets below the log dirs' start
    (``below``: the progress of each partition behind its log start ``begins``), read from the
    object store instead of being a gap; ``fetch_from`` says where the tier's part ends."""
    if not config.remote_log_storage or not below:
        return TierPlan([], {})
    plan = plan_tier(
        config.bootstrap_servers,
        config.remote_log_storage,
        below,
        {tp: begins[tp] for tp in below},
        config=config.kafka,
        read_committed=config.isolation == "read_committed",
    )
    log(plan_summary(plan, below) + f" below the log dirs' start, at {config.remote_log_storage}")
    return plan


def stage_records(
    spark: SparkSession,
    config: IngestConfig,
    tasks: Sequence[Any],
    read: Callable[[Any], Iterator[Any]],
    log: Log,
) -> StagedWrite:
    """The run's ``records`` files, staged by the executors (``read`` per task: its rows, then
    its reports), in the table's one shape (schema, partitions, Parquet options) whichever
    source the rows came from (log dirs, the tier, Fetch); the files of runs killed before
    their commit are reaped first. Ends with :func:`finish_run`."""
    staged = stage_files(
        spark,
        config.records_path,
        tasks,
        read,
        schema=RECORDS_ARROW_SCHEMA,
        partition_by=["topic", "date"],
        compression=config.compression,
        max_rows_per_file=config.max_rows_per_file,
        writer_options=RECORDS_PARQUET_OPTIONS,
    )
    if staged.reaped:
        log(f"removed {staged.reaped} data files of earlier runs that were killed before commit")
    return staged


def finish_run(  # noqa: PLR0917
    spark: SparkSession,
    config: IngestConfig,
    summary: IngestSummary,
    staged: StagedWrite,
    starts: Mapping[TopicPartition, int],
    progress: Mapping[TopicPartition, int],
    high_watermarks: Mapping[TopicPartition, int] | None,
    log: Log,
    divergence: Divergences | None = None,
) -> IngestSummary:
    """Steps 3 and 4: quarantine, then commit the staged files with the new progress.

    ``high_watermarks``: where each partition's offsets to ingest end (the high watermark,
    or the last stable offset below it under ``read_committed``)."""
    divergence = divergence or Divergences()
    ends: dict[TopicPartition, int] = {}
    sizes: dict[TopicPartition, tuple[int, int]] = {}
    damaged: dict[tuple[str, int, str, int], dict[str, Any]] = {}
    for report in staged.reports:
        tp = (report["topic"], report["partition"])
        if report["next_offset"] is not None:
            ends[tp] = max(ends.get(tp, report["next_offset"]), report["next_offset"])
        b, c = sizes.get(tp, (0, 0))
        sizes[tp] = (b + report["bytes"], c + report["control_batches"])
    # Damage: runs of unreadable bytes between sound batches; progress moves past each run
    # below the high watermark, and its offsets are reported as skipped (never a silent gap).
    skipped, damage_rows, past_damage = skipped_offsets(staged.reports, starts, high_watermarks)
    for row in damage_rows:
        damaged[(row["topic"], row["partition"], row["file"], row["position"])] = row
    for tp, end in past_damage.items():
        ends[tp] = max(ends.get(tp, end), end)
    summary.skipped = skipped
    summary.skipped_offsets = sum(s.offsets for s in skipped)
    summary.skipped_bytes = sum(s.bytes for s in skipped)
    for s in skipped:
        to = "the unknown log end" if s.to_offset is None else s.to_offset
        log(
            f"SKIPPED {s.topic}/{s.partition}: offsets [{s.from_offset}, {to}) ({s.offsets} "
            f"offsets) are unreadable: {s.bytes} bytes at position {s.position} of {s.file} "
            f"({s.error})"
        )
    try:
        summary.corrupt_batches = len(damaged)
        if damaged:
            log(f"{len(damaged)} damaged batches found")
            summary.quarantined += _quarantine(
                list(damaged.values()), config.quarantine_path, log, compression=config.compression
            )
        if damaged and config.fail_on_corrupt:
            raise CorruptRecordError(
                f"{len(damaged)} damaged batches (see {config.quarantine_path}): "
                f"{summary.skipped_offsets} offsets in {summary.skipped_bytes} bytes unreadable; "
                "fail_on_corrupt is set, progress not moved"
            )
        new_progress: dict[TopicPartition, int] = {}
        for tp, start in starts.items():
            end = ends.get(tp, start)
            if high_watermarks is not None and tp in high_watermarks:
                end = min(end, high_watermarks[tp])
            if end > start:
                new_progress[tp] = end
                summary.partitions += 1
                summary.bytes += sizes[tp][0]
                summary.control_batches += sizes[tp][1]
            elif start > progress.get(tp, 0):
                # Only a gap was skipped: the partition still moves, so it is reported once.
                new_progress[tp] = start
        new_progress.update(divergence.progress_after(new_progress))
        if not new_progress:
            log("nothing new to ingest")
            staged.abort()
            return summary
    except BaseException:
        staged.abort()
        raise
    log(
        f"committing {staged.num_rows} records of {len(new_progress)} partitions: "
        + ", ".join(
            f"{t}/{p} [{starts[(t, p)]}, {new_progress[(t, p)]})" for t, p in sorted(new_progress)
        )
    )
    apps = {app_id(t, p): v for (t, p), v in new_progress.items()}
    expected = {app_id(t, p): progress.get((t, p)) for (t, p) in new_progress}
    try:
        extra = _rewind(config, staged, divergence, summary, log)
        # through Fetch, the batches' identities are read from the broker: may fail too
        found = divergence.batch_ids(new_progress) if divergence.batch_ids else None
    except BaseException:
        staged.abort()
        raise
    extra["commit_info"] = commit_info(
        new_progress, divergence.parts, divergence.fingerprints, progress, divergence.ids.values(),
        found=found,
    )  # fmt: skip
    result = staged.commit(app_transactions=apps, expected_versions=expected, **extra)
    summary.records = result.num_rows
    if result.committed:  # rows a rewind wrote back to new files are not new records
        summary.records -= sum(f.num_rows for f in extra.get("extra_files", ()))
    summary.committed = result.committed
    summary.table_version = result.version
    summary.progress = dict(sorted(apps.items()))
    if not result.committed:
        log("another run already committed exactly this range: nothing written")
    return summary


@dataclass
class Divergences:
    """What the divergence check of a run found (see :mod:`pipelines.divergence`)."""

    parts: Mapping[TopicPartition, Path] = field(default_factory=dict)
    fingerprints: dict[TopicPartition, BatchId | None] = field(default_factory=dict)
    starts: dict[TopicPartition, int] = field(default_factory=dict)  # divergence points
    ids: dict[TopicPartition, str] = field(default_factory=dict)
    reasons: dict[TopicPartition, str] = field(default_factory=dict)
    # through Fetch (no log dirs, so no parts): the batches ending at the new progress - 1
    batch_ids: BatchIdsOf | None = None

    def progress_after(
        self, new_progress: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """Rewound partitions with nothing re-read still move: back to their divergence point."""
        return {tp: d for tp, d in self.starts.items() if tp not in new_progress}


def _check_divergence(  # noqa: PLR0917
    config: IngestConfig,
    parts: Mapping[TopicPartition, Path],
    progress: Mapping[TopicPartition, int],
    log_starts: Mapping[TopicPartition, int],
    high_watermarks: Mapping[TopicPartition, int] | None,
    log: Log,
) -> Divergences:
    """Step 1b: does every partition's log still hold what the lake ingested from it?

    Raises :class:`DivergenceError` (``on_divergence="fail"``) or returns the partitions to
    rewind with their divergence points (``"rewind"``).
    """
    # every partition's entry, also of topics this run does not read: carried to the commit
    out = Divergences(parts=parts, fingerprints=read_fingerprints(config.records_path, progress))
    cleaned = merged_checkpoint(config.log_dirs, "cleaner-offset-checkpoint") or {}
    found = []
    for tp, part_dir in sorted(parts.items()):
        check = functools.partial(
            check_partition,
            tp,
            part_dir,
            progress=progress.get(tp, 0),
            high_watermark=None if high_watermarks is None else high_watermarks.get(tp),
            fingerprint=out.fingerprints.get(tp),
            known=tp in out.fingerprints,
            cleaned_to=cleaned.get(tp, 0),
        )
        start = _log_start(part_dir, log_starts, tp)
        div = check(log_start=start)
        if div is not None and (later := _log_start(part_dir, log_starts, tp)) > start:
            # retention deleted the segment of the lake's last batch meanwhile (the lake group
            # holds offsets from its progress on, not the batch before): judge the log as it
            # is now, where that batch is below the log start and nothing can be compared
            div = check(log_start=later)
        if div is not None:
            found.append(div)
    if not found:
        return out
    if config.on_divergence == "fail":
        raise divergence_error(found, diverged_path=config.diverged_path)
    for div in found:
        tp = (div.topic, div.partition)
        start = _log_start(parts[tp], log_starts, tp)
        point = divergence_point(config.records_path, parts[tp], div, start)
        out.starts[tp] = point
        out.ids[tp] = rewind_id(tp, div.progress, out.fingerprints.get(tp))
        out.reasons[tp] = div.describe()
        log(f"DIVERGED {div.describe()}; rewinding {tp[0]}/{tp[1]} from offset {point}")
    return out


def _rewind(
    config: IngestConfig,
    staged: StagedWrite,
    divergence: Divergences,
    summary: IngestSummary,
    log: Log,
) -> dict[str, Any]:
    """Rewind step 1 (``diverged`` written); returns what the records commit needs for step 2."""
    if not divergence.starts:
        return {}
    options = {
        "compression": config.compression,
        "max_rows_per_file": config.max_rows_per_file,
        **RECORDS_PARQUET_OPTIONS,
    }
    rewind = plan_rewind(
        config.records_path,
        divergence.starts,
        divergence.ids,
        divergence.reasons,
        write_id=staged.write_id,
        writer_options=options,
    )
    summary.diverged_rows = write_diverged(
        config.diverged_path, rewind, compression=config.compression
    )
    summary.rewinds = [
        f"{t}/{p} from offset {d}" for (t, p), d in sorted(divergence.starts.items())
    ]
    log(
        f"moved {summary.diverged_rows} rows to {config.diverged_path}: {rewind.describe()}; "
        f"{len(rewind.removes)} data files rewritten in the records commit"
    )
    return {
        "extra_files": rewind.kept_files,
        "removes": rewind.removes,
        "read_version": rewind.read_version,
        "rewind_apps": {app_id(t, p) for t, p in divergence.starts},
    }
