"""What retention planning reads of one partition directory, from the files alone, lazily.

A partition is listed once (one ``listdir``): the ``<base>.log`` names give the segments
(``.deleted``, ``.cleaned`` and ``.swap`` files are not part of the log), oldest first, the
last one active. Nothing else is read up front. Each :class:`SegmentScan` then reads what a
rule asks of it, once:

- ``largest_timestamp``: Kafka's ``largestTimestamp``, the last entry of the ``.timeindex``
  (the broker appends the segment's largest timestamp there when the segment is rolled or
  closed): ``open`` + ``fstat`` + one 12-byte ``pread`` + ``close``. When the time index is
  missing or empty, the ``.log`` file's last-modified time (Kafka's rule for a segment without
  timestamps): one ``stat``. The data itself is never read.
- ``size``: the ``.log`` size, one ``stat`` (shared with the mtime above).

So the time rule, which stops at the first segment that has not expired (Kafka's
``deleteOldSegments``), reads the time index of the segments it deletes plus one; sizes are
read for every segment only when ``retention.bytes`` applies (the log size counts them all),
otherwise only for the segments that go (reported in the plan). This is the same laziness as
the broker's own retention over its in-memory segments.

The active segment's time index is still preallocated and is never read (retention never
deletes it; its timestamp is -1, source ``"active"``). A time index whose last 12 bytes are
zero in a file of several entries was not trimmed (a crash before the broker's recovery
rebuilt it): its largest timestamp is unknown, reported as ``"unknown"`` with
:data:`UNKNOWN_TIMESTAMP`, which no ``retention.ms`` ever breaches, so such a segment is never
deleted by time.

A ``.log`` that disappears between the listing and a read (the broker deleted or replaced the
segment meanwhile) raises :class:`SegmentVanishedError`; the planner lists the partition
again. Pure functions over the file system, no shared state; used by the Spark executors of
the retention job and by the single-process scan alike.
"""

from __future__ import annotations

import os
import struct

from logstore.storage.config import LONG_MAX
from logstore.storage.files import LOG_SUFFIX, TIME_INDEX_SUFFIX
from logstore.storage.index import TIME_ENTRY_SIZE
from pipelines.logdir import SegmentVanishedError, segment_bases

__all__ = [
    "UNKNOWN_TIMESTAMP",
    "SegmentScan",
    "SegmentVanishedError",
    "list_segments",
    "scan_partition",
]

UNKNOWN_TIMESTAMP = LONG_MAX
_TIME_ENTRY = struct.Struct(">qi")
_ZERO_ENTRY = bytes(TIME_ENTRY_SIZE)


class SegmentScan:
    """One segment as retention sees it, read on first access (see the module docstring).

    ``timestamp_source``: ``timeindex``, ``mtime``, ``unknown`` or ``active`` (the active
    segment, whose timestamp is not read and is -1). Not thread-safe (a cache per object).
    """

    __slots__ = ("_dir", "_mtime_ms", "_size", "_source", "_ts", "base_offset")

    def __init__(self, part_dir: str, base_offset: int) -> None:
        self._dir = part_dir
        self.base_offset = base_offset
        self._size = -1
        self._source = ""  # "": timestamp not read yet

    def _file(self, suffix: str) -> str:
        return f"{self._dir}/{self.base_offset:020d}{suffix}"

    def _stat(self) -> None:
        try:
            st = os.stat(self._file(LOG_SUFFIX))
        except FileNotFoundError:
            raise SegmentVanishedError(
                "segment deleted while planning", path=self._file(LOG_SUFFIX)
            ) from None
        self._size = st.st_size
        self._mtime_ms = st.st_mtime_ns // 1_000_000

    def _read_timestamp(self) -> None:
        ts, source = _last_time_entry(self._file(TIME_INDEX_SUFFIX))
        if source == "empty":
            if self._size < 0:
                self._stat()
            ts, source = self._mtime_ms, "mtime"
        self._ts, self._source = ts, source

    @property
    def size(self) -> int:
        if self._size < 0:
            self._stat()
        return self._size

    @property
    def largest_timestamp(self) -> int:
        if not self._source:
            self._read_timestamp()
        return self._ts

    @property
    def timestamp_source(self) -> str:
        if not self._source:
            self._read_timestamp()
        return self._source

    @property
    def timestamp_read(self) -> bool:
        """Whether ``largest_timestamp`` was asked for (``active`` counts as read)."""
        return bool(self._source)

    def __repr__(self) -> str:
        return f"SegmentScan({self._file(LOG_SUFFIX)})"


def _last_time_entry(path: str) -> tuple[int, str]:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return -1, "empty"
    try:
        length = os.fstat(fd).st_size
        if length < TIME_ENTRY_SIZE:
            return -1, "empty"
        tail = os.pread(fd, TIME_ENTRY_SIZE, length - length % TIME_ENTRY_SIZE - TIME_ENTRY_SIZE)
    finally:
        os.close(fd)
    if len(tail) < TIME_ENTRY_SIZE:  # shrunk meanwhile
        return -1, "empty"
    if tail == _ZERO_ENTRY and length >= 2 * TIME_ENTRY_SIZE:
        # timestamps strictly increase: a zero last entry after others is untrimmed space
        return UNKNOWN_TIMESTAMP, "unknown"
    ts, _ = _TIME_ENTRY.unpack(tail)
    return int(ts), "timeindex"


def list_segments(part_dir: str) -> list[SegmentScan]:
    """The segments of ``part_dir``, oldest first (the last one is active), nothing read yet.

    One ``listdir`` (:func:`pipelines.logdir.segment_bases`)."""
    segments = [SegmentScan(part_dir, b) for b in segment_bases(part_dir)]
    if segments:
        active = segments[-1]
        active._source, active._ts = "active", -1
    return segments


def scan_partition(part_dir: str) -> list[SegmentScan]:
    """:func:`list_segments` with every size and timestamp read (for tools and tests)."""
    segments = list_segments(part_dir)
    for s in segments:
        _ = s.size, s.largest_timestamp
    return segments
