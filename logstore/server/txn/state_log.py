"""The transaction coordinator's state, kept in the compacted ``__transaction_state`` topic.

Each change of a transactional id's state is one record (formats in
:mod:`logstore.server.txn.schemas`) appended to partition ``partition_for(id, n)`` of
``__transaction_state`` through the ordinary :class:`logstore.storage.log.Log`: the same
segments, indexes, checkpoints and recovery as any topic. Later records win; a null value
(tombstone) removes the id. On start every partition is read back from its log start offset
to its end (:meth:`TxnStateLog.load`), exactly as a compacted topic is read.

The topic is created on its first record with ``cleanup.policy=compact`` stored as its
override, so the directory describes itself. Nothing else cleans it: like
``__consumer_offsets`` (:mod:`logstore.server.group.offset_store`) a partition is compacted by
snapshot once at least half of its records are dead; both stores share that, the lazy
opening of partitions and the reading back (:mod:`logstore.server.internal_log`).

Thread-safety: appends to one partition serialise on the log's own lock; the coordinator
appends for one id at a time (under that id's lock), so records of one id stay in order.
Crash behaviour: a record is one batch; recovery truncates a torn tail, so a state change is
either in the log whole or not at all, and the coordinator acts on a change only after its
append returned.
"""

from __future__ import annotations

import logging
import threading

from logstore.errors import CorruptRecordError
from logstore.protocol.records import build_batch
from logstore.server.internal_log import CompactedInternalLog, iter_records
from logstore.server.txn.schemas import (
    TxnLogValue,
    decode_txn_key,
    decode_txn_value,
    encode_txn_key,
    encode_txn_value,
    partition_for,
)
from logstore.storage.log import Log
from logstore.storage.log_manager import LogManager

__all__ = ["TRANSACTION_STATE_TOPIC", "TxnStateLog"]

log = logging.getLogger(__name__)

TRANSACTION_STATE_TOPIC = "__transaction_state"


class TxnStateLog:
    """Appends transaction state records and reads them back (see the module docstring)."""

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
            TRANSACTION_STATE_TOPIC,
            segment_bytes=segment_bytes,
            snapshot_min_records=snapshot_min_records,
        )
        # The compacted view: id -> its latest encoded value (tombstoned ids are absent).
        self._live: dict[str, bytes] = {}
        self._live_lock = threading.Lock()

    def partition_for(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self.num_partitions)

    # --- writing ------------------------------------------------------------------------

    def write(self, transactional_id: str, value: TxnLogValue | None, *, now_ms: int) -> None:
        """Append ``transactional_id``'s new state (None: a tombstone) as one batch.

        Raises :class:`~logstore.errors.LoglakeError` or ``OSError`` when the log refuses;
        nothing was appended then and the caller must not act on the change.
        """
        key = encode_txn_key(transactional_id)
        encoded = None if value is None else encode_txn_value(value)
        partition = self.partition_for(transactional_id)
        log_ = self._topic.log(partition)
        batch = build_batch([(key, encoded, (), now_ms)], base_timestamp=now_ms)
        # Under the log's lock, so that a snapshot (which takes it too) sees every value
        # appended before it and none appended after it.
        with log_.lock:
            _append_committed(log_, batch, now_ms=now_ms)
            with self._live_lock:
                if encoded is None:
                    self._live.pop(transactional_id, None)
                else:
                    self._live[transactional_id] = encoded
        self._maybe_snapshot(partition, log_, now_ms=now_ms)

    def flush(self, transactional_id: str) -> None:
        """fsync the partition holding ``transactional_id``'s records (crash tests)."""
        self._topic.log(self.partition_for(transactional_id)).flush()

    def _maybe_snapshot(self, partition: int, log_: Log, *, now_ms: int) -> None:
        if not self._topic.snapshot_due(log_):
            return
        with log_.lock:
            with self._live_lock:
                live = [
                    (encode_txn_key(t), v)
                    for t, v in self._live.items()
                    if self.partition_for(t) == partition
                ]
            self._topic.snapshot(
                partition,
                live,
                now_ms=now_ms,
                append=lambda buf: _append_committed(log_, buf, now_ms=now_ms),
                delete_before=log_.delete_records,
            )

    # --- loading ------------------------------------------------------------------------

    def load(self) -> dict[str, TxnLogValue]:
        """The latest state of every transactional id in the existing partitions.

        A record that cannot be decoded is skipped and counted (logged once per partition):
        a foreign record must not stop the broker from starting. A record of an id that
        belongs to another partition (the partition count was changed) is read all the same.
        """
        state: dict[str, TxnLogValue] = {}
        live: dict[str, bytes] = {}
        for log_ in self._topic.existing_logs():
            bad = 0
            for header, rec in iter_records(log_):
                if header.is_control:
                    continue
                key, value = rec.key, rec.value
                try:
                    if key is None:
                        raise CorruptRecordError("record without a key")
                    txn_id = decode_txn_key(key)
                    if value is None:
                        state.pop(txn_id, None)
                        live.pop(txn_id, None)
                    else:
                        state[txn_id] = decode_txn_value(value)
                        live[txn_id] = value
                except CorruptRecordError:
                    bad += 1
            if bad:
                log.warning(
                    "%s-%d: skipped %d undecodable records",
                    TRANSACTION_STATE_TOPIC,
                    log_.partition,
                    bad,
                )
        with self._live_lock:
            self._live = live
        return state


def _append_committed(log_: Log, batch: bytearray, *, now_ms: int) -> None:
    log_.append(batch, now_ms=now_ms)
    # A single broker: what is appended is committed.
    log_.high_watermark = log_.log_end_offset
