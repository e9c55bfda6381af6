"""Committed offsets and group metadata, kept in the compacted ``__consumer_offsets`` topic.

Each change is one record (formats in :mod:`logstore.server.group.schemas`) appended to
partition ``partition_for(group, n)`` of ``__consumer_offsets`` through the partition
layer (:meth:`logstore.storage.partition.Partition.append_as_coordinator`, markers through
``write_txn_marker``) over an ordinary :class:`logstore.storage.Log` — the same segment
files, indexes, producer state, checkpoints and recovery as any topic. Later records win;
a null value (tombstone) deletes the key. On start the store reads every partition back
from its log start offset to its end and rebuilds the latest value per key, exactly as a
compacted topic is meant to be read.

The topic is created lazily (a partition's log appears with its first record) with
``cleanup.policy=compact`` stored as its override (``LogManager.set_topic_config``, i.e.
``<log_dir>/topic-configs/__consumer_offsets.properties``) so the directory describes itself.
That, snapshot compaction and reading back are shared with ``__transaction_state``
(:mod:`logstore.server.internal_log`).

Transactional offset commits (TxnOffsetCommit, KIP-98) are appended as a *transactional*
batch carrying the producer's id and epoch and stay pending (not visible to OffsetFetch)
until the transaction coordinator writes a COMMIT or ABORT marker into the same partition
(:meth:`OffsetStore.complete_txn`): COMMIT materialises the producer's pending offsets of
that partition's groups, ABORT drops them. Loading replays the same rules from the log, so a
restart keeps pending offsets pending until their marker arrives. Snapshot compaction skips
a partition while it holds pending offsets (Kafka's cleaner never passes the LSO).

It also keeps the compacted view in memory (group -> partition -> latest committed value),
updated only after the append that makes a change durable returned.

Thread-safety: none of its own; the coordinator calls it under its lock.
Crash behaviour: an append is one batch (all offsets of one OffsetCommit together), so a
crash leaves all or none of it after recovery truncates a torn tail; the in-memory view is
updated only after the append returned.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from logstore.errors import (
    CorruptRecordError,
    InvalidProducerEpochError,
    TransactionCoordinatorFencedError,
)
from logstore.protocol.control import ControlType, decode_control_record
from logstore.protocol.records import build_batch
from logstore.server.group.schemas import (
    GroupKey,
    GroupValue,
    OffsetKey,
    OffsetValue,
    decode_group_value,
    decode_key,
    decode_offset_value,
    encode_group_key,
    encode_group_value,
    encode_offset_key,
    encode_offset_value,
    partition_for,
)
from logstore.server.internal_log import CompactedInternalLog, iter_records
from logstore.storage.log import Log
from logstore.storage.log_manager import LogManager
from logstore.storage.partition import Partition

__all__ = ["OFFSETS_TOPIC", "LoadedState", "OffsetStore"]

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"


# a pending transactional offset and the log offset of its batch (Kafka's
# CommitRecordMetadataAndOffset: the later one in the log wins when its marker commits it)
_Pending = tuple[OffsetValue, int]


@dataclass(slots=True)
class LoadedState:
    """The latest value of every live key, after tombstones."""

    offsets: dict[str, dict[tuple[str, int], OffsetValue]] = field(default_factory=dict)
    groups: dict[str, GroupValue] = field(default_factory=dict)
    # producer id -> group -> (topic, partition) -> (offset, its batch's log offset),
    # awaiting the producer's marker
    pending: dict[int, dict[str, dict[tuple[str, int], _Pending]]] = field(default_factory=dict)
    # (group, (topic, partition)) -> log offset of the batch of the committed value in offsets
    offset_at: dict[tuple[str, tuple[str, int]], int] = field(default_factory=dict)
    records: int = 0
    corrupt_records: int = 0


class OffsetStore:
    """Appends offset and group records to ``__consumer_offsets`` and reads them back."""

    def __init__(
        self,
        log_manager: LogManager,
        *,
        num_partitions: int,
        segment_bytes: int,
        snapshot_min_records: int = 10_000,
    ) -> None:
        self.num_partitions = num_partitions
        self._topic = CompactedInternalLog(
            log_manager,
            OFFSETS_TOPIC,
            segment_bytes=segment_bytes,
            snapshot_min_records=snapshot_min_records,
        )
        self._partitions: dict[int, Partition] = {}
        # The log's compacted view: group -> (topic, partition) -> latest committed value,
        # and group -> its latest group metadata value (encoded).
        self._offsets: dict[str, dict[tuple[str, int], OffsetValue]] = {}
        self._group_values: dict[str, bytes] = {}
        # Where each committed value's batch is in the log: (group, tp) -> log offset.
        self._offset_at: dict[tuple[str, tuple[str, int]], int] = {}
        # Transactional commits awaiting their marker: producer id -> group -> tp -> (value,
        # log offset of its batch).
        self._pending: dict[int, dict[str, dict[tuple[str, int], _Pending]]] = {}

    # --- the committed offsets ----------------------------------------------------------

    def offsets_of(self, group_id: str) -> Mapping[tuple[str, int], OffsetValue]:
        return self._offsets.get(group_id, {})

    def commit(
        self,
        group_id: str,
        values: Sequence[tuple[tuple[str, int], OffsetValue]],
        *,
        now_ms: int,
    ) -> None:
        """Append the offsets as one batch, then make them visible (nothing on failure)."""
        at = self.append(
            group_id,
            [(encode_offset_key(group_id, t, p), encode_offset_value(v)) for (t, p), v in values],
            now_ms=now_ms,
        )
        group_offsets = self._offsets.setdefault(group_id, {})
        for tp, v in values:
            group_offsets[tp] = v
            self._offset_at[(group_id, tp)] = at

    def txn_commit(
        self,
        group_id: str,
        values: Sequence[tuple[tuple[str, int], OffsetValue]],
        *,
        producer_id: int,
        producer_epoch: int,
        now_ms: int,
    ) -> None:
        """Append the offsets as one transactional batch of the producer; they stay pending
        until :meth:`complete_txn` (nothing on failure). The batch opens the producer's
        transaction in the partition's producer state, so its last stable offset (a
        READ_COMMITTED fetch of the topic) stops here until the marker."""
        at = self.append(
            group_id,
            [(encode_offset_key(group_id, t, p), encode_offset_value(v)) for (t, p), v in values],
            now_ms=now_ms,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
        )
        pending = self._pending.setdefault(producer_id, {}).setdefault(group_id, {})
        for tp, v in values:
            pending[tp] = (v, at)

    def has_pending(self, group_id: str, tp: tuple[str, int]) -> bool:
        """Whether a transaction holds an uncommitted offset of ``tp`` for the group."""
        return any(tp in groups.get(group_id, {}) for groups in self._pending.values())

    def complete_txn(
        self,
        partition: int,
        *,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        now_ms: int,
    ) -> None:
        """Append the producer's COMMIT/ABORT marker to ``partition`` of the topic
        (:meth:`Partition.write_txn_marker`: the producer's transaction there ends, an ABORT
        joins the ``.txnindex``), then materialise (commit) or drop (abort) its pending
        offsets of that partition's groups. A committed offset replaces the group's value
        only if its batch is later in the log than the value's (Kafka: a plain OffsetCommit
        made while the transaction was open wins over the transaction's older one).

        Raises :class:`~logstore.errors.LoglakeError` / ``OSError`` when the marker cannot be
        appended; the offsets stay pending then (the coordinator retries), except for an
        obsolete marker (:class:`~logstore.errors.InvalidProducerEpochError`,
        :class:`~logstore.errors.TransactionCoordinatorFencedError`: the partition has a newer
        epoch of the producer), whose offsets are dropped."""
        try:
            self._partition(partition).write_txn_marker(
                producer_id,
                producer_epoch,
                commit=commit,
                coordinator_epoch=coordinator_epoch,
                now_ms=now_ms,
            )
        except (InvalidProducerEpochError, TransactionCoordinatorFencedError):
            # the partition has moved on to a newer epoch: this marker is obsolete (the
            # broker drops it, as Kafka's marker channel does) and the producer's pending
            # offsets here can never be committed; dropped, not left unstable forever
            self._settle(partition, producer_id=producer_id, commit=False)
            raise
        self._settle(partition, producer_id=producer_id, commit=commit)

    def _settle(self, partition: int, *, producer_id: int, commit: bool) -> None:
        """:meth:`_apply_marker` on this store's own view."""
        self._apply_marker(
            self._pending,
            self._offsets,
            self._offset_at,
            partition,
            producer_id=producer_id,
            commit=commit,
        )

    def _apply_marker(
        self,
        pending: dict[int, dict[str, dict[tuple[str, int], _Pending]]],
        offsets: dict[str, dict[tuple[str, int], OffsetValue]],
        offset_at: dict[tuple[str, tuple[str, int]], int],
        partition: int,
        *,
        producer_id: int,
        commit: bool,
    ) -> None:
        groups = pending.get(producer_id)
        if not groups:
            return
        for group_id in [g for g in groups if self.partition_for(g) == partition]:
            values = groups.pop(group_id)
            if not commit:
                continue
            group_offsets = offsets.setdefault(group_id, {})
            for tp, (v, at) in values.items():
                # the later record in the log wins (Kafka's olderThan): a plain commit
                # appended after the transactional one stays
                if tp not in group_offsets or offset_at.get((group_id, tp), -1) < at:
                    group_offsets[tp] = v
                    offset_at[(group_id, tp)] = at
            if not group_offsets:
                del offsets[group_id]
        if not groups:
            del pending[producer_id]

    def expire(
        self, group_id: str, *, base_ms: int, retention_ms: int, now_ms: int, delete_group: bool
    ) -> bool:
        """Tombstone the group's offsets that are due: an explicit expire timestamp passed,
        or ``retention_ms`` after the later of the commit and ``base_ms`` (when the group
        became empty, KIP-211). With ``delete_group`` and nothing left, the group metadata is
        tombstoned in the same batch. Returns whether the group has no offsets left."""
        expired = [
            tp
            for tp, v in self.offsets_of(group_id).items()
            if (0 <= v.expire_timestamp <= now_ms)
            or (
                v.expire_timestamp < 0 and max(v.commit_timestamp, base_ms) + retention_ms <= now_ms
            )
        ]
        emptied = len(expired) == len(self.offsets_of(group_id))
        self.delete(group_id, expired, delete_group=emptied and delete_group, now_ms=now_ms)
        return emptied

    def delete(
        self,
        group_id: str,
        partitions: Sequence[tuple[str, int]],
        *,
        delete_group: bool,
        now_ms: int,
    ) -> None:
        """Tombstone the offsets of ``partitions`` (and the group metadata when
        ``delete_group``) in one batch, then forget them."""
        records: list[tuple[bytes, bytes | None]] = [
            (encode_offset_key(group_id, t, p), None) for t, p in partitions
        ]
        if delete_group:
            records.append((encode_group_key(group_id), None))
        self.append(group_id, records, now_ms=now_ms)
        offsets = self._offsets.get(group_id, {})
        for tp in partitions:
            offsets.pop(tp, None)
            self._offset_at.pop((group_id, tp), None)
        if not offsets:
            self._offsets.pop(group_id, None)
        if delete_group:
            self._group_values.pop(group_id, None)

    def store_group(self, group_id: str, value: GroupValue, *, now_ms: int) -> None:
        encoded = encode_group_value(value)
        self.append(group_id, [(encode_group_key(group_id), encoded)], now_ms=now_ms)
        self._group_values[group_id] = encoded

    # --- writing ------------------------------------------------------------------------

    def partition_for(self, group_id: str) -> int:
        return partition_for(group_id, self.num_partitions)

    def append(
        self,
        group_id: str,
        records: Iterable[tuple[bytes, bytes | None]],
        *,
        now_ms: int,
        producer_id: int = -1,
        producer_epoch: int = -1,
    ) -> int:
        """Append ``(key, value)`` records of one group as one batch (value None: tombstone);
        a transactional batch of ``producer_id`` when one is given. Returns the batch's
        offset (-1 when there was nothing to append).

        Through :meth:`Partition.append_as_coordinator`, so the partition's producer state
        (last stable offset, fencing) sees transactional batches as it sees a client's.
        Raises :class:`~logstore.errors.LoglakeError` (or ``OSError``) when the log refuses;
        nothing is appended then.
        """
        items = [(key, value, (), now_ms) for key, value in records]
        if not items:
            return -1
        partition = self.partition_for(group_id)
        log_ = self._topic.log(partition)
        buf = build_batch(
            items,
            base_timestamp=now_ms,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            is_transactional=producer_id >= 0,
        )
        # A single broker: what is appended is committed (the partition moves the high
        # watermark), so consumers of the topic (the lakehouse ingest included) may read it
        # at once.
        first = self._partition(partition).append_as_coordinator(buf, now_ms=now_ms).first_offset
        self._maybe_snapshot(partition, log_, now_ms=now_ms)
        return first

    def _maybe_snapshot(self, partition: int, log_: Log, *, now_ms: int) -> None:
        """Compact one partition by snapshot once at least half of it is dead records
        (:meth:`CompactedInternalLog.snapshot`), through the partition so that its producer
        state below the new log start goes too."""
        if not self._topic.snapshot_due(log_):
            return
        if any(self.partition_for(g) == partition for gs in self._pending.values() for g in gs):
            return  # pending transactional offsets: their records must stay (never past LSO)
        part = self._partition(partition)
        self._topic.snapshot(
            partition,
            self._live_records(partition),
            now_ms=now_ms,
            append=lambda buf: part.append_as_coordinator(buf, now_ms=now_ms),
            delete_before=part.delete_records_before,
        )

    def _live_records(self, partition: int) -> list[tuple[bytes, bytes]]:
        out: list[tuple[bytes, bytes]] = []
        for group_id, value in self._group_values.items():
            if self.partition_for(group_id) == partition:
                out.append((encode_group_key(group_id), value))
        for group_id, offsets in self._offsets.items():
            if self.partition_for(group_id) == partition:
                out.extend(
                    (encode_offset_key(group_id, t, p), encode_offset_value(v))
                    for (t, p), v in offsets.items()
                )
        return out

    def _partition(self, partition: int) -> Partition:
        """The partition over this store's log of ``partition`` (its producer state is the
        log's, shared with the broker's Partition of the same log; only the coordinator
        writes to the topic, clients' produce requests are refused)."""
        log_ = self._topic.log(partition)
        part = self._partitions.get(partition)
        if part is None or part.log is not log_:
            part = self._partitions[partition] = Partition(OFFSETS_TOPIC, partition, log_)
        return part

    # --- loading ------------------------------------------------------------------------

    def load(self) -> LoadedState:
        """Read every existing ``__consumer_offsets`` partition into a :class:`LoadedState`
        (which also becomes this store's view of the committed offsets).

        Records whose key or value cannot be decoded are counted and skipped (logged once
        per partition): a foreign record must not stop the broker from starting.
        """
        state = LoadedState()
        for log_ in self._topic.existing_logs():
            bad = 0
            partition = int(log_.partition)
            for header, rec in iter_records(log_):
                state.records += 1
                key, value, batch_offset = rec.key, rec.value, header.base_offset
                # producer id of a transactional batch, else -1
                producer_id = header.producer_id if header.is_transactional else -1
                try:
                    if header.is_control:
                        marker = decode_control_record(key, value)
                        if marker.is_transaction_marker:
                            self._apply_marker(
                                state.pending,
                                state.offsets,
                                state.offset_at,
                                partition,
                                producer_id=producer_id,
                                commit=marker.type == ControlType.COMMIT,
                            )
                    elif producer_id >= 0:
                        self._apply_pending(state, producer_id, batch_offset, key, value)
                    else:
                        self._apply(state, batch_offset, key, value)
                except CorruptRecordError:
                    bad += 1
            if bad:
                state.corrupt_records += bad
                log.warning(
                    "%s-%d: skipped %d undecodable records", OFFSETS_TOPIC, log_.partition, bad
                )
        self._offsets = state.offsets
        self._offset_at = state.offset_at
        self._pending = state.pending
        self._group_values = {g: encode_group_value(v) for g, v in state.groups.items()}
        return state

    @staticmethod
    def _apply_pending(
        state: LoadedState, producer_id: int, at: int, key: bytes | None, value: bytes | None
    ) -> None:
        if key is None:
            raise CorruptRecordError("__consumer_offsets record without a key")
        k = decode_key(key)
        if isinstance(k, OffsetKey) and value is not None:
            state.pending.setdefault(producer_id, {}).setdefault(k.group, {})[
                (k.topic, k.partition)
            ] = (decode_offset_value(value), at)

    @staticmethod
    def _apply(state: LoadedState, at: int, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            raise CorruptRecordError("__consumer_offsets record without a key")
        k = decode_key(key)
        if isinstance(k, OffsetKey):
            if value is None:
                group_offsets = state.offsets.get(k.group)
                if group_offsets is not None:
                    group_offsets.pop((k.topic, k.partition), None)
                    state.offset_at.pop((k.group, (k.topic, k.partition)), None)
                    if not group_offsets:
                        del state.offsets[k.group]
            else:
                state.offsets.setdefault(k.group, {})[(k.topic, k.partition)] = decode_offset_value(
                    value
                )
                state.offset_at[(k.group, (k.topic, k.partition))] = at
        elif isinstance(k, GroupKey):
            if value is None:
                state.groups.pop(k.group, None)
            else:
                state.groups[k.group] = decode_group_value(value)
