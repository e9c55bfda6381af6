"""A partition's log: ordered segments, offset assignment, reads as file slices, retention.

Kafka's ``UnifiedLog`` + ``LocalLog`` for one ``<topic>-<partition>`` directory. The directory
holds segments named by base offset (see :mod:`logstore.storage.segment`) and a
``leader-epoch-checkpoint``; the log-dir-wide checkpoints (recovery point, high watermark, log
start offset) are written by :class:`~logstore.storage.log_manager.LogManager`.

Offsets: ``log_start_offset <= high_watermark <= log_end_offset``. Segments' base offsets
strictly increase; the last segment is the *active* one, the only one appended to. Every batch
in the log has offsets above the previous batch's (gaps are allowed: compaction, truncation).

Appends (:meth:`Log.append`) take the producer's buffer, validate every batch first (so bad
input appends nothing), stamp base offsets and the leader epoch in place (outside the CRC),
optionally rewrite LogAppendTime (recomputing the CRC), roll if needed and write the buffer to
the active segment in one ``pwrite``. No per-record work: batch headers only.

Reads (:meth:`Log.read`) return a :class:`FetchSlice` — file descriptor, position, length —
for ``os.sendfile``; the bytes never pass through Python.

Thread-safety: mutating methods (append, roll, flush, truncate, retention, close) serialise on
the log's lock. :meth:`read`, :meth:`offset_for_timestamp` and the offset properties may be
called from any thread without the lock: they use a snapshot of the segment list (replaced,
never mutated in place) and of the log end offset, which only advances after the bytes were
written. A :class:`FetchSlice`'s descriptor stays valid for ``file.delete.delay.ms`` after its
segment is deleted by retention (segments are renamed ``.deleted`` and closed later), which is
the window Kafka gives in-flight fetches too.

Storage errors (a full disk, an I/O error) take the log *offline for appends*, Kafka's
reaction to an ``IOException`` narrowed to one partition: the failed operation leaves the log as
it was (a failed write is cut back, a segment that cannot be created is not), every append is
refused with :class:`~logstore.errors.LogOfflineError` (the broker answers
``KAFKA_STORAGE_ERROR``), and reads, offsets and timestamps keep working on what is there. It
is logged once, when the log goes offline. The log comes back by itself once the disk has room:
an append arriving at least ``offline_retry_ms`` (1 s) after the last attempt preallocates the
active segment's indexes again and is tried; when both succeed the log is online (logged),
otherwise it stays offline. A restart also retries (see :mod:`logstore.storage.loader`). A log
whose files may not match what it says (an fsync failed, or a failed write could not be cut
back: :attr:`Log.needs_recovery`) does not count as cleanly shut down: the log manager then
writes no clean-shutdown marker, so the next start recovers.

Producer state and transactions (Kafka's ``UnifiedLog`` owns them too): :attr:`Log.producer_state`
is loaded when the log opens, from the latest ``<offset>.snapshot`` plus the batches after it,
and the ``.txnindex`` of every segment recovery touched is rebuilt from its markers
(:mod:`logstore.storage.producer_loader`). A snapshot is written on each roll (at the new
segment's base offset, the state of every batch before it) and at a clean :meth:`close` (at the
log end offset); which snapshots are kept is :mod:`logstore.storage.producer_snapshot`'s rule
(the newest few; those below the log start go with their segments, those above a truncation
point with the truncation, which reloads the state). The state itself is changed by the
partition (:mod:`logstore.storage.partition`) under its append lock; ABORT markers add their
entry through :meth:`append_aborted_txn`, and :meth:`collect_aborted_txns` answers
READ_COMMITTED fetches from the segments' indexes.

Crash behaviour: nothing is fsynced except by :meth:`flush` (called by the flush policy:
``flush.messages``, ``flush.ms`` via the manager, and on roll for the rolled segment). On open
after an unclean shutdown the log is recovered from the recovery point (see
:mod:`logstore.storage.loader`): the log then holds exactly the whole valid batches that reached
the disk, in order.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from crc32c import crc32c

from logstore.errors import (
    CorruptRecordError,
    InvalidTopicError,
    LogClosedError,
    LoglakeError,
    LogOfflineError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    StorageError,
)
from logstore.protocol.batch import (
    ATTRIBUTES_OFFSET,
    CODEC_MASK,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    BatchHeader,
    set_log_append_time,
    stamp_batch,
    validate_batch,
)
from logstore.protocol.records import first_record_at_time
from logstore.storage.checkpoints import LeaderEpochCache
from logstore.storage.config import LogConfig
from logstore.storage.files import (
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LEADER_EPOCH_CHECKPOINT,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    fsync_dir,
    parse_partition_dir,
    segment_path,
)
from logstore.storage.loader import LoadResult, load_segments
from logstore.storage.producer_loader import ProducerStateLoad, load_producer_state
from logstore.storage.producer_snapshot import MAX_SNAPSHOTS, delete_snapshots, take_snapshot
from logstore.storage.producer_state import ProducerStateManager
from logstore.storage.retention import RULE_LOG_START, retention_plan
from logstore.storage.scheduler import Scheduler
from logstore.storage.segment import BatchInfo, LogSegment
from logstore.storage.txn_index import AbortedTxn

__all__ = [
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "MAX_TIMESTAMP",
    "AppendInfo",
    "FetchSlice",
    "Log",
    "LogConfig",
    "analyze_batches",
]

_log = logging.getLogger(__name__)

_MAX_CODEC = 4  # zstd
_MIN_RECORD_SIZE = 7  # as protocol.batch: the smallest possible uncompressed record

# Kafka's ListOffsets special timestamps.
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def analyze_batches(
    buf: bytearray | memoryview, *, max_message_bytes: int
) -> list[tuple[int, BatchHeader]]:
    """``(position, header)`` of every batch of a producer's ``buf``, each fully checked.

    Kafka's ``analyzeAndValidateRecords``: the whole batch present, magic 2, size at most
    ``max_message_bytes`` (:class:`RecordTooLargeError`), a known codec, the CRC-32C, and
    ``records_count == last_offset_delta + 1 > 0``; any failure raises
    :class:`CorruptRecordError` (:class:`~logstore.errors.UnsupportedMagicError` for magic 0/1)
    naming the position. One ``struct`` unpack per batch, headers only: the records are not
    touched, and the headers are what the caller needs next (producer state, offsets).
    """
    total = len(buf)
    if total == 0:
        raise CorruptRecordError("produce request holds no record batch")
    out: list[tuple[int, BatchHeader]] = []
    pos = 0
    unpack = HEADER.unpack_from
    new = tuple.__new__
    while pos < total:
        if total - pos < HEADER_SIZE:
            validate_batch(buf, pos, exact_count=True)  # raises: torn header
        fields = unpack(buf, pos)
        _, length, _, magic, crc, attrs, delta, _, _, _, _, _, count = fields
        size = length + LOG_OVERHEAD
        if size > max_message_bytes and magic == MAGIC:
            raise RecordTooLargeError(
                f"batch of {size} bytes exceeds max.message.bytes {max_message_bytes}",
                position=pos,
            )
        # The checks of protocol.validate_batch(exact_count=True), inlined: this runs once
        # per produced batch. On any failure validate_batch itself names the problem.
        if (
            magic != MAGIC
            or length < HEADER_SIZE - LOG_OVERHEAD
            or size > total - pos
            or attrs & CODEC_MASK > _MAX_CODEC
            or delta < 0
            or count <= 0
            or count != delta + 1
            or (attrs & CODEC_MASK == 0 and count * _MIN_RECORD_SIZE > size - HEADER_SIZE)
            or crc32c(buf[pos + ATTRIBUTES_OFFSET : pos + size]) != crc
        ):
            validate_batch(buf, pos, exact_count=True)
            raise CorruptRecordError("batch failed validation", position=pos)
        out.append((pos, new(BatchHeader, fields)))
        pos += size
    return out


class AppendInfo(NamedTuple):
    """The result of one :meth:`Log.append`.

    ``max_timestamp`` and ``offset_of_max_timestamp`` are over the appended batches (the offset
    is the last offset of the first batch carrying that maximum, Kafka's shallow form);
    ``log_append_time_ms`` is the broker time written into the batches, or -1 with CreateTime.
    """

    first_offset: int
    last_offset: int
    max_timestamp: int
    offset_of_max_timestamp: int
    log_append_time_ms: int
    num_batches: int
    num_records: int
    valid_bytes: int


class FetchSlice(NamedTuple):
    """A byte range of a segment file to send with ``os.sendfile(sock, fileno, position, length)``.

    ``first_offset`` is the base offset of the first batch in the slice (it may be below the
    requested offset: the slice starts at the batch that holds it), or the requested offset
    when ``length == 0``. The slice may end in a partial batch, as in Kafka.
    """

    path: Path
    fileno: int
    position: int
    length: int
    first_offset: int


class Log:
    """One partition's log; see the module docstring. Open with :meth:`Log.open`."""

    # how long an offline log refuses appends before the next one tries the disk again
    offline_retry_ms = 1_000

    def __init__(
        self,
        dir: Path,
        config: LogConfig,
        loaded: LoadResult,
        *,
        scheduler: Scheduler | None = None,
        now_ms: int | None = None,
    ) -> None:
        parsed = parse_partition_dir(dir.name)
        if parsed is None:
            raise InvalidTopicError("log directory name is not <topic>-<partition>", path=str(dir))
        self._dir = dir
        self.topic, self.partition = parsed
        self._config = config
        self._scheduler = scheduler
        self._lock = threading.RLock()
        self._segments: list[LogSegment] = loaded.segments
        self._bases: list[int] = [s.base_offset for s in self._segments]
        self._next_offset = loaded.next_offset
        self._log_start_offset = loaded.log_start_offset
        self._recovery_point = loaded.recovery_point
        self._high_watermark = self._log_start_offset
        self.load_result = loaded
        self.leader_epoch_cache = LeaderEpochCache(dir / LEADER_EPOCH_CHECKPOINT)
        try:
            self.leader_epoch_cache.truncate_from_end(self._next_offset)
        except StorageError as exc:
            # the cache in memory is right; the stale file is truncated again at the next start
            _log.warning("%s: leader-epoch-checkpoint not rewritten: %s", dir.name, exc)
        self.unflushed_messages = 0
        self.last_flush_ms = _now_ms() if now_ms is None else now_ms
        self._closed = False
        self._offline_reason: str | None = None
        self.storage_errors = 0  # storage failures since open (the broker's metrics)
        self._failed_at = 0.0  # time.monotonic() of the last storage failure
        self._flush_failed = False
        self._txn_index_failed = False
        if loaded.offline_reason is not None:
            self._go_offline(loaded.offline_reason)
        # Kafka's UnifiedLog owns the producer state too: roll and close snapshot it, and
        # recovery rebuilds it together with the .txnindex of the recovered segments
        self.producer_state = ProducerStateManager(self.topic, self.partition)
        self.producer_load = self._load_producer_state(loaded.recovered_segments)

    # -- producer state -------------------------------------------------------------------------

    def _load_producer_state(self, recovered: Sequence[int] = ()) -> ProducerStateLoad:
        """(Re)load :attr:`producer_state` from the latest snapshot and the batches after it;
        rebuild the ``.txnindex`` of ``recovered`` segments (:mod:`producer_loader`)."""
        result = load_producer_state(
            self.producer_state,
            self._dir,
            self._segments,
            self.iter_located_headers,
            log_start_offset=self._log_start_offset,
            log_end_offset=self._next_offset,
            recovered_segments=recovered,
        )
        if result.txn_index_error is not None:
            # no clean shutdown marker then: the next start rebuilds it again
            self._txn_index_failed = True
            self._go_offline(result.txn_index_error)
        return result

    def take_snapshot(self) -> bool:
        """Write the producer state at the log end offset as ``<offset>.snapshot`` (roll,
        clean shutdown) unless one is there already, keeping the newest
        :data:`MAX_SNAPSHOTS`; False (logged) when the disk refused: snapshots only shorten
        the next load, they are never needed for correctness."""
        with self._lock:
            return take_snapshot(
                self._dir,
                self._next_offset,
                self.producer_state.snapshot_entries,
                keep=MAX_SNAPSHOTS,
            )

    @classmethod
    def open(
        cls,
        dir: str | os.PathLike[str],
        config: LogConfig,
        *,
        recovery_point: int = 0,
        log_start_offset: int = 0,
        clean_shutdown: bool = False,
        scheduler: Scheduler | None = None,
    ) -> Log:
        """Open (creating if needed) the log in ``dir``; recover it unless ``clean_shutdown``.

        ``dir`` must be named ``<topic>-<partition>``. ``recovery_point`` and
        ``log_start_offset`` come from the log directory's checkpoints. ``scheduler`` runs the
        delayed deletion of retired segments and the flush of rolled segments; without one both
        happen immediately.
        """
        path = Path(dir)
        if parse_partition_dir(path.name) is None:
            raise InvalidTopicError("log directory name is not <topic>-<partition>", path=str(path))
        loaded = load_segments(
            path,
            config,
            recovery_point=recovery_point,
            log_start_offset=log_start_offset,
            clean_shutdown=clean_shutdown,
        )
        return cls(path, config, loaded, scheduler=scheduler)

    # -- state --------------------------------------------------------------------------------

    @property
    def dir(self) -> Path:
        return self._dir

    @property
    def config(self) -> LogConfig:
        return self._config

    @config.setter
    def config(self, value: LogConfig) -> None:
        with self._lock:
            self._config = value

    @property
    def lock(self) -> threading.RLock:
        """The log's re-entrant lock: hold it to make a check plus :meth:`append` atomic
        (e.g. producer-state validation in the broker)."""
        return self._lock

    @property
    def segments(self) -> list[LogSegment]:
        """A snapshot of the segments, oldest first (the last one is active)."""
        return list(self._segments)

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._next_offset

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @high_watermark.setter
    def high_watermark(self, value: int) -> None:
        """Set the high watermark, clamped to ``[log_start_offset, log_end_offset]``."""
        with self._lock:
            self._high_watermark = min(max(value, self._log_start_offset), self._next_offset)

    @property
    def offline_reason(self) -> str | None:
        """Why the log refuses appends (a storage error), or None when it takes them."""
        return self._offline_reason

    @property
    def needs_recovery(self) -> bool:
        """Whether the files may differ from what the log says, so that the next start must
        not skip recovery: an fsync failed (what reached the disk is unknown) or a failed
        write could not be cut back. Other storage errors (no room to write or preallocate)
        leave the files exactly as the log describes them."""
        return (
            self._flush_failed or self._txn_index_failed or any(s.torn_tail for s in self._segments)
        )

    def _go_offline(self, reason: str) -> None:
        if self._offline_reason is None:
            _log.error(
                "%s is offline for appends: %s. Reads continue; appends are retried once the "
                "disk has room (at most every %d ms) or after a restart",
                self._dir.name,
                reason,
                self.offline_retry_ms,
            )
        self._offline_reason = reason
        self._failed_at = time.monotonic()
        self.storage_errors += 1

    def _offline_error(self) -> LogOfflineError:
        return LogOfflineError(
            f"{self._dir.name} is offline for appends: {self._offline_reason}",
            path=str(self._dir),
        )

    def _prepare_active(self) -> None:
        """Preallocate the active segment's indexes if they have no room (a full disk at
        load or at a failed roll). :class:`StorageError` when the disk still has none and
        the segment is empty; a non-empty one with full indexes makes the append roll to a
        new segment instead, which allocates its own (and fails the same way without room)."""
        active = self._segments[-1]
        if active.offset_index.has_room and active.time_index.has_room:
            return
        try:
            active.resize_indexes(self._config.segment_index_bytes)
        except StorageError:
            if active.size == 0:
                raise

    def _storage_failure(self, exc: OSError | StorageError) -> LogOfflineError:
        """Take the log offline after ``exc``; the error to raise to the appender."""
        if isinstance(exc, StorageError):
            self._go_offline(str(exc))
        else:
            self._go_offline(f"{exc.strerror or exc} [{exc.filename or self._dir}]")
        return self._offline_error()

    @property
    def size(self) -> int:
        """Bytes in all segments."""
        return sum(s.size for s in self._segments)

    def __repr__(self) -> str:
        return (
            f"Log({self._dir.name}, start={self._log_start_offset}, hw={self._high_watermark}, "
            f"end={self._next_offset}, segments={len(self._segments)})"
        )

    # -- append -------------------------------------------------------------------------------

    def append(
        self,
        buf: bytearray | memoryview,
        *,
        leader_epoch: int = 0,
        now_ms: int | None = None,
        analyzed: Sequence[tuple[int, BatchHeader]] | None = None,
    ) -> AppendInfo:
        """Validate, assign offsets to and append the v2 batches in ``buf`` (writable).

        All batches are checked before anything is written (:func:`analyze_batches`); any
        failure raises :class:`CorruptRecordError` (:class:`RecordTooLargeError` for size)
        and appends nothing. ``analyzed`` is that function's result for this very ``buf``
        when the caller already has it (the partition, which also needs the headers): then
        the batches are not parsed again. Then, under the lock: base offsets and
        ``leader_epoch`` are stamped in place, LogAppendTime is applied when the topic says
        so, the log rolls if needed, and ``buf`` is written unchanged otherwise in one write.

        :class:`LogOfflineError` when the log is offline or a storage error takes it offline
        now; :class:`LogClosedError` when the log was closed; nothing is appended then (see
        the module docstring).
        """
        view = memoryview(buf)
        if view.readonly:
            view.release()
            raise TypeError("Log.append needs a writable buffer (bytearray or memoryview)")
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        try:
            if analyzed is None:
                analyzed = analyze_batches(view, max_message_bytes=self._config.max_message_bytes)
            return self._append(view, analyzed, leader_epoch, now_ms)
        finally:
            view.release()

    def _append(
        self,
        view: memoryview,
        batches: Sequence[tuple[int, BatchHeader]],
        leader_epoch: int,
        now_ms: int | None,
    ) -> AppendInfo:
        total = view.nbytes
        with self._lock:
            if self._closed:
                raise LogClosedError(f"log {self._dir.name} is closed", path=str(self._dir))
            was_offline = self._offline_reason is not None
            if was_offline:
                if time.monotonic() < self._failed_at + self.offline_retry_ms / 1000:
                    raise self._offline_error()
                try:
                    self._prepare_active()
                except (OSError, StorageError) as exc:
                    raise self._storage_failure(exc) from exc
            now = _now_ms() if now_ms is None else now_ms
            append_time = self._config.log_append_time
            first = next_offset = self._next_offset
            infos: list[BatchInfo] = []
            max_ts, max_ts_offset = -1, first
            records = 0
            for bpos, h in batches:
                size = h.batch_length + LOG_OVERHEAD
                delta = h.last_offset_delta
                count = h.records_count
                batch_max_ts = h.max_timestamp
                stamp_batch(
                    view, bpos, base_offset=next_offset, partition_leader_epoch=leader_epoch
                )
                if append_time:
                    set_log_append_time(view, bpos, now)
                    ts = now
                else:
                    ts = batch_max_ts
                last = next_offset + delta
                if ts > max_ts:
                    max_ts, max_ts_offset = ts, last
                infos.append(BatchInfo(bpos, size, last, ts))
                records += count
                next_offset = last + 1
            try:
                # Before the write, as Kafka's appendAsLeader: a failure here appends nothing.
                self.leader_epoch_cache.assign(leader_epoch, first)
                segment = self._maybe_roll(total, max_ts, next_offset - 1, now)
                segment.append(view, infos)
            except (OSError, StorageError) as exc:
                raise self._storage_failure(exc) from exc
            self._next_offset = next_offset
            if was_offline:
                _log.info("%s is back online for appends", self._dir.name)
                self._offline_reason = None
            self.unflushed_messages += next_offset - first
            if self.unflushed_messages >= self._config.flush_messages:
                self._flush(next_offset)
        return AppendInfo(
            first_offset=first,
            last_offset=next_offset - 1,
            max_timestamp=max_ts,
            offset_of_max_timestamp=max_ts_offset,
            log_append_time_ms=now if append_time else -1,
            num_batches=len(infos),
            num_records=records,
            valid_bytes=total,
        )

    # -- roll ---------------------------------------------------------------------------------

    def _maybe_roll(self, size: int, max_ts: int, max_offset: int, now_ms: int) -> LogSegment:
        active = self._segments[-1]
        if active.size > 0 and active.should_roll(
            messages_size=size,
            max_timestamp_in_messages=max_ts,
            max_offset_in_messages=max_offset,
            now_ms=now_ms,
            segment_bytes=self._config.segment_bytes,
            segment_ms=self._config.segment_ms,
        ):
            return self._roll(now_ms)
        return active

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"log {self._dir.name} is closed", path=str(self._dir))

    def roll(self, *, now_ms: int | None = None) -> LogSegment:
        """Start a new active segment at the log end offset (no-op if the active one is empty)."""
        with self._lock:
            self._check_open()
            try:
                return self._roll(_now_ms() if now_ms is None else now_ms)
            except (OSError, StorageError) as exc:
                raise self._storage_failure(exc) from exc

    def _roll(self, now_ms: int) -> LogSegment:
        active = self._segments[-1]
        if active.size == 0:
            return active
        new_base = self._next_offset
        for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
            # stale files of a segment truncated away earlier would be reopened, not recreated
            segment_path(self._dir, new_base, suffix).unlink(missing_ok=True)
        active.on_become_inactive()
        # A full disk fails here, before the new segment exists (its files are removed): the
        # old one stays active with trimmed indexes, so the next append tries to roll again.
        seg = LogSegment.open(
            self._dir,
            new_base,
            index_interval_bytes=self._config.index_interval_bytes,
            max_index_size=self._config.segment_index_bytes,
            created_ms=now_ms,
        )
        try:
            seg.prepare_active(
                roll_jitter_ms=self._config.random_segment_jitter(),
                reserve_bytes=self._config.segment_bytes if self._config.preallocate else 0,
            )
        except StorageError:
            seg.close_handlers()
            for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
                segment_path(self._dir, new_base, suffix).unlink(missing_ok=True)
            raise
        self._segments = [*self._segments, seg]
        self._bases = [*self._bases, new_base]
        # the state after every batch of the rolled segment: the next load replays from here
        self.take_snapshot()
        # Kafka flushes the rolled segment in the background right away, which moves the
        # recovery point to the new segment and keeps post-crash recovery short.
        if self._scheduler is not None and self._scheduler.running:
            self._scheduler.schedule(
                f"flush-{self._dir.name}", lambda: self._flush_rolled(new_base), delay_ms=0
            )
        else:
            self._flush(new_base)
        return seg

    # -- read ---------------------------------------------------------------------------------

    def _segment_index_for(self, offset: int, bases: list[int]) -> int:
        return max(bisect.bisect_right(bases, offset) - 1, 0)

    def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        min_one_batch: bool = True,
    ) -> FetchSlice:
        """A slice of one segment starting at the batch that holds ``offset``.

        At most ``max_bytes`` (but the whole first batch when ``min_one_batch``), never data at
        or above ``max_offset`` (exclusive, e.g. the high watermark for consumers). ``length``
        is 0 at the log end. :class:`OffsetOutOfRangeError` when ``offset`` is outside
        ``[log_start_offset, log_end_offset]``.
        """
        segments = self._segments
        bases = self._bases
        end = self._next_offset
        start = self._log_start_offset
        if offset < start or offset > end:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside [{start}, {end}] of {self._dir.name}"
            )
        limit = end if max_offset is None else min(max_offset, end)
        if offset >= limit:
            active = segments[-1]
            if offset == end:
                return FetchSlice(active.path, active.fileno, active.size, 0, offset)
            i = self._segment_index_for(offset, bases)
            loc = segments[i].translate_offset(offset)
            seg = segments[i]
            position = seg.size if loc is None else loc.position
            return FetchSlice(seg.path, seg.fileno, position, 0, offset)
        i = self._segment_index_for(offset, bases)
        while i < len(segments):
            seg = segments[i]
            max_position: int | None = None
            if max_offset is not None and (i + 1 >= len(segments) or bases[i + 1] > limit):
                loc = seg.translate_offset(limit)
                max_position = None if loc is None else loc.position
            found = seg.read(
                offset, max_bytes, max_position=max_position, min_one_message=min_one_batch
            )
            if found is not None:
                position, length, first = found
                return FetchSlice(seg.path, seg.fileno, position, length, first)
            i += 1
        active = segments[-1]
        return FetchSlice(active.path, active.fileno, active.size, 0, offset)

    def segment_for(self, offset: int) -> LogSegment:
        """The segment whose range holds ``offset`` (the first one below the log start)."""
        segments = self._segments
        return segments[min(self._segment_index_for(offset, self._bases), len(segments) - 1)]

    def segment_end_offset(self, offset: int) -> int:
        """The offset after the range of the segment holding ``offset``: the next segment's
        base offset, or the log end offset for the active segment."""
        bases = self._bases
        i = bisect.bisect_right(bases, offset)
        return bases[i] if i < len(bases) else self._next_offset

    def append_aborted_txn(self, txn: AbortedTxn) -> None:
        """Add ``txn`` to the ``.txnindex`` of the segment holding its ABORT marker.

        A failed write takes the log offline (:class:`LogOfflineError`) and marks it as not
        cleanly closable, so that the next start rebuilds the index from the markers."""
        with self._lock:
            try:
                self.segment_for(txn.last_offset).txn_index.append(txn)
            except StorageError as exc:
                self._txn_index_failed = True
                raise self._storage_failure(exc) from exc

    def collect_aborted_txns(self, start_offset: int, upper_bound_offset: int) -> list[AbortedTxn]:
        """The aborted transactions overlapping ``[start_offset, upper_bound_offset)``
        (Kafka's ``collectAbortedTransactions``): from the segment holding ``start_offset``
        on, until an entry shows that no later marker can belong to a transaction begun
        below the bound. Reads the indexes' entries in memory, no file."""
        segments = self._segments
        out: list[AbortedTxn] = []
        first = min(self._segment_index_for(start_offset, self._bases), len(segments) - 1)
        for seg in segments[first:]:
            found = seg.txn_index.collect(start_offset, upper_bound_offset)
            out.extend(found.aborted)
            if found.complete:
                break
        return out

    def iter_headers(self, start_offset: int | None = None) -> Iterator[BatchHeader]:
        """Every batch header (61 bytes, no CRC check) from the batch holding ``start_offset``
        (default: the log start) up to the log end offset seen when iteration starts.

        Headers only, read in chunks: what the broker rebuilds producer state from. Safe to
        run while appends continue (they are not included).
        """
        for _seg, _pos, header in self.iter_located_headers(start_offset):
            yield header

    def iter_located_headers(
        self, start_offset: int | None = None
    ) -> Iterator[tuple[LogSegment, int, BatchHeader]]:
        """:meth:`iter_headers` with each header's segment and position in it (to read a
        control batch's record)."""
        segments = self._segments
        bases = self._bases
        end = self._next_offset
        start = self._log_start_offset if start_offset is None else start_offset
        for i in range(self._segment_index_for(start, bases), len(segments)):
            seg = segments[i]
            position = seg.offset_index.lookup(start).position  # 0 below the first entry
            for pos, header in seg.headers(position):
                last = header.base_offset + header.last_offset_delta
                if header.base_offset >= end:
                    return
                if last >= start:
                    yield seg, pos, header

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """Kafka ListOffsets: ``(offset, timestamp)`` of the first record with timestamp >= ``ts``.

        Special values: -2 (earliest) gives ``(log_start_offset, -1)``, -1 (latest)
        ``(log_end_offset, -1)``, -3 (KIP-734 max timestamp) the offset and value of the
        largest timestamp (the record's, in the first batch reaching it, as Kafka 3.8+ after
        KAFKA-16310; before, the batch's last offset). ``None`` when no record is that recent.
        Decodes at most the records of the batches around the match (reference decoder: not a
        hot path).
        """
        if timestamp == EARLIEST_TIMESTAMP:
            return (self._log_start_offset, -1)
        if timestamp == LATEST_TIMESTAMP:
            return (self._next_offset, -1)
        segments = self._segments
        start = self._log_start_offset
        if timestamp == MAX_TIMESTAMP:
            return _offset_of_max_timestamp(segments)
        for seg in segments:
            if seg.max_timestamp_so_far < timestamp:
                continue
            floor = seg.time_index.lookup(timestamp)
            position = seg.offset_index.lookup(max(floor.offset, start)).position
            for loc in seg.batches(position):
                if loc.max_timestamp < timestamp or loc.last_offset < start:
                    continue
                found = first_record_at_time(
                    os.pread(seg.fileno, loc.size, loc.position),
                    timestamp=timestamp,
                    min_offset=start,
                )
                if found is not None:
                    return found
        return None

    # -- flush --------------------------------------------------------------------------------

    def _flush_rolled(self, offset: int) -> None:
        # a failure took the log offline and was logged there; nothing for the scheduler
        with contextlib.suppress(StorageError):
            self.flush(offset)

    def flush(self, offset: int | None = None) -> None:
        """fsync the segments holding offsets below ``offset`` (default: all); move the
        recovery point there. A failed fsync takes the log offline and raises
        :class:`LogOfflineError`; the recovery point stays where it was."""
        with self._lock:
            self._flush(self._next_offset if offset is None else min(offset, self._next_offset))

    def _flush(self, offset: int) -> None:
        if self._closed or offset <= self._recovery_point:
            return
        try:
            for i, seg in enumerate(self._segments):
                seg_end = self._bases[i + 1] if i + 1 < len(self._bases) else self._next_offset
                if seg_end > self._recovery_point and seg.base_offset < offset and not seg.closed:
                    seg.flush()
            fsync_dir(self._dir)
        except OSError as exc:
            self._flush_failed = True
            raise self._storage_failure(exc) from exc
        self._recovery_point = offset
        if offset >= self._next_offset:
            self.unflushed_messages = 0
        self.last_flush_ms = _now_ms()

    # -- truncation and deletion ----------------------------------------------------------------

    def truncate_to(self, offset: int) -> bool:
        """Remove every batch whose last offset is >= ``offset``; True if anything changed.

        Segments above ``offset`` are deleted; the log end offset becomes ``offset``.
        """
        if offset < 0:
            raise OffsetOutOfRangeError(f"cannot truncate {self._dir.name} to {offset}")
        with self._lock:
            self._check_open()
            if offset >= self._next_offset:
                return False
            if offset < self._segments[0].base_offset:
                self._truncate_fully_and_start_at(offset)
                return True
            doomed = [s for s in self._segments if s.base_offset > offset]
            if doomed:
                self._remove_segments(doomed, immediately=True, allow_all=True)
            active = self._segments[-1]
            active.truncate_to(offset)
            self._next_offset = offset
            self._recovery_point = min(self._recovery_point, offset)
            self._log_start_offset = min(self._log_start_offset, offset)
            self._high_watermark = min(self._high_watermark, offset)
            self._after_truncation(offset, clear_epochs=False)
            # Kafka's truncateAndReload: snapshots above the new end describe batches gone
            delete_snapshots(self._dir, above=offset)
            self._load_producer_state()
            return True

    def _after_truncation(self, offset: int, *, clear_epochs: bool) -> None:
        """The truncation is done: forget later epochs and give the active segment's indexes
        room again; a full disk takes the log offline here instead of failing."""
        try:
            if clear_epochs:
                self.leader_epoch_cache.clear()
            else:
                self.leader_epoch_cache.truncate_from_end(offset)
            self._segments[-1].resize_indexes(self._config.segment_index_bytes)
        except (OSError, StorageError) as exc:
            self._storage_failure(exc)

    def _truncate_fully_and_start_at(self, offset: int) -> None:
        self._remove_segments(list(self._segments), immediately=True, allow_all=True)
        seg = LogSegment.open(
            self._dir,
            offset,
            index_interval_bytes=self._config.index_interval_bytes,
            max_index_size=self._config.segment_index_bytes,
            preallocate=False,
        )
        self._segments = [seg]
        self._bases = [offset]
        self._next_offset = offset
        self._log_start_offset = offset
        self._recovery_point = offset
        self._high_watermark = offset
        self._after_truncation(offset, clear_epochs=True)
        delete_snapshots(self._dir, below=2**63 - 1)
        self.producer_state.clear()

    def _remove_segments(
        self, doomed: list[LogSegment], *, immediately: bool = False, allow_all: bool = False
    ) -> None:
        if not allow_all and doomed and doomed[-1] is self._segments[-1]:
            raise ValueError("the active segment is never deleted")
        ids = {id(s) for s in doomed}
        kept = [s for s in self._segments if id(s) not in ids]
        self._segments = kept
        self._bases = [s.base_offset for s in kept]
        delay = self._config.file_delete_delay_ms
        for seg in doomed:
            seg.change_file_suffixes(seg.file_suffix, seg.file_suffix + DELETED_SUFFIX)
        if immediately or delay == 0 or self._scheduler is None or not self._scheduler.running:
            for seg in doomed:
                seg.delete()
        else:
            batch = list(doomed)

            def delete_later() -> None:
                for s in batch:
                    s.delete()

            self._scheduler.schedule(f"delete-{self._dir.name}", delete_later, delay_ms=delay)

    def delete_records(self, offset: int) -> int:
        """Kafka DeleteRecords: advance the log start offset to ``offset``; delete the whole
        segments below it. Returns the new log start offset.

        :class:`OffsetOutOfRangeError` when ``offset`` is above the high watermark.
        """
        with self._lock:
            self._check_open()
            if offset > self._high_watermark:
                raise OffsetOutOfRangeError(
                    f"cannot delete records of {self._dir.name} up to {offset}: above the high "
                    f"watermark {self._high_watermark}"
                )
            if offset > self._log_start_offset:
                self._log_start_offset = offset
                self.leader_epoch_cache.truncate_from_start(offset)
                self._delete_segments(lambda seg, nxt: nxt is not None and nxt <= offset)
                delete_snapshots(self._dir, below=offset)
            return self._log_start_offset

    def _delete_segments(self, predicate: Callable[[LogSegment, int], bool]) -> int:
        """Delete the oldest segments while ``predicate(segment, next_base)`` holds.

        Never the active segment, never a segment holding offsets at or above the high
        watermark (Kafka's ``deletableSegments``).
        """
        doomed: list[LogSegment] = []
        segs = self._segments
        for i, seg in enumerate(segs[:-1]):
            nxt = segs[i + 1].base_offset
            if nxt > self._high_watermark or not predicate(seg, nxt):
                break
            doomed.append(seg)
        if doomed:
            # the log start moves first, as in Kafka: no reader sees a start offset whose
            # segment file is already gone
            new_start = segs[len(doomed)].base_offset
            self._log_start_offset = max(self._log_start_offset, new_start)
            self._remove_segments(doomed)
            self.leader_epoch_cache.truncate_from_start(self._log_start_offset)
            delete_snapshots(self._dir, below=self._log_start_offset)
        return len(doomed)

    def delete_old_segments(
        self,
        now_ms: int | None = None,
        *,
        lake_offset: int | None = None,
        lake_max_bytes: int = -1,
        lake_valve: str = "",
    ) -> int:
        """Retention: delete segments by ``retention.ms``, ``retention.bytes`` and the log start
        offset (the first two only with ``cleanup.policy`` delete). Returns how many went.

        The rules are :func:`logstore.storage.retention.retention_plan` (shared with the
        retention job): ``retention.ms`` against each segment's largest timestamp,
        ``retention.bytes`` while the log stays at or over the limit without the segment,
        segments wholly below the log start offset; never the active segment.

        ``lake_offset``: the lake's committed next offset for this partition (the broker's
        ``log.retention.lake.group``); time and size retention then keep every segment holding
        an offset ``>= lake_offset``, unless the log is larger than ``lake_max_bytes``
        (``>= 0``, the safety valve; ``0`` opens it whatever the size), which deletes anyway
        and logs a WARN naming the offsets and ``lake_valve`` (why the valve is open).
        """
        now = _now_ms() if now_ms is None else now_ms
        with self._lock:
            if self._closed:
                return 0
            cfg = self._config
            rules = retention_plan(
                self._segments,
                retention_ms=cfg.retention_ms,
                retention_bytes=cfg.retention_bytes,
                delete_policy=cfg.delete,
                log_start_offset=self._log_start_offset,
                high_watermark=self._high_watermark,
                now_ms=now,
                lake_offset=lake_offset,
                lake_max_bytes=lake_max_bytes,
            )
            if not rules:
                return 0
            keep_from = self._segments[len(rules)].base_offset
            if lake_offset is not None:
                self._warn_lake_valve(rules, lake_offset, lake_valve)
            return self._delete_segments(lambda seg, nxt: nxt <= keep_from)

    def _warn_lake_valve(self, rules: list[str], lake_offset: int, why: str) -> None:
        """WARN when time/size retention (``rules``, about to be applied) deletes offsets at or
        above ``lake_offset`` that the log start offset had not already given up."""
        by_rule = sum(1 for r in rules if r != RULE_LOG_START)
        if not by_rule:
            return
        lost_from = max(lake_offset, self._log_start_offset, self._segments[0].base_offset)
        lost_to = self._segments[by_rule].base_offset
        if lost_to > lost_from:
            _log.warning(
                "%s: retention deletes offsets [%d, %d) the lake has not ingested (lake group "
                "committed offset %d): %s",
                self.dir.name,
                lost_from,
                lost_to,
                lake_offset,
                why or "the log is larger than log.retention.lake.max.bytes",
            )

    # -- cleaner hand-over ---------------------------------------------------------------------

    def replace_segments(self, new: LogSegment, old: list[LogSegment]) -> None:
        """Put the cleaned segment ``new`` in place of the consecutive segments ``old`` (never
        the active one); step b of :mod:`logstore.storage.swap`, which validated both.

        One assignment of the segment list, so readers see the old list or the new one; the
        old files are renamed ``.deleted`` and deleted after ``file.delete.delay.ms`` (open
        descriptors keep in-flight fetches valid), like retention's.
        """
        with self._lock:
            self._check_open()
            segs = self._segments
            start = next((i for i, s in enumerate(segs) if s is old[0]), None)
            if start is None or segs[start : start + len(old)] != old or segs[-1] in old:
                raise ValueError("replace_segments: old segments are not consecutive live ones")
            # the cleaner keeps markers and their transactions' records at their offsets, so
            # the replaced segments' aborted transactions are the new segment's
            carried = [e for seg in old for e in seg.txn_index.entries]
            if carried and not len(new.txn_index):
                try:
                    new.txn_index.rewrite(carried)
                except StorageError as exc:
                    self._txn_index_failed = True  # the next start rebuilds it
                    self._storage_failure(exc)
            kept = [*segs[:start], new, *segs[start + len(old) :]]
            # the new list first: a lockless reader never sees the range without a segment
            self._segments = kept
            self._bases = [s.base_offset for s in kept]
            self._remove_segments(old)

    # -- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Close every segment (indexes trimmed, final time index entries). No fsync.

        Every segment is closed even when one fails (a full disk refusing a final time index
        entry); :class:`StorageError` afterwards names the failures."""
        with self._lock:
            if self._closed:
                return
            if not self.needs_recovery:
                # clean shutdown: the next load replays nothing (a failure is only logged)
                self.take_snapshot()
            failures: list[str] = []
            for seg in self._segments:
                try:
                    seg.close()
                except (OSError, LoglakeError) as exc:
                    failures.append(f"{seg.path.name}: {exc}")
            self._closed = True
            if failures:
                raise StorageError(
                    f"closing {self._dir.name}: " + "; ".join(failures), path=str(self._dir)
                )

    @property
    def closed(self) -> bool:
        return self._closed

    def delete(self) -> None:
        """Close and remove the whole partition directory."""
        with self._lock:
            for seg in self._segments:
                seg.close_handlers()
            self._closed = True
            shutil.rmtree(self._dir, ignore_errors=True)
            parent = self._dir.parent
            if parent.exists():
                fsync_dir(parent)


def _offset_of_max_timestamp(segments: list[LogSegment]) -> tuple[int, int] | None:
    """``(offset, timestamp)`` of the record with the largest timestamp of ``segments``: the
    first segment reaching it, its first batch reaching it (the segment's cached maximum
    names that batch's last offset), that batch's first record carrying it (Kafka's
    ``RecordBatch.offsetOfMaxTimestamp``; under LogAppendTime the batch's first record)."""
    best: LogSegment | None = None
    for seg in segments:
        ts = seg.max_timestamp_so_far
        if ts >= 0 and (best is None or ts > best.max_timestamp_so_far):
            best = seg
    if best is None:
        return None
    ts, last = best.max_timestamp_so_far, best.offset_of_max_timestamp_so_far
    loc = best.translate_offset(last)
    if loc is not None and loc.max_timestamp == ts:
        data = os.pread(best.fileno, loc.size, loc.position)
        found = first_record_at_time(data, timestamp=ts, exact=True)
        if found is not None:
            return found
    return last, ts
