"""A Parquet writer for Arrow tables of flat columns and lists of structs, built for the ingest
job's ``records`` table: :class:`FastParquetWriter`, same calls as ``pq.ParquetWriter``.

Why: writing ``records`` with pyarrow's writer cost ~200-275 ns a record on one core, more
than half of an ingest task's CPU, and most of it outside compression (per record: the value
column ~107 ns of which snappy ~75, headers 26, key 22, codec 20, the per-batch integers ~30,
measured). Here each column is encoded by one compiled pass over its Arrow buffers
(:mod:`pipelines.delta._parquet_kernels`) and compressed in a reused buffer (snappy through
cramjam, the other codecs through pyarrow's): ~155-185 ns a record on the same data, of which
snappy on the value column is ~90. The file is what pyarrow would write for these options:

- format: data page v1, one dictionary page per column chunk where dictionary encoding is on,
  footer with the Arrow schema (``ARROW:schema``, taken from pyarrow) so readers restore the
  exact Arrow types, and pyarrow's Parquet schema (physical, logical and converted types);
- encodings: PLAIN; RLE_DICTIONARY (``use_dictionary``; dictionaries are built from the runs
  of equal values, so a column holding one value per Kafka batch costs one run a batch; a
  dictionary over ``dictionary_pagesize_limit`` falls back to PLAIN for that chunk, as
  pyarrow's does); DELTA_BINARY_PACKED (``column_encoding``, integer and timestamp columns);
- statistics (``write_statistics``): min, max and null count of flat columns;
- snappy: a column whose pages do not shrink (random values) has its data pages stored as one
  snappy literal each, a copy, re-probed every few pages (``FastParquetWriter._snappy``).

Supported Arrow types (:func:`fast_writer_supports`): integers, bool, timestamp, date32,
string, binary, and ``list<struct<...>>`` of those. Anything else: use ``pq.ParquetWriter``.

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
    _ENCODINGS,
    _INT32,
    _INT64,
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
    booleans as uint8 0/1; timestamps in seconds as milliseconds (Parquet has no seconds)."""
    t = arr.type
    n = len(arr)
    if pa.types.is_boolean(t):
        return _bits(arr.buffers()[1], arr.offset, n)
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
    the leaf array; None: every row in ``rows`` of a flat column)."""

    num_values: int  # level entries (rows for a flat column)
    rep: np.ndarray | None  # None: a flat column (no repetition levels)
    dfn: np.ndarray | None  # None: every entry present (all levels max_def, or no levels)
    rows: tuple[int, int]  # rows of the top-level column
    take: np.ndarray | None  # present leaf rows (nested, or flat with nulls)
    child_rows: tuple[int, int] = (0, 0)  # nested: the struct rows the page's lists span


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
    ``write_table`` writes row groups of at most ``row_group_size`` rows.
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
    ) -> None:
        if not fast_writer_supports(schema):
            raise TypeError(f"FastParquetWriter cannot write {schema}; use pq.ParquetWriter")
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

    def _column_chunk(self, leaf: _Leaf, arrays: list[pa.Array], chunk: _Chunk) -> None:
        arrays = [a for a in arrays if len(a)]
        if len(arrays) > 1 and leaf.field_index is None and leaf.physical != _BYTE_ARRAY:
            # A few bytes a row to copy, against a page (and its Python steps) per input chunk
            # for every small column: the decoder yields chunks of ~40k records.
            arrays = [pa.concat_arrays(arrays)]
        if leaf.statistics:
            chunk.statistics = _statistics(leaf, arrays)
        dictionary = _dictionary(leaf, arrays, self._dict_limit) if leaf.dictionary else None
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
            for page in _pages(leaf, arr, self._page_size):
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
        self, leaf: _Leaf, arr: pa.Array, page: _Page, runs: tuple[np.ndarray, np.ndarray] | None
    ) -> np.ndarray:
        """Levels then values of one data page, in the writer's scratch buffer (valid until
        the next page)."""
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


def _pages(leaf: _Leaf, arr: pa.Array, page_size: int) -> Iterable[_Page]:
    """Split one Arrow array (a chunk of the column) into data pages of about ``page_size``."""
    n = len(arr)
    if leaf.field_index is None:
        per_row = _row_bytes(leaf, arr)
        rows = max(1, min(n, page_size // max(per_row, 1)))
        valid = _validity(arr) if leaf.max_def else np.empty(0, np.uint8)
        for r0 in range(0, n, rows):
            r1 = min(n, r0 + rows)
            dfn = None  # no nulls here: every level is max_def (one RLE run)
            take = None
            if valid.shape[0]:
                dfn = valid[r0:r1]
                take = np.flatnonzero(dfn) + r0
            yield _Page(r1 - r0, None, dfn, (r0, r1), take)
        return
    # list<struct>: pages at row boundaries, each page's levels into buffers reused by the next
    offsets = np.frombuffer(arr.buffers()[1], np.int32, n + 1, arr.offset * 4)
    items = arr.values  # the struct array, not sliced to this list's offsets
    child = items.field(leaf.field_index)
    n_list, n_elem, n_leaf = leaf.nullable
    list_valid = _validity(arr) if n_list else np.empty(0, np.uint8)
    elem_valid = _validity(items) if n_elem else np.empty(0, np.uint8)
    leaf_valid = _validity(child) if n_leaf else np.empty(0, np.uint8)
    span = int(offsets[-1] - offsets[0])
    entries = n + span
    rep = np.empty(entries, np.uint8)
    dfn = np.empty(entries, np.uint8)
    take = np.empty(span, np.int64)
    per_row = max(1, (_row_bytes(leaf, child) * span) // max(n, 1) + 2)
    rows = max(1, min(n, page_size // per_row))
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        e, t = k.list_levels(
            offsets[r0 : r1 + 1],
            list_valid[r0:r1] if list_valid.shape[0] else list_valid,
            elem_valid,
            leaf_valid,
            int(n_list),
            int(n_elem),
            int(n_leaf),
            rep,
            dfn,
            take,
        )
        yield _Page(
            e,
            rep[:e],
            dfn[:e],
            (r0, r1),
            take[:t],
            (int(offsets[r0]), int(offsets[r1])),
        )


def _row_bytes(leaf: _Leaf, arr: pa.Array) -> int:
    if leaf.physical == _BYTE_ARRAY:
        n = max(len(arr), 1)
        offsets = np.frombuffer(arr.buffers()[1], np.int32, len(arr) + 1, arr.offset * 4)
        return int(offsets[-1] - offsets[0]) // n + 4
    if leaf.physical == _BOOLEAN:
        return 1
    return 4 if leaf.physical == _INT32 else 8


def _values_bound(
    leaf: _Leaf, arr: pa.Array, page: _Page, runs: tuple[np.ndarray, np.ndarray] | None
) -> int:
    """Most bytes the page's values (or dictionary indices) can take."""
    r0, r1 = page.rows
    n = page.num_values
    if runs is not None:
        return 1 + _levels_bound(n, 32) + 14 * (r1 - r0)
    if leaf.physical == _BYTE_ARRAY:
        if leaf.field_index is None:
            offsets, _ = _binary_buffers(arr)
            return 4 * (r1 - r0) + int(offsets[r1] - offsets[r0])
        offsets, _ = _binary_buffers(arr.values.field(leaf.field_index))
        c0, c1 = page.child_rows
        return 4 * (c1 - c0) + int(offsets[c1] - offsets[c0])
    if leaf.physical == _BOOLEAN:
        return n // 8 + 1
    if leaf.encoding == _DELTA_BINARY_PACKED:
        return k.delta_binary_packed_bound(n)
    return n * (4 if leaf.physical == _INT32 else 8)


def _put_values(out: np.ndarray, pos: int, leaf: _Leaf, arr: pa.Array, page: _Page) -> int:
    """The present values of the page, PLAIN or DELTA_BINARY_PACKED, into ``out``."""
    r0, r1 = page.rows
    index = page.take
    source = arr if leaf.field_index is None else arr.values.field(leaf.field_index)
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


def _run_starts(leaf: _Leaf, arr: pa.Array) -> np.ndarray:
    """Rows where a run of equal values starts; a run is all null or all present (a null's
    slot holds arbitrary bytes, so runs also break where the validity changes)."""
    starts = np.empty(max(len(arr), 1), np.int64)
    if leaf.physical == _BYTE_ARRAY:
        offsets, data = _binary_buffers(arr)
        if len(arr) and not arr.null_count and same_bytes(arr):
            # one run (a per-chunk label such as codec): ~0.4 ns a row, the kernel ~3.3
            return np.zeros(1, np.int64)
        count = k.runs_binary(offsets, data, starts)
    else:
        count = k.runs_fixed(_fixed_values(arr), starts)
    starts = starts[:count]
    if arr.null_count:
        changes = np.flatnonzero(np.diff(_validity(arr))) + 1
        starts = np.union1d(starts, changes)
    return starts


def _dictionary(
    leaf: _Leaf, arrays: list[pa.Array], limit: int
) -> tuple[pa.Array, np.ndarray, list[tuple[np.ndarray, np.ndarray]]] | None:
    """``(dictionary values, their PLAIN page, per array (run starts, run indices))`` from the
    runs of equal values; None when the PLAIN dictionary would exceed ``limit`` bytes. Runs
    of nulls get index 0: only the indices of present rows are written."""
    starts = [_run_starts(leaf, a) for a in arrays]
    firsts = [a.take(numpy_array(s)) for a, s in zip(arrays, starts, strict=True)]
    if not firsts:
        return None
    run_values = pa.concat_arrays(firsts) if len(firsts) > 1 else firsts[0]
    encoded = pc.dictionary_encode(run_values)  # nulls: null indices, not in the dictionary
    values = encoded.dictionary
    plain = _plain_of(leaf, values)
    if plain.shape[0] > limit:
        return None
    # (pc.fill_null / pc.index_in with a Python value import pandas: ~1.5 s in a fresh worker)
    indices = encoded.indices
    index_np = _fixed_values(indices).astype(np.int64)
    if indices.null_count:
        index_np[_validity(indices) == 0] = 0
    per_array = []
    at = 0
    for s in starts:
        per_array.append((s, index_np[at : at + len(s)]))
        at += len(s)
    return values, plain, per_array


def _plain_of(leaf: _Leaf, values: pa.Array) -> np.ndarray:
    if leaf.physical == _BYTE_ARRAY:
        offsets, data = _binary_buffers(values)
        out = np.empty(4 * len(values) + int(offsets[-1] - offsets[0]), np.uint8)
        end = k.plain_binary(offsets, data, _NONE, out, 0)
        return out[:end]
    return np.ascontiguousarray(_fixed_values(values)).view(np.uint8)


def _put_dictionary_indices(
    out: np.ndarray, pos: int, runs: tuple[np.ndarray, np.ndarray], page: _Page
) -> int:
    """Bit width byte, then the dictionary indices of the page's present rows: one RLE run
    per run of equal values (rows ``r0 .. r1`` all present), else the hybrid encoding of the
    present rows' indices."""
    starts, index = runs
    r0, r1 = page.rows
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


def _statistics(leaf: _Leaf, arrays: list[pa.Array]) -> Fields:
    """Statistics of a flat column chunk: null count, min and max (PLAIN bytes); min/max are
    left out above 4 KiB, as pyarrow does."""
    nulls = sum(a.null_count for a in arrays)
    present = [a for a in arrays if a.null_count < len(a)]
    if not present:
        return [(3, "i64", nulls)]
    if leaf.physical == _BYTE_ARRAY:
        mm = pc.min_max(pa.chunked_array([a.cast(pa.binary()) for a in present]))
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
        if max(len(lo), len(hi)) > _MAX_STATISTICS_SIZE:
            return [(3, "i64", nulls)]
        return [(3, "i64", nulls), (5, "bin", hi), (6, "bin", lo)]
    values = np.concatenate(
        [_fixed_values(a)[_validity(a) != 0] if a.null_count else _fixed_values(a) for a in present]
    )
    size = {_BOOLEAN: 1, _INT32: 4, _INT64: 8}[leaf.physical]
    lo_raw = int(values.min()).to_bytes(size, "little", signed=True)
    hi_raw = int(values.max()).to_bytes(size, "little", signed=True)
    return [
        (1, "bin", hi_raw),
        (2, "bin", lo_raw),
        (3, "i64", nulls),
        (5, "bin", hi_raw),
        (6, "bin", lo_raw),
    ]
