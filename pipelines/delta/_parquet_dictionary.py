"""Dictionaries and statistics of one column chunk for
:class:`~pipelines.delta.parquet.FastParquetWriter`: dictionaries built from runs of equal
values (or every row where runs are short), hashed in a compiled kernel for fixed-width leaves,
by ``pc.dictionary_encode`` for byte arrays; min/max/null count as pyarrow writes them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.decode.arrow import numpy_array, same_bytes
from pipelines.delta import _parquet_kernels as k
from pipelines.delta._parquet_columns import (
    _NONE,
    _WIDTH,
    _binary_buffers,
    _fixed_values,
    _Page,
    _validity,
)
from pipelines.delta._parquet_format import (
    _BOOLEAN,
    _BYTE_ARRAY,
    _MAX_STATISTICS_SIZE,
    Fields,
    _Leaf,
)

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
    values = run_values.take(numpy_array(firsts[:count]))  # pa.array(ndarray) imports pandas
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
        # no deprecated min/max (fields 1, 2) for byte arrays: their old order was signed
        return _bounds(lo, hi, nulls, deprecated=False)
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
    return _bounds(lo_raw, hi_raw, nulls, deprecated=True)


def _bounds(lo: bytes, hi: bytes, nulls: int, *, deprecated: bool) -> Fields:
    """A Statistics struct as pyarrow writes it: the deprecated max/min (fields 1, 2) where
    asked, the null count, max_value/min_value and both marked exact (fields 7, 8)."""
    old: Fields = [(1, "bin", hi), (2, "bin", lo)] if deprecated else []
    return [*old, (3, "i64", nulls), (5, "bin", hi), (6, "bin", lo), (7, "bool", True),
            (8, "bool", True)]  # fmt: skip


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
