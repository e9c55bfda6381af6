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
from pipelines.logdir import PARTITION_DIR_MISSING, PartitionDirMissingError
from pipelines.retention.scan import SegmentScan, SegmentVanishedError, list_segments

__all__ = [
    "PartitionPlan",
    "PartitionTask",
    "SegmentDecision",
    "WirePlan",
    "from_wire",
    "plan_partition",
    "plan_task",
]


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
    """One partition's plan. ``new_log_start`` is ``None`` when nothing is deleted.

    ``segments``: how many segments the partition has; ``unknown_timestamps``: segments the
    time rule looked at whose time index was left untrimmed (see
    :mod:`pipelines.retention.scan`; such a segment stops the time rule)."""

    topic: str
    partition: int
    path: str
    segments: int
    unknown_timestamps: int
    new_log_start: int | None
    decisions: list[SegmentDecision]


# What a planning task sends back per partition: PartitionPlan's fields with the decisions as
# plain tuples (SegmentDecision's fields after topic and partition). Plain tuples pickle in C
# and need no class lookup on the way back to the driver, which rebuilds the named tuples
# (:func:`from_wire`) once.
WirePlan = tuple[str, int, str, int, int, int | None, tuple[tuple[Any, ...], ...]]


def _plan_wire(
    task: PartitionTask, segments: list[SegmentScan], now_ms: int, force: bool
) -> WirePlan:
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
    decisions: list[tuple[Any, ...]] = []
    new_start: int | None = None
    held = False
    progress = task.progress
    for i, rule in enumerate(rules):
        seg, nxt = segments[i], segments[i + 1].base_offset
        if held:
            action = "held"  # nothing after a held segment goes: the log start is contiguous
        elif progress is None or nxt <= progress:
            action = "delete"
        else:
            action = "forced" if force else "held"
        if action == "held":
            held = True
        else:
            new_start = nxt
        decisions.append(
            (
                seg.base_offset,
                nxt,
                seg.size,
                seg.largest_timestamp,
                seg.timestamp_source,
                rule,
                action,
            )
        )
    unknown = sum(1 for s in segments if s.timestamp_read and s.timestamp_source == "unknown")
    return (
        task.topic,
        task.partition,
        task.path,
        len(segments),
        unknown,
        new_start,
        tuple(decisions),
    )


def from_wire(wire: WirePlan) -> PartitionPlan:
    """The :class:`PartitionPlan` of what :func:`plan_task` yielded."""
    topic, partition, path, segments, unknown, new_start, decisions = wire
    make, head = SegmentDecision._make, (topic, partition)
    return PartitionPlan(
        topic, partition, path, segments, unknown, new_start, [make(head + d) for d in decisions]
    )


def plan_partition(
    task: PartitionTask, segments: list[SegmentScan], *, now_ms: int, force: bool
) -> PartitionPlan:
    """Kafka's retention for ``segments`` (oldest first, last active), bounded by the lake."""
    return from_wire(_plan_wire(task, segments, now_ms, force))


_ATTEMPTS = 3  # listings of a partition whose segments the broker deletes while we read


def plan_task(tasks: Iterable[PartitionTask], *, now_ms: int, force: bool) -> Iterator[WirePlan]:
    """Executor side: list and plan each partition, reading only what the rules ask for.

    Yields :data:`WirePlan` tuples (:func:`from_wire` turns them into plans). A partition
    whose segments vanish while it is read (the broker's own retention or a compaction swap)
    is listed again, and skipped after ``_ATTEMPTS`` tries (a later run plans it). A partition
    whose directory is not there raises :class:`~pipelines.logdir.PartitionDirMissingError`:
    only the driver, which listed it, can tell a topic deleted under the run (gone there too:
    plan again) from executors that do not share its disk (exit 2, as ingest)."""
    for task in tasks:
        plan: WirePlan | None = None
        for _ in range(_ATTEMPTS):
            try:
                segments = list_segments(task.path)
            except (FileNotFoundError, NotADirectoryError):
                raise PartitionDirMissingError(PARTITION_DIR_MISSING, path=task.path) from None
            try:
                plan = _plan_wire(task, segments, now_ms, force)
            except SegmentVanishedError:
                continue
            break
        if plan is not None:
            yield plan
