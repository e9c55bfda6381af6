"""Executor side of the Delta sink: Arrow batches to Parquet data files plus their add metadata.

Layout on disk (what Delta and Hive readers expect): data files live under the table root,
one directory level per partition column, ``<col>=<escaped value>`` (Hive escaping; a null is
``__HIVE_DEFAULT_PARTITION__``). Partition columns are not stored inside the Parquet files;
their values travel in the add action (``partitionValues``, Delta's string forms). File names
are ``part-<task:05d>-<write_id>-<attempt>-c<seq:03d>.<codec>.parquet``: ``write_id`` is unique
per write job, so every file a job ever produced (including failed or duplicate task attempts)
can be found and removed by name when the job aborts or after it commits.

Stats follow the Delta protocol's per-file statistics: ``numRecords``, ``minValues``,
``maxValues``, ``nullCount`` for the first 32 top-level columns (``dataSkippingNumIndexedCols``).
Bounds are only ever looser, never tighter, than the data: long strings get no max, timestamps
are written with millisecond precision (min floored, max ceiled), floats with NaN get no bounds.

Where: the table's location is a local directory or an object-store prefix
(:class:`~logstore.objectstore.LakeLocation`); files are written through the pyarrow
filesystem of that location (:meth:`~logstore.objectstore.StorageSettings.filesystem`), so an
executor writes straight to S3 (a multipart upload streamed while the Parquet writer runs, no
local copy; a file under one part, 10 MiB, is one PUT at its close) exactly as it writes to
disk. The settings travel to executors inside the task (a
frozen dataclass): an executor's environment is the JVM's, not the driver's.

Crash behaviour: a file is written in place and is invisible until a commit references it; a
killed task leaves a partial file that no snapshot contains (``cleanup_write_files`` removes it;
on S3 an upload that never completed leaves no object at all: nothing for a file that had
not filled a part, else an incomplete multipart upload that the bucket's lifecycle rule
``AbortIncompleteMultipartUpload`` expires).
Thread-safety: one ``PartitionedFileWriter`` per task; not shared between threads.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from logstore.objectstore import LakeLocation, ObjectStore, StorageSettings
from pipelines.decode.arrow import same_bytes

if TYPE_CHECKING:
    from pipelines.delta.parquet import FastParquetWriter

__all__ = [
    "HIVE_NULL",
    "LOCAL_ROW_GROUP_BYTES",
    "NUM_INDEXED_COLS",
    "RECORDS_PARQUET_OPTIONS",
    "REMOTE_ROW_GROUP_BYTES",
    "PartitionedFileWriter",
    "WrittenFile",
    "cleanup_write_files",
    "default_row_group_bytes",
    "escape_path_name",
    "parquet_column_paths",
    "partition_value_string",
    "split_by_partition",
    "table_location",
]

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
NUM_INDEXED_COLS = 32
_STRING_PREFIX = 32
# Hive's FileUtils.escapePathName set: characters a partition directory name must not hold raw.
_HIVE_UNSAFE = frozenset("\"#%'*/:=?\\\x7f{[]^") | frozenset(chr(c) for c in range(1, 32))

# Writer options for the ingest job's ``records`` table (partitioned by topic and date), as
# ``PartitionedFileWriter(..., **RECORDS_PARQUET_OPTIONS)``; chosen by measuring 1.08M records
# with unique keys and values (half random bytes), against pyarrow's defaults:
# - key, value, headers: plain, no statistics. Keys and values are mostly distinct, so a
#   dictionary is built and then abandoned at its 1 MiB page limit (pure cost), and min/max of
#   binaries costs a compare per row while Delta's stats skip binaries anyway;
# - offset, timestamp, batch_position (non-decreasing): DELTA_BINARY_PACKED, ~0 bytes a row;
#   statistics only on offset and timestamp (what readers filter rows on);
# - the per-batch integers and codec (one value per batch or per partition): dictionary,
#   a few bytes per file.
# Together, with snappy, ~0.19 instead of ~0.30 s of one core per 1M records and files 15%
# smaller (64 instead of 75 bytes a record). Readable by Spark 4's vectorized reader, delta-rs
# and polars (tests/unit/pipelines/delta/test_delta_files.py reads files back with each).
RECORDS_PARQUET_OPTIONS: Mapping[str, Any] = {
    "use_dictionary": (
        "partition",
        "timestamp_type",
        "producer_id",
        "producer_epoch",
        "base_sequence",
        "leader_epoch",
        "segment_base_offset",
        "codec",
    ),
    "write_statistics": ("offset", "timestamp"),
    "column_encoding": {
        "offset": "DELTA_BINARY_PACKED",
        "timestamp": "DELTA_BINARY_PACKED",
        "batch_position": "DELTA_BINARY_PACKED",
    },
    "parquet_writer": "loglake",
}


def table_location(path: str | Path | LakeLocation) -> LakeLocation:
    """A table's location from what callers hold: a location, a local path (``file://`` or
    plain, made absolute) or an object-store URI (``s3://bucket/prefix``)."""
    return path if isinstance(path, LakeLocation) else LakeLocation.parse(path)


@dataclass(frozen=True)
class WrittenFile:
    """One data file written by a task: what its Delta add action needs.

    ``path`` is relative to the table root and URI-encoded, as Delta's ``add.path`` requires;
    ``stats`` is the JSON string of the add action's ``stats`` field.
    """

    path: str
    size: int
    num_rows: int
    partition_values: dict[str, str | None]
    stats: str
    modification_time: int


def escape_path_name(value: str) -> str:
    """Hive-escape one partition value for a directory name (``%XX`` for unsafe characters)."""
    return "".join(f"%{ord(c):02X}" if c in _HIVE_UNSAFE else c for c in value)


def partition_value_string(value: Any) -> str | None:
    """Delta's string form of a partition value (protocol "Partition Value Serialization")."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, _dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(_dt.UTC).replace(tzinfo=None)
        return str(value.isoformat(sep=" ", timespec="microseconds"))
    if isinstance(value, _dt.date):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return str(value)


def _partition_dir(partition_by: Sequence[str], values: dict[str, str | None]) -> str:
    parts = []
    for col in partition_by:
        v = values[col]
        parts.append(f"{escape_path_name(col)}={HIVE_NULL if v is None else escape_path_name(v)}")
    return "/".join(parts)


def split_by_partition(
    table: pa.Table, partition_by: Sequence[str]
) -> Iterator[tuple[dict[str, str | None], pa.Table]]:
    """Yield ``(partition values, rows without the partition columns)`` per distinct key.

    The common case, every partition column holding one value (one topic, one day), is
    recognised by cheap whole-column checks (:func:`_single_value`) without grouping.
    """
    if not partition_by:
        yield {}, table
        return
    data_cols = [n for n in table.column_names if n not in set(partition_by)]
    values: dict[str, str | None] = {}
    for col in partition_by:
        single, value = _single_value(table.column(col))
        if not single:
            break
        values[col] = partition_value_string(value)
    else:
        yield values, table.select(data_cols)
        return
    # Dictionaries decoded: group_by keys them by index, so one value under two indices
    # would come out as two groups (and the rows twice).
    columns = {c: _decoded(table.column(c)) for c in partition_by}
    keys = pa.table(columns).group_by(list(partition_by)).aggregate([])
    for row in keys.to_pylist():
        values = {c: partition_value_string(row[c]) for c in partition_by}
        if keys.num_rows == 1:
            yield values, table.select(data_cols)
            continue
        mask = None
        for col, column in columns.items():
            m = _equal(column, row[col])
            mask = m if mask is None else pc.and_(mask, m)
        yield values, table.filter(mask).select(data_cols)


def _decoded(column: pa.ChunkedArray) -> pa.ChunkedArray:
    if pa.types.is_dictionary(column.type):
        return pc.cast(column, column.type.value_type)
    return column


def _equal(column: pa.ChunkedArray, value: Any) -> pa.ChunkedArray:
    """Rows equal to ``value`` as group_by sees it: nulls match None, NaN matches NaN."""
    if value is None:
        return pc.is_null(column)
    if isinstance(value, float) and math.isnan(value):
        return pc.fill_null(pc.is_nan(column), False)
    return pc.fill_null(pc.equal(column, value), False)


def _single_value(column: pa.ChunkedArray) -> tuple[bool, Any]:
    """``(True, value)`` when every row of ``column`` holds ``value`` (None: all null).

    ``(False, None)`` when the rows differ, and also when no cheap check exists for the type
    (floats, nested...): callers then take their general path. Integers, dates, timestamps
    and booleans are checked by ``min_max``, dictionaries by their indices, strings and
    binaries by :func:`~pipelines.decode.arrow.same_bytes` (``min_max`` on strings costs ~12 ns a
    row).
    """
    chunks = [c for c in column.chunks if len(c)]
    if not chunks or not all(_chunk_single(c) for c in chunks):
        return False, None
    first = chunks[0][0]
    if any(not c[0].equals(first) for c in chunks[1:]):
        return False, None
    return True, first.as_py()


def _chunk_single(arr: pa.Array) -> bool:
    if arr.null_count:
        return bool(arr.null_count == len(arr))
    t = arr.type
    if pa.types.is_dictionary(t):
        return _chunk_single(arr.indices)  # a repeated value under two indices reads as "no"
    if pa.types.is_integer(t) or pa.types.is_date(t) or pa.types.is_timestamp(t) or t == pa.bool_():
        mm = pc.min_max(arr)
        return bool(mm["min"].equals(mm["max"]))
    if t in (pa.string(), pa.binary(), pa.large_string(), pa.large_binary()):
        return same_bytes(arr)
    return False


class _Stats:
    """Running per-file statistics over the chunks written to one file.

    ``footer``: string columns whose bounds are taken from the Parquet footer the writer makes
    anyway (pyarrow's or loglake's; :meth:`from_footer`, after the file is closed) instead of a
    ``min_max`` pass of their own here: ~12-17 ns a row per string column (3 of the decode
    bench's 12 columns: ~39 ns of a typed row's ~1.3 us), computed twice otherwise.
    """

    def __init__(self, schema: pa.Schema, footer: Collection[str] = ()) -> None:
        self.num_records = 0
        self.mins: dict[str, Any] = {}
        self.maxs: dict[str, Any] = {}
        self.no_bounds: set[str] = set()
        self.nulls: dict[str, int] = {}
        self.fields = [f for f in schema][:NUM_INDEXED_COLS]
        self.footer = {f.name for f in self.fields if f.name in footer and _is_string(f.type)}

    def update(self, table: pa.Table) -> None:
        self.num_records += table.num_rows
        for f in self.fields:
            col = table.column(f.name)
            self.nulls[f.name] = self.nulls.get(f.name, 0) + col.null_count
            if f.name in self.no_bounds or f.name in self.footer or not _has_bounds(f.type):
                continue
            if col.null_count == len(col):
                continue
            if pa.types.is_floating(f.type) and pc.any(pc.is_nan(col)).as_py():
                self.no_bounds.add(f.name)
                continue
            single, lo = _single_value(col) if _is_string(f.type) else (False, None)
            if single:
                hi = lo
            else:
                mm = pc.min_max(col)
                lo, hi = _scalar_value(mm["min"]), _scalar_value(mm["max"])
            if f.name in self.mins:
                lo, hi = min(lo, self.mins[f.name]), max(hi, self.maxs[f.name])
            self.mins[f.name], self.maxs[f.name] = lo, hi

    def from_footer(self, metadata: pq.FileMetaData) -> None:
        """The bounds of the ``footer`` columns from the file's row groups' statistics (top-level
        columns: their path is their name). A row group with present values but no min/max
        leaves the column without bounds: none rather than wrong ones."""
        index = {metadata.schema.column(i).path: i for i in range(metadata.num_columns)}
        for name in self.footer:
            lo = hi = None
            for g in range(metadata.num_row_groups):
                column = metadata.row_group(g).column(index[name])
                st = column.statistics
                if st is not None and st.has_null_count and st.null_count == column.num_values:
                    continue  # all null: no bounds to take
                if st is None or not st.has_min_max:
                    self.no_bounds.add(name)
                    break
                g_lo, g_hi = st.min_raw, st.max_raw  # bytes, compared as Parquet orders them
                lo = g_lo if lo is None else min(lo, g_lo)
                hi = g_hi if hi is None else max(hi, g_hi)
            if name not in self.no_bounds and lo is not None and hi is not None:
                self.mins[name] = lo.decode("utf-8") if isinstance(lo, bytes) else lo
                self.maxs[name] = hi.decode("utf-8") if isinstance(hi, bytes) else hi

    def to_json(self) -> str:
        mins: dict[str, Any] = {}
        maxs: dict[str, Any] = {}
        for f in self.fields:
            if f.name not in self.mins or f.name in self.no_bounds:
                continue
            lo = _bound(f.type, self.mins[f.name], False)
            hi = _bound(f.type, self.maxs[f.name], True)
            if lo is not None:
                mins[f.name] = lo
            if hi is not None:
                maxs[f.name] = hi
        nulls = {
            f.name: self.nulls.get(f.name, 0) for f in self.fields if not pa.types.is_struct(f.type)
        }
        return json.dumps(
            {
                "numRecords": self.num_records,
                "minValues": mins,
                "maxValues": maxs,
                "nullCount": nulls,
            },
            separators=(",", ":"),
        )


def _is_string(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def _has_bounds(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or _is_string(t)
        or pa.types.is_date32(t)
        or pa.types.is_timestamp(t)
    )


def _scalar_value(scalar: pa.Scalar) -> Any:
    """``scalar.as_py()``, but a timestamp as its integer count of its unit: a timestamp's
    ``as_py()`` imports pandas (~1.5 s in a fresh Spark Python worker)."""
    if pa.types.is_timestamp(scalar.type):
        return int(scalar.value)
    return scalar.as_py()


# A timestamp value in its unit -> milliseconds: value * multiplier, then // divisor.
_TO_MILLIS = {"s": (1000, 1), "ms": (1, 1), "us": (1, 1_000), "ns": (1, 1_000_000)}
_EPOCH = _dt.datetime(1970, 1, 1)


def _bound(t: pa.DataType, value: Any, upper: bool) -> Any:
    if pa.types.is_integer(t):
        return int(value)
    if pa.types.is_floating(t):
        return float(value) if math.isfinite(value) else None
    if _is_string(t):
        if len(value) <= _STRING_PREFIX:
            return value
        return None if upper else value[:_STRING_PREFIX]
    if pa.types.is_date32(t):
        return value.isoformat()
    if pa.types.is_timestamp(t):
        # ``value``: a count of the type's unit since the epoch (UTC when the type has a tz);
        # to milliseconds, the lower bound floored and the upper one ceiled.
        mul, div = _TO_MILLIS[t.unit]
        ms = -(-value * mul // div) if upper else value * mul // div
        try:
            ts = _EPOCH + _dt.timedelta(milliseconds=ms)
        except OverflowError:  # beyond datetime's years 1-9999: no bound rather than a wrong one
            return None
        text = ts.isoformat(timespec="milliseconds")
        return text + "Z" if t.tz is not None else text
    return None


@dataclass
class _OpenFile:
    rel_path: str
    fs_path: str
    values: dict[str, str | None]
    writer: pq.ParquetWriter | FastParquetWriter
    sink: pa.NativeFile
    stats: _Stats
    rows: int = 0
    pending: list[pa.Table] = field(default_factory=list)
    pending_bytes: int = 0


class PartitionedFileWriter:
    """Write one task's rows as Parquet files under ``root``, split by partition values.

    Rows are buffered per partition until ``row_group_bytes`` and written as one row group;
    a file rolls after ``max_rows_per_file`` rows. ``row_group_bytes`` (Arrow bytes) defaults
    by store (:func:`default_row_group_bytes`): 64 MiB on local disk, 16 MiB on an object
    store, where a row group is also the unit in which the file streams up. ``close()``
    returns the files written; ``abort()`` removes them.

    ``compression``, ``compression_level``, ``use_dictionary``, ``write_statistics``,
    ``column_encoding`` and ``store_decimal_as_integer`` mean what they mean for
    ``pyarrow.parquet.ParquetWriter``; column
    names are Parquet leaf paths (:func:`parquet_column_paths`: ``headers.list.element.key``
    for a field of a list of structs), and a name that is no column of the file is refused
    (pyarrow would silently ignore it). The defaults are pyarrow's (dictionary and statistics
    on every column) with zstd; :data:`RECORDS_PARQUET_OPTIONS` is the ingest job's choice.
    ``parquet_writer``: ``"pyarrow"`` (``pq.ParquetWriter``) or ``"loglake"``
    (:class:`pipelines.delta.parquet.FastParquetWriter`, same options and file layout, used
    when it supports every column type of the file with these options, else pyarrow's: it
    writes decimals only as integers, ``store_decimal_as_integer=True``).
    """

    def __init__(
        self,
        root: str | Path | LakeLocation,
        *,
        settings: StorageSettings | None = None,
        write_id: str,
        task_id: int,
        attempt: int,
        partition_by: Sequence[str],
        compression: str = "zstd",
        compression_level: int | None = None,
        use_dictionary: bool | Sequence[str] = True,
        write_statistics: bool | Sequence[str] = True,
        column_encoding: str | Mapping[str, str] | None = None,
        max_rows_per_file: int = 10_000_000,
        row_group_bytes: int | None = None,
        parquet_writer: str = "pyarrow",
        store_decimal_as_integer: bool = False,
    ) -> None:
        self.location = table_location(root)
        self.settings = settings if settings is not None else StorageSettings.default()
        self._fs = self.settings.filesystem(self.location)
        self.write_id = write_id
        self.task_id = task_id
        self.attempt = attempt
        self.partition_by = list(partition_by)
        self.compression = compression
        self.parquet_options: dict[str, Any] = {
            "compression": compression,
            "compression_level": compression_level,
            "use_dictionary": _names_or_bool(use_dictionary),
            "write_statistics": _names_or_bool(write_statistics),
            "column_encoding": (
                dict(column_encoding) if isinstance(column_encoding, Mapping) else column_encoding
            ),
            "store_decimal_as_integer": store_decimal_as_integer,
        }
        self._named_columns = {
            name
            for option in (use_dictionary, write_statistics, column_encoding)
            if not isinstance(option, (bool, str, type(None)))
            for name in option
        }
        if parquet_writer not in ("pyarrow", "loglake"):
            raise ValueError(
                f"parquet_writer must be 'pyarrow' or 'loglake', not {parquet_writer!r}"
            )
        self.parquet_writer = parquet_writer
        self.max_rows_per_file = max_rows_per_file
        self.row_group_bytes = (
            default_row_group_bytes(self.location) if row_group_bytes is None else row_group_bytes
        )
        self._open: dict[tuple[str | None, ...], _OpenFile] = {}
        self._done: list[WrittenFile] = []
        self._all_paths: list[str] = []
        self._seq = 0

    def write(self, table: pa.Table) -> None:
        """Add rows (with the partition columns still present)."""
        if table.num_rows == 0:
            return
        for values, group in split_by_partition(table, self.partition_by):
            key = tuple(values[c] for c in self.partition_by)
            rows = group
            while rows.num_rows:
                f = self._open.get(key)
                if f is None:
                    f = self._new_file(values, rows.schema)
                    self._open[key] = f
                room = self.max_rows_per_file - f.rows
                part, rows = rows.slice(0, room), rows.slice(room)
                f.pending.append(part)
                f.pending_bytes += part.nbytes
                f.rows += part.num_rows
                if f.pending_bytes >= self.row_group_bytes:
                    self._flush(f)
                if f.rows >= self.max_rows_per_file:
                    self._finish(key)

    def close(self) -> list[WrittenFile]:
        """Finish every open file and return all files of this task."""
        for key in list(self._open):
            self._finish(key)
        return list(self._done)

    def abort(self) -> None:
        """Close and delete everything this task wrote (best effort: a file may be gone)."""
        for f in self._open.values():
            try:
                f.writer.close()
                f.sink.close()
            except Exception:  # the task is failing already; removal below is what matters
                pass
        self._open.clear()
        for p in self._all_paths:
            with contextlib.suppress(OSError):  # never created, or the store is away
                self._fs.delete_file(p)

    def _new_file(self, values: dict[str, str | None], schema: pa.Schema) -> _OpenFile:
        if self._named_columns:
            self._check_column_names(schema)
        name = (
            f"part-{self.task_id:05d}-{self.write_id}-{self.attempt}-c{self._seq:03d}"
            f".{self.compression}.parquet"
        )
        self._seq += 1
        rel_dir = _partition_dir(self.partition_by, values)
        rel = f"{rel_dir}/{name}" if rel_dir else name
        fs_path = self.location.join(rel).fs_path
        self._all_paths.append(fs_path)
        sink: pa.NativeFile
        if self.location.is_local:
            Path(fs_path).parent.mkdir(parents=True, exist_ok=True)
            sink = pa.OSFile(fs_path, "wb")
        else:  # object stores have no directories to make
            sink = self._fs.open_output_stream(fs_path)
        writer: pq.ParquetWriter | FastParquetWriter
        decimals = bool(self.parquet_options["store_decimal_as_integer"])
        if self.parquet_writer == "loglake" and _fast_writer().fast_writer_supports(
            schema, store_decimal_as_integer=decimals
        ):
            writer = _fast_writer().FastParquetWriter(sink, schema, **self.parquet_options)
        else:
            writer = pq.ParquetWriter(sink, schema, **self.parquet_options)
        asked = self.parquet_options["write_statistics"]
        footer = [n for n in schema.names if asked is True or (asked and n in asked)]
        return _OpenFile(rel, fs_path, values, writer, sink, _Stats(schema, footer))

    def _check_column_names(self, schema: pa.Schema) -> None:
        """Refuse option names that are no Parquet column of ``schema`` (pyarrow ignores them)."""
        unknown = self._named_columns - set(parquet_column_paths(schema))
        if unknown:
            raise ValueError(
                f"Parquet writer options name columns not in the file: {sorted(unknown)} "
                f"(its columns: {parquet_column_paths(schema)})"
            )

    def _flush(self, f: _OpenFile) -> None:
        if not f.pending:
            return
        chunk = pa.concat_tables(f.pending) if len(f.pending) > 1 else f.pending[0]
        f.pending.clear()
        f.pending_bytes = 0
        f.stats.update(chunk)
        f.writer.write_table(chunk, row_group_size=max(chunk.num_rows, 1))

    def _finish(self, key: tuple[str | None, ...]) -> None:
        f = self._open.pop(key)
        self._flush(f)
        f.writer.close()
        if f.stats.footer:
            f.stats.from_footer(
                f.writer.writer.metadata
                if isinstance(f.writer, pq.ParquetWriter)
                else f.writer.metadata
            )
        size = f.sink.tell()  # every byte of the file went through this stream
        f.sink.close()  # on S3: completes the upload; the object exists from here on
        self._done.append(
            WrittenFile(
                path=quote(f.rel_path, safe="/=-_.~"),
                size=size,
                num_rows=f.stats.num_records,
                partition_values=dict(f.values),
                stats=f.stats.to_json(),
                modification_time=int(time.time() * 1000),
            )
        )


# Row-group sizes (bytes of Arrow data buffered before a row group is encoded and written).
LOCAL_ROW_GROUP_BYTES = 64 << 20
# Why smaller on an object store: a row group is encoded at once when it is flushed, and only
# then do its bytes reach the upload stream (a multipart upload whose parts go up in
# pyarrow's I/O threads while the task goes on). With 64 MiB, a task of up to ~400k records
# (most tasks of an ingest run: schedule_tasks cuts them smaller towards the end) buffered
# everything until close(), so its whole file was encoded and uploaded after its decoding:
# decode, then encode, then wait for the upload, with nothing overlapped (profiled on moto,
# 1M records: close() took 2-4 s of a 6-8 s task on S3, 0.2-0.5 s on disk). 16 MiB (~100k
# records of 100 bytes, a ~6 MB row group) lets each row group upload while the next one is
# decoded; the file's layout stays a reader's ordinary one.
REMOTE_ROW_GROUP_BYTES = 16 << 20


def default_row_group_bytes(location: LakeLocation) -> int:
    """The row-group size :class:`PartitionedFileWriter` uses at ``location`` when not told."""
    return LOCAL_ROW_GROUP_BYTES if location.is_local else REMOTE_ROW_GROUP_BYTES


def _fast_writer() -> Any:
    """:mod:`pipelines.delta.parquet`, imported on first use (it loads numba)."""
    from pipelines.delta import parquet  # noqa: PLC0415

    return parquet


def parquet_column_paths(schema: pa.Schema) -> list[str]:
    """The Parquet leaf column paths of ``schema`` as pyarrow writes it.

    These are the names ``use_dictionary``, ``write_statistics`` and ``column_encoding`` take:
    a top-level column is its name, a field of a list of structs ``<name>.list.element.<field>``.
    """
    sink = pa.BufferOutputStream()
    # A writer closed without rows: ``schema.empty_table()`` would import pandas (~1.5 s in a
    # fresh Spark Python worker).
    pq.ParquetWriter(sink, schema).close()
    parquet_schema = pq.read_metadata(pa.BufferReader(sink.getvalue())).schema
    return [parquet_schema.column(i).path for i in range(len(parquet_schema))]


def _names_or_bool(value: bool | Sequence[str]) -> bool | list[str]:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        raise TypeError(f"expected a bool or a sequence of column names, got {value!r}")
    return list(value)


def cleanup_write_files(
    root: str | Path | LakeLocation,
    write_id: str,
    *,
    keep: set[str] | None = None,
    prune_dirs: bool = False,
    dirs: Iterable[str] | None = None,
    settings: StorageSettings | None = None,
) -> int:
    """Remove the files of write ``write_id`` under ``root`` except the relative paths in ``keep``.

    ``keep`` holds paths as written (not URI-encoded). ``_delta_log`` is never touched.
    ``dirs``: look only in these directories (relative to ``root``, not recursively), e.g. the
    partition directories of the files a write staged, instead of listing the whole table,
    which grows with every run. ``prune_dirs`` also removes partition directories left empty
    on local disk (only safe when no other writer is adding files to the table at the same
    time; an object store has no directories). Returns the number of files removed. Local
    disk and object stores alike, through :class:`~logstore.objectstore.ObjectStore`.
    """
    store = ObjectStore(table_location(root), settings=settings)
    marker = f"-{write_id}-"
    keep = keep or set()
    if store.root.is_local and not store.root.local_path.is_dir():
        return 0
    if dirs is None:
        names = [o.path for o in store.list()]
    else:
        names = [o.path for d in sorted(set(dirs)) for o in store.list(d, recursive=False)]
    removed = 0
    for rel in names:
        if marker not in rel.rsplit("/", 1)[-1] or rel.split("/", 1)[0] == "_delta_log":
            continue
        if rel in keep:
            continue
        store.delete(rel, missing_ok=True)
        removed += 1
    if prune_dirs and store.root.is_local:
        base = store.root.local_path
        for dirpath, _dirnames, _filenames in os.walk(base, topdown=False):
            d = Path(dirpath)
            if d != base and "_delta_log" not in d.relative_to(base).parts:
                with contextlib.suppress(OSError):  # not empty: holds other data
                    d.rmdir()
    return removed
