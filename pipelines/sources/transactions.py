"""Transactions in segment files: aborted ranges and the last stable offset (KIP-98), from the
batch headers alone.

A ``read_committed`` ingest must leave out every record of an aborted transaction and stop
each partition at its **last stable offset** (LSO): the first offset of the earliest
transaction still open at the high watermark. Nothing but the segment files is needed, so
it does not matter who wrote them (our broker, Kafka, a copy of either):

- a transactional data batch (attributes bit 4, not a control batch) of producer ``P``
  belongs to ``P``'s current transaction, which ends at ``P``'s **next** ABORT or COMMIT
  marker (a control batch, attributes bit 5, whose record key holds the type; the marker's
  epoch is not compared: Kafka's markers end the producer id's transaction whatever the
  epoch, a fencing abort carries a bumped one). So the fate of a batch is decided by looking
  *forward* in its producer's batches, never back: a scan may start anywhere (the ingest
  progress, a log start after retention, a rewind point), and a transaction that began
  below the start is still judged right for its batches above it;
- a data batch whose producer has no marker after it below the high watermark is **open**;
  the LSO is the smallest first offset (at or above the start) of an open transaction, or
  the high watermark when none is open. Markers at or above the high watermark do not count
  (not yet replicated, not stable);
- non-transactional batches are always visible; a control batch that is no ABORT/COMMIT
  (KRaft types) or whose key cannot be read ends nothing (its transaction stays open: the
  safe side, see :func:`pipelines.decode.transactions.marker_types`).

How a run uses it (:mod:`pipelines.ingest.committed`):

1. the records pass walks each range with the records reader (:func:`pipelines.sources.read.
   read_records`: chunked reads, CRC checks, resynchronisation after damage) and, from the
   same chunks before any record is decoded, keeps the transactional data batches and
   markers in the offset window ``[start, high watermark)``
   (:func:`pipelines.decode.transactions.txn_frames`; :func:`~pipelines.sources.read.
   read_txn_frames` is that walk alone), returned as :class:`TxnEvents` compacted per
   producer (consecutive data batches of one producer with no marker between them are one
   span): O(transactions) numbers per range, not O(batches);
2. the driver concatenates a partition's events (any order: offsets only grow in a
   partition, so sorting by ``(producer, offset)`` restores each producer's sequence) and
   :func:`resolve` classifies every span by the marker after it — all numpy, no Python step
   per batch or per transaction;
3. a partition with an aborted or an open transaction is read again only below its LSO,
   every task getting the aborted ranges that overlap its segment; :meth:`AbortedRanges.mask`
   drops the batches inside them (numpy, one sort per chunk) before any record is decoded.

Cost: nothing is read for transactions alone. Until 11-28 step 1 was a pre-pass (a Spark job
of its own over the same bytes: sequential ``preadv``, the CRC check, the header walk), 6-16%
of every run (``tests/perf/bench_ingest_txn.py``, local[2], on a shared machine), also of the
runs over logs without any transaction; step 1 now rides on the records pass, and only the
tasks of partitions that need a mask or a cut are read twice. The ``.txnindex`` files only
*predict* the aborted ranges (:func:`pipelines.ingest.committed.indexed_aborts`): they list
aborted transactions, not the open ones the LSO needs (Kafka keeps those in its in-memory
producer state), and a log may have none (written before such an index existed, or copied
without it), so the walk is needed anyway and judges the prediction. A partition
held at its LSO has its bytes above the LSO walked again by every run until the transaction
ends.

A marker lost to damage leaves its transaction open: the partition stops at that
transaction's first offset until the log is repaired (never a record of an unknown fate in
``records``).

Pure numpy here (no numba, no reader): the driver imports this module.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipelines.sources.aborted import AbortedRanges, as_int64

__all__ = [
    "AbortedRanges",  # defined in pipelines.sources.aborted; part of PartitionTxns
    "PartitionTxns",
    "TxnEvents",
    "resolve",
]

TopicPartition = tuple[str, int]
KIND_DATA = 0
KIND_COMMIT = 1
KIND_ABORT = 2
_NONE = -9  # no next event of the same producer


@dataclass(frozen=True)
class TxnEvents:
    """Transactional data spans and markers: ``kind[i]`` (0 data, 1 COMMIT, 2 ABORT) of
    producer ``producer_id[i]`` covering offsets ``[first[i], last[i]]``."""

    producer_id: np.ndarray
    kind: np.ndarray
    first: np.ndarray
    last: np.ndarray

    @staticmethod
    def of(
        producer_id: Iterable[int] | np.ndarray,
        kind: Iterable[int] | np.ndarray,
        first: Iterable[int] | np.ndarray,
        last: Iterable[int] | np.ndarray,
    ) -> TxnEvents:
        out = TxnEvents(
            as_int64(producer_id), np.asarray(kind, np.int8), as_int64(first), as_int64(last)
        )
        n = out.producer_id.shape[0]
        if not out.kind.shape[0] == out.first.shape[0] == out.last.shape[0] == n:
            raise ValueError("TxnEvents columns differ in length")
        return out

    def __len__(self) -> int:
        return int(self.producer_id.shape[0])

    @staticmethod
    def concat(parts: Sequence[TxnEvents]) -> TxnEvents:
        if not parts:
            return TxnEvents.of([], [], [], [])
        return TxnEvents.of(
            np.concatenate([p.producer_id for p in parts]),
            np.concatenate([p.kind for p in parts]),
            np.concatenate([p.first for p in parts]),
            np.concatenate([p.last for p in parts]),
        )

    def compact(self) -> TxnEvents:
        """Sorted by ``(producer, offset)``; each producer's consecutive data spans with no
        marker between them merged into one (they belong to one transaction)."""
        if not len(self):
            return self
        order = np.lexsort((self.first, self.producer_id))
        pid, kind = self.producer_id[order], self.kind[order]
        first, last = self.first[order], self.last[order]
        new = np.ones(pid.shape[0], np.bool_)
        new[1:] = (pid[1:] != pid[:-1]) | (kind[1:] != KIND_DATA) | (kind[:-1] != KIND_DATA)
        starts = np.flatnonzero(new)
        last = np.maximum.reduceat(last, starts)
        return TxnEvents(pid[starts], kind[starts], first[starts], last)

    def to_json(self) -> dict[str, list[int]]:
        return {
            "producer_id": self.producer_id.tolist(),
            "kind": self.kind.tolist(),
            "first": self.first.tolist(),
            "last": self.last.tolist(),
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> TxnEvents:
        return TxnEvents.of(data["producer_id"], data["kind"], data["first"], data["last"])


@dataclass(frozen=True)
class PartitionTxns:
    """What :func:`resolve` found in one partition's window: the aborted ranges, the first
    offset of the earliest open transaction (``open_from``; None: none open, the LSO is the
    high watermark), and counts for the run's summary."""

    aborted: AbortedRanges
    open_from: int | None
    committed: int
    open: int

    def lso(self, high_watermark: int) -> int:
        return high_watermark if self.open_from is None else min(self.open_from, high_watermark)


def resolve(events: TxnEvents) -> PartitionTxns:
    """Classify every data span of one partition by its producer's next marker."""
    ev = events.compact()
    n = len(ev)
    nxt = np.full(n, _NONE, np.int8)
    marker_at = ev.last.copy()
    if n > 1:
        same = ev.producer_id[1:] == ev.producer_id[:-1]
        nxt[:-1] = np.where(same, ev.kind[1:], _NONE)
        marker_at[:-1] = np.where(same, ev.first[1:], ev.last[:-1])
    data = ev.kind == KIND_DATA
    aborted = data & (nxt == KIND_ABORT)
    opened = data & (nxt == _NONE)
    # An aborted range reaches its ABORT marker: by the rule, every transactional batch of
    # the producer between its first batch and the marker is of that transaction.
    return PartitionTxns(
        aborted=AbortedRanges(ev.producer_id[aborted], ev.first[aborted], marker_at[aborted]),
        open_from=int(ev.first[opened].min()) if opened.any() else None,
        committed=int((data & (nxt == KIND_COMMIT)).sum()),
        open=int(opened.sum()),
    )
