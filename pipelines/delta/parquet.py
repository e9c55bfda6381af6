"""A Parquet writer for Arrow tables of flat and nested columns, built for the ingest job's
``records`` table and the decode job's typed tables: :class:`FastParquetWriter`, same calls as
``pq.ParquetWriter``.

Why: writing ``records`` with pyarrow's writer cost ~200-275 ns a record on one core, more
than half of an ingest task's CPU, and most of it outside compression (per record: the value
column ~107 ns of which snappy ~75, headers 26, key 22, codec 20, the per-batch integers ~30,
measured). Here each column is encoded by one compiled pass over its Arrow buffers
(:mod:`pipelines.delta._parquet_kernels`) and compressed in a reused buffer (snappy through
cramjam, the other codecs through pyarrow's): ~155-185 ns a record on the same data, of which
snappy on the value column is ~90. The file is what pyarrow would write for these options:

- format: data page v1, one dictionary page per column chunk where dictionary encoding is on,
  footer with the Arrow schema (``ARROW:schema``, taken from pyarrow) so readers restore the
  exact Arrow types, and pyarrow's Parquet schema (groups, LIST annotations, physical,
  logical and converted types: the same SchemaElements);
- levels: one compiled pass per leaf (:func:`~pipelines.delta._parquet_kernels.levels`) over
  the validity of each struct and list on its path; a leaf with no list on its path has no
  repetition levels and one definition level a row;
- encodings: PLAIN; RLE_DICTIONARY (``use_dictionary``, leaves not under a list, struct fields
  included; dictionaries are built from the runs of equal present values, so a column holding
  one value per Kafka batch costs one run a batch; a dictionary over
  ``dictionary_pagesize_limit`` falls back to PLAIN for that chunk, as pyarrow's does);
  DELTA_BINARY_PACKED (``column_encoding``, integer, decimal and timestamp leaves). Leaves
  under a list are written PLAIN even where a dictionary is asked for (pyarrow writes one):
  their values follow the levels, not the rows, and the runs the dictionaries are built from
  are rows;
- statistics (``write_statistics``): min, max and null count of leaves not under a list (a
  null at any level of the path counts as a null, as pyarrow counts it); floats' min/max as
  pyarrow writes them (NaN left out, a zero min as -0.0, a zero max as +0.0). None for leaves
  under a list (naming one is refused);
- snappy: a column whose pages do not shrink (random values) has its data pages stored as one
  snappy literal each, a copy, re-probed every few pages (``FastParquetWriter._snappy``).

Supported Arrow types (:func:`fast_writer_supports`): integers, bool, float32/float64,
timestamp, date32, string, binary, decimal128 of up to 18 digits (INT32 / INT64, as pyarrow's
``store_decimal_as_integer=True`` and Spark write them: that option is required), structs of
any depth and one list level anywhere on a leaf's path. Lists of lists, maps, wider decimals,
unsigned and large types: use ``pq.ParquetWriter``.

The format's constants, the Thrift compact encoding and the file schema are in
:mod:`pipelines.delta._parquet_format`; the compiled column encoders in
:mod:`pipelines.delta._parquet_kernels`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import cramjam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from logstore.protocol.varint import encode_unsigned_varint
from pipelines.decode.arrow import numpy_array, same_bytes
from pipelines.delta import _parquet_kernels as k
from pipelines.delta._parquet_format import (
    _BOOLEAN,
    _BYTE_ARRAY,
    _CODECS,
    _DATA_PAGE,
    _DELTA_BINARY_PACKED,
    _DICTIONARY_PAGE,
    _DICTIONARY_PAGESIZE_LIMIT,
    _DOUBLE,
    _ENCODINGS,
    _FLOAT,
    _INT32,
    _INT64,
    _LIST,
    _MAX_INT32_DECIMAL,
    _MAX_SECONDS,
    _MAX_STATISTICS_SIZE,
    _PLAIN,
    _RLE,
    _RLE_DICTIONARY,
    CREATED_BY,
    MAGIC,
    Fields,
    _apply_options,
    _Leaf,
    _names,
    _schema,
    fast_writer_supports,
    thrift_struct,
)

__all__ = ["FastParquetWriter", "fast_writer_supports"]


# --- column values out of Arrow buffers --------------------------------------------------


def _bits(buf: pa.Buffer | None, offset: int, n: int) -> np.ndarray:
    """A bit-packed Arrow bitmap as one uint8 (0/1) per row."""
    if buf is None:
        return np.ones(n, np.uint8)
    raw = np.frombuffer(buf, np.uint8, (offset + n + 7) // 8)
    return np.unpackbits(raw, bitorder="little")[offset : offset + n]


def _validity(arr: pa.Array) -> np.ndarray:
    """0/1 per row, or an empty array when the array has no nulls."""
    if arr.null_count == 0:
        return np.empty(0, np.uint8)
    return _bits(arr.buffers()[0], arr.offset, len(arr))


_INT_DTYPES = {8: np.int8, 16: np.int16, 32: np.int32, 64: np.int64}


def _fixed_values(arr: pa.Array) -> np.ndarray:
    """Integer (or timestamp/date) values of every row, nulls included, as numpy int32/int64;
    booleans as uint8 0/1; timestamps in seconds as milliseconds (Parquet has no seconds);
    floats as float32/float64; decimal128 (precision <= 18) as the int32/int64 it is stored as
    (the low word of its 16-byte two's complement: the value fits in it)."""
    t = arr.type
    n = len(arr)
    if pa.types.is_boolean(t):
        return _bits(arr.buffers()[1], arr.offset, n)
    if pa.types.is_floating(t):
        dtype = np.float32 if t.bit_width == 32 else np.float64
        return np.frombuffer(arr.buffers()[1], dtype, n, arr.offset * (t.bit_width // 8))
    if pa.types.is_decimal(t):
        words = np.frombuffer(arr.buffers()[1], np.int64, 2 * n, arr.offset * 16)[::2]
        return words.astype(np.int32 if t.precision <= _MAX_INT32_DECIMAL else np.int64)
    width = t.bit_width
    dtype = _INT_DTYPES[width]
    values = np.frombuffer(arr.buffers()[1], dtype, n, arr.offset * (width // 8))
    if pa.types.is_timestamp(t) and t.unit == "s":
        present = values[_validity(arr) != 0] if arr.null_count else values
        if present.shape[0] and max(-int(present.min()), int(present.max())) > _MAX_SECONDS:
            raise ValueError("timestamp[s] values beyond the range of int64 milliseconds")
        return values * 1000
    if width < 32:
        return values.astype(np.int32)
    return values


def _binary_buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    n = len(arr)
    offsets = np.frombuffer(arr.buffers()[1], np.int32, n + 1, arr.offset * 4)
    data_buf = arr.buffers()[2]
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return offsets, data


@dataclass
class _Page:
    """One data page: its levels and which leaf values it holds (``take``: the present rows of
    the leaf array, or child rows under a list; None: every row in ``rows``)."""

    num_values: int  # level entries (rows for a leaf not under a list)
    rep: np.ndarray | None  # None: no list on the leaf's path (no repetition levels)
    dfn: np.ndarray | None  # None: every entry present (all levels max_def, or no levels)
    rows: tuple[int, int]  # rows of the top-level column
    take: np.ndarray | None  # present leaf rows (nested, or flat with nulls)
    child_rows: tuple[int, int] = (0, 0)  # under a list: the child rows the page's lists span


@dataclass
class _Chunk:
    """What one column chunk's pages were written as, for its ColumnMetaData."""

    dictionary_offset: int | None = None
    data_offset: int = 0
    num_values: int = 0
    uncompressed: int = 0
    compressed: int = 0
    encodings: set[int] = field(default_factory=set)
    page_stats: list[tuple[int, int, int]] = field(default_factory=list)  # type, encoding, n
    statistics: Fields | None = None


class FastParquetWriter:
    """``pq.ParquetWriter`` for the types :func:`fast_writer_supports` accepts.

    ``where``: a path or a writable ``pyarrow.NativeFile``. ``compression``: none, snappy,
    gzip, brotli, zstd, lz4 (LZ4_RAW). ``use_dictionary``, ``write_statistics``: True, False or
    leaf column paths; ``column_encoding``: ``{path: "PLAIN" | "DELTA_BINARY_PACKED"}``.
    ``store_decimal_as_integer``: as pyarrow's, and required for decimal columns (this writer
    has no FIXED_LEN_BYTE_ARRAY decimals). ``write_table`` writes row groups of at most
    ``row_group_size`` rows.
    """

    def __init__(
        self,
        where: str | pa.NativeFile,
        schema: pa.Schema,
        *,
        compression: str | None = "snappy",
        compression_level: int | None = None,
        use_dictionary: bool | Sequence[str] = False,
        write_statistics: bool | Sequence[str] = False,
        column_encoding: str | Mapping[str, str] | None = None,
        data_page_size: int = 1 << 20,
        dictionary_pagesize_limit: int = _DICTIONARY_PAGESIZE_LIMIT,
        store_decimal_as_integer: bool = False,
    ) -> None:
        if not fast_writer_supports(schema, store_decimal_as_integer=store_decimal_as_integer):
            decimals = "" if store_decimal_as_integer else " (decimals: store_decimal_as_integer)"
            raise TypeError(
                f"FastParquetWriter cannot write {schema}{decimals}; use pq.ParquetWriter"
            )
        name = (compression or "none").lower()
        if name not in _CODECS:
            raise ValueError(f"unknown compression {compression!r}")
        self._codec_id, codec_name = _CODECS[name]
        self._codec = (
            None
            if codec_name is None
            else pa.Codec(codec_name, compression_level=compression_level)
        )
        self.schema = schema
        self._elements, self._leaves = _schema(schema)
        paths = [leaf.path for leaf in self._leaves]
        chosen = (
            dict.fromkeys(paths, column_encoding)
            if isinstance(column_encoding, str)
            else dict(column_encoding or {})
        )
        unknown = sorted({e for e in chosen.values() if e not in _ENCODINGS})
        if unknown:
            raise ValueError(f"column_encoding {unknown}: this writer has {sorted(_ENCODINGS)}")
        encodings = {p: _ENCODINGS[e] for p, e in chosen.items()}
        _apply_options(
            self._leaves,
            _names(use_dictionary, paths),
            _names(write_statistics, paths),
            encodings,
            all_statistics=write_statistics is True,
        )
        self._page_size = max(1, data_page_size)
        self._dict_limit = dictionary_pagesize_limit
        self._scratch, self._compressed = _thread_buffers()
        # snappy data pages still to store uncompressed, per leaf (see _snappy)
        self._snappy_stored: dict[tuple[str, ...], int] = {}
        self._own = isinstance(where, str)
        self._sink: Any = pa.OSFile(where, "wb") if isinstance(where, str) else where
        self._sink.write(MAGIC)
        self._pos = len(MAGIC)
        self._row_groups: list[Fields] = []
        self._rows = 0
        self._closed = False

    # -- public ----------------------------------------------------------------------------

    def write_table(self, table: pa.Table, row_group_size: int | None = None) -> None:
        if table.schema.types != self.schema.types or table.schema.names != self.schema.names:
            raise ValueError(f"table schema {table.schema} differs from the writer's {self.schema}")
        step = table.num_rows if not row_group_size else max(1, row_group_size)
        for start in range(0, table.num_rows, max(step, 1)):
            self._row_group(table.slice(start, step))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        footer = thrift_struct(
            [
                (1, "i32", 2),
                (2, ("list", "struct"), self._elements),
                (3, "i64", self._rows),
                (4, ("list", "struct"), self._row_groups),
                (
                    5,
                    ("list", "struct"),
                    [[(1, "bin", b"ARROW:schema"), (2, "bin", _arrow_schema(self.schema))]],
                ),
                (6, "bin", CREATED_BY),
                (7, ("list", "struct"), [[(1, "struct", [])] for _ in self._leaves]),
            ]
        )
        self._sink.write(footer)
        self._sink.write(len(footer).to_bytes(4, "little") + MAGIC)
        if self._own:
            self._sink.close()

    def __enter__(self) -> FastParquetWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- row groups and pages --------------------------------------------------------------

    def _row_group(self, table: pa.Table) -> None:
        n = table.num_rows
        if n == 0:
            return
        start = self._pos
        chunks: list[Fields] = []
        total_uncompressed = 0
        for leaf in self._leaves:
            column = table.column(leaf.column)
            chunk = _Chunk()
            self._column_chunk(leaf, column.chunks, chunk)
            total_uncompressed += chunk.uncompressed
            meta = [
                (1, "i32", leaf.physical),
                (2, ("list", "i32"), sorted(chunk.encodings)),
                (3, ("list", "bin"), list(leaf.parts)),
                (4, "i32", self._codec_id),
                (5, "i64", chunk.num_values),
                (6, "i64", chunk.uncompressed),
                (7, "i64", chunk.compressed),
                (9, "i64", chunk.data_offset),
                (11, "i64", chunk.dictionary_offset),
                (12, "struct", chunk.statistics),
                (
                    13,
                    ("list", "struct"),
                    [[(1, "i32", t), (2, "i32", e), (3, "i32", c)] for t, e, c in chunk.page_stats],
                ),
            ]
            first = (
                chunk.dictionary_offset
                if chunk.dictionary_offset is not None
                else chunk.data_offset
            )
            chunks.append([(2, "i64", first), (3, "struct", meta)])
        self._row_groups.append(
            [
                (1, ("list", "struct"), chunks),
                (2, "i64", total_uncompressed),
                (3, "i64", n),
                (5, "i64", start),
                (6, "i64", self._pos - start),
                (7, "i16", len(self._row_groups)),
            ]
        )
        self._rows += n

    def _page(  # noqa: PLR0917
        self,
        page_type: int,
        header_field: int,
        header: Fields,
        body: np.ndarray,
        chunk: _Chunk,
        leaf: _Leaf | None = None,
    ) -> None:
        """Compress ``body``, then write its PageHeader (type, both sizes, and ``header`` as
        field ``header_field``: 5 data page, 7 dictionary page) and it. ``leaf``: the data
        page's column, whose snappy pages may be stored (:meth:`_snappy`)."""
        size = body.shape[0]
        if self._codec_id == _CODECS["snappy"][0]:
            data: Any = self._snappy(body, leaf)
        elif self._codec is not None:
            data = self._codec.compress(body, asbytes=False)
        else:
            data = body
        written = len(data)
        head = thrift_struct(
            [
                (1, "i32", page_type),
                (2, "i32", size),
                (3, "i32", written),
                (header_field, "struct", header),
            ]
        )
        self._sink.write(head)
        self._sink.write(data)
        self._pos += len(head) + written
        chunk.uncompressed += len(head) + size
        chunk.compressed += len(head) + written

    def _snappy(self, body: np.ndarray, leaf: _Leaf | None) -> np.ndarray:
        """``body`` as a snappy stream, in the compressed-page buffer.

        Data pages of a column whose last compressed page did not shrink below
        :data:`_SNAPPY_KEEP` of its size are stored: one snappy literal (:func:`snappy_stored`,
        a valid stream every reader decodes), a copy instead of a compression, for the next
        :data:`_SNAPPY_PROBE_EVERY` - 1 pages; then a page is compressed again to look.
        Why: snappy cost ~60 ns a record (1.6 GB/s) on random 100-byte values (encrypted or
        already-compressed payloads; measured in-process, 1M records decoded from lz4 batches
        and written: 233-238 -> 176-199 ns a record) to save nothing; values that do shrink
        are compressed as before: half-random ones (~0.55), and ``bench_tier_ingest.py``'s 1,000
        random values cycled (0.888: snappy's matches find the repeats within its 64 KiB
        blocks), whose 11% is kept rather than the CPU."""
        if leaf is not None and self._snappy_stored.get(leaf.parts, 0) > 0:
            self._snappy_stored[leaf.parts] -= 1
            out = self._compressed.get(body.shape[0] + _SNAPPY_STORED_OVERHEAD)
            return out[: snappy_stored(body, out)]
        out = self._compressed.get(cramjam.snappy.compress_raw_max_len(body))
        data = out[: cramjam.snappy.compress_raw_into(body, out)]
        if leaf is not None and data.shape[0] > _SNAPPY_KEEP * body.shape[0]:
            self._snappy_stored[leaf.parts] = _SNAPPY_PROBE_EVERY - 1
        return data

    def _column_chunk(self, leaf: _Leaf, columns: list[pa.Array], chunk: _Chunk) -> None:
        columns = [a for a in columns if len(a)]
        walks: list[_Walk | None]
        levels: list[np.ndarray | None]
        if leaf.under_list:
            walks = [_walk(leaf, a) for a in columns]
            arrays = [w.values for w in walks]  # type: ignore[union-attr]
            levels = [None] * len(arrays)
        else:
            flat = [_flat(leaf, a) for a in columns]
            arrays = [a for a, _ in flat]
            levels = [d for _, d in flat]
            walks = [None] * len(arrays)
            if len(arrays) > 1 and leaf.physical != _BYTE_ARRAY:
                # A few bytes a row to copy, against a page (and its Python steps) per input
                # chunk for every small column: the decoder yields chunks of ~40k records.
                arrays, levels = [pa.concat_arrays(arrays)], [_concat_levels(leaf, flat)]
                walks = [None]
        dictionary = _dictionary(leaf, arrays, self._dict_limit) if leaf.dictionary else None
        if leaf.statistics:
            # min/max over the dictionary when there is one: it holds exactly the present
            # values (strings of the typed bench table: ~15 ns a row less)
            nulls = sum(a.null_count for a in arrays)
            present = arrays if dictionary is None else [dictionary[0]]
            chunk.statistics = _statistics(leaf, present, nulls)
        if dictionary is not None:
            values, plain, _ = dictionary
            chunk.dictionary_offset = self._pos
            header = [(1, "i32", len(values)), (2, "i32", _PLAIN)]
            self._page(_DICTIONARY_PAGE, 7, header, plain, chunk)
            chunk.page_stats.append((_DICTIONARY_PAGE, _PLAIN, 1))
            chunk.encodings.add(_PLAIN)
        chunk.data_offset = self._pos
        pages = 0
        encoding = _RLE_DICTIONARY if dictionary is not None else leaf.encoding
        for ai, arr in enumerate(arrays):
            runs = None if dictionary is None else dictionary[2][ai]
            walk = walks[ai]
            split = (
                _list_pages(leaf, walk, self._page_size)
                if walk is not None
                else _flat_pages(leaf, arr, levels[ai], self._page_size)
            )
            for page in split:
                body = self._page_body(leaf, arr, page, runs)
                header = [
                    (1, "i32", page.num_values),
                    (2, "i32", encoding),
                    (3, "i32", _RLE),
                    (4, "i32", _RLE),
                ]
                self._page(_DATA_PAGE, 5, header, body, chunk, leaf)
                chunk.num_values += page.num_values
                pages += 1
        chunk.page_stats.append((_DATA_PAGE, encoding, pages))
        chunk.encodings.update((encoding, _RLE))

    def _page_body(
        self,
        leaf: _Leaf,
        arr: pa.Array,
        page: _Page,
        runs: tuple[np.ndarray | None, np.ndarray] | None,
    ) -> np.ndarray:
        """Levels then values of one data page, in the writer's scratch buffer (valid until
        the next page). ``arr``: the leaf's values (rows, or the list's child rows)."""
        width = leaf.max_def.bit_length()
        bound = 0
        if leaf.max_rep:
            bound += _levels_bound(page.num_values, 1)
        if leaf.max_def:
            bound += _levels_bound(page.num_values, width)
        bound += _values_bound(leaf, arr, page, runs)
        out = self._scratch.get(bound)
        pos = 0
        if leaf.max_rep:
            pos = _put_levels(out, pos, page.rep, 1, page.num_values, 0)
        if leaf.max_def:
            pos = _put_levels(out, pos, page.dfn, width, page.num_values, leaf.max_def)
        if runs is not None:
            pos = _put_dictionary_indices(out, pos, runs, page)
        else:
            pos = _put_values(out, pos, leaf, arr, page)
        return out[:pos]


# A snappy page is kept compressed when it is at most this fraction of its size; past it, the
# column's next pages are stored, and every _SNAPPY_PROBE_EVERY-th is compressed to look again
# (random bytes come out at ~1.0001 of their size; half-random values at ~0.55).
_SNAPPY_KEEP = 0.9
_SNAPPY_PROBE_EVERY = 8
_SNAPPY_STORED_OVERHEAD = 10  # the length's varint (<= 5 bytes), the literal's tag (<= 5)


def snappy_stored(body: np.ndarray, out: np.ndarray) -> int:
    """``body`` as a snappy stream of one literal, into ``out``; its length.

    The format (google/snappy's ``format_description.txt``): the uncompressed length as a
    varint, then elements; a literal's tag byte holds ``length - 1`` in its upper six bits when
    below 60, else 60-63 for that many minus 59 little-endian bytes of ``length - 1`` after it.
    Decoders take literals of any length (the compressor itself cuts its input into 64 KiB
    fragments, not the format), so a page is one literal: a copy of the bytes. A body of 4 GiB
    or more has no one-literal form (nor a Parquet page: its sizes are int32): ``ValueError``."""
    n = body.shape[0]
    if n > 1 << 32:
        raise ValueError(f"a snappy literal holds at most 4 GiB, not {n} bytes")
    head = encode_unsigned_varint(n)
    if n:
        m = n - 1
        width = 0 if m < 60 else (m.bit_length() + 7) // 8  # 1-4 bytes of length - 1
        tag = m << 2 if not width else (59 + width) << 2
        head += bytes([tag]) + (m.to_bytes(width, "little") if width else b"")
    pos = len(head)
    out[:pos] = np.frombuffer(head, np.uint8)
    out[pos : pos + n] = body
    return pos + n


class _Buffer:
    """A growing byte buffer reused for every page (fresh memory costs page faults)."""

    def __init__(self) -> None:
        self.data = np.empty(1 << 16, np.uint8)

    def get(self, size: int) -> np.ndarray:
        if self.data.shape[0] < size:
            self.data = np.empty(max(size, 2 * self.data.shape[0]), np.uint8)
        return self.data


_BUFFERS = threading.local()


def _thread_buffers() -> tuple[_Buffer, _Buffer]:
    """The (page body, compressed page) buffers of this thread, shared by its writers: a page is
    encoded, compressed and written in one call, so writers in one thread never interleave, and
    a task with many open files (one per partition) holds two buffers, not two per file."""
    pair: tuple[_Buffer, _Buffer] | None = getattr(_BUFFERS, "pair", None)
    if pair is None:
        pair = _BUFFERS.pair = (_Buffer(), _Buffer())
    return pair


def _arrow_schema_uncached(schema: pa.Schema) -> bytes:
    sink = pa.BufferOutputStream()
    pq.ParquetWriter(sink, schema).close()
    meta = pq.read_metadata(pa.BufferReader(sink.getvalue())).metadata
    return bytes(meta[b"ARROW:schema"])


_ARROW_SCHEMAS: dict[pa.Schema, bytes] = {}


def _arrow_schema(schema: pa.Schema) -> bytes:
    """The footer's ``ARROW:schema`` value, exactly as pyarrow writes it for ``schema``."""
    found = _ARROW_SCHEMAS.get(schema)
    if found is None:
        found = _ARROW_SCHEMAS[schema] = _arrow_schema_uncached(schema)
    return found


def _levels_bound(n: int, width: int) -> int:
    """Most bytes the 4-byte length and hybrid encoding of ``n`` levels can take: a varint
    header per run or per bit-packed stretch, and ``width`` bytes per group of 8."""
    return 4 + 16 + (n // 8 + 1) * (width + 6)


def _put_levels(  # noqa: PLR0917
    out: np.ndarray, pos: int, levels: np.ndarray | None, width: int, n: int, level: int
) -> int:
    """Levels as data page v1 stores them: 4-byte little-endian length, hybrid encoding.
    ``levels`` None: all ``n`` of them are ``level``, written as one RLE run; so are levels
    that are all equal (repetition levels of lists of at most one item: one numpy pass
    instead of the hybrid encoder, ~2.5 ns a row less)."""
    if levels is not None and levels.shape[0] and (levels == levels[0]).all():
        n, level, levels = levels.shape[0], int(levels[0]), None
    if levels is None:
        end = int(k.rle_run(out, pos + 4, n, level, (width + 7) // 8))
    else:
        end = int(k.rle_hybrid(levels, width, out, pos + 4))
    out[pos : pos + 4] = np.frombuffer((end - pos - 4).to_bytes(4, "little"), np.uint8)
    return end


# --- levels ------------------------------------------------------------------------------


@dataclass
class _Walk:
    """One leaf's path through one Arrow array of its top-level column, as
    :func:`pipelines.delta._parquet_kernels.levels` takes it."""

    values: pa.Array  # the leaf's array: one per row, or per child row of the list
    pre: np.ndarray  # validity (0/1) of the nodes indexed by row that have nulls
    pre_row: np.ndarray  # per node: its row in ``pre``, -1 without nulls
    pre_def: np.ndarray  # per node: 1 if nullable
    offsets: np.ndarray  # the list's offsets, empty without a list
    post: np.ndarray  # the same for the nodes under the list (indexed by child row)
    post_row: np.ndarray
    post_def: np.ndarray


def _walk(leaf: _Leaf, arr: pa.Array) -> _Walk:
    """Follow ``leaf``'s path from ``arr`` down: the validity of each node on it and the list's
    offsets. ``StructArray.field`` applies the struct's offset; a list's ``values`` is its whole
    child array, which its (absolute) offsets index."""
    parts: list[list[tuple[pa.Array, bool]]] = [[], []]
    side = 0
    offsets = _NO_OFFSETS
    for kind, nullable, child in leaf.steps:
        parts[side].append((arr, nullable))
        if kind == _LIST:
            offsets = np.frombuffer(arr.buffers()[1], np.int32, len(arr) + 1, arr.offset * 4)
            arr = arr.values
            side = 1
        else:
            arr = arr.field(child)
    parts[side].append((arr, leaf.leaf_nullable))
    matrices = []
    for nodes in parts:
        rows = [_bits(a.buffers()[0], a.offset, len(a)) for a, _ in nodes if a.null_count]
        at = np.cumsum([bool(a.null_count) for a, _ in nodes]) - 1
        matrices += [
            np.vstack(rows) if rows else _NO_MATRIX,
            np.array(
                [r if a.null_count else -1 for r, (a, _) in zip(at, nodes, strict=True)], np.int64
            ),
            np.array([int(nullable) for _, nullable in nodes], np.int64),
        ]
    pre, pre_row, pre_def, post, post_row, post_def = matrices
    return _Walk(arr, pre, pre_row, pre_def, offsets, post, post_row, post_def)


_NO_OFFSETS = np.empty(0, np.int32)
_NO_MATRIX = np.empty((0, 0), np.uint8)
_NO_LEVELS = np.empty(0, np.uint8)


def _levels(  # noqa: PLR0917
    leaf: _Leaf, walk: _Walk, r0: int, r1: int, rep: np.ndarray, dfn: np.ndarray, take: np.ndarray
) -> tuple[int, int]:
    """Levels of rows ``r0 .. r1 - 1`` (see the kernel); a null where the schema has none is
    refused."""
    e, t = k.levels(
        r0,
        r1,
        walk.pre,
        walk.pre_row,
        walk.pre_def,
        walk.offsets,
        walk.post,
        walk.post_row,
        walk.post_def,
        rep,
        dfn,
        take,
    )
    if e < 0:
        raise ValueError(
            f"column {leaf.path}: a null in a non-nullable field under present parents "
            f"(row {t} of the array)"
        )
    return int(e), int(t)


def _flat(leaf: _Leaf, arr: pa.Array) -> tuple[pa.Array, np.ndarray | None]:
    """A leaf not under a list as a flat column: its values, null where the definition level is
    below the maximum (a null at any level of its path: what statistics count as nulls and
    dictionaries skip), and its definition levels (None: all at the maximum)."""
    if not leaf.steps:
        if arr.null_count and not leaf.max_def:
            raise ValueError(f"column {leaf.path}: {arr.null_count} nulls in a non-nullable field")
        return arr, (_validity(arr) if arr.null_count else None)
    walk = _walk(leaf, arr)
    n = len(arr)
    dfn = np.empty(n, np.uint8)
    take = np.empty(n, np.int64)
    _, present = _levels(leaf, walk, 0, n, _NO_LEVELS, dfn, take)
    values = walk.values
    if present == n:
        return values, None
    defined = np.zeros(values.offset + n, np.uint8)
    defined[values.offset + take[:present]] = 1
    bitmap = pa.py_buffer(np.packbits(defined, bitorder="little"))
    rebuilt = pa.Array.from_buffers(
        values.type, n, [bitmap, *values.buffers()[1:]], n - present, values.offset
    )
    return rebuilt, dfn


def _concat_levels(
    leaf: _Leaf, flat: list[tuple[pa.Array, np.ndarray | None]]
) -> np.ndarray | None:
    if all(d is None for _, d in flat):
        return None
    return np.concatenate(
        [np.full(len(a), leaf.max_def, np.uint8) if d is None else d for a, d in flat]
    )


def _flat_pages(
    leaf: _Leaf, arr: pa.Array, dfn: np.ndarray | None, page_size: int
) -> Iterable[_Page]:
    """Pages of a leaf not under a list: rows of about ``page_size`` bytes."""
    n = len(arr)
    per_row = _row_bytes(leaf, arr)
    rows = max(1, min(n, page_size // max(per_row, 1)))
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        if dfn is None:  # every level is max_def (one RLE run)
            yield _Page(r1 - r0, None, None, (r0, r1), None)
            continue
        levels = dfn[r0:r1]
        take = np.flatnonzero(levels == leaf.max_def) + r0
        yield _Page(r1 - r0, None, levels, (r0, r1), take)


def _list_pages(leaf: _Leaf, walk: _Walk, page_size: int) -> Iterable[_Page]:
    """Pages of a leaf under a list, at row boundaries, each page's levels into buffers reused
    by the next."""
    offsets = walk.offsets
    n = offsets.shape[0] - 1
    span = int(offsets[-1] - offsets[0])
    entries = n + span
    rep = np.empty(entries, np.uint8)
    dfn = np.empty(entries, np.uint8)
    take = np.empty(span, np.int64)
    per_row = max(1, (_row_bytes(leaf, walk.values) * span) // max(n, 1) + 2)
    rows = max(1, min(n, page_size // per_row))
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        e, t = _levels(leaf, walk, r0, r1, rep, dfn, take)
        yield _Page(
            e,
            rep[:e],
            dfn[:e],
            (r0, r1),
            take[:t],
            (int(offsets[r0]), int(offsets[r1])),
        )


_WIDTH = {_BOOLEAN: 1, _INT32: 4, _INT64: 8, _FLOAT: 4, _DOUBLE: 8}


def _row_bytes(leaf: _Leaf, arr: pa.Array) -> int:
    if leaf.physical == _BYTE_ARRAY:
        n = max(len(arr), 1)
        offsets = np.frombuffer(arr.buffers()[1], np.int32, len(arr) + 1, arr.offset * 4)
        return int(offsets[-1] - offsets[0]) // n + 4
    return _WIDTH[leaf.physical]


def _values_bound(
    leaf: _Leaf, arr: pa.Array, page: _Page, runs: tuple[np.ndarray | None, np.ndarray] | None
) -> int:
    """Most bytes the page's values (or dictionary indices) can take."""
    r0, r1 = page.rows
    n = page.num_values
    if runs is not None:
        return 1 + _levels_bound(n, 32) + 14 * (r1 - r0)
    if leaf.physical == _BYTE_ARRAY:
        offsets, _ = _binary_buffers(arr)
        c0, c1 = page.child_rows if leaf.under_list else page.rows
        return 4 * (c1 - c0) + int(offsets[c1] - offsets[c0])
    if leaf.physical == _BOOLEAN:
        return n // 8 + 1
    if leaf.encoding == _DELTA_BINARY_PACKED:
        return k.delta_binary_packed_bound(n)
    return n * _WIDTH[leaf.physical]


def _put_values(out: np.ndarray, pos: int, leaf: _Leaf, arr: pa.Array, page: _Page) -> int:
    """The present values of the page, PLAIN or DELTA_BINARY_PACKED, into ``out``."""
    r0, r1 = page.rows
    index = page.take
    source = arr
    if leaf.physical == _BYTE_ARRAY:
        offsets, data = _binary_buffers(source)
        if index is None:
            return int(k.plain_binary(offsets[r0 : r1 + 1], data, _NONE, out, pos))
        return int(k.plain_binary_take(offsets, data, index, out, pos))
    values = _fixed_values(source)
    values = values[r0:r1] if index is None else values[index]
    if leaf.physical == _BOOLEAN:
        packed = np.packbits(values, bitorder="little")
    elif leaf.encoding == _DELTA_BINARY_PACKED:
        wide = values.astype(np.int64, copy=False)
        return int(k.delta_binary_packed(wide, 32 if leaf.physical == _INT32 else 64, out, pos))
    else:
        packed = np.ascontiguousarray(values).view(np.uint8)
    out[pos : pos + packed.shape[0]] = packed
    return pos + packed.shape[0]


_NONE = np.empty(0, np.uint8)


# --- dictionaries ------------------------------------------------------------------------


def _run_starts(leaf: _Leaf, arr: pa.Array) -> np.ndarray | None:
    """Rows where a run of equal values starts; a run is all null or all present (a null's
    slot holds arbitrary bytes, so runs also break where the validity changes), found in one
    pass with the validity (a merge of value runs and validity changes in numpy, ``union1d``,
    cost ~200 ns a row on a float column with nulls: it sorts). None when there are more runs
    than one per :data:`_ROWS_PER_RUN` rows (the kernel stops there), in the first
    :data:`_RUN_SAMPLE` rows already: else a column of short runs was scanned up to a quarter
    of its rows before the kernel gave up."""
    if len(arr) > 2 * _RUN_SAMPLE and _run_starts(leaf, arr.slice(0, _RUN_SAMPLE)) is None:
        return None
    most = max(1, len(arr) // _ROWS_PER_RUN)
    starts = np.empty(max(len(arr), 1), np.int64)
    valid = _validity(arr)
    if leaf.physical == _BYTE_ARRAY:
        offsets, data = _binary_buffers(arr)
        if len(arr) and not arr.null_count and same_bytes(arr):
            # one run (a per-chunk label such as codec): ~0.4 ns a row, the kernel ~3.3
            return np.zeros(1, np.int64)
        count = k.runs_binary(offsets, data, valid, starts, most)
    else:
        values = _fixed_values(arr)
        if values.dtype.kind == "f":  # bits, not values: -0.0 == 0.0, NaN != NaN
            values = values.view(np.int32 if values.dtype.itemsize == 4 else np.int64)
        count = k.runs_fixed(values, valid, starts, most)
    return starts[:count] if count >= 0 else None


# Dictionaries from runs while a run covers this many rows on average, else from every row:
# the runs cost a take of their first values and searches per page, worth it only where
# values repeat in runs (a value per Kafka batch).
_ROWS_PER_RUN = 4
_RUN_SAMPLE = 4096


def _dictionary(
    leaf: _Leaf, arrays: list[pa.Array], limit: int
) -> tuple[pa.Array, np.ndarray, list[tuple[np.ndarray | None, np.ndarray]]] | None:
    """``(dictionary values, their PLAIN page, per array (run starts, run indices))`` from the
    runs of equal values, or from every row where runs are short (run starts None, an index
    per row); None when the PLAIN dictionary would exceed ``limit`` bytes. Nulls get index 0:
    only the indices of present rows are written."""
    if not arrays:
        return None
    found = [_run_starts(leaf, a) for a in arrays]
    starts: list[np.ndarray | None]
    if any(s is None for s in found):
        starts = [None] * len(arrays)
        run_values = pa.concat_arrays(arrays) if len(arrays) > 1 else arrays[0]
        sizes = [len(a) for a in arrays]
    else:
        starts = list(found)
        firsts = [a.take(numpy_array(s)) for a, s in zip(arrays, found, strict=True)]
        run_values = pa.concat_arrays(firsts) if len(firsts) > 1 else firsts[0]
        sizes = [len(s) for s in found if s is not None]
    if leaf.physical in (_BYTE_ARRAY, _BOOLEAN):
        found_dict = _dictionary_encoded(leaf, run_values, limit)
    else:
        found_dict = _dictionary_hashed(run_values, limit)
    if found_dict is None:
        return None
    values, plain, index_np = found_dict
    per_array = []
    at = 0
    for s, size in zip(starts, sizes, strict=True):
        per_array.append((s, index_np[at : at + size]))
        at += size
    return values, plain, per_array


def _dictionary_hashed(
    run_values: pa.Array, limit: int
) -> tuple[pa.Array, np.ndarray, np.ndarray] | None:
    """``(dictionary values, their PLAIN page, an int32 index per row)`` of a fixed-width
    column by :func:`~pipelines.delta._parquet_kernels.dictionary_fixed`, which stops as soon as
    the page would pass ``limit`` bytes (None). Why not ``pc.dictionary_encode``: it encodes
    every row before the limit can be checked (a column of distinct ids: 1M rows hashed to be
    thrown away) and its int32 indices were copied to int64; measured on the typed bench table
    (1M rows, ~20k distinct, thread CPU ns a row, kernel vs ``dictionary_encode``): int64 id
    4.9 vs 7.0, timestamp 4.8 vs 9.4, double 5.3 vs 8.9, decimal as int64 5.1 vs 16.2, int32
    2.5 vs 4.6, a float of one value 1.8 vs 8.1."""
    fixed = _fixed_values(run_values)
    if fixed.dtype.kind == "f":  # bits, not values, as pyarrow's hash of floats
        fixed = fixed.view(np.int32 if fixed.dtype.itemsize == 4 else np.int64)
    n = len(run_values)
    keys = np.empty(min(limit // fixed.dtype.itemsize, n), fixed.dtype)
    index = np.empty(n, np.int32)
    firsts = np.empty(max(n, 1), np.int64)
    count = k.dictionary_fixed(fixed, _validity(run_values), keys, index, firsts)
    if count < 0:
        return None
    values = run_values.take(pa.array(firsts[:count]))
    return values, keys[:count].view(np.uint8), index


def _dictionary_encoded(
    leaf: _Leaf, run_values: pa.Array, limit: int
) -> tuple[pa.Array, np.ndarray, np.ndarray] | None:
    """:func:`_dictionary_hashed` for byte arrays (and booleans) by ``pc.dictionary_encode``:
    a numba kernel hashing the bytes (words of 8, the distinct values copied compactly into the
    page) measured ~2x slower on the bench table's strings (customer 54.8 vs 24.7 ns a row)."""
    encoded = pc.dictionary_encode(run_values)  # nulls: null indices, not in the dictionary
    values = encoded.dictionary
    plain = _plain_of(leaf, values)
    if plain.shape[0] > limit:
        return None
    # (pc.fill_null / pc.index_in with a Python value import pandas: ~1.5 s in a fresh worker)
    indices = encoded.indices
    index = _fixed_values(indices)  # int32, read-only: copied only to zero the nulls' slots
    if indices.null_count:
        index = index.copy()
        index[_validity(indices) == 0] = 0
    return values, plain, index


def _plain_of(leaf: _Leaf, values: pa.Array) -> np.ndarray:
    if leaf.physical == _BYTE_ARRAY:
        offsets, data = _binary_buffers(values)
        out = np.empty(4 * len(values) + int(offsets[-1] - offsets[0]), np.uint8)
        end = k.plain_binary(offsets, data, _NONE, out, 0)
        return out[:end]
    return np.ascontiguousarray(_fixed_values(values)).view(np.uint8)


def _put_dictionary_indices(
    out: np.ndarray, pos: int, runs: tuple[np.ndarray | None, np.ndarray], page: _Page
) -> int:
    """Bit width byte, then the dictionary indices of the page's present rows: one RLE run
    per run of equal values (rows ``r0 .. r1`` all present), else the hybrid encoding of the
    present rows' indices (``runs`` without starts: an index per row)."""
    starts, index = runs
    r0, r1 = page.rows
    if starts is None:
        rows = index[r0:r1] if page.take is None else index[page.take]
        out[pos] = width = max(1, (int(rows.max()) if rows.shape[0] else 0).bit_length())
        return int(k.rle_hybrid(rows, width, out, pos + 1))
    width = max(1, (int(index.max()) if index.shape[0] else 0).bit_length())
    out[pos] = width
    if page.take is None:
        first = int(np.searchsorted(starts, r0, side="right")) - 1
        last = int(np.searchsorted(starts, r1, side="left"))
        bounds = starts[first:last].copy()
        bounds[0] = r0
        lengths = np.append(bounds[1:], r1) - bounds
        return int(k.rle_runs(lengths, index[first:last], width, out, pos + 1))
    row_ids = index[np.searchsorted(starts, page.take, side="right") - 1]
    return int(k.rle_hybrid(row_ids, width, out, pos + 1))


# --- statistics --------------------------------------------------------------------------


def _statistics(leaf: _Leaf, arrays: list[pa.Array], nulls: int) -> Fields:
    """Statistics of a column chunk not under a list: ``nulls``, and min and max (PLAIN bytes)
    of the values of ``arrays`` (its values or their dictionary); min/max are left out above
    4 KiB, as pyarrow does."""
    present = [a for a in arrays if a.null_count < len(a)]
    if not present:
        return [(3, "i64", nulls)]
    if leaf.physical == _BYTE_ARRAY:
        mm = pc.min_max(pa.chunked_array([a.cast(pa.binary()) for a in present]))
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
        if max(len(lo), len(hi)) > _MAX_STATISTICS_SIZE:
            return [(3, "i64", nulls)]
        return [
            (3, "i64", nulls),
            (5, "bin", hi),
            (6, "bin", lo),
            (7, "bool", True),
            (8, "bool", True),
        ]
    values = np.concatenate(
        [_fixed_values(a)[_validity(a) != 0] if a.null_count else _fixed_values(a) for a in present]
    )
    if values.dtype.kind == "f":
        lo_raw, hi_raw = _float_bounds(values)
        if lo_raw is None:
            return [(3, "i64", nulls)]
    else:
        size = _WIDTH[leaf.physical]
        lo_raw = int(values.min()).to_bytes(size, "little", signed=True)
        hi_raw = int(values.max()).to_bytes(size, "little", signed=True)
    return [
        (1, "bin", hi_raw),
        (2, "bin", lo_raw),
        (3, "i64", nulls),
        (5, "bin", hi_raw),
        (6, "bin", lo_raw),
        (7, "bool", True),  # is_max_value_exact, is_min_value_exact: as pyarrow writes them
        (8, "bool", True),
    ]


def _float_bounds(values: np.ndarray) -> tuple[bytes, bytes] | tuple[None, None]:
    """Min and max of floats as Parquet wants them: NaN left out (none if only NaN), a zero
    minimum written as -0.0 and a zero maximum as +0.0 (the spec's rule for readers that
    cannot tell the zeros apart, and what pyarrow writes)."""
    lo = np.fmin.reduce(values)  # fmin/fmax skip NaN
    hi = np.fmax.reduce(values)
    if np.isnan(lo):
        return None, None
    if lo == 0:
        lo = -values.dtype.type(0.0)
    if hi == 0:
        hi = values.dtype.type(0.0)
    return lo.tobytes(), hi.tobytes()
