"""The column side of :class:`~pipelines.delta.parquet.FastParquetWriter`: a leaf's values out of
Arrow buffers, its definition and repetition levels (structs and one list level on its path),
the data pages it is cut into and their PLAIN / DELTA_BINARY_PACKED values.

Split from :mod:`pipelines.delta.parquet` (the writer's file and page framing) when nested
columns made that module ~1,000 lines; the compiled passes are in
:mod:`pipelines.delta._parquet_kernels`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from pipelines.delta import _parquet_kernels as k
from pipelines.delta._parquet_format import (
    _BOOLEAN,
    _BYTE_ARRAY,
    _DELTA_BINARY_PACKED,
    _DOUBLE,
    _FLOAT,
    _INT32,
    _INT64,
    _LIST,
    _MAX_INT32_DECIMAL,
    _MAX_SECONDS,
    _Leaf,
)

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
    node = arr
    clean = arr.null_count == 0
    for _kind, _nullable, child in leaf.steps:  # structs only: no list on the path
        node = node.field(child)  # the parent's offset and length applied
        clean = clean and node.null_count == 0
    if clean:
        # Nothing null on the path: every level is max_def, the values are the leaf's. Why:
        # the levels kernel walks every row (``_kafka``'s partition, offset, timestamp ... in
        # the decode bench: ~3.5 ns a row each for levels that are all the same)
        return node, None
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
