"""What the broker's log directories say about each partition, for the quality suites.

Per partition: the log start offset (``log-start-offset-checkpoint``, or the first segment's
base offset when larger or when the file is absent, as ingest reads it), the high watermark
(``replication-offset-checkpoint``; None when the broker has not written it) and the ingest
progress (the ``records`` table's app transactions: the next offset ingest will read).
Only reads files; never writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pipelines.logdir import (
    LOG_START_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    TopicPartition,
    log_start_offset,
    merged_checkpoint,
    partition_dirs,
)

__all__ = ["PartitionBounds", "partition_bounds"]


@dataclass(frozen=True, slots=True)
class PartitionBounds:
    """One partition's offsets: ``[log_start, high_watermark)`` is readable in the log."""

    topic: str
    partition: int
    log_start: int
    high_watermark: int | None
    progress: int | None


def partition_bounds(
    log_dirs: Iterable[str],
    progress: Mapping[TopicPartition, int],
    *,
    topics: Iterable[str] | None = None,
) -> list[PartitionBounds]:
    """Bounds of every partition directory in ``log_dirs`` (of ``topics``, when given), plus
    partitions that only the progress knows (their directory is gone: log start = progress)."""
    dirs = list(log_dirs)
    wanted = set(topics) if topics else None
    starts = merged_checkpoint(dirs, LOG_START_OFFSET_CHECKPOINT) or {}
    hws = merged_checkpoint(dirs, REPLICATION_OFFSET_CHECKPOINT) or {}
    found: dict[TopicPartition, int] = {}
    for d in dirs:
        for part in partition_dirs(d, topics=wanted):
            found[part.tp] = log_start_offset(part, starts)
    for tp, next_offset in progress.items():
        if tp not in found and (wanted is None or tp[0] in wanted):
            found[tp] = next_offset
    return [
        PartitionBounds(t, p, start, hws.get((t, p)), progress.get((t, p)))
        for (t, p), start in sorted(found.items())
    ]
