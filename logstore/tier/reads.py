"""The remote log manager's reads (KIP-405), on the tier's reader pool: a Fetch below the local
log start (whole batches of the remote segment holding the offset, and the aborted
transactions overlapping them, as Kafka's ``collectAbortedTransactions``), ListOffsets by
timestamp below the local log start and -3 (max timestamp) over the remote segments.

A mixin of :class:`~logstore.tier.manager.RemoteLogManager` (its state: the live segments, the
log start offset, the :class:`~logstore.tier.reader.SegmentReader`; see that module's docstring
for the reads' design and errors). Every method that reads the store waits for it: call it on
the reader pool, never on a network thread; store errors are logged (with the segment) and
raised. Thread-safe: the state is read through snapshots.
"""

from __future__ import annotations

import bisect
import logging
from typing import Protocol

from logstore.errors import LoglakeError, OffsetOutOfRangeError
from logstore.storage.log_manager import LogManager
from logstore.storage.txn_index import TxnSearchResult
from logstore.tier.metadata import RemoteSegment
from logstore.tier.reader import SegmentReader

__all__ = ["RemoteReads"]

_log = logging.getLogger(__name__)


class _Manager(Protocol):
    """What the reads use of the remote log manager."""

    reader: SegmentReader
    _logs: LogManager

    def live_segments(self, topic: str, partition: int) -> list[RemoteSegment]: ...

    def log_start_offset(self, topic: str, partition: int, local_start: int) -> int: ...

    def _aborted(
        self, topic: str, partition: int, segments: list[RemoteSegment], start: int, upper: int
    ) -> list[tuple[int, int]]: ...


class RemoteReads:
    """The reads of :class:`~logstore.tier.manager.RemoteLogManager` (module docstring)."""

    def read(
        self: _Manager, topic: str, partition: int, offset: int, max_bytes: int, *, max_offset: int
    ) -> tuple[bytes, list[tuple[int, int]]]:
        """Whole batches from ``offset`` (at least one, then up to ``max_bytes``) out of the
        remote segment holding it, none at or above ``max_offset``; and the aborted
        transactions ``(producer id, first offset)`` overlapping them (:meth:`_aborted`).
        :class:`OffsetOutOfRangeError` when no live remote segment holds ``offset``;
        :class:`ObjectStoreError` (``ObjectNotFoundError`` for a missing object) from the
        store. Waits for the store: call on the reader pool."""
        live = self.live_segments(topic, partition)
        starts = [s.start_offset for s in live]
        i = bisect.bisect_right(starts, offset) - 1
        if i < 0 or offset > live[i].end_offset:
            raise OffsetOutOfRangeError(
                f"{topic}-{partition}: offset {offset} is in no remote segment"
            )
        seg = live[i]
        try:
            out = self.reader.read(seg, offset, max_bytes, max_offset=max_offset)
            if out is None:
                return b"", []
            body, first, last = out
            return body, self._aborted(topic, partition, live[i:], first, last + 1)
        except LoglakeError as exc:  # the store, a manifest or bytes that do not parse
            _log.error(
                "%s-%d: remote read of offset %d failed (segment %s): %s",
                topic,
                partition,
                offset,
                seg.segment_id,
                exc,
            )
            raise

    def _aborted(
        self: _Manager,
        topic: str,
        partition: int,
        segments: list[RemoteSegment],
        start: int,
        upper: int,
    ) -> list[tuple[int, int]]:
        """Kafka's ``RemoteLogManager.collectAbortedTransactions``: the aborted transactions
        ``(producer id, first offset)`` overlapping ``[start, upper)``, from the transaction
        index of the fetched segment and of the following ones — an entry is in the index of
        the segment holding its ABORT marker, which may be later than the transaction's
        batches — the remote segments first (``segments``: from the fetched one on), then the
        local segments not tiered, until an entry shows no later marker can matter."""
        seen: set[tuple[int, int]] = set()
        out: list[tuple[int, int]] = []

        def add(found: TxnSearchResult) -> bool:
            for e in found.aborted:
                if (e.producer_id, e.first_offset) not in seen:
                    seen.add((e.producer_id, e.first_offset))
                    out.append((e.producer_id, e.first_offset))
            return found.complete

        for seg in segments:
            if add(self.reader.aborted(seg, start, upper)):
                return out
        lg = self._logs.get_log(topic, partition)
        if lg is not None:
            tiered = segments[-1].end_offset if segments else -1
            for local in list(lg.segments):  # a snapshot: retention may replace the list
                if local.base_offset > tiered and add(local.txn_index.collect(start, upper)):
                    break
        return out

    def needs_remote_lookup(
        self: _Manager, topic: str, partition: int, timestamp: int, local_start: int
    ) -> bool:
        """Whether a ListOffsets by ``timestamp`` must look at remote segments: one holds
        offsets below the local log start and records that recent (else the local log
        answers alone, as before tiering). A snapshot read: fit for a network thread."""
        return any(
            s.start_offset < local_start and s.max_timestamp_ms >= timestamp
            for s in self.live_segments(topic, partition)
        )

    def offset_for_timestamp(
        self: _Manager, topic: str, partition: int, timestamp: int, *, local_start: int
    ) -> tuple[int, int] | None:
        """Kafka's remote part of a ListOffsets by timestamp: ``(offset, timestamp)`` of the
        first record whose timestamp is >= ``timestamp``, looking in the live remote segments
        below the local log start in offset order, from the partition's log start offset;
        None when none has one (the caller then asks the local log, as Kafka does). Waits
        for the store: call on the reader pool; store errors are logged and raised."""
        start = self.log_start_offset(topic, partition, local_start)
        for seg in self.live_segments(topic, partition):
            if seg.start_offset >= local_start:
                break  # wholly local too: the local log answers for it
            if seg.max_timestamp_ms < timestamp or seg.end_offset < start:
                continue
            try:
                found = self.reader.offset_for_timestamp(seg, timestamp, start_offset=start)
            except LoglakeError as exc:
                _log.error(
                    "%s-%d: remote lookup of timestamp %d failed (segment %s): %s",
                    topic,
                    partition,
                    timestamp,
                    seg.segment_id,
                    exc,
                )
                raise
            if found is not None:
                return found
        return None

    def max_timestamp_segment(
        self: _Manager, topic: str, partition: int, local_start: int
    ) -> RemoteSegment | None:
        """The remote part of a ListOffsets -3 (KIP-734 max timestamp; Kafka's KAFKA-17552):
        the live remote segment with the partition's largest timestamp (the earliest such, by
        the metadata's ``max_timestamp_ms``; none wholly below the log start offset), when it
        lies wholly below the local log start; None when the local log holds it (or none
        has a timestamp). A snapshot read: fit for a network thread."""
        start = self.log_start_offset(topic, partition, local_start)
        best: RemoteSegment | None = None
        for s in self.live_segments(topic, partition):
            if s.end_offset < start:
                continue
            if best is None or s.max_timestamp_ms > best.max_timestamp_ms:
                best = s
        if best is None or best.max_timestamp_ms < 0 or best.end_offset >= local_start:
            return None
        return best

    def offset_of_max_timestamp(self: _Manager, seg: RemoteSegment) -> tuple[int, int] | None:
        """``(offset, timestamp)`` of the record holding ``seg``'s largest timestamp
        (:meth:`SegmentReader.offset_of_max_timestamp`). Waits for the store: call on the
        reader pool; store errors are logged and raised."""
        try:
            return self.reader.offset_of_max_timestamp(seg)
        except LoglakeError as exc:
            _log.error(
                "%s-%d: remote lookup of the max timestamp failed (segment %s): %s",
                seg.topic,
                seg.partition,
                seg.segment_id,
                exc,
            )
            raise
