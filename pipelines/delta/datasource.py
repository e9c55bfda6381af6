"""The Delta sink as a Spark Python data source: ``df.write.format("loglake_delta")``.

Where things run: ``DataSource.writer()`` runs once per write in a Python worker on the
driver host and fixes the write id; the writer object is pickled to every task, whose
``write()`` (executors) produces Parquet files and returns a ``TaskFiles`` commit message;
``commit()`` / ``abort()`` run in another Python worker on the driver host, after all tasks.
Nothing is shared in memory between those processes: the outcome goes back to
``write_delta`` through the ``resultFile`` option (JSON, written tmp + rename).

Options (all strings): ``path`` (from ``save(path)``; a local directory), ``mode``
(``append``/``overwrite``; Spark's ``mode("overwrite")`` also works), ``partitionBy`` (JSON list),
``predicate`` + ``removesFile`` (replace where, prepared by ``write_delta``), ``checkColumn``
(boolean column that must be true on every row, dropped before writing), ``appTransactions``
and ``expectedVersions`` (JSON objects), ``resultFile``, ``compression``, ``maxRowsPerFile``.

Crash tests: with ``LOGLAKE_FAILPOINT=delta.before_commit`` in the job's environment,
``commit()`` kills every process of its session (SIGKILL) after every file is written.

Crash behaviour: a failed task removes its own files; ``abort()`` and a refused ``commit()``
remove every file carrying the write id; after a committed write, files of failed or
duplicate task attempts are removed too. A process killed before ``commit()`` leaves files no
snapshot references; ``write_delta``'s run marker (:mod:`pipelines.delta.staging`) lets the next
write to the table remove them.
"""

from __future__ import annotations

import json
import os
import posixpath
import signal
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from pipelines.delta.commit import CommitResult, RemovedFile, commit_files
from pipelines.delta.errors import DeltaSinkError
from pipelines.delta.files import PartitionedFileWriter, WrittenFile, cleanup_write_files
from pipelines.delta.staging import hold_run_marker
from pipelines.worker import start_task

__all__ = [
    "FAILPOINT_ENV",
    "FORMAT",
    "DeltaRsDataSource",
    "DeltaRsWriter",
    "TaskFiles",
    "write_result_file",
]

FORMAT = "loglake_delta"
# Fault injection for crash tests, read from the environment the job was launched with.
FAILPOINT_ENV = "LOGLAKE_FAILPOINT"


@dataclass
class TaskFiles(WriterCommitMessage):
    """Commit message of one task: the files it wrote."""

    task_id: int
    attempt: int
    files: list[WrittenFile]


def write_result_file(path: str | None, payload: dict[str, Any]) -> None:
    """Write the outcome for the driver (tmp + rename, so a reader never sees half a file)."""
    if not path:
        return
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(payload, fh)
    os.replace(tmp, path)


def kill_session() -> None:
    """SIGKILL every process of this session (driver JVM, Python driver, daemon, workers).

    Crash tests start the job as a session leader (``start_new_session``); Spark's Python
    daemon moves to its own process group, so a process-group kill would miss the JVM.
    """
    sid = os.getsid(0)
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            if os.getsid(int(entry)) == sid:
                os.kill(int(entry), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    os.kill(me, signal.SIGKILL)


class DeltaRsDataSource(DataSource):
    """Write-only data source committing to Delta with delta-rs (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def writer(self, schema: StructType, overwrite: bool) -> DeltaRsWriter:
        return DeltaRsWriter(dict(self.options), schema, overwrite)


class DeltaRsWriter(DataSourceArrowWriter):
    """Executors write Parquet files; the driver commits them in one Delta transaction."""

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        # Spark hands options over case-insensitively (lower-cased keys): look them up so.
        options = {k.lower(): v for k, v in options.items()}
        path = options.get("path")
        if not path:
            raise DeltaSinkError("the Delta sink needs a path: df.write...save(<table dir>)")
        self.root = str(Path(path.removeprefix("file://")).absolute())
        mode = options.get("mode", "overwrite" if overwrite else "append")
        if mode not in ("append", "overwrite"):
            raise DeltaSinkError(f"mode must be 'append' or 'overwrite', got {mode!r}")
        self.mode = mode
        self.partition_by: list[str] = json.loads(options.get("partitionby", "[]"))
        self.predicate = options.get("predicate") or None
        self.check_column = options.get("checkcolumn") or None
        self.removes_file = options.get("removesfile") or None
        self.app_transactions: dict[str, int] = json.loads(options.get("apptransactions", "{}"))
        expected = options.get("expectedversions")
        self.expected_versions: dict[str, int | None] | None = (
            json.loads(expected) if expected else None
        )
        self.result_file = options.get("resultfile") or None
        self.compression = options.get("compression", "zstd")
        self.max_rows_per_file = int(options.get("maxrowsperfile", "10000000"))
        # The driver may choose the write id (so it can remove the files itself after a failed
        # job, once every task has stopped); file names carry it, so it must be plain hex.
        self.write_id = options.get("writeid") or uuid.uuid4().hex
        # a write id chosen by the driver (write_delta) comes with its run marker
        self.marked = bool(options.get("writeid"))
        if not all(c in "0123456789abcdef" for c in self.write_id):
            raise DeltaSinkError(f"writeId must be lower-case hex, got {self.write_id!r}")
        fields = [f for f in schema.fields if f.name != self.check_column]
        missing = [c for c in self.partition_by if c not in [f.name for f in fields]]
        if missing:
            raise DeltaSinkError(f"partition columns {missing} are not in the data")
        self.schema = to_arrow_schema(StructType(fields), timezone="UTC")
        self.data_schema = pa.schema([f for f in self.schema if f.name not in self.partition_by])

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskFiles:
        start_task()  # no full GC of the worker's modules between tasks
        ctx = TaskContext.get()
        task_id = ctx.partitionId() if ctx is not None else 0
        attempt = ctx.attemptNumber() if ctx is not None else 0
        out = PartitionedFileWriter(
            self.root,
            write_id=self.write_id,
            task_id=task_id,
            attempt=attempt,
            partition_by=self.partition_by,
            compression=self.compression,
            max_rows_per_file=self.max_rows_per_file,
        )
        # sharing the driver's lock on its run marker (pipelines.delta.staging): no reaper
        # takes these files for a dead write's while they are written
        held: AbstractContextManager[None] = (
            hold_run_marker(self.root, self.write_id) if self.marked else nullcontext()
        )
        with held:
            try:
                for batch in iterator:
                    table = pa.Table.from_batches([batch])
                    if self.check_column is not None:
                        ok = table.column(self.check_column)
                        if not pc.all(pc.fill_null(ok, False)).as_py():
                            raise DeltaSinkError(
                                "data does not match the replace-where predicate"
                                f" {self.predicate!r}",
                                path=self.root,
                            )
                        table = table.drop_columns([self.check_column])
                    if table.schema.types != self.schema.types:
                        table = table.cast(self.schema)
                    out.write(table)
                files = out.close()
            except BaseException:
                out.abort()
                raise
        return TaskFiles(task_id, attempt, files)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        files = [f for m in messages if isinstance(m, TaskFiles) for f in m.files]
        if os.environ.get(FAILPOINT_ENV) == "delta.before_commit":
            kill_session()
        try:
            removes: list[RemovedFile] = []
            read_version = None
            if self.removes_file:
                with open(self.removes_file, encoding="utf-8") as fh:
                    spec = json.load(fh)
                read_version = spec["read_version"]
                removes = [RemovedFile(**r) for r in spec["removes"]]
            result: CommitResult = commit_files(
                self.root,
                files,
                schema=self.schema,
                partition_by=self.partition_by,
                mode=self.mode,  # type: ignore[arg-type]
                predicate=self.predicate,
                removes=removes,
                read_version=read_version,
                app_transactions=self.app_transactions,
                expected_versions=self.expected_versions,
            )
        except BaseException as exc:
            cleanup_write_files(self.root, self.write_id)
            write_result_file(
                self.result_file,
                {"error": {"type": type(exc).__name__, "message": str(exc)}},
            )
            raise
        staged = {unquote(f.path) for f in files}
        cleanup_write_files(
            self.root,
            self.write_id,
            keep=staged if result.committed else set(),
            dirs={posixpath.dirname(p) for p in staged},  # not the whole table
        )
        write_result_file(self.result_file, {"result": result.to_json()})

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        removed = cleanup_write_files(self.root, self.write_id, prune_dirs=True)
        # Spark also aborts after a failed commit(): keep the error that commit() recorded.
        if self.result_file and not os.path.exists(self.result_file):
            write_result_file(self.result_file, {"aborted": {"removed_files": removed}})
