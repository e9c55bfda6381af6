"""Direct writes: tasks that produce Arrow data in the Python worker and write it there.

Rows produced in Python never cross into the JVM and back (for nested columns that
conversion costs more than producing and writing the data together). :func:`stage_files`: the
driver hands small picklable *tasks* (one Spark partition each) to ``produce``, which runs in
the Python worker and yields ``pyarrow.RecordBatch``es that go straight to the sink's own
executor writer (:class:`~pipelines.delta.files.PartitionedFileWriter`: same file names,
partition directories, stats, ``max_rows_per_file``). Only the written files' metadata
(path, size, rows, partition values, stats JSON) travels back, together with any *reports*
``produce`` yields (JSON-able values that are not record batches: what a task saw, e.g. the
offsets it covered and the damage it found). The result is a :class:`StagedWrite`: the caller
looks at the reports, then commits every file in one Delta transaction
(:meth:`StagedWrite.commit`, carrying app transactions and expected versions,
:mod:`pipelines.delta.commit`) or aborts. :func:`write_direct` is stage + commit in one call.

The table is a local directory or an object-store prefix (``s3://...``): tasks write their
files through the store (:class:`~pipelines.delta.files.PartitionedFileWriter` with the
driver's :class:`~logstore.objectstore.StorageSettings`, shipped inside the task) and the
driver commits through delta-rs with put-if-absent (:mod:`pipelines.delta.commit`).

Crash tests: ``LOGLAKE_FAILPOINT=delta.before_commit`` kills every process of the session
(SIGKILL) after every file is written, just before the commit.

Crash behaviour: a failing task removes its own files; a failed job, an abort or a refused
commit removes every file carrying the write id; after a committed write, files of failed or
duplicate task attempts are removed. A process killed before the commit leaves only files no
snapshot references; the next :func:`stage_files` on the table removes them once the dead
write's lease expired (:mod:`pipelines.delta.staging`), never those of a write still running
(its lease is renewed by a heartbeat of its driver). Errors raised by ``produce`` reach the
caller inside the ``DeltaSinkError`` (as its cause), so their text can still be recognised.
"""

from __future__ import annotations

import json
import posixpath
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import SparkSession

from logstore.failpoints import failpoint, kill_session
from logstore.objectstore import LakeLocation, StorageSettings
from pipelines.delta.commit import (
    CommitResult,
    RemovedFile,
    check_app_transactions,
    check_schema,
    commit_files,
    load_table,
)
from pipelines.delta.errors import DeltaSinkError, first_error_line
from pipelines.delta.files import (
    PartitionedFileWriter,
    WrittenFile,
    cleanup_write_files,
    table_location,
)
from pipelines.delta.staging import WRITE_ID_KEY, Lease, check_lease, reap_crashed_writes
from pipelines.worker import start_task

__all__ = ["StagedWrite", "append_table", "run_in_job_group", "stage_files", "write_direct"]

T = TypeVar("T")
_JOB_GROUP = "spark.jobGroup.id"


def _wait_for_tasks(spark: SparkSession, group: str, *, timeout_s: float = 60.0) -> None:
    """Wait (bounded) until no task of job group ``group`` runs any more.

    A failed job reports its failure while the other tasks are still being killed; removing
    the write's files before they stop could miss a file one of them is still writing.
    """
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        active = 0
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job is not None else ():
                stage = tracker.getStageInfo(stage_id)
                active += stage.numActiveTasks if stage is not None else 0
        if active == 0:
            return
        time.sleep(0.1)


def run_in_job_group(spark: SparkSession, group: str, action: Callable[[], T]) -> T:
    """``action()`` with its Spark jobs in job group ``group``; when it fails, returns only
    after every task of the group has stopped (so files they write can be removed safely)."""
    sc = spark.sparkContext
    previous_group = sc.getLocalProperty(_JOB_GROUP)
    sc.setLocalProperty(_JOB_GROUP, group)
    try:
        return action()
    except BaseException:
        _wait_for_tasks(spark, group)
        raise
    finally:
        sc.setLocalProperty(_JOB_GROUP, previous_group)  # type: ignore[arg-type]


def _task_writer(
    root: LakeLocation,
    *,
    settings: StorageSettings,
    write_id: str,
    produce: Callable[[T], Iterable[Any]],
    schema: pa.Schema,
    partition_by: list[str],
    writer_options: Mapping[str, Any],
    first_task: int = 0,
) -> Callable[[int, Iterable[T]], Iterator[str]]:
    """The function each Spark task runs: produce, write files, yield their metadata and the
    task's reports as JSON lines (``{"file": ...}`` / ``{"report": ..., "task": ...}``); the
    task's id (in its files' names) is ``first_task`` plus its Spark partition index."""

    def run(index: int, items: Iterable[T]) -> Iterator[str]:
        index += first_task
        start_task()  # no full GC of the worker's modules between tasks
        ctx = TaskContext.get()
        attempt = ctx.attemptNumber() if ctx is not None else 0
        # the lease gone: the driver is over or died, and a reaper may be at its files
        check_lease(root, write_id, settings=settings)
        out = PartitionedFileWriter(
            root,
            settings=settings,
            write_id=write_id,
            task_id=index,
            attempt=attempt,
            partition_by=partition_by,
            **writer_options,
        )
        reports: list[Any] = []
        try:
            for item in items:
                for batch in produce(item):
                    if not isinstance(batch, pa.RecordBatch):
                        reports.append(batch)
                        continue
                    table = pa.Table.from_batches([batch])
                    if table.schema.types != schema.types:
                        table = table.cast(schema)
                    out.write(table)
            files = out.close()
            check_lease(root, write_id, settings=settings)  # still the driver's to commit
        except BaseException:
            out.abort()
            raise
        for f in files:
            yield json.dumps({"file": asdict(f)})
        for r in reports:
            yield json.dumps({"report": r, "task": index})

    return run


@dataclass
class StagedWrite:
    """Data files written by :func:`stage_files` (referenced by no snapshot yet).

    ``reports`` holds what the tasks' ``produce`` yielded besides record batches, in task
    order, and ``report_tasks`` the id of the task that yielded each. Call :meth:`commit` or
    :meth:`abort` exactly once.
    """

    location: LakeLocation
    write_id: str
    schema: pa.Schema
    partition_by: list[str]
    settings: StorageSettings
    lease: Lease | None = None
    files: list[WrittenFile] = field(default_factory=list)
    reports: list[Any] = field(default_factory=list)
    report_tasks: list[int] = field(default_factory=list)
    reaped: int = 0  # files of earlier crashed writes removed before this one started
    tasks: int = 0  # tasks staged so far (the next stage_files(into=...) numbers on from here)

    @property
    def root(self) -> str:
        """The table's URI (an absolute path on local disk)."""
        return self.location.uri

    @property
    def num_rows(self) -> int:
        return sum(f.num_rows for f in self.files)

    def commit(
        self,
        *,
        app_transactions: Mapping[str, int] | None = None,
        expected_versions: Mapping[str, int | None] | None = None,
        commit_info: Mapping[str, str] | None = None,
        extra_files: Sequence[WrittenFile] = (),
        removes: Sequence[RemovedFile] = (),
        read_version: int | None = None,
        rewind_apps: Collection[str] = (),
    ) -> CommitResult:
        """Append every staged file in one Delta commit (with the app transactions); a refused
        commit removes the files and raises, a committed one removes leftover attempt files.

        ``extra_files`` (written by the driver under this write id) are added too; ``removes``
        (files of snapshot ``read_version``) are removed in the same commit, which then fails
        if the table moved since. ``commit_info`` and ``rewind_apps``: see ``commit_files``.
        """
        failpoint("delta.before_commit", kill=kill_session)
        apps = {str(k): int(v) for k, v in (app_transactions or {}).items()}
        files = [*self.files, *extra_files]
        try:
            if self.lease is not None:
                self.lease.check()  # a reaper never removes files of a commit that starts now
            result = commit_files(
                self.location,
                files,
                schema=self.schema,
                partition_by=self.partition_by,
                mode="overwrite" if removes else "append",
                predicate="loglake rewind" if removes else None,
                removes=removes,
                read_version=read_version,
                app_transactions=apps,
                expected_versions=expected_versions,
                commit_info={WRITE_ID_KEY: self.write_id, **(commit_info or {})},
                rewind_apps=rewind_apps,
                settings=self.settings,
            )
        except BaseException:
            self.abort()
            raise
        staged = {unquote(f.path) for f in files}
        # Leftovers of failed or duplicate task attempts sit beside the files they duplicate:
        # only those partition directories are listed, not the whole (growing) table.
        cleanup_write_files(
            self.location,
            self.write_id,
            keep=staged if result.committed else set(),
            dirs={posixpath.dirname(p) for p in staged},
            settings=self.settings,
        )
        self._release()
        return result

    def discard_tasks(self, task_ids: Collection[int]) -> int:
        """Drop the files and reports of tasks ``task_ids`` from this write and remove the
        files from the store (before the commit: a caller that found their contents wrong
        re-stages them with :func:`stage_files` ``into=`` this write). Returns the files
        removed. A process killed meanwhile leaves only unreferenced files of this write,
        reaped as after any crash."""
        drop = set(task_ids)
        pairs = list(zip(self.reports, self.report_tasks, strict=True))
        self.reports = [r for r, t in pairs if t not in drop]
        self.report_tasks = [t for _, t in pairs if t not in drop]
        gone = [f for f in self.files if _task_of(f.path) in drop]
        if not gone:
            return 0
        self.files = [f for f in self.files if _task_of(f.path) not in drop]
        removed = cleanup_write_files(
            self.location,
            self.write_id,
            keep={unquote(f.path) for f in self.files},
            dirs={posixpath.dirname(unquote(f.path)) for f in gone},
            settings=self.settings,
        )
        return removed

    def abort(self) -> None:
        """Remove every file of this write (nothing was committed)."""
        try:
            cleanup_write_files(self.location, self.write_id, settings=self.settings)
        finally:
            self._release()

    def _release(self) -> None:
        if self.lease is not None:
            self.lease.release()
            self.lease = None


def _task_of(path: str) -> int:
    """The task id in a staged file's name (``part-<task:05d>-<write id>-...``, see
    :class:`~pipelines.delta.files.PartitionedFileWriter`)."""
    return int(posixpath.basename(path).split("-", 2)[1])


def stage_files(
    spark: SparkSession,
    path: str | Path | LakeLocation,
    tasks: Sequence[T],
    produce: Callable[[T], Iterable[Any]],
    *,
    schema: pa.Schema,
    partition_by: Sequence[str] | None = None,
    compression: str = "zstd",
    max_rows_per_file: int | None = None,
    writer_options: Mapping[str, Any] | None = None,
    settings: StorageSettings | None = None,
    lease_ttl_s: float | None = None,
    into: StagedWrite | None = None,
) -> StagedWrite:
    """Run ``produce(task)`` for every task in the executors and write what it yields.

    One Spark partition per task (``produce`` and the tasks must be picklable; ``produce``
    runs in the executors' Python workers). Record batches must have ``schema``'s columns
    (types are cast when they differ); ``partition_by`` columns become directories; any other
    item ``produce`` yields is a JSON-able report returned in :attr:`StagedWrite.reports`.
    ``writer_options`` are further keyword arguments of
    :class:`~pipelines.delta.files.PartitionedFileWriter` (Parquet encodings and the like).
    Raises ``DeltaSinkError`` (wrapping the task's error) when a task fails; nothing is left
    on disk then. ``path``: a local directory or an object-store URI; ``settings``: how to
    reach the store (the AWS environment when not given); ``lease_ttl_s``: the write's lease
    (:func:`~pipelines.delta.staging.lease_ttl_s` when not given). ``into``: add these
    tasks' files and reports to that write (same table, write id and lease; task ids numbered
    on), which a failure here removes entirely.
    """
    parts = list(partition_by or [])
    missing = [c for c in parts if c not in schema.names]
    if missing:
        raise DeltaSinkError(f"partition columns {missing} are not in the data")
    if into is not None:
        staged = into
        loc, resolved = into.location, into.settings
    else:
        loc = table_location(path)
        resolved = settings if settings is not None else StorageSettings.default()
        dt = load_table(loc, settings=resolved)
        if dt is not None:
            check_schema(dt, schema, parts)
        staged = StagedWrite(loc, uuid.uuid4().hex, schema, parts, resolved)
        staged.reaped = reap_crashed_writes(loc, settings=resolved)
        staged.lease = Lease.take(loc, staged.write_id, settings=resolved, ttl_s=lease_ttl_s)
    if not tasks:
        return staged
    options: dict[str, Any] = {
        "compression": compression,
        "max_rows_per_file": 10_000_000 if max_rows_per_file is None else max_rows_per_file,
        **(writer_options or {}),
    }
    run = _task_writer(
        loc,
        settings=resolved,
        write_id=staged.write_id,
        produce=produce,
        schema=schema,
        partition_by=parts,
        writer_options=options,
        first_task=staged.tasks,
    )
    staged.tasks += len(tasks)
    # parallelize() cuts n items into n slices of exactly one item each.
    rdd = spark.sparkContext.parallelize(list(tasks), len(tasks))
    try:
        rows = run_in_job_group(
            spark, f"loglake-direct-{staged.write_id}", rdd.mapPartitionsWithIndex(run).collect
        )
    except Exception as exc:
        try:
            cleanup_write_files(loc, staged.write_id, prune_dirs=True, settings=resolved)
        finally:
            staged._release()
        raise DeltaSinkError(
            f"write to {loc.uri} failed, nothing committed: {first_error_line(exc)}",
            path=loc.uri,
        ) from exc
    for line in rows:
        item = json.loads(line)
        if "file" in item:
            staged.files.append(WrittenFile(**item["file"]))
        else:
            staged.reports.append(item["report"])
            staged.report_tasks.append(item["task"])
    return staged


def write_direct(
    spark: SparkSession,
    path: str | Path | LakeLocation,
    tasks: Sequence[T],
    produce: Callable[[T], Iterable[pa.RecordBatch]],
    *,
    schema: pa.Schema,
    partition_by: Sequence[str] | None = None,
    app_transactions: Mapping[str, int] | None = None,
    expected_versions: Mapping[str, int | None] | None = None,
    compression: str = "zstd",
    max_rows_per_file: int | None = None,
    writer_options: Mapping[str, Any] | None = None,
    settings: StorageSettings | None = None,
) -> CommitResult:
    """Append what ``produce(task)`` yields for every task to the Delta table at ``path``.

    :func:`stage_files` then :meth:`StagedWrite.commit`. ``app_transactions`` and
    ``expected_versions`` mean what they mean for ``commit_files``: a write whose versions are
    all already in the table is a no-op (checked before any task runs, and again at the
    commit), a stale one is refused (``StaleTransactionError``, ...).
    """
    apps = {str(k): int(v) for k, v in (app_transactions or {}).items()}
    loc = table_location(path)
    resolved = settings if settings is not None else StorageSettings.default()
    dt = load_table(loc, settings=resolved)
    if dt is not None and not check_app_transactions(dt, apps, expected_versions):
        return CommitResult(loc.uri, dt.version(), False, "append", 0, 0, 0, 0, 0, apps)
    staged = stage_files(
        spark,
        loc,
        tasks,
        produce,
        schema=schema,
        partition_by=partition_by,
        compression=compression,
        max_rows_per_file=max_rows_per_file,
        writer_options=writer_options,
        settings=resolved,
    )
    return staged.commit(app_transactions=apps, expected_versions=expected_versions)


def append_table(
    path: str | Path | LakeLocation,
    table: pa.Table,
    *,
    schema: pa.Schema,
    partition_by: Sequence[str] = (),
    compression: str = "zstd",
    app_transactions: Mapping[str, int] | None = None,
    settings: StorageSettings | None = None,
) -> CommitResult:
    """Append a small Arrow ``table`` to the Delta table at ``path`` from the driver (created
    when absent): the same file writer and commit as the Spark paths, without a Spark job.
    For the handful of rows a job records about itself (quarantined batches, quality results,
    the retention log). ``app_transactions``: carried by the commit, which is a no-op
    (``committed`` False) when the table has them all already, so an append retried after a
    commit whose answer was lost is not written twice.
    """
    loc = table_location(path)
    resolved = settings if settings is not None else StorageSettings.default()
    dt = load_table(loc, settings=resolved)
    writer = PartitionedFileWriter(
        loc,
        settings=resolved,
        write_id=uuid.uuid4().hex,
        task_id=0,
        attempt=0,
        partition_by=partition_by,
        compression=compression,
    )
    try:
        if table.num_rows:
            writer.write(table.select(schema.names).cast(schema))
        result = commit_files(
            loc,
            writer.close(),
            schema=schema,
            partition_by=partition_by,
            read_version=dt.version() if dt is not None else None,
            app_transactions=app_transactions,
            settings=resolved,
        )
        # not committed (no-op): the file stays, the commit that holds the apps may be this
        # very append's (an attempt whose answer was lost); else maintain's vacuum takes it
        return result
    except BaseException:
        writer.abort()
        raise
