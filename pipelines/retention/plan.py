"""Retention planning: Kafka's decisions per partition, bounded by what the lake holds.

For one partition, :func:`plan_partition` takes its scan (:mod:`pipelines.retention.scan`),
its effective retention settings, log start offset and high watermark (the log directory's
checkpoints) and decides with the broker's own rules
(:func:`logstore.storage.retention.retention_plan`). Then the lake bound: when the partition
is lake-protected, a segment may go only if every record in it is committed to ``records``,
i.e. its next segment's base offset is ``<=`` the ingest progress; the segments retention
wants beyond that are **held** (reported, not deleted) unless ``force``.

The result is the new log start offset: the base offset of the first segment kept, which is
what DeleteRecords is given (the broker then deletes exactly the segments wholly below it).

Which partitions are lake-protected: those ingest would ingest (``[ingest] topics``, or every
topic whose name does not start with ``__`` when that list is empty), the same selection as
``pipelines.ingest``. Other topics (Kafka's internal ones, topics left out of ``[ingest]
topics``) are never in the lake, so holding them back would keep them forever: they get
Kafka's retention alone.

Pure functions; the Spark job runs :func:`plan_task` on the executors.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from logstore.storage.retention import retention_plan
from pipelines.retention.scan import SegmentScan, scan_partition

__all__ = ["PartitionPlan", "PartitionTask", "SegmentDecision", "plan_partition", "plan_task"]


class PartitionTask(NamedTuple):
    """Everything planning needs for one partition (built on the driver, shipped to tasks).

    ``progress`` is the ingest progress (next offset to ingest), ``None`` when the partition is
    not lake-protected. ``high_watermark`` ``None``: unknown (no checkpoint), then nothing is
    deletable (Kafka never deletes at or above the high watermark).
    """

    path: str
    topic: str
    partition: int
    retention_ms: int
    retention_bytes: int
    delete_policy: bool
    log_start_offset: int
    high_watermark: int | None
    progress: int | None


class SegmentDecision(NamedTuple):
    """A segment retention wants gone. ``action``: ``delete``; ``held`` (not all of it in the
    lake yet: kept); ``forced`` (not all of it in the lake, deleted anyway: ``force``)."""

    topic: str
    partition: int
    base_offset: int
    next_offset: int
    size: int
    largest_timestamp: int
    timestamp_source: str
    rule: str
    action: str


class PartitionPlan(NamedTuple):
    """One partition's plan. ``new_log_start`` is ``None`` when nothing is deleted."""

    topic: str
    partition: int
    path: str
    segments: int
    size: int
    unknown_timestamps: int
    new_log_start: int | None
    decisions: list[SegmentDecision]


def plan_partition(
    task: PartitionTask, segments: list[SegmentScan], *, now_ms: int, force: bool
) -> PartitionPlan:
    """Kafka's retention for ``segments`` (oldest first, last active), bounded by the lake."""
    hw = task.high_watermark
    rules = (
        retention_plan(
            segments,
            retention_ms=task.retention_ms,
            retention_bytes=task.retention_bytes,
            delete_policy=task.delete_policy,
            log_start_offset=task.log_start_offset,
            high_watermark=hw,
            now_ms=now_ms,
        )
        if hw is not None and segments
        else []
    )
    decisions: list[SegmentDecision] = []
    new_start: int | None = None
    for i, rule in enumerate(rules):
        seg, nxt = segments[i], segments[i + 1].base_offset
        in_lake = task.progress is None or nxt <= task.progress
        action = "delete" if in_lake else ("forced" if force else "held")
        if decisions and decisions[-1].action == "held":
            action = "held"  # nothing after a held segment goes: the log start is contiguous
        if action != "held":
            new_start = nxt
        decisions.append(
            SegmentDecision(
                task.topic,
                task.partition,
                seg.base_offset,
                nxt,
                seg.size,
                seg.largest_timestamp,
                seg.timestamp_source,
                rule,
                action,
            )
        )
    return PartitionPlan(
        task.topic,
        task.partition,
        task.path,
        len(segments),
        sum(s.size for s in segments),
        sum(1 for s in segments if s.timestamp_source == "unknown"),
        new_start,
        decisions,
    )


def plan_task(tasks: Iterable[PartitionTask], *, now_ms: int, force: bool) -> Iterator[Any]:
    """Executor side: scan and plan each partition; partitions gone meanwhile are skipped."""
    for task in tasks:
        try:
            segments = scan_partition(task.path)
        except (FileNotFoundError, NotADirectoryError):
            continue
        yield plan_partition(task, segments, now_ms=now_ms, force=force)
