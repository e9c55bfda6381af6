"""Kafka's retention rules as pure functions, shared by the broker and the retention job.

:meth:`logstore.storage.log.Log.delete_old_segments` (the broker's periodic retention) and
``pipelines.retention`` (the Spark job that plans retention over every partition of the log
directories from the files alone) both decide with :func:`retention_plan`, so the rules exist
once. They are Kafka's ``UnifiedLog.deleteOldSegments``, applied to the oldest segments in
order, each pass stopping at the first segment that does not qualify:

1. ``retention.ms`` (only with ``cleanup.policy`` containing ``delete``, and ``>= 0``): a
   segment goes when ``now - largest_timestamp > retention.ms``; ``largest_timestamp`` is the
   largest record timestamp in the segment, or the ``.log`` file's last-modified time when
   the segment has none (Kafka's ``LogSegment.largestTimestamp``);
2. ``retention.bytes`` (same conditions): with ``excess = log size - retention.bytes``
   (the log size counts every segment, the active one included), the oldest remaining segments
   go while ``excess - segment size >= 0``, each subtracting its size;
3. the log start offset: segments whose next segment's base offset is ``<=`` it (wholly below).

A segment is deletable at all only if it is not the active (last) segment and its next
segment's base offset is ``<=`` the high watermark (Kafka's ``deletableSegments``).

The lake bound (loglake's own, the broker's ``log.retention.lake.group``): with
``lake_offset`` given (the offset the lake's ingest committed for the partition: the next
offset it will read), rules 1 and 2 delete a segment only if its next offset (the next
segment's base offset) is ``<= lake_offset``, so no offset the lake has not ingested goes by
time or size; they stop at the first segment held back. The safety valve ``lake_max_bytes``
(``>= 0``): while the log (from the segment examined to the end, the active one included) is
larger than that, rules 1 and 2 ignore the bound, as in Kafka. Rule 3 (the log start offset,
moved by DeleteRecords) is never bounded. ``lake_offset=None`` is Kafka's behaviour.
Pure and thread-safe; segments are read through attributes only, lazily: the time rule
reads ``largest_timestamp`` of the segments it examines and no others.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Protocol

__all__ = [
    "RULES",
    "RULE_LOG_START",
    "RULE_RETENTION_BYTES",
    "RULE_RETENTION_MS",
    "SegmentLike",
    "retention_plan",
    "size_breached",
    "time_breached",
]

RULE_RETENTION_MS: Final = "retention.ms"
RULE_RETENTION_BYTES: Final = "retention.bytes"
RULE_LOG_START: Final = "log.start.offset"
RULES: Final = (RULE_RETENTION_MS, RULE_RETENTION_BYTES, RULE_LOG_START)


class SegmentLike(Protocol):
    """What the rules read of a segment (``LogSegment`` and the job's scans both have it)."""

    @property
    def base_offset(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def largest_timestamp(self) -> int: ...


def time_breached(now_ms: int, largest_timestamp: int, retention_ms: int) -> bool:
    """Kafka's ``retention.ms`` test for one segment (``retention_ms < 0``: never)."""
    return retention_ms >= 0 and now_ms - largest_timestamp > retention_ms


def size_breached(excess: int, segment_size: int) -> bool:
    """Kafka's ``retention.bytes`` test: the log stays at or over the limit without it."""
    return excess - segment_size >= 0


def retention_plan(
    segments: Sequence[SegmentLike],
    *,
    retention_ms: int,
    retention_bytes: int,
    delete_policy: bool,
    log_start_offset: int,
    high_watermark: int,
    now_ms: int,
    lake_offset: int | None = None,
    lake_max_bytes: int = -1,
) -> list[str]:
    """The rule deleting each of the oldest segments, in order: the first ``len(result)``
    segments of ``segments`` (oldest first, the last one active) go. See the module docstring
    (``lake_offset``/``lake_max_bytes``: the lake bound and its safety valve).
    """
    n = len(segments)
    rules: list[str] = []
    i = 0
    # bytes from segment i to the end; computed only when the lake bound needs it
    remaining = sum(s.size for s in segments) if lake_offset is not None else 0

    def deletable(j: int) -> bool:
        return j < n - 1 and segments[j + 1].base_offset <= high_watermark

    def lake_allows(j: int) -> bool:
        if lake_offset is None or segments[j + 1].base_offset <= lake_offset:
            return True
        return 0 <= lake_max_bytes < remaining

    def take(rule: str) -> None:
        nonlocal i, remaining
        rules.append(rule)
        if lake_offset is not None:
            remaining -= segments[i].size
        i += 1

    if delete_policy and retention_ms >= 0:
        while (
            deletable(i)
            and time_breached(now_ms, segments[i].largest_timestamp, retention_ms)
            and lake_allows(i)
        ):
            take(RULE_RETENTION_MS)
    if delete_policy and retention_bytes >= 0:
        excess = sum(s.size for s in segments[i:]) - retention_bytes
        if excess > 0:
            while deletable(i) and size_breached(excess, segments[i].size) and lake_allows(i):
                excess -= segments[i].size
                take(RULE_RETENTION_BYTES)
    while deletable(i) and segments[i + 1].base_offset <= log_start_offset:
        rules.append(RULE_LOG_START)
        i += 1
    return rules
