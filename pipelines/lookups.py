"""Offset and time lookups as tables: what ``.index`` and ``.timeindex`` answer, in SQL.

Both tables hold the ``kind=batches`` rows of the segments (headers + CRC only; damaged
batches, which carry an ``error``, are left out):

- ``offset_lookup``: one row per batch — topic, partition, segment (base offset), file,
  first_offset, last_offset, position, size, record_count, max_timestamp, is_control,
  is_transactional, producer_id, marker (a control batch's type: ``commit``, ``abort`` or
  ``other``; null for data batches). The last three let the quality suites tie an aborted
  transaction's batches to their ABORT marker without the segment files (which retention
  may have deleted); a table of an earlier release gets them on the next run (schema
  evolution: null in the rows written before; to fill those, delete the table and run again:
  it is rebuilt from the segments still in the log dirs);
- ``time_lookup``: one row per batch — topic, partition, max_timestamp, first_offset,
  last_offset, segment, file, position, size.

Without log dirs (``[paths] log_dirs = []`` and ``[ingest] bootstrap_servers``) the batches are
read through Fetch (read_uncommitted, up to the high watermark: every batch, as from the
files) into the same decoder, and the rows are the same but for what only a file has:
``segment`` and ``position`` are -1 (as ``records``' ``segment_base_offset`` and
``batch_position`` through Fetch) and ``file`` is ``kafka://<bootstrap>/<topic>-<partition>``;
with ``[paths] remote_log_storage`` the batches the cluster's tier holds are read from the
object store, with real ``segment`` and ``position`` (a log-dir run's) and ``file`` the
segment's ``.log`` object (:mod:`pipelines.lookups_fetch`).
:func:`locate` then tells the batch's offsets and size, not where it lies on a disk. The index
check needs the broker's ``.index``/``.timeindex`` files: not done through Fetch, and each run
logs so. A segment deleted under a Fetch run (offset out of range) fails it (exit 1, retried:
the next run starts at the new log start).

Questions and their answers (Kafka's semantics):

- :func:`locate` (Fetch / ``.index``): the batch holding ``offset`` is the first batch, in
  offset order, whose ``last_offset >= offset`` (a compacted gap resolves to the next batch)::

    SELECT file, position, size FROM offset_lookup
    WHERE topic = 't' AND partition = 0 AND last_offset >= 42
    ORDER BY first_offset LIMIT 1

- :func:`offsets_for_times` (ListOffsets): the first offset whose record timestamp is
  ``>= ts``. The candidate batch is the first, in offset order, whose ``max_timestamp >= ts``;
  the answer is the first record inside it with a timestamp ``>= ts`` (the batch is read and
  decoded, exactly as the broker does)::

    SELECT partition, min(first_offset) AS batch FROM time_lookup
    WHERE topic = 't' AND max_timestamp >= 1700000000000 GROUP BY partition

  then, over the ``records`` table, ``min(offset) WHERE offset >= batch AND timestamp >= ts``.

:func:`check_index_files` (and :func:`check_indexes` for a DataFrame of batches) checks the
broker's own ``.index``/``.timeindex`` entries against the batches (positions are batch starts,
offsets inside the batch found there, the time index's timestamps are running maxima of the
batch max timestamps).

:func:`build_lookups` reads and writes in plain Spark tasks (``pipelines.delta.direct``: each
task reads its planned segment ranges with :func:`pipelines.sources.read.read_batches` and
writes the rows as Parquet in the same Python worker), never through the Python Data Source
API: Spark 4.2's planner workers of Python data sources end with ``BrokenPipeError``
tracebacks from ``pyspark/daemon.py`` on stderr after the JVM has read their answer, which a
successful job must not print.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from logstore.errors import LoglakeError
from logstore.objectstore import LakeLocation
from logstore.protocol.records import decode_batch
from logstore.tools.client_config import ClientConfig
from pipelines.config import log_dir_topics
from pipelines.sources.plan import (
    SegmentRange,
    SegmentVanishedError,
    SourceOptions,
    deleted_from_front,
    parse_options,
    plan_ranges,
    replanned,
)
from pipelines.sources.schema import BATCHES_ARROW_SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from pipelines.delta.direct import StagedWrite

__all__ = [
    "LOOKUP_SCHEMAS",
    "IndexProblem",
    "Location",
    "LookupsSummary",
    "build_lookups",
    "build_offset_lookup",
    "build_time_lookup",
    "check_index_files",
    "check_indexes",
    "check_segment_indexes",
    "locate",
    "lookup_rows",
    "offsets_for_times",
]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


OFFSET_LOOKUP = "offset_lookup"
TIME_LOOKUP = "time_lookup"
# (column of the kind=batches rows, column of the table), in table order.
_COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    OFFSET_LOOKUP: (
        ("topic", "topic"),
        ("partition", "partition"),
        ("segment_base_offset", "segment"),
        ("file", "file"),
        ("base_offset", "first_offset"),
        ("last_offset", "last_offset"),
        ("position", "position"),
        ("size", "size"),
        ("record_count", "record_count"),
        ("max_timestamp", "max_timestamp"),
        ("is_control", "is_control"),
        ("is_transactional", "is_transactional"),
        ("producer_id", "producer_id"),
    ),
    TIME_LOOKUP: (
        ("topic", "topic"),
        ("partition", "partition"),
        ("max_timestamp", "max_timestamp"),
        ("base_offset", "first_offset"),
        ("last_offset", "last_offset"),
        ("segment_base_offset", "segment"),
        ("file", "file"),
        ("position", "position"),
        ("size", "size"),
    ),
}
# Columns of a table that are not ``kind=batches`` columns (computed by :func:`lookup_rows`).
_MARKER = pa.field("marker", pa.string())
_EXTRA: dict[str, tuple[pa.Field, ...]] = {OFFSET_LOOKUP: (_MARKER,), TIME_LOOKUP: ()}
LOOKUP_SCHEMAS: dict[str, pa.Schema] = {
    table: pa.schema(
        [BATCHES_ARROW_SCHEMA.field(src).with_name(dst) for src, dst in columns]
        + list(_EXTRA[table])
    )
    for table, columns in _COLUMNS.items()
}
"""The Arrow schema of each lookup table (partitioned by ``topic``)."""
# Columns added to offset_lookup after its first release, at the end of the schema: an older
# table gets them by schema evolution (:func:`_evolve`), null in the rows written before.
_ADDED = {OFFSET_LOOKUP: ("is_transactional", "producer_id", "marker"), TIME_LOOKUP: ()}


@dataclass(frozen=True, slots=True)
class Location:
    """Where a batch lives: ``file`` and byte ``position``/``size``, its offsets."""

    topic: str
    partition: int
    segment: int
    file: str
    position: int
    size: int
    first_offset: int
    last_offset: int


@dataclass(frozen=True, slots=True)
class IndexProblem:
    """One index entry that disagrees with the data (``kind`` is ``index``/``timeindex``)."""

    file: str
    kind: str
    entry: int
    offset: int
    value: int
    problem: str


def _select(batches: DataFrame, table: str) -> DataFrame:
    from pyspark.sql.pandas.types import from_arrow_schema  # noqa: PLC0415

    def rows(parts: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for part in parts:
            yield lookup_rows(table, part.select(BATCHES_ARROW_SCHEMA.names))

    return batches.mapInArrow(rows, from_arrow_schema(LOOKUP_SCHEMAS[table]))


def build_offset_lookup(batches: DataFrame) -> DataFrame:
    """``offset_lookup`` rows from a DataFrame of ``kind=batches`` rows (sound batches only)."""
    return _select(batches, OFFSET_LOOKUP)


def build_time_lookup(batches: DataFrame) -> DataFrame:
    """``time_lookup`` rows from a DataFrame of ``kind=batches`` rows (sound batches only)."""
    return _select(batches, TIME_LOOKUP)


def lookup_rows(
    table: str, batches: pa.RecordBatch, *, data: bytes | memoryview | None = None
) -> pa.RecordBatch:
    """``table``'s rows (:data:`LOOKUP_SCHEMAS`) from a record batch of ``kind=batches`` rows
    (:data:`~pipelines.sources.BATCHES_ARROW_SCHEMA`; sound batches only). ``data``: the
    bytes the rows' positions index (a Fetch response) instead of their files."""
    sound = batches.filter(pc.is_null(batches.column("error")))
    extra = [marker_column(sound, data=data)] if table == OFFSET_LOOKUP else []
    return pa.RecordBatch.from_arrays(
        [sound.column(src) for src, _ in _COLUMNS[table]] + extra, schema=LOOKUP_SCHEMAS[table]
    )


# The bytes of a control batch that hold its record's key: the 61-byte header, then the
# record's length, attributes, timestamp and offset deltas and key length (varints), the key.
_MARKER_PREFIX = 128


def marker_column(batches: pa.RecordBatch, *, data: bytes | memoryview | None = None) -> pa.Array:
    """``offset_lookup.marker`` of each row of ``kind=batches`` rows: for a control batch, the
    type its record's key names — ``commit``, ``abort``, else ``other`` (another control type,
    an unreadable key, a compressed control batch) — judged as read_committed ingest judges it
    (:func:`pipelines.decode.transactions.marker_types`); null for data batches. One ``pread``
    of at most 128 bytes per control batch (one per transaction and partition), nothing per
    data batch; with ``data``, a slice of those bytes instead (through Fetch)."""
    n = batches.num_rows
    control = pc.fill_null(batches.column("is_control"), False)
    if n == 0 or not pc.any(control).as_py():
        return pa.nulls(n, pa.string())
    from pipelines.decode.transactions import (  # noqa: PLC0415 (numba on executors only)
        KIND_ABORT,
        KIND_COMMIT,
        _marker_kind,
    )

    names = {KIND_COMMIT: "commit", KIND_ABORT: "abort"}
    rows = batches.filter(control)
    values: list[str] = []
    fds: dict[str, int] = {}
    try:
        for path, position, size, codec, count in zip(
            *(rows.column(c).to_pylist() for c in ("file", "position", "size", "codec",
                                                    "record_count")),
            strict=True,
        ):  # fmt: skip
            kind = None
            if codec == "none" and count and count >= 1 and data is not None:
                got = data[position : position + min(size, _MARKER_PREFIX)]
                kind = _marker_kind(np.frombuffer(got, np.uint8), 0, len(got))
            elif codec == "none" and count and count >= 1:
                fd = fds.get(path)
                if fd is None:
                    fd = fds[path] = os.open(path, os.O_RDONLY)
                head = os.pread(fd, min(size, _MARKER_PREFIX), position)
                kind = _marker_kind(np.frombuffer(head, np.uint8), 0, len(head))
            values.append(names.get(kind, "other") if kind is not None else "other")
    finally:
        for fd in fds.values():
            os.close(fd)
    return pc.replace_with_mask(pa.nulls(n, pa.string()), control, pa.array(values, pa.string()))


def locate(offset_lookup: DataFrame, topic: str, partition: int, offset: int) -> Location | None:
    """The batch a Fetch at ``offset`` starts from; None past the end of the table."""
    from pyspark.sql import functions as F  # noqa: N812, PLC0415 (Spark only when used)

    rows = (
        offset_lookup.where(
            (F.col("topic") == topic)
            & (F.col("partition") == partition)
            & (F.col("last_offset") >= offset)
        )
        .orderBy("first_offset")
        .limit(1)
        .collect()
    )
    if not rows:
        return None
    r = rows[0]
    return Location(
        r.topic, r.partition, r.segment, r.file, r.position, r.size, r.first_offset, r.last_offset
    )


def offsets_for_times(
    time_lookup: DataFrame,
    topic: str,
    timestamp: int,
    *,
    partitions: Sequence[int] | None = None,
) -> dict[int, tuple[int, int] | None]:
    """Kafka ListOffsets for ``timestamp`` (ms): ``{partition: (offset, timestamp) | None}``.

    Partitions of ``topic`` in the table (or ``partitions``) without any record that recent
    map to None. The candidate batch is read from its segment file and decoded (reference
    decoder: one batch per partition, not a hot path).
    """
    from pyspark.sql import functions as F  # noqa: N812, PLC0415

    if timestamp < 0:
        raise LoglakeError(f"timestamp must be >= 0 ms, got {timestamp}")
    table = time_lookup.where(F.col("topic") == topic)
    known = [r.partition for r in table.select("partition").distinct().collect()]
    wanted = sorted(set(known if partitions is None else partitions))
    candidates = (
        table.where(F.col("max_timestamp") >= timestamp)
        .groupBy("partition")
        .agg(F.min_by(F.struct("file", "position", "size", "first_offset"), F.col("first_offset")))
        .collect()
    )
    found = {r[0]: r[1] for r in candidates}
    out: dict[int, tuple[int, int] | None] = {}
    for partition in wanted:
        batch = found.get(partition)
        out[partition] = None if batch is None else _first_at_or_after(batch, timestamp)
    return out


def _first_at_or_after(batch: object, timestamp: int) -> tuple[int, int] | None:
    path, position, size = batch.file, batch.position, batch.size  # type: ignore[attr-defined]
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.pread(fd, size, position)
    finally:
        os.close(fd)
    _, records = decode_batch(data)
    for rec in records:
        if rec.timestamp >= timestamp:
            return rec.offset, rec.timestamp
    return None


def _entries(path: Path, dtype: np.dtype) -> np.ndarray:
    try:
        raw = np.fromfile(path, dtype=dtype)
    except OSError:
        return np.zeros(0, dtype)
    if raw.size == 0:
        return raw
    # A preallocated (active or untrimmed) file ends in zero entries: not entries at all.
    nonzero = np.flatnonzero(raw.view(np.uint8).reshape(len(raw), -1).any(axis=1))
    return raw[: int(nonzero[-1]) + 1] if nonzero.size else raw[:0]


_PROBLEMS = pa.schema(
    [
        ("file", pa.string()),
        ("kind", pa.string()),
        ("entry", pa.int32()),
        ("offset", pa.int64()),
        ("value", pa.int64()),
        ("problem", pa.string()),
    ]
)
_OFFSET_ENTRY = np.dtype([("rel", ">i4"), ("pos", ">i4")])
_TIME_ENTRY = np.dtype([("ts", ">i8"), ("rel", ">i4")])


def check_segment_indexes(
    log_path: str,
    segment: int,
    *,
    positions: np.ndarray,
    first_offsets: np.ndarray,
    last_offsets: np.ndarray,
    max_timestamps: np.ndarray,
    read_to: int | None = None,
) -> list[IndexProblem]:
    """Check one segment's ``.index`` and ``.timeindex`` against its batches (sorted by
    position; every frame of the file, damaged ones included, so positions are complete).

    ``read_to``: the active segment, read while the broker appends to it: the batches end at
    this byte position, and the index entries of batches written after the read (an ``.index``
    position at or past it, an offset past the last batch) are not judged. The broker writes
    an entry into its memory map while this reads the file, so one read can catch an entry
    half-written, or an unwritten one before a written one: an active segment whose first read
    shows a problem is read again after :data:`_REREAD_S`, and only what that read shows is
    reported (an entry in flight has landed by then; damage is still there).
    """
    order = np.argsort(positions)
    pos, first, last, maxts = (
        a[order] for a in (positions, first_offsets, last_offsets, max_timestamps)
    )
    problems = _index_problems(log_path, segment, pos, first, last, maxts, read_to)
    if problems and read_to is not None:
        time.sleep(_REREAD_S)
        problems = _index_problems(log_path, segment, pos, first, last, maxts, read_to)
    return problems


# how long an active segment's index files are left before the second read (see above): an
# entry is one 8-12 byte copy of the broker's
_REREAD_S = 0.05


def _index_problems(  # noqa: PLR0917
    log_path: str,
    segment: int,
    pos: np.ndarray,
    first: np.ndarray,
    last: np.ndarray,
    maxts: np.ndarray,
    read_to: int | None,
) -> list[IndexProblem]:
    """One read of the segment's two index files, judged (:func:`check_segment_indexes`)."""
    problems: list[IndexProblem] = []
    log = Path(log_path)
    index = _entries(log.with_suffix(".index"), _OFFSET_ENTRY)
    times = _entries(log.with_suffix(".timeindex"), _TIME_ENTRY)
    if read_to is not None:
        index = index[index["pos"] < read_to]
        if len(last):
            index = index[segment + index["rel"].astype(np.int64) <= int(last[-1])]
            times = times[segment + times["rel"].astype(np.int64) <= int(last[-1])]
    prev_rel, prev_pos = -1, -1
    for i, (rel, p) in enumerate(zip(index["rel"].tolist(), index["pos"].tolist(), strict=True)):
        offset = segment + rel
        j = int(np.searchsorted(pos, p))
        if rel <= prev_rel or p <= prev_pos:
            problems.append(IndexProblem(log_path, "index", i, offset, p, "entries not increasing"))
        elif j >= len(pos) or pos[j] != p:
            problems.append(
                IndexProblem(log_path, "index", i, offset, p, "position is not a batch start")
            )
        elif not first[j] <= offset <= last[-1]:
            problems.append(
                IndexProblem(log_path, "index", i, offset, p,
                             f"offset outside the batch there (first offset {int(first[j])})")
            )  # fmt: skip
        prev_rel, prev_pos = rel, p
    running = np.maximum.accumulate(maxts) if len(maxts) else maxts
    prev_ts = None
    for i, (ts, rel) in enumerate(zip(times["ts"].tolist(), times["rel"].tolist(), strict=True)):
        offset = segment + rel
        j = int(np.searchsorted(last, offset))  # the batch holding offset (last >= offset)
        if prev_ts is not None and ts <= prev_ts:
            problems.append(
                IndexProblem(log_path, "timeindex", i, offset, ts, "timestamps not increasing")
            )
        elif j >= len(last) or first[j] > offset:
            problems.append(
                IndexProblem(log_path, "timeindex", i, offset, ts, "offset not in any batch")
            )
        elif int(running[j]) != ts:
            problems.append(
                IndexProblem(log_path, "timeindex", i, offset, ts,
                             f"largest timestamp up to that batch is {int(running[j])}")
            )  # fmt: skip
        prev_ts = ts
    return problems


_CHECK_COLUMNS = ["file", "segment_base_offset", "position", "size", "base_offset",
                  "last_offset", "max_timestamp"]  # fmt: skip


def _check_segment_table(table: pa.Table, *, active: bool = False) -> list[IndexProblem]:
    """:func:`check_segment_indexes` over one segment's ``kind=batches`` rows (``_CHECK_COLUMNS``;
    frames without a v2 header, whose ``last_offset`` is null, are left out). ``active``: the
    log's active segment, read while the broker may append to it."""
    t = table.filter(pc.is_valid(table.column("last_offset")))
    if t.num_rows == 0:
        return []
    read_to = None
    if active:
        ends = pc.add(t.column("position"), t.column("size"))
        read_to = int(pc.max(ends).as_py())
    return check_segment_indexes(
        t.column("file")[0].as_py(),
        t.column("segment_base_offset")[0].as_py(),
        positions=t.column("position").to_numpy(),
        first_offsets=t.column("base_offset").to_numpy(),
        last_offsets=t.column("last_offset").to_numpy(),
        max_timestamps=t.column("max_timestamp").to_numpy(),
        read_to=read_to,
    )


def check_indexes(batches: DataFrame) -> list[IndexProblem]:
    """Check every segment's index files against a DataFrame of ``kind=batches`` rows, on the
    executors (:func:`check_index_files` does the same straight from the log dirs).

    Pass the batches of whole segments (no offset or time filters), damaged ones included.
    """
    schema = "file string, kind string, entry int, offset long, value long, problem string"

    def check(table: pa.Table) -> pa.Table:
        problems = _check_segment_table(table)
        return pa.Table.from_pylist([_as_dict(p) for p in problems], schema=_PROBLEMS)

    rows = batches.select(*_CHECK_COLUMNS).groupBy("file").applyInArrow(check, schema).collect()
    return [IndexProblem(r.file, r.kind, r.entry, r.offset, r.value, r.problem) for r in rows]


def _check_task(ranges: Iterable[SegmentRange], *, options: SourceOptions) -> Iterator[str]:
    """Executor side of :func:`check_index_files`: the problems of whole segments, as JSON."""
    from pipelines.sources.read import read_batches  # noqa: PLC0415 (numba on executors only)
    from pipelines.worker import start_task  # noqa: PLC0415

    start_task()
    by_file: dict[str, list[pa.RecordBatch]] = {}
    active: set[str] = set()
    for rng in ranges:  # a segment's ranges are consecutive (one per segment as planned)
        parts = by_file.setdefault(rng.path, [])
        if rng.is_tail:
            active.add(rng.path)
        try:
            for batch in read_batches(rng, min_timestamp=options.min_timestamp):
                parts.append(batch.select(_CHECK_COLUMNS))
        except SegmentVanishedError:
            # retention deleted it since planning: a segment that is gone has no index to check
            parts.clear()
    for path, parts in by_file.items():
        if parts:
            table = pa.Table.from_batches(parts)
            for problem in _check_segment_table(table, active=path in active):
                yield json.dumps(_as_dict(problem))


def check_index_files(
    spark: SparkSession,
    log_dirs: Sequence[str],
    *,
    topics: Sequence[str] | None = None,
    log: Callable[[str], None] = _stderr,
) -> list[IndexProblem]:
    """Check every segment's ``.index``/``.timeindex`` against its batches (every batch up to
    the end of the file, damaged ones included), in plain Spark tasks of whole segments.

    Problems come in log dir, topic, partition, segment and entry order. A segment that
    retention deletes meanwhile is not checked (planning again if it goes while planned).
    """
    from pipelines.ingest import schedule_tasks  # noqa: PLC0415

    source = _source(log_dirs, topics, until="latest", max_partition_bytes=_WHOLE_SEGMENTS)
    ranges = replanned(lambda: plan_ranges(source), what="index check", log=log)
    if not ranges:
        return []
    cores = spark.sparkContext.defaultParallelism
    tasks = schedule_tasks(ranges, cores, _CHECK_TASK_BYTES, _CHECK_TASK_BYTES // 8)
    rdd = spark.sparkContext.parallelize(tasks, len(tasks))
    task = functools.partial(_check_task, options=source)
    lines = rdd.mapPartitions(lambda items: task(r for rs in items for r in rs)).collect()
    return [IndexProblem(**json.loads(line)) for line in lines]


# One range per segment (a segment is checked whole), tasks of about this many bytes.
_WHOLE_SEGMENTS = 1 << 62
_CHECK_TASK_BYTES = 128 << 20


def _source(
    log_dirs: Sequence[str],
    topics: Sequence[str] | None,
    *,
    starting: dict[str, dict[str, int]] | None = None,
    until: str | None = None,
    max_partition_bytes: int | None = None,
) -> SourceOptions:
    options: dict[str, str] = {"path": ",".join(log_dirs), "kind": "batches"}
    if topics:
        options["topics"] = ",".join(topics)
    if starting:
        options["startingOffsets"] = json.dumps(starting)
    if until:
        options["until"] = until
    if max_partition_bytes:
        options["maxPartitionBytes"] = str(max_partition_bytes)
    return parse_options(options)


def _as_dict(p: IndexProblem) -> dict[str, object]:
    return {f: getattr(p, f) for f in ("file", "kind", "entry", "offset", "value", "problem")}


@dataclass(slots=True)
class LookupsSummary:
    """What one :func:`build_lookups` run added (per table: rows; per partition: progress)."""

    rows: dict[str, int]
    progress: dict[str, dict[str, int]]
    index_problems: list[IndexProblem]


def _app_id(table: str, topic: str, partition: int) -> str:
    return f"{table}:{topic}-{partition}"


def _lookup_task(ranges: list[SegmentRange], *, table: str, min_timestamp: int) -> Iterator[Any]:
    """Executor side of :func:`build_lookups`: ``table``'s rows of ``ranges``, then one report
    per partition: ``{"topic", "partition", "next_offset": max last_offset + 1, "rows"}``."""
    from pipelines.sources.read import read_batches  # noqa: PLC0415 (numba on executors only)

    ends: dict[tuple[str, int], tuple[int, int]] = {}
    gone: dict[tuple[str, int], int] = {}
    for rng in ranges:
        key = (rng.topic, rng.partition)
        try:
            for batch in read_batches(rng, min_timestamp=min_timestamp):
                rows = lookup_rows(table, batch)
                if rows.num_rows == 0:
                    continue
                last = pc.max(rows.column("last_offset")).as_py()
                end, n = ends.get(key, (-1, 0))
                ends[key] = (max(end, -1 if last is None else last), n + rows.num_rows)
                yield rows
        except SegmentVanishedError:
            # Gone before its first byte was read (a read opens its segment once, first).
            # Deleted by retention, oldest first: nothing of it can be indexed any more, and
            # the partition's progress moves past it. Otherwise the driver plans again.
            following = rng.next_base_offset
            if following is None or not deleted_from_front(rng):
                raise
            end, n = ends.get(key, (-1, 0))
            ends[key] = (max(end, following - 1), n)
            gone[key] = gone.get(key, 0) + 1
    for (topic, partition), (end, n) in ends.items():
        yield {
            "topic": topic,
            "partition": partition,
            "next_offset": end + 1,
            "rows": n,
            "deleted_segments": gone.get((topic, partition), 0),
        }


def _evolve(path: str, table: str) -> None:
    """Give a table of an earlier release the columns added since (:data:`_ADDED`), nullable,
    at the end of its schema, in one Delta commit (metadata only: no file is rewritten; the
    rows written before read as null there). A table with any other schema is left as it is
    (the write refuses it by name)."""
    from deltalake.schema import Schema as DeltaSchema  # noqa: PLC0415

    from pipelines.delta.commit import load_table  # noqa: PLC0415

    dt = load_table(path)
    if dt is None:
        return
    have = dt.schema().to_arrow().names
    want = LOOKUP_SCHEMAS[table].names
    missing = want[len(have) :]
    if have != want[: len(have)] or not missing or not set(missing) <= set(_ADDED[table]):
        return
    fields = pa.schema([LOOKUP_SCHEMAS[table].field(n).with_nullable(True) for n in missing])
    dt.alter.add_columns(list(DeltaSchema.from_arrow(fields).fields))


def build_lookups(
    spark: SparkSession,
    *,
    log_dirs: Sequence[str],
    lake: str,
    topics: Sequence[str] | None = None,
    max_partition_bytes: int | None = None,
    check: bool = True,
    bootstrap_servers: str = "",
    kafka: ClientConfig | None = None,
    remote_log_storage: str = "",
    log: Callable[[str], None] = _stderr,
) -> LookupsSummary:
    """Append new batches to ``<lake>/offset_lookup`` and ``<lake>/time_lookup``, incrementally.

    Each table keeps its own progress per partition as Delta app transactions
    (``<table>:<topic>-<partition>`` -> next offset), committed with its rows, so a re-run
    after a crash between the two commits neither duplicates nor loses rows; a run that finds
    another run moved a table's progress meanwhile is refused (``StaleTransactionError``).
    ``topics``: default every topic but Kafka's internal ones (``__consumer_offsets``, ...), as
    ingest; they are indexed only when named (the index check covers every segment anyway).
    Reads batches up to the high watermark (``replication-offset-checkpoint``), in plain Spark
    tasks of planned ranges (:func:`pipelines.delta.direct.stage_files`), one Delta commit per
    table. ``check`` also runs :func:`check_index_files` over every segment (a full scan).
    ``remote_log_storage`` (no log dirs): the offsets the cluster's tier holds are read from
    the object store (:mod:`pipelines.lookups_fetch`); with log dirs it is not read (the tables
    index what the log dirs hold, from the progress or the log start on).

    Retention racing the run: the broker holds what the lake's ingest has not read, not what
    lookups has not indexed, so segments go under a run. One deleted oldest-first (retention,
    DeleteRecords) before a task read it is skipped, its batches never indexed (its records,
    ingested, are in ``records``), the count logged with ``log``; any other segment found gone
    makes the table's step plan again (:func:`pipelines.sources.plan.replanned`, each attempt
    logged). The index check skips segments deleted under it.
    """
    # Imported here: pipelines.ingest and the writer need the Spark driver, not the executors.
    from pipelines.delta import read_app_transactions  # noqa: PLC0415
    from pipelines.delta.direct import stage_files  # noqa: PLC0415
    from pipelines.ingest import PIECES_PER_TASK, schedule_tasks  # noqa: PLC0415
    from pipelines.lookups_fetch import fetch_lookup_task, fetch_tasks  # noqa: PLC0415
    from pipelines.sources.plan import DEFAULT_MAX_PARTITION_BYTES  # noqa: PLC0415

    named = topics
    if not log_dirs and not bootstrap_servers:
        raise LoglakeError("build_lookups needs log dirs or bootstrap servers to read from")
    if topics is None and log_dirs:
        # every topic but Kafka's internal ones, as ingest: their batches are the broker's own
        # bookkeeping (consumer groups' commits, ingest's own lake-group commit every run),
        # which would change the tables on every run without any new application data
        topics = sorted(t for t in log_dir_topics(log_dirs) if not t.startswith("__"))
    max_bytes = max_partition_bytes or DEFAULT_MAX_PARTITION_BYTES
    piece = max(1, max_bytes // PIECES_PER_TASK)
    cores = spark.sparkContext.defaultParallelism
    rows: dict[str, int] = {}
    progress: dict[str, dict[str, int]] = {}
    for table in (OFFSET_LOOKUP, TIME_LOOKUP):
        path = LakeLocation.parse(lake).join(table).uri
        _evolve(path, table)
        done = read_app_transactions(path)
        starting: dict[str, dict[str, int]] = {}
        for app, version in done.items():
            name, _, tp = app.partition(":")
            topic, _, part = tp.rpartition("-")
            if name == table and topic and part.isdigit():
                starting.setdefault(topic, {})[part] = version
        if not log_dirs:  # through Fetch: the same rows but the file columns (module doc)
            tasks = fetch_tasks(
                bootstrap_servers, kafka=kafka, topics=topics, starting=starting, cores=cores,
                remote_log_storage=remote_log_storage, log=log,
            )  # fmt: skip
            task = functools.partial(fetch_lookup_task, table=table)
            staged = stage_files(
                spark, path, tasks, task, schema=LOOKUP_SCHEMAS[table], partition_by=["topic"]
            )
            _commit_table(table, staged, done, rows, progress, log)
            continue
        source = _source(log_dirs, topics, starting=starting, max_partition_bytes=piece)

        def stage(
            source: SourceOptions = source, path: str = path, table: str = table
        ) -> tuple[list[list[SegmentRange]], StagedWrite]:
            # A range starting at or past its partition's high watermark holds nothing to add
            # (a partition that is caught up starts no task).
            ranges = [r for r in plan_ranges(source) if r.start_offset < r.until] if topics else []
            tasks = schedule_tasks(ranges, cores, max_bytes, piece)
            task = functools.partial(_lookup_task, table=table, min_timestamp=source.min_timestamp)
            staged = stage_files(
                spark, path, tasks, task, schema=LOOKUP_SCHEMAS[table], partition_by=["topic"]
            )
            return tasks, staged

        # retention may delete a segment under the run (the lake group holds what ingest has
        # not read, not what lookups has not indexed): plan again from the new log start
        _tasks, staged = replanned(stage, what=f"build_lookups {table}", log=log)
        _commit_table(table, staged, done, rows, progress, log)
    problems: list[IndexProblem] = []
    if check and not log_dirs:
        # said on every run, never skipped silently: the check reads the broker's files
        log(
            "index check not done through Fetch: it compares the broker's .index/.timeindex "
            "files with the batches, and there are no log dirs to read them from"
        )
    elif check:
        problems = check_index_files(spark, log_dirs, topics=named, log=log)
    return LookupsSummary(rows, progress, problems)


def _commit_table(  # noqa: PLR0917
    table: str,
    staged: StagedWrite,
    done: Mapping[str, int],
    rows: dict[str, int],
    progress: dict[str, dict[str, int]],
    log: Callable[[str], None],
) -> None:
    """One table's commit: its rows with each partition's new progress (exactly once)."""
    ends: dict[tuple[str, int], int] = {}
    for report in staged.reports:
        tp_key = (report["topic"], report["partition"])
        ends[tp_key] = max(ends.get(tp_key, 0), report["next_offset"])
    deleted = sum(report["deleted_segments"] for report in staged.reports)
    if deleted:
        log(
            f"build_lookups {table}: {deleted} segments were deleted by retention before "
            "they were read; their batches are not indexed"
        )
    apps = {_app_id(table, t, p): end for (t, p), end in sorted(ends.items())}
    rows[table] = staged.num_rows
    if apps:
        staged.commit(app_transactions=apps, expected_versions={a: done.get(a) for a in apps})
    else:  # nothing to commit: remove what was staged, release the lease
        staged.abort()
    progress[table] = apps
