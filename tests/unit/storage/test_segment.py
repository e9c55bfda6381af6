"""LogSegment: append, index entries per index.interval.bytes, translate, read, truncate, roll."""

from __future__ import annotations

import os
from pathlib import Path

from logstore.protocol.batch import read_header
from logstore.protocol.records import build_batch
from logstore.storage.index import OffsetPosition, TimestampOffset
from logstore.storage.segment import BatchInfo, LogSegment


def _batch(base: int, n: int, ts: int, size: int = 100) -> bytearray:
    return build_batch([(b"k", b"v" * size) for _ in range(n)], base_offset=base, base_timestamp=ts)


def _append(seg: LogSegment, buf: bytearray) -> None:
    h = read_header(buf)
    seg.append(buf, [BatchInfo(0, h.size, h.last_offset, h.max_timestamp)])


def _fill(
    seg: LogSegment, count: int, *, start: int = 0, ts0: int = 1000
) -> list[tuple[int, int, int]]:
    """Append ``count`` 2-record batches; return (position, base, last) for each."""
    out = []
    off = start
    for i in range(count):
        buf = _batch(off, 2, ts0 + i)
        out.append((seg.size, off, off + 1))
        _append(seg, buf)
        off += 2
    return out


def test_files_and_names(tmp_path: Path) -> None:
    seg = LogSegment.open(tmp_path, 42, max_index_size=1024)
    assert seg.path.name == "00000000000000000042.log"
    assert (tmp_path / "00000000000000000042.index").exists()
    assert (tmp_path / "00000000000000000042.timeindex").exists()
    seg.close()


def test_append_writes_bytes_unchanged_and_indexes_every_interval(tmp_path: Path) -> None:
    seg = LogSegment.open(tmp_path, 0, index_interval_bytes=300, max_index_size=4096)
    written = bytearray()
    layout = []
    for i in range(10):
        buf = _batch(i * 2, 2, 1000 + i)
        layout.append((len(written), i * 2 + 1))
        written += buf
        _append(seg, buf)
    assert (tmp_path / "00000000000000000000.log").read_bytes() == bytes(written)
    size = len(_batch(0, 2, 0))
    # Kafka: an entry for a batch when more than 300 bytes were written since the last entry
    expected = []
    since = 0
    for pos, last in layout:
        if since > 300:
            expected.append(OffsetPosition(last, pos))
            since = 0
        since += size
    assert seg.offset_index.entries() == expected
    assert expected  # the interval is small enough to produce entries
    assert seg.time_index.entries()[0].timestamp > 1000
    seg.close()


def test_translate_offset_and_read(tmp_path: Path) -> None:
    seg = LogSegment.open(tmp_path, 100, index_interval_bytes=150, max_index_size=4096)
    layout = _fill(seg, 30, start=100)
    for pos, base, last in layout:
        for target in (base, last):
            loc = seg.translate_offset(target)
            assert loc is not None and (loc.position, loc.base_offset, loc.last_offset) == (
                pos,
                base,
                last,
            )
    assert seg.translate_offset(99) is not None and seg.translate_offset(99).position == 0  # type: ignore[union-attr]
    assert seg.translate_offset(layout[-1][2] + 1) is None
    pos, base, _ = layout[10]
    got = seg.read(base + 1, 10)
    batch_size = layout[1][0]
    assert got == (pos, batch_size, base)  # min one whole batch
    assert seg.read(base, 10, min_one_message=False) == (pos, 10, base)
    assert seg.read(base, 10**6) == (pos, seg.size - pos, base)
    assert seg.read(base, 10**6, max_position=layout[12][0]) == (pos, layout[12][0] - pos, base)
    assert seg.read_next_offset() == layout[-1][2] + 1
    seg.close()


def test_truncate_to_cuts_whole_batches_and_indexes(tmp_path: Path) -> None:
    seg = LogSegment.open(tmp_path, 0, index_interval_bytes=150, max_index_size=4096)
    layout = _fill(seg, 20)
    pos, base, _ = layout[12]
    old_size = seg.size
    removed = seg.truncate_to(base + 1)  # inside a batch: the whole batch goes
    assert removed == old_size - pos
    assert seg.size == pos == os.path.getsize(seg.path)
    assert seg.read_next_offset() == base
    assert all(e.offset < base for e in seg.offset_index.entries())
    assert all(e.offset < base for e in seg.time_index.entries())
    assert seg.max_timestamp_so_far == 1000 + 11
    assert seg.truncate_to(10_000) == 0
    seg.close()


def test_should_roll_conditions(tmp_path: Path) -> None:
    seg = LogSegment.open(tmp_path, 0, max_index_size=24, created_ms=0)  # 3 offset slots, 2 time
    common = {"max_offset_in_messages": 5, "segment_ms": 1000}
    assert not seg.should_roll(
        messages_size=10, max_timestamp_in_messages=0, now_ms=5000, segment_bytes=1000, **common
    )  # empty: time does not roll
    _append(seg, _batch(0, 2, 10_000))
    n = seg.size
    assert seg.should_roll(
        messages_size=1000 - n + 1,
        max_timestamp_in_messages=10_000,
        now_ms=0,
        segment_bytes=1000,
        **common,
    )
    assert not seg.should_roll(
        messages_size=1000 - n,
        max_timestamp_in_messages=10_000,
        now_ms=0,
        segment_bytes=1000,
        **common,
    )
    # segment.ms counts from the first batch's max timestamp
    assert seg.should_roll(
        messages_size=1, max_timestamp_in_messages=11_001, now_ms=0, segment_bytes=10**6, **common
    )
    assert not seg.should_roll(
        messages_size=1, max_timestamp_in_messages=11_000, now_ms=0, segment_bytes=10**6, **common
    )
    # offsets that no longer fit a relative i32
    assert seg.should_roll(
        messages_size=1,
        max_timestamp_in_messages=0,
        now_ms=0,
        segment_bytes=10**6,
        max_offset_in_messages=2**31,
        segment_ms=10**9,
    )
    seg.close()


def test_full_time_index_rolls(tmp_path: Path) -> None:
    seg = LogSegment.open(tmp_path, 0, index_interval_bytes=0, max_index_size=36)
    for i in range(4):
        _append(seg, _batch(i, 1, 100 + i))
        if seg.time_index.is_full:
            break
    assert seg.time_index.is_full
    assert seg.should_roll(
        messages_size=1,
        max_timestamp_in_messages=0,
        now_ms=0,
        segment_bytes=10**6,
        segment_ms=10**9,
        max_offset_in_messages=10,
    )
    seg.on_become_inactive()  # the final entry goes into the reserved slot
    assert seg.time_index.last_entry == TimestampOffset(
        seg.max_timestamp_so_far, seg.offset_of_max_timestamp_so_far
    )
    assert os.path.getsize(seg.time_index.path) == len(seg.time_index) * 12
    seg.close()


def test_reopen_recovers_max_timestamp_and_next_offset(tmp_path: Path) -> None:
    seg = LogSegment.open(tmp_path, 0, index_interval_bytes=150, max_index_size=4096)
    layout = _fill(seg, 25)
    seg.close()
    again = LogSegment.open(tmp_path, 0, index_interval_bytes=150, max_index_size=4096)
    again.sanity_check()
    assert again.read_next_offset() == layout[-1][2] + 1
    assert again.max_timestamp_so_far == 1024
    assert again.rolling_based_timestamp == 1000
    rebuilt_before = again.offset_index.entries()
    assert again.recover() == 0
    assert again.offset_index.entries() == rebuilt_before
    again.close()


def test_change_suffix_keeps_descriptor(tmp_path: Path) -> None:
    seg = LogSegment.open(tmp_path, 0, max_index_size=4096)
    _fill(seg, 3)
    fd = seg.fileno
    seg.change_file_suffixes("", ".deleted")
    assert seg.path.name == "00000000000000000000.log.deleted"
    assert (tmp_path / "00000000000000000000.index.deleted").exists()
    assert len(os.pread(fd, 10, 0)) == 10
    seg.delete()
    assert list(tmp_path.iterdir()) == []
