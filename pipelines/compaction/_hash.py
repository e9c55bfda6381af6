"""Spark's ``xxhash64`` of binary keys, computed in the Python worker (numba, ``cache=True``).

The topic table's bucket is ``pmod(xxhash64(key), N)`` as Spark computes it (XXH64, seed 42,
little-endian words: the standard algorithm). The direct merge path buckets records without
the JVM, so it must compute the same value; ``tests/unit/pipelines/compaction`` checks this
against Spark's own function on random keys of every length class (0-70 bytes).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from numba import njit

__all__ = ["SPARK_SEED", "buckets_of", "latest_indices", "xxhash64"]

SPARK_SEED = 42
_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_P4 = np.uint64(0x85EBCA77C2B2AE63)
_P5 = np.uint64(0x27D4EB2F165667C5)


@njit(cache=True, nogil=True, inline="always")
def _rotl(x: np.uint64, r: int) -> np.uint64:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


@njit(cache=True, nogil=True, inline="always")
def _word(data: np.ndarray, i: int) -> np.uint64:
    v = np.uint64(0)
    for j in range(8):
        v |= np.uint64(data[i + j]) << np.uint64(8 * j)
    return v


@njit(cache=True, nogil=True, inline="always")
def _round(acc: np.uint64, lane: np.uint64) -> np.uint64:
    acc = acc + lane * _P2
    return _rotl(acc, 31) * _P1


@njit(cache=True, nogil=True)
def _xxh64(data: np.ndarray, offsets: np.ndarray, seed: np.uint64, out: np.ndarray) -> None:
    for r in range(len(offsets) - 1):
        pos = np.int64(offsets[r])
        end = np.int64(offsets[r + 1])
        length = end - pos
        if length >= 32:
            limit = end - 32
            v1 = seed + _P1 + _P2
            v2 = seed + _P2
            v3 = seed
            v4 = seed - _P1
            while pos <= limit:
                v1 = _round(v1, _word(data, pos))
                v2 = _round(v2, _word(data, pos + 8))
                v3 = _round(v3, _word(data, pos + 16))
                v4 = _round(v4, _word(data, pos + 24))
                pos += 32
            h = _rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)
            for v in (v1, v2, v3, v4):
                h ^= _round(np.uint64(0), v)
                h = h * _P1 + _P4
        else:
            h = seed + _P5
        h += np.uint64(length)
        while pos + 8 <= end:
            h ^= _round(np.uint64(0), _word(data, pos))
            h = _rotl(h, 27) * _P1 + _P4
            pos += 8
        if pos + 4 <= end:
            k = np.uint64(0)
            for j in range(4):
                k |= np.uint64(data[pos + j]) << np.uint64(8 * j)
            h ^= k * _P1
            h = _rotl(h, 23) * _P2 + _P3
            pos += 4
        while pos < end:
            h ^= np.uint64(data[pos]) * _P5
            h = _rotl(h, 11) * _P1
            pos += 1
        h ^= h >> np.uint64(33)
        h *= _P2
        h ^= h >> np.uint64(29)
        h *= _P3
        h ^= h >> np.uint64(32)
        out[r] = h


def xxhash64(keys: pa.Array | pa.ChunkedArray, seed: int = SPARK_SEED) -> np.ndarray:
    """Spark's ``xxhash64(key)`` (int64) of every binary ``key``; nulls hash as ``seed``
    (Spark's rule: a null input leaves the seed unchanged)."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks() if keys.num_chunks != 1 else keys.chunk(0)
    keys = keys.cast(pa.large_binary())
    n = len(keys)
    out = np.empty(n, dtype=np.uint64)
    if n:
        all_offsets = np.frombuffer(keys.buffers()[1], dtype=np.int64)
        offsets = all_offsets[keys.offset : keys.offset + n + 1]
        buf = keys.buffers()[2]
        data = np.frombuffer(buf, dtype=np.uint8) if buf is not None else np.zeros(0, np.uint8)
        _xxh64(data, offsets, np.uint64(seed), out)
        if keys.null_count:
            valid = np.asarray(keys.is_valid().to_numpy(zero_copy_only=False))
            out[~valid] = np.uint64(seed)
    return out.view(np.int64)


def buckets_of(keys: pa.Array | pa.ChunkedArray, buckets: int) -> np.ndarray:
    """``pmod(xxhash64(key), buckets)`` as int32, Spark's bucket of every key."""
    return np.mod(xxhash64(keys), np.int64(buckets)).astype(np.int32)


@njit(cache=True, nogil=True)
def _latest(  # noqa: PLR0917
    rows: np.ndarray,
    part: np.ndarray,
    hashes: np.ndarray,
    offsets: np.ndarray,
    data: np.ndarray,
    has_v: np.ndarray,
    ver: np.ndarray,
    off: np.ndarray,
    slots: np.ndarray,
) -> None:
    mask = np.int64(len(slots) - 1)
    for i in rows:
        h = np.int64(hashes[i] ^ (np.int64(part[i]) * np.int64(-7046029254386353131)))
        s = h & mask
        while True:
            j = slots[s]
            if j < 0:
                slots[s] = i
                break
            same = part[j] == part[i] and hashes[j] == hashes[i]
            if same:
                a0, a1, b0, b1 = offsets[i], offsets[i + 1], offsets[j], offsets[j + 1]
                same = a1 - a0 == b1 - b0
                k = np.int64(0)
                while same and k < a1 - a0:
                    same = data[a0 + k] == data[b0 + k]
                    k += 1
            if same:
                # the model's order: a version beats none, then the greater version, then
                # the greater offset; a tie keeps the later row
                if has_v[i] != has_v[j]:
                    wins = has_v[i]
                elif has_v[i] and ver[i] != ver[j]:
                    wins = ver[i] > ver[j]
                else:
                    wins = off[i] >= off[j]
                if wins:
                    slots[s] = i
                break
            s = (s + 1) & mask


def latest_indices(  # noqa: PLR0917
    partition: np.ndarray,
    keys: pa.Array | pa.ChunkedArray,
    hashes: np.ndarray,
    has_version: np.ndarray,
    version: np.ndarray,
    offset: np.ndarray,
) -> np.ndarray:
    """Ascending row indices of the winners, one per ``(partition, key)`` among the rows with
    a key (``pipelines.compaction.plan.winner_indices``'s rule, in one pass: a hash table on
    ``hashes`` = :func:`xxhash64` of ``keys``, whose bytes are compared on a hash match)."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks() if keys.num_chunks != 1 else keys.chunk(0)
    keys = keys.cast(pa.large_binary())
    n = len(keys)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    rows = np.arange(n, dtype=np.int64)
    if keys.null_count:
        rows = rows[np.asarray(keys.is_valid().to_numpy(zero_copy_only=False))]
    offsets = np.frombuffer(keys.buffers()[1], dtype=np.int64)[keys.offset : keys.offset + n + 1]
    buf = keys.buffers()[2]
    data = np.frombuffer(buf, dtype=np.uint8) if buf is not None else np.zeros(1, np.uint8)
    slots = np.full(1 << max(4, int(2 * len(rows)).bit_length()), -1, dtype=np.int64)
    _latest(
        rows,
        np.ascontiguousarray(partition, dtype=np.int32),
        np.ascontiguousarray(hashes).view(np.uint64),
        offsets,
        data,
        np.ascontiguousarray(has_version, dtype=np.bool_),
        np.ascontiguousarray(version, dtype=np.int64),
        np.ascontiguousarray(offset, dtype=np.int64),
        slots,
    )
    return np.sort(slots[slots >= 0])
