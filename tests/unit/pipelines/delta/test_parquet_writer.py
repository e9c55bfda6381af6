"""The fast Parquet writer (pipelines.delta.parquet) writes files every reader reads back exactly.

Reference for a correct file: ``pyarrow.parquet.ParquetWriter`` given the same table and options
(same Parquet schema, row groups, value counts, codecs). Files are read back with pyarrow and
polars (two independent readers; Spark's vectorized and parquet-mr readers in the integration
test), and their structure is checked from the footer and the page headers themselves (a small
Thrift compact-protocol reader below): page types, value counts, encodings, page sizes.
"""

from __future__ import annotations

import decimal
import inspect
import io
import itertools
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import cramjam
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.delta import _parquet_kernels as kernels
from pipelines.delta import parquet as parquet_module
from pipelines.delta.files import RECORDS_PARQUET_OPTIONS
from pipelines.delta.parquet import FastParquetWriter, fast_writer_supports, snappy_stored
from pipelines.sources.schema import RECORDS_ARROW_SCHEMA
from tests.fixtures.records import records_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

STORED_RECORDS_SCHEMA = pa.schema(
    [f for f in RECORDS_ARROW_SCHEMA if f.name not in ("topic", "date")]
)

# Parquet enum values (parquet.thrift)
PAGE_DATA_V1, PAGE_DICTIONARY = 0, 2
ENC_PLAIN, ENC_PLAIN_DICTIONARY, ENC_RLE, ENC_DELTA_BINARY_PACKED, ENC_RLE_DICTIONARY = (
    0,
    2,
    3,
    5,
    8,
)
CODECS = {"none": 0, "snappy": 1, "zstd": 6, "lz4": 7}  # lz4 is LZ4_RAW

INT_BOUNDS = {
    pa.int8(): (-(2**7), 2**7 - 1),
    pa.int16(): (-(2**15), 2**15 - 1),
    pa.int32(): (-(2**31), 2**31 - 1),
    pa.int64(): (-(2**63), 2**63 - 1),
    pa.date32(): (-(2**31), 2**31 - 1),
}
# timestamp[s] is stored in milliseconds (as pyarrow does): seconds must fit once multiplied
TS_SECONDS_BOUND = (2**63 - 1) // 1000


# ---------------------------------------------------------------------------------------------
# Writing and reading helpers


def _write_fast(
    tables: Sequence[pa.Table],
    schema: pa.Schema | None = None,
    row_group_size: int | None = None,
    where: Any = None,
    **options: Any,
) -> bytes:
    """Write ``tables`` (one ``write_table`` call each) with the fast writer; the file's bytes."""
    schema = schema if schema is not None else tables[0].schema
    sink = pa.BufferOutputStream() if where is None else where
    w = FastParquetWriter(sink, schema, **options)
    for t in tables:
        w.write_table(t, row_group_size=row_group_size)
    w.close()
    if where is None:
        return bytes(sink.getvalue().to_pybytes())
    if isinstance(where, (str, Path)):
        return Path(where).read_bytes()
    return b""


def _write_reference(
    tables: Sequence[pa.Table],
    schema: pa.Schema | None = None,
    row_group_size: int | None = None,
    **options: Any,
) -> bytes:
    """The same tables and options through ``pyarrow.parquet.ParquetWriter``."""
    schema = schema if schema is not None else tables[0].schema
    # the fast writer's defaults, where pyarrow's differ
    opts = {"use_dictionary": False, "write_statistics": False, **options}
    if opts.get("compression_level", 0) is None:
        del opts["compression_level"]
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, schema, **opts) as w:
        for t in tables:
            w.write_table(t, row_group_size=row_group_size)
    return bytes(sink.getvalue().to_pybytes())


def _read_pyarrow(data: bytes) -> pa.Table:
    return pq.read_table(pa.BufferReader(data), page_checksum_verification=True)


def _read_polars(data: bytes) -> pa.Table:
    return pl.read_parquet(io.BytesIO(data)).to_arrow()


def _storage_type(t: pa.DataType) -> pa.DataType:
    """The integer type behind a timestamp/date (recursively): values compare without datetime
    conversions, which fail or lose precision for extreme values and nanoseconds."""
    if pa.types.is_timestamp(t):
        return pa.int64()
    if pa.types.is_date32(t):
        return pa.int32()
    if pa.types.is_list(t):
        return pa.list_(pa.field(t.value_field.name, _storage_type(t.value_type), True))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _storage_type(f.type), True) for f in t])
    return t


def _plain_values(col: pa.ChunkedArray | pa.Array) -> list[Any]:
    return list(col.cast(_storage_type(col.type)).to_pylist())


def assert_same_table(got: pa.Table, expected: pa.Table, reader: str) -> None:
    """``got`` holds exactly ``expected``'s rows (cast to its schema first: types may differ in
    representation only, e.g. polars' large_string or a reader's timestamp unit/zone)."""
    assert got.column_names == expected.column_names, reader
    assert got.num_rows == expected.num_rows, f"{reader}: {got.num_rows} != {expected.num_rows}"
    got = got.cast(expected.schema)
    for name in expected.column_names:
        g, e = _plain_values(got.column(name)), _plain_values(expected.column(name))
        if g != e:
            i = next(k for k in range(len(e)) if g[k] != e[k])
            raise AssertionError(f"{reader}: column {name!r} row {i}: {g[i]!r} != {e[i]!r}")


def assert_round_trips(data: bytes, expected: pa.Table) -> None:
    """pyarrow reads back the Arrow schema it reads from its own writer's file of the same table
    (timestamp[s] comes back as timestamp[ms]: Parquet has no seconds) and the values; polars
    reads the same values."""
    got = _read_pyarrow(data)
    want = _read_pyarrow(_write_reference([expected])).schema
    assert got.schema.equals(want), f"{got.schema}\n!=\n{want}"
    assert_same_table(got, expected, "pyarrow")
    assert_same_table(_read_polars(data), expected, "polars")


# ---------------------------------------------------------------------------------------------
# A Thrift compact-protocol reader: the footer and the page headers as {field id: value}


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _thrift_value(data: bytes, pos: int, ttype: int) -> tuple[Any, int]:
    if ttype in (1, 2):
        return ttype == 1, pos
    if ttype == 3:
        return struct.unpack_from("b", data, pos)[0], pos + 1
    if ttype in (4, 5, 6):
        v, pos = _varint(data, pos)
        return _zigzag(v), pos
    if ttype == 7:
        return struct.unpack_from("<d", data, pos)[0], pos + 8
    if ttype == 8:
        n, pos = _varint(data, pos)
        return bytes(data[pos : pos + n]), pos + n
    if ttype in (9, 10):
        head = data[pos]
        pos += 1
        size, etype = head >> 4, head & 0x0F
        if size == 15:
            size, pos = _varint(data, pos)
        items = []
        for _ in range(size):
            if etype in (1, 2):
                items.append(data[pos] == 1)
                pos += 1
            else:
                item, pos = _thrift_value(data, pos, etype)
                items.append(item)
        return items, pos
    if ttype == 11:
        size, pos = _varint(data, pos)
        if size == 0:
            return {}, pos
        kv = data[pos]
        pos += 1
        out = {}
        for _ in range(size):
            k, pos = _thrift_value(data, pos, kv >> 4)
            v, pos = _thrift_value(data, pos, kv & 0x0F)
            out[k] = v
        return out, pos
    if ttype == 12:
        return _thrift_struct(data, pos)
    raise AssertionError(f"bad thrift type {ttype} at {pos}")


def _thrift_struct(data: bytes, pos: int) -> tuple[dict[int, Any], int]:
    fields: dict[int, Any] = {}
    last = 0
    while True:
        head = data[pos]
        pos += 1
        if head == 0:
            return fields, pos
        delta, ttype = head >> 4, head & 0x0F
        if delta:
            fid = last + delta
        else:
            v, pos = _varint(data, pos)
            fid = _zigzag(v)
        fields[fid], pos = _thrift_value(data, pos, ttype)
        last = fid


def _footer(data: bytes) -> dict[int, Any]:
    assert data[:4] == b"PAR1" and data[-4:] == b"PAR1"
    (n,) = struct.unpack_from("<i", data, len(data) - 8)
    start = len(data) - 8 - n
    meta, end = _thrift_struct(data, start)
    assert end == len(data) - 8, "footer length does not match its contents"
    return meta


@dataclass
class Page:
    type: int
    num_values: int
    encoding: int
    uncompressed: int
    compressed: int


@dataclass
class Chunk:
    path: str
    codec: int
    num_values: int
    encodings: list[int]
    pages: list[Page] = field(default_factory=list)

    @property
    def data_pages(self) -> list[Page]:
        return [p for p in self.pages if p.type != PAGE_DICTIONARY]


def chunks_of(data: bytes) -> list[list[Chunk]]:
    """Every column chunk of every row group, with its pages walked from the page headers."""
    meta = _footer(data)
    out = []
    for rg in meta.get(4, []):
        chunks = []
        for cc in rg[1]:
            md = cc[3]
            start = md[11] if md.get(11) else md[9]
            if md.get(11) and md[5]:
                assert md[11] < md[9], "dictionary page must come before the data pages"
            end = start + md[7]
            chunk = Chunk(".".join(p.decode() for p in md[3]), md[4], md[5], list(md[2]))
            pos = start
            while pos < end:
                hdr, pos = _thrift_struct(data, pos)
                ptype, size = hdr[1], hdr[3]
                if ptype == PAGE_DICTIONARY:
                    dp = hdr[7]
                    page = Page(ptype, dp[1], dp[2], hdr[2], size)
                else:
                    dp = hdr[5]
                    assert dp[3] == ENC_RLE and dp[4] == ENC_RLE, "levels must be RLE"
                    page = Page(ptype, dp[1], dp[2], hdr[2], size)
                chunk.pages.append(page)
                pos += size
            assert pos == end, f"{chunk.path}: pages end at {pos}, chunk at {end}"
            kinds = [p.type for p in chunk.pages]
            assert PAGE_DICTIONARY not in kinds[1:], f"{chunk.path}: dictionary page not first"
            assert all(k == PAGE_DATA_V1 for k in kinds if k != PAGE_DICTIONARY), kinds
            assert sum(p.num_values for p in chunk.data_pages) == chunk.num_values, chunk.path
            used = {p.encoding for p in chunk.pages}
            assert used <= set(chunk.encodings), f"{chunk.path}: {used} not in {chunk.encodings}"
            if any(p.encoding in (ENC_RLE_DICTIONARY, ENC_PLAIN_DICTIONARY) for p in chunk.pages):
                assert kinds[0] == PAGE_DICTIONARY, f"{chunk.path}: dictionary indices, no page"
            chunks.append(chunk)
        out.append(chunks)
    return out


def row_group_sizes(data: bytes) -> list[int]:
    md = pq.read_metadata(pa.BufferReader(data))
    return [md.row_group(i).num_rows for i in range(md.num_row_groups)]


def column_chunks(data: bytes, rg: int = 0) -> dict[str, pq.ColumnChunkMetaData]:
    md = pq.read_metadata(pa.BufferReader(data)).row_group(rg)
    return {md.column(c).path_in_schema: md.column(c) for c in range(md.num_columns)}


def leaf_paths(schema: pa.Schema) -> list[str]:
    paths = []
    for f in schema:
        if pa.types.is_list(f.type):
            base = f"{f.name}.list.element"
            paths += [f"{base}.{c.name}" for c in f.type.value_type]
        else:
            paths.append(f.name)
    return paths


def parquet_schema_text(data: bytes) -> str:
    """The Parquet schema as pyarrow prints it (minus its first line: the object's address)."""
    return str(pq.ParquetFile(pa.BufferReader(data)).schema).split("\n", 1)[1]


# ---------------------------------------------------------------------------------------------
# Expected statistics, from the data


def _physical_values(arr: pa.ChunkedArray | pa.Array) -> list[Any]:
    """Non-null values as Parquet stores them (timestamp[s] as milliseconds, strings as UTF-8)."""
    t = arr.type
    if pa.types.is_timestamp(t):
        ints = arr.cast(pa.int64()).to_pylist()
        scale = 1000 if t.unit == "s" else 1
        return [v * scale for v in ints if v is not None]
    vals = [v for v in arr.cast(_storage_type(t)).to_pylist() if v is not None]
    if pa.types.is_string(t):
        return [v.encode() for v in vals]
    return vals


def _leaf_values(table: pa.Table, path: str) -> pa.ChunkedArray | pa.Array:
    parts = path.split(".")
    col = table.column(parts[0])
    if len(parts) == 1:
        return col
    items = pa.concat_arrays([c.flatten() for c in col.chunks]) if col.num_chunks else None
    if items is None:
        return pa.array([], col.type.value_type.field(parts[-1]).type)
    return pc.struct_field(items, parts[-1])


def check_statistics(
    data: bytes,
    table: pa.Table,
    stats_columns: set[str],
    reference: bytes | None = None,
) -> None:
    """Statistics only for ``stats_columns``; min/max/null count equal to each row group's data
    (byte arrays: bounds at least as wide if any value is long); nested null counts as the
    reference writer counts them. Nested leaves go without statistics (the writer documents
    statistics of flat columns only)."""
    md = pq.read_metadata(pa.BufferReader(data))
    ref = pq.read_metadata(pa.BufferReader(reference)) if reference is not None else None
    start = 0
    for r in range(md.num_row_groups):
        rg = md.row_group(r)
        part = table.slice(start, rg.num_rows)
        start += rg.num_rows
        for c in range(rg.num_columns):
            chunk = rg.column(c)
            path = chunk.path_in_schema
            if path not in stats_columns:
                assert not chunk.is_stats_set, f"rg {r} {path}: statistics not asked for"
                continue
            if rg.num_rows == 0 and not chunk.is_stats_set:
                continue  # an empty row group: no statistics is fine
            if "." in path and not chunk.is_stats_set:
                continue  # nested leaves: none (right when written)
            assert chunk.is_stats_set, f"rg {r} {path}: no statistics"
            s = chunk.statistics
            leaf = _leaf_values(part, path)
            values = _physical_values(leaf)
            if "." not in path:
                assert s.null_count == leaf.null_count, f"rg {r} {path}: null count"
            elif ref is not None:
                want = ref.row_group(r).column(c).statistics.null_count
                assert s.null_count == want, f"rg {r} {path}: null count {s.null_count} != {want}"
            if not values:
                assert not s.has_min_max, f"rg {r} {path}: min/max of no values"
                continue
            lo, hi = min(values), max(values)
            if isinstance(lo, bytes) and max(len(v) for v in values) > 64:
                if s.has_min_max:
                    assert s.min_raw <= lo and s.max_raw >= hi, f"rg {r} {path}: bounds"
                continue
            assert s.has_min_max, f"rg {r} {path}: no min/max"
            assert (s.min_raw, s.max_raw) == (lo, hi), f"rg {r} {path}: min/max"


def expected_row_groups(part_rows: Sequence[int], row_group_size: int | None) -> list[int]:
    sizes: list[int] = []
    for n in part_rows:
        step = row_group_size or max(n, 1)
        sizes += [min(step, n - s) for s in range(0, n, step)]
    return sizes


# ---------------------------------------------------------------------------------------------
# Random tables: the shape is drawn by Hypothesis, the values by a numpy generator it seeds


TS_UNITS = ("s", "ms", "us", "ns")
TIME_ZONES = (None, "UTC", "Asia/Tokyo")
INT_KINDS = ("uniform", "extremes", "small", "constant", "sorted", "runs", "widths")
BYTES_KINDS = ("short", "empty", "few", "long", "unique")
BOOL_KINDS = ("random", "constant", "runs")
NULL_KINDS = ("none", "sparse", "half", "runs", "all")
ALPHABET = np.array(["a", "b", "z", "0", " ", "é", "€", "😀", "\x00", "\n"])


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    type: pa.DataType
    nullable: bool
    values: str
    nulls: str
    children: tuple[ColumnSpec, ...] = ()
    lengths: str = "small"
    element: str = "element"

    @property
    def arrow_type(self) -> pa.DataType:
        if not self.children:
            return self.type
        struct_type = pa.struct([pa.field(c.name, c.type, c.nullable) for c in self.children])
        return pa.list_(pa.field(self.element, struct_type, nullable=False))


def _is_int_like(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_timestamp(t) or pa.types.is_date32(t))


def _kinds(t: pa.DataType) -> tuple[str, ...]:
    if _is_int_like(t):
        return INT_KINDS
    if pa.types.is_boolean(t):
        return BOOL_KINDS
    return BYTES_KINDS


flat_types = st.one_of(
    st.sampled_from(
        [
            pa.int8(),
            pa.int16(),
            pa.int32(),
            pa.int64(),
            pa.bool_(),
            pa.date32(),
            pa.string(),
            pa.binary(),
        ]
    ),
    st.builds(pa.timestamp, st.sampled_from(TS_UNITS), st.sampled_from(TIME_ZONES)),
)


@st.composite
def flat_specs(draw: st.DrawFn, name: str) -> ColumnSpec:
    t = draw(flat_types)
    nullable = draw(st.booleans())
    return ColumnSpec(
        name,
        t,
        nullable,
        draw(st.sampled_from(_kinds(t))),
        draw(st.sampled_from(NULL_KINDS)) if nullable else "none",
    )


@st.composite
def column_specs(draw: st.DrawFn, name: str) -> ColumnSpec:
    if draw(st.integers(0, 3)) > 0:
        return draw(flat_specs(name))
    names = draw(st.lists(st.sampled_from(["key", "value", "x", "y"]), min_size=1, unique=True))
    children = tuple(draw(flat_specs(n)) for n in names)
    nullable = draw(st.booleans())
    return ColumnSpec(
        name,
        pa.null(),
        nullable,
        "",
        draw(st.sampled_from(NULL_KINDS)) if nullable else "none",
        children=children,
        lengths=draw(st.sampled_from(["empty", "small", "mixed", "one"])),
        element="element",  # "item": test_list_items_named_item_are_written_like_pyarrow
    )


def _runs(rng: np.random.Generator, n: int, pool: np.ndarray) -> np.ndarray:
    lengths = rng.geometric(1 / float(rng.choice([2, 9, 40, 400])), size=n + 1)
    idx = np.repeat(rng.integers(0, len(pool), size=len(lengths)), lengths)[:n]
    return np.asarray(pool)[idx]


def _null_mask(rng: np.random.Generator, n: int, kind: str) -> np.ndarray:
    if kind == "sparse":
        return np.asarray(rng.random(n) < 0.05)
    if kind == "half":
        return np.asarray(rng.random(n) < 0.5)
    if kind == "runs":
        return _runs(rng, n, np.array([False, True]))
    if kind == "all":
        return np.ones(n, bool)
    return np.zeros(n, bool)


def _ints(rng: np.random.Generator, n: int, lo: int, hi: int, kind: str) -> np.ndarray:
    uniform = rng.integers(lo, hi, size=n, endpoint=True, dtype=np.int64)
    if kind == "uniform":
        return uniform
    if kind == "extremes":
        return rng.choice(np.array([lo, lo + 1, -1, 0, 1, hi - 1, hi], np.int64), n)
    if kind == "small":
        return rng.integers(max(lo, -3), min(hi, 3), size=n, endpoint=True, dtype=np.int64)
    if kind == "constant":
        return np.full(n, rng.choice(np.array([lo, 0, hi, 7], np.int64)), np.int64)
    if kind == "sorted":
        return np.sort(uniform)
    if kind == "runs":
        return _runs(rng, n, uniform[:4] if n >= 4 else np.array([lo, hi], np.int64))
    # "widths": a random bit width per 32 values, so miniblock widths differ
    bits = int(math.log2(hi + 1))
    widths = np.repeat(rng.integers(0, bits, size=n // 32 + 1), 32)[:n]
    half = np.left_shift(np.int64(1), widths.astype(np.int64))
    return np.clip(rng.integers(-half, half, dtype=np.int64), lo, hi)


def _strings(rng: np.random.Generator, n: int, kind: str, binary: bool) -> list[Any]:
    def one(max_len: int) -> Any:
        k = int(rng.integers(0, max_len + 1))
        if binary:
            return rng.bytes(k)
        return "".join(rng.choice(ALPHABET, k))

    if kind == "empty":
        return [b"" if binary else "" for _ in range(n)]
    if kind == "few":
        pool = [one(6) for _ in range(int(rng.integers(1, 5)))]
        return [pool[i] for i in rng.integers(0, len(pool), size=n)]
    if kind == "long":
        return [one(3000) if rng.random() < 0.1 else one(20) for _ in range(n)]
    if kind == "unique":
        return [(b"%d-" % i + one(6)) if binary else f"{i}-{one(6)}" for i in range(n)]
    return [one(8) for _ in range(n)]


def make_array(spec: ColumnSpec, n: int, rng: np.random.Generator) -> pa.Array:
    mask = _null_mask(rng, n, spec.nulls)
    pa_mask = mask if mask.any() or rng.random() < 0.5 else None
    if spec.children:
        return _make_list(spec, n, rng, mask)
    t = spec.type
    if _is_int_like(t):
        if pa.types.is_timestamp(t):
            lo, hi = (
                (-TS_SECONDS_BOUND, TS_SECONDS_BOUND) if t.unit == "s" else INT_BOUNDS[pa.int64()]
            )
        else:
            lo, hi = INT_BOUNDS[t]
        ints = _ints(rng, n, lo, hi, spec.values)
        if pa.types.is_timestamp(t):
            return pa.array(ints, pa.int64(), mask=pa_mask).cast(t)
        if pa.types.is_date32(t):
            return pa.array(ints.astype(np.int32), pa.int32(), mask=pa_mask).cast(t)
        return pa.array(ints.astype(t.to_pandas_dtype()), t, mask=pa_mask)
    if pa.types.is_boolean(t):
        if spec.values == "constant":
            bools = np.full(n, bool(rng.integers(0, 2)))
        elif spec.values == "runs":
            bools = _runs(rng, n, np.array([False, True]))
        else:
            bools = rng.random(n) < rng.random()
        return pa.array(bools, t, mask=pa_mask)
    values = _strings(rng, n, spec.values, pa.types.is_binary(t))
    return pa.array([None if m else v for v, m in zip(values, mask, strict=True)], t)


def _make_list(spec: ColumnSpec, n: int, rng: np.random.Generator, mask: np.ndarray) -> pa.Array:
    if spec.lengths == "empty":
        lengths = np.zeros(n, np.int64)
    elif spec.lengths == "one":
        lengths = np.ones(n, np.int64)
    elif spec.lengths == "small":
        lengths = rng.integers(0, 4, size=n)
    else:
        lengths = np.where(
            rng.random(n) < 0.05, rng.integers(0, 200, size=n), rng.integers(0, 3, n)
        )
    # a null list may still own child values in Arrow: readers must see null, not the values
    lengths = np.where(mask & (rng.random(n) < 0.5), 0, lengths)
    lead = int(rng.integers(0, 3))  # child values before the first list: offsets start > 0
    offsets = np.concatenate([[0], np.cumsum(lengths)]) + lead
    total = int(offsets[-1])
    children = [make_array(c, total, rng) for c in spec.children]
    fields = [pa.field(c.name, c.type, c.nullable) for c in spec.children]
    items = pa.StructArray.from_arrays(children, fields=fields)
    return pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32()),
        items,
        type=spec.arrow_type,
        mask=pa.array(mask) if mask.any() else None,
    )


@dataclass(frozen=True)
class Case:
    specs: tuple[ColumnSpec, ...]
    rows: int
    seed: int
    skip: int
    splits: tuple[int, ...]
    chunks: int
    row_group_size: int | None
    options: dict[str, Any]

    def schema(self) -> pa.Schema:
        return pa.schema([pa.field(s.name, s.arrow_type, s.nullable) for s in self.specs])

    def tables(self) -> list[pa.Table]:
        """The ``write_table`` arguments: slices of one table (offsets not on byte boundaries),
        each possibly in several chunks."""
        rng = np.random.default_rng(self.seed)
        total = self.rows + self.skip
        arrays = [make_array(s, total, rng) for s in self.specs]
        whole = pa.Table.from_arrays(arrays, schema=self.schema()).slice(self.skip, self.rows)
        bounds = [0, *sorted(min(s, self.rows) for s in self.splits), self.rows]
        out = []
        for a, b in itertools.pairwise(bounds):
            t = whole.slice(a, b - a)
            if self.chunks > 1 and t.num_rows > 1:
                cut = t.num_rows // self.chunks
                t = pa.concat_tables([t.slice(0, cut), t.slice(cut)])
            out.append(t)
        return out


@st.composite
def cases(draw: st.DrawFn) -> Case:
    n_cols = draw(st.integers(1, 5))
    specs = tuple(draw(column_specs(f"c{i}")) for i in range(n_cols))
    rows = draw(st.one_of(st.integers(0, 40), st.integers(300, 2500)))
    schema = pa.schema([pa.field(s.name, s.arrow_type, s.nullable) for s in specs])
    leaves = leaf_paths(schema)
    delta_ok = [
        s.name
        for s in specs
        if not s.children and (s.type in (pa.int32(), pa.int64()) or pa.types.is_timestamp(s.type))
    ]
    encoding: dict[str, str] = {}
    for name in draw(st.lists(st.sampled_from(delta_ok), unique=True)) if delta_ok else []:
        encoding[name] = "DELTA_BINARY_PACKED"
    for name in draw(st.lists(st.sampled_from(leaves), unique=True, max_size=2)):
        encoding.setdefault(name, "PLAIN")
    others = [p for p in leaves if p not in encoding]
    if encoding:
        use_dictionary: Any = draw(st.lists(st.sampled_from(others), unique=True)) if others else []
    else:
        use_dictionary = draw(st.booleans() | st.lists(st.sampled_from(leaves), unique=True))
    # Named statistics: flat columns only (a nested leaf named there is refused, see below).
    flat = [p for p in leaves if "." not in p]
    named = st.lists(st.sampled_from(flat), unique=True) if flat else st.just([])
    write_statistics: Any = draw(st.booleans() | named)
    compression = draw(st.sampled_from(["snappy", "none", "zstd", "lz4"]))
    level = draw(st.none() | st.integers(1, 9)) if compression == "zstd" else None
    rgs = draw(st.none() | st.integers(1, rows + 2))
    if rgs is not None:
        rgs = max(rgs, math.ceil(rows / 40))  # a few dozen row groups at most: keep it fast
    options = {
        "compression": compression,
        "compression_level": level,
        "use_dictionary": use_dictionary,
        "write_statistics": write_statistics,
        "column_encoding": encoding or None,
        "data_page_size": draw(st.sampled_from([1 << 20]) | st.integers(64, 4096)),
    }
    return Case(
        specs=specs,
        rows=rows,
        seed=draw(st.integers(0, 2**32 - 1)),
        skip=draw(st.integers(0, 9)),
        splits=tuple(draw(st.lists(st.integers(0, rows), max_size=2))),
        chunks=draw(st.integers(1, 3)),
        row_group_size=rgs,
        options=options,
    )


def _selected(option: Any, leaves: list[str]) -> set[str]:
    if option is True:
        return set(leaves)
    if not option:
        return set()
    return set(option)


def check_file(
    data: bytes,
    parts: Sequence[pa.Table],
    schema: pa.Schema,
    row_group_size: int | None,
    options: dict[str, Any],
) -> None:
    """Everything a correct file of ``parts`` written with ``options`` satisfies."""
    expected = pa.concat_tables(parts).combine_chunks() if parts else schema.empty_table()
    reference = _write_reference(parts, schema, row_group_size, **options)
    assert_round_trips(data, expected)
    assert_same_table(_read_pyarrow(reference), expected, "pyarrow, reference file")
    assert parquet_schema_text(data) == parquet_schema_text(reference)
    assert pq.read_metadata(pa.BufferReader(data)).num_rows == expected.num_rows

    sizes = row_group_sizes(data)
    assert [s for s in sizes if s] == expected_row_groups(
        [t.num_rows for t in parts], row_group_size
    )
    # the same leaves and level counts (values, nulls, empty lists) in every row group
    ref_sizes = row_group_sizes(reference)
    fast_groups = [rg for rg, n in zip(chunks_of(data), sizes, strict=True) if n]
    ref_groups = [rg for rg, n in zip(chunks_of(reference), ref_sizes, strict=True) if n]
    for rg, ref_rg in zip(fast_groups, ref_groups, strict=True):
        assert [(c.path, c.num_values) for c in rg] == [(c.path, c.num_values) for c in ref_rg]

    leaves = leaf_paths(schema)
    dictionary = _selected(options.get("use_dictionary", False), leaves)
    encoding = options.get("column_encoding") or {}
    page_size = options.get("data_page_size", 1 << 20)
    codec = CODECS[options.get("compression", "snappy")]
    for rg_index, rg in enumerate(chunks_of(data)):
        start = sum(sizes[:rg_index])
        part = expected.slice(start, sizes[rg_index])
        for chunk in rg:
            assert chunk.codec == codec, f"{chunk.path}: codec {chunk.codec} != {codec}"
            data_encodings = {p.encoding for p in chunk.data_pages}
            uses_dictionary = data_encodings & {ENC_RLE_DICTIONARY, ENC_PLAIN_DICTIONARY}
            if chunk.path not in dictionary:
                assert not uses_dictionary, f"{chunk.path}: dictionary not asked for"
                assert all(p.type != PAGE_DICTIONARY for p in chunk.pages), chunk.path
            non_null = len(_physical_values(_leaf_values(part, chunk.path)))
            if encoding.get(chunk.path) == "DELTA_BINARY_PACKED" and non_null:
                assert data_encodings == {ENC_DELTA_BINARY_PACKED}, (chunk.path, data_encodings)
            if encoding.get(chunk.path) == "PLAIN" and non_null:
                assert data_encodings == {ENC_PLAIN}, (chunk.path, data_encodings)
            # pages of about data_page_size (checked where a page split is always possible:
            # plain values of a flat column)
            uncompressed = sum(p.uncompressed for p in chunk.data_pages)
            plain = data_encodings == {ENC_PLAIN} and "." not in chunk.path
            if plain and uncompressed > 16 * page_size and chunk.num_values >= 2048:
                assert len(chunk.data_pages) > 1, f"{chunk.path}: {uncompressed} B in one page"
    check_statistics(
        data, expected, _selected(options.get("write_statistics", False), leaves), reference
    )


@SETTINGS
@given(cases())
def test_random_tables_read_back_exactly(case: Case) -> None:
    schema = case.schema()
    assert fast_writer_supports(schema)
    parts = case.tables()
    data = _write_fast(parts, schema, case.row_group_size, **case.options)
    check_file(data, parts, schema, case.row_group_size, case.options)


# ---------------------------------------------------------------------------------------------
# DELTA_BINARY_PACKED


def _delta_options(*names: str, page: int = 1 << 20) -> dict[str, Any]:
    return {
        "compression": "none",
        "column_encoding": dict.fromkeys(names, "DELTA_BINARY_PACKED"),
        "write_statistics": True,
        "data_page_size": page,
    }


@pytest.mark.parametrize(
    ("type_", "values"),
    [
        (pa.int64(), [2**63 - 1, -(2**63), 0, 2**63 - 1, -1, -(2**63), 1, 2**62, -(2**62)]),
        (pa.int64(), [-(2**63), 2**63 - 1] * 40),
        (pa.int64(), [0, 2**63 - 1, 2**63 - 1, 2**63 - 2, -(2**63)] + [5] * 70),
        (pa.int32(), [2**31 - 1, -(2**31), 0, 2**31 - 1, -1, -(2**31), 1]),
        (pa.int32(), [-(2**31), 2**31 - 1] * 40),
        (pa.timestamp("us", tz="UTC"), [2**63 - 1, -(2**63), -1, 0, 1_700_000_000_000_000]),
        (pa.timestamp("ns"), [-(2**63), 2**63 - 1, -1_000_000_000_000_000_000]),
        (pa.int16(), [2**15 - 1, -(2**15), 0, 7]),
        (pa.int8(), [127, -128, 0, -1, 127]),
    ],
)
def test_delta_binary_packed_with_overflowing_deltas(type_: pa.DataType, values: list[int]) -> None:
    storage = pa.int64() if pa.types.is_timestamp(type_) else type_
    for nullable in (False, True):
        if nullable:  # nulls between the values: deltas across them
            arr = pa.array([v for x in values for v in (None, x)], storage).cast(type_)
        else:
            arr = pa.array(values, storage).cast(type_)
        table = pa.table({"v": arr}, schema=pa.schema([pa.field("v", type_, nullable)]))
        for page in (1 << 20, 64):
            options = _delta_options("v", page=page)
            data = _write_fast([table], **options)
            check_file(data, [table], table.schema, None, options)
            assert "DELTA_BINARY_PACKED" in column_chunks(data)["v"].encodings


@pytest.mark.parametrize("count", [0, 1, 2, 3, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 1000])
def test_delta_binary_packed_around_block_and_miniblock_boundaries(count: int) -> None:
    rng = np.random.default_rng(count)
    i = np.arange(count, dtype=np.int64)
    patterns: dict[str, np.ndarray] = {
        "increasing": 1_000 + i,
        "constant": np.full(count, -7, np.int64),
        "decreasing": 10**12 - 3 * i,
        "random": rng.integers(-(2**40), 2**40, size=count),
        "full-range": rng.integers(-(2**63), 2**63 - 1, size=count, endpoint=True),
        "one-jump": np.where(i == count // 2, 2**62, i),
        "widths": i * (1 << (i % 33)),
    }
    for pattern, values in patterns.items():
        cols = {
            "i64": pa.array(values, pa.int64()),
            "i32": pa.array(np.clip(values, -(2**31), 2**31 - 1).astype(np.int32), pa.int32()),
            "ts": pa.array(values, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            "n64": pa.array(values, pa.int64(), mask=(i % 3 == 1) if count else None),
        }
        table = pa.table(cols)
        for page in (1 << 20, 100):
            options = _delta_options(*cols, page=page)
            data = _write_fast([table], **options)
            try:
                check_file(data, [table], table.schema, None, options)
            except AssertionError as e:
                raise AssertionError(f"{pattern}, {count} values, page {page}: {e}") from e


@pytest.mark.parametrize("count", [1, 2, 3, 33, 129, 257])
def test_delta_binary_packed_stays_within_its_bound(count: int) -> None:
    # The last block's miniblocks are padded to 32 values: full-width deltas in a short
    # column take far more than 9 bytes a value. The kernel writes into a buffer of exactly
    # the bound, behind a guard region that must stay untouched.
    values = np.random.default_rng(count).integers(-(2**63), 2**63 - 1, count, endpoint=True)
    for width in (64, 32):
        wide = values if width == 64 else values.astype(np.int32).astype(np.int64)
        bound = kernels.delta_binary_packed_bound(count)
        out = np.full(bound + 64, 0xAB, np.uint8)
        end = kernels.delta_binary_packed(wide, width, out, 0)
        assert 0 < end <= bound
        assert (out[bound:] == 0xAB).all()


# ---------------------------------------------------------------------------------------------
# Dictionary encoding, levels and nulls


@pytest.mark.parametrize("distinct", [1, 2, 3, 4, 5, 8, 9, 16, 17, 255, 256, 257, 1000, 5000])
def test_dictionary_columns_with_any_number_of_distinct_values(distinct: int) -> None:
    n = max(3 * distinct, 600)
    rng = np.random.default_rng(distinct)
    i = np.arange(n)
    patterns = {
        "cycling": i % distinct,
        "alternating-runs": (i // 7) % distinct,
        "random": rng.integers(0, distinct, n),
    }
    for pattern, idx in patterns.items():
        table = pa.table(
            {
                "s": pa.array([f"v{k}é" for k in idx]),
                "b": pa.array([b"\xff%d" % k for k in idx], pa.binary()),
                "i32": pa.array(idx.astype(np.int32) - 5),
                "i64": pa.array(idx * -(2**40), pa.int64()),
                "i16": pa.array(idx.astype(np.int16), pa.int16()),
                "ts": pa.array(idx * 1_000 - 10**9, pa.int64()).cast(pa.timestamp("ms")),
                "d": pa.array(idx.astype(np.int32), pa.int32()).cast(pa.date32()),
                "ns": pa.array([None if k % 5 == 0 else f"x{k}" for k in idx], pa.string()),
            }
        )
        for page in (1 << 20, 128):
            options = {
                "compression": "snappy",
                "use_dictionary": True,
                "write_statistics": True,
                "data_page_size": page,
            }
            data = _write_fast([table], row_group_size=n // 2 + 1, **options)
            try:
                check_file(data, [table], table.schema, n // 2 + 1, options)
            except AssertionError as e:
                raise AssertionError(f"{pattern}, page {page}: {e}") from e
            for rg in chunks_of(data):
                for chunk in rg:
                    assert chunk.pages[0].type == PAGE_DICTIONARY, (pattern, chunk.path)
                    assert {p.encoding for p in chunk.data_pages} == {ENC_RLE_DICTIONARY}
            assert "RLE_DICTIONARY" in column_chunks(data)["s"].encodings


@pytest.mark.parametrize(
    ("values", "distinct"),
    [
        (["lz4"] * 1000, 1),  # one label per decoded chunk: the whole-buffer check
        ([""] * 1000, 1),  # zero width
        (["abc"] * 500 + ["abd"] + ["abc"] * 499, 2),  # same width, one byte differs
        (["abd"] + ["abc"] * 999, 2),  # the first row differs
        (["ab"] * 500 + ["abc"] + ["ab"] * 499, 2),  # one width differs
        (["ab", "c"] * 500, 2),  # widths differ, bytes end-to-end equal "abc" repeated
    ],
)
def test_dictionary_of_equal_and_nearly_equal_byte_arrays(values: list[str], distinct: int) -> None:
    """A column of one repeated value takes the whole-buffer check, not the run kernel: a
    value that differs anywhere (width or one byte, first row or middle) must still start a
    run; sliced and chunked inputs are checked from their offsets."""
    full = pa.array(["zz", *values, "zz"])  # sliced below: offsets start past 0
    chunked = pa.chunked_array([full.slice(1, 400), full.slice(401, len(values) - 400)])
    for column in (full.slice(1, len(values)), chunked):
        table = pa.table({"s": column})
        options: dict[str, Any] = {
            "compression": "none",
            "use_dictionary": True,
            "write_statistics": True,
        }
        data = _write_fast([table], **options)
        check_file(data, [table], table.schema, None, options)
        chunk = chunks_of(data)[0][0]
        assert chunk.pages[0].type == PAGE_DICTIONARY
        assert chunk.pages[0].num_values == distinct


def test_dictionary_over_its_page_limit_reads_back() -> None:
    """A chunk whose dictionary would pass 1 MiB (pyarrow's limit) falls back or not, but reads
    back; a small chunk of the same file keeps its dictionary."""
    n = 12_000
    big = [f"{k:08d}" + "v" * 92 for k in range(n)]  # 1.2 MB of distinct values
    table = pa.table(
        {
            "s": pa.array(big + ["a", "b"] * 50),
            "i": pa.array(list(range(n)) + [1, 2] * 50, pa.int64()),
        }
    )
    options = {"compression": "snappy", "use_dictionary": True, "data_page_size": 8192}
    data = _write_fast([table], row_group_size=n, **options)
    check_file(data, [table], table.schema, n, options)
    small = {c.path: c for c in chunks_of(data)[1]}
    assert {p.encoding for p in small["s"].data_pages} == {ENC_RLE_DICTIONARY}


def _fixed_bits(arr: pa.Array) -> np.ndarray:
    """Every row's value as the ints the writer hashes (floats as their bits; nulls' slots
    included), from the array's offset."""
    width = arr.type.bit_width // 8
    ints = np.int32 if width == 4 else np.int64
    return np.frombuffer(arr.buffers()[1], ints, len(arr), arr.offset * width)


@pytest.mark.parametrize(
    "values",
    [
        pa.array([], pa.int64()),
        pa.array([None, None], pa.int32()),
        pa.array([3, None, 3, -(2**63), None, 2**63 - 1, 3], pa.int64()),
        pa.array(np.arange(5000) % 1234 * 7919, pa.int64()).slice(17, 4000),  # grows, sliced
        pa.array([0.0, -0.0, math.nan, None, 0.0, math.inf, -0.0], pa.float64()),
        pa.array([1.5, None, -0.0, 0.0, 1.5], pa.float32()),
        pa.array(np.array([5, 7, 7, 9]), pa.int32(), mask=np.array([False, True, False, False])),
    ],
)
def test_dictionary_kernel_matches_pyarrows_dictionary_encode(values: pa.Array) -> None:
    """``dictionary_fixed``: the entries (first-appearance order, floats by their bits) and
    every present row's index are ``pc.dictionary_encode``'s; nulls get index 0."""
    bits = _fixed_bits(values)
    valid = np.array(values.is_valid(), np.uint8) if values.null_count else np.empty(0, np.uint8)
    n = len(values)
    keys, index = np.empty(n, bits.dtype), np.full(n, -1, np.int32)
    firsts = np.empty(max(n, 1), np.int64)
    count = kernels.dictionary_fixed(bits, valid, keys, index, firsts)
    encoded = pc.dictionary_encode(values)
    assert count == len(encoded.dictionary)
    assert _fixed_bits(encoded.dictionary).tolist() == keys[:count].tolist()
    assert bits[firsts[:count]].tolist() == keys[:count].tolist()
    expected = [0 if i is None else i for i in encoded.indices.to_pylist()]
    assert index.tolist() == expected


def test_dictionary_kernel_gives_up_past_its_entries() -> None:
    """-1 as soon as a value would be entry ``len(keys) + 1`` (the page limit), not before."""
    values = np.array([4, 1, 4, 2, 1, 3, 2], np.int64)  # 4 distinct
    index, firsts = np.empty(7, np.int32), np.empty(7, np.int64)
    for room, count in ((4, 4), (3, -1), (0, -1)):
        keys = np.empty(room, np.int64)
        assert kernels.dictionary_fixed(values, _NO_NULLS, keys, index, firsts) == count
    keys = np.empty(0, np.int64)
    assert kernels.dictionary_fixed(values[:0], _NO_NULLS, keys, index, firsts) == 0


_NO_NULLS = np.empty(0, np.uint8)


@pytest.mark.parametrize("distinct", [127, 128, 129])
def test_fixed_dictionary_at_its_page_limit(distinct: int) -> None:
    """1024 bytes of dictionary page: 128 distinct int64 keep the dictionary, 129 fall back to
    PLAIN; with nulls, in a sliced column, reading back equal either way."""
    values = [None if k % 9 == 0 else k % distinct for k in range(3 * distinct + 40)]
    table = pa.table({"i": pa.array(values, pa.int64()).slice(3)})
    options = {"compression": "none", "use_dictionary": True, "write_statistics": True,
               "dictionary_pagesize_limit": 1024}  # fmt: skip
    data = _write_fast([table], **options)
    check_file(data, [table], table.schema, None, options)
    present = len({v for v in table.column("i").to_pylist() if v is not None})
    chunk = chunks_of(data)[0][0]
    if present * 8 <= 1024:
        assert chunk.pages[0].type == PAGE_DICTIONARY and chunk.pages[0].num_values == present
    else:
        assert {p.encoding for p in chunk.data_pages} == {ENC_PLAIN}


@pytest.mark.parametrize(
    "values",
    [
        pa.array([5, None, 0], pa.int64()),
        pa.array([None, 0], pa.int32()),
        pa.array([None, 0, 1], pa.int16()),
        pa.array([7, None, None, 0, 0, 7], pa.int8()),
        pa.array(["a", None, ""]),
        pa.array([None, "", "x"]),
        pa.array([b"a", None, b""], pa.binary()),
        pa.array([None, 0], pa.timestamp("us", tz="UTC")),
        pa.array([None, 0], pa.date32()),
        # a null slot hiding a value equal to the next (Arrow leaves values under nulls as is)
        pa.array(np.array([5, 7, 7, 9]), pa.int64(), mask=np.array([False, True, False, False])),
    ],
)
def test_dictionary_values_next_to_nulls(values: pa.Array) -> None:
    """A null's slot holds some value (0, "" or anything): it must not merge into the run of the
    equal value next to it."""
    table = pa.table({"v": values})
    for rgs in (None, 2):
        options = {"compression": "none", "use_dictionary": True, "write_statistics": True}
        data = _write_fast([table], row_group_size=rgs, **options)
        check_file(data, [table], table.schema, rgs, options)


@pytest.mark.parametrize("dictionary", [False, True])
def test_null_patterns_long_runs_and_all_null(dictionary: bool) -> None:
    n = 5_000
    i = np.arange(n)
    masks = {
        "all": np.ones(n, bool),
        "none": np.zeros(n, bool),
        "long-runs": (i // 1_000) % 2 == 0,
        "first-only": i == 0,
        "last-only": i == n - 1,
        "alternating": i % 2 == 0,
        "one-valued-run": (i < 1_000) | (i > 1_001),
    }
    for name, mask in masks.items():
        table = pa.table(
            {
                "i64": pa.array(i, pa.int64(), mask=mask),
                "i8": pa.array((i % 100).astype(np.int8), pa.int8(), mask=mask),
                "b": pa.array(i % 3 == 0, mask=mask),
                "s": pa.array(
                    [None if m else str(k % 7) for k, m in zip(i, mask, strict=True)], pa.string()
                ),
                "ts": pa.array(i, pa.int64(), mask=mask).cast(pa.timestamp("us", tz="UTC")),
                "d": pa.array(i.astype(np.int32), pa.int32(), mask=mask).cast(pa.date32()),
            }
        )
        for page in (1 << 20, 256):
            options = {
                "compression": "zstd",
                "use_dictionary": dictionary,
                "write_statistics": True,
                "data_page_size": page,
            }
            data = _write_fast([table], row_group_size=2_000, **options)
            try:
                check_file(data, [table], table.schema, 2_000, options)
            except AssertionError as e:
                raise AssertionError(f"{name}, page {page}: {e}") from e
    # the all-null column: null count n, no min/max
    table = pa.table({"x": pa.nulls(n, pa.int64())})
    data = _write_fast([table], write_statistics=True, use_dictionary=dictionary)
    s = column_chunks(data)["x"].statistics
    assert s.null_count == n and not s.has_min_max
    assert_round_trips(data, table)


def _decode_hybrid(data: bytes, width: int, count: int) -> list[int]:
    """RLE / bit-packing hybrid, decoded from the format's description (LSB-first bits)."""
    out: list[int] = []
    pos = 0
    nbytes = (width + 7) // 8
    while len(out) < count:
        header, pos = _varint(data, pos)
        if header & 1:  # bit-packed: (header >> 1) groups of 8 values
            groups = header >> 1
            bits = int.from_bytes(data[pos : pos + groups * width], "little")
            out += [(bits >> (j * width)) & ((1 << width) - 1) for j in range(groups * 8)]
            pos += groups * width
        else:
            out += [int.from_bytes(data[pos : pos + nbytes], "little")] * (header >> 1)
            pos += nbytes
    return out[:count]


@pytest.mark.parametrize("width", [1, 2, 3, 7, 8, 9, 13, 17, 32])
def test_hybrid_encoder_against_a_reference_decoder(width: int) -> None:
    """The encoder behind levels and dictionary indices, both packing paths (a group of 8 in
    one register up to 8 bits wide, bit by bit above), partial last groups included."""
    from pipelines.delta import _parquet_kernels as kernels

    rng = np.random.default_rng(width)
    top = (1 << width) - 1
    for n in (1, 7, 8, 9, 15, 16, 17, 100, 1001):
        patterns = [
            rng.integers(0, top, n, endpoint=True),
            np.where(np.arange(n) % 10 == 9, top, 0),  # a blip every 10th value
            np.repeat(rng.integers(0, top, n // 5 + 1, endpoint=True), 5)[:n],
        ]
        dtypes = (np.int64, np.uint8) if width <= 8 else (np.int64,)  # indices, levels
        for values, dtype in itertools.product(patterns, dtypes):
            typed = values.astype(dtype)
            out = np.full(16 + n * 8, 0xA5, np.uint8)  # every byte written must be set
            end = kernels.rle_hybrid(typed, width, out, 0)
            assert _decode_hybrid(out[:end].tobytes(), width, n) == values.tolist(), (n, values)


def test_long_runs_and_wide_dictionary_indices() -> None:
    """Run lengths beyond two varint bytes (levels, dictionary indices, delta blocks) and
    dictionary indices 17 bits wide."""
    n = 300_000
    i = np.arange(n)
    table = pa.table(
        {
            "const": pa.array(np.full(n, 42, np.int32)),
            "nulls": pa.array(np.zeros(n, np.int64), mask=i < n - 3),
            "flag": pa.array(np.ones(n, bool)),
            "wide": pa.array((i % 70_000).astype(np.int32)),
            "delta": pa.array(np.full(n, -(2**40)), pa.int64()),
            "codec": pa.array(["lz4"] * n),
        }
    )
    options: dict[str, Any] = {
        "compression": "snappy",
        "use_dictionary": ["const", "wide", "codec", "nulls"],
        "column_encoding": {"delta": "DELTA_BINARY_PACKED"},
        "write_statistics": True,
    }
    data = _write_fast([table], **options)
    check_file(data, [table], table.schema, None, options)
    for path in ("const", "wide", "codec"):
        assert "RLE_DICTIONARY" in column_chunks(data)[path].encodings, path


def test_booleans_across_byte_and_page_boundaries() -> None:
    for n in (1, 7, 8, 9, 15, 16, 17, 1_001, 4_099):
        rng = np.random.default_rng(n)
        values = rng.random(n) < 0.5
        table = pa.table(
            {
                "b": pa.array(values),
                "nb": pa.array(values, mask=rng.random(n) < 0.3),
                "t": pa.array(np.ones(n, bool)),
            }
        )
        for page in (64, 1 << 20):
            options = {"compression": "none", "write_statistics": True, "data_page_size": page}
            for rgs in (None, 5):
                data = _write_fast([table], row_group_size=rgs, **options)
                check_file(data, [table], table.schema, rgs, options)


# ---------------------------------------------------------------------------------------------
# Pages, row groups, several calls, input layouts


def test_tiny_data_pages_split_columns_into_many_pages() -> None:
    n = 10_000
    i = np.arange(n)
    table = pa.table(
        {
            "i64": pa.array(i * 7_919, pa.int64()),
            "s": pa.array([f"row-{k:06d}" for k in i]),
            "long": pa.array(["x" * (k % 300) for k in i]),
            "h": pa.array(
                [[{"key": "k", "value": b"v" * (k % 5)}] * (k % 3) for k in i],
                STORED_RECORDS_SCHEMA.field("headers").type,
            ),
        }
    )
    options: dict[str, Any] = {"compression": "snappy", "data_page_size": 1024}
    data = _write_fast([table], **options)
    check_file(data, [table], table.schema, None, options)
    chunks = {c.path: c for c in chunks_of(data)[0]}
    assert len(chunks["i64"].data_pages) >= 40  # 80,000 B of values in pages of ~1 KiB
    assert max(p.uncompressed for p in chunks["i64"].data_pages) <= 4 * 1024
    assert len(chunks["s"].data_pages) >= 40
    assert len(chunks["long"].data_pages) >= 100
    assert len(chunks["h.list.element.key"].data_pages) > 5
    # one value larger than a page still reads back
    big = pa.table({"s": ["y" * 10_000, "", "z" * 5_000, None]})
    data = _write_fast([big], data_page_size=64, compression="none")
    check_file(data, [big], big.schema, None, {"compression": "none", "data_page_size": 64})


def test_several_write_table_calls_read_back_as_their_concatenation() -> None:
    records = _stored_records(1_000)
    parts = [records.slice(0, 333), records.slice(333, 1), records.slice(334, 0)]
    parts += [records.slice(334, 666)]
    options = {"compression": "snappy", **_records_options(), "data_page_size": 512}
    for rgs in (None, 100, 1_000):
        data = _write_fast(parts, STORED_RECORDS_SCHEMA, rgs, **options)
        check_file(data, parts, STORED_RECORDS_SCHEMA, rgs, options)
        expected = expected_row_groups([t.num_rows for t in parts], rgs)
        assert [s for s in row_group_sizes(data) if s] == expected
        if rgs == 100:
            assert expected == [100, 100, 100, 33, 1] + [100] * 6 + [66]


def test_row_group_counts_are_ceil_rows_over_row_group_size() -> None:
    table = pa.table({"v": pa.array(range(1_000), pa.int64()), "s": ["a"] * 1_000})
    for rgs in (1, 7, 100, 999, 1_000, 1_001, 10_000):
        data = _write_fast([table], row_group_size=rgs)
        md = pq.read_metadata(pa.BufferReader(data))
        assert md.num_rows == 1_000
        assert md.num_row_groups == math.ceil(1_000 / rgs), rgs
        assert row_group_sizes(data) == expected_row_groups([1_000], rgs)
        assert_round_trips(data, table)


def test_sliced_and_chunked_inputs_are_written_from_their_offsets() -> None:
    stored = _stored_records(300)
    for start, length in ((0, 300), (1, 298), (3, 5), (7, 293), (9, 0), (150, 17)):
        sliced = stored.slice(start, length)
        rechunked = pa.concat_tables([sliced.slice(0, length // 3), sliced.slice(length // 3)])
        for t in (sliced, rechunked):
            options = {"compression": "none", **_records_options(), "data_page_size": 200}
            data = _write_fast([t], STORED_RECORDS_SCHEMA, 50, **options)
            check_file(data, [t], STORED_RECORDS_SCHEMA, 50, options)


def test_empty_table() -> None:
    table = STORED_RECORDS_SCHEMA.empty_table()
    data = _write_fast([table], STORED_RECORDS_SCHEMA, write_statistics=True)
    got = _read_pyarrow(data)
    assert got.num_rows == 0 and got.schema.equals(STORED_RECORDS_SCHEMA)
    assert _read_polars(data).num_rows == 0
    assert parquet_schema_text(data) == parquet_schema_text(_write_reference([table]))
    # no write_table call at all: still a valid file of the schema
    data = _write_fast([], STORED_RECORDS_SCHEMA)
    assert _read_pyarrow(data).schema.equals(STORED_RECORDS_SCHEMA)


def test_where_may_be_a_path_an_os_file_or_a_buffer(tmp_path: Path) -> None:
    table = _stored_records(500)
    options = {"compression": "snappy", **_records_options()}
    in_memory = _write_fast([table], STORED_RECORDS_SCHEMA, 200, **options)
    as_str = _write_fast([table], STORED_RECORDS_SCHEMA, 200, where=str(tmp_path / "a"), **options)
    with pa.OSFile(str(tmp_path / "b"), "wb") as f:
        _write_fast([table], STORED_RECORDS_SCHEMA, 200, where=f, **options)
    as_os_file = (tmp_path / "b").read_bytes()
    assert as_str == in_memory == as_os_file
    assert_same_table(pq.read_table(tmp_path / "a"), table, "pyarrow from a path")
    check_file(in_memory, [table], STORED_RECORDS_SCHEMA, 200, options)


@pytest.mark.parametrize(
    ("compression", "level"),
    [("none", None), ("snappy", None), ("zstd", None), ("zstd", 1), ("zstd", 9), ("lz4", None)],
)
def test_compression_codecs_are_recorded_and_decoded(compression: str, level: int | None) -> None:
    table = _stored_records(800)
    options = {"compression": compression, "compression_level": level, **_records_options()}
    data = _write_fast([table], STORED_RECORDS_SCHEMA, 300, **options)
    check_file(data, [table], STORED_RECORDS_SCHEMA, 300, options)
    for rg in chunks_of(data):
        assert {c.codec for c in rg} == {CODECS[compression]}
    ref = column_chunks(_write_reference([table], compression=compression))
    assert column_chunks(data)["offset"].compression == ref["offset"].compression


@pytest.mark.parametrize("n", [0, 1, 59, 60, 61, 256, 257, 65_536, 65_537, (1 << 24) + 3])
def test_a_stored_snappy_stream_is_decoded_by_arrow_and_cramjam(n: int) -> None:
    """One literal of ``n`` bytes, around every width of the literal's length (0-4 bytes)."""
    body = np.frombuffer(np.random.default_rng(n).bytes(n), np.uint8)
    out = np.empty(n + 10, np.uint8)
    stream = out[: snappy_stored(body, out)].tobytes()
    assert len(stream) <= n + 10
    got = pa.Codec("snappy").decompress(stream, decompressed_size=n).to_pybytes()
    assert got == body.tobytes()
    assert bytes(cramjam.snappy.decompress_raw(stream)) == body.tobytes()


def test_a_body_past_4_gib_has_no_stored_snappy_form() -> None:
    body = np.broadcast_to(np.zeros(1, np.uint8), ((1 << 32) + 1,))  # no memory behind it
    with pytest.raises(ValueError, match="at most 4 GiB"):
        snappy_stored(body, np.empty(16, np.uint8))


def _random_then_repeated(n: int) -> pa.Table:
    """``r`` random 64-byte values then ``n - r`` repeated ones (``r = n // 2``), a
    compressible column beside them, and nulls."""
    rng = np.random.default_rng(5)
    half = n // 2
    values = [None if k % 13 == 0 else rng.bytes(64) for k in range(half)]
    values += [None if k % 13 == 0 else b"abcdefgh" * 8 for k in range(half, n)]
    text = [f"row {k % 7} of a very repetitive column" for k in range(n)]
    return pa.table({"v": pa.array(values, pa.binary()), "t": pa.array(text)})


def test_incompressible_snappy_pages_are_stored_and_compressible_ones_compressed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Random values: after a page that snappy could not shrink, the column's pages are stored
    (a literal, no compression: counted at cramjam's compressor, which still does the work)
    but for one page in _SNAPPY_PROBE_EVERY; once the values repeat, the next probe compresses
    again and the rest stay compressed. The file reads back exactly (pyarrow, polars); the
    repetitive column is compressed throughout."""
    calls = []
    real = cramjam.snappy

    def compress_raw_into(body: Any, out: Any) -> int:
        calls.append(len(body))
        return int(real.compress_raw_into(body, out))

    monkeypatch.setattr(
        parquet_module,
        "cramjam",
        SimpleNamespace(
            snappy=SimpleNamespace(
                compress_raw_max_len=real.compress_raw_max_len,
                compress_raw_into=compress_raw_into,
            )
        ),
    )
    table = _random_then_repeated(4_000)
    data = _write_fast([table], compression="snappy", data_page_size=2_048)
    assert_round_trips(data, table)
    ((v, t),) = chunks_of(data)
    assert {v.codec, t.codec} == {CODECS["snappy"]}
    ends = np.cumsum([p.num_values for p in v.data_pages])
    random = [p for p, end in zip(v.data_pages, ends, strict=True) if end <= 2_000]
    repeated = [p for p, end in zip(v.data_pages, ends, strict=True) if end - p.num_values >= 2_000]
    assert len(random) >= 40 and len(repeated) >= 40
    assert all(p.compressed > 0.9 * p.uncompressed for p in random)
    # stored until the next probe (at most 7 pages on), compressed from there
    late = next(i for i, p in enumerate(repeated) if p.compressed < p.uncompressed // 4)
    assert late < 8
    assert all(p.compressed < p.uncompressed // 4 for p in repeated[late:])
    assert all(p.compressed < p.uncompressed // 2 for p in t.data_pages)
    # every page of t and of the repeated half compressed, one in 8 of the random half (+1:
    # the probe that finds the values repeating again may fall on either side)
    straddling = len(v.data_pages) - len(random) - len(repeated)
    expected = len(t.data_pages) + len(repeated) - late + straddling + -(-len(random) // 8)
    assert expected - 1 <= len(calls) <= expected + 1, (len(calls), expected)
    assert len(calls) < len(t.data_pages) + len(v.data_pages) - 30


@pytest.mark.parametrize("compression", ["SNAPPY", "Zstd", "NONE", "LZ4", None])
def test_compression_names_are_taken_as_pyarrow_takes_them(compression: str | None) -> None:
    """Codec names in any case, and None for no compression, as ``pq.ParquetWriter``."""
    table = pa.table({"a": pa.array([1, 2, 3], pa.int64()), "s": ["x", None, "z"]})
    data = _write_fast([table], compression=compression)
    reference = _write_reference([table], compression=compression)
    assert [c.codec for c in chunks_of(data)[0]] == [c.codec for c in chunks_of(reference)[0]]
    assert_round_trips(data, table)


def test_timestamp_seconds_that_overflow_milliseconds_are_refused() -> None:
    """timestamp[s] is stored in milliseconds: a value beyond int64 milliseconds must raise
    (as pyarrow's writer does), not be written wrapped around."""
    table = pa.table({"t": pa.array([0, 2**62], pa.int64()).cast(pa.timestamp("s"))})
    with pytest.raises(pa.ArrowInvalid):
        _write_reference([table])
    with pytest.raises(Exception):  # noqa: B017 - any error: not silently corrupted
        _write_fast([table])


# ---------------------------------------------------------------------------------------------
# Statistics and schema


def test_statistics_hold_exact_min_max_and_null_counts_only_where_asked() -> None:
    table = pa.table(
        {
            "i8": pa.array([-128, 5, None, 127], pa.int8()),
            "i16": pa.array([3, -32768, 32767, 0], pa.int16()),
            "i32": pa.array([None, -(2**31), 2**31 - 1, None], pa.int32()),
            "i64": pa.array([-(2**63), 2**63 - 1, 0, None], pa.int64()),
            "b": pa.array([True, None, True, True]),
            "ts": pa.array([-(2**63) + 1, None, -5, 2**62], pa.int64()).cast(pa.timestamp("ns")),
            "tss": pa.array([-86_400, 3, None, 7], pa.int64()).cast(pa.timestamp("s", "UTC")),
            "d": pa.array([-(2**31), 0, 2**31 - 1, None], pa.int32()).cast(pa.date32()),
            # unsigned byte order: "é" (0xC3..) sorts after "z"; 0xFF after everything
            "s": pa.array(["z", "é", "", None]),
            "bin": pa.array([b"\xff", b"\x00", b"a", b"\x00\x00"], pa.binary()),
            "none": pa.nulls(4, pa.int32()),
            "off": pa.array([1, 2, 3, 4], pa.int64()),
        }
    )
    asked = [c for c in table.column_names if c != "off"]
    data = _write_fast([table], write_statistics=asked)
    check_statistics(data, table, set(asked))
    chunks = column_chunks(data)
    assert not chunks["off"].is_stats_set
    assert chunks["s"].statistics.min_raw == b"" and chunks["s"].statistics.max_raw == "é".encode()
    assert chunks["bin"].statistics.min_raw == b"\x00"
    assert chunks["bin"].statistics.max_raw == b"\xff"
    assert chunks["i64"].statistics.min_raw == -(2**63)
    assert chunks["tss"].statistics.min_raw == -86_400_000  # stored in milliseconds
    assert chunks["b"].statistics.min_raw is True and chunks["b"].statistics.null_count == 1
    assert chunks["none"].statistics.null_count == 4
    assert not chunks["none"].statistics.has_min_max
    # per row group, not per file
    data = _write_fast([table], row_group_size=2, write_statistics=True)
    check_statistics(data, table, set(table.column_names))
    assert column_chunks(data, 1)["i64"].statistics.min_raw == 0
    # none at all
    data = _write_fast([table], write_statistics=False)
    check_statistics(data, table, set())


def _all_types_schema() -> pa.Schema:
    header = STORED_RECORDS_SCHEMA.field("headers").type
    mixed = pa.struct(
        [
            pa.field("a", pa.int8()),
            pa.field("b", pa.int16(), False),
            pa.field("c", pa.bool_()),
            pa.field("d", pa.timestamp("ms", tz="UTC")),
            pa.field("e", pa.date32(), False),
            pa.field("f", pa.string()),
            pa.field("g", pa.int64()),
        ]
    )
    fields = []
    for nullable in (False, True):
        suffix = "_n" if nullable else ""
        flat = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.bool_(), pa.date32()]
        flat += [pa.string(), pa.binary()]
        flat += [pa.timestamp(u, tz=tz) for u in TS_UNITS for tz in (None, "UTC", "+01:00")]
        fields += [pa.field(f"f{k}{suffix}", t, nullable) for k, t in enumerate(flat)]
        fields.append(pa.field(f"headers{suffix}", header, nullable))
        fields.append(
            pa.field(f"mixed{suffix}", pa.list_(pa.field("element", mixed, False)), nullable)
        )
    return pa.schema(fields)


def _fill(schema: pa.Schema, n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    arrays = []
    for f in schema:
        t = f.type
        if pa.types.is_list(t):
            children = tuple(
                ColumnSpec(
                    c.name, c.type, c.nullable, _kinds(c.type)[0], "half" if c.nullable else "none"
                )
                for c in t.value_type
            )
            spec = ColumnSpec(
                f.name,
                pa.null(),
                f.nullable,
                "",
                "sparse" if f.nullable else "none",
                children=children,
                lengths="mixed",
                element=t.value_field.name,
            )
        else:
            spec = ColumnSpec(f.name, t, f.nullable, _kinds(t)[0], "half" if f.nullable else "none")
        arrays.append(make_array(spec, n, rng))
    return pa.Table.from_arrays(arrays, schema=schema)


def test_parquet_schema_matches_pyarrow_writer() -> None:
    schema = _all_types_schema()
    assert fast_writer_supports(schema)
    table = _fill(schema, 300, 0)
    data = _write_fast([table])
    reference = _write_reference([table])
    fast, ref = pq.ParquetFile(pa.BufferReader(data)), pq.ParquetFile(pa.BufferReader(reference))
    for i in range(len(ref.schema)):
        a, b = fast.schema.column(i), ref.schema.column(i)
        got = (a.path, a.physical_type, str(a.logical_type), a.converted_type)
        want = (b.path, b.physical_type, str(b.logical_type), b.converted_type)
        assert got == want
        assert (a.max_definition_level, a.max_repetition_level) == (
            b.max_definition_level,
            b.max_repetition_level,
        ), a.path
    assert parquet_schema_text(data) == parquet_schema_text(
        reference
    )  # group nodes: repetition, LIST annotations
    assert fast.schema_arrow.equals(ref.schema_arrow)
    check_file(data, [table], schema, None, {})
    options = {
        "compression": "zstd",
        "use_dictionary": True,
        "write_statistics": True,
        "data_page_size": 300,
    }
    data = _write_fast([table], row_group_size=70, **options)
    check_file(data, [table], schema, 70, options)


def test_list_items_named_item_are_written_like_pyarrow() -> None:
    """pyarrow's default list field name is "item"; its writer names the Parquet element
    "element" all the same (the LIST spec), and so do the leaf paths options name."""
    item = pa.struct([pa.field("key", pa.string(), False), pa.field("value", pa.int64())])
    schema = pa.schema([pa.field("h", pa.list_(pa.field("item", item, False)))])
    assert fast_writer_supports(schema)
    table = pa.table(
        {"h": [[{"key": "a", "value": 1}], None, [], [{"key": "b", "value": None}] * 3]},
        schema=schema,
    )
    options: dict[str, Any] = {"column_encoding": {"h.list.element.value": "PLAIN"}}
    data = _write_fast([table], **options)
    check_file(data, [table], schema, None, options)


def test_nested_lists_with_nulls_empties_and_large_rows() -> None:
    header_type = STORED_RECORDS_SCHEMA.field("headers").type
    rows: list[Any] = [
        [],
        None,
        [{"key": "", "value": None}],
        [{"key": "a", "value": b""}, {"key": "é", "value": b"\x00"}],
        [{"key": f"k{k}", "value": None if k % 3 else b"%d" % k} for k in range(2_000)],
        None,
        [],
        [{"key": "z", "value": b"z"}],
    ]
    for nullable in (True, False):
        values = rows if nullable else [r if r is not None else [] for r in rows]
        schema = pa.schema([pa.field("h", header_type, nullable), pa.field("i", pa.int32())])
        table = pa.table(
            {"h": pa.array(values * 3, header_type), "i": pa.array(range(24), pa.int32())},
            schema=schema,
        )
        for page, rgs in ((1 << 20, None), (64, 3), (512, 5)):
            options = {
                "compression": "snappy",
                "use_dictionary": ["h.list.element.key"],
                "write_statistics": True,
                "data_page_size": page,
            }
            data = _write_fast([table], row_group_size=rgs, **options)
            check_file(data, [table], schema, rgs, options)


def test_statistics_of_nested_leaves_named_explicitly_are_written_or_refused() -> None:
    """Naming a nested leaf in ``write_statistics`` is refused (this writer has no statistics
    for nested leaves; pyarrow's has): it is not silently ignored. ``True`` (every column)
    writes those of the flat columns."""
    table = _stored_records(500)
    asked = ["offset", "headers.list.element.key"]
    with pytest.raises(ValueError, match=r"leaves under a list \['headers.list.element.key'\]"):
        _write_fast([table], write_statistics=asked)
    data = _write_fast([table], write_statistics=True)
    flat = {f.name for f in STORED_RECORDS_SCHEMA if f.name != "headers"}
    check_statistics(data, table, flat, _write_reference([table], write_statistics=True))


def test_nullable_list_items_round_trip_when_supported() -> None:
    """A list of nullable structs, if the writer claims it: null items read back as null."""
    item = pa.struct([pa.field("key", pa.string(), False), pa.field("value", pa.binary())])
    schema = pa.schema([pa.field("h", pa.list_(pa.field("element", item, True)))])
    assert fast_writer_supports(schema)
    table = pa.table(
        {
            "h": [
                [None],
                [{"key": "a", "value": None}, None],
                None,
                [],
                [{"key": "b", "value": b""}],
            ]
        },
        schema=schema,
    )
    data = _write_fast([table], write_statistics=True)
    check_file(data, [table], schema, None, {"write_statistics": True})


# ---------------------------------------------------------------------------------------------
# The records table


def _records_options() -> dict[str, Any]:
    """RECORDS_PARQUET_OPTIONS, minus any key the fast writer does not take."""
    params = inspect.signature(FastParquetWriter).parameters
    return {k: v for k, v in RECORDS_PARQUET_OPTIONS.items() if k in params}


def test_fast_writer_takes_the_records_encoding_options() -> None:
    taken = _records_options().keys()
    assert {"use_dictionary", "write_statistics", "column_encoding"} <= taken


def _stored_records(n: int) -> pa.Table:
    return records_table(n).select(STORED_RECORDS_SCHEMA.names).cast(STORED_RECORDS_SCHEMA)


@pytest.mark.parametrize(("page", "rgs"), [(1 << 20, None), (1 << 20, 700), (777, 333)])
def test_records_table_reads_back_with_pyarrow_and_polars(page: int, rgs: int | None) -> None:
    table = _stored_records(3_000)
    options = {"compression": "snappy", **_records_options(), "data_page_size": page}
    data = _write_fast([table], STORED_RECORDS_SCHEMA, rgs, **options)
    check_file(data, [table], STORED_RECORDS_SCHEMA, rgs, options)
    chunks = column_chunks(data)
    dictionary = set(RECORDS_PARQUET_OPTIONS["use_dictionary"])
    for path, chunk in chunks.items():
        if path in dictionary:
            assert "RLE_DICTIONARY" in chunk.encodings, path
        else:
            assert "RLE_DICTIONARY" not in chunk.encodings, path
        if path in RECORDS_PARQUET_OPTIONS["column_encoding"]:
            assert "DELTA_BINARY_PACKED" in chunk.encodings, path
        assert chunk.is_stats_set == (path in RECORDS_PARQUET_OPTIONS["write_statistics"]), path
    assert chunks["offset"].statistics.min_raw == 1_000
    assert chunks["timestamp"].statistics.max_raw == (1_699_920_000_000 + (rgs or 3_000) - 1) * 1000
    # the same Arrow and Parquet schema as pyarrow's writer gives the stored schema
    reference = _write_reference([table], STORED_RECORDS_SCHEMA, rgs, **options)
    assert parquet_schema_text(data) == parquet_schema_text(reference)
    assert pq.read_schema(pa.BufferReader(data)).equals(STORED_RECORDS_SCHEMA)


@pytest.mark.integration
def test_records_table_reads_back_with_spark(spark: SparkSession, tmp_path: Path) -> None:
    table = _stored_records(3_000)
    layouts = {
        "default": ({"compression": "snappy", **_records_options()}, None),
        "tiny-pages": ({"compression": "snappy", **_records_options(), "data_page_size": 300}, 700),
        "zstd-dict": (
            {"compression": "zstd", "use_dictionary": True, "write_statistics": True},
            1_000,
        ),
    }
    for name, (options, rgs) in layouts.items():
        directory = tmp_path / name
        directory.mkdir()
        _write_fast(
            [table.slice(0, 1_234), table.slice(1_234)],
            STORED_RECORDS_SCHEMA,
            rgs,
            where=str(directory / "part-00000.parquet"),
            **options,
        )
    expected = table.sort_by("offset")
    key = "spark.sql.parquet.enableVectorizedReader"
    before = str(spark.conf.get(key))
    try:
        for vectorized in ("true", "false"):  # Spark's own reader, then parquet-mr's
            spark.conf.set(key, vectorized)
            for name in layouts:
                got = spark.read.parquet(str(tmp_path / name)).orderBy("offset").toArrow()
                assert_same_table(got, expected, f"spark, vectorized={vectorized}, {name}")
    finally:
        spark.conf.set(key, before)


@pytest.mark.integration
def test_stored_snappy_pages_read_back_with_spark(spark: SparkSession, tmp_path: Path) -> None:
    """Pages stored as one snappy literal (random values) are read by Spark's vectorized
    reader and parquet-mr's (snappy-java), the compressed pages beside them too."""
    table = _random_then_repeated(6_000)
    table = table.append_column("n", pa.array(np.arange(6_000), pa.int64()))
    _write_fast(
        [table],
        compression="snappy",
        data_page_size=2_048,
        where=str(tmp_path / "part-00000.parquet"),
    )
    key = "spark.sql.parquet.enableVectorizedReader"
    before = str(spark.conf.get(key))
    try:
        for vectorized in ("true", "false"):
            spark.conf.set(key, vectorized)
            got = spark.read.parquet(str(tmp_path)).orderBy("n").toArrow()
            assert_same_table(got, table, f"spark, vectorized={vectorized}")
    finally:
        spark.conf.set(key, before)


# ---------------------------------------------------------------------------------------------
# Supported types


@pytest.mark.parametrize(
    "type_",
    [
        pa.decimal128(19, 2),
        pa.decimal256(10, 2),
        pa.float16(),
        pa.uint32(),
        pa.large_string(),
        pa.large_list(pa.int64()),
        pa.map_(pa.string(), pa.int64()),
        pa.list_(pa.list_(pa.int64())),
        pa.list_(pa.struct([pa.field("x", pa.list_(pa.int32()))])),
        pa.struct([pa.field("a", pa.list_(pa.list_(pa.int32())))]),
        pa.struct([pa.field("m", pa.map_(pa.string(), pa.int32()))]),
        pa.struct([]),
        pa.dictionary(pa.int32(), pa.string()),
    ],
)
def test_unsupported_types_are_reported(type_: pa.DataType) -> None:
    for decimals in (False, True):
        one = pa.schema([pa.field("x", type_)])
        assert not fast_writer_supports(one, store_decimal_as_integer=decimals)
        two = pa.schema([pa.field("ok", pa.int64()), pa.field("x", type_)])
        assert not fast_writer_supports(two, store_decimal_as_integer=decimals)


@pytest.mark.parametrize(
    "type_",
    [
        pa.float64(),
        pa.float32(),
        pa.list_(pa.float64()),
        pa.list_(pa.struct([pa.field("x", pa.float64())])),
        pa.list_(pa.struct([pa.field("x", pa.struct([pa.field("y", pa.int32())]))])),
        pa.struct([pa.field("a", pa.struct([pa.field("b", pa.list_(pa.string()))]))]),
    ],
)
def test_nested_and_float_types_are_supported(type_: pa.DataType) -> None:
    assert fast_writer_supports(pa.schema([pa.field("x", type_)]))


def test_decimals_are_supported_as_integers_only() -> None:
    """Up to 18 digits, as INT32 / INT64 (``store_decimal_as_integer``); pyarrow's default
    (FIXED_LEN_BYTE_ARRAY) is not this writer's, which refuses the schema without the option."""
    for precision in (1, 9, 10, 18):
        schema = pa.schema([pa.field("d", pa.list_(pa.decimal128(precision, 0)))])
        assert fast_writer_supports(schema, store_decimal_as_integer=True)
        assert not fast_writer_supports(schema)
        with pytest.raises(TypeError, match="store_decimal_as_integer"):
            FastParquetWriter(pa.BufferOutputStream(), schema)


def test_supported_types_are_reported() -> None:
    assert fast_writer_supports(RECORDS_ARROW_SCHEMA)
    assert fast_writer_supports(STORED_RECORDS_SCHEMA)
    assert fast_writer_supports(_all_types_schema())
    for f in _all_types_schema():
        assert fast_writer_supports(pa.schema([f])), f


# ---------------------------------------------------------------------------------------------
# Floats, decimals and nested columns (structs, one list level): compared with pyarrow's file
# field by field (Parquet schema elements, statistics, value counts), read back by pyarrow and
# polars


FLOATS = [math.nan, -0.0, 0.0, math.inf, -math.inf, 1.5, -2.25, 3e38, -1e-30, 7.0]


def _random_value(t: pa.DataType, rng: np.random.Generator) -> Any:
    """A non-null value of ``t`` (nested values nullable where their fields are)."""
    if pa.types.is_struct(t):
        return {f.name: _random_field(f, rng) for f in t}
    if pa.types.is_list(t):
        n = int(rng.choice([0, 0, 1, 2, 3, 5]))
        return [_random_field(t.value_field, rng) for _ in range(n)]
    if pa.types.is_floating(t):
        return float(FLOATS[rng.integers(len(FLOATS))]) if rng.random() < 0.5 else rng.normal()
    if pa.types.is_decimal(t):
        top = 10**t.precision - 1
        digits = int(rng.choice([0, 1, -1, top, -top, int(rng.integers(-top, top + 1))]))
        return decimal.Decimal(digits).scaleb(-t.scale)
    if pa.types.is_boolean(t):
        return bool(rng.integers(2))
    if pa.types.is_string(t):
        return "".join(rng.choice(ALPHABET[:4], int(rng.integers(0, 4))))
    if pa.types.is_binary(t):
        return bytes(rng.integers(0, 3, int(rng.integers(0, 3))).astype(np.uint8))
    if pa.types.is_timestamp(t) or pa.types.is_date32(t):
        return int(rng.integers(-(10**5), 10**5))  # days within Python's dates
    lo, hi = INT_BOUNDS.get(t, (-(2**31), 2**31 - 1))
    return int(rng.choice([lo, hi, 0, int(rng.integers(-5, 5))]))


def _random_field(f: pa.Field, rng: np.random.Generator, null_rate: float = 0.2) -> Any:
    if f.nullable and rng.random() < null_rate:
        return None
    return _random_value(f.type, rng)


def _random_table(schema: pa.Schema, n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    columns = []
    for f in schema:
        values = [_random_field(f, rng) for _ in range(n)]
        if pa.types.is_timestamp(f.type) or pa.types.is_date32(f.type):
            arr = pa.array(values, _storage_type(f.type)).cast(f.type)
        else:
            arr = pa.array(values, _nullable_copy(f.type)).cast(f.type)
        columns.append(arr)
    return pa.Table.from_arrays(columns, schema=schema)


def _nullable_copy(t: pa.DataType) -> pa.DataType:
    """``t`` as pa.array builds it from Python values (timestamps and dates from integers)."""
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_nullable_copy(f.type)) for f in t])
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_nullable_copy(t.value_type)))
    return _storage_type(t)


def _norm(value: Any) -> Any:
    """Python values compared exactly: NaN equal to NaN, -0.0 unequal to 0.0."""
    if isinstance(value, float):
        return struct.pack("<d", value) if not math.isnan(value) else "nan"
    if isinstance(value, dict):
        return {k: _norm(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_norm(v) for v in value]
    return value


def _physical_leaves(data: bytes) -> list[str]:
    md = pq.read_metadata(pa.BufferReader(data))
    return [md.schema.column(i).path for i in range(md.num_columns)]


def _nested_options(case_options: dict[str, Any]) -> dict[str, Any]:
    return {"store_decimal_as_integer": True, **case_options}


def check_like_pyarrow(
    data: bytes, parts: Sequence[pa.Table], row_group_size: int | None, options: dict[str, Any]
) -> bytes:
    """``data`` (the fast writer's file of ``parts``) against pyarrow's file of the same: the
    same Parquet schema elements (thrift, field by field), Arrow schema, row groups and level
    counts; statistics equal to pyarrow's wherever they were written; dictionaries where asked
    (leaves not under a list); the rows read back exactly by pyarrow and polars. Returns
    pyarrow's file."""
    schema = parts[0].schema
    expected = pa.concat_tables(parts)
    reference = _write_reference(parts, schema, row_group_size, **options)
    fast, ref = _footer(data), _footer(reference)
    assert fast[2] == ref[2]  # SchemaElements: names, repetition, physical/logical/converted
    assert parquet_schema_text(data) == parquet_schema_text(reference)
    assert pq.read_schema(pa.BufferReader(data)).equals(schema)
    got = _read_pyarrow(data)
    assert got.schema.equals(schema)
    assert _norm(got.to_pylist()) == _norm(expected.to_pylist()), "pyarrow"
    assert _norm(_read_polars(data).to_pylist()) == _norm(expected.to_pylist()), "polars"
    # (pyarrow writes an empty row group for an empty table, this writer none)
    assert row_group_sizes(data) == [n for n in row_group_sizes(reference) if n]
    leaves = _physical_leaves(data)
    listed = {p for p in leaves if ".list." in p}
    stats = _selected(options.get("write_statistics", False), leaves) - listed
    dictionary = _selected(options.get("use_dictionary", False), leaves) - listed
    ref_groups = [rg for rg in ref.get(4, []) if rg[3]]
    for r, (rg, ref_rg) in enumerate(zip(fast.get(4, []), ref_groups, strict=True)):
        for c, (chunk, ref_chunk) in enumerate(zip(rg[1], ref_rg[1], strict=True)):
            meta, want = chunk[3], ref_chunk[3]
            path = ".".join(p.decode() for p in meta[3])
            assert meta[3] == want[3] and meta[1] == want[1], path
            assert meta[5] == want[5], f"rg {r} {path}: {meta[5]} levels != {want[5]}"
            if path in stats:
                assert meta.get(12) == want.get(12), f"rg {r} {path}: statistics"
            else:
                assert 12 not in meta, f"rg {r} {path}: statistics not asked for"
            by_pages = {e for _, e, _ in (tuple(s.values()) for s in meta.get(13, []))}
            boolean = meta[1] == 0
            if path in dictionary and not boolean and meta[5]:
                assert ENC_RLE_DICTIONARY in by_pages | set(meta[2]), f"{path} (col {c})"
            else:
                assert ENC_RLE_DICTIONARY not in set(meta[2]), f"{path} (col {c})"
    chunks_of(data)  # every page header walks to its chunk's end
    return reference


NESTED_SCHEMA = pa.schema(
    [
        pa.field("f64", pa.float64()),
        pa.field("f32", pa.float32(), False),
        pa.field("d9", pa.decimal128(9, 2)),
        pa.field("d18", pa.decimal128(18, 4), False),
        pa.field("d1", pa.decimal128(1, 0)),
        pa.field("tags", pa.list_(pa.string())),
        pa.field("ints", pa.list_(pa.field("element", pa.int64(), False)), False),
        pa.field("floats", pa.list_(pa.field("item", pa.float32()))),
        pa.field("decs", pa.list_(pa.decimal128(12, 2))),
        pa.field(
            "address",
            pa.struct(
                [
                    pa.field("street", pa.string()),
                    pa.field("city", pa.string(), False),
                    pa.field("zip", pa.int32()),
                ]
            ),
        ),
        pa.field(
            "deep",
            pa.struct(
                [
                    pa.field(
                        "a",
                        pa.struct(
                            [
                                pa.field("b", pa.bool_()),
                                pa.field("c", pa.list_(pa.struct([pa.field("x", pa.int8())]))),
                            ]
                        ),
                        False,
                    ),
                    pa.field("d", pa.float64()),
                ]
            ),
            False,
        ),
        pa.field(
            "_kafka",
            pa.struct(
                [
                    pa.field("partition", pa.int32(), False),
                    pa.field("offset", pa.int64(), False),
                    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
                    pa.field("key", pa.binary()),
                    pa.field(
                        "headers",
                        pa.list_(
                            pa.field(
                                "element",
                                pa.struct(
                                    [
                                        pa.field("key", pa.string(), False),
                                        pa.field("value", pa.binary()),
                                    ]
                                ),
                                False,
                            )
                        ),
                        False,
                    ),
                ]
            ),
        ),
        pa.field(
            "lstruct", pa.list_(pa.struct([pa.field("s", pa.struct([pa.field("y", pa.date32())]))]))
        ),
    ]
)


@pytest.mark.parametrize(
    ("page", "rgs", "dictionary", "statistics"),
    [
        (1 << 20, None, False, False),
        (1 << 20, None, True, True),
        (97, 37, True, True),
        (300, 64, False, True),
        (64, None, True, False),
    ],
)
def test_nested_floats_and_decimals_read_back_like_pyarrows_file(
    page: int, rgs: int | None, dictionary: bool, statistics: bool
) -> None:
    """Every new type and nesting shape, nulls at every level, empty lists, two write_table
    calls of sliced tables (non-zero offsets) of two chunks each, several row groups and
    pages."""
    assert fast_writer_supports(NESTED_SCHEMA, store_decimal_as_integer=True)
    table = _random_table(NESTED_SCHEMA, 400, 7)
    parts = [
        pa.concat_tables([table.slice(3, 100), table.slice(150, 50)]),
        table.slice(211, 180),
    ]
    options = _nested_options(
        {
            "compression": "zstd",
            "use_dictionary": dictionary,
            "write_statistics": statistics,
            "data_page_size": page,
        }
    )
    data = _write_fast(parts, NESTED_SCHEMA, rgs, **options)
    check_like_pyarrow(data, parts, rgs, options)


def test_nested_leaves_take_dictionaries_statistics_and_delta_by_path() -> None:
    """Options name struct leaves (and leaves under a list, where dictionaries are PLAIN)."""
    table = _random_table(NESTED_SCHEMA, 500, 11)
    options = _nested_options(
        {
            "use_dictionary": ["address.street", "address.zip", "_kafka.key", "tags.list.element"],
            "write_statistics": ["_kafka.partition", "_kafka.offset", "address.zip", "f64"],
            "column_encoding": {
                "_kafka.offset": "DELTA_BINARY_PACKED",
                "_kafka.partition": "DELTA_BINARY_PACKED",
                "ints.list.element": "PLAIN",
            },
            "data_page_size": 512,
        }
    )
    data = _write_fast([table], NESTED_SCHEMA, 200, **options)
    check_like_pyarrow(data, [table], 200, options)
    chunks = column_chunks(data)
    assert "DELTA_BINARY_PACKED" in chunks["_kafka.offset"].encodings
    assert "RLE_DICTIONARY" in chunks["address.street"].encodings
    assert "RLE_DICTIONARY" not in chunks["tags.list.element"].encodings  # PLAIN, documented
    with pytest.raises(ValueError, match=r"under a list \['tags.list.element'\]"):
        _write_fast(
            [table], NESTED_SCHEMA, write_statistics=["tags.list.element"], **_nested_options({})
        )


@pytest.mark.parametrize(
    "values",
    [
        [math.nan, math.nan, None],
        [-0.0, 0.0],
        [0.0, -0.0, math.nan],
        [0.0, 0.0],
        [-0.0, -0.0],
        [1.0, math.nan, -1.0, math.inf],
        [-math.inf, math.nan],
        [None, None],
        [5e-324, -5e-324],
    ],
)
@pytest.mark.parametrize("type_", [pa.float32(), pa.float64()])
def test_float_statistics_are_pyarrows(values: list[float | None], type_: pa.DataType) -> None:
    """NaN left out of min/max (none when only NaN), a zero min written -0.0 and a zero max
    +0.0, as the spec says and pyarrow writes; also in a struct, and with dictionaries."""
    schema = pa.schema([pa.field("x", type_), pa.field("s", pa.struct([pa.field("y", type_)]))])
    arr = pa.array(values, type_)
    table = pa.table({"x": arr, "s": pa.StructArray.from_arrays([arr], ["y"])}, schema=schema)
    for dictionary in (False, True):
        options = {"write_statistics": True, "use_dictionary": dictionary}
        data = _write_fast([table], **options)
        check_like_pyarrow(data, [table], None, options)


def test_decimal_extremes_and_statistics_are_pyarrows() -> None:
    rows = []
    for precision, scale in ((1, 0), (9, 9), (9, 0), (10, 2), (18, 0), (18, 18)):
        top = 10**precision - 1
        for digits in (top, -top, 0, 1, -1):
            rows.append((precision, scale, digits))
    for precision, scale in {(p, s) for p, s, _ in rows}:
        t = pa.decimal128(precision, scale)
        values = [decimal.Decimal(d).scaleb(-s) for p, s, d in rows if (p, s) == (precision, scale)]
        arr = pa.array([*values, None], t)
        table = pa.table(
            {"d": arr, "l": pa.array([values, None, [], [None, values[0]], *[[]] * 2], pa.list_(t))}
        )
        for dictionary, encoding in ((False, None), (True, None), (False, "DELTA_BINARY_PACKED")):
            options = _nested_options(
                {
                    "write_statistics": ["d"],
                    "use_dictionary": dictionary,
                    "column_encoding": {"d": encoding} if encoding else None,
                }
            )
            data = _write_fast([table], **options)
            check_like_pyarrow(data, [table], None, options)


def test_a_null_in_a_non_nullable_field_under_present_parents_is_refused() -> None:
    child = pa.array([1, None, 3], pa.int32())
    type_ = pa.struct([pa.field("x", pa.int32(), False)])
    schema = pa.schema([pa.field("s", type_)])
    bad = pa.Array.from_buffers(type_, 3, [None], children=[child])  # pa.array would refuse it
    with pytest.raises(ValueError, match=r"column s\.x: a null in a non-nullable field"):
        _write_fast([pa.Table.from_arrays([bad], schema=schema)])
    # under a null parent the same null slot is never written: fine (pyarrow's writer refuses
    # it all the same: it checks the child array's null count alone)
    validity = pa.py_buffer(np.packbits([1, 0, 1], bitorder="little").tobytes())
    masked = pa.Array.from_buffers(type_, 3, [validity], 1, children=[child])
    table = pa.Table.from_arrays([masked], schema=schema)
    data = _write_fast([table], write_statistics=True)
    assert _read_pyarrow(data).to_pylist() == [{"s": {"x": 1}}, {"s": None}, {"s": {"x": 3}}]
    stats = column_chunks(data)["s.x"].statistics
    assert (stats.null_count, stats.min, stats.max) == (1, 1, 3)


# Random nested schemas and data within the supported shapes

SCALARS = [
    pa.int8(),
    pa.int32(),
    pa.int64(),
    pa.bool_(),
    pa.string(),
    pa.binary(),
    pa.float32(),
    pa.float64(),
    pa.decimal128(7, 3),
    pa.decimal128(15, 1),
    pa.timestamp("us", tz="UTC"),
    pa.date32(),
]


def _nested_types(depth: int, under_list: bool) -> st.SearchStrategy[pa.DataType]:
    scalar = st.sampled_from(SCALARS)
    if depth >= 3:
        return scalar
    children = st.lists(
        st.tuples(st.deferred(lambda: _nested_types(depth + 1, under_list)), st.booleans()),
        min_size=1,
        max_size=3,
    ).map(lambda fs: pa.struct([pa.field(f"c{i}", t, n) for i, (t, n) in enumerate(fs)]))
    options = [scalar, children]
    if not under_list:
        options.append(
            st.tuples(_nested_types(depth + 1, True), st.booleans()).map(
                lambda tn: pa.list_(pa.field("element", tn[0], tn[1]))
            )
        )
    return st.one_of(*options)


@st.composite
def nested_cases(draw: st.DrawFn) -> tuple[pa.Schema, int, int, int | None, dict[str, Any]]:
    fields = draw(
        st.lists(st.tuples(_nested_types(0, False), st.booleans()), min_size=1, max_size=3)
    )
    schema = pa.schema([pa.field(f"f{i}", t, n) for i, (t, n) in enumerate(fields)])
    rows = draw(st.integers(0, 120))
    seed = draw(st.integers(0, 2**32 - 1))
    rgs = draw(st.sampled_from([None, 1, 7, 50]))
    options = _nested_options(
        {
            "compression": draw(st.sampled_from(["none", "snappy", "zstd"])),
            "use_dictionary": draw(st.booleans()),
            "write_statistics": draw(st.booleans()),
            "data_page_size": draw(st.sampled_from([1, 40, 1 << 20])),
        }
    )
    return schema, rows, seed, rgs, options


@SETTINGS
@given(nested_cases())
def test_random_nested_tables_read_back_like_pyarrows_file(
    case: tuple[pa.Schema, int, int, int | None, dict[str, Any]],
) -> None:
    schema, rows, seed, rgs, options = case
    assert fast_writer_supports(schema, store_decimal_as_integer=True)
    table = _random_table(schema, rows, seed)
    cut = rows // 3
    parts = [table.slice(0, cut), table.slice(cut)] if rows else [table]
    data = _write_fast(parts, schema, rgs, **options)
    check_like_pyarrow(data, parts, rgs, options)


def test_metadata_is_the_footer_written() -> None:
    """``metadata`` (as ``pq.ParquetWriter``'s ``writer.metadata``) is the footer the file
    holds: row groups, rows, statistics; asked for before ``close`` it is an error."""
    table = pa.table({"s": pa.array(["b", None, "a", "c"] * 50), "n": pa.array(range(200))})
    sink = pa.BufferOutputStream()
    w = FastParquetWriter(sink, table.schema, write_statistics=["s"])
    w.write_table(table, row_group_size=120)
    with pytest.raises(ValueError, match="not closed"):
        _ = w.metadata
    w.close()
    got = w.metadata
    want = pq.read_metadata(pa.BufferReader(sink.getvalue()))
    assert got.to_dict() == want.to_dict()
    assert (got.num_rows, got.num_row_groups) == (200, 2)
    st = got.row_group(0).column(0).statistics
    assert (st.min, st.max, st.null_count) == ("a", "c", 30)
    assert got.row_group(1).column(1).statistics is None


def test_struct_leaves_with_nothing_null_on_their_path_from_sliced_parents() -> None:
    """A struct leaf whose path holds no null in the rows written takes its values as they are
    (no levels walked); slices of a struct column whose nulls (of the struct, of a field) are
    all outside the slice, inside it, or at its edge read back as pyarrow's file does."""
    n = 3_000
    inner = pa.StructArray.from_arrays(
        [pa.array([f"c{i % 7}" if i >= 100 else None for i in range(n)])], names=["c"]
    )
    mask = np.zeros(n, bool)
    mask[:50] = True  # the struct itself null in rows 0-49, its field c null up to row 99
    column = pa.StructArray.from_arrays(
        [pa.array(range(n), pa.int64()), inner],
        fields=[pa.field("a", pa.int64(), nullable=False), pa.field("b", inner.type)],
        mask=pa.array(mask),
    )
    table = pa.table({"s": column, "k": pa.array(range(n), pa.int32())})
    options = {"use_dictionary": True, "write_statistics": ["k"]}
    for parts in (
        [table.slice(100)],  # nothing null on any path
        [table.slice(60), table.slice(0, 60)],  # c null at the start of the first part
        [table.slice(49, 10), table.slice(2_000)],  # the struct's last null row at the edge
    ):
        data = _write_fast(parts, table.schema, None, **options)
        check_like_pyarrow(data, parts, None, options)
