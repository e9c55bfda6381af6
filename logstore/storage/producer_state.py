"""Per-partition producer state for idempotent produce (KIP-98), as Kafka keeps it.

For every producer id seen in a partition: its epoch and the metadata of its last
``BATCHES_RETAINED`` (5, Kafka's ``NUM_BATCHES_TO_RETAIN``: the client's
``max.in.flight.requests.per.connection`` limit with idempotence) batches — first/last
sequence, first/last offset, max timestamp. Before a batch from an idempotent producer
(``producerId >= 0``) is appended the broker calls :meth:`ProducerStateManager.check`:

- a batch whose (first, last) sequence equals a retained one of the same epoch is a
  **duplicate** (a retry of a batch already written): it is acknowledged with the original
  offsets and not appended again;
- an older epoch is fenced: :class:`InvalidProducerEpochError` (``INVALID_PRODUCER_EPOCH``);
- a new epoch must start at sequence 0 unless the producer is unknown here;
- otherwise the first sequence must follow the last one (``last + 1``, wrapping from
  ``2**31 - 1`` to 0): else :class:`OutOfOrderSequenceError`
  (``OUT_OF_ORDER_SEQUENCE_NUMBER``).

After a successful append :meth:`update` records the batch with its assigned offsets.

The partition (:mod:`logstore.storage.partition`) uses the request-level pair:
:meth:`check_batches` validates all batches of one produce request at once (a later batch of
the same producer in the request must follow the earlier one; a request is either wholly a
duplicate or wholly new), and :meth:`append_batch` records one appended batch — the same step
:meth:`rebuild_from_batches` replays, so live and rebuilt state cannot differ.

Transactions (KIP-98): a transactional batch (attributes bit 4) opens its producer's
transaction at the batch's first offset unless one is open already
(:attr:`ProducerEntry.current_txn_first_offset`, Kafka's ``currentTxnFirstOffset``); while it is
open, a non-transactional batch of that producer is :class:`InvalidTxnStateError`
(``INVALID_TXN_STATE``). A COMMIT or ABORT marker (:meth:`complete_txn`) closes it and returns
the :class:`CompletedTxn` with the last stable offset right after it (for the ``.txnindex``
entry of an ABORT). A marker is checked first (:meth:`check_marker`): an older producer epoch
is :class:`InvalidProducerEpochError`, an older coordinator epoch
:class:`TransactionCoordinatorFencedError`; a newer producer epoch moves the producer to it (the
coordinator fencing a zombie), which then must start again at sequence 0. :attr:`ongoing` maps
producer id -> first offset of each open transaction, in first-offset order (appends come in
offset order), so the oldest one bounds the last stable offset.

After a restart the state is rebuilt by :meth:`replay` of every batch header from a snapshot
(or the log start) on, in offset order: a pure function of the batches, so live and rebuilt
state cannot differ. Control batches need their record (ABORT or COMMIT), which the caller
decodes (one small uncompressed record per marker).

Thread-safety: none inside; the broker holds the partition's append lock around
check -> append -> update so the three are atomic with respect to other producers. Readers
without the lock use :attr:`ProducerStateManager.first_unstable_offset` only (one attribute,
replaced whole).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from logstore.errors import (
    InvalidProducerEpochError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    TransactionCoordinatorFencedError,
)
from logstore.protocol.batch import TRANSACTIONAL_FLAG, BatchHeader
from logstore.protocol.control import ControlRecord, ControlType
from logstore.storage.producer_snapshot import SnapshotEntry

__all__ = [
    "BATCHES_RETAINED",
    "BatchMetadata",
    "CompletedTxn",
    "InvalidProducerEpochError",
    "OutOfOrderSequenceError",
    "ProducerEntry",
    "ProducerStateManager",
]

BATCHES_RETAINED: Final = 5
_INT32_MAX: Final = 2**31 - 1
NO_PRODUCER_EPOCH: Final = -1


class BatchMetadata(NamedTuple):
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    max_timestamp: int


class CompletedTxn(NamedTuple):
    """A transaction ended by a marker (Kafka's ``CompletedTxn``): ``first_offset`` is the
    transaction's first offset in this partition (the marker's own offset when no transaction
    was open: a coordinator's retry), ``last_offset`` the marker's offset;
    ``last_stable_offset`` is the partition's last stable offset once it completed (the first
    offset of the oldest other open transaction, else ``last_offset + 1``)."""

    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool
    last_stable_offset: int


@dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    epoch: int = NO_PRODUCER_EPOCH
    batches: collections.deque[BatchMetadata] = field(
        default_factory=lambda: collections.deque(maxlen=BATCHES_RETAINED)
    )
    # the epoch of the coordinator that wrote this producer's last marker (-1: none yet)
    coordinator_epoch: int = -1
    # first offset of the producer's open transaction in this partition; -1: none open
    current_txn_first_offset: int = -1
    # timestamp of the producer's last batch or marker (Kafka keeps it for expiry)
    last_timestamp: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1


def _in_sequence(last_seq: int, first_seq: int) -> bool:
    return first_seq == last_seq + 1 or (first_seq == 0 and last_seq == _INT32_MAX)


def _last_seq(base_sequence: int, last_offset_delta: int) -> int:
    return (base_sequence + last_offset_delta) % (_INT32_MAX + 1)


class ProducerStateManager:
    """Producer entries of one partition (see the module docstring)."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.producers: dict[int, ProducerEntry] = {}
        # producer id -> first offset of its open transaction, oldest first
        self.ongoing: dict[int, int] = {}
        # the first offset of the oldest open transaction (None: none is open); a plain
        # attribute set by the writer, so that lockless readers (fetch) never iterate `ongoing`
        self.first_unstable_offset: int | None = None

    def _ongoing_changed(self) -> None:
        self.first_unstable_offset = next(iter(self.ongoing.values()), None)

    def check(
        self,
        producer_id: int,
        producer_epoch: int,
        base_sequence: int,
        last_offset_delta: int,
        *,
        transactional: bool = False,
    ) -> BatchMetadata | None:
        """Validate one batch; returns the original batch when it is a duplicate.

        Raises :class:`InvalidProducerEpochError` / :class:`OutOfOrderSequenceError`, and
        :class:`InvalidTxnStateError` for a non-transactional batch while the producer's
        transaction is open. Batches without a producer id (``-1``) are never checked.
        """
        if producer_id < 0:
            return None
        entry = self.producers.get(producer_id)
        first_seq = base_sequence
        last_seq = _last_seq(base_sequence, last_offset_delta)
        where = f"{self.topic}-{self.partition}"
        if entry is None:
            return None
        if producer_epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"{where}: producer {producer_id} epoch {producer_epoch} is older than the"
                f" current epoch {entry.epoch}"
            )
        if producer_epoch == entry.epoch:
            for b in entry.batches:
                if b.first_seq == first_seq and b.last_seq == last_seq:
                    return b
        if not transactional and entry.current_txn_first_offset >= 0:
            raise InvalidTxnStateError(
                f"{where}: non-transactional batch from producer {producer_id} while its"
                f" transaction from offset {entry.current_txn_first_offset} is open"
            )
        if producer_epoch != entry.epoch:
            if first_seq != 0 and entry.epoch != NO_PRODUCER_EPOCH:
                raise OutOfOrderSequenceError(
                    f"{where}: producer {producer_id} new epoch {producer_epoch} starts at"
                    f" sequence {first_seq}, expected 0"
                )
            return None
        # an epoch moved by a marker (no batch of it yet) starts at sequence 0, as in Kafka
        if not _in_sequence(entry.last_seq, first_seq):
            raise OutOfOrderSequenceError(
                f"{where}: producer {producer_id} epoch {producer_epoch}: sequence {first_seq}"
                f" does not follow {entry.last_seq}"
            )
        return None

    def check_batches(self, batches: Sequence[tuple[int, BatchHeader]]) -> BatchMetadata | None:
        """Validate every batch of one request (``(position, header)`` pairs, in order).

        Returns the original of the first batch when the request is a retry of batches
        already written (all of them duplicates), None when all are new. Raises
        :class:`OutOfOrderSequenceError` for a gap, for a later batch of a producer that does
        not follow its earlier batch in the same request, and for duplicates mixed with new
        batches (Kafka would drop the new ones silently); :class:`InvalidProducerEpochError`
        for a fenced epoch; :class:`InvalidTxnStateError` for a non-transactional batch of a
        producer with an open transaction. Nothing is recorded: that is :meth:`append_batch`,
        after the append.
        """
        dup: BatchMetadata | None = None
        # pid -> (epoch, last sequence, transactional) of this request's earlier batches
        pending: dict[int, tuple[int, int, bool]] = {}
        for i, (_pos, h) in enumerate(batches):
            pid = h.producer_id
            txn = bool(h.attributes & TRANSACTIONAL_FLAG)
            d: BatchMetadata | None = None
            if pid >= 0:
                earlier = pending.get(pid)
                if earlier is None:
                    d = self.check(
                        pid,
                        h.producer_epoch,
                        h.base_sequence,
                        h.last_offset_delta,
                        transactional=txn,
                    )
                elif h.producer_epoch != earlier[0] or not _in_sequence(
                    earlier[1], h.base_sequence
                ):
                    raise OutOfOrderSequenceError(
                        f"{self.topic}-{self.partition}: producer {pid} epoch {h.producer_epoch}"
                        f" sequence {h.base_sequence} does not follow its previous batch in the"
                        f" same request (epoch {earlier[0]}, sequence {earlier[1]})"
                    )
                elif earlier[2] and not txn:
                    raise InvalidTxnStateError(
                        f"{self.topic}-{self.partition}: non-transactional batch from producer"
                        f" {pid} after its transactional batch in the same request"
                    )
                if d is None:
                    pending[pid] = (
                        h.producer_epoch,
                        _last_seq(h.base_sequence, h.last_offset_delta),
                        txn or (earlier is not None and earlier[2]),
                    )
            if i == 0:
                dup = d
            elif (d is None) != (dup is None):
                raise OutOfOrderSequenceError(
                    f"{self.topic}-{self.partition}: a retried (duplicate) batch mixed with new"
                    " batches in one request"
                )
        return dup

    def append_batch(self, h: BatchHeader, *, base_offset: int, max_timestamp: int) -> None:
        """Record one appended data batch at ``base_offset``; a transactional one opens its
        producer's transaction. A control batch only moves the epoch here: markers go through
        :meth:`complete_txn` (or :meth:`replay`, which knows their type)."""
        if h.producer_id < 0:
            return
        if h.is_control:
            self.update_control(h.producer_id, h.producer_epoch)
            return
        self.update(
            h.producer_id,
            h.producer_epoch,
            h.base_sequence,
            h.last_offset_delta,
            first_offset=base_offset,
            last_offset=base_offset + h.last_offset_delta,
            max_timestamp=max_timestamp,
        )
        if h.attributes & TRANSACTIONAL_FLAG:
            entry = self.producers[h.producer_id]
            if entry.current_txn_first_offset < 0:
                entry.current_txn_first_offset = base_offset
                self.ongoing[h.producer_id] = base_offset
                self._ongoing_changed()

    def update(
        self,
        producer_id: int,
        producer_epoch: int,
        base_sequence: int,
        last_offset_delta: int,
        *,
        first_offset: int,
        last_offset: int,
        max_timestamp: int,
    ) -> None:
        """Record an appended batch (its offsets as assigned by the log)."""
        if producer_id < 0:
            return
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = self.producers[producer_id] = ProducerEntry(producer_id)
        if producer_epoch != entry.epoch:
            entry.epoch = producer_epoch
            entry.batches.clear()
        entry.last_timestamp = max_timestamp
        if base_sequence < 0:
            return
        entry.batches.append(
            BatchMetadata(
                base_sequence,
                _last_seq(base_sequence, last_offset_delta),
                first_offset,
                last_offset,
                max_timestamp,
            )
        )

    def update_control(self, producer_id: int, producer_epoch: int) -> None:
        """A control batch of unknown type: only the epoch moves."""
        if producer_id < 0:
            return
        entry = self.producers.setdefault(producer_id, ProducerEntry(producer_id))
        if producer_epoch > entry.epoch:
            entry.epoch = producer_epoch
            entry.batches.clear()

    def check_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> None:
        """Validate a COMMIT/ABORT marker before it is written (Kafka's
        ``appendEndTxnMarker`` checks): :class:`InvalidProducerEpochError` for an epoch older
        than the producer's, :class:`TransactionCoordinatorFencedError` for a coordinator epoch
        older than the one of the producer's last marker."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return
        where = f"{self.topic}-{self.partition}"
        if producer_epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"{where}: marker for producer {producer_id} epoch {producer_epoch} is older than"
                f" the current epoch {entry.epoch}"
            )
        if coordinator_epoch < entry.coordinator_epoch:
            raise TransactionCoordinatorFencedError(
                f"{where}: marker for producer {producer_id} from coordinator epoch"
                f" {coordinator_epoch}, older than {entry.coordinator_epoch}"
            )

    def complete_txn(
        self,
        producer_id: int,
        producer_epoch: int,
        *,
        commit: bool,
        coordinator_epoch: int,
        offset: int,
        timestamp: int,
    ) -> CompletedTxn:
        """Record a marker written at ``offset``: the producer's open transaction (if any)
        ends; its epoch moves up to ``producer_epoch`` (batches then start at sequence 0)."""
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = self.producers[producer_id] = ProducerEntry(producer_id)
        if producer_epoch > entry.epoch:
            entry.epoch = producer_epoch
            entry.batches.clear()
        entry.coordinator_epoch = coordinator_epoch
        entry.last_timestamp = timestamp
        first = entry.current_txn_first_offset
        entry.current_txn_first_offset = -1
        self.ongoing.pop(producer_id, None)
        self._ongoing_changed()
        lso = self.first_unstable_offset
        return CompletedTxn(
            producer_id,
            first if first >= 0 else offset,
            offset,
            not commit,
            offset + 1 if lso is None else lso,
        )

    def replay(self, h: BatchHeader, control: ControlRecord | None = None) -> CompletedTxn | None:
        """Apply one batch of the log in offset order (recovery, rebuild). ``control`` is the
        decoded record of a control batch; a COMMIT/ABORT marker returns its
        :class:`CompletedTxn`."""
        if h.producer_id < 0:
            return None
        if h.is_control:
            if control is None or not control.is_transaction_marker:
                self.update_control(h.producer_id, h.producer_epoch)
                return None
            return self.complete_txn(
                h.producer_id,
                h.producer_epoch,
                commit=control.type == ControlType.COMMIT,
                coordinator_epoch=control.coordinator_epoch or 0,
                offset=h.base_offset,
                timestamp=h.max_timestamp,
            )
        self.append_batch(h, base_offset=h.base_offset, max_timestamp=h.max_timestamp)
        return None

    def rebuild_from_batches(self, batches: Iterable[BatchHeader]) -> None:
        """Replay batch headers in offset order (control batches' types unknown: epochs only)."""
        self.clear()
        for h in batches:
            self.append_batch(h, base_offset=h.base_offset, max_timestamp=h.max_timestamp)

    def clear(self) -> None:
        self.producers.clear()
        self.ongoing.clear()
        self._ongoing_changed()

    def snapshot_entries(self) -> list[SnapshotEntry]:
        """Every producer as a ``.snapshot`` entry (its last batch only, as Kafka keeps)."""
        out = []
        for pid, e in list(self.producers.items()):
            last = e.batches[-1] if e.batches else None
            out.append(
                SnapshotEntry(
                    pid,
                    e.epoch,
                    -1 if last is None else last.last_seq,
                    -1 if last is None else last.last_offset,
                    0 if last is None else last.last_offset - last.first_offset,
                    e.last_timestamp,
                    e.coordinator_epoch,
                    e.current_txn_first_offset,
                )
            )
        return out

    def load_snapshot_entries(self, entries: Iterable[SnapshotEntry]) -> None:
        """Replace the state with a snapshot's entries (open transactions in offset order)."""
        self.clear()
        for s in entries:
            e = ProducerEntry(
                s.producer_id,
                s.epoch,
                coordinator_epoch=s.coordinator_epoch,
                current_txn_first_offset=s.current_txn_first_offset,
                last_timestamp=s.timestamp,
            )
            if s.last_offset >= 0:
                e.batches.append(
                    BatchMetadata(
                        (s.last_sequence - s.offset_delta) % (_INT32_MAX + 1),
                        s.last_sequence,
                        s.last_offset - s.offset_delta,
                        s.last_offset,
                        s.timestamp,
                    )
                )
            self.producers[s.producer_id] = e
        for pid, first in sorted(
            ((p, e.current_txn_first_offset) for p, e in self.producers.items()),
            key=lambda t: t[1],
        ):
            if first >= 0:
                self.ongoing[pid] = first
        self._ongoing_changed()

    def truncate_below(self, log_start_offset: int) -> None:
        """Forget batches wholly below the log start offset (DeleteRecords, retention); a
        producer left with no batch and no open transaction is forgotten (any sequence is then
        accepted from it, as Kafka does for a producer it no longer knows)."""
        for pid in list(self.producers):
            entry = self.producers[pid]
            had = bool(entry.batches)
            while entry.batches and entry.batches[0].last_offset < log_start_offset:
                entry.batches.popleft()
            if had and not entry.batches and entry.current_txn_first_offset < 0:
                del self.producers[pid]
