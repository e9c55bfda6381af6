"""One log segment: a ``.log`` file of whole v2 batches plus its ``.index`` and ``.timeindex``
(and a ``.txnindex`` once a transaction aborts in it: :mod:`logstore.storage.txn_index`).

Bytes on disk: ``<20-digit base offset>.log`` is a plain concatenation of RecordBatch v2
batches exactly as producers sent them (after the broker stamped baseOffset and the partition
leader epoch); there is no file header. Every offset in the segment is >= ``base_offset`` and
< ``base_offset + 2**31`` (relative offsets are i32 in the indexes). See
:mod:`logstore.storage.index` for the index layouts.

Indexing (Kafka 3.7+ ``LogSegment.append``): for each appended batch, when more than
``index_interval_bytes`` were written since the last offset index entry, the batch's last
offset is mapped to its start position in ``.index`` and the segment's running
``(max timestamp, offset of max timestamp)`` is offered to ``.timeindex`` (appended only when
the maximum grew). The first batch of a segment therefore never has an entry: a lookup below
the first entry starts at position 0.

Invariants: ``size`` only ever covers whole batches (it is advanced after the bytes are
written); batches' offsets strictly increase; index entries point at batch starts.

Thread-safety: one writer at a time (the owning :class:`~logstore.storage.log.Log` holds its
lock around :meth:`append`, :meth:`truncate_to`, :meth:`recover`, roll and close). Readers may
call :meth:`translate_offset` and :meth:`read` concurrently with an append; they see a size
snapshot taken before or after it, never a half-written batch.

Crash behaviour: appends go to the page cache (``os.pwrite``); nothing is fsynced unless
:meth:`flush` is called. After a crash the ``.log`` may end in a torn batch and the indexes may
be stale or untrimmed; :meth:`recover` re-validates every batch (size, magic, CRC, increasing
offsets), truncates at the first bad one and rebuilds both indexes from the batches.

A full disk (or any I/O error) is a :class:`~logstore.errors.StorageError`, never a fault: an
append whose write fails cuts the ``.log`` back to its last whole batch (shrinking needs no
space) before raising, so the segment stays as it was; a new segment whose index files cannot
be preallocated is not created (see :mod:`logstore.storage.index`); :meth:`recover` writes the
rebuilt indexes with ``write(2)`` and, when that fails, removes them (the next start rebuilds
them) and raises :class:`IndexRebuildError` after the ``.log`` itself was recovered.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import struct
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from crc32c import crc32c

from logstore.errors import CorruptIndexError, CorruptRecordError, StorageError
from logstore.protocol.batch import (
    ATTRIBUTES_OFFSET,
    CODEC_MASK,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    BatchHeader,
    read_header,
    validate_batch,
)
from logstore.storage.files import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    reserve_blocks,
    segment_path,
)
from logstore.storage.index import (
    OFFSET_ENTRY_SIZE,
    TIME_ENTRY_SIZE,
    OffsetIndex,
    TimeIndex,
)
from logstore.storage.txn_index import TransactionIndex

__all__ = ["BatchInfo", "BatchLocation", "IndexRebuildError", "LogSegment"]

# The first 43 header bytes: baseOffset, batchLength, partitionLeaderEpoch, magic, crc,
# attributes, lastOffsetDelta, baseTimestamp, maxTimestamp. Enough to scan a segment.
_SCAN = struct.Struct(">qiibIhiqq")
_SCAN_CHUNK = 64 * 1024
_MAX_RELATIVE = 2**31 - 1
_MAX_CODEC = 4  # zstd
_MIN_RECORD_SIZE = 7  # as protocol.batch: the smallest possible uncompressed record
_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")


class IndexRebuildError(StorageError):
    """:meth:`LogSegment.recover` recovered the ``.log`` but could not write the rebuilt
    indexes (no space): they were removed, lookups scan from the segment start until a later
    start rebuilds them. ``truncated`` is what recovery cut from the ``.log``, as its return
    value would have said."""

    def __init__(self, message: str, *, path: str, truncated: int, errno: int | None) -> None:
        super().__init__(message, path=path, errno=errno)
        self.truncated = truncated


class BatchInfo(NamedTuple):
    """What a segment needs to know about a batch being appended (no bytes)."""

    position: int  # start of the batch in the caller's buffer
    size: int
    last_offset: int
    max_timestamp: int


class BatchLocation(NamedTuple):
    """A batch found in a segment's ``.log`` (header fields only)."""

    position: int
    size: int
    base_offset: int
    last_offset: int
    max_timestamp: int


def _diagnose(buf: mmap.mmap, pos: int, max_size: int | None) -> str:
    """Why the batch at ``pos`` is invalid, in protocol.validate_batch's words."""
    try:
        validate_batch(buf, pos, max_size=max_size)
    except CorruptRecordError as exc:
        return exc.message
    return "invalid batch"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class LogSegment:
    """A ``.log`` with its two indexes; see the module docstring for format and guarantees.

    Open with :meth:`open` (creates missing files). ``file_suffix`` (``""`` normally,
    ``".cleaned"`` / ``".swap"`` for cleaner output) is appended to every file name.
    ``preallocate=False`` creates missing index files empty instead of preallocated (loading
    and recovery, which must not need free space). When a file cannot be created the files
    this call created are removed and the error (:class:`StorageError` for a full disk) raised.
    """

    def __init__(
        self,
        dir: str | os.PathLike[str],
        base_offset: int,
        *,
        index_interval_bytes: int = 4096,
        max_index_size: int = 10485760,
        file_suffix: str = "",
        created_ms: int | None = None,
        preallocate: bool = True,
    ) -> None:
        self.dir = Path(dir)
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.max_index_size = max_index_size
        self.file_suffix = file_suffix
        self._log_path = segment_path(self.dir, base_offset, LOG_SUFFIX + file_suffix)
        log_created = not self._log_path.exists()
        self._fd = os.open(self._log_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self._size = os.fstat(self._fd).st_size
            offset_index_path = segment_path(self.dir, base_offset, INDEX_SUFFIX + file_suffix)
            time_index_path = segment_path(self.dir, base_offset, TIME_INDEX_SUFFIX + file_suffix)
            self.offset_index_existed = offset_index_path.exists()
            self.time_index_existed = time_index_path.exists()
            self.offset_index = OffsetIndex(
                offset_index_path,
                base_offset,
                max_index_size=max_index_size,
                preallocate=preallocate,
            )
            try:
                self.time_index = TimeIndex(
                    time_index_path,
                    base_offset,
                    max_index_size=max_index_size,
                    preallocate=preallocate,
                )
            except BaseException:
                if self.offset_index_existed:
                    self.offset_index.close_handler()
                else:
                    self.offset_index.delete()
                raise
        except BaseException:
            os.close(self._fd)
            if log_created:
                self._log_path.unlink(missing_ok=True)
            raise
        self.txn_index = TransactionIndex(
            segment_path(self.dir, base_offset, TXN_INDEX_SUFFIX + file_suffix), base_offset
        )
        self.created_ms = _now_ms() if created_ms is None else created_ms
        self._bytes_since_last_index_entry = 0
        # (max timestamp, offset of max timestamp) over the segment; None = not loaded yet.
        self._max_ts: tuple[int, int] | None = (-1, base_offset) if self._size == 0 else None
        self._rolling_based_timestamp: int | None = None
        self._rolling_loaded = self._size == 0
        self._closed = False
        # why the last recover() stopped before the end of the file (None: it did not)
        self.recovery_stop_reason: str | None = None
        # a failed append left bytes past `size` that could not be removed
        self.torn_tail = False
        # segment.jitter.ms drawn for this segment (Kafka's rollJitterMs); 0 until prepare_active
        self.roll_jitter_ms = 0
        # bytes of disk blocks reserved past the end (preallocate); released when rolled/closed
        self._reserved_to = 0

    @classmethod
    def open(
        cls,
        dir: str | os.PathLike[str],
        base_offset: int,
        *,
        index_interval_bytes: int = 4096,
        max_index_size: int = 10485760,
        file_suffix: str = "",
        created_ms: int | None = None,
        preallocate: bool = True,
    ) -> LogSegment:
        return cls(
            dir,
            base_offset,
            index_interval_bytes=index_interval_bytes,
            max_index_size=max_index_size,
            file_suffix=file_suffix,
            created_ms=created_ms,
            preallocate=preallocate,
        )

    # -- properties --------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The ``.log`` file."""
        return self._log_path

    @property
    def fileno(self) -> int:
        """The ``.log`` file descriptor (for ``os.sendfile``); valid until :meth:`close`."""
        return self._fd

    @property
    def size(self) -> int:
        """Bytes of whole batches in the ``.log``."""
        return self._size

    def __repr__(self) -> str:
        return f"LogSegment({self._log_path}, size={self._size})"

    def _load_max_timestamp(self) -> tuple[int, int]:
        # Kafka's loadLargestTimestamp: start from the time index's last entry and scan the
        # batches after its offset-index position for anything larger.
        if self._max_ts is None:
            last = self.time_index.last_entry
            best = (last.timestamp, last.offset)
            start = self.offset_index.lookup(last.offset).position if last.timestamp >= 0 else 0
            if start > self._size:
                start = 0
            for loc in self._scan(start, self._size):
                if loc.max_timestamp > best[0]:
                    best = (loc.max_timestamp, loc.last_offset)
            self._max_ts = best
        return self._max_ts

    @property
    def max_timestamp_so_far(self) -> int:
        """Largest batch max timestamp in the segment, -1 if none."""
        return self._load_max_timestamp()[0]

    @property
    def offset_of_max_timestamp_so_far(self) -> int:
        return self._load_max_timestamp()[1]

    @property
    def largest_timestamp(self) -> int:
        """Kafka's ``largestTimestamp``: max batch timestamp, else the file's mtime (ms)."""
        ts = self.max_timestamp_so_far
        if ts >= 0:
            return ts
        return self.last_modified_ms

    @property
    def last_modified_ms(self) -> int:
        return os.stat(self._log_path).st_mtime_ns // 1_000_000

    @property
    def rolling_based_timestamp(self) -> int | None:
        """Max timestamp of the first batch (what ``segment.ms`` counts from), if any."""
        if not self._rolling_loaded:
            first = next(self._scan(0, min(self._size, _SCAN_CHUNK)), None)
            self._rolling_based_timestamp = None if first is None else first.max_timestamp
            self._rolling_loaded = True
        return self._rolling_based_timestamp

    # -- scanning ----------------------------------------------------------------------------

    def _scan(self, start: int, end: int) -> Iterator[BatchLocation]:
        """Header fields of every whole batch in ``[start, end)`` via chunked ``pread``.

        A header whose length is impossible raises :class:`CorruptRecordError`; a batch running
        past ``end`` ends the scan (``end`` is normally a size snapshot, so never torn).
        """
        fd = self._fd
        pos = start
        buf = b""
        buf_start = start
        while pos + HEADER_SIZE <= end:
            rel = pos - buf_start
            if rel < 0 or rel + _SCAN.size > len(buf):
                buf = os.pread(fd, min(_SCAN_CHUNK, end - pos), pos)
                buf_start = pos
                rel = 0
                if len(buf) < _SCAN.size:
                    return
            base, length, _, _, _, _, delta, _, max_ts = _SCAN.unpack_from(buf, rel)
            size = length + LOG_OVERHEAD
            if size < HEADER_SIZE:
                raise CorruptRecordError(
                    f"impossible batchLength {length}", path=str(self._log_path), position=pos
                )
            if pos + size > end:
                return
            yield BatchLocation(pos, size, base, base + delta, max_ts)
            pos += size

    def headers(self, start_position: int = 0) -> Iterator[tuple[int, BatchHeader]]:
        """``(position, full 61-byte header)`` of every batch from ``start_position``.

        Chunked ``pread``, no CRC check (producer-state rebuild, tools). Raises
        :class:`CorruptRecordError` on a header that cannot be a v2 batch.
        """
        end = self._size
        pos = start_position
        buf = b""
        buf_start = pos
        while pos + HEADER_SIZE <= end:
            rel = pos - buf_start
            if rel + HEADER_SIZE > len(buf):
                buf = os.pread(self._fd, min(_SCAN_CHUNK, end - pos), pos)
                buf_start, rel = pos, 0
                if len(buf) < HEADER_SIZE:
                    return
            try:
                header = read_header(buf, rel)
            except CorruptRecordError as exc:
                raise CorruptRecordError(
                    exc.message, path=str(self._log_path), position=pos
                ) from None
            size = header.batch_length + LOG_OVERHEAD
            if pos + size > end:
                return
            yield pos, header
            pos += size

    def batches(self, start_position: int = 0) -> Iterator[BatchLocation]:
        """Every batch from ``start_position`` to the current end (headers only)."""
        return self._scan(start_position, self._size)

    def translate_offset(self, offset: int, starting_position: int = 0) -> BatchLocation | None:
        """The first batch whose last offset is >= ``offset``; ``None`` past the segment's end.

        Kafka's ``translateOffset``: an offset index lookup gives a start position at or
        before the batch, then a forward header scan finds it (at most about
        ``index_interval_bytes`` of headers when the index is complete).
        """
        start = max(self.offset_index.lookup(offset).position, starting_position)
        for loc in self._scan(start, self._size):
            if loc.last_offset >= offset:
                return loc
        return None

    def read_next_offset(self) -> int:
        """The offset after the last batch, or ``base_offset`` when the segment is empty."""
        start = self.offset_index.lookup(self.offset_index.last_offset).position
        if start > self._size:
            start = 0
        nxt = self.base_offset
        for loc in self._scan(start, self._size):
            nxt = loc.last_offset + 1
        return nxt

    def read(
        self,
        start_offset: int,
        max_size: int,
        *,
        max_position: int | None = None,
        min_one_message: bool = True,
    ) -> tuple[int, int, int] | None:
        """``(position, length, first batch's base offset)`` to send for ``start_offset``.

        Kafka's ``LogSegment.read``: the slice starts at the batch holding ``start_offset`` and
        runs for ``max_size`` bytes (at least that whole first batch when ``min_one_message``),
        never past ``max_position`` (default: the segment size). The end may cut a batch; Kafka
        clients drop a partial trailing batch. ``None`` when no batch holds ``start_offset``.
        """
        loc = self.translate_offset(start_offset)
        if loc is None:
            return None
        limit = self._size if max_position is None else min(max_position, self._size)
        if loc.position >= limit:
            return (loc.position, 0, loc.base_offset)
        wanted = max(max_size, loc.size) if min_one_message else max_size
        return (loc.position, max(0, min(limit - loc.position, wanted)), loc.base_offset)

    # -- writing -----------------------------------------------------------------------------

    def append(self, buf: bytes | bytearray | memoryview, batches: Sequence[BatchInfo]) -> None:
        """Append ``buf`` (whole batches, described by ``batches``) with one positional write.

        The bytes are written as they are (no copy); index entries are added per batch after
        the write succeeded. ``batches[i].position`` are positions within ``buf``. A failed
        write (no space, I/O error) cuts the file back to the segment's size and raises
        :class:`StorageError`: nothing of ``buf`` stays in the segment.
        """
        if not batches:
            return
        largest = batches[-1].last_offset
        if not self.offset_index.can_append_offset(largest):
            raise CorruptIndexError(
                f"offset {largest} does not fit segment {self.base_offset} (relative i32)",
                path=str(self._log_path),
            )
        physical = self._size
        if physical == 0:
            self._rolling_based_timestamp = batches[0].max_timestamp
            self._rolling_loaded = True
        view = memoryview(buf)
        try:
            total = view.nbytes
            written = 0
            while written < total:
                written += os.pwrite(self._fd, view[written:], physical + written)
        except OSError as exc:
            raise self._undo_write(physical, total, exc) from exc
        finally:
            view.release()
        max_ts, max_off = self._load_max_timestamp()
        since = self._bytes_since_last_index_entry
        interval = self.index_interval_bytes
        base_pos = batches[0].position
        for info in batches:
            if info.max_timestamp > max_ts:
                max_ts, max_off = info.max_timestamp, info.last_offset
            if since > interval:
                self.offset_index.append(info.last_offset, physical + info.position - base_pos)
                self.time_index.maybe_append(max_ts, max_off)
                since = 0
            since += info.size
        self._bytes_since_last_index_entry = since
        self._max_ts = (max_ts, max_off)
        self._size = physical + total

    def _undo_write(self, physical: int, total: int, exc: OSError) -> StorageError:
        """Cut the ``.log`` back to ``physical`` after a failed write of ``total`` bytes (a
        partial write leaves a torn batch); the error to raise."""
        message = f"cannot append {total} bytes at position {physical}: {exc.strerror}"
        try:
            if os.fstat(self._fd).st_size > physical:
                os.ftruncate(self._fd, physical)
        except OSError as undo:
            # The torn bytes stay past `size`: the owning log must not be marked clean, so
            # that the next start recovers (and truncates them).
            message += f"; the partial write could not be removed: {undo.strerror}"
            self.torn_tail = True
        return StorageError(message, path=str(self._log_path), errno=exc.errno)

    def truncate_to(self, offset: int) -> int:
        """Remove every batch whose last offset is >= ``offset``; returns bytes removed.

        Index entries at or above ``offset`` go too. The indexes keep their length: the owner
        preallocates them again (:meth:`resize_indexes`) when the segment is to be written to,
        which may fail on a full disk after the truncation itself is complete.
        """
        loc = self.translate_offset(offset)
        self.offset_index.truncate_to(offset)
        self.time_index.truncate_to(offset)
        self.txn_index.truncate_to(offset)
        if loc is None:
            removed = 0
        else:
            removed = self._size - loc.position
            os.ftruncate(self._fd, loc.position)
            self._size = loc.position
        if self._size == 0:
            self.created_ms = _now_ms()
            self._rolling_based_timestamp = None
            self._rolling_loaded = True
        self._bytes_since_last_index_entry = 0
        self._max_ts = None
        self._load_max_timestamp()
        return removed

    def recover(self, *, max_message_size: int | None = None) -> int:
        """Rebuild both indexes from the ``.log``; truncate at the first invalid batch.

        Every batch is validated (whole, magic 2, size >= 61, CRC, codec, counts) and its
        offsets must lie above the previous batch's and within this segment's range
        (``base_offset <= base``, relative offset fits an i32). Returns the bytes truncated
        (0 when the whole file was valid).

        The entries are collected in memory and written at the end with
        :meth:`AbstractIndex.rebuild` (exactly their size, no preallocation): recovery on a
        full disk needs only the space the old index files held. When even that fails the
        indexes are removed and :class:`IndexRebuildError` is raised; the ``.log`` has been
        recovered by then and the segment is usable (lookups scan from position 0).
        """
        file_size = os.fstat(self._fd).st_size
        valid = 0
        max_ts, max_off = -1, self.base_offset
        since = 0
        expected_min = self.base_offset
        first_ts: int | None = None
        self.recovery_stop_reason = None
        base_offset = self.base_offset
        # The indexes' own rules (OffsetIndex.append, TimeIndex.maybe_append) over buffers.
        offset_entries = bytearray()
        time_entries = bytearray()
        last_time_entry: int | None = None  # timestamp of the last time index entry
        max_offset_entries = self.max_index_size // OFFSET_ENTRY_SIZE
        max_time_entries = self.max_index_size // TIME_ENTRY_SIZE - 1  # last slot reserved
        if file_size > 0:
            mm = mmap.mmap(self._fd, file_size, access=mmap.ACCESS_READ)
            view = memoryview(mm)
            unpack = HEADER.unpack_from
            limit = max_message_size if max_message_size is not None else file_size
            interval = self.index_interval_bytes
            try:
                pos = 0
                while pos < file_size:
                    if file_size - pos < HEADER_SIZE:
                        self.recovery_stop_reason = "torn batch header"
                        break
                    base, length, _, magic, crc, attrs, delta, _, ts, _, _, _, count = unpack(
                        view, pos
                    )
                    size = length + LOG_OVERHEAD
                    # protocol.validate_batch's checks, inlined: this loop is recovery's cost
                    codec = attrs & CODEC_MASK
                    if (
                        magic != MAGIC
                        or size < HEADER_SIZE
                        or size > file_size - pos
                        or size > limit
                        or codec > _MAX_CODEC
                        or delta < 0
                        or count < 0
                        or count > delta + 1
                        or (codec == 0 and count * _MIN_RECORD_SIZE > size - HEADER_SIZE)
                        or crc32c(view[pos + ATTRIBUTES_OFFSET : pos + size]) != crc
                    ):
                        self.recovery_stop_reason = _diagnose(mm, pos, max_message_size)
                        break
                    last = base + delta
                    if base < expected_min or last - base_offset > _MAX_RELATIVE:
                        self.recovery_stop_reason = (
                            f"batch offsets {base}..{last} not above {expected_min - 1} or "
                            f"outside segment {base_offset}"
                        )
                        break
                    if first_ts is None:
                        first_ts = ts
                    if ts > max_ts:
                        max_ts, max_off = ts, last
                    if since > interval:
                        if len(offset_entries) >= max_offset_entries * OFFSET_ENTRY_SIZE:
                            raise CorruptIndexError(
                                f"index is full ({max_offset_entries} entries)",
                                path=str(self.offset_index.path),
                            )
                        offset_entries += _OFFSET_ENTRY.pack(last - base_offset, pos)
                        if last_time_entry is None or max_ts > last_time_entry:
                            if len(time_entries) >= max_time_entries * TIME_ENTRY_SIZE:
                                raise CorruptIndexError(
                                    f"time index is full ({max_time_entries} entries)",
                                    path=str(self.time_index.path),
                                )
                            time_entries += _TIME_ENTRY.pack(max_ts, max_off - base_offset)
                            last_time_entry = max_ts
                        since = 0
                    since += size
                    pos += size
                    valid = pos
                    expected_min = last + 1
            finally:
                view.release()
                mm.close()
        # the final entry (Kafka's onBecomeInactiveSegment / close), reserved slot
        if last_time_entry is None or max_ts > last_time_entry:
            time_entries += _TIME_ENTRY.pack(max_ts, max_off - base_offset)
        truncated = file_size - valid
        if truncated:
            os.ftruncate(self._fd, valid)
        self._size = valid
        self._bytes_since_last_index_entry = 0
        self._max_ts = (max_ts, max_off)
        self._rolling_based_timestamp = first_ts
        self._rolling_loaded = True
        try:
            self.offset_index.rebuild(offset_entries)
            self.time_index.rebuild(time_entries)
        except StorageError as exc:
            self.offset_index.discard()
            self.time_index.discard()
            self.offset_index_existed = self.time_index_existed = False
            raise IndexRebuildError(
                f"recovered the log but could not write its rebuilt indexes: {exc.message}",
                path=str(self._log_path),
                truncated=truncated,
                errno=exc.errno,
            ) from exc
        self.offset_index_existed = self.time_index_existed = True
        return truncated

    def sanity_check(self) -> None:
        """Raise :class:`CorruptIndexError` unless both index files exist and look valid.

        Kafka's ``LogSegment.sanityCheck`` plus the stricter ordering checks of the indexes;
        positions in ``.index`` must lie inside the ``.log``.
        """
        if not self.offset_index_existed:
            raise CorruptIndexError(
                "offset index file is missing", path=str(self.offset_index.path)
            )
        if not self.time_index_existed:
            raise CorruptIndexError("time index file is missing", path=str(self.time_index.path))
        self.offset_index.sanity_check(log_size=self._size)
        self.time_index.sanity_check()
        if self._size == 0 and (len(self.offset_index) or len(self.time_index)):
            raise CorruptIndexError(
                "index has entries but the log is empty", path=str(self.offset_index.path)
            )

    # -- rolling -----------------------------------------------------------------------------

    def prepare_active(self, *, roll_jitter_ms: int = 0, reserve_bytes: int = 0) -> None:
        """Settings of the segment becoming the active one: its roll jitter
        (``segment.jitter.ms``, drawn once per segment as Kafka does) and, with
        ``preallocate``, ``reserve_bytes`` of disk blocks for its ``.log``.

        The reservation keeps the file's size (``fallocate`` with ``FALLOC_FL_KEEP_SIZE``):
        Kafka grows a preallocated ``.log`` to ``segment.bytes`` and trims it on roll and clean
        close, which leaves a zero-filled tail after a crash; here readers, recovery and the
        Spark jobs never see one, and the blocks are still the segment's, contiguous where the
        filesystem can. A filesystem without ``fallocate`` gets no reservation;
        a full disk raises :class:`StorageError` (the caller treats it as any full disk).
        """
        self.roll_jitter_ms = roll_jitter_ms
        if reserve_bytes > self._size and reserve_bytes > self._reserved_to:
            try:
                reserve_blocks(self._fd, self._size, reserve_bytes - self._size)
            except OSError as exc:
                if exc.errno in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    return
                raise StorageError(
                    f"cannot preallocate {reserve_bytes} bytes: {exc.strerror}",
                    path=str(self._log_path),
                    errno=exc.errno,
                ) from exc
            self._reserved_to = reserve_bytes

    def _release_reservation(self) -> None:
        """Give back the blocks reserved past the end (best effort: only space is at stake).

        ``ftruncate`` to the current size frees blocks allocated past it (ext4, xfs, tmpfs);
        punching a hole would not, as filesystems clamp holes to the file size."""
        if self._reserved_to > self._size and not self.torn_tail:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)
        self._reserved_to = 0

    def should_roll(
        self,
        *,
        messages_size: int,
        max_timestamp_in_messages: int,
        max_offset_in_messages: int,
        now_ms: int,
        segment_bytes: int,
        segment_ms: int,
    ) -> bool:
        """Kafka's ``LogSegment.shouldRoll``, with this segment's :attr:`roll_jitter_ms`.

        Roll when the batches would push the segment past ``segment_bytes``; when the segment
        is non-empty and ``segment_ms`` has passed since its first batch's max timestamp (or
        since it was created, if that timestamp is missing); when either index is full; or when
        the largest offset no longer fits a relative i32.
        """
        rolling_ts = self.rolling_based_timestamp
        if rolling_ts is not None and rolling_ts >= 0:
            waited = max_timestamp_in_messages - rolling_ts
        else:
            waited = now_ms - self.created_ms
        return (
            self._size > segment_bytes - messages_size
            or (self._size > 0 and waited > segment_ms - self.roll_jitter_ms)
            or self.offset_index.is_full
            or self.time_index.is_full
            or not self.offset_index.can_append_offset(max_offset_in_messages)
        )

    def on_become_inactive(self) -> None:
        """The segment was rolled: write the final time index entry and trim both indexes."""
        self._release_reservation()
        max_ts, max_off = self._load_max_timestamp()
        if max_ts >= 0:
            self.time_index.maybe_append(max_ts, max_off, skip_full_check=True)
        self.offset_index.trim_to_valid_size()
        self.time_index.trim_to_valid_size()

    def resize_indexes(self, size: int) -> None:
        self.offset_index.resize(size)
        self.time_index.resize(size)

    # -- lifecycle ---------------------------------------------------------------------------

    def flush(self) -> None:
        """fsync the ``.log`` and the ``.txnindex``, msync both indexes."""
        os.fsync(self._fd)
        self.offset_index.flush()
        self.time_index.flush()
        self.txn_index.flush()

    def close(self) -> None:
        """Final time index entry, trim indexes, close files. Idempotent.

        Trimming only shrinks files, which needs no space; the final time index entry may need
        one more slot (:class:`StorageError` on a full disk, after the files were closed)."""
        if self._closed:
            return
        failure: StorageError | None = None
        try:
            # Unloaded means nothing was appended since open: the time index is already final,
            # and loading would cost a header scan per segment at shutdown.
            if self._max_ts is not None and self._max_ts[0] >= 0:
                self.time_index.maybe_append(*self._max_ts, skip_full_check=True)
        except StorageError as exc:  # no room to grow by the final entry: trim all the same
            failure = exc
        try:
            self.offset_index.close()
            self.time_index.close()
        finally:
            self.close_handlers()
        if failure is not None:
            raise failure

    def close_handlers(self) -> None:
        """Close files without touching them (no trim, no final entry)."""
        if self._closed:
            return
        self._release_reservation()
        self.offset_index.close_handler()
        self.time_index.close_handler()
        self._closed = True
        os.close(self._fd)

    @property
    def closed(self) -> bool:
        return self._closed

    def change_file_suffixes(self, old_suffix: str, new_suffix: str) -> None:
        """Rename the files from ``<name><old_suffix>`` to ``<name><new_suffix>``.

        Open descriptors and maps stay valid (they follow the inodes), so a segment renamed
        ``.deleted`` can still serve in-flight ``sendfile`` calls until it is deleted.
        """
        if self.file_suffix != old_suffix:
            raise ValueError(f"segment suffix is {self.file_suffix!r}, not {old_suffix!r}")
        new_log = segment_path(self.dir, self.base_offset, LOG_SUFFIX + new_suffix)
        os.replace(self._log_path, new_log)
        self._log_path = new_log
        self.offset_index.rename_to(
            segment_path(self.dir, self.base_offset, INDEX_SUFFIX + new_suffix)
        )
        self.time_index.rename_to(
            segment_path(self.dir, self.base_offset, TIME_INDEX_SUFFIX + new_suffix)
        )
        self.txn_index.rename_to(
            segment_path(self.dir, self.base_offset, TXN_INDEX_SUFFIX + new_suffix)
        )
        self.file_suffix = new_suffix

    def delete(self) -> None:
        """Close and unlink the segment's files (missing files are fine)."""
        self.close_handlers()
        paths = (self._log_path, self.offset_index.path, self.time_index.path, self.txn_index.path)
        for p in paths:
            p.unlink(missing_ok=True)
