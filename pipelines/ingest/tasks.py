"""The executor side of ingest's step 2 and how its work is cut into Spark tasks.

:func:`schedule_tasks` cuts the planned segment pieces into tasks that run out small (so the
cores finish together); :func:`_with_aborted` gives each range the aborted transactions that
reach it (``read_committed``); :func:`_read_ranges` is what a task runs: per range, its
records then its report. See :mod:`pipelines.ingest` for the run."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pipelines.ingest.config import TopicPartition
from pipelines.sources.plan import (
    SegmentRange,
    SourceOptions,
    guided_cuts,
)
from pipelines.sources.tier import (
    TierRange,
    next_tier_ranges,
    read_tier_range,
)
from pipelines.sources.transactions import AbortedRanges, PartitionTxns, TxnEvents

__all__ = [
    "PIECES_PER_TASK",
    "schedule_tasks",
]


def _read_ranges(
    ranges: list[tuple[SegmentRange, AbortedRanges | None] | TierRange],
    *,
    options: SourceOptions,
    collect_txn: bool = False,
) -> Iterator[Any]:
    """Executor side of step 2: per range, its records (without those of the aborted
    transactions given with it) then its :class:`RangeReport` (JSON). A :class:`TierRange`
    (offsets below the log dirs' start that the tier holds) is read from the object store.
    ``collect_txn``: a segment range's report also carries, under ``"txn"``, the
    :class:`TxnEvents` its walk met (compacted; left out when there are none), for
    :mod:`pipelines.ingest.committed`."""
    # Imported here: the driver plans without loading the decoder (numba) at all.
    from pipelines.sources.read import RangeReport, read_records  # noqa: PLC0415

    for i, item in enumerate(ranges):
        if isinstance(item, TierRange):
            report = RangeReport(item.topic, item.partition)
            yield from read_tier_range(
                item,
                min_timestamp=options.min_timestamp,
                max_timestamp=options.max_timestamp,
                report=report,
                after=next_tier_ranges(ranges, i),
            )
            yield report.to_json()
            continue
        rng, aborted = item
        report = RangeReport(rng.topic, rng.partition, txn=[] if collect_txn else None)
        yield from read_records(
            rng,
            min_timestamp=options.min_timestamp,
            max_timestamp=options.max_timestamp,
            report=report,
            aborted=aborted,
        )
        out = report.to_json()
        if report.txn:
            events = TxnEvents.of(*report.txn_frames()).compact()
            if len(events):
                out["txn"] = events.to_json()
        yield out


def _with_aborted(
    tasks: list[list[SegmentRange]], txns: Mapping[TopicPartition, PartitionTxns]
) -> list[list[tuple[SegmentRange, AbortedRanges | None]]]:
    """Each range with the aborted transactions that can reach its segment's offsets."""
    out = []
    for task in tasks:
        items: list[tuple[SegmentRange, AbortedRanges | None]] = []
        for r in task:
            found = txns.get((r.topic, r.partition))
            aborted = None
            if found is not None and len(found.aborted):
                high = r.until if r.next_base_offset is None else r.next_base_offset
                aborted = found.aborted.overlapping(
                    max(r.start_offset, r.segment_base_offset), min(r.until, high)
                )
            items.append((r, aborted if aborted is not None and len(aborted) else None))
        out.append(items)
    return out


# Segments are planned in pieces of max_partition_bytes / PIECES_PER_TASK, the smallest task
# schedule_tasks makes.
PIECES_PER_TASK = 8


def schedule_tasks(
    pieces: Sequence[SegmentRange], cores: int, max_bytes: int, min_bytes: int
) -> list[list[SegmentRange]]:
    """Cut ``pieces`` (planned ranges in file order) into tasks, largest first, so that
    ``cores`` cores running them in order finish together.

    Spark starts a stage's tasks in index order, each on the first free core. The cut is
    :func:`~pipelines.sources.plan.guided_cuts` by the pieces' bytes (guided
    self-scheduling: ``max_bytes`` tasks first, then a core's share of the rest, down to
    ``min_bytes``).

    Tasks of equal bytes do not finish together: on a busy machine the same bytes cost one
    task up to 30% more than another, and a core that finished its last big task idled while
    the other still worked (up to 0.45 s of a 1.8 s run, measured). Tasks that run out small
    let the first free core take the next one. A task is consecutive pieces; pieces of one
    segment that meet are merged into one range (one sequential read).
    """
    tasks: list[list[SegmentRange]] = []
    for lo, hi in guided_cuts([p.end - p.start for p in pieces], cores, max_bytes, min_bytes):
        task: list[SegmentRange] = []
        for piece in pieces[lo:hi]:
            previous = task[-1] if task else None
            if previous is not None and previous.path == piece.path and previous.end == piece.start:
                task[-1] = dataclasses.replace(previous, end=piece.end, is_tail=piece.is_tail)
            else:
                task.append(piece)
        tasks.append(task)
    return tasks
