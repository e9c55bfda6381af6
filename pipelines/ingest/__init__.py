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
   With ``isolation="read_committed"`` (the default) the same pass also collects each
   partition's transactional batches and markers, from which the driver finds its aborted
   transactions and its **last stable offset** (LSO, the first offset of the earliest
   transaction still open at the high watermark) (:mod:`pipelines.sources.transactions`);
   a partition holding an aborted or an open transaction has its tasks' files discarded and
   is read again only below its LSO with the batches of aborted transactions left out
   (:mod:`pipelines.ingest.committed`: one Spark job when, as usually, there is none), so
   ``records`` never holds an aborted record and an open transaction waits for a later run.
   ``"read_uncommitted"`` reads everything below the high watermark (control batches are
   never records);
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

Modules: this one plans and runs steps 1 and 2; :mod:`pipelines.ingest.config` (the settings,
the summary), :mod:`pipelines.ingest.tasks` (the executors' side of step 2 and how it is cut
into tasks), :mod:`pipelines.ingest.committed` (step 2 under ``read_committed``),
:mod:`pipelines.ingest.commit` (steps 3 and 4).
"""

from __future__ import annotations

import functools
import json
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from logstore.objectstore import LakeLocation
from pipelines.config import (
    ISOLATION_LEVELS,
)
from pipelines.delta import read_app_transactions
from pipelines.delta.commit import ensure_table
from pipelines.delta.direct import StagedWrite, stage_files
from pipelines.delta.files import RECORDS_PARQUET_OPTIONS
from pipelines.divergence import (
    DIVERGED_ARROW_SCHEMA,
    DIVERGED_PARTITION_BY,
    check_partition,
    divergence_error,
    divergence_point,
    read_fingerprints,
    rewind_id,
)
from pipelines.ingest.commit import QUARANTINE_ARROW_SCHEMA, Divergences, finish_run
from pipelines.ingest.committed import stage_committed
from pipelines.ingest.config import (
    APP_PREFIX,
    INTERNAL_TOPIC_PREFIX,
    RECORDS_TABLE,
    Gap,
    IngestConfig,
    IngestSummary,
    Log,
    TopicPartition,
    app_id,
    load_config,
)
from pipelines.ingest.tasks import PIECES_PER_TASK, _read_ranges, _with_aborted, schedule_tasks
from pipelines.lake_group import commit_lake_offsets
from pipelines.logdir import (
    LOG_START_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    PartitionDir,
    log_start_offset,
    merged_checkpoint,
    partition_dirs,
)
from pipelines.sources import RECORDS_ARROW_SCHEMA
from pipelines.sources.plan import (
    parse_options,
    plan_ranges,
    replanned,
)
from pipelines.sources.tier import (
    TierPlan,
    plan_summary,
    plan_tier,
    tier_tasks,
)
from pipelines.sources.transactions import PartitionTxns

__all__ = [
    "APP_PREFIX",
    "INTERNAL_TOPIC_PREFIX",
    "ISOLATION_LEVELS",
    "PIECES_PER_TASK",
    "RECORDS_TABLE",
    "Divergences",
    "Gap",
    "IngestConfig",
    "IngestSummary",
    "Log",
    "app_id",
    "finish_run",
    "load_config",
    "read_progress",
    "run_ingest",
    "schedule_tasks",
    "stage_records",
]


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


def _ensure_tables(config: IngestConfig) -> None:
    """``records``, ``quarantine`` and ``diverged`` exist from the first run on (empty)."""
    ensure_table(config.records_path, RECORDS_ARROW_SCHEMA, ["topic", "date"])
    ensure_table(config.quarantine_path, QUARANTINE_ARROW_SCHEMA, ["topic"])
    ensure_table(config.diverged_path, DIVERGED_ARROW_SCHEMA, DIVERGED_PARTITION_BY)


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
    total = sum(r.end - r.start for r in ranges)
    log(
        f"reading {len(ranges)} ranges ({total / 1e6:.1f} MB) of {len(starts)} partitions up to "
        f"their high watermarks in {len(tasks)} tasks"
    )

    def stage(items: Sequence[Any], *, collect_txn: bool = False, **more: Any) -> StagedWrite:
        read = functools.partial(_read_ranges, options=source, collect_txn=collect_txn)
        return stage_records(spark, config, items, read, log, **more)

    head = tier_tasks(tier.ranges, cores)
    txns: dict[TopicPartition, PartitionTxns] = {}
    with _ProgressReporter(spark, config.progress_interval_s, log):
        if config.isolation == "read_committed" and ranges:
            staged, txns = stage_committed(tasks, head=head, stage=stage, summary=summary, log=log)
        else:
            staged = stage([*head, *_with_aborted(tasks, {})])
    # the offsets this run may ingest end at the high watermark, or the LSO below it
    limits = dict(high_watermarks) if high_watermarks is not None else None
    for tp, found in txns.items():
        if found.open_from is not None:
            limits = limits if limits is not None else {}
            limits[tp] = found.lso(limits.get(tp, found.open_from))
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
    *,
    into: StagedWrite | None = None,
) -> StagedWrite:
    """The run's ``records`` files, staged by the executors (``read`` per task: its rows, then
    its reports), in the table's one shape (schema, partitions, Parquet options) whichever
    source the rows came from (log dirs, the tier, Fetch); the files of runs killed before
    their commit are reaped first. ``into``: more tasks of that staged write (a
    ``read_committed`` re-read, :mod:`pipelines.ingest.committed`). Ends with
    :func:`finish_run`."""
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
        into=into,
    )
    if staged.reaped and into is None:
        log(f"removed {staged.reaped} data files of earlier runs that were killed before commit")
    return staged


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
