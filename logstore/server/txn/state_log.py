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
snapshot once at least half of its records are dead (roll, append the live value of every
id of the partition, advance the log start offset to the snapshot). Later records win when
reading back, so a crash between those steps still loads to the same state.

Thread-safety: appends to one partition serialise on the log's own lock; the coordinator
appends for one id at a time (under that id's lock), so records of one id stay in order.
Crash behaviour: a record is one batch; recovery truncates a torn tail, so a state change is
either in the log whole or not at all, and the coordinator acts on a change only after its
append returned.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator

from logstore.errors import CorruptRecordError, LoglakeError
from logstore.protocol.batch import iter_batches
from logstore.protocol.records import build_batch, decode_batch
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
from logstore.storage.topic_config import read_topic_config

__all__ = ["TRANSACTION_STATE_TOPIC", "TxnStateLog"]

log = logging.getLogger(__name__)

TRANSACTION_STATE_TOPIC = "__transaction_state"

_LOAD_READ_BYTES = 4 * 1024 * 1024
_SNAPSHOT_BATCH_RECORDS = 2_000


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
        self._log_manager = log_manager
        self.num_partitions = num_partitions
        self._segment_bytes = segment_bytes
        self._snapshot_min_records = snapshot_min_records
        self._logs: dict[int, Log] = {}
        self._logs_lock = threading.Lock()
        self._config_checked = False
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
        log_ = self._log(partition)
        batch = build_batch([(key, encoded, (), now_ms)], base_timestamp=now_ms)
        # Under the log's lock, so that a snapshot (which takes it too) sees every value
        # appended before it and none appended after it.
        with log_.lock:
            log_.append(batch, now_ms=now_ms)
            # A single broker: what is appended is committed.
            log_.high_watermark = log_.log_end_offset
            with self._live_lock:
                if encoded is None:
                    self._live.pop(transactional_id, None)
                else:
                    self._live[transactional_id] = encoded
        self._maybe_snapshot(partition, log_, now_ms=now_ms)

    def flush(self, transactional_id: str) -> None:
        """fsync the partition holding ``transactional_id``'s records (crash tests)."""
        self._log(self.partition_for(transactional_id)).flush()

    def _maybe_snapshot(self, partition: int, log_: Log, *, now_ms: int) -> None:
        span = log_.log_end_offset - log_.log_start_offset
        if span < self._snapshot_min_records:
            return
        try:
            with log_.lock:
                with self._live_lock:
                    live = [
                        (encode_txn_key(t), v)
                        for t, v in self._live.items()
                        if self.partition_for(t) == partition
                    ]
                if 2 * len(live) > span:
                    return
                log_.roll(now_ms=now_ms)
                start = log_.log_end_offset
                for i in range(0, len(live), _SNAPSHOT_BATCH_RECORDS):
                    chunk = live[i : i + _SNAPSHOT_BATCH_RECORDS]
                    buf = build_batch([(k, v, (), now_ms) for k, v in chunk], base_timestamp=now_ms)
                    log_.append(buf, now_ms=now_ms)
                log_.high_watermark = log_.log_end_offset
                log_.delete_records(start)
        except (LoglakeError, OSError) as e:
            log.error(
                "%s-%d: snapshot compaction failed: %s", TRANSACTION_STATE_TOPIC, partition, e
            )
            return
        log.info(
            "%s-%d: compacted %d records to %d live ones",
            TRANSACTION_STATE_TOPIC,
            partition,
            span,
            len(live),
        )

    def _log(self, partition: int) -> Log:
        log_ = self._logs.get(partition)
        if log_ is None:
            with self._logs_lock:
                log_ = self._logs.get(partition)
                if log_ is None:
                    self._ensure_topic_config()
                    log_ = self._log_manager.get_or_create_log(TRANSACTION_STATE_TOPIC, partition)
                    self._logs[partition] = log_
        return log_

    def _ensure_topic_config(self) -> None:
        if self._config_checked:
            return
        wanted = {"cleanup.policy": "compact", "segment.bytes": str(self._segment_bytes)}
        current: dict[str, str] = {}
        for d in self._log_manager.log_dirs:
            try:
                current.update(read_topic_config(d, TRANSACTION_STATE_TOPIC))
            except (LoglakeError, OSError):
                continue
        if any(current.get(k) != v for k, v in wanted.items()):
            self._log_manager.set_topic_config(TRANSACTION_STATE_TOPIC, {**current, **wanted})
        self._config_checked = True

    # --- loading ------------------------------------------------------------------------

    def load(self) -> dict[str, TxnLogValue]:
        """The latest state of every transactional id in the existing partitions.

        A record that cannot be decoded is skipped and counted (logged once per partition):
        a foreign record must not stop the broker from starting. A record of an id that
        belongs to another partition (the partition count was changed) is read all the same.
        """
        state: dict[str, TxnLogValue] = {}
        live: dict[str, bytes] = {}
        logs = sorted(
            (lg for lg in self._log_manager.all_logs() if lg.topic == TRANSACTION_STATE_TOPIC),
            key=lambda lg: int(lg.partition),
        )
        for log_ in logs:
            self._logs[int(log_.partition)] = log_
            bad = 0
            for key, value in _iter_records(log_):
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


def _iter_records(log_: Log) -> Iterator[tuple[bytes | None, bytes | None]]:
    """(key, value) of every data record of ``log_``, from its log start offset to its end."""
    offset = int(log_.log_start_offset)
    end = int(log_.log_end_offset)
    while offset < end:
        fetched = log_.read(offset, _LOAD_READ_BYTES)
        if fetched.length == 0:
            return
        data = os.pread(fetched.fileno, fetched.length, fetched.position)
        next_offset = offset
        for pos, header in iter_batches(data, allow_torn_tail=True):
            next_offset = header.next_offset
            if header.next_offset <= offset or header.is_control:
                continue
            _, records = decode_batch(data, pos)
            for rec in records:
                if rec.offset >= offset:
                    yield rec.key, rec.value
        if next_offset <= offset:
            raise CorruptRecordError(
                f"{TRANSACTION_STATE_TOPIC}-{log_.partition}: no progress reading at {offset}"
            )
        offset = next_offset
