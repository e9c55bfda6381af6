"""Cutting planned segment pieces into Spark tasks (pipelines.ingest.schedule_tasks)."""

from __future__ import annotations

import heapq
import itertools
import random

import pytest

from pipelines.ingest import schedule_tasks
from pipelines.sources.plan import SegmentRange

MB = 1 << 20


def _piece(path: str, start: int, end: int, *, tail: bool = False) -> SegmentRange:
    return SegmentRange(
        topic="t", partition=0, path=path, segment_base_offset=0, start=start, end=end,
        start_offset=0, until=2**63 - 1, next_base_offset=None, is_tail=tail,
    )  # fmt: skip


def _segments(sizes_mb: list[int], piece_mb: int) -> list[SegmentRange]:
    """Pieces of ``piece_mb`` (the last of a segment smaller), segment after segment."""
    out = []
    for n, size in enumerate(sizes_mb):
        for start in range(0, size, piece_mb):
            end = min(size, start + piece_mb)
            out.append(_piece(f"{n:020d}.log", start * MB, end * MB, tail=end == size))
    return out


def _bytes(task: list[SegmentRange]) -> int:
    return sum(r.end - r.start for r in task)


def _covered(ranges: list[SegmentRange]) -> list[tuple[str, int, int]]:
    """The byte intervals of ``ranges``, touching ones of one file joined."""
    out: list[tuple[str, int, int]] = []
    for r in sorted(ranges, key=lambda r: (r.path, r.start)):
        if out and out[-1][0] == r.path and out[-1][2] == r.start:
            out[-1] = (r.path, out[-1][1], r.end)
        else:
            out.append((r.path, r.start, r.end))
    return out


def _finish_times(cost: list[float], cores: int) -> list[float]:
    """Spark's dispatch: task i (cost[i] seconds) starts on the first free core, in order."""
    free = [0.0] * cores
    for task_cost in cost:
        heapq.heappush(free, heapq.heappop(free) + task_cost)
    return sorted(free)


def test_every_byte_once_in_file_order_and_touching_pieces_merged() -> None:
    rng = random.Random(7)
    pieces = []
    for seg in range(6):
        pos = 0
        for _ in range(rng.randint(1, 9)):
            size = rng.randint(1, 20) * MB
            pieces.append(_piece(f"{seg:020d}.log", pos, pos + size))
            pos += size + (MB if rng.random() < 0.2 else 0)  # a piece planned away: a hole
    for cores in (1, 2, 3, 8):
        tasks = schedule_tasks(pieces, cores, 64 * MB, 8 * MB)
        flat = [r for task in tasks for r in task]
        assert _covered(flat) == _covered(pieces)  # every byte once, no hole bridged
        assert [(r.path, r.start) for r in flat] == sorted((r.path, r.start) for r in flat)
        for task in tasks:  # no two ranges of one task meet: they would have been merged
            assert all(a.path != b.path or a.end != b.start for a, b in itertools.pairwise(task))


def test_full_tasks_first_then_a_cores_share_of_the_rest_down_to_a_piece() -> None:
    # The bench's lz4 topic: 5 segments of 128 MB and one of 30, pieces of 16 MB, 2 cores.
    pieces = _segments([128] * 5 + [30], 16)
    tasks = schedule_tasks(pieces, 2, 128 * MB, 16 * MB)
    sizes = [_bytes(t) // MB for t in tasks]
    assert sizes == [128, 128, 128, 128, 64, 32, 16, 16, 16, 14]
    # a full task is one segment read in one range, with the segment's tail flag
    assert [len(t) for t in tasks[:4]] == [1, 1, 1, 1]
    assert all(t[0].start == 0 and t[0].end == 128 * MB and t[0].is_tail for t in tasks[:4])


def test_one_core_gets_tasks_of_max_bytes() -> None:
    tasks = schedule_tasks(_segments([100, 100], 10), 1, 40 * MB, 10 * MB)
    assert [_bytes(t) // MB for t in tasks] == [40, 40, 40, 40, 40]
    # the third task reads the end of one segment and the start of the next: two ranges
    assert [(r.path[-5:], r.start // MB, r.end // MB) for r in tasks[2]] == [
        ("0.log", 80, 100),
        ("1.log", 0, 20),
    ]


def test_a_rest_under_half_a_piece_joins_the_last_task() -> None:
    pieces = [*_segments([64], 16), _piece("x.log", 0, 3 * MB)]
    tasks = schedule_tasks(pieces, 2, 32 * MB, 16 * MB)
    assert [_bytes(t) // MB for t in tasks] == [32, 16, 19]
    assert tasks[-1][-1].path == "x.log"


def test_no_pieces_no_tasks_and_one_piece_one_task() -> None:
    assert schedule_tasks([], 2, 128 * MB, 16 * MB) == []
    one = [_piece("a.log", 0, 500)]
    assert schedule_tasks(one, 2, 128 * MB, 16 * MB) == [one]


@pytest.mark.parametrize("slow_task", [0, 1, 3])
def test_cores_finish_together_when_one_big_task_runs_slow(slow_task: int) -> None:
    """Modelled dispatch: one 128 MB task costs 30% more per byte (a busy core). Equal tasks of
    117 MB (the old plan) leave the other core idle for most of a task; these tasks run out
    small, so the cores end within one small task of each other."""
    pieces = _segments([128] * 5 + [30], 16)
    tasks = schedule_tasks(pieces, 2, 128 * MB, 16 * MB)
    per_mb = 0.004
    cost = [_bytes(t) / MB * per_mb * (1.3 if i == slow_task else 1.0) for i, t in enumerate(tasks)]
    first, last = _finish_times(cost, 2)
    assert last - first <= 16 * per_mb + 1e-9
    # the old plan: 6 tasks of 117 MB
    old_cost = [117 * per_mb * (1.3 if i == slow_task else 1.0) for i in range(6)]
    old_first, old_last = _finish_times(old_cost, 2)
    assert old_last - old_first >= 0.3 * 117 * per_mb - 1e-9


def test_a_small_run_is_still_spread_over_the_cores() -> None:
    """Less than one smallest task a core: each core still gets a share (a cluster's every
    executor works, as one task per segment did)."""
    pieces = [_piece(f"{s}.log", 0, 1000) for s in range(6)]
    tasks = schedule_tasks(pieces, 2, 128 * MB, 16 * MB)
    assert [_bytes(t) for t in tasks] == [3000, 3000]
    tasks = schedule_tasks(pieces, 4, 128 * MB, 16 * MB)  # a share is 1500: one piece a task
    assert [_bytes(t) for t in tasks] == [1000] * 6
