"""Offset and time indexes against a trivially correct reference (a sorted list's floor)."""

from __future__ import annotations

import bisect
import os
import random
import struct
from pathlib import Path

import pytest

from logstore.errors import CorruptIndexError
from logstore.storage.index import OffsetIndex, OffsetPosition, TimeIndex, TimestampOffset


def _floor(keys: list[int], target: int) -> int:
    return bisect.bisect_right(keys, target) - 1


def test_offset_index_layout_on_disk(tmp_path: Path) -> None:
    idx = OffsetIndex(tmp_path / "x.index", 100, max_index_size=1000)
    assert os.path.getsize(idx.path) == 1000  # preallocated, 1000 is a multiple of 8
    idx.append(105, 4096)
    idx.append(110, 9000)
    idx.close()
    raw = (tmp_path / "x.index").read_bytes()
    assert raw == struct.pack(">iiii", 5, 4096, 10, 9000)


def test_preallocation_rounds_down_to_entry_size(tmp_path: Path) -> None:
    off = OffsetIndex(tmp_path / "a.index", 0, max_index_size=1001)
    tim = TimeIndex(tmp_path / "a.timeindex", 0, max_index_size=1001)
    assert os.path.getsize(off.path) == 1000
    assert os.path.getsize(tim.path) == 996
    assert off.max_entries == 125 and tim.max_entries == 83
    off.close()
    tim.close()
    assert os.path.getsize(off.path) == 0 and os.path.getsize(tim.path) == 0


def test_time_index_layout_and_reserved_slot(tmp_path: Path) -> None:
    idx = TimeIndex(tmp_path / "t.timeindex", 50, max_index_size=36)  # 3 slots
    idx.maybe_append(1000, 50)
    idx.maybe_append(1000, 52)  # not larger: ignored
    idx.maybe_append(2000, 53)
    assert idx.is_full  # 2 of 3: the last slot is reserved
    with pytest.raises(CorruptIndexError):
        idx.maybe_append(3000, 54)
    idx.maybe_append(3000, 54, skip_full_check=True)
    assert idx.entries() == [
        TimestampOffset(1000, 50),
        TimestampOffset(2000, 53),
        TimestampOffset(3000, 54),
    ]
    idx.close()
    assert (tmp_path / "t.timeindex").read_bytes() == struct.pack(
        ">qiqiqi", 1000, 0, 2000, 3, 3000, 4
    )


def test_offset_lookup_matches_reference(tmp_path: Path) -> None:
    rng = random.Random(7)
    base = 1_000
    idx = OffsetIndex(tmp_path / "r.index", base, max_index_size=8 * 5000)
    offsets: list[int] = []
    off, pos = base, 0
    for _ in range(4000):  # > warm section (1024 entries) so both halves are searched
        off += rng.randint(1, 20)
        pos += rng.randint(1, 5000)
        idx.append(off, pos)
        offsets.append(off)
    positions = [e.position for e in idx.entries()]
    targets = [base - 5, base, offsets[0], offsets[-1], offsets[-1] + 100]
    targets += [rng.randint(base, offsets[-1] + 10) for _ in range(3000)]
    for t in targets:
        i = _floor(offsets, t)
        expected = OffsetPosition(base, 0) if i < 0 else OffsetPosition(offsets[i], positions[i])
        assert idx.lookup(t) == expected, t


def test_time_lookup_matches_reference(tmp_path: Path) -> None:
    rng = random.Random(11)
    idx = TimeIndex(tmp_path / "r.timeindex", 0, max_index_size=12 * 3000)
    stamps: list[int] = []
    offsets: list[int] = []
    ts, off = 1_600_000_000_000, 0
    for _ in range(2500):
        ts += rng.randint(1, 1000)
        off += rng.randint(0, 3)
        idx.maybe_append(ts, off)
        stamps.append(ts)
        offsets.append(off)
    for t in [0, stamps[0], stamps[-1], stamps[-1] + 1] + [
        rng.randint(stamps[0] - 10, stamps[-1] + 10) for _ in range(3000)
    ]:
        i = _floor(stamps, t)
        expected = TimestampOffset(-1, 0) if i < 0 else TimestampOffset(stamps[i], offsets[i])
        assert idx.lookup(t) == expected


def test_warm_section_touches_only_tail_pages(tmp_path: Path) -> None:
    idx = OffsetIndex(tmp_path / "w.index", 0, max_index_size=8 * 100_000)
    for i in range(100_000):
        idx.append(i * 2 + 1, i * 100)
    touched: set[int] = set()
    assert idx.lookup(199_990, touched=touched).offset == 199_989
    last_page = (100_000 - 1) * 8 // 4096
    # warm section = 1024 entries = 8 KiB: at most 3 pages at the tail
    assert touched and min(touched) >= last_page - 2
    cold: set[int] = set()
    idx.lookup(51, touched=cold)
    assert 0 in cold and len(cold) > 3


def test_reopen_counts_entries_by_file_length(tmp_path: Path) -> None:
    path = tmp_path / "c.index"
    idx = OffsetIndex(path, 10, max_index_size=800)
    for i in range(5):
        idx.append(10 + i * 3, i * 10)
    idx.close()
    again = OffsetIndex(path, 10, max_index_size=800)
    assert len(again) == 5 and again.last_offset == 22
    again.sanity_check(log_size=100)
    again.close_handler()


def test_untrimmed_preallocated_index_fails_sanity_check(tmp_path: Path) -> None:
    path = tmp_path / "u.index"
    idx = OffsetIndex(path, 0, max_index_size=800)
    idx.append(3, 100)
    idx.append(7, 200)
    idx.flush()
    idx.close_handler()  # a crash: never trimmed
    assert os.path.getsize(path) == 800
    again = OffsetIndex(path, 0, max_index_size=800)
    assert len(again) == 100  # Kafka counts length // 8
    with pytest.raises(CorruptIndexError, match="does not increase"):
        again.sanity_check()
    again.close_handler()

    tpath = tmp_path / "u.timeindex"
    tidx = TimeIndex(tpath, 0, max_index_size=120)
    tidx.maybe_append(5000, 3)
    tidx.close_handler()
    tagain = TimeIndex(tpath, 0, max_index_size=120)
    with pytest.raises(CorruptIndexError):
        tagain.sanity_check()
    tagain.close_handler()


def test_garbage_and_bad_length_fail_sanity_check(tmp_path: Path) -> None:
    path = tmp_path / "g.index"
    path.write_bytes(os.urandom(64))
    idx = OffsetIndex(path, 0, max_index_size=800)
    with pytest.raises(CorruptIndexError):
        idx.sanity_check()
    idx.close_handler()
    odd = tmp_path / "o.index"
    odd.write_bytes(struct.pack(">ii", 1, 0) + b"\x00\x01\x02")
    idx2 = OffsetIndex(odd, 0, max_index_size=800)
    with pytest.raises(CorruptIndexError, match="multiple"):
        idx2.sanity_check()
    idx2.close_handler()
    below = tmp_path / "b.index"
    below.write_bytes(struct.pack(">ii", -5, 0))
    idx3 = OffsetIndex(below, 100, max_index_size=800)
    with pytest.raises(CorruptIndexError, match="below the base offset"):
        idx3.sanity_check()
    idx3.close_handler()


def test_position_beyond_log_fails_sanity_check(tmp_path: Path) -> None:
    idx = OffsetIndex(tmp_path / "p.index", 0, max_index_size=80)
    idx.append(5, 5000)
    with pytest.raises(CorruptIndexError, match="position 5000"):
        idx.sanity_check(log_size=4000)
    idx.sanity_check(log_size=6000)
    idx.close()


def test_truncate_to_removes_entries_at_and_above(tmp_path: Path) -> None:
    idx = OffsetIndex(tmp_path / "t.index", 0, max_index_size=800)
    for off in (5, 10, 15, 20):
        idx.append(off, off * 10)
    idx.truncate_to(15)
    assert [e.offset for e in idx.entries()] == [5, 10]
    idx.truncate_to(12)
    assert [e.offset for e in idx.entries()] == [5, 10]
    idx.truncate_to(0)
    assert idx.entries() == [] and idx.last_offset == 0
    idx.close()
    tidx = TimeIndex(tmp_path / "t.timeindex", 0, max_index_size=120)
    for ts, off in ((100, 4), (200, 9), (300, 14)):
        tidx.maybe_append(ts, off)
    tidx.truncate_to(9)
    assert tidx.entries() == [TimestampOffset(100, 4)]
    assert tidx.last_entry == TimestampOffset(100, 4)
    tidx.close()


def test_appends_must_increase(tmp_path: Path) -> None:
    idx = OffsetIndex(tmp_path / "m.index", 10, max_index_size=16)
    idx.append(11, 0)
    with pytest.raises(CorruptIndexError):
        idx.append(11, 5)
    idx.append(12, 5)
    with pytest.raises(CorruptIndexError, match="full"):
        idx.append(13, 9)
    with pytest.raises(CorruptIndexError):
        OffsetIndex(tmp_path / "n.index", 10, max_index_size=16).append(9, 0)
    tidx = TimeIndex(tmp_path / "m.timeindex", 0, max_index_size=120)
    tidx.maybe_append(10, 5)
    with pytest.raises(CorruptIndexError):
        tidx.maybe_append(20, 4)
    idx.close()
    tidx.close()


def test_fetch_upper_bound_offset_is_the_first_entry_at_or_after_a_position(tmp_path: Path) -> None:
    idx = OffsetIndex(tmp_path / "u.index", 100, max_index_size=8 * 100)
    assert idx.fetch_upper_bound_offset(0) is None  # empty
    for i in range(50):  # batch i: last offset 100 + 10i + 9, at position 1000 i
        idx.append(100 + 10 * i + 9, 1000 * i)
    assert idx.fetch_upper_bound_offset(0) == 109
    assert idx.fetch_upper_bound_offset(1) == 119
    assert idx.fetch_upper_bound_offset(25_000) == 359
    assert idx.fetch_upper_bound_offset(25_001) == 369
    assert idx.fetch_upper_bound_offset(49_000) == 599
    assert idx.fetch_upper_bound_offset(49_001) is None  # after every entry
    positions = [1000 * i for i in range(50)]
    for p in range(0, 49_001, 337):  # against a plain search
        assert idx.fetch_upper_bound_offset(p) == 100 + 10 * bisect.bisect_left(positions, p) + 9
