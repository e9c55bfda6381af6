"""Kafka's sparse segment indexes: ``.index`` (offset -> position) and ``.timeindex``.

Bytes on disk, big-endian, no header, no checksum:

* ``.index`` (:class:`OffsetIndex`): 8-byte entries ``relative_offset i32, position i32``,
  where ``relative_offset = offset - base_offset`` and ``position`` is the byte position in the
  segment's ``.log`` of the batch containing ``offset``. Entries strictly increase in both.
* ``.timeindex`` (:class:`TimeIndex`): 12-byte entries ``timestamp i64, relative_offset i32``:
  the largest timestamp seen so far in the segment and the offset where it was seen.
  Timestamps strictly increase, offsets never decrease.

A new index file is preallocated to ``max_index_size`` rounded down to the entry size and
memory-mapped; entries are written through the map. Preallocation uses ``posix_fallocate``, not
a sparse ``ftruncate``: a store through the map into a page that has no block behind it, on a
full disk (or a full tmpfs), cannot report ENOSPC and kills the process with SIGBUS instead.
With real blocks a lack of space is a :class:`~logstore.errors.StorageError` when the file is
created or grown (the file is then left as it was), never a fault later. Every slot a writer
can still fill (``entry_count .. max_entries``) lies in allocated blocks: any :meth:`resize`
that leaves room allocates the whole mapped length, holes of an older sparse file included.
Recovery rebuilds an index with :meth:`rebuild` (plain ``write(2)`` of exactly the entries), so
it needs no preallocated room at all. On roll and on clean close the file is
trimmed to ``entries * entry_size`` (:meth:`trim_to_valid_size`). When an existing file is
opened its entry count is ``file length // entry_size``, exactly as Kafka counts it; so an index
left untrimmed by a crash appears full of zero entries, which :meth:`sanity_check` rejects
(the zeros break the ordering) and recovery rebuilds it from the ``.log``.

Lookups are binary searches over the map. Following Kafka's ``AbstractIndex``, the last
``warm_entries = 8192 // entry_size`` entries (the "warm section", two 4 KiB pages at most)
are searched first: consumers and followers almost always look up offsets near the tail, and a
search that starts over the whole file would touch a different set of cold pages each time as
the index grows, paging them in one by one; the warm section keeps the tail lookups on pages
that are already resident.

Crash behaviour: entries are written to the page cache through the map; nothing here fsyncs
unless :meth:`flush` is called. After a crash an index may hold stale or zero entries; it is
never trusted without :meth:`sanity_check` and is rebuilt by segment recovery.

Thread-safety: an index is not thread-safe; :class:`~logstore.storage.log.Log` serialises
writers under its lock. Concurrent lookups while a single writer appends are tolerated (an
entry becomes visible only after it is written and the count is bumped).
"""

from __future__ import annotations

import errno
import mmap
import os
import struct
import sys
from pathlib import Path
from typing import ClassVar, NamedTuple

import numpy as np

from logstore.errors import CorruptIndexError, StorageError

__all__ = [
    "OFFSET_ENTRY_SIZE",
    "TIME_ENTRY_SIZE",
    "AbstractIndex",
    "OffsetIndex",
    "OffsetPosition",
    "TimeIndex",
    "TimestampOffset",
    "allocate",
]

OFFSET_ENTRY_SIZE = 8
TIME_ENTRY_SIZE = 12
_PAGE = 4096
_MAX_RELATIVE = 2**31 - 1

# fdatasync writes back pages stored through a shared map (Linux): see AbstractIndex.flush
_FSYNC_FLUSHES_MAP = sys.platform.startswith("linux")

_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")


def allocate(fd: int, length: int, path: str | os.PathLike[str]) -> None:
    """Make the first ``length`` bytes of ``fd`` real blocks (``posix_fallocate``), growing
    the file to ``length`` if it is shorter.

    Raises :class:`StorageError` (with the errno) when the filesystem has no room; the caller
    restores the file's length. Filesystems without fallocate get glibc's emulation (it writes
    the blocks); where even that is missing the file is extended sparse, as before.
    """
    if length <= 0:
        return
    try:
        os.posix_fallocate(fd, 0, length)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.ENOSYS):
            os.ftruncate(fd, max(length, os.fstat(fd).st_size))
            return
        raise StorageError(
            f"cannot allocate {length} bytes: {exc.strerror}", path=str(path), errno=exc.errno
        ) from exc


class OffsetPosition(NamedTuple):
    """An offset index entry in absolute terms."""

    offset: int
    position: int


class TimestampOffset(NamedTuple):
    """A time index entry in absolute terms."""

    timestamp: int
    offset: int


class AbstractIndex:
    """What both index files share: file, map, entry count, resizing, warm-section search.

    ``path`` may not exist yet; it is then created and preallocated to ``max_index_size``
    rounded down to the entry size (``preallocate=False``: created empty, as recovery wants
    it; :meth:`resize` gives it room later). When the preallocation fails for lack of space
    the new file is removed and :class:`StorageError` raised. An existing file keeps its
    length.
    """

    entry_size: ClassVar[int]
    # the search key is the first field of every entry: relative offset / timestamp
    _key_struct: ClassVar[struct.Struct]

    def __init__(
        self,
        path: str | os.PathLike[str],
        base_offset: int,
        *,
        max_index_size: int,
        preallocate: bool = True,
    ) -> None:
        if max_index_size < self.entry_size:
            raise ValueError(
                f"max_index_size {max_index_size} is smaller than one entry ({self.entry_size})"
            )
        self._path = Path(path)
        self.base_offset = base_offset
        self.max_index_size = max_index_size
        # Kafka: warmEntries = 8192 / entrySize (1024 offset entries, 682 time entries).
        self._warm_entries = 8192 // self.entry_size
        newly_created = not self._path.exists()
        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if newly_created and preallocate:
                allocate(self._fd, self._round(max_index_size), self._path)
            length = os.fstat(self._fd).st_size
            self._length = self._round(length)
            self._max_entries = self._length // self.entry_size
            self._mm: mmap.mmap | None = self._map(self._length)
        except BaseException:
            os.close(self._fd)
            if newly_created:
                self._path.unlink(missing_ok=True)
            raise
        self._entries = 0 if newly_created else self._length // self.entry_size
        self._closed = False
        self._after_load()

    # -- sizes -------------------------------------------------------------------------------

    def _round(self, size: int) -> int:
        return size - size % self.entry_size

    def _map(self, length: int) -> mmap.mmap | None:
        # mmap cannot map zero bytes; an empty (trimmed) index simply has no map.
        if length == 0:
            return None
        return mmap.mmap(self._fd, length, access=mmap.ACCESS_WRITE)

    def _after_load(self) -> None:
        """Refresh cached values derived from the last entry."""

    @property
    def path(self) -> Path:
        return self._path

    @property
    def entry_count(self) -> int:
        """Number of entries (``len(index)``)."""
        return self._entries

    def __len__(self) -> int:
        return self._entries

    @property
    def max_entries(self) -> int:
        return self._max_entries

    @property
    def size_in_bytes(self) -> int:
        """Bytes of valid entries (the file itself may be preallocated larger)."""
        return self._entries * self.entry_size

    @property
    def file_length(self) -> int:
        return self._length

    @property
    def is_full(self) -> bool:
        return self._entries >= self._max_entries

    def relative_offset(self, offset: int) -> int:
        """``offset - base_offset``; :class:`CorruptIndexError` when it does not fit an i32."""
        rel = offset - self.base_offset
        if not 0 <= rel <= _MAX_RELATIVE:
            raise CorruptIndexError(
                f"offset {offset} is not within 0..2**31-1 of base offset {self.base_offset}",
                path=str(self._path),
            )
        return rel

    def can_append_offset(self, offset: int) -> bool:
        return 0 <= offset - self.base_offset <= _MAX_RELATIVE

    @property
    def has_room(self) -> bool:
        """Whether the file is longer than its entries (writers can add entries in place)."""
        return self._length > self._entries * self.entry_size

    def resize(self, new_size: int) -> bool:
        """Set the file length to ``new_size`` rounded down (never below the valid entries).

        When the new length leaves room for more entries, the whole length is allocated first
        (``posix_fallocate``), so that every slot a writer may fill has a block behind it;
        :class:`StorageError` when the disk has no room, with the file and its map unchanged.
        Remaps the file. Returns whether the length changed.
        """
        rounded = max(self._round(new_size), self._entries * self.entry_size)
        if rounded > self._entries * self.entry_size:
            try:
                allocate(self._fd, rounded, self._path)
            except StorageError:
                # ext4 may keep what it managed to allocate, and the length with it
                if os.fstat(self._fd).st_size != self._length:
                    os.ftruncate(self._fd, self._length)
                raise
        if rounded == self._length:
            return False
        # The old map is not closed here but dropped: a lookup running in another thread
        # (fetches do not take the log lock) keeps a reference to it and may finish reading
        # entries, all of which lie below the new length, so shrinking the file under it is
        # safe. The map is unmapped when its last reference goes.
        os.ftruncate(self._fd, rounded)
        self._mm = self._map(rounded)
        self._length = rounded
        self._max_entries = rounded // self.entry_size
        return True

    def trim_to_valid_size(self) -> None:
        """Shrink the file to exactly its entries (Kafka does this on roll and close)."""
        self.resize(self._entries * self.entry_size)

    def reset(self) -> None:
        """Drop every entry and preallocate again to ``max_index_size``."""
        self._entries = 0
        self._after_load()
        self.resize(self.max_index_size)

    def rebuild(self, raw: bytes | bytearray) -> None:
        """Replace the whole file with the entries in ``raw`` (recovery).

        The file is truncated to nothing and the entries written with ``pwrite``: exactly the
        space they need, and a full disk is an error here (:class:`StorageError`), never a
        fault on a mapped page. On failure the file is left empty. No preallocation: the file
        ends trimmed, like an index of an inactive segment.
        """
        if len(raw) % self.entry_size:
            raise ValueError(f"{len(raw)} bytes are not whole {self.entry_size}-byte entries")
        self._mm = None  # dropped, not closed: see resize()
        self._entries = 0
        self._length = self._max_entries = 0
        self._after_load()
        os.ftruncate(self._fd, 0)
        view = memoryview(raw)
        written = 0
        try:
            while written < len(raw):
                written += os.pwrite(self._fd, view[written:], written)
        except OSError as exc:
            os.ftruncate(self._fd, 0)
            raise StorageError(
                f"cannot write {len(raw)} bytes of index entries: {exc.strerror}",
                path=str(self._path),
                errno=exc.errno,
            ) from exc
        finally:
            view.release()
        self._length = len(raw)
        self._max_entries = self._length // self.entry_size
        self._mm = self._map(self._length)
        self._entries = self._max_entries
        self._after_load()

    def discard(self) -> None:
        """Drop every entry and remove the file, keeping the handle (an index that could not
        be written: its absence makes the next start rebuild it)."""
        self._mm = None
        self._entries = 0
        self._length = self._max_entries = 0
        self._after_load()
        os.ftruncate(self._fd, 0)
        self._path.unlink(missing_ok=True)

    def flush(self) -> None:
        """Make the entries written so far durable.

        On Linux an ``fdatasync`` of the file, not ``mmap.flush()``: CPython (3.11) calls
        ``msync`` holding the GIL, and every request thread of a broker waited for it. The
        log-manager's flush of a rolled segment and the tier thread's flush of
        ``__remote_log_metadata`` held the GIL 0.28 s of a 2.2 s produce of 200k records,
        0.54 s of 3.2 s with tiering on (``py-spy record --gil`` on the broker of
        ``tests/perf/bench_tier.py``); ``os.fdatasync`` releases it. The two are the same
        on Linux: ``msync(MS_SYNC)`` of a shared file map is a ``vfs_fsync_range`` of its
        file, and the pages stored through the map are dirty pages of the page cache, which
        ``fdatasync`` writes back."""
        if self._mm is None:
            return
        if _FSYNC_FLUSHES_MAP:
            os.fdatasync(self._fd)
        else:
            self._mm.flush()

    def close(self) -> None:
        """Trim to the valid size, unmap and close. Idempotent."""
        if self._closed:
            return
        self.trim_to_valid_size()
        self.close_handler()

    def close_handler(self) -> None:
        """Unmap and close without trimming (the file stays as it is)."""
        if self._closed:
            return
        self._closed = True
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        os.close(self._fd)

    def rename_to(self, path: str | os.PathLike[str]) -> None:
        """Rename the file (the map stays valid: it follows the inode)."""
        target = Path(path)
        if self._path.exists():
            os.replace(self._path, target)
        self._path = target

    def delete(self) -> None:
        """Close and unlink the file."""
        self.close_handler()
        self._path.unlink(missing_ok=True)

    # -- raw entries ------------------------------------------------------------------------

    def _key(self, slot: int) -> int:
        assert self._mm is not None  # slot < entries implies a non-empty map
        return int(self._key_struct.unpack_from(self._mm, slot * self.entry_size)[0])

    def _floor_slot(self, target: int, touched: set[int] | None = None) -> int:
        """Slot of the largest entry whose key is <= ``target``; -1 when there is none.

        Kafka's ``indexSlotRangeFor``: the warm tail section first, then the cold head.
        ``touched`` (benchmarks) collects the 4 KiB pages read.
        """
        n = self._entries
        if n == 0:
            return -1
        mm = self._mm
        assert mm is not None  # entries imply a map
        unpack = self._key_struct.unpack_from
        size = self.entry_size
        first_hot = max(0, n - 1 - self._warm_entries)
        if touched is not None:
            touched.add(first_hot * size // _PAGE)
        if unpack(mm, first_hot * size)[0] <= target:
            lo, hi = first_hot, n - 1
        else:
            if touched is not None:
                touched.add(0)
            if unpack(mm, 0)[0] > target:
                return -1
            lo, hi = 0, first_hot
        # Kafka's binarySearch: the largest slot whose key is <= target.
        if touched is None:
            while lo < hi:
                mid = (lo + hi + 1) >> 1
                found = unpack(mm, mid * size)[0]
                if found > target:
                    hi = mid - 1
                elif found < target:
                    lo = mid
                else:
                    return mid
            return lo
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            touched.add(mid * size // _PAGE)
            found = unpack(mm, mid * size)[0]
            if found > target:
                hi = mid - 1
            elif found < target:
                lo = mid
            else:
                return mid
        return lo

    def _keys_array(self) -> np.ndarray:
        raise NotImplementedError

    def _corrupt(self, message: str) -> CorruptIndexError:
        return CorruptIndexError(message, path=str(self._path))


class OffsetIndex(AbstractIndex):
    """The ``.index`` file of a segment: sparse map from offsets to ``.log`` positions.

    Invariants: relative offsets and positions strictly increase; every entry maps the last
    offset of some batch to that batch's start position. :meth:`lookup` returns the entry with
    the largest offset <= the target (or ``(base_offset, 0)``), from which a forward scan of the
    ``.log`` finds the batch holding the target.
    """

    entry_size = OFFSET_ENTRY_SIZE
    _key_struct = _I32

    def __init__(
        self,
        path: str | os.PathLike[str],
        base_offset: int,
        *,
        max_index_size: int = 10485760,
        preallocate: bool = True,
    ) -> None:
        self._last_offset = base_offset
        super().__init__(path, base_offset, max_index_size=max_index_size, preallocate=preallocate)

    def _after_load(self) -> None:
        if self._entries == 0:
            self._last_offset = self.base_offset
        else:
            self._last_offset = self.base_offset + self._key(self._entries - 1)

    @property
    def last_offset(self) -> int:
        """Offset of the last entry, or ``base_offset`` when empty."""
        return self._last_offset

    def entry(self, slot: int) -> OffsetPosition:
        if not 0 <= slot < self._entries:
            raise IndexError(f"slot {slot} outside 0..{self._entries - 1}")
        assert self._mm is not None
        rel, pos = _OFFSET_ENTRY.unpack_from(self._mm, slot * 8)
        return OffsetPosition(self.base_offset + rel, pos)

    def entries(self) -> list[OffsetPosition]:
        """Every entry, absolute offsets (for tools and tests)."""
        return [self.entry(i) for i in range(self._entries)]

    def lookup(self, target_offset: int, *, touched: set[int] | None = None) -> OffsetPosition:
        """The entry with the largest offset <= ``target_offset``; ``(base_offset, 0)`` if none."""
        slot = self._floor_slot(target_offset - self.base_offset, touched)
        if slot < 0:
            return OffsetPosition(self.base_offset, 0)
        return self.entry(slot)

    def fetch_upper_bound_offset(self, position: int) -> int | None:
        """The offset of the first entry at or after ``position`` in the ``.log``; None when
        every entry lies before it (Kafka's ``fetchUpperBoundOffset``).

        The entry's batch starts at or after ``position``, so every batch that ends at or
        before ``position`` (a fetch slice's bytes) holds only offsets below the returned
        one: a READ_COMMITTED fetch collects aborted transactions up to it, not to the
        segment's end. A binary search over the entries' positions (they increase)."""
        n = self._entries
        if n == 0:
            return None
        mm = self._mm
        assert mm is not None
        unpack = _OFFSET_ENTRY.unpack_from
        if unpack(mm, (n - 1) * 8)[1] < position:
            return None
        lo, hi = 0, n - 1
        while lo < hi:  # smallest slot whose position is >= position
            mid = (lo + hi) >> 1
            if unpack(mm, mid * 8)[1] >= position:
                hi = mid
            else:
                lo = mid + 1
        return self.base_offset + int(unpack(mm, lo * 8)[0])

    def append(self, offset: int, position: int) -> None:
        """Add ``offset -> position``; offsets must strictly increase, the index not be full."""
        if self._entries > 0 and offset <= self._last_offset:
            raise self._corrupt(
                f"offset {offset} appended after {self._last_offset}: index entries must "
                "strictly increase"
            )
        if self.is_full:
            raise self._corrupt(f"index is full ({self._entries} entries)")
        rel = self.relative_offset(offset)
        assert self._mm is not None  # not full implies a map
        _OFFSET_ENTRY.pack_into(self._mm, self._entries * 8, rel, position)
        self._entries += 1
        self._last_offset = offset

    def truncate_to(self, offset: int) -> None:
        """Remove every entry whose offset is >= ``offset``."""
        slot = self._floor_slot(offset - self.base_offset)
        if slot < 0:
            keep = 0
        elif self._key(slot) + self.base_offset == offset:
            keep = slot
        else:
            keep = slot + 1
        self._entries = min(self._entries, keep)
        self._after_load()

    def _keys_array(self) -> np.ndarray:
        assert self._mm is not None
        raw = np.frombuffer(self._mm, dtype=">i4", count=self._entries * 2)
        return raw.reshape(-1, 2).astype(np.int64)

    def sanity_check(self, *, log_size: int | None = None) -> None:
        """Raise :class:`CorruptIndexError` unless the file can be a valid offset index.

        Kafka's checks (length a multiple of 8; last offset >= base offset) plus: relative
        offsets >= 0 and strictly increasing, positions >= 0 and strictly increasing, and, when
        ``log_size`` is given, every position inside the ``.log``. The ordering check is what
        catches an index left preallocated (zero-filled) by a crash, or garbage.
        """
        length = os.fstat(self._fd).st_size
        if length % self.entry_size != 0:
            raise self._corrupt(
                f"index file is {length} bytes, not a multiple of the entry size {self.entry_size}"
            )
        if self._entries == 0:
            return
        if self._last_offset < self.base_offset:
            raise self._corrupt(
                f"last offset {self._last_offset} is below the base offset {self.base_offset}"
            )
        arr = self._keys_array()
        rel, pos = arr[:, 0], arr[:, 1]
        if rel[0] < 0 or pos[0] < 0:
            raise self._corrupt(f"negative first entry ({rel[0]}, {pos[0]})")
        if len(arr) > 1:
            bad = np.flatnonzero((np.diff(rel) <= 0) | (np.diff(pos) <= 0))
            if bad.size:
                i = int(bad[0]) + 1
                raise self._corrupt(
                    f"entry {i} ({int(rel[i])}, {int(pos[i])}) does not increase over entry "
                    f"{i - 1} ({int(rel[i - 1])}, {int(pos[i - 1])})"
                )
        if log_size is not None and int(pos[-1]) >= max(log_size, 1):
            raise self._corrupt(
                f"last entry points at position {int(pos[-1])}, the log holds {log_size} bytes"
            )


class TimeIndex(AbstractIndex):
    """The ``.timeindex`` file: sparse map from (max) timestamps to offsets.

    An entry ``(t, o)`` says: the largest timestamp among the batches up to offset ``o`` is
    ``t``, so every record with a timestamp > ``t`` lies after ``o``. Entries are only added when
    the segment's maximum timestamp grows.

    The last slot is reserved (``is_full`` at ``max_entries - 1``): when the segment stops being
    active Kafka appends the final ``(max timestamp, offset of max timestamp)`` entry with
    ``skip_full_check=True``, and that entry must always find room.
    """

    entry_size = TIME_ENTRY_SIZE
    _key_struct = _I64

    def __init__(
        self,
        path: str | os.PathLike[str],
        base_offset: int,
        *,
        max_index_size: int = 10485760,
        preallocate: bool = True,
    ) -> None:
        self._last = TimestampOffset(-1, base_offset)
        super().__init__(path, base_offset, max_index_size=max_index_size, preallocate=preallocate)

    def _after_load(self) -> None:
        if self._entries == 0:
            self._last = TimestampOffset(-1, self.base_offset)
        else:
            self._last = self.entry(self._entries - 1)

    def _offset_key(self, slot: int) -> int:
        assert self._mm is not None
        return int(_I32.unpack_from(self._mm, slot * 12 + 8)[0])

    @property
    def is_full(self) -> bool:
        return self._entries >= self._max_entries - 1

    @property
    def last_entry(self) -> TimestampOffset:
        """The last entry, or ``(-1, base_offset)`` when empty."""
        return self._last

    def entry(self, slot: int) -> TimestampOffset:
        if not 0 <= slot < self._entries:
            raise IndexError(f"slot {slot} outside 0..{self._entries - 1}")
        assert self._mm is not None
        ts, rel = _TIME_ENTRY.unpack_from(self._mm, slot * 12)
        return TimestampOffset(ts, self.base_offset + rel)

    def entries(self) -> list[TimestampOffset]:
        return [self.entry(i) for i in range(self._entries)]

    def lookup(self, target_timestamp: int, *, touched: set[int] | None = None) -> TimestampOffset:
        """The entry with the largest timestamp <= the target; ``(-1, base_offset)`` if none.

        The offset found is where a forward scan for the first record with timestamp >=
        ``target_timestamp`` may start (everything before it is older).
        """
        slot = self._floor_slot(target_timestamp, touched)
        if slot < 0:
            return TimestampOffset(-1, self.base_offset)
        return self.entry(slot)

    def maybe_append(self, timestamp: int, offset: int, *, skip_full_check: bool = False) -> None:
        """Append ``(timestamp, offset)`` if ``timestamp`` exceeds the last entry's.

        Raises :class:`CorruptIndexError` when the index is full (unless
        ``skip_full_check``, used only for the final entry of an inactive segment) or when the
        offset goes backwards.
        """
        if not skip_full_check and self.is_full:
            raise self._corrupt(f"time index is full ({self._entries} entries)")
        if self._entries > 0 and offset < self._last.offset:
            raise self._corrupt(
                f"offset {offset} appended after {self._last.offset}: time index offsets "
                "must not decrease"
            )
        if self._entries > 0 and timestamp <= self._last.timestamp:
            return
        if self._entries >= self._max_entries:
            # Only the reserved slot can be missing here (skip_full_check on a full file):
            # grow by one entry rather than drop the final timestamp.
            self.resize((self._entries + 1) * self.entry_size)
        rel = self.relative_offset(offset)
        assert self._mm is not None
        _TIME_ENTRY.pack_into(self._mm, self._entries * 12, timestamp, rel)
        self._entries += 1
        self._last = TimestampOffset(timestamp, offset)

    def truncate_to(self, offset: int) -> None:
        """Remove every entry whose offset is >= ``offset``."""
        target = offset - self.base_offset
        lo, hi = 0, self._entries
        while lo < hi:  # first slot whose offset >= target (offsets never decrease)
            mid = (lo + hi) >> 1
            if self._offset_key(mid) < target:
                lo = mid + 1
            else:
                hi = mid
        self._entries = min(self._entries, lo)
        self._after_load()

    def _keys_array(self) -> np.ndarray:
        assert self._mm is not None
        raw = np.frombuffer(self._mm, dtype=np.uint8, count=self._entries * 12)
        rows = raw.reshape(-1, 12)
        ts = rows[:, :8].copy().view(">i8").reshape(-1).astype(np.int64)
        rel = rows[:, 8:].copy().view(">i4").reshape(-1).astype(np.int64)
        return np.stack([ts, rel], axis=1)

    def sanity_check(self) -> None:
        """Raise :class:`CorruptIndexError` unless the file can be a valid time index.

        Kafka's checks (length a multiple of 12; last timestamp >= first; last offset >= base)
        plus: timestamps strictly increasing, relative offsets >= 0 and never decreasing.
        """
        length = os.fstat(self._fd).st_size
        if length % self.entry_size != 0:
            raise self._corrupt(
                f"time index file is {length} bytes, not a multiple of {self.entry_size}"
            )
        if self._entries == 0:
            return
        if self._last.offset < self.base_offset:
            raise self._corrupt(
                f"last offset {self._last.offset} is below the base offset {self.base_offset}"
            )
        arr = self._keys_array()
        ts, rel = arr[:, 0], arr[:, 1]
        if int(ts[-1]) < int(ts[0]):
            raise self._corrupt(
                f"last timestamp {int(ts[-1])} is below the first timestamp {int(ts[0])}"
            )
        if rel[0] < 0:
            raise self._corrupt(f"negative relative offset {int(rel[0])} in entry 0")
        if len(arr) > 1:
            bad = np.flatnonzero((np.diff(ts) <= 0) | (np.diff(rel) < 0))
            if bad.size:
                i = int(bad[0]) + 1
                raise self._corrupt(
                    f"entry {i} ({int(ts[i])}, {int(rel[i])}) does not follow entry {i - 1} "
                    f"({int(ts[i - 1])}, {int(rel[i - 1])})"
                )
