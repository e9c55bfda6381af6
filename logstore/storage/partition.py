"""One partition as its only leader sees it: Kafka's ``Partition`` + ``appendAsLeader``.

The log's rules live here, not in the API handlers: a handler parses the request, calls
:meth:`Partition.append_as_leader` or :meth:`Partition.read`, and turns a raised
:class:`~logstore.errors.LoglakeError` into a Kafka error code through one table
(``logstore.server.error_codes``).

:meth:`Partition.append_as_leader`, numbered as it runs:

1. analyse the producer's bytes (:func:`logstore.storage.log.analyze_batches`): every batch
   whole, magic 2, at most ``max.message.bytes``, CRC-32C, codec, record count — one header
   unpack per batch, the only parse of the request; nothing is decompressed and no record is
   looked at;
2. refuse what no producer may send: control batches (only the transaction coordinator
   writes markers, :meth:`Partition.write_txn_marker`) and transactional batches without a
   producer id; in a compacted topic, refuse a record without a key (Kafka's LogValidator,
   ``INVALID_RECORD``: only there are batches decompressed, to read each record's key length);
   a CreateTime batch outside the topic's timestamp window (``INVALID_TIMESTAMP``, from the
   headers); then, unless ``compression.type=producer``, rewrite batches of another codec
   (:mod:`logstore.storage.append_rules`);
3. under the partition's lock: producer state checks every idempotent or transactional batch
   (KIP-98: duplicates of one of the producer's last 5 batches, sequence order, epoch fencing,
   no non-transactional batch while the producer's transaction is open); a retried request
   is answered with the original offsets and appended again nowhere;
4. append the bytes unchanged (offsets and leader epoch stamped in place, outside the CRC);
5. record each batch in the producer state with its assigned offsets: a transactional batch
   opens its producer's transaction here unless one is open (Kafka's
   ``currentTxnFirstOffset``);
6. move the high watermark to the log end (a single replica: appended is committed).

Typed failures, each leaving the log as it was: :class:`~logstore.errors.CorruptRecordError`
(:class:`~logstore.errors.UnsupportedMagicError`, :class:`~logstore.errors.RecordTooLargeError`),
:class:`~logstore.errors.OutOfOrderSequenceError`,
:class:`~logstore.errors.InvalidProducerEpochError`,
:class:`~logstore.errors.InvalidTxnStateError`,
:class:`~logstore.errors.InvalidRecordError`,
:class:`~logstore.errors.StorageError` / :class:`~logstore.errors.LogOfflineError` (a full disk,
an I/O error: the log is offline for appends), :class:`~logstore.errors.LogClosedError`.

Transactions: :meth:`Partition.write_txn_marker` (the coordinator's call) appends a COMMIT or
ABORT marker and completes the producer's transaction. :attr:`Partition.last_stable_offset`
is the first offset of the oldest open transaction, capped by the high watermark; a
``READ_COMMITTED`` :meth:`Partition.read` stops there and returns the aborted transactions
(producer id, first offset) overlapping what it read, from the segments' ``.txnindex``
(:mod:`logstore.storage.txn_index`; an ABORT marker adds its transaction there).

Thread-safety: appends and DeleteRecords serialise on :attr:`Partition.lock` (producer-state
check -> append -> update is atomic with respect to other producers). :meth:`read` and the
offset properties take no lock (the log's reads are safe from any thread).

Crash behaviour: nothing of its own is persisted. The producer state is the log's
(:attr:`Log.producer_state`, Kafka's ``UnifiedLog`` owns it too): loaded from the latest
``.snapshot`` plus the batches after it when the log opens, with the ``.txnindex`` of every
recovered segment rebuilt from its markers; a marker whose ``.txnindex`` entry a crash
prevented is thus indexed again, and a torn marker batch is cut off by recovery like any
torn batch (its transaction stays open, and the coordinator writes the marker again).
"""

from __future__ import annotations

import logging
import threading
import time
from enum import IntEnum
from typing import NamedTuple

from logstore.errors import (
    InvalidRecordError,
    LoglakeError,
    OffsetOutOfRangeError,
    StorageError,
)
from logstore.protocol.batch import CONTROL_FLAG, TRANSACTIONAL_FLAG, BatchHeader
from logstore.protocol.control import ControlType, build_control_batch
from logstore.protocol.records import first_keyless_record
from logstore.storage.append_rules import check_timestamps, recompress
from logstore.storage.log import FetchSlice, Log, analyze_batches
from logstore.storage.producer_state import ProducerStateManager
from logstore.storage.txn_index import AbortedTxn

__all__ = ["AppendResult", "IsolationLevel", "Partition", "ReadResult"]

_log = logging.getLogger(__name__)


class IsolationLevel(IntEnum):
    """Fetch's and ListOffsets' ``isolation_level`` (Kafka's ``IsolationLevel``, wire values)."""

    READ_UNCOMMITTED = 0  # everything below the high watermark
    READ_COMMITTED = 1  # everything below the last stable offset


class AppendResult(NamedTuple):
    """What a produce response says about one partition.

    ``duplicate``: the request was a producer's retry of batches already in the log; the
    offsets are the originals' and nothing was appended (``log_append_time_ms`` is then -1,
    as Kafka answers). ``log_append_time_ms`` is -1 with CreateTime.
    """

    first_offset: int
    last_offset: int
    log_append_time_ms: int
    log_start_offset: int
    duplicate: bool


class ReadResult(NamedTuple):
    """One partition's part of a fetch: the file slice (None when there is nothing to send),
    the offsets a fetch response carries, and for READ_COMMITTED the aborted transactions
    overlapping the slice (None for READ_UNCOMMITTED: the response's null)."""

    slice: FetchSlice | None
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    aborted_transactions: list[AbortedTxn] | None = None


class Partition:
    """One topic-partition's log, producer state and append lock (see the module docstring)."""

    __slots__ = ("lock", "log", "partition", "producers", "topic")

    def __init__(
        self, topic: str, partition: int, log: Log, producers: ProducerStateManager | None = None
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.log = log
        self.producers = producers if producers is not None else log.producer_state
        self.lock = threading.Lock()

    @classmethod
    def load(cls, topic: str, partition: int, log: Log) -> Partition:
        """The partition over an open log and the producer state it loaded (from its latest
        ``.snapshot`` plus the batches after it: :mod:`logstore.storage.producer_loader`)."""
        return cls(topic, partition, log)

    def __repr__(self) -> str:
        return f"Partition({self.topic}-{self.partition}, {self.log!r})"

    # -- offsets ------------------------------------------------------------------------------

    @property
    def deleted(self) -> bool:
        """Whether the log was closed (topic deleted, broker shut down)."""
        return bool(self.log.closed)

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def high_watermark(self) -> int:
        return self.log.high_watermark

    @property
    def last_stable_offset(self) -> int:
        """The first offset a READ_COMMITTED consumer may not see yet.

        Kafka: the first offset of the oldest ongoing transaction (never below the log start
        offset), else the high watermark (never above it). Lockless: one attribute read of
        the producer state.
        """
        hw = self.log.high_watermark
        first = self.producers.first_unstable_offset
        if first is None:
            return hw
        # an open transaction begun below the log start (DeleteRecords, retention) counts from
        # the log start, as Kafka's maybeIncrementFirstUnstableOffset does
        return min(max(first, self.log.log_start_offset), hw)

    def fetch_limit(self, isolation: IsolationLevel) -> int:
        """The offset a fetch of ``isolation`` stops before (also ListOffsets' "latest")."""
        if isolation == IsolationLevel.READ_COMMITTED:
            return self.last_stable_offset
        return self.high_watermark

    # -- append -------------------------------------------------------------------------------

    def append_as_leader(
        self, records: bytearray, *, now_ms: int | None = None, leader_epoch: int = 0
    ) -> AppendResult:
        """Validate and append a producer's batches (see the module docstring's steps).

        ``records`` must be writable: offsets are stamped into it in place, then it is
        written unchanged. Raises the typed errors of the module docstring; nothing is
        appended then.
        """
        lg = self.log
        # 1. the only parse of the request's batches
        batches = analyze_batches(records, max_message_bytes=lg.config.max_message_bytes)
        # 2. what no producer may send
        for _pos, h in batches:
            if h.attributes & CONTROL_FLAG:
                raise InvalidRecordError(
                    f"{self.topic}-{self.partition}: control batch from producer"
                    f" {h.producer_id}: only the transaction coordinator writes markers"
                )
            if h.attributes & TRANSACTIONAL_FLAG and h.producer_id < 0:
                raise InvalidRecordError(
                    f"{self.topic}-{self.partition}: transactional batch without a producer id"
                )
        config = lg.config
        if config.compact:
            self._refuse_keyless(records, batches)
        # 2b. the topic's timestamp window and compression.type (logstore.storage.append_rules)
        if now_ms is None:
            now_ms = time.time_ns() // 1_000_000
        check_timestamps(
            batches, config=config, now_ms=now_ms, topic=self.topic, partition=self.partition
        )
        if config.compression_type != "producer":
            converted = recompress(records, batches, config=config)
            if converted is not None:
                records = converted
                batches = analyze_batches(records, max_message_bytes=config.max_message_bytes)
        with self.lock:
            # 3. idempotence
            producers = self.producers
            dup = producers.check_batches(batches)
            if dup is not None:
                return AppendResult(
                    dup.first_offset, dup.last_offset, -1, lg.log_start_offset, True
                )
            return self._append_locked(records, batches, now_ms=now_ms, leader_epoch=leader_epoch)

    def append_as_coordinator(
        self, records: bytearray, *, now_ms: int | None = None, leader_epoch: int = 0
    ) -> AppendResult:
        """Append a coordinator's own batches (Kafka's ``appendAsLeader`` with origin
        COORDINATOR): the group coordinator's ``__consumer_offsets`` records, among them the
        transactional batches of TxnOffsetCommit (a producer's id and epoch, no sequence).

        As :meth:`append_as_leader`, but no sequence is checked (a coordinator's batches have
        none, as in Kafka, where only client batches are) and control batches are refused
        (markers go through :meth:`write_txn_marker`). The producer state is updated as for a
        client's batch: a transactional batch opens its producer's transaction, so the last
        stable offset of the partition stops at a pending transactional offset commit until
        its marker. Raises the storage errors of :meth:`append_as_leader`.
        """
        lg = self.log
        batches = analyze_batches(records, max_message_bytes=lg.config.max_message_bytes)
        for _pos, h in batches:
            if h.attributes & CONTROL_FLAG:
                raise InvalidRecordError(
                    f"{self.topic}-{self.partition}: control batch: markers are written by"
                    " write_txn_marker"
                )
        with self.lock:
            return self._append_locked(records, batches, now_ms=now_ms, leader_epoch=leader_epoch)

    def _append_locked(
        self,
        records: bytearray,
        batches: list[tuple[int, BatchHeader]],
        *,
        now_ms: int | None,
        leader_epoch: int,
    ) -> AppendResult:
        """Steps 4-6 of :meth:`append_as_leader`, under :attr:`lock`."""
        lg = self.log
        producers = self.producers
        # 4. the bytes
        try:
            info = lg.append(records, leader_epoch=leader_epoch, now_ms=now_ms, analyzed=batches)
        except OSError as exc:  # the log converts its own; anything else is still storage
            raise StorageError(
                f"{self.topic}-{self.partition}: append failed: {exc}", errno=exc.errno
            ) from exc
        # 5. producer state, from the headers of step 1 and the offsets just assigned
        base = info.first_offset
        append_time = info.log_append_time_ms
        for _pos, h in batches:
            if h.producer_id >= 0:
                producers.append_batch(
                    h,
                    base_offset=base,
                    max_timestamp=append_time if append_time >= 0 else h.max_timestamp,
                )
            base += h.last_offset_delta + 1
        # 6. single replica: everything appended is committed
        lg.high_watermark = lg.log_end_offset
        return AppendResult(
            info.first_offset, info.last_offset, append_time, lg.log_start_offset, False
        )

    def _refuse_keyless(self, records: bytearray, batches: list[tuple[int, BatchHeader]]) -> None:
        """Kafka refuses a keyless record in a compacted topic (its message, INVALID_RECORD)."""
        for pos, h in batches:
            if h.is_control:
                continue
            if first_keyless_record(records, pos) is not None:
                raise InvalidRecordError(
                    "Compacted topic cannot accept message without key in topic partition "
                    f"{self.topic}-{self.partition}."
                )

    # -- transaction markers ------------------------------------------------------------------

    def write_txn_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        *,
        commit: bool,
        coordinator_epoch: int,
        now_ms: int | None = None,
        leader_epoch: int = 0,
    ) -> int:
        """Append a COMMIT (``commit=True``) or ABORT marker for ``producer_id``; its offset.

        The transaction coordinator's call (Kafka's WriteTxnMarkers -> ``appendAsLeader`` with
        origin COORDINATOR), one per partition of the transaction. The marker is Kafka's
        control batch: attributes control + transactional, the producer's id and
        ``producer_epoch``, base sequence -1, one record with key ``version 0, type`` (0 ABORT,
        1 COMMIT) and value ``version 0, coordinator_epoch``. It ends the producer's open
        transaction here: the last stable offset moves past it and, for an ABORT, the
        transaction joins the aborted ones READ_COMMITTED fetches return.

        Idempotent for the coordinator's retries: a marker for a producer with no open
        transaction in this partition (a retry after a lost response, or a partition the
        producer never wrote to) is still written, as Kafka does; it completes nothing, so a
        consumer skips it like any marker. A marker with a newer ``producer_epoch`` moves the
        producer to it (fencing a zombie: its later batches get ``INVALID_PRODUCER_EPOCH``, the
        new producer starts at sequence 0).

        Raises, appending nothing: :class:`~logstore.errors.InvalidProducerEpochError`
        (``INVALID_PRODUCER_EPOCH``) when ``producer_epoch`` is older than the producer's
        epoch here; :class:`~logstore.errors.TransactionCoordinatorFencedError`
        (``TRANSACTION_COORDINATOR_FENCED``) when ``coordinator_epoch`` is older than the one of
        the producer's last marker; :class:`~logstore.errors.StorageError` /
        :class:`~logstore.errors.LogOfflineError`, :class:`~logstore.errors.LogClosedError`
        as for any append. Thread-safe (the partition's lock). The high watermark moves past the
        marker; the caller wakes Fetch waiters (``broker.purgatory.check_and_complete``).
        """
        lg = self.log
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        batch = build_control_batch(
            ControlType.COMMIT if commit else ControlType.ABORT,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            coordinator_epoch=coordinator_epoch,
            timestamp=now,
        )
        with self.lock:
            self.producers.check_marker(producer_id, producer_epoch, coordinator_epoch)
            try:
                info = lg.append(batch, leader_epoch=leader_epoch, now_ms=now)
            except OSError as exc:
                raise StorageError(
                    f"{self.topic}-{self.partition}: marker append failed: {exc}", errno=exc.errno
                ) from exc
            offset = info.first_offset
            done = self.producers.complete_txn(
                producer_id,
                producer_epoch,
                commit=commit,
                coordinator_epoch=coordinator_epoch,
                offset=offset,
                timestamp=info.max_timestamp,
            )
            lg.high_watermark = lg.log_end_offset
            if done.is_aborted:
                # after the marker (Kafka's order): a crash in between is mended by recovery,
                # which rebuilds the index from the markers; a failure takes the log offline
                lg.append_aborted_txn(
                    AbortedTxn(
                        done.producer_id,
                        done.first_offset,
                        done.last_offset,
                        done.last_stable_offset,
                    )
                )
            return offset

    # -- read ---------------------------------------------------------------------------------

    def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
        min_one_batch: bool = True,
    ) -> ReadResult:
        """Batches from ``offset`` up to the fetch limit of ``isolation``, as a file slice.

        At most ``max_bytes`` (but one whole batch when ``min_one_batch``, KIP-74); nothing at
        all when ``max_bytes <= 0`` and not ``min_one_batch``. Raises
        :class:`OffsetOutOfRangeError` outside ``[log_start_offset, high_watermark]`` and
        :class:`StorageError` when the log cannot be read.
        """
        start = self.log.log_start_offset
        hw = self.log.high_watermark
        lso = self.last_stable_offset
        if offset < start or offset > hw:
            raise OffsetOutOfRangeError(
                f"{self.topic}-{self.partition}: fetch offset {offset} is outside"
                f" [{start}, {hw}] (log start offset, high watermark)"
            )
        committed = isolation == IsolationLevel.READ_COMMITTED
        limit = lso if committed else hw
        none: list[AbortedTxn] | None = [] if committed else None
        if offset >= limit or (max_bytes <= 0 and not min_one_batch):
            return ReadResult(None, hw, lso, start, none)
        try:
            sl = self.log.read(
                offset, max(max_bytes, 0), max_offset=limit, min_one_batch=min_one_batch
            )
        except OffsetOutOfRangeError:
            raise
        except (OSError, LoglakeError) as exc:
            raise StorageError(f"{self.topic}-{self.partition}: read failed: {exc}") from exc
        if sl.length <= 0:
            return ReadResult(None, hw, lso, start, none)
        aborted = none
        if committed:
            # Kafka's bound: the slice never leaves its segment, and its bytes end before the
            # batch of the first offset-index entry at or after the slice's end (Kafka's
            # fetchUpperBoundOffset), else the segment's end; never above the LSO. Without the
            # index bound every fetch of a long segment would return (and search) all its
            # aborted transactions after the fetch offset.
            seg = self.log.segment_for(sl.first_offset)
            bound = seg.offset_index.fetch_upper_bound_offset(sl.position + sl.length)
            if bound is None:
                bound = self.log.segment_end_offset(sl.first_offset)
            upper = min(limit, bound)
            aborted = self.log.collect_aborted_txns(offset, upper)
        return ReadResult(sl, hw, lso, start, aborted)

    # -- DeleteRecords ------------------------------------------------------------------------

    def delete_records_before(self, offset: int) -> int:
        """Advance the log start offset to ``offset`` (-1: the high watermark); returns the
        new low watermark. :class:`OffsetOutOfRangeError` above the high watermark."""
        lg = self.log
        with self.lock:
            target = lg.high_watermark if offset == -1 else offset
            if target < 0 or target > lg.high_watermark:
                raise OffsetOutOfRangeError(
                    f"{self.topic}-{self.partition}: delete offset {offset} is outside"
                    f" [0, {lg.high_watermark}]"
                )
            try:
                low = lg.delete_records(target)
            except OffsetOutOfRangeError:
                raise
            except (OSError, LoglakeError) as exc:
                raise StorageError(
                    f"{self.topic}-{self.partition}: delete records failed: {exc}"
                ) from exc
            self.producers.truncate_below(low)
        return int(low)
