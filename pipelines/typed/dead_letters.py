"""Dead letters of the typed tables job: ``<lake>/dead_letters``, written by the Spark tasks.

Table (Delta, append-only): topic, partition, offset, timestamp, part (``value`` or ``key``:
which did not decode), schema_id (null without a header), error, key, value (the raw bytes),
headers. Progress: the app transactions ``loglake-decode/<topic>/<partition>`` of
:mod:`pipelines.typed.job`, carried by each commit of a topic's dead letters.

How a run writes them: before its tasks start, the driver opens a staged write of the table
(:func:`stage_dead_letters`: :func:`pipelines.delta.direct.stage_files` with no task of its
own, which reaps dead runs' files and takes the write's lease). Each task that meets records it
cannot decode writes them (:class:`DeadLetterWriter`) as Parquet files of the table named with
that write id, and reports only the files' metadata; the driver adds those files and commits
them once (:func:`commit_dead_letters`), so no dead letter passes through the driver.

Crash behaviour: a task that fails removes its own files; a run that fails or is refused
removes every file of the write (:meth:`~pipelines.delta.direct.StagedWrite.abort`); a killed
run leaves files no version names, removed by the next run's staged write once the lease
expired (:mod:`pipelines.delta.staging`). A task checks the lease before its first file and
after its last, as the staged write's own tasks do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import SparkSession

from logstore.objectstore import StorageSettings
from pipelines.delta.commit import ensure_table
from pipelines.delta.direct import StagedWrite, stage_files
from pipelines.delta.files import PartitionedFileWriter, WrittenFile
from pipelines.delta.staging import check_lease

__all__ = [
    "DEAD_LETTERS_SCHEMA",
    "HEADERS_TYPE",
    "DeadLetterSink",
    "DeadLetterWriter",
    "commit_dead_letters",
    "dead_letter_rows",
    "stage_dead_letters",
]

HEADERS_TYPE = pa.list_(
    pa.field(
        "element",
        pa.struct([pa.field("key", pa.string(), False), pa.field("value", pa.binary())]),
        False,
    )
)
DEAD_LETTERS_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("part", pa.string()),
        pa.field("schema_id", pa.int32()),
        pa.field("error", pa.string()),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", HEADERS_TYPE),
    ]
)


@dataclass(frozen=True)
class DeadLetterSink:
    """Where a task writes its dead letters: the table, the driver's staged write id (its
    lease), how to reach the store, the Parquet codec. Picklable: it rides in the tasks."""

    root: str
    write_id: str
    settings: StorageSettings
    compression: str

    @classmethod
    def of(cls, staged: StagedWrite, *, compression: str) -> DeadLetterSink:
        return cls(staged.root, staged.write_id, staged.settings, compression)


class DeadLetterWriter:
    """A task's dead letters, written as it meets them (a file opened at the first one): the
    task keeps no row, and only the files' metadata goes back to the driver."""

    def __init__(self, sink: DeadLetterSink) -> None:
        self._sink = sink
        self._writer: PartitionedFileWriter | None = None
        self.rows = 0

    def write(self, rows: pa.Table) -> None:
        """Append ``rows`` (:data:`DEAD_LETTERS_SCHEMA`)."""
        if not rows.num_rows:
            return
        if self._writer is None:
            ctx = TaskContext.get()
            sink = self._sink
            check_lease(sink.root, sink.write_id, settings=sink.settings)
            self._writer = PartitionedFileWriter(
                sink.root,
                settings=sink.settings,
                write_id=sink.write_id,
                task_id=ctx.partitionId() if ctx is not None else 0,
                attempt=ctx.attemptNumber() if ctx is not None else 0,
                partition_by=[],
                compression=sink.compression,
            )
        self._writer.write(rows)
        self.rows += rows.num_rows

    def close(self) -> dict[str, Any]:
        """Finish the files; the task's report: ``dead_letters`` (rows) and ``dead_files``."""
        files = self._writer.close() if self._writer is not None else []
        if files:
            check_lease(self._sink.root, self._sink.write_id, settings=self._sink.settings)
        return {"dead_letters": self.rows, "dead_files": [asdict(f) for f in files]}

    def abort(self) -> None:
        """Remove the files written so far (the task failed)."""
        if self._writer is not None:
            self._writer.abort()


def dead_letter_rows(
    topic: str,
    rows: pa.Table,
    keep: pa.Array,
    *,
    part: pa.Array,
    ids: pa.Array,
    errors: pa.Array,
) -> pa.Table:
    """The rows of ``rows`` (``records``' columns) where ``keep``, with their ``part``,
    schema ``ids`` and ``errors``, in :data:`DEAD_LETTERS_SCHEMA` (column at a time)."""
    picked = rows.filter(keep)
    return pa.Table.from_arrays(
        [
            pa.repeat(pa.scalar(topic, pa.string()), picked.num_rows),
            picked["partition"].cast(pa.int32()),
            picked["offset"].cast(pa.int64()),
            picked["timestamp"].cast(pa.timestamp("us", tz="UTC")),
            part.filter(keep),
            ids.filter(keep).cast(pa.int32()),
            errors.filter(keep).cast(pa.string()),
            picked["key"].cast(pa.binary()),
            picked["value"].cast(pa.binary()),
            picked["headers"].cast(HEADERS_TYPE),
        ],
        schema=DEAD_LETTERS_SCHEMA,
    )


def _no_rows(_task: object) -> list[pa.RecordBatch]:
    return []


def stage_dead_letters(spark: SparkSession, root: str, *, compression: str) -> StagedWrite:
    """The run's staged write of the dead-letters table at ``root`` (created empty when
    absent): its lease taken, no file yet; the tasks write under its write id."""
    ensure_table(root, DEAD_LETTERS_SCHEMA, [])
    return stage_files(
        spark, root, [], _no_rows, schema=DEAD_LETTERS_SCHEMA, compression=compression
    )


def commit_dead_letters(
    staged: StagedWrite,
    reports: Sequence[Any],
    apps: Mapping[str, int],
    expected: Mapping[str, int | None],
) -> None:
    """Commit the files the tasks reported (``dead_files``) with progress ``apps`` in one
    commit: a no-op, the files removed, when the table already has that progress; a refused
    commit removes them and raises."""
    for report in reports:
        staged.files.extend(WrittenFile(**f) for f in report.get("dead_files", ()))
    staged.commit(app_transactions=apps, expected_versions=expected)
