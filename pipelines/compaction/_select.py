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

from collections.abc import Callable

import numpy as np
from numba import njit

from logstore.errors import CorruptRecordError

__all__ = ["make_selector", "select_records"]

_OK = 0
_BAD_VARINT = -1
_BAD_LENGTH = -2
_TRAILING = -3


@njit(cache=True, nogil=True)
def _zigzag(buf: np.ndarray, p: int, end: int) -> tuple:  # type: ignore[type-arg]
    """Zigzag varint (up to 10 bytes) at ``p`` before ``end``: (value, next, ok)."""
    u = np.uint64(0)
    shift = np.uint64(0)
    for i in range(10):
        q = p + i
        if q >= end:
            return np.int64(0), q, False
        b = buf[q]
        u |= np.uint64(b & 0x7F) << shift
        if b < 0x80:
            return np.int64(u >> np.uint64(1)) ^ -np.int64(u & np.uint64(1)), q + 1, True
        shift += np.uint64(7)
    return np.int64(0), p + 10, False


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
    max_delta = np.int64(-(2**63))
    for _ in range(count):
        length, q, ok = _zigzag(data, p, end)
        if not ok:
            return _BAD_VARINT, w, kept, max_delta
        record_end = q + length
        if length < 6 or record_end > end:
            return _BAD_LENGTH, w, kept, max_delta
        ts_delta, r, ok1 = _zigzag(data, q + 1, record_end)
        offset_delta, _after, ok2 = _zigzag(data, r, record_end)
        if not (ok1 and ok2):
            return _BAD_VARINT, w, kept, max_delta
        offset = base_offset + offset_delta
        while k < n_keep and keep[k] < offset:
            k += 1
        if k < n_keep and keep[k] == offset:
            out[w : w + (record_end - p)] = data[p:record_end]
            w += record_end - p
            kept += 1
            max_delta = max(max_delta, ts_delta)
        p = record_end
    if p != end:
        return _TRAILING, w, kept, max_delta
    return _OK, w, kept, max_delta


_REASONS = {
    _BAD_VARINT: "a varint runs past its record",
    _BAD_LENGTH: "a record length is out of bounds",
    _TRAILING: "bytes left after the last record",
}


def make_selector(keep: np.ndarray) -> Callable[[bytes, int, int], tuple[bytes, int, int]]:
    """The selector :func:`~logstore.storage.cleaner.rewrite_group` takes: ``(records section,
    base offset, record count) -> (kept records' bytes, how many, largest timestamp delta)``,
    for the sorted winning offsets ``keep``."""
    winners = np.ascontiguousarray(keep, dtype=np.int64)

    def select(data: bytes, base_offset: int, count: int) -> tuple[bytes, int, int]:
        src = np.frombuffer(data, np.uint8)
        out = np.empty(len(src), np.uint8)
        status, written, kept, max_delta = select_records(src, count, base_offset, winners, out)
        if status != _OK:
            raise CorruptRecordError(
                f"batch at offset {base_offset}: {_REASONS.get(status, status)}"
            )
        return out[:written].tobytes(), int(kept), int(max_delta)

    return select
