"""Find a few keys among many rows: a hash table on the few, probed by the many (numba,
``cache=True``).

An incremental merge matches each bucket's new winners (one row per ``(partition, key)``, a
few) against the bucket's current rows (many: the whole bucket), to find the row each winner
replaces. :class:`KeyIndex` is built once on the winners (open addressing, a table of twice
their count, so it stays in cache) and probed by every current row in one compiled pass over
the rows' Arrow buffers, read in place: the row's hash (its key's bytes, the partition mixed
in), then a one-bit-per-hash filter (16 bits per indexed row: most probes that miss stop
there, in cache), then the slots from the hash's one on. A slot holds the upper bits of its
row's hash as a tag, so a probe that passed the filter by chance stops without touching a
key; a tag match is confirmed by the partition and the key bytes. No Python and no
allocation per probed row: the one output is per indexed row.

The hash is this module's own (nothing outside this process sees it): a multiply-rotate over
the key's 8-byte little-endian words and its zero-padded tail, then the partition, finished
with MurmurHash3's ``fmix64``.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from numba import njit

from pipelines.decode.arrow import one_array

__all__ = ["KeyIndex"]

_M1 = np.uint64(0x9E3779B185EBCA87)
_M2 = np.uint64(0xC2B2AE3D27D4EB4F)
_M3 = np.uint64(0xFF51AFD7ED558CCD)
_M4 = np.uint64(0xC4CEB9FE1A85EC53)
# a slot: the upper bits of its row's hash (a tag) over the row's index; -1 when empty (a
# tag's top bit is always clear)
_TAG = np.int64(0x7FFFFFFF00000000)
_ROW = np.int64(0xFFFFFFFF)


@njit(cache=True, nogil=True, inline="always")
def _hash(part: np.int32, data: np.ndarray, start: np.int64, end: np.int64) -> np.uint64:
    h = np.uint64(end - start) * _M1
    i = start
    while i < end:
        w = np.uint64(0)
        stop = min(i + 8, end)
        shift = np.uint64(0)
        while i < stop:
            w |= np.uint64(data[i]) << shift
            shift += np.uint64(8)
            i += 1
        h ^= w * _M2
        h = ((h << np.uint64(31)) | (h >> np.uint64(33))) * _M1
    h ^= np.uint64(np.int64(part) & 0xFFFFFFFF) * _M2
    h ^= h >> np.uint64(33)
    h *= _M3
    h ^= h >> np.uint64(33)
    h *= _M4
    h ^= h >> np.uint64(33)
    return h


@njit(cache=True, nogil=True, inline="always")
def _tag(h: np.uint64) -> np.int64:
    return (np.int64(h >> np.uint64(32)) << np.int64(32)) & _TAG


@njit(cache=True, nogil=True, inline="always")
def _bit(h: np.uint64, bits: np.ndarray) -> tuple[np.int64, np.uint64]:
    """The word and the bit of ``h`` in the filter (bits 24-63 of the hash: the slot number
    takes the low ones)."""
    b = (h >> np.uint64(24)) & np.uint64(len(bits) * 64 - 1)
    return np.int64(b >> np.uint64(6)), np.uint64(1) << (b & np.uint64(63))


@njit(cache=True, nogil=True)
def _build(  # noqa: PLR0917
    valid: np.ndarray,
    part: np.ndarray,
    offsets: np.ndarray,
    data: np.ndarray,
    slots: np.ndarray,
    bits: np.ndarray,
) -> None:
    mask = np.uint64(len(slots) - 1)
    for i in range(len(part)):
        if not valid[i]:
            continue
        h = _hash(part[i], data, np.int64(offsets[i]), np.int64(offsets[i + 1]))
        word, bit = _bit(h, bits)
        bits[word] |= bit
        s = h & mask
        while slots[s] >= 0:
            s = (s + np.uint64(1)) & mask
        slots[s] = _tag(h) | i


@njit(cache=True, nogil=True)
def _probe(  # noqa: PLR0917
    valid: np.ndarray,
    base: np.int64,
    part: np.ndarray,
    offsets: np.ndarray,
    data: np.ndarray,
    t_part: np.ndarray,
    t_offsets: np.ndarray,
    t_data: np.ndarray,
    slots: np.ndarray,
    bits: np.ndarray,
    out: np.ndarray,
) -> None:
    mask = np.uint64(len(slots) - 1)
    for r in range(len(part)):
        if not valid[r]:
            continue
        a0, a1 = np.int64(offsets[r]), np.int64(offsets[r + 1])
        h = _hash(part[r], data, a0, a1)
        word, bit = _bit(h, bits)
        if not bits[word] & bit:
            continue
        tag = _tag(h)
        s = h & mask
        while True:
            slot = slots[s]
            if slot < 0:
                break
            if slot & _TAG == tag:
                j = slot & _ROW
                b0, b1 = np.int64(t_offsets[j]), np.int64(t_offsets[j + 1])
                same = t_part[j] == part[r] and a1 - a0 == b1 - b0
                k = np.int64(0)
                while same and k < a1 - a0:
                    same = data[a0 + k] == t_data[b0 + k]
                    k += 1
                if same:
                    out[j] = base + r
                    break
            s = (s + np.uint64(1)) & mask


def _binary_buffers(keys: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, data) of a binary array, zero-copy (int32 or int64 offsets, sliced)."""
    if pa.types.is_binary(keys.type) or pa.types.is_string(keys.type):
        dtype: type = np.int32
    elif pa.types.is_large_binary(keys.type) or pa.types.is_large_string(keys.type):
        dtype = np.int64
    else:
        raise TypeError(f"keys must be binary, not {keys.type}")
    n = len(keys)
    buffers = keys.buffers()
    if buffers[1] is None or n == 0:
        return np.zeros(1, dtype=dtype), np.zeros(1, dtype=np.uint8)
    offsets = np.frombuffer(buffers[1], dtype=dtype)[keys.offset : keys.offset + n + 1]
    data = buffers[2]
    if data is None or data.size == 0:
        return offsets, np.zeros(1, dtype=np.uint8)
    return offsets, np.frombuffer(data, dtype=np.uint8)


def _valid(keys: pa.Array, rows: np.ndarray | None) -> np.ndarray:
    """Rows to use: ``rows`` (a bool mask), or all; never a null key."""
    valid = np.ones(len(keys), dtype=bool) if rows is None else np.array(rows, dtype=bool)
    if keys.null_count:
        valid &= np.asarray(keys.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    return valid


class KeyIndex:
    """The rows of ``(partition, keys)``, one per partition and key (nulls never match), to be
    found by :meth:`locate`."""

    def __init__(self, partition: np.ndarray, keys: pa.Array | pa.ChunkedArray) -> None:
        keys = one_array(keys)
        if len(partition) != len(keys):
            raise ValueError(f"{len(partition)} partitions for {len(keys)} keys")
        n = len(keys)
        if n > int(_ROW):
            raise ValueError(f"{n} keys: at most {int(_ROW)} fit a KeyIndex")
        self._keys = keys  # the buffers below point into it
        self._part = np.ascontiguousarray(partition, dtype=np.int32)
        self._offsets, self._data = _binary_buffers(keys)
        self._slots = np.full(1 << max(4, int(2 * n).bit_length()), -1, dtype=np.int64)
        # a bit per hash, 16 bits per row: most probes that miss stop at this filter (a
        # sixteenth of the table's size, so it stays in the fastest cache)
        self._bits = np.zeros(1 << max(0, int(16 * n).bit_length() - 6), dtype=np.uint64)
        _build(_valid(keys, None), self._part, self._offsets, self._data, self._slots,
               self._bits)  # fmt: skip

    def __len__(self) -> int:
        return len(self._part)

    def locate(
        self,
        partition: np.ndarray,
        keys: pa.Array | pa.ChunkedArray,
        out: np.ndarray,
        *,
        base: int = 0,
        rows: np.ndarray | None = None,
    ) -> None:
        """For each row ``i`` of ``(partition, keys)`` (only where the bool mask ``rows`` is
        True, when given) whose partition and key the index holds at row ``j``: ``out[j] =
        base + i`` (``out``: int64, one per indexed row)."""
        keys = one_array(keys)
        if len(partition) != len(keys) or (rows is not None and len(rows) != len(keys)):
            raise ValueError(f"{len(partition)} partitions for {len(keys)} keys")
        if len(out) != len(self._part):
            raise ValueError(f"out has {len(out)} rows, the index {len(self._part)}")
        if not len(self._part) or not len(keys):
            return
        offsets, data = _binary_buffers(keys)
        _probe(
            _valid(keys, rows),
            np.int64(base),
            np.ascontiguousarray(partition, dtype=np.int32),
            offsets,
            data,
            self._part,
            self._offsets,
            self._data,
            self._slots,
            self._bits,
            out,
        )
