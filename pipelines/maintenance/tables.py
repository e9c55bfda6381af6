"""Records retention and Delta table maintenance, with delta-rs (no Spark needed).

**Records retention** (``[retention] records`` in ``conf/pipeline.toml``): ``forever`` (the
default: the lake keeps everything), ``topic`` (each topic's ``retention.ms``, from the log
dirs' topic configs over the broker defaults; topics whose ``cleanup.policy`` lacks
``delete`` or whose ``retention.ms`` is -1 are kept) or an age (``30d``, ``12h``, ``90m``).
Rows are removed only as whole ``date`` partitions: a day goes once all of it is past the
cutoff (``date < date(now - retention)``, UTC), so a row is kept up to one day longer than the
setting says and no data file is ever rewritten. All topics go in **one** delete commit
(predicate on the partition columns). What went (per topic and Kafka partition: rows, first
and last offset) is returned for ``retention_log``.

**Maintenance** of one table (:func:`maintain_table`), each step one commit (vacuum: delta-rs
records a start and an end commit), in order: ``optimize`` (compaction of small files, or
z-order by ``offset`` when asked and the table has that column; data files are rewritten,
rows unchanged, ``dataChange=false``; rows a deletion vector deletes stay deleted), ``vacuum``
of files unreferenced for longer than the horizon (delta-rs's, then the deletion vector and
change-data files it does not know, :mod:`pipelines.maintenance.orphans`), a checkpoint (it
keeps the deletion vector descriptors), and clean-up of log entries older than the table's
``delta.logRetentionDuration`` (30 days by default: the version history stays readable that
long).

Every step works on local disk and on an object store alike (``s3://``): delta-rs opens the
table with the run's storage options (:func:`logstore.objectstore.delta_target`), the table
list and the orphan files come through :class:`~logstore.objectstore.ObjectStore`. A store
that stops answering mid-step fails that step (reported in ``errors``; delta-rs's vacuum
deletes before it commits its end, so a re-run finds and removes the rest).

Concurrency: every step reads a snapshot and commits with delta-rs's conflict checks. An
ingest appending meanwhile does not conflict with compaction or vacuum (blind appends); a
step that does conflict (e.g. another maintenance run removed the same files) is retried on a
fresh snapshot up to ``retries`` times, then reported in the result's ``errors`` (the table is
unchanged by the failed step). Ingest's own commits retry the same way
(``pipelines.delta.commit``).
"""

from __future__ import annotations

import datetime
import os
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError

from logstore.errors import LoglakeError
from logstore.objectstore import LakeLocation, ObjectStore, delta_target
from logstore.storage.files import validate_topic
from pipelines.delta.commit import load_table
from pipelines.delta.files import table_location
from pipelines.maintenance.orphans import vacuum_orphans

__all__ = [
    "TablePlan",
    "TableReport",
    "find_tables",
    "maintain_table",
    "plan_table",
    "records_retention",
]

T = TypeVar("T")
TablePath = str | Path | LakeLocation
_DAY_MS = 86_400_000
# delta-rs's optimize target when the table has no delta.targetFileSize (100 MiB).
_TARGET_FILE_SIZE = 104_857_600


@dataclass
class TableReport:
    """What maintenance did to one table."""

    path: str
    version_before: int = -1
    version_after: int = -1
    files_before: int = 0
    files_after: int = 0
    optimize: dict[str, Any] = field(default_factory=dict)
    vacuumed_files: int = 0
    vacuumed_orphans: int = 0  # deletion vector and change-data files
    checkpoint: bool = False
    log_cleaned: bool = False
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TablePlan:
    """What :func:`maintain_table` would do to one table (``--dry-run``), read without a commit.

    ``optimize_files``: the data files optimize would rewrite (delta-rs's plan: with z-order
    every file; else, per partition, the files under the target size when there are at least
    two of them: a lone small file is left as it is). ``vacuum_files``: delta-rs's own vacuum
    dry run; ``vacuum_orphans``: the deletion vector and change-data files
    :func:`~pipelines.maintenance.orphans.vacuum_orphans` would remove. ``checkpoint_version``:
    the version a checkpoint would be written at. Paths are relative to the table root."""

    path: str
    version: int
    files: int
    optimize: str
    optimize_files: list[str] = field(default_factory=list)
    vacuum_files: list[str] = field(default_factory=list)
    vacuum_orphans: list[str] = field(default_factory=list)
    checkpoint_version: int = -1

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _open(loc: LakeLocation) -> DeltaTable:
    """The table at ``loc``, with the run's storage options."""
    uri, options = delta_target(loc)
    return DeltaTable(uri, storage_options=options)


def _relative(loc: LakeLocation, file: str) -> str:
    """A path delta-rs's vacuum reports (absolute on disk, a URI or a key elsewhere) relative
    to the table root."""
    if "://" in file or file.startswith("/"):
        try:
            return table_location(file).relative_to(loc)
        except LoglakeError:
            return file
    return file


def plan_table(path: TablePath, *, vacuum_hours: float, zorder: bool = False) -> TablePlan:
    """:class:`TablePlan` of the table at ``path``: reads its log and files, writes nothing."""
    import pyarrow as pa  # noqa: PLC0415

    loc = table_location(path)
    dt = _open(loc)
    adds = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    names = {f.name for f in dt.schema().fields}
    plan = TablePlan(loc.uri, version=dt.version(), files=len(adds), optimize="compact")
    if zorder and "offset" in names:
        plan.optimize = "z-order by offset"
        plan.optimize_files = sorted(str(a["path"]) for a in adds)
    else:
        target = int(dt.metadata().configuration.get("delta.targetFileSize", _TARGET_FILE_SIZE))
        small: dict[tuple[tuple[str, Any], ...], list[str]] = {}
        for a in adds:
            if int(a["size_bytes"]) < target:
                part = tuple(sorted((k, v) for k, v in a.items() if k.startswith("partition.")))
                small.setdefault(part, []).append(str(a["path"]))
        plan.optimize_files = sorted(f for files in small.values() if len(files) > 1 for f in files)
    plan.vacuum_files = sorted(
        _relative(loc, f)
        for f in dt.vacuum(
            retention_hours=int(vacuum_hours), dry_run=True, enforce_retention_duration=False
        )
    )
    plan.vacuum_orphans = vacuum_orphans(loc, vacuum_hours=vacuum_hours, dry_run=True)
    plan.checkpoint_version = plan.version + (1 if plan.optimize_files else 0)
    return plan


def find_tables(lake: str | Path) -> list[LakeLocation]:
    """Every Delta table under ``lake`` (a directory holding ``_delta_log``), two levels deep
    (``<lake>/records``, ``<lake>/topics/<name>``); one listing per directory on an object
    store."""
    root = table_location(lake)
    if root.is_local and not root.local_path.is_dir():
        return []
    store = ObjectStore(root)
    out: list[LakeLocation] = []
    for name in store.list_dirs():
        if name.startswith((".", "_")):
            continue
        children = store.list_dirs(name)
        if "_delta_log" in children:
            out.append(root.join(name))
            continue
        out.extend(
            root.join(name, sub)
            for sub in children
            if "_delta_log" in store.list_dirs(f"{name}/{sub}")
        )
    return out


def _retrying(step: Callable[[], T], retries: int) -> T:
    for attempt in range(1, retries + 1):
        try:
            return step()
        except CommitFailedError:
            if attempt == retries:
                raise
            time.sleep(0.05 * attempt)
    raise AssertionError("unreachable")


def maintain_table(
    path: TablePath,
    *,
    vacuum_hours: float,
    zorder: bool = False,
    retries: int = 5,
) -> TableReport:
    """Optimize, vacuum, checkpoint and clean up the log of the table at ``path``."""
    loc = table_location(path)
    report = TableReport(loc.uri)
    dt = _open(loc)
    report.version_before = dt.version()
    report.files_before = len(dt.file_uris())

    def optimize() -> dict[str, Any]:
        t = _open(loc)
        names = {f.name for f in t.schema().fields}
        if zorder and "offset" in names:
            return dict(t.optimize.z_order(["offset"]))
        return dict(t.optimize.compact())

    def vacuum() -> list[str]:
        return _open(loc).vacuum(
            retention_hours=int(vacuum_hours),
            dry_run=False,
            enforce_retention_duration=False,
        )

    steps: list[tuple[str, Callable[[], Any]]] = [
        ("optimize", optimize),
        ("vacuum", vacuum),
        ("vacuum_orphans", lambda: vacuum_orphans(loc, vacuum_hours=vacuum_hours)),
        ("checkpoint", lambda: _open(loc).create_checkpoint()),
        ("cleanup_metadata", lambda: _open(loc).cleanup_metadata()),
    ]
    for name, step in steps:
        try:
            out = _retrying(step, retries)
        except (CommitFailedError, DeltaError, OSError, LoglakeError) as exc:
            report.errors.append(f"{name}: {_one_line(exc)}")
            continue
        if name == "optimize":
            report.optimize = {k: v for k, v in out.items() if isinstance(v, (int, float, str))}
        elif name == "vacuum":
            report.vacuumed_files = len(out)
        elif name == "vacuum_orphans":
            report.vacuumed_orphans = len(out)
        elif name == "checkpoint":
            report.checkpoint = True
        else:
            report.log_cleaned = True
    try:
        dt = _open(loc)
    except (DeltaError, OSError) as exc:  # the store went away: the steps' errors say more
        report.errors.append(f"reading the table after the steps: {_one_line(exc)}")
        return report
    report.version_after = dt.version()
    report.files_after = len(dt.file_uris())
    return report


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _one_line(exc: BaseException) -> str:
    """``exc`` as one line: delta-rs's errors span lines, with terminal colours."""
    text = " ".join(_ANSI.sub("", str(exc)).split())
    return f"{type(exc).__name__}: {text.replace('↳ ', '')}"


def _cutoff_date(now_ms: int, retention_ms: int) -> datetime.date:
    cutoff = datetime.datetime.fromtimestamp((now_ms - retention_ms) / 1000, datetime.UTC)
    return cutoff.date()


def records_retention(
    records_path: TablePath,
    retention: Mapping[str, int],
    *,
    now_ms: int | None = None,
    retries: int = 5,
    dry_run: bool = False,
) -> tuple[list[dict[str, Any]], int | None, int]:
    """Delete the whole ``date`` partitions of each topic past its retention (ms) in one
    commit; returns (``retention_log`` rows, the new table version or None, rows deleted).

    The rows are counted from the snapshot before the delete; the deleted count comes from
    the delete itself (larger when an ingest added rows to a doomed day in between). With
    ``dry_run`` nothing is deleted: the rows say what would go, the version is None and the
    count is the snapshot's."""
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    loc = table_location(records_path)
    dt = load_table(loc)
    if dt is None:
        return [], None, 0
    dates: dict[str, set[datetime.date]] = {}
    for values in dt.partitions():
        topic, day = values.get("topic"), values.get("date")
        if topic is None or day is None:
            continue
        dates.setdefault(topic, set()).add(datetime.date.fromisoformat(day))
    clauses: list[str] = []
    cutoffs: dict[str, datetime.date] = {}
    for topic, days in sorted(dates.items()):
        ms = retention.get(topic)
        if ms is None or ms < 0:
            continue
        cutoff = _cutoff_date(now, ms)
        if not any(d < cutoff for d in days):
            continue
        validate_topic(topic)  # Kafka's name rules: no quote can reach the predicate
        cutoffs[topic] = cutoff
        clauses.append(f"(topic = '{topic}' AND date < '{cutoff.isoformat()}')")
    if not clauses:
        return [], None, 0
    predicate = " OR ".join(clauses)
    doomed = _doomed_ranges(dt, cutoffs)
    if dry_run:
        return (
            _log_rows(doomed, cutoffs, now, "dry-run"),
            None,
            sum(c for _, _, c in doomed.values()),
        )

    def delete() -> dict[str, Any]:
        return dict(_open(loc).delete(predicate))

    metrics = _retrying(delete, retries)
    version = _open(loc).version()
    rows = _log_rows(doomed, cutoffs, now, "records-retention")
    return rows, version, int(metrics.get("num_deleted_rows", 0))


def _log_rows(
    doomed: Mapping[tuple[str, int], tuple[int, int, int]],
    cutoffs: Mapping[str, datetime.date],
    now: int,
    run: str,
) -> list[dict[str, Any]]:
    """``retention_log`` rows of the doomed ranges (:func:`_doomed_ranges`)."""
    removed_at = datetime.datetime.now(datetime.UTC)
    # unique like the retention job's: retention_log takes each run id's rows once
    run_id = f"{run}-{now}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return [
        {
            "source": "records",
            "topic": topic,
            "partition": partition,
            "segment_base_offset": first,
            "end_offset": last + 1,
            "bytes": None,
            "rows": count,
            "largest_timestamp": None,
            "rule": f"records < {cutoffs[topic].isoformat()}",
            "forced": False,
            "removed_at": removed_at,
            "run_id": run_id,
        }
        for (topic, partition), (first, last, count) in sorted(doomed.items())
    ]


def _doomed_ranges(
    dt: DeltaTable, cutoffs: Mapping[str, datetime.date]
) -> dict[tuple[str, int], tuple[int, int, int]]:
    """Per (topic, Kafka partition) in the doomed days: first offset, last offset, rows."""
    import pyarrow.compute as pc  # noqa: PLC0415

    out: dict[tuple[str, int], tuple[int, int, int]] = {}
    for topic, cutoff in cutoffs.items():
        table = dt.to_pyarrow_table(
            filters=[("topic", "=", topic)], columns=["partition", "offset", "date"]
        )
        table = table.filter(pc.less(table["date"], cutoff))
        grouped = table.group_by("partition").aggregate(
            [("offset", "min"), ("offset", "max"), ("offset", "count")]
        )
        for r in grouped.to_pylist():
            out[(topic, int(r["partition"]))] = (
                int(r["offset_min"]),
                int(r["offset_max"]),
                int(r["offset_count"]),
            )
    if not out:
        raise LoglakeError("records retention found doomed days but no rows in them")
    return out
