"""Compiled kernels of :mod:`pipelines.delta.parquet` (numba, ``cache=True``, ``nogil=True``).

Each walks a column's buffers once and writes Parquet's byte encodings into an output array its
caller allocated (from a given position), returning where it stopped; none
creates a Python object per value. References (Parquet format, ``Encodings.md``):

- PLAIN ``BYTE_ARRAY``: per value a 4-byte little-endian length, then the bytes;
- RLE / bit-packing hybrid (levels, dictionary indices): runs of ``varint(len << 1)`` + the
  value in ``ceil(width / 8)`` bytes, or ``varint(groups << 1 | 1)`` + ``groups`` x 8 values
  bit-packed LSB first;
- DELTA_BINARY_PACKED: ``varint(128) varint(4) varint(count) zigzag(first)``, then per block of
  128 deltas ``zigzag(min delta)``, 4 miniblock bit widths, and the miniblocks (32 values
  ``delta - min`` bit-packed each). Deltas wrap in the column's physical width (32 or 64 bits).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pipelines.decode._kernels import _copy

__all__ = [
    "BLOCK",
    "MINIBLOCK",
    "delta_binary_packed",
    "delta_binary_packed_bound",
    "dictionary_fixed",
    "levels",
    "plain_binary",
    "plain_binary_take",
    "rle_hybrid",
    "rle_run",
    "rle_runs",
    "runs_binary",
    "runs_fixed",
]

BLOCK = 128
MINIBLOCK = 32  # 4 miniblocks a block
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio (Fibonacci hashing)
_TAG = np.uint64(0xFFFFFFFF00000000)
_ENTRY = np.uint64(0xFFFFFFFF)
_FIRST_SLOTS = 1024


@njit(cache=True, nogil=True)
def _put_varint(out: np.ndarray, pos: int, value: int) -> int:
    v = np.uint64(value)
    while v >= 0x80:
        out[pos] = np.uint8((v & np.uint64(0x7F)) | np.uint64(0x80))
        v >>= np.uint64(7)
        pos += 1
    out[pos] = np.uint8(v)
    return pos + 1


@njit(cache=True, nogil=True)
def _zigzag(value: np.int64) -> np.uint64:
    return np.uint64((value << np.int64(1)) ^ (value >> np.int64(63)))


@njit(cache=True, nogil=True, inline="always")
def _put_plain(out: np.ndarray, pos: int, data: np.ndarray, start: int, n: int) -> int:
    """One PLAIN byte array: 4-byte little-endian length, then ``data[start:start + n]``."""
    out[pos] = n & 0xFF
    out[pos + 1] = (n >> 8) & 0xFF
    out[pos + 2] = (n >> 16) & 0xFF
    out[pos + 3] = (n >> 24) & 0xFF
    _copy(out, pos + 4, data, start, n)
    return pos + 4 + n


@njit(cache=True, nogil=True)
def plain_binary(
    offsets: np.ndarray, data: np.ndarray, valid: np.ndarray, out: np.ndarray, pos: int
) -> int:
    """PLAIN byte arrays of rows ``0 .. len(offsets) - 1`` (``valid`` empty: all; else only the
    rows where ``valid`` is non-zero) into ``out`` from ``pos``; returns the end. ``offsets``
    are Arrow's (absolute into ``data``); the caller sized ``out``."""
    all_valid = valid.shape[0] == 0
    for i in range(offsets.shape[0] - 1):
        if not all_valid and valid[i] == 0:
            continue
        pos = _put_plain(out, pos, data, offsets[i], offsets[i + 1] - offsets[i])
    return pos


@njit(cache=True, nogil=True)
def plain_binary_take(
    offsets: np.ndarray, data: np.ndarray, index: np.ndarray, out: np.ndarray, pos: int
) -> int:
    """PLAIN byte arrays of the rows ``index`` (in that order) into ``out`` from ``pos``."""
    for k in range(index.shape[0]):
        i = index[k]
        pos = _put_plain(out, pos, data, offsets[i], offsets[i + 1] - offsets[i])
    return pos


@njit(cache=True, nogil=True)
def _bitpack(out: np.ndarray, bitpos: int, value: np.uint64, width: int) -> int:
    """OR the low ``width`` bits of ``value`` into ``out`` at bit ``bitpos`` (LSB first)."""
    remaining = width
    v = value
    while remaining > 0:
        byte = bitpos >> 3
        shift = bitpos & 7
        take = min(8 - shift, remaining)
        out[byte] |= np.uint8((v & np.uint64((1 << take) - 1)) << np.uint64(shift))
        v >>= np.uint64(take)
        bitpos += take
        remaining -= take
    return bitpos


@njit(cache=True, nogil=True)
def rle_run(out: np.ndarray, pos: int, count: int, value: int, nbytes: int) -> int:
    """One RLE run of the hybrid encoding: ``varint(count << 1)``, then ``value`` in
    ``nbytes`` little-endian bytes; returns the end position."""
    pos = _put_varint(out, pos, count << 1)
    v = np.uint64(value)
    for b in range(nbytes):
        out[pos + b] = np.uint8((v >> np.uint64(8 * b)) & np.uint64(0xFF))
    return pos + nbytes


@njit(cache=True, nogil=True)
def rle_hybrid(values: np.ndarray, width: int, out: np.ndarray, pos: int) -> int:
    """RLE / bit-packing hybrid of ``values`` (each < 2**width) into ``out`` from
    ``pos``; returns the end position. Runs of 8 or more equal values are RLE runs, the rest
    bit-packed groups of 8 (the last group padded with zeros, which readers ignore)."""
    n = values.shape[0]
    nbytes = (width + 7) // 8
    i = 0
    while i < n:
        j = i + 1
        while j < n and values[j] == values[i]:
            j += 1
        if j - i >= 8 or j == n:
            pos = rle_run(out, pos, j - i, values[i], nbytes)
            i = j
            continue
        # bit-packed groups until a run of 8 equal values starts at a group boundary
        start = i
        groups = 0
        while i < n:
            groups += 1
            i += 8
            if i >= n:
                break
            k = i + 1
            while k < n and k - i < 8 and values[k] == values[i]:
                k += 1
            if k - i >= 8:
                break
        pos = _put_varint(out, pos, (groups << 1) | 1)
        stop = min(i, n)
        if width <= 8:
            # a group of 8 values is 8 * width <= 64 bits: build it in a register, LSB first
            for g in range(groups):
                acc = np.uint64(0)
                for j in range(8):
                    at = start + g * 8 + j
                    if at < stop:
                        acc |= np.uint64(values[at]) << np.uint64(j * width)
                for b in range(width):
                    out[pos + g * width + b] = np.uint8((acc >> np.uint64(8 * b)) & np.uint64(0xFF))
        else:
            out[pos : pos + groups * width] = 0
            bitpos = pos * 8
            for k in range(start, stop):
                bitpos = _bitpack(out, bitpos, np.uint64(values[k]), width)
        pos += groups * width
        i = stop
    return pos


@njit(cache=True, nogil=True)
def rle_runs(lengths: np.ndarray, values: np.ndarray, width: int, out: np.ndarray, pos: int) -> int:
    """RLE runs ``lengths[i]`` x ``values[i]`` (hybrid encoding, RLE runs only)."""
    nbytes = (width + 7) // 8
    for i in range(lengths.shape[0]):
        if lengths[i] != 0:
            pos = rle_run(out, pos, lengths[i], values[i], nbytes)
    return pos


@njit(cache=True, nogil=True)
def runs_fixed(values: np.ndarray, valid: np.ndarray, starts: np.ndarray, most: int) -> int:
    """Row numbers where a run starts (first: 0) into ``starts``; returns how many, or -1 as
    soon as there are more than ``most`` (the caller then takes another way). A run is equal
    present values or nulls (``valid`` empty: no nulls; else 0 = null, whose slot holds
    arbitrary bytes). ``values``: a fixed-width array (ints, or floats viewed as ints)."""
    n = values.shape[0]
    if n == 0:
        return 0
    k = 1
    starts[0] = 0
    all_valid = valid.shape[0] == 0
    for i in range(1, n):
        if all_valid:
            if values[i] == values[i - 1]:
                continue
        elif valid[i] == valid[i - 1] and (valid[i] == 0 or values[i] == values[i - 1]):
            continue
        if k == most:
            return -1
        starts[k] = i
        k += 1
    return k


@njit(cache=True, nogil=True)
def runs_binary(
    offsets: np.ndarray, data: np.ndarray, valid: np.ndarray, starts: np.ndarray, most: int
) -> int:
    """:func:`runs_fixed` for Arrow byte arrays (``offsets`` absolute into ``data``)."""
    n = offsets.shape[0] - 1
    if n <= 0:
        return 0
    k = 1
    starts[0] = 0
    all_valid = valid.shape[0] == 0
    for i in range(1, n):
        if all_valid or valid[i] == valid[i - 1]:
            if not all_valid and valid[i] == 0:
                continue
            a0 = offsets[i - 1]
            b0 = offsets[i]
            la = b0 - a0
            same = la == offsets[i + 1] - b0
            if same:
                for j in range(la):
                    if data[a0 + j] != data[b0 + j]:
                        same = False
                        break
            if same:
                continue
        if k == most:
            return -1
        starts[k] = i
        k += 1
    return k


def delta_binary_packed_bound(n: int) -> int:
    """Most bytes :func:`delta_binary_packed` writes for ``n`` values: the header (4 varints),
    per block of 128 deltas its min (a varint) and 4 widths, and 8 bytes a delta, the last
    block's miniblocks padded to 32 values (up to 1 KiB of padding)."""
    return 32 + 9 * n + 14 + BLOCK * 8


@njit(cache=True, nogil=True, inline="always")
def _put_le64(out: np.ndarray, pos: int, value: np.uint64, nbytes: int) -> None:
    """The low ``nbytes`` (<= 8) bytes of ``value`` into ``out[pos:]``, little-endian."""
    for b in range(nbytes):
        out[pos + b] = np.uint8((value >> np.uint64(8 * b)) & np.uint64(0xFF))


@njit(cache=True, nogil=True)
def delta_binary_packed(values: np.ndarray, width: int, out: np.ndarray, pos: int) -> int:
    """DELTA_BINARY_PACKED of int64 ``values`` into ``out`` from ``pos`` (``width`` 32: the
    column is INT32, deltas wrap at 32 bits); returns the end. ``out`` must hold
    :func:`delta_binary_packed_bound` bytes from ``pos``.

    Why this shape: the columns written with it (offsets, timestamps, batch positions) mostly
    have one delta per miniblock, so a miniblock is usually 0 bits wide and writes nothing;
    one pass a block finds the deltas, the block's smallest and each miniblock's largest
    (whose distance to the smallest is the miniblock's width), and the other miniblocks are
    packed through a 64-bit register, 8 bytes at a time, instead of a bit loop per value.
    Measured, 1.43M values, one core, interleaved with the previous loops (three passes a
    block and a per-value bit loop): consecutive offsets 1.1-2.0 -> 0.9 ns a value, batch
    positions (a jump every 200 rows) 1.9-2.8 -> 1.15."""
    n = values.shape[0]
    pos = _put_varint(out, pos, BLOCK)
    pos = _put_varint(out, pos, BLOCK // MINIBLOCK)
    pos = _put_varint(out, pos, n)
    if n == 0:
        return _put_varint(out, pos, 0)
    pos = _put_varint(out, pos, _zigzag(np.int64(values[0])))
    mask = np.uint64(0xFFFFFFFF) if width == 32 else np.uint64(0xFFFFFFFFFFFFFFFF)
    deltas = np.empty(BLOCK, np.int64)
    highest = np.empty(BLOCK // MINIBLOCK, np.int64)  # per miniblock, its largest delta
    i = 1
    while i < n:
        count = min(BLOCK, n - i)
        # One pass: the deltas, each miniblock's largest and the block's smallest. A
        # miniblock's width is that of (largest - smallest): x - lo grows with x.
        lo = np.int64(0x7FFFFFFFFFFFFFFF)
        for m in range(BLOCK // MINIBLOCK):
            first = m * MINIBLOCK
            hi = np.int64(-0x7FFFFFFFFFFFFFFF - 1)
            last = min(first + MINIBLOCK, count)
            if width == 32:
                for k in range(first, last):
                    d = np.int64(np.int32(values[i + k] - values[i + k - 1]))
                    deltas[k] = d
                    lo = min(lo, d)
                    hi = max(hi, d)
            else:
                for k in range(first, last):
                    d = np.int64(np.uint64(values[i + k]) - np.uint64(values[i + k - 1]))
                    deltas[k] = d
                    lo = min(lo, d)
                    hi = max(hi, d)
            highest[m] = hi
        pos = _put_varint(out, pos, _zigzag(lo))
        widths_at = pos
        pos += BLOCK // MINIBLOCK
        ulo = np.uint64(lo)
        for m in range(BLOCK // MINIBLOCK):
            first = m * MINIBLOCK
            last = min(first + MINIBLOCK, count)
            top = (np.uint64(highest[m]) - ulo) & mask if first < count else np.uint64(0)
            bits = 0
            while bits < 64 and (top >> np.uint64(bits)) != 0:
                bits += 1
            out[widths_at + m] = bits
            if bits == 0:
                continue
            # 32 values of ``bits`` bits: 4 * bits whole bytes; values past ``count`` are 0.
            acc = np.uint64(0)
            held = 0
            for k in range(first, first + MINIBLOCK):
                u = (np.uint64(deltas[k]) - ulo) & mask if k < last else np.uint64(0)
                acc |= u << np.uint64(held)
                held += bits
                if held >= 64:
                    _put_le64(out, pos, acc, 8)
                    pos += 8
                    held -= 64
                    # the bits of u that did not fit (none when it ended exactly at 64)
                    acc = u >> np.uint64(bits - held) if held else np.uint64(0)
            if held:
                _put_le64(out, pos, acc, (held + 7) // 8)
                pos += (held + 7) // 8
        i += count
    return pos


@njit(cache=True, nogil=True, inline="always")
def _path_level(
    valid: np.ndarray, node_row: np.ndarray, node_def: np.ndarray, at: int, d: int
) -> tuple[int, bool]:
    """Walk the nodes of one part of a leaf's path (:func:`levels`) at row ``at`` from
    definition level ``d``: (the level reached, whether every node is present), stopping at
    the first null; (-1, False) when that null is in a non-nullable node."""
    for i in range(node_row.shape[0]):
        row = node_row[i]
        if row >= 0 and valid[row, at] == 0:
            if node_def[i] == 0:
                return -1, False
            return d, False
        d += node_def[i]
    return d, True


@njit(cache=True, nogil=True)
def levels(  # noqa: PLR0917 (numba: no keyword-only parameters)
    r0: int,
    r1: int,
    pre: np.ndarray,
    pre_row: np.ndarray,
    pre_def: np.ndarray,
    offsets: np.ndarray,
    post: np.ndarray,
    post_row: np.ndarray,
    post_def: np.ndarray,
    rep: np.ndarray,
    dfn: np.ndarray,
    take: np.ndarray,
) -> tuple[int, int]:
    """Repetition and definition levels of rows ``r0 .. r1 - 1`` of one leaf column whose path
    holds structs and at most one list, in one pass.

    The path's nodes are in two parts: ``pre`` (the nodes indexed by row: the top-level column,
    the structs under it, the list itself; without a list, every node down to the leaf) and
    ``post`` (the nodes under the list, indexed by the list's child rows: the element, its
    structs, the leaf). Per node ``i``: ``*_def[i]`` 1 if it is nullable, ``*_row[i]`` its row
    in the validity matrix ``pre`` / ``post`` (non-zero = present), -1 when it has no nulls.
    ``offsets``: the list's (absolute, one per row and one more), empty without a list.

    A node adds 1 to the definition level when nullable and present; a non-empty list adds 1 for
    its repeated group. Writes one (rep, dfn) pair per entry (a row without a list; else a
    missing or empty list, or each item) and, into ``take``, the leaf rows whose value is present
    (row numbers, or child rows under a list). Returns (entries, values), or (-1, row) where a
    non-nullable node holds a null under present parents (the data contradicts its schema).
    ``rep`` is not written without a list.
    """
    e = 0
    t = 0
    has_list = offsets.shape[0] != 0
    for r in range(r0, r1):
        d, defined = _path_level(pre, pre_row, pre_def, r, 0)
        if d < 0:
            return -1, r
        if not has_list:
            dfn[e] = d
            e += 1
            if defined:
                take[t] = r
                t += 1
            continue
        a = offsets[r]
        b = offsets[r + 1]
        if not defined or a == b:
            rep[e] = 0
            dfn[e] = d
            e += 1
            continue
        d += 1
        for c in range(a, b):
            rep[e] = 0 if c == a else 1
            dd, present = _path_level(post, post_row, post_def, c, d)
            if dd < 0:
                return -1, r
            dfn[e] = dd
            e += 1
            if present:
                take[t] = c
                t += 1
    return e, t


@njit(cache=True, nogil=True, inline="always")
def _hash_word(value: np.int64) -> np.uint64:
    h = np.uint64(value) * _GOLDEN
    return h ^ (h >> np.uint64(29))


@njit(cache=True, nogil=True)
def _grown(table: np.ndarray, hashes: np.ndarray, count: int) -> np.ndarray:
    """:func:`dictionary_fixed`'s table of entries ``0 .. count - 1`` at twice its size."""
    size = table.shape[0] * 2
    out = np.zeros(size, np.uint64)
    mask = np.uint64(size - 1)
    for e in range(count):
        h = hashes[e]
        s = h & mask
        while out[s] != 0:
            s = (s + np.uint64(1)) & mask
        out[s] = (h & _TAG) | np.uint64(e + 1)
    return out


@njit(cache=True, nogil=True)
def dictionary_fixed(
    values: np.ndarray, valid: np.ndarray, keys: np.ndarray, index: np.ndarray, firsts: np.ndarray
) -> int:
    """Dictionary-encode fixed-width ``values`` (ints; floats viewed as ints: bits compare, so
    -0.0 and 0.0 are two entries, as in pyarrow's ``dictionary_encode``): entries in order of
    first appearance, their values into ``keys`` and their first rows into ``firsts``, each
    row's entry into ``index`` (nulls, ``valid`` 0: index 0; ``valid`` empty: no nulls).
    Returns the number of entries, or -1 as soon as there would be more than ``len(keys)``
    (the caller's dictionary page limit: it writes PLAIN then).

    An open-addressing table (linear probing, at most half full, doubled as it fills) whose
    slots hold the hash's high 32 bits and ``entry + 1`` (0: empty), so a probe reads one slot
    and, when the tags agree, the compact ``keys``; never the rows of earlier values.
    """
    n = values.shape[0]
    most = keys.shape[0]
    all_valid = valid.shape[0] == 0
    table = np.zeros(_FIRST_SLOTS, np.uint64)
    mask = np.uint64(_FIRST_SLOTS - 1)
    hashes = np.empty(max(min(n, most), 1), np.uint64)
    count = 0
    for i in range(n):
        if not all_valid and valid[i] == 0:
            index[i] = 0
            continue
        v = values[i]
        h = _hash_word(np.int64(v))
        tag = h & _TAG
        s = h & mask
        while True:
            slot = table[s]
            if slot == 0:
                if count == most:
                    return -1
                table[s] = tag | np.uint64(count + 1)
                hashes[count] = h
                firsts[count] = i
                keys[count] = v
                index[i] = count
                count += 1
                if 2 * count > table.shape[0]:
                    table = _grown(table, hashes, count)
                    mask = np.uint64(table.shape[0] - 1)
                break
            if slot & _TAG == tag and keys[np.int64(slot & _ENTRY) - 1] == v:
                index[i] = np.int64(slot & _ENTRY) - 1
                break
            s = (s + np.uint64(1)) & mask
    return count
