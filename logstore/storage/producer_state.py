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

State is not persisted in snapshot files (Kafka's ``.snapshot``); after a restart it is
rebuilt by :meth:`rebuild_from_batches` from the batch headers of the log (headers only, no
decompression), which gives the same state because it is a pure function of the batches in
offset order. Control batches (transaction markers) only bump the epoch.

Thread-safety: none inside; the broker holds the partition's append lock around
check -> append -> update so the three are atomic with respect to other producers.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from logstore.errors import InvalidProducerEpochError, OutOfOrderSequenceError
from logstore.protocol.batch import BatchHeader

__all__ = [
    "BATCHES_RETAINED",
    "BatchMetadata",
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


@dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    epoch: int = NO_PRODUCER_EPOCH
    batches: collections.deque[BatchMetadata] = field(
        default_factory=lambda: collections.deque(maxlen=BATCHES_RETAINED)
    )

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

    def check(
        self, producer_id: int, producer_epoch: int, base_sequence: int, last_offset_delta: int
    ) -> BatchMetadata | None:
        """Validate one batch; returns the original batch when it is a duplicate.

        Raises :class:`InvalidProducerEpochError` / :class:`OutOfOrderSequenceError`.
        Batches without a producer id (``-1``) are never checked (returns None).
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
        if producer_epoch != entry.epoch:
            if first_seq != 0 and entry.epoch != NO_PRODUCER_EPOCH:
                raise OutOfOrderSequenceError(
                    f"{where}: producer {producer_id} new epoch {producer_epoch} starts at"
                    f" sequence {first_seq}, expected 0"
                )
            return None
        if entry.batches and not _in_sequence(entry.last_seq, first_seq):
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
        for a fenced epoch. Nothing is recorded: that is :meth:`append_batch`, after the append.
        """
        dup: BatchMetadata | None = None
        # pid -> (epoch, last sequence) of this request's earlier batches
        pending: dict[int, tuple[int, int]] = {}
        for i, (_pos, h) in enumerate(batches):
            pid = h.producer_id
            d: BatchMetadata | None = None
            if pid >= 0:
                earlier = pending.get(pid)
                if earlier is None:
                    d = self.check(pid, h.producer_epoch, h.base_sequence, h.last_offset_delta)
                elif h.producer_epoch != earlier[0] or not _in_sequence(
                    earlier[1], h.base_sequence
                ):
                    raise OutOfOrderSequenceError(
                        f"{self.topic}-{self.partition}: producer {pid} epoch {h.producer_epoch}"
                        f" sequence {h.base_sequence} does not follow its previous batch in the"
                        f" same request (epoch {earlier[0]}, sequence {earlier[1]})"
                    )
                if d is None:
                    pending[pid] = (
                        h.producer_epoch,
                        _last_seq(h.base_sequence, h.last_offset_delta),
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
        """Record one batch as appended at ``base_offset`` (control batches move the epoch)."""
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
        """A control batch (transaction marker): only the epoch moves."""
        if producer_id < 0:
            return
        entry = self.producers.setdefault(producer_id, ProducerEntry(producer_id))
        if producer_epoch > entry.epoch:
            entry.epoch = producer_epoch
            entry.batches.clear()

    def rebuild_from_batches(self, batches: Iterable[BatchHeader]) -> None:
        """Replay batch headers in offset order (``Log.iter_headers()``)."""
        self.producers.clear()
        for h in batches:
            self.append_batch(h, base_offset=h.base_offset, max_timestamp=h.max_timestamp)

    def truncate_below(self, log_start_offset: int) -> None:
        """Forget batches wholly below the log start offset (DeleteRecords, retention)."""
        for pid in list(self.producers):
            entry = self.producers[pid]
            while entry.batches and entry.batches[0].last_offset < log_start_offset:
                entry.batches.popleft()
