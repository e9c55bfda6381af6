"""A compacted internal topic a coordinator keeps: ``__consumer_offsets``, ``__transaction_state``.

A coordinator appends one record per change (its own key/value schema) to partition
``partition_for(key, n)`` of its topic through the ordinary :class:`logstore.storage.log.Log`:
the same segments, indexes, checkpoints and recovery as any topic. Later records win; a null
value (tombstone) removes the key. On start every partition is read back from its log start
offset to its end (:func:`iter_records`), exactly as a compacted topic is read.

:class:`CompactedInternalLog` holds what the two stores share and nothing of their schemas:

1. the partitions' logs, opened lazily (a partition's log appears with its first record);
2. the topic's stored overrides, ``cleanup.policy=compact`` and the segment size, written
   before the first log is opened so the directory describes itself (any other override an
   operator set is kept);
3. compaction by snapshot. Nothing else cleans these topics and every start reads them whole,
   so the owner does what Kafka's cleaner would, once at least half of a partition is dead
   records: (1) roll, so every older record is in a closed segment; (2) append the live value
   of every key of the partition; (3) advance the log start offset to the snapshot
   (DeleteRecords), which deletes the older segments. Later records win when reading back, so
   a crash between any two steps leaves a log that still loads to the same state. A failure
   is logged, never raised: the change that triggered it is already durable.

Thread-safety: opening a partition's log is serialised by this object's lock; appends and
snapshots are the owner's to serialise (the log's own lock, or the coordinator's).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence

from logstore.errors import CorruptRecordError, LoglakeError
from logstore.protocol.batch import BatchHeader, iter_batches
from logstore.protocol.records import Record, build_batch, decode_batch
from logstore.storage.log import Log
from logstore.storage.log_manager import LogManager
from logstore.storage.topic_config import read_topic_config

__all__ = ["CompactedInternalLog", "iter_records"]

log = logging.getLogger(__name__)

# Bytes read from a log per step while loading; a batch larger than this is still read whole
# (min_one_batch), so this only bounds memory for ordinary batches.
_LOAD_READ_BYTES = 4 * 1024 * 1024
# Records per batch of a snapshot: ~100 B each, well under max.message.bytes (1 MiB).
_SNAPSHOT_BATCH_RECORDS = 2_000


class CompactedInternalLog:
    """The partitions of one compacted internal topic (see the module docstring)."""

    def __init__(
        self,
        log_manager: LogManager,
        topic: str,
        *,
        segment_bytes: int,
        snapshot_min_records: int,
    ) -> None:
        self.topic = topic
        self._log_manager = log_manager
        self._segment_bytes = segment_bytes
        self._snapshot_min_records = snapshot_min_records
        self._logs: dict[int, Log] = {}
        self._logs_lock = threading.Lock()
        self._config_checked = False

    def log(self, partition: int) -> Log:
        """The log of ``partition``, created (with the topic's overrides) on first use."""
        log_ = self._logs.get(partition)
        if log_ is None:
            with self._logs_lock:
                log_ = self._logs.get(partition)
                if log_ is None:
                    self._ensure_topic_config()
                    log_ = self._log_manager.get_or_create_log(self.topic, partition)
                    self._logs[partition] = log_
        return log_

    def existing_logs(self) -> list[Log]:
        """The partitions' logs already on disk, by partition (loading reads them in order)."""
        found = sorted(
            (lg for lg in self._log_manager.all_logs() if lg.topic == self.topic),
            key=lambda lg: int(lg.partition),
        )
        with self._logs_lock:
            for lg in found:
                self._logs[int(lg.partition)] = lg
        return found

    def _ensure_topic_config(self) -> None:
        if self._config_checked:
            return
        wanted = {"cleanup.policy": "compact", "segment.bytes": str(self._segment_bytes)}
        current: dict[str, str] = {}
        for d in self._log_manager.log_dirs:
            try:
                current.update(read_topic_config(d, self.topic))
            except (LoglakeError, OSError):
                continue
        if any(current.get(k) != v for k, v in wanted.items()):
            self._log_manager.set_topic_config(self.topic, {**current, **wanted})
        self._config_checked = True

    # --- snapshot compaction ----------------------------------------------------------------

    def snapshot_due(self, log_: Log) -> bool:
        """Whether ``log_`` holds enough records for a snapshot to be worth considering."""
        return log_.log_end_offset - log_.log_start_offset >= self._snapshot_min_records

    def snapshot(
        self,
        partition: int,
        live: Sequence[tuple[bytes, bytes]],
        *,
        now_ms: int,
        append: Callable[[bytearray], object],
        delete_before: Callable[[int], object],
    ) -> None:
        """Compact ``partition`` to ``live`` (every live key's latest value) when at most half
        of its records are live: steps (1)-(3) of the module docstring. ``append`` appends one
        batch as the owner does (and moves the high watermark), ``delete_before`` advances
        the log start offset. Failures are logged, never raised."""
        log_ = self.log(partition)
        span = log_.log_end_offset - log_.log_start_offset
        if 2 * len(live) > span:
            return
        try:
            log_.roll(now_ms=now_ms)
            start = log_.log_end_offset
            for i in range(0, len(live), _SNAPSHOT_BATCH_RECORDS):
                chunk = live[i : i + _SNAPSHOT_BATCH_RECORDS]
                append(build_batch([(k, v, (), now_ms) for k, v in chunk], base_timestamp=now_ms))
            delete_before(start)
        except (LoglakeError, OSError) as e:
            log.error("%s-%d: snapshot compaction failed: %s", self.topic, partition, e)
            return
        log.info(
            "%s-%d: compacted %d records to %d live ones", self.topic, partition, span, len(live)
        )


def iter_records(log_: Log) -> Iterator[tuple[BatchHeader, Record]]:
    """(batch header, record) of every record of ``log_`` (control records included), from its
    log start offset to its end. Loading only: one object per record is fine here.

    Raises :class:`CorruptRecordError` when a read makes no progress or a batch cannot be
    decoded.
    """
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
            if header.next_offset <= offset:
                continue
            _, records = decode_batch(data, pos)
            for rec in records:
                if rec.offset >= offset:
                    yield header, rec
        if next_offset <= offset:
            raise CorruptRecordError(
                f"{log_.topic}-{log_.partition}: no progress reading at offset {offset}"
            )
        offset = next_offset
