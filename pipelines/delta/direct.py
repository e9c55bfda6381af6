"""Direct writes: tasks that produce Arrow data in the Python worker and write it there.

``write_delta`` takes a DataFrame, so rows produced by a Python data source cross Python ->
JVM -> Python before the sink's executor writer sees them; for nested columns that conversion
costs more than producing and writing the data together. :func:`write_direct` skips it: the
driver hands small picklable *tasks* (one Spark partition each) to ``produce``, which runs in
the Python worker and yields ``pyarrow.RecordBatch``es that go straight to the sink's own
executor writer (:class:`~pipelines.delta.files.PartitionedFileWriter`: same file names,
partition directories, stats, ``max_rows_per_file``). Only the written files' metadata
(path, size, rows, partition values, stats JSON) travels back; the driver commits every file
in one Delta transaction with :func:`~pipelines.delta.commit.commit_files`, carrying the app
transactions and expected versions, exactly as the ``loglake_delta`` sink does.

Crash tests: ``LOGLAKE_FAILPOINT=delta.before_commit`` kills every process of the session
(SIGKILL) after every file is written, just before the commit, as the sink's ``commit()`` does.

Crash behaviour: a failing task removes its own files; a failed job or a refused commit
removes every file carrying the write id; after a committed write, files of failed or
duplicate task attempts are removed. A process killed before the commit leaves only files no
snapshot references (Delta's ``VACUUM`` removes those). Errors raised by ``produce`` reach the
caller inside the ``DeltaSinkError`` (as its cause), so their text can still be recognised.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TypeVar
from urllib.parse import unquote

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import SparkSession

from pipelines.delta.commit import (
    CommitResult,
    check_app_transactions,
    check_schema,
    commit_files,
    load_table,
)
from pipelines.delta.datasource import FAILPOINT_ENV, kill_session
from pipelines.delta.errors import DeltaSinkError
from pipelines.delta.files import PartitionedFileWriter, WrittenFile, cleanup_write_files

__all__ = ["write_direct"]

T = TypeVar("T")
_JOB_GROUP = "spark.jobGroup.id"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        if "Error" in line or "Exception" in line:
            return line.strip()
    return text.splitlines()[0] if text else type(exc).__name__


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


def _task_writer(
    root: str,
    *,
    write_id: str,
    produce: Callable[[T], Iterable[pa.RecordBatch]],
    schema: pa.Schema,
    partition_by: list[str],
    compression: str,
    max_rows_per_file: int,
) -> Callable[[int, Iterable[T]], Iterator[str]]:
    """The function each Spark task runs: produce, write files, yield their metadata as JSON."""

    def run(index: int, items: Iterable[T]) -> Iterator[str]:
        ctx = TaskContext.get()
        attempt = ctx.attemptNumber() if ctx is not None else 0
        out = PartitionedFileWriter(
            root,
            write_id=write_id,
            task_id=index,
            attempt=attempt,
            partition_by=partition_by,
            compression=compression,
            max_rows_per_file=max_rows_per_file,
        )
        try:
            for item in items:
                for batch in produce(item):
                    table = pa.Table.from_batches([batch])
                    if table.schema.types != schema.types:
                        table = table.cast(schema)
                    out.write(table)
            files = out.close()
        except BaseException:
            out.abort()
            raise
        for f in files:
            yield json.dumps(asdict(f))

    return run


def write_direct(
    spark: SparkSession,
    path: str | Path,
    tasks: Sequence[T],
    produce: Callable[[T], Iterable[pa.RecordBatch]],
    *,
    schema: pa.Schema,
    partition_by: Sequence[str] | None = None,
    app_transactions: Mapping[str, int] | None = None,
    expected_versions: Mapping[str, int | None] | None = None,
    compression: str = "zstd",
    max_rows_per_file: int | None = None,
) -> CommitResult:
    """Append what ``produce(task)`` yields for every task to the Delta table at ``path``.

    One Spark partition per task (``produce`` and the tasks must be picklable; ``produce``
    runs in the executors' Python workers). Batches must have ``schema``'s columns (types are
    cast when they differ); ``partition_by`` columns become directories. ``app_transactions``
    and ``expected_versions`` mean what they mean for ``write_delta``: a write whose versions
    are all already in the table is a no-op (checked before any task runs, and again at the
    commit), a stale one is refused. Raises ``DeltaSinkError`` (wrapping the task's error)
    when a task fails, the commit's own errors (``StaleTransactionError``, ...) otherwise.
    """
    parts = list(partition_by or [])
    missing = [c for c in parts if c not in schema.names]
    if missing:
        raise DeltaSinkError(f"partition columns {missing} are not in the data")
    apps = {str(k): int(v) for k, v in (app_transactions or {}).items()}
    root = str(Path(str(path).removeprefix("file://")).absolute())
    dt = load_table(root)
    if dt is not None:
        check_schema(dt, schema, parts)
        if not check_app_transactions(dt, apps, expected_versions):
            return CommitResult(root, dt.version(), False, "append", 0, 0, 0, 0, 0, apps)
    write_id = uuid.uuid4().hex
    files: list[WrittenFile] = []
    if tasks:
        run = _task_writer(
            root,
            write_id=write_id,
            produce=produce,
            schema=schema,
            partition_by=parts,
            compression=compression,
            max_rows_per_file=10_000_000 if max_rows_per_file is None else max_rows_per_file,
        )
        sc = spark.sparkContext
        # parallelize() cuts n items into n slices of exactly one item each.
        rdd = sc.parallelize(list(tasks), len(tasks))
        previous_group = sc.getLocalProperty(_JOB_GROUP)
        sc.setLocalProperty(_JOB_GROUP, f"loglake-direct-{write_id}")
        try:
            rows = rdd.mapPartitionsWithIndex(run).collect()
        except Exception as exc:
            _wait_for_tasks(spark, f"loglake-direct-{write_id}")
            cleanup_write_files(root, write_id, prune_dirs=True)
            raise DeltaSinkError(
                f"write to {root} failed, nothing committed: {_first_line(exc)}", path=root
            ) from exc
        finally:
            sc.setLocalProperty(_JOB_GROUP, previous_group)  # type: ignore[arg-type]
        files = [WrittenFile(**json.loads(r)) for r in rows]
    if os.environ.get(FAILPOINT_ENV) == "delta.before_commit":
        kill_session()
    try:
        result = commit_files(
            root,
            files,
            schema=schema,
            partition_by=parts,
            mode="append",
            app_transactions=apps,
            expected_versions=expected_versions,
        )
    except BaseException:
        cleanup_write_files(root, write_id)
        raise
    keep = {unquote(f.path) for f in files} if result.committed else set()
    cleanup_write_files(root, write_id, keep=keep)
    return result
