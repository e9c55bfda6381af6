"""The planner's reading of a partition directory: only what the rules look at, on real files.

Partitions are written with ``tests.fixtures.retention_logdirs`` (sparse ``.log`` files, real
``.timeindex`` tails). The lazy segments say which time indexes were read; the plans are
checked against the reference model where they matter.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipelines.logdir import PartitionDirMissingError
from pipelines.retention.model import ModelPartition, ModelSegment, expected_log_start
from pipelines.retention.plan import PartitionTask, from_wire, plan_partition, plan_task
from pipelines.retention.scan import SegmentVanishedError, list_segments, scan_partition
from tests.fixtures.retention_logdirs import write_partition

NOW = 1_700_000_000_000
HOUR = 3_600_000


def _segments(ages_h: list[int | None]) -> list[ModelSegment]:
    """One segment per age (hours; None: no timestamp, mtime 10 h ago), 1000 bytes each."""
    return [
        ModelSegment(
            i * 100,
            1000,
            None if age is None else NOW - age * HOUR,
            NOW - (10 if age is None else age) * HOUR,
        )
        for i, age in enumerate(ages_h)
    ]


def _task(path: Path, segs: list[ModelSegment], *, ms: int, size: int = -1) -> PartitionTask:
    end = segs[-1].base_offset + 100
    return PartitionTask(str(path), "t", 0, ms, size, True, 0, end, None)


def test_time_rule_reads_the_time_indexes_it_examines_and_no_more(tmp_path: Path) -> None:
    segs = _segments([9, 8, 7, 3, 2, 1, 0])
    write_partition(tmp_path / "t-0", segs)
    task = _task(tmp_path / "t-0", segs, ms=5 * HOUR)
    listed = list_segments(task.path)
    plan = plan_partition(task, listed, now_ms=NOW, force=False)
    assert [d.base_offset for d in plan.decisions] == [0, 100, 200]
    assert plan.new_log_start == 300
    # three expired, the fourth stops the rule; the active one is never read
    assert [s.timestamp_read for s in listed] == [True] * 4 + [False] * 2 + [True]
    assert [s.timestamp_source for s in listed[:4]] == ["timeindex"] * 4
    assert listed[-1].timestamp_source == "active"
    p = ModelPartition(segs, 5 * HOUR, -1, "delete", 0, task.high_watermark, None)
    assert expected_log_start(p, NOW, force=False)[0] == plan.new_log_start


def test_size_rule_reads_every_size_and_a_missing_time_index_falls_back_to_mtime(
    tmp_path: Path,
) -> None:
    segs = _segments([1, None, 1, 1, 0])
    write_partition(tmp_path / "t-0", segs)
    os.remove(tmp_path / "t-0" / f"{100:020d}.timeindex")  # a time index that is gone
    scans = scan_partition(str(tmp_path / "t-0"))
    assert [s.timestamp_source for s in scans] == ["timeindex", "mtime"] + ["timeindex"] * 2 + [
        "active"
    ]
    assert scans[1].largest_timestamp == NOW - 10 * HOUR
    assert [s.size for s in scans] == [1000] * 5
    # retention.bytes 2500 of 5000: the oldest two go, then the log would drop below it
    task = _task(tmp_path / "t-0", segs, ms=-1, size=2500)
    plan = from_wire(next(plan_task([task], now_ms=NOW, force=False)))
    assert [(d.base_offset, d.rule, d.size) for d in plan.decisions] == [
        (0, "retention.bytes", 1000),
        (100, "retention.bytes", 1000),
    ]


def test_only_segment_log_names_count(tmp_path: Path) -> None:
    part = tmp_path / "t-0"
    write_partition(part, _segments([3, 2, 1]))
    for junk in (
        f"{50:020d}.log.deleted",
        f"{60:020d}.log.cleaned",
        f"{70:020d}.log.swap",
        f"x{80:020d}.log",
        f"{90:019d}.log",
        f"{5:020d}.log\n",
        "leader-epoch-checkpoint",
    ):
        (part / junk).write_bytes(b"")
    assert [s.base_offset for s in list_segments(str(part))] == [0, 100, 200]


def test_a_segment_deleted_under_the_planner(tmp_path: Path) -> None:
    segs = _segments([9, 8, 0])
    write_partition(tmp_path / "t-0", segs)
    task = _task(tmp_path / "t-0", segs, ms=-1, size=0)
    listed = list_segments(task.path)
    os.rename(
        tmp_path / "t-0" / f"{0:020d}.log", tmp_path / "t-0" / f"{0:020d}.log.deleted"
    )  # what the broker's retention does meanwhile
    with pytest.raises(SegmentVanishedError, match="deleted while planning"):
        plan_partition(task, listed, now_ms=NOW, force=False)
    # plan_task lists again: the plan is of what is left
    (wire,) = plan_task([task], now_ms=NOW, force=False)
    assert from_wire(wire).segments == 2 and from_wire(wire).new_log_start == 200
    # a partition directory not there: the driver decides (a deleted topic or no shared disk)
    gone = task._replace(path=str(tmp_path / "nope-0"))
    with pytest.raises(PartitionDirMissingError) as err:
        list(plan_task([gone], now_ms=NOW, force=False))
    assert err.value.path == gone.path
