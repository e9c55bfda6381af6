"""Offset and time lookups as tables: what ``.index`` and ``.timeindex`` answer, in SQL.

Both tables are built from the ``logsegments`` source's ``kind=batches`` rows (headers + CRC
only; damaged batches, which carry an ``error``, are left out):

- ``offset_lookup``: one row per batch — topic, partition, segment (base offset), file,
  first_offset, last_offset, position, size, record_count, max_timestamp, is_control;
- ``time_lookup``: one row per batch — topic, partition, max_timestamp, first_offset,
  last_offset, segment, file, position, size.

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

:func:`check_indexes` checks the broker's own ``.index``/``.timeindex`` entries against the
batches (positions are batch starts, offsets inside the batch found there, the time index's
timestamps are running maxima of the batch max timestamps).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from logstore.errors import LoglakeError
from logstore.protocol.records import decode_batch

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "IndexProblem",
    "Location",
    "LookupsSummary",
    "build_lookups",
    "build_offset_lookup",
    "build_time_lookup",
    "check_indexes",
    "check_segment_indexes",
    "locate",
    "offsets_for_times",
]


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


def build_offset_lookup(batches: DataFrame) -> DataFrame:
    """``offset_lookup`` rows from ``kind=batches`` rows (sound batches only)."""
    return batches.where("error IS NULL").selectExpr(
        "topic",
        "partition",
        "segment_base_offset AS segment",
        "file",
        "base_offset AS first_offset",
        "last_offset",
        "position",
        "size",
        "record_count",
        "max_timestamp",
        "is_control",
    )


def build_time_lookup(batches: DataFrame) -> DataFrame:
    """``time_lookup`` rows from ``kind=batches`` rows (sound batches only)."""
    return batches.where("error IS NULL").selectExpr(
        "topic",
        "partition",
        "max_timestamp",
        "base_offset AS first_offset",
        "last_offset",
        "segment_base_offset AS segment",
        "file",
        "position",
        "size",
    )


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
) -> list[IndexProblem]:
    """Check one segment's ``.index`` and ``.timeindex`` against its batches (sorted by
    position; every frame of the file, damaged ones included, so positions are complete)."""
    problems: list[IndexProblem] = []
    log = Path(log_path)
    order = np.argsort(positions)
    pos, first, last, maxts = (
        a[order] for a in (positions, first_offsets, last_offsets, max_timestamps)
    )
    index = _entries(log.with_suffix(".index"), _OFFSET_ENTRY)
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
    times = _entries(log.with_suffix(".timeindex"), _TIME_ENTRY)
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


def check_indexes(batches: DataFrame) -> list[IndexProblem]:
    """Check every segment's index files against ``kind=batches`` rows, on the executors.

    Pass the batches of whole segments (no offset or time filters), damaged ones included.
    """
    schema = "file string, kind string, entry int, offset long, value long, problem string"

    def check(table: pa.Table) -> pa.Table:
        t = table.filter(pc.is_valid(table.column("last_offset")))
        if t.num_rows == 0:
            return _PROBLEMS.empty_table()
        problems = check_segment_indexes(
            t.column("file")[0].as_py(),
            t.column("segment_base_offset")[0].as_py(),
            positions=t.column("position").to_numpy(),
            first_offsets=t.column("base_offset").to_numpy(),
            last_offsets=t.column("last_offset").to_numpy(),
            max_timestamps=t.column("max_timestamp").to_numpy(),
        )
        return pa.Table.from_pylist([_as_dict(p) for p in problems], schema=_PROBLEMS)

    rows = (
        batches.select(
            "file", "segment_base_offset", "position", "base_offset", "last_offset", "max_timestamp"
        )
        .groupBy("file")
        .applyInArrow(check, schema)
        .collect()
    )
    return [IndexProblem(r.file, r.kind, r.entry, r.offset, r.value, r.problem) for r in rows]


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


def build_lookups(
    spark: SparkSession,
    *,
    log_dirs: Sequence[str],
    lake: str,
    topics: Sequence[str] | None = None,
    max_partition_bytes: int | None = None,
    check: bool = True,
) -> LookupsSummary:
    """Append new batches to ``<lake>/offset_lookup`` and ``<lake>/time_lookup``, incrementally.

    Each table keeps its own progress per partition as Delta app transactions
    (``<table>:<topic>-<partition>`` -> next offset), committed with its rows, so a re-run
    after a crash between the two commits neither duplicates nor loses rows. Reads batches up
    to the high watermark (the source's default). ``check`` also runs :func:`check_indexes`
    over every segment (a full ``kind=batches`` scan).
    """
    from pipelines.delta import read_app_transactions, write_delta  # noqa: PLC0415
    from pipelines.sources import read_segments  # noqa: PLC0415

    options: dict[str, object] = {}
    if topics:
        options["topics"] = ",".join(topics)
    if max_partition_bytes:
        options["maxPartitionBytes"] = max_partition_bytes
    rows: dict[str, int] = {}
    progress: dict[str, dict[str, int]] = {}
    for table, build in (
        ("offset_lookup", build_offset_lookup),
        ("time_lookup", build_time_lookup),
    ):
        path = str(Path(lake) / table)
        done = read_app_transactions(path)
        starting: dict[str, dict[int, int]] = {}
        for app, version in done.items():
            name, _, tp = app.partition(":")
            topic, _, part = tp.rpartition("-")
            if name == table and topic and part.isdigit():
                starting.setdefault(topic, {})[int(part)] = version
        batches = read_segments(
            spark, ",".join(log_dirs), kind="batches", startingOffsets=starting, **options
        )
        df = build(batches).cache()
        ends = df.groupBy("topic", "partition").agg({"last_offset": "max", "*": "count"}).collect()
        apps = {
            _app_id(table, r["topic"], r["partition"]): int(r["max(last_offset)"]) + 1 for r in ends
        }
        rows[table] = sum(int(r["count(1)"]) for r in ends)
        if apps:
            write_delta(df, path, partition_by=["topic"], app_transactions=apps)
        df.unpersist()
        progress[table] = apps
    problems: list[IndexProblem] = []
    if check:
        scan_options = {k: v for k, v in options.items() if k == "topics"}
        problems = check_indexes(
            read_segments(spark, ",".join(log_dirs), kind="batches", until="latest", **scan_options)
        )
    return LookupsSummary(rows, progress, problems)
