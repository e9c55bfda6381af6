"""Topic rules on the produce path (Partition.append_as_leader on a real Log): the timestamp
window (INVALID_TIMESTAMP) and compression.type recompression; segment.jitter.ms and
preallocate on the segments a real Log rolls."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from logstore.errors import InvalidTimestampError
from logstore.protocol.batch import CODEC_MASK, Codec, iter_batches
from logstore.protocol.records import build_batch, decode_batch
from logstore.server.error_codes import error_code_for
from logstore.storage.log import Log, LogConfig
from logstore.storage.partition import Partition

NOW = 1_700_000_000_000
HOUR = 3_600_000


def _part(tmp_path: Path, config: LogConfig) -> Partition:
    return Partition.load("t", 0, Log.open(tmp_path / "t-0", config))


def _stored(p: Partition) -> bytes:
    sl = p.log.read(p.log_start_offset, 10**9)
    return os.pread(sl.fileno, sl.length, sl.position)


def _batch(codec: Codec, *, ts: int = NOW, n: int = 20, pid: int = -1) -> bytearray:
    return build_batch(
        [(b"k%d" % i, b"value-%d " % i * 20, (("h", b"x"),), ts + i) for i in range(n)],
        codec=codec,
        producer_id=pid,
        producer_epoch=0 if pid >= 0 else -1,
        base_sequence=0 if pid >= 0 else -1,
    )


def test_timestamp_window_refuses_whole_batches(tmp_path):
    cfg = LogConfig(message_timestamp_before_max_ms=HOUR, message_timestamp_after_max_ms=60_000)
    p = _part(tmp_path, cfg)
    try:
        p.append_as_leader(_batch(Codec.NONE, ts=NOW - HOUR), now_ms=NOW)  # at the bound: ok
        for ts in (NOW - HOUR - 1, NOW + 60_000 - 19 + 1):  # first / last record outside
            with pytest.raises(InvalidTimestampError) as exc:
                p.append_as_leader(_batch(Codec.LZ4, ts=ts), now_ms=NOW)
            assert error_code_for(exc.value) == ErrorCode.invalid_timestamp
            assert f"must be within [{NOW - HOUR}, {NOW + 60_000}]" in exc.value.message
        assert p.log.log_end_offset == 20  # nothing of the refused batches was appended
    finally:
        p.log.close()


def test_log_append_time_topics_take_any_timestamp(tmp_path):
    cfg = LogConfig(message_timestamp_type="LogAppendTime", message_timestamp_after_max_ms=0)
    p = _part(tmp_path, cfg)
    try:
        p.append_as_leader(_batch(Codec.NONE, ts=NOW + 10 * HOUR), now_ms=NOW)
        assert p.log.log_end_offset == 20
    finally:
        p.log.close()


def test_kafka_default_window_refuses_far_future_batches(tmp_path):
    p = _part(tmp_path, LogConfig())
    try:
        p.append_as_leader(_batch(Codec.NONE, ts=0), now_ms=NOW)  # no lower bound by default
        with pytest.raises(InvalidTimestampError):
            p.append_as_leader(_batch(Codec.NONE, ts=NOW + HOUR), now_ms=NOW)
    finally:
        p.log.close()


@pytest.mark.parametrize("target", ["uncompressed", "gzip", "snappy", "lz4", "zstd"])
def test_recompression_to_the_topic_codec_keeps_every_record(tmp_path, target):
    cfg = LogConfig(compression_type=target, compression_zstd_level=19, compression_lz4_level=12)
    p = _part(tmp_path, cfg)
    sources = [Codec.NONE, Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD]
    expected = []
    try:
        for i, codec in enumerate(sources):
            batch = _batch(codec, pid=7 if i == 2 else -1)
            expected += [(r.key, r.value, r.headers, r.timestamp) for r in decode_batch(batch)[1]]
            p.append_as_leader(batch, now_ms=NOW)
        data = _stored(p)
    finally:
        p.log.close()
    want = Codec.NONE if target == "uncompressed" else Codec[target.upper()]
    got = []
    offsets = []
    for pos, header in iter_batches(data):
        assert header.attributes & CODEC_MASK == want
        records = decode_batch(data, pos)[1]  # checks the recomputed CRC
        got += [(r.key, r.value, r.headers, r.timestamp) for r in records]
        offsets += [r.offset for r in records]
    assert got == expected
    assert offsets == list(range(100))
    # the idempotent batch kept its producer id, epoch and sequence
    headers = [h for _, h in iter_batches(data)]
    assert (headers[2].producer_id, headers[2].producer_epoch, headers[2].base_sequence) == (
        7,
        0,
        0,
    )


def test_producer_compression_stores_the_bytes_as_sent(tmp_path):
    p = _part(tmp_path, LogConfig())
    batch = _batch(Codec.LZ4)
    sent = bytes(batch)
    try:
        p.append_as_leader(batch, now_ms=NOW)
        stored = _stored(p)
    finally:
        p.log.close()
    # byte for byte but for the base offset the broker stamps (outside the CRC)
    assert stored[8:] == sent[8:]


def test_segment_jitter_rolls_earlier(tmp_path):
    cfg = LogConfig(segment_ms=10_000, segment_jitter_ms=10_000)
    lg = Log.open(tmp_path / "t-0", cfg)
    try:
        lg.append(_batch(Codec.NONE, ts=NOW, n=1), now_ms=NOW)
        jitter = lg.segments[-1].roll_jitter_ms
        assert 0 <= jitter < 10_000
        lg.roll(now_ms=NOW)
        # the next segment drew its own jitter; a batch past segment.ms - jitter rolls it
        seg = lg.segments[-1]
        seg.roll_jitter_ms = 4_000
        lg.append(_batch(Codec.NONE, ts=NOW, n=1), now_ms=NOW)
        lg.append(_batch(Codec.NONE, ts=NOW + 6_001, n=1), now_ms=NOW)
        assert len(lg.segments) == 3
    finally:
        lg.close()


def test_preallocate_reserves_blocks_without_changing_the_size(tmp_path):
    size = 4 << 20
    cfg = LogConfig(segment_bytes=size, preallocate=True)
    lg = Log.open(tmp_path / "t-0", cfg)
    try:
        lg.append(_batch(Codec.NONE, n=5), now_ms=NOW)
        first = lg.segments[-1].path
        lg.roll(now_ms=NOW)
        active = lg.segments[-1].path
        st = os.stat(active)
        assert st.st_size == 0
        assert st.st_blocks * 512 >= size  # reserved for the segment's appends
        # the rolled segment gave back what it did not use
        assert os.stat(first).st_blocks * 512 < size // 2
        lg.append(_batch(Codec.NONE, n=5), now_ms=NOW)
        assert os.stat(active).st_size > 0
    finally:
        lg.close()
    assert os.stat(active).st_blocks * 512 < size // 2  # released on close
    plain = Log.open(tmp_path / "u-0", LogConfig(segment_bytes=size))
    try:
        plain.roll(now_ms=NOW)
        assert os.stat(plain.segments[-1].path).st_blocks * 512 < size // 2
    finally:
        plain.close()
