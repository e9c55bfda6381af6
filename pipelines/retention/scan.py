"""What retention planning reads of one partition directory, from the files alone.

Per segment (``<base>.log`` files only: ``.deleted``, ``.cleaned`` and ``.swap`` files are not
part of the log): the base offset from the name, the size of the ``.log`` and Kafka's
``largestTimestamp``. That is the last entry of the ``.timeindex`` (the broker appends the
segment's largest timestamp there when the segment is rolled or closed), or, when the time
index is empty, the ``.log`` file's last-modified time (Kafka's rule for a segment without
timestamps). The data itself is never read: a segment costs two ``stat`` calls and one 12-byte
read.

The last segment is the active one; its time index is still preallocated and is not read
(retention never deletes it). A time index whose last 12 bytes are zero in a file of several
entries was not trimmed (a crash before the broker's recovery rebuilt it): its largest
timestamp is unknown, reported as ``"unknown"`` with :data:`UNKNOWN_TIMESTAMP`, which no
``retention.ms`` ever breaches, so such a segment is never deleted by time.

Pure functions over the file system, no shared state; used by the Spark executors of the
retention job and by the single-process scan alike.
"""

from __future__ import annotations

import os
import struct
from typing import NamedTuple

from logstore.storage.config import LONG_MAX
from logstore.storage.files import LOG_SUFFIX, TIME_INDEX_SUFFIX, offset_from_file_name
from logstore.storage.index import TIME_ENTRY_SIZE

__all__ = ["UNKNOWN_TIMESTAMP", "SegmentScan", "scan_partition"]

UNKNOWN_TIMESTAMP = LONG_MAX
_TIME_ENTRY = struct.Struct(">qi")
_ZERO_ENTRY = bytes(TIME_ENTRY_SIZE)


class SegmentScan(NamedTuple):
    """One segment as retention sees it (``timestamp_source``: ``timeindex``, ``mtime``,
    ``unknown`` or ``active``, whose timestamp is not read and is -1)."""

    base_offset: int
    size: int
    largest_timestamp: int
    timestamp_source: str


def _last_time_entry(path: str, length: int) -> tuple[int, str]:
    if length < TIME_ENTRY_SIZE:
        return -1, "empty"
    fd = os.open(path, os.O_RDONLY)
    try:
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


def scan_partition(part_dir: str) -> list[SegmentScan]:
    """The segments of ``part_dir``, oldest first (the last one is active)."""
    logs: dict[int, os.DirEntry[str]] = {}
    time_indexes: dict[int, os.DirEntry[str]] = {}
    with os.scandir(part_dir) as entries:
        for entry in entries:
            parsed = offset_from_file_name(entry.name)
            if parsed is None:
                continue
            base, suffix = parsed
            if suffix == LOG_SUFFIX:
                logs[base] = entry
            elif suffix == TIME_INDEX_SUFFIX:
                time_indexes[base] = entry
    bases = sorted(logs)
    out: list[SegmentScan] = []
    for i, base in enumerate(bases):
        try:
            st = logs[base].stat()
        except FileNotFoundError:  # deleted by the broker meanwhile
            continue
        if i == len(bases) - 1:
            out.append(SegmentScan(base, st.st_size, -1, "active"))
            continue
        ti = time_indexes.get(base)
        ts, source = -1, "empty"
        if ti is not None:
            try:
                ts, source = _last_time_entry(ti.path, ti.stat().st_size)
            except FileNotFoundError:
                continue
        if source == "empty":
            ts, source = st.st_mtime_ns // 1_000_000, "mtime"
        out.append(SegmentScan(base, st.st_size, ts, source))
    return out
