"""Log: offset assignment, reads as file slices, roll, truncation, retention, flush policy."""

from __future__ import annotations

import os
import random
import threading
from pathlib import Path

import pytest

from logstore.errors import (
    CorruptRecordError,
    InvalidTopicError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from logstore.protocol.batch import TimestampType, iter_batches, read_header
from logstore.protocol.records import build_batch, decode_batch
from logstore.storage.files import LEADER_EPOCH_CHECKPOINT
from logstore.storage.log import Log, LogConfig
from logstore.storage.scheduler import Scheduler

CFG = LogConfig(segment_bytes=4000, index_interval_bytes=200, segment_index_bytes=4096)


def _batch(n: int = 2, ts: int = 1000, size: int = 100, **kw: object) -> bytearray:
    return build_batch([(b"k%d" % i, b"v" * size) for i in range(n)], base_timestamp=ts, **kw)  # type: ignore[arg-type]


def _read_all(log: Log, offset: int) -> bytes:
    fs = log.read(offset, 10**9)
    return os.pread(fs.fileno, fs.length, fs.position)


def _offsets_in(data: bytes) -> list[tuple[int, int]]:
    return [(h.base_offset, h.last_offset) for _, h in iter_batches(data, allow_torn_tail=True)]


@pytest.fixture
def log(tmp_path: Path) -> Log:
    lg = Log.open(tmp_path / "orders-0", CFG)
    yield lg  # type: ignore[misc]
    lg.close()


def test_open_requires_partition_dir_name(tmp_path: Path) -> None:
    with pytest.raises(InvalidTopicError):
        Log.open(tmp_path / "not a partition", CFG)


def test_append_assigns_offsets_in_place_and_stores_bytes(log: Log) -> None:
    buf = _batch(3, ts=5000)
    crc_before = read_header(buf).crc
    info = log.append(buf, leader_epoch=7)
    assert (info.first_offset, info.last_offset, info.num_batches, info.num_records) == (0, 2, 1, 3)
    assert info.max_timestamp == 5000 and info.log_append_time_ms == -1
    assert info.valid_bytes == len(buf)
    h = read_header(buf)
    assert (h.base_offset, h.partition_leader_epoch, h.crc) == (0, 7, crc_before)
    info2 = log.append(_batch(2))
    assert (info2.first_offset, info2.last_offset) == (3, 4)
    assert log.log_end_offset == 5
    on_disk = (log.dir / "00000000000000000000.log").read_bytes()
    assert on_disk[: len(buf)] == bytes(buf)
    _, recs = decode_batch(on_disk)
    assert [r.offset for r in recs] == [0, 1, 2]
    assert (log.dir / LEADER_EPOCH_CHECKPOINT).read_text() == "0\n1\n7 0\n"


def test_append_many_batches_in_one_buffer(log: Log) -> None:
    buf = _batch(2, ts=10) + _batch(1, ts=30) + _batch(4, ts=20)
    info = log.append(buf)
    assert (info.first_offset, info.last_offset, info.num_batches, info.num_records) == (0, 6, 3, 7)
    assert (info.max_timestamp, info.offset_of_max_timestamp) == (30, 2)
    assert _offsets_in(_read_all(log, 0)) == [(0, 1), (2, 2), (3, 6)]


def test_bad_input_appends_nothing(log: Log) -> None:
    log.append(_batch())
    size = log.size
    good = _batch()
    bad = bytearray(_batch())
    bad[-1] ^= 0xFF  # CRC mismatch
    with pytest.raises(CorruptRecordError):
        log.append(good + bad)
    with pytest.raises(CorruptRecordError):
        log.append(_batch()[:-3])  # torn
    with pytest.raises(CorruptRecordError):
        log.append(bytearray())
    with pytest.raises(TypeError):
        log.append(bytes(_batch()))  # type: ignore[arg-type]
    assert log.size == size and log.log_end_offset == 2
    assert read_header(good).base_offset == 0  # not stamped either


def test_max_message_bytes(tmp_path: Path) -> None:
    lg = Log.open(tmp_path / "t-0", LogConfig(max_message_bytes=500))
    with pytest.raises(RecordTooLargeError):
        lg.append(_batch(1, size=600))
    assert lg.log_end_offset == 0
    lg.close()


def test_log_append_time(tmp_path: Path) -> None:
    lg = Log.open(tmp_path / "t-0", LogConfig(message_timestamp_type="LogAppendTime"))
    buf = _batch(2, ts=5)
    info = lg.append(buf, now_ms=777_000)
    assert info.log_append_time_ms == 777_000 and info.max_timestamp == 777_000
    h, recs = decode_batch(_read_all(lg, 0))  # CRC recomputed: decodes cleanly
    assert h.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert [r.timestamp for r in recs] == [777_000, 777_000]
    lg.close()


def test_roll_on_segment_bytes_and_read_across_segments(log: Log) -> None:
    for i in range(60):
        log.append(_batch(2, ts=1000 + i))
    names = sorted(p.name for p in log.dir.glob("*.log"))
    assert len(names) == len(log.segments) > 3
    assert all(s.size <= CFG.segment_bytes for s in log.segments)
    assert [s.base_offset for s in log.segments] == [int(n[:20]) for n in names]
    # rolled segments' indexes are trimmed
    for seg in log.segments[:-1]:
        assert os.path.getsize(seg.offset_index.path) == len(seg.offset_index) * 8
        assert os.path.getsize(seg.time_index.path) == len(seg.time_index) * 12
    seen: list[tuple[int, int]] = []
    offset = 0
    while offset < log.log_end_offset:
        fs = log.read(offset, 1000)
        got = _offsets_in(os.pread(fs.fileno, fs.length, fs.position))
        assert got and got[0][0] <= offset <= got[0][1]
        seen.extend(got)
        offset = got[-1][1] + 1
    assert seen == [(i * 2, i * 2 + 1) for i in range(60)]


def test_read_bounds(log: Log) -> None:
    for _ in range(5):
        log.append(_batch(2))
    end = log.read(10, 100)
    assert (end.length, end.first_offset) == (0, 10)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(11, 100)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, 100)
    capped = log.read(0, 10**6, max_offset=6)
    assert _offsets_in(os.pread(capped.fileno, capped.length, capped.position)) == [
        (0, 1),
        (2, 3),
        (4, 5),
    ]
    assert log.read(6, 10**6, max_offset=6).length == 0
    partial = log.read(3, 10, min_one_batch=False)
    assert (partial.length, partial.first_offset) == (10, 2)


def test_offset_for_timestamp(log: Log) -> None:
    stamps = [100, 300, 200, 500, 400]
    for ts in stamps:
        log.append(build_batch([(None, b"a", (), ts), (None, b"b", (), ts + 10)]))
    # first record (in offset order) with timestamp >= target
    assert log.offset_for_timestamp(0) == (0, 100)
    assert log.offset_for_timestamp(105) == (1, 110)
    assert log.offset_for_timestamp(250) == (2, 300)
    assert log.offset_for_timestamp(450) == (6, 500)
    assert log.offset_for_timestamp(511) is None
    assert log.offset_for_timestamp(-2) == (0, -1)
    assert log.offset_for_timestamp(-1) == (10, -1)
    assert log.offset_for_timestamp(-3) == (7, 510)
    # the record carrying the largest timestamp, not its batch's last offset (KAFKA-16310)
    log.append(build_batch([(None, b"c", (), 700), (None, b"d", (), 650)]))
    assert log.offset_for_timestamp(-3) == (10, 700)


def test_truncate_to(log: Log) -> None:
    for _ in range(40):
        log.append(_batch(2))
    n_segments = len(log.segments)
    log.high_watermark = 80
    assert log.truncate_to(31)  # inside batch (30, 31): it goes
    assert log.log_end_offset == 31 and log.high_watermark == 31
    assert len(log.segments) < n_segments
    assert sorted(int(p.name[:20]) for p in log.dir.glob("*.log")) == [
        s.base_offset for s in log.segments
    ]
    assert _offsets_in(_read_all(log, 28)) == [(28, 29)]
    info = log.append(_batch(2))
    assert info.first_offset == 31
    assert not log.truncate_to(1000)


def test_truncate_below_first_segment_starts_over(tmp_path: Path) -> None:
    lg = Log.open(tmp_path / "t-0", CFG)
    for _ in range(40):
        lg.append(_batch(2))
    lg.high_watermark = 80
    lg.delete_records(60)
    first = lg.segments[0].base_offset
    assert first > 0
    lg.truncate_to(first - 1)
    assert (lg.log_start_offset, lg.log_end_offset, len(lg.segments)) == (first - 1,) * 2 + (1,)
    assert lg.append(_batch(1)).first_offset == first - 1
    lg.close()


def test_delete_records_and_retention(tmp_path: Path) -> None:
    cfg = LogConfig(
        segment_bytes=1000, index_interval_bytes=200, retention_ms=1000, file_delete_delay_ms=0
    )
    lg = Log.open(tmp_path / "t-0", cfg)
    for i in range(30):
        lg.append(_batch(2, ts=10_000 + i * 100))
    with pytest.raises(OffsetOutOfRangeError):
        lg.delete_records(10)  # above the high watermark (still 0)
    lg.high_watermark = lg.log_end_offset
    segs = lg.segments
    target = segs[2].base_offset + 1
    assert lg.delete_records(target) == target
    assert lg.log_start_offset == target
    assert lg.segments[0].base_offset == segs[2].base_offset  # whole segments below went
    with pytest.raises(OffsetOutOfRangeError):
        lg.read(target - 1, 100)
    # retention.ms against each segment's largest timestamp; never the active segment
    cutoff_seg = lg.segments[3]
    now = cutoff_seg.largest_timestamp + 1000
    deleted = lg.delete_old_segments(now)
    assert deleted >= 1
    assert all(now - s.largest_timestamp <= 1000 for s in lg.segments[:-1])
    assert lg.log_start_offset == lg.segments[0].base_offset
    lg.delete_old_segments(10**15)
    assert len(lg.segments) == 1 and lg.segments[0].size > 0
    assert not list(tmp_path.glob("t-0/*.deleted"))
    lg.close()


def test_retention_bytes_keeps_log_under_limit(tmp_path: Path) -> None:
    cfg = LogConfig(
        segment_bytes=1000, retention_bytes=2500, retention_ms=-1, file_delete_delay_ms=0
    )
    lg = Log.open(tmp_path / "t-0", cfg)
    for _ in range(40):
        lg.append(_batch(2))
    lg.high_watermark = lg.log_end_offset
    sizes = [s.size for s in lg.segments]
    lg.delete_old_segments()
    kept = [s.size for s in lg.segments]
    # Kafka deletes oldest-first while the log minus that segment stays >= the limit
    dropped = len(sizes) - len(kept)
    total = sum(sizes)
    assert total - sum(sizes[:dropped]) >= 2500
    assert total - sum(sizes[: dropped + 1]) < 2500
    lg.close()


def test_delayed_delete_renames_then_removes(tmp_path: Path) -> None:
    sched = Scheduler()
    sched.start()
    cfg = LogConfig(segment_bytes=1000, file_delete_delay_ms=50, retention_ms=-1)
    lg = Log.open(tmp_path / "t-0", cfg, scheduler=sched)
    for _ in range(20):
        lg.append(_batch(2))
    lg.high_watermark = lg.log_end_offset
    victim = lg.segments[0]
    fs = lg.read(0, 100)
    lg.delete_records(lg.segments[1].base_offset)
    assert victim.path.name.endswith(".log.deleted") and victim.path.exists()
    assert len(os.pread(fs.fileno, 61, fs.position)) == 61  # in-flight fetch still readable
    done = threading.Event()
    sched.schedule("probe", done.set, delay_ms=200)
    assert done.wait(10)
    assert not victim.path.exists()
    sched.shutdown()
    lg.close()


def test_flush_messages_moves_recovery_point(tmp_path: Path) -> None:
    lg = Log.open(tmp_path / "t-0", LogConfig(flush_messages=5))
    lg.append(_batch(2))
    assert lg.recovery_point == 0
    lg.append(_batch(3))
    assert lg.recovery_point == 5 and lg.unflushed_messages == 0
    lg.append(_batch(1))
    lg.flush()
    assert lg.recovery_point == 6
    lg.close()


def test_high_watermark_is_clamped(log: Log) -> None:
    log.append(_batch(2))
    log.high_watermark = 100
    assert log.high_watermark == 2
    log.high_watermark = -4
    assert log.high_watermark == 0


def test_reads_concurrent_with_appends_and_rolls(tmp_path: Path) -> None:
    cfg = LogConfig(segment_bytes=3000, index_interval_bytes=100, segment_index_bytes=256)
    lg = Log.open(tmp_path / "t-0", cfg)
    lg.append(_batch(2))
    stop = threading.Event()
    errors: list[BaseException] = []
    checked = [0]

    def reader() -> None:
        rng = random.Random(3)
        try:
            while not stop.is_set():
                end = lg.log_end_offset
                off = rng.randint(0, end - 1)
                fs = lg.read(off, 200)
                data = os.pread(fs.fileno, max(fs.length, 61), fs.position)
                h = read_header(data)
                assert h.base_offset <= off <= h.last_offset, (off, h)
                checked[0] += 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for _ in range(400):
        lg.append(_batch(2))
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert checked[0] > 0 and len(lg.segments) > 10
    lg.close()


def test_iter_headers(log: Log) -> None:
    for i in range(40):
        log.append(_batch(1 + i % 3, ts=100 + i, producer_id=7, producer_epoch=1, base_sequence=i))
    headers = list(log.iter_headers())
    assert [h.base_sequence for h in headers] == list(range(40))
    assert all(h.producer_id == 7 for h in headers)
    assert headers[0].base_offset == 0 and headers[-1].last_offset == log.log_end_offset - 1
    for start in (0, 1, 37, 41, log.log_end_offset - 1):
        got = list(log.iter_headers(start))
        assert got == [h for h in headers if h.last_offset >= start]
    assert list(log.iter_headers(log.log_end_offset)) == []
