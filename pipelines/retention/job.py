"""The log retention job: Kafka's retention over every partition, never ahead of the lake.

A run:

1. on the driver, lists the partition directories of every log dir and builds one
   :class:`~pipelines.retention.plan.PartitionTask` each: the topic's effective
   ``retention.ms``/``retention.bytes``/``cleanup.policy`` (``<log_dir>/topic-configs``
   overrides over the broker defaults of ``broker.properties``), its log start offset and high
   watermark (the log dir's checkpoints) and, when the topic is ingested, its ingest progress
   (``records``' app transactions);
2. on the executors, scans each partition's segment files and plans (see
   :mod:`pipelines.retention.plan`): Kafka's decisions, then the lake bound;
3. applies the new log start offsets: with ``bootstrap`` through Kafka's DeleteRecords API
   on the running broker (it advances the log start offset, renames the segments wholly below
   it ``.deleted`` and removes them after ``file.delete.delay.ms``, and checkpoints the log
   start offset), or without one directly on the log dirs under their ``.lock``
   (``LogManager``: fails cleanly when a broker holds the lock), or not at all (dry run);
4. appends what went to ``<lake>/retention_log`` (the Delta engine's driver-side append, one
   app transaction per run id: see :func:`append_retention_log`).

Crash behaviour: nothing is deleted before step 3; each DeleteRecords is atomic in the broker
(log start offset first, then the segment renames), and the offline path goes through the
broker's own code, whose next start recovers from any interruption (``.deleted`` leftovers are
removed, the log start offset is at least the first segment's base). A run killed between
the chunks of step 3, or between steps 3 and 4, has left its intended ``retention_log`` rows in
a journal before deleting anything; the next run settles it before it plans, so every removed
segment gets exactly one row (:mod:`pipelines.retention.journal`).

Crash tests: ``LOGLAKE_FAILPOINT=retention.after_delete_chunk`` kills the job (every process of
its session) once the broker answered the first DeleteRecords request; ``[retention]
delete_records_chunk`` sets how many partitions one request carries.
"""

from __future__ import annotations

import datetime
import functools
import os
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from kio.schema.delete_records.v2.request import (
    DeleteRecordsPartition,
    DeleteRecordsRequest,
    DeleteRecordsTopic,
)
from kio.schema.errors import ErrorCode
from kio.schema.types import TopicName
from kio.static.primitive import i32, i64

from logstore.errors import InvalidConfigError, LogDirLockedError, LoglakeError
from logstore.failpoints import failpoint, kill_session
from logstore.objectstore import LakeLocation
from logstore.server.config import BrokerConfig
from logstore.storage.config import LogConfig
from logstore.storage.dirlock import DirLock
from logstore.storage.log_manager import LogManager
from logstore.storage.retention import RULES
from logstore.storage.topic_config import read_topic_configs
from logstore.tools.client_config import ClientConfig
from logstore.tools.connection import KafkaConnection
from pipelines.config import job_settings, kafka_client_config, read_pipeline_toml
from pipelines.delta.commit import ensure_table, load_table
from pipelines.delta.direct import append_table
from pipelines.ingest import INTERNAL_TOPIC_PREFIX, RECORDS_TABLE, read_progress
from pipelines.logdir import (
    LOG_START_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    partition_dirs,
    read_checkpoint,
)
from pipelines.retention.journal import clear_pending, settle_pending, write_pending
from pipelines.retention.plan import (
    PartitionPlan,
    PartitionTask,
    SegmentDecision,
    from_wire,
    plan_task,
)
from pipelines.sources.plan import replanned

__all__ = [
    "RETENTION_LOG_APP",
    "RETENTION_LOG_SCHEMA",
    "RETENTION_LOG_TABLE",
    "RetentionConfig",
    "RetentionSummary",
    "build_tasks",
    "load_retention_config",
    "plan_local",
    "plan_spark",
    "run_retention",
]

RETENTION_LOG_TABLE = "retention_log"
# app id prefix of the retention_log's app transactions: one app per run id that logged rows
RETENTION_LOG_APP = "loglake-retention:"
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BROKER_CONFIG = ROOT / "conf" / "broker.properties"
_DELETE_RECORDS_CHUNK = 1000  # partitions per DeleteRecords request ([retention] default)
FAILPOINT_AFTER_CHUNK = "retention.after_delete_chunk"
_TIMEOUT: Any = datetime.timedelta(seconds=30)
Log = Callable[[str], None]

RETENTION_LOG_SCHEMA = pa.schema(
    [
        ("source", pa.string()),  # "log" (segments) or "records" (table rows)
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("segment_base_offset", pa.int64()),
        ("end_offset", pa.int64()),  # exclusive
        ("bytes", pa.int64()),
        ("rows", pa.int64()),
        ("largest_timestamp", pa.int64()),
        ("rule", pa.string()),
        ("forced", pa.bool_()),
        ("removed_at", pa.timestamp("us", tz="UTC")),
        ("run_id", pa.string()),
    ]
)


@dataclass(frozen=True)
class RetentionConfig:
    """What ``conf/pipeline.toml`` says about a retention run (plus the command line)."""

    log_dirs: tuple[str, ...]
    lake: str
    broker_config: str
    ingest_topics: tuple[str, ...] | None = None
    app_name: str = "loglake-retention"
    master: str | None = None
    spark_conf: dict[str, str] = field(default_factory=dict)
    records_retention: str = "forever"
    vacuum_hours: float = 168.0
    zorder: bool = False
    delete_records_chunk: int = _DELETE_RECORDS_CHUNK
    kafka: ClientConfig | None = None  # [kafka]: how DeleteRecords connects to the broker
    # [ingest] bootstrap_servers: the topic configs of records = "topic" without log dirs
    bootstrap_servers: str = ""

    @property
    def records_path(self) -> str:
        return LakeLocation.parse(self.lake).join(RECORDS_TABLE).uri

    @property
    def retention_log_path(self) -> str:
        return LakeLocation.parse(self.lake).join(RETENTION_LOG_TABLE).uri


def load_retention_config(
    path: str | Path,
    *,
    log_dirs: Iterable[str] | None = None,
    lake: str | None = None,
    broker_config: str | None = None,
) -> RetentionConfig:
    """``[paths]``, ``[spark]``, ``[ingest] topics`` and ``[retention]`` of a pipeline TOML."""
    p = Path(path)
    data = read_pipeline_toml(p)
    retention = data.get("retention", {})
    # no log dirs ([paths] log_dirs = []): the table side alone (see run_retention)
    common = job_settings(data, p, "retention", log_dirs=log_dirs, lake=lake, need_log_dirs=False)
    topics = data.get("ingest", {}).get("topics") or None
    records = str(retention.get("records", "forever"))
    try:
        parse_records_retention(records)
    except ValueError as exc:
        raise InvalidConfigError(f"[retention] records: {exc}", path=str(p)) from None
    try:
        vacuum_hours = float(retention.get("vacuum_hours", 168))
    except (TypeError, ValueError):
        raise InvalidConfigError("[retention] vacuum_hours must be a number", path=str(p)) from None
    if vacuum_hours < 0:
        raise InvalidConfigError("[retention] vacuum_hours must be >= 0", path=str(p))
    chunk = retention.get("delete_records_chunk", _DELETE_RECORDS_CHUNK)
    if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
        raise InvalidConfigError(
            "[retention] delete_records_chunk must be an integer >= 1", path=str(p)
        )
    return RetentionConfig(
        log_dirs=common.log_dirs,
        lake=common.lake,
        broker_config=str(
            Path(broker_config or retention.get("broker_config") or DEFAULT_BROKER_CONFIG)
        ),
        ingest_topics=tuple(topics) if topics else None,
        app_name=common.app_name,
        master=common.master,
        spark_conf=common.spark_conf,
        records_retention=records,
        vacuum_hours=vacuum_hours,
        zorder=bool(retention.get("zorder", False)),
        delete_records_chunk=chunk,
        kafka=kafka_client_config(data, p),
        bootstrap_servers=str(data.get("ingest", {}).get("bootstrap_servers") or ""),
    )


_UNITS = {"d": 86_400_000, "h": 3_600_000, "m": 60_000}


def parse_records_retention(value: str) -> str | int:
    """``[retention] records``: ``"forever"``, ``"topic"`` (the topic's ``retention.ms``) or
    an age such as ``"30d"``, ``"12h"``, ``"90m"`` (returned in milliseconds)."""
    text = value.strip()
    if text in ("forever", "topic"):
        return text
    number, unit = text[:-1], text[-1:]
    if unit in _UNITS and number.isdigit() and int(number) > 0:
        return int(number) * _UNITS[unit]
    raise ValueError(f"{value!r}: expected forever, topic or an age like 30d, 12h, 90m")


def broker_defaults(path: str) -> LogConfig:
    """The broker's default topic config, exactly as the broker derives it from its file."""
    return LogConfig.from_properties(BrokerConfig.load(path).topic_defaults())


def lake_protected(topic: str, ingest_topics: Iterable[str] | None) -> bool:
    """Whether ingest takes ``topic`` (the selection of ``pipelines.ingest``)."""
    if ingest_topics:
        return topic in set(ingest_topics)
    return not topic.startswith(INTERNAL_TOPIC_PREFIX)


def build_tasks(
    log_dirs: Iterable[str],
    defaults: LogConfig,
    progress: Mapping[tuple[str, int], int],
    ingest_topics: Iterable[str] | None,
) -> list[PartitionTask]:
    """Step 1: one task per partition directory of every log dir."""
    topics = tuple(ingest_topics) if ingest_topics else None
    tasks: list[PartitionTask] = []
    for d in log_dirs:
        parts = partition_dirs(d)
        overrides = read_topic_configs(d)
        starts = read_checkpoint(d, LOG_START_OFFSET_CHECKPOINT) or {}
        hws = read_checkpoint(d, REPLICATION_OFFSET_CHECKPOINT) or {}
        configs: dict[str, LogConfig] = {}
        for part in parts:
            topic, partition, path = part
            cfg = configs.get(topic)
            if cfg is None:
                cfg = LogConfig.from_properties(overrides.get(topic, {}), defaults=defaults)
                configs[topic] = cfg
            tasks.append(
                PartitionTask(
                    str(path),
                    topic,
                    partition,
                    cfg.retention_ms,
                    cfg.retention_bytes,
                    cfg.delete,
                    starts.get(part.tp, 0),
                    hws.get(part.tp),
                    progress.get(part.tp, 0) if lake_protected(topic, topics) else None,
                )
            )
    tasks.sort(key=lambda t: (t.topic, t.partition))
    return tasks


def plan_local(tasks: list[PartitionTask], *, now_ms: int, force: bool) -> list[PartitionPlan]:
    """Step 2 in this process (the single-process scan the benchmark compares with): the same
    :func:`~pipelines.retention.plan.plan_task` as the executors run, over every task."""
    return [from_wire(w) for w in plan_task(tasks, now_ms=now_ms, force=force)]


def plan_spark(
    spark: Any,
    tasks: list[PartitionTask],
    *,
    now_ms: int,
    force: bool,
    slices_per_core: int = 2,
) -> list[PartitionPlan]:
    """Step 2 on the executors: the tasks cut into ``slices_per_core`` slices per core.

    One Spark job; each task plans a contiguous slice of partitions (a topic's partitions
    stay together) and sends back plain tuples (:data:`~pipelines.retention.plan.WirePlan`).
    Few slices: Spark's cost per task (scheduling, a Python worker round trip) is paid per
    slice, and two per core still let a core that finishes early take over the rest."""
    if not tasks:
        return []
    sc = spark.sparkContext
    slices = max(1, min(len(tasks), sc.defaultParallelism * slices_per_core))
    rdd = sc.parallelize(tasks, slices).mapPartitions(
        functools.partial(plan_task, now_ms=now_ms, force=force)
    )
    return [from_wire(w) for w in rdd.collect()]


@dataclass
class RetentionSummary:
    """What a run decided and did (``mode``: dry-run, online or offline)."""

    mode: str = "dry-run"
    partitions: int = 0
    segments: int = 0
    planned_segments: int = 0
    deleted_segments: int = 0
    deleted_bytes: int = 0
    held_segments: int = 0  # wanted by retention, not yet in the lake
    held_bytes: int = 0
    held_partitions: int = 0
    settled_segments: int = 0  # removed by an interrupted run, logged by this one
    unknown_timestamps: int = 0
    by_rule: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    forced: bool = False
    log_starts: dict[str, int] = field(default_factory=dict)
    plan_seconds: float = 0.0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        return (
            f"retention summary ({self.mode}): partitions={self.partitions} "
            f"segments={self.segments} deleted={self.deleted_segments} segments "
            f"({self.deleted_bytes} bytes) held_not_in_lake={self.held_segments} segments "
            f"in {self.held_partitions} partitions, by rule {self.by_rule}, "
            f"errors={len(self.errors)} seconds={self.seconds:.1f}"
        )


def format_plan(plans: Iterable[PartitionPlan]) -> str:
    """The plan as a text table, one row per segment retention wants."""
    head = ("topic", "partition", "segment", "next_offset", "bytes", "largest_ts", "rule", "action")
    rows = [head]
    for p in plans:
        for d in p.decisions:
            ts = "?" if d.timestamp_source == "unknown" else f"{d.largest_timestamp}"
            if d.timestamp_source == "mtime":
                ts += " (mtime)"
            rows.append(
                (
                    d.topic,
                    str(d.partition),
                    str(d.base_offset),
                    str(d.next_offset),
                    str(d.size),
                    ts,
                    d.rule,
                    d.action,
                )
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def delete_records_online(
    bootstrap: str,
    starts: Mapping[tuple[str, int], int],
    *,
    chunk_size: int = _DELETE_RECORDS_CHUNK,
    client: ClientConfig | None = None,
) -> dict[Any, Any]:
    """DeleteRecords on the broker, ``chunk_size`` partitions per request (in topic, partition
    order), connecting with ``client`` (``[kafka]``; None: PLAINTEXT): ``{(topic, partition):
    low watermark or error name}``."""
    out: dict[tuple[str, int], int | str] = {}
    items = sorted(starts.items())
    with KafkaConnection(bootstrap, client_id="loglake-retention", config=client) as conn:
        for i in range(0, len(items), chunk_size):
            chunk = items[i : i + chunk_size]
            by_topic: dict[str, list[DeleteRecordsPartition]] = {}
            for (topic, partition), offset in chunk:
                by_topic.setdefault(topic, []).append(
                    DeleteRecordsPartition(partition_index=i32(partition), offset=i64(offset))
                )
            resp = conn.call(
                DeleteRecordsRequest(
                    topics=tuple(
                        DeleteRecordsTopic(name=TopicName(t), partitions=tuple(ps))
                        for t, ps in by_topic.items()
                    ),
                    timeout=_TIMEOUT,
                )
            )
            for t in resp.topics:
                for p in t.partitions:
                    key = (str(t.name), int(p.partition_index))
                    if p.error_code == ErrorCode.none:
                        out[key] = int(p.low_watermark)
                    else:
                        out[key] = p.error_code.name.upper()
            if i == 0:
                failpoint(FAILPOINT_AFTER_CHUNK, kill=kill_session)
    return out


def _broker_running(exc: LogDirLockedError) -> LogDirLockedError:
    return LogDirLockedError(
        f"{exc}: a broker is running on the log dir; give --bootstrap-server to delete through it"
    )


def _check_unlocked(log_dirs: Iterable[str]) -> None:
    for d in log_dirs:
        lock = DirLock(d)
        try:
            lock.acquire()
        except LogDirLockedError as exc:
            raise _broker_running(exc) from None
        lock.release()


def delete_records_offline(
    log_dirs: Iterable[str], defaults: LogConfig, starts: Mapping[tuple[str, int], int]
) -> dict[Any, Any]:
    """The same as DeleteRecords, directly on the log dirs under their ``.lock``."""
    out: dict[tuple[str, int], int | str] = {}
    try:
        manager = LogManager(list(log_dirs), default_config=defaults, background=False)
    except LogDirLockedError as exc:
        raise _broker_running(exc) from None
    try:
        for (topic, partition), offset in sorted(starts.items()):
            lg = manager.get_log(topic, partition)
            if lg is None:
                out[(topic, partition)] = "UNKNOWN_TOPIC_OR_PARTITION"
                continue
            try:
                out[(topic, partition)] = lg.delete_records(offset)
            except LoglakeError as exc:
                out[(topic, partition)] = f"{type(exc).__name__}: {exc}"
    finally:
        manager.shutdown()
    return out


def logged_run_ids(path: str, run_ids: Iterable[str]) -> set[str]:
    """Which of ``run_ids`` have rows in the ``retention_log`` table at ``path``."""
    ids = list(run_ids)
    dt = load_table(path) if ids else None
    if dt is None:
        return set()
    found = dt.to_pyarrow_table(columns=["run_id"], filters=[("run_id", "in", ids)])
    return {str(v) for v in found.column("run_id").to_pylist()}


def _log_row(d: SegmentDecision, removed_at: Any, run_id: str) -> dict[str, Any]:
    return {
        "source": "log",
        "topic": d.topic,
        "partition": d.partition,
        "segment_base_offset": d.base_offset,
        "end_offset": d.next_offset,
        "bytes": d.size,
        "rows": None,
        "largest_timestamp": d.largest_timestamp,
        "rule": d.rule,
        "forced": d.action == "forced",
        "removed_at": removed_at,
        "run_id": run_id,
    }


def append_retention_log(path: str, rows: list[dict[str, Any]]) -> None:
    """Append rows to the ``retention_log`` Delta table, created (empty) by the first run even
    when it removed nothing, so that queries of it never fail on a missing table.

    Through the Delta engine's driver-side append (:func:`~pipelines.delta.direct.append_table`,
    the run's storage settings), with one app transaction per ``run_id`` of the rows
    (:data:`RETENTION_LOG_APP` + run id, version 1): a run's rows go in once, even when the
    commit is retried after an attempt whose answer was lost (a commit on S3 that landed but
    timed out). Across runs, the journal's ``logged_run_ids`` check does the same."""
    if not rows:
        ensure_table(path, RETENTION_LOG_SCHEMA, [])
        return
    table = pa.Table.from_pylist(rows, schema=RETENTION_LOG_SCHEMA)
    apps = {f"{RETENTION_LOG_APP}{run_id}": 1 for run_id in sorted({r["run_id"] for r in rows})}
    append_table(path, table, schema=RETENTION_LOG_SCHEMA, app_transactions=apps)


NO_LOG_DIRS = (
    "no log dirs (log_dirs = []): log retention is the broker's own here (its periodic "
    "retention, lake-bounded with log.retention.lake.group); nothing planned or deleted"
)


def run_retention(
    spark: Any,
    config: RetentionConfig,
    *,
    bootstrap: str | None = None,
    dry_run: bool = False,
    force: bool = False,
    now_ms: int | None = None,
    log: Log = lambda _m: None,
    plan_out: list[PartitionPlan] | None = None,
) -> RetentionSummary:
    """One run (see the module docstring); ``spark`` None plans in this process.

    Without log dirs (``[paths] log_dirs = []``: a cluster that does not share the broker's
    disk) there is no log side to plan: a log's retention is then the broker's own job, as in
    Kafka (its periodic retention, bounded by the lake through ``log.retention.lake.group``).
    The run says so, makes sure ``retention_log`` exists and returns mode ``broker`` with
    nothing planned; the table side (``jobs/maintain.py``) works without log dirs."""
    started = time.monotonic()
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    summary = RetentionSummary(forced=force)
    if not config.log_dirs:
        summary.mode = "broker"
        log(NO_LOG_DIRS)
        if not dry_run:
            append_retention_log(config.retention_log_path, [])
        summary.seconds = time.monotonic() - started
        return summary
    summary.mode = "dry-run" if dry_run else ("online" if bootstrap else "offline")
    defaults = broker_defaults(config.broker_config)
    if summary.mode == "offline":
        _check_unlocked(config.log_dirs)  # fail before planning, not after
    progress = read_progress(config.records_path)  # {} before the first ingest
    tasks = build_tasks(config.log_dirs, defaults, progress, config.ingest_topics)
    if not dry_run:
        settled = settle_pending(
            config.lake,
            {(t.topic, t.partition): t.path for t in tasks},
            functools.partial(logged_run_ids, config.retention_log_path),
            functools.partial(append_retention_log, config.retention_log_path),
        )
        summary.settled_segments = len(settled)
        if settled:
            log(f"logged {len(settled)} segments an interrupted run removed")
    log(f"{len(tasks)} partitions in {', '.join(config.log_dirs)}; progress for {len(progress)}")
    listed = [tasks]

    def plan_once() -> list[PartitionPlan]:
        # a partition directory gone for the driver too is a topic deleted under the run: list
        # again (replanned); one only the executors miss: LogDirNotSharedError, exit 2
        current = (
            listed.pop()
            if listed
            else build_tasks(config.log_dirs, defaults, progress, config.ingest_topics)
        )
        if spark is None:
            return plan_local(current, now_ms=now, force=force)
        return plan_spark(spark, current, now_ms=now, force=force)

    plans = replanned(plan_once, what="retention", log=log)
    summary.plan_seconds = time.monotonic() - started
    if plan_out is not None:
        plan_out.extend(plans)
    summary.by_rule = dict.fromkeys(RULES, 0)
    starts: dict[tuple[str, int], int] = {}
    for p in plans:
        summary.partitions += 1
        summary.segments += p.segments
        summary.unknown_timestamps += p.unknown_timestamps
        held = [d for d in p.decisions if d.action == "held"]
        summary.planned_segments += len(p.decisions) - len(held)
        summary.held_segments += len(held)
        summary.held_bytes += sum(d.size for d in held)
        summary.held_partitions += 1 if held else 0
        if p.new_log_start is not None:
            starts[(p.topic, p.partition)] = p.new_log_start
    if dry_run or not starts:
        if not dry_run:
            append_retention_log(config.retention_log_path, [])  # the table exists from now on
        for p in plans:
            for d in p.decisions:
                if d.action != "held":
                    summary.by_rule[d.rule] += 1
        summary.seconds = time.monotonic() - started
        return summary
    run_id = f"retention-{now}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    journal = write_pending(
        config.lake,
        run_id,
        [
            _log_row(d, None, run_id)
            for p in plans
            if (p.topic, p.partition) in starts
            for d in p.decisions
            if d.action != "held"
        ],
    )
    log(f"deleting below new log starts in {len(starts)} partitions ({summary.mode})")
    if bootstrap:
        results = delete_records_online(
            bootstrap, starts, chunk_size=config.delete_records_chunk, client=config.kafka
        )
    else:
        results = delete_records_offline(config.log_dirs, defaults, starts)
    removed_at = datetime.datetime.now(datetime.UTC)
    rows: list[dict[str, Any]] = []
    for p in plans:
        key = (p.topic, p.partition)
        if key not in starts:
            continue
        result = results.get(key, "NO_ANSWER")
        if isinstance(result, str):
            summary.errors.append(f"{p.topic}/{p.partition}: {result}")
            continue
        summary.log_starts[f"{p.topic}/{p.partition}"] = result
        for d in p.decisions:
            if d.action == "held" or d.next_offset > result:
                continue
            summary.deleted_segments += 1
            summary.deleted_bytes += d.size
            summary.by_rule[d.rule] += 1
            rows.append(_log_row(d, removed_at, run_id))
    append_retention_log(config.retention_log_path, rows)
    clear_pending(journal)
    summary.seconds = time.monotonic() - started
    return summary
