"""Packing planned segment ranges into equal tasks (pipelines.ingest.pack_ranges)."""

from __future__ import annotations

import random

from pipelines.ingest import pack_ranges
from pipelines.sources.plan import SegmentRange


def _range(path: str, start: int, end: int) -> SegmentRange:
    return SegmentRange(
        topic="t", partition=0, path=path, segment_base_offset=0, start=start, end=end,
        start_offset=0, until=2**63 - 1, next_base_offset=None, is_tail=False,
    )  # fmt: skip


def _bytes(group: list[SegmentRange]) -> int:
    return sum(r.end - r.start for r in group)


def test_every_range_once_in_file_order_and_balanced() -> None:
    rng = random.Random(7)
    ranges = []
    for seg in range(6):
        pos = 0
        for _ in range(rng.randint(1, 5)):
            size = rng.randint(1, 40) << 20
            ranges.append(_range(f"{seg:020d}.log", pos, pos + size))
            pos += size
    for tasks in (1, 2, 4, 6, 64):
        groups = pack_ranges(ranges, tasks)
        assert len(groups) == min(tasks, len(ranges))
        assert sorted(id(r) for g in groups for r in g) == sorted(id(r) for r in ranges)
        for g in groups:  # planned (file) order kept inside a task
            assert [ranges.index(r) for r in g] == sorted(ranges.index(r) for r in g)
        sizes = [_bytes(g) for g in groups]
        biggest = max(r.end - r.start for r in ranges)
        # LPT: no group exceeds the mean by more than one range
        assert max(sizes) <= _bytes(ranges) / len(groups) + biggest


def test_one_big_segment_and_a_small_one_no_longer_idle_a_core() -> None:
    """The case that motivated packing: 5 segments of 4 pieces and a small one, 2 cores."""
    ranges = [_range(f"{s}.log", i * 32, (i + 1) * 32) for s in range(5) for i in range(4)]
    ranges.append(_range("5.log", 0, 30))
    groups = pack_ranges(ranges, 6)
    # one task per segment: [128] * 5 + [30], a core reads 3 x 128 while the other idles;
    # packed: tasks within one piece (32) of each other
    assert sorted(_bytes(g) for g in groups) == [96, 96, 96, 126, 128, 128]
