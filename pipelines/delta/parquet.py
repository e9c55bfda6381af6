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
:mod:`pipelines.delta._parquet_format`; a leaf's values, levels and pages in
:mod:`pipelines.delta._parquet_columns`; dictionaries and statistics in
:mod:`pipelines.delta._parquet_dictionary`; the compiled column encoders in
:mod:`pipelines.delta._parquet_kernels`.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import cramjam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from logstore.protocol.varint import encode_unsigned_varint
from pipelines.delta._parquet_columns import (
    _concat_levels,
    _flat,
    _flat_pages,
    _levels_bound,
    _list_pages,
    _Page,
    _put_levels,
    _put_values,
    _values_bound,
    _Walk,
    _walk,
)
from pipelines.delta._parquet_dictionary import _dictionary, _put_dictionary_indices, _statistics
from pipelines.delta._parquet_format import (
    _BYTE_ARRAY,
    _CODECS,
    _DATA_PAGE,
    _DICTIONARY_PAGE,
    _DICTIONARY_PAGESIZE_LIMIT,
    _ENCODINGS,
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
        self._footer: bytes | None = None

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
        tail = len(footer).to_bytes(4, "little") + MAGIC
        self._sink.write(footer)
        self._sink.write(tail)
        self._footer = footer + tail
        if self._own:
            self._sink.close()

    @property
    def metadata(self) -> pq.FileMetaData:
        """The footer written by :meth:`close` (``pq.ParquetWriter``'s ``writer.metadata``):
        row groups, column chunks, statistics."""
        if self._footer is None:
            raise ValueError("the writer is not closed: no footer yet")
        return pq.read_metadata(pa.BufferReader(MAGIC + self._footer))

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
