"""The aborted transactions of one partition, as the records reader applies them to a chunk.

Why a module of its own: the reader (:mod:`pipelines.sources.read`) needs
:class:`AbortedRanges`, and the driver's :mod:`pipelines.sources.transactions` (which once ran
a pre-pass with the reader's walk, and the two imported each other) must stay free of the
reader and its compiled kernels. This module imports neither. Pure numpy, picklable (the
driver ships it to executors).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

__all__ = ["AbortedRanges", "as_int64"]


def as_int64(values: Iterable[int] | np.ndarray) -> np.ndarray:
    """``values`` as an int64 array (an array is converted without a Python list)."""
    return np.asarray(values if isinstance(values, np.ndarray) else list(values), np.int64)


@dataclass(frozen=True)
class AbortedRanges:
    """Aborted transactions of one partition: producer ``producer_id[i]``'s transactional
    batches with base offsets in ``[first[i], last[i]]`` are aborted (``first``: the
    transaction's first batch in the window read; ``last``: its ABORT marker). Sorted by
    ``(producer, first)``; one producer's ranges never overlap. Picklable (numpy arrays)."""

    producer_id: np.ndarray
    first: np.ndarray
    last: np.ndarray

    @staticmethod
    def of(
        producer_id: Iterable[int] | np.ndarray,
        first: Iterable[int] | np.ndarray,
        last: Iterable[int] | np.ndarray,
    ) -> AbortedRanges:
        pid, lo, hi = as_int64(producer_id), as_int64(first), as_int64(last)
        order = np.lexsort((lo, pid))
        return AbortedRanges(pid[order], lo[order], hi[order])

    def __len__(self) -> int:
        return int(self.producer_id.shape[0])

    def overlapping(self, low: int, high: int | None) -> AbortedRanges:
        """The ranges that reach offsets ``[low, high)`` (``high`` None: no upper bound)."""
        keep = self.last >= low
        if high is not None:
            keep &= self.first < high
        return AbortedRanges(self.producer_id[keep], self.first[keep], self.last[keep])

    def mask(
        self, producer_id: np.ndarray, base_offset: np.ndarray, transactional: np.ndarray
    ) -> np.ndarray:
        """True for each batch (arrays of a chunk's headers) that is transactional and lies
        in an aborted range of its producer. One merge sort of ranges and batches by
        ``(producer, offset)``: each batch meets the last range that starts at or before it."""
        n = producer_id.shape[0]
        out = np.zeros(n, np.bool_)
        idx = np.flatnonzero(transactional)
        m = len(self)
        if not idx.shape[0] or not m:
            return out
        pid = np.concatenate([self.producer_id, producer_id[idx].astype(np.int64)])
        off = np.concatenate([self.first, base_offset[idx].astype(np.int64)])
        tag = np.concatenate([np.zeros(m, np.int8), np.ones(idx.shape[0], np.int8)])
        order = np.lexsort((tag, off, pid))  # a range sorts before a batch at its first offset
        # ranges are already in (producer, first) order: their indexes grow along ``order``
        latest = np.maximum.accumulate(np.where(order < m, order, -1))
        where = np.empty_like(order)
        where[order] = np.arange(order.shape[0])
        r = latest[where[m:]]
        has = r >= 0
        rr = np.where(has, r, 0)
        hit = has & (self.producer_id[rr] == pid[m:]) & (off[m:] <= self.last[rr])
        out[idx] = hit
        return out
