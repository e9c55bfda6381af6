"""Compiled record selection for the log rewrite (numba, ``cache=True``, ``nogil=True``).

:func:`logstore.storage.cleaner.rewrite_group` keeps, of a partly kept batch, the records whose
offsets win their key. Its own loop walks the records in Python (microseconds a record); this
kernel does the same walk compiled (tens of nanoseconds a record) and is handed to it by
:mod:`pipelines.compaction.log` (the storage layer itself takes no numpy). Same bytes out:
each kept record is copied as it is (its offset delta and timestamp delta are relative to the
batch's unchanged base offset and base timestamp).

Record layout (Kafka's RecordBatch v2, decompressed)::

    length varint | attributes i8 | timestampDelta varlong | offsetDelta varint | ...

Inputs are untrusted: every read is bounds-checked; a malformed section makes the kernel return
a negative status and :func:`make_selector`'s function raise
:class:`~logstore.errors.CorruptRecordError`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import types
from numba.extending import intrinsic

from logstore.errors import CorruptRecordError
from pipelines.decode._kernels import _copy, _varint

__all__ = ["last_per_key", "last_per_key_into", "make_selector", "select_records"]

_OK = 0
_BAD_VARINT = -1
_BAD_LENGTH = -2
_TRAILING = -3


@njit(cache=True, nogil=True)
def select_records(
    data: np.ndarray,
    count: int,
    base_offset: int,
    keep: np.ndarray,
    out: np.ndarray,
) -> tuple:  # type: ignore[type-arg]
    """Copy the records of ``data`` (``count`` records) whose offsets are in ``keep`` (sorted
    int64) to ``out`` (at least ``len(data)`` bytes). ``(status, bytes written, records
    kept, largest timestamp delta kept or -2**63)``."""
    end = data.shape[0]
    k = np.searchsorted(keep, base_offset)
    n_keep = keep.shape[0]
    p = 0
    w = 0
    kept = 0
    run_start = 0
    run_end = 0
    max_delta = np.int64(-(2**63))
    for _ in range(count):
        length, q, ok = _varint(data, p, end, 10)
        if not ok:
            return _BAD_VARINT, w, kept, max_delta
        record_end = q + length
        if length < 6 or record_end > end:
            return _BAD_LENGTH, w, kept, max_delta
        ts_delta, r, ok1 = _varint(data, q + 1, record_end, 10)
        offset_delta, _after, ok2 = _varint(data, r, record_end, 10)
        if not (ok1 and ok2):
            return _BAD_VARINT, w, kept, max_delta
        offset = base_offset + offset_delta
        while k < n_keep and keep[k] < offset:
            k += 1
        if k < n_keep and keep[k] == offset:
            if p != run_end:  # not right after the last kept record: a new run
                _copy(out, w, data, run_start, run_end - run_start)
                w += run_end - run_start
                run_start = p
            run_end = record_end
            kept += 1
            max_delta = max(max_delta, ts_delta)
        p = record_end
    _copy(out, w, data, run_start, run_end - run_start)  # kept records end to end: one copy
    w += run_end - run_start
    if p != end:
        return _TRAILING, w, kept, max_delta
    return _OK, w, kept, max_delta


_MUL = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xFF51AFD7ED558CCD)
_MIX2 = np.uint64(0xC4CEB9FE1A85EC53)
_S29 = np.uint64(29)
_S33 = np.uint64(33)


@intrinsic
def _load64(typingctx, arr, p):  # type: ignore[no-untyped-def]
    """The 8 bytes ``arr[p:p+8]`` as one unaligned native-order ``uint64`` load (the caller
    checked the bounds). Little-endian on the hosts this runs on; the key map only needs the
    same bytes to give the same word, which holds on any host."""
    sig = types.uint64(arr, p)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        arr_ty, p_ty = signature.args
        arr_v, p_v = args
        a = context.make_array(arr_ty)(context, builder, arr_v)
        ptr = builder.gep(a.data, [context.cast(builder, p_v, p_ty, types.intp)])
        ptr64 = builder.bitcast(ptr, ir.IntType(64).as_pointer())
        return builder.load(ptr64, align=1)

    return sig, codegen


_SHIFT = np.arange(8, dtype=np.uint64) * np.uint64(8)
_LITTLE = sys.byteorder == "little"  # the tail load below needs it


@njit(cache=True, nogil=True, inline="always")
def _word(data: np.ndarray, p: int, end: int) -> np.uint64:
    """The (up to) 8 bytes at ``p`` before ``end`` as one word, zero padded: one load, or
    for a short tail the 8 bytes that end at ``end`` shifted down (a byte loop only when the
    array holds fewer than 8 bytes before ``end``)."""
    n = end - p
    if n >= 8:
        return _load64(data, p)
    if n <= 0:
        return np.uint64(0)
    if end >= 8 and _LITTLE:
        return _load64(data, end - 8) >> _SHIFT[8 - n]
    w = np.uint64(0)
    for i in range(n):
        w |= np.uint64(data[p + i]) << _SHIFT[i]
    return w


@njit(cache=True, nogil=True, inline="always")
def _fmix(h: np.uint64) -> np.uint64:
    """murmur3's 64-bit finaliser."""
    h = (h ^ (h >> _S33)) * _MIX1
    h = (h ^ (h >> _S33)) * _MIX2
    return h ^ (h >> _S33)


@njit(cache=True, nogil=True)
def _key_hash(data: np.ndarray, start: int, end: int) -> np.int64:
    """A 64-bit hash of ``data[start:end]``: the length, then each 8-byte little-endian word
    (the last zero padded) multiplied in, then murmur3's finaliser (spreads the bits; the top
    ones pick the radix part, the low ones the slot); as int64."""
    h = np.uint64(end - start) * _MUL
    p = start
    while p < end:
        h = (h ^ _word(data, p, end)) * _MUL
        h ^= h >> _S29
        p += 8
    return np.int64(_fmix(h))


_ROW_BITS = 40
_ROW_MASK = (1 << _ROW_BITS) - 1
_INLINE = 16  # keys up to this many bytes live in the table itself
_SLOT = 4  # int64 per slot: row | length << 40, hash, key bytes 0-7, key bytes 8-15


@njit(cache=True, nogil=True)
def _words(data: np.ndarray, start: int, end: int) -> tuple:  # type: ignore[type-arg]
    """The first 16 bytes of ``data[start:end]`` as two little-endian int64 (zero padded)."""
    return np.int64(_word(data, start, end)), np.int64(_word(data, start + 8, end))


@njit(cache=True, nogil=True)
def _same_key(data: np.ndarray, starts: np.ndarray, ends: np.ndarray, a: int, b: int) -> bool:
    sa = starts[a]
    sb = starts[b]
    n = ends[a] - sa
    if ends[b] - sb != n:
        return False
    for i in range(n):  # noqa: SIM110 (numba: no generator in all())
        if data[sa + i] != data[sb + i]:
            return False
    return True


_PART_ROWS = 8192  # rows per radix part: its table (16K slots of 32 B) stays in L2


@njit(cache=True, nogil=True)
def last_per_key(
    starts: np.ndarray, ends: np.ndarray, data: np.ndarray, valid: np.ndarray
) -> np.ndarray:
    """:func:`last_per_key_into` with scratch space of its own."""
    n = valid.shape[0]
    return last_per_key_into(
        starts, ends, data, valid, np.empty(n, np.int64), np.empty(n * (_SLOT + 1), np.int64)
    )


@njit(cache=True, nogil=True)
def last_per_key_into(  # noqa: PLR0917
    starts: np.ndarray,
    ends: np.ndarray,
    data: np.ndarray,
    valid: np.ndarray,
    hashes: np.ndarray,
    scratch: np.ndarray,
) -> np.ndarray:
    """Per row, True when it is the last row of its key: rows ``i`` with ``valid[i]``, key
    ``data[starts[i]:ends[i]]`` (an Arrow binary column: its offsets without the last and
    without the first).

    A 64-bit hash per key, then the rows are split by the hash's top bits into parts of
    about 8K rows (a stable counting sort: rows stay in order within a part), and each part
    gets its own open-addressing table (linear probing, at most half full) small enough to
    stay in cache: a random access per row into a table of the whole key space costs more
    than the rest of the pass. A slot holds the key's last row so far, its length, its hash
    and, for keys of up to 16 bytes, the key bytes themselves, so that a hit on a short key
    is decided by the slot alone; longer keys are compared byte for byte in ``data``.
    Exact whatever the hash does.

    Scratch space from the caller (fresh pages cost a fault each, pooled ones do not):
    ``hashes`` int64[n], ``scratch`` int64[5 n]."""
    n = valid.shape[0]
    bits = 0
    while (n >> bits) > _PART_ROWS:
        bits += 1
    shift = np.uint64(64 - bits) if bits else np.uint64(0)
    parts = 1 << bits
    counts = np.zeros(parts + 1, np.int64)
    for i in range(n):
        if valid[i]:
            h = _key_hash(data, starts[i], ends[i])
            hashes[i] = h
            part = np.int64(np.uint64(h) >> shift) if bits else 0
            counts[part + 1] += 1
    for p in range(parts):
        counts[p + 1] += counts[p]
    m = counts[parts]
    rows = scratch[:m]
    keyed = scratch[m : m * (_SLOT + 1)].reshape((m, _SLOT))  # length tag, hash, key 0-15
    fill = counts[:parts].copy()
    for i in range(n):
        if valid[i]:
            h = hashes[i]
            part = np.int64(np.uint64(h) >> shift) if bits else 0
            at = fill[part]
            fill[part] += 1
            rows[at] = i
            w0, w1 = _words(data, starts[i], ends[i])
            keyed[at, 0] = np.int64(min(ends[i] - starts[i], _INLINE + 1)) << _ROW_BITS
            keyed[at, 1] = h
            keyed[at, 2] = w0
            keyed[at, 3] = w1
    last = np.zeros(n, np.bool_)
    biggest = 0
    for p in range(parts):
        biggest = max(biggest, counts[p + 1] - counts[p])
    cap = 16
    while cap < 2 * biggest:
        cap *= 2
    table = np.empty(_SLOT * cap, np.int64)
    for p in range(parts):
        lo = counts[p]
        hi = counts[p + 1]
        if hi == lo:
            continue
        size = 16
        while size < 2 * (hi - lo):
            size *= 2
        mask = size - 1
        table[: _SLOT * size] = -1
        for at in range(lo, hi):
            tag = keyed[at, 0]
            h = keyed[at, 1]
            w0 = keyed[at, 2]
            w1 = keyed[at, 3]
            j = h & mask
            while True:
                slot = _SLOT * j
                head = table[slot]
                if head < 0:
                    table[slot] = at | tag
                    table[slot + 1] = h
                    table[slot + 2] = w0
                    table[slot + 3] = w1
                    break
                if (
                    table[slot + 1] == h
                    and (head & ~_ROW_MASK) == tag
                    and table[slot + 2] == w0
                    and table[slot + 3] == w1
                    and (
                        (tag >> _ROW_BITS) <= _INLINE
                        or _same_key(data, starts, ends, rows[head & _ROW_MASK], rows[at])
                    )
                ):
                    table[slot] = at | tag
                    break
                j = (j + 1) & mask
        for j in range(size):
            head = table[_SLOT * j]
            if head >= 0:
                last[rows[head & _ROW_MASK]] = True
    return last


_REASONS = {
    _BAD_VARINT: "a varint runs past its record",
    _BAD_LENGTH: "a record length is out of bounds",
    _TRAILING: "bytes left after the last record",
}


def make_selector(
    keep: np.ndarray,
) -> Callable[[bytes | memoryview, int, int], tuple[bytes, int, int]]:
    """The selector :func:`~logstore.storage.cleaner.rewrite_group` takes: ``(records section,
    base offset, record count) -> (kept records' bytes, how many, largest timestamp delta)``,
    for the sorted winning offsets ``keep``."""
    winners = np.ascontiguousarray(keep, dtype=np.int64)
    scratch = [np.empty(1 << 16, np.uint8)]  # reused: no allocation per batch

    def select(data: bytes | memoryview, base_offset: int, count: int) -> tuple[bytes, int, int]:
        src = np.frombuffer(data, np.uint8)
        if len(scratch[0]) < len(src):
            scratch[0] = np.empty(2 * len(src), np.uint8)
        out = scratch[0]
        status, written, kept, max_delta = select_records(src, count, base_offset, winners, out)
        if status != _OK:
            raise CorruptRecordError(
                f"batch at offset {base_offset}: {_REASONS.get(status, status)}"
            )
        return out[:written].tobytes(), int(kept), int(max_delta)

    return select
