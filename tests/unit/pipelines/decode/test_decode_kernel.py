"""The vectorised decoder on hand-built bytes and on batches built by kafka-python."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import cramjam
import lz4.frame
import numpy as np
import pytest
import zstandard
from crc32c import crc32c
from kafka.record.default_records import DefaultRecordBatchBuilder

from logstore.protocol.codecs import XERIAL_HEADER, ZstdFrames, zstd_frame
from pipelines.decode import _kernels, decode_records, scan_batches, verify_batches
from pipelines.decode.codecs import LZ4_STORED, lz4_frames
from pipelines.decode.reference import reference_decode
from pipelines.decode.warmup import warm
from pipelines.delta import _parquet_kernels
from pipelines.numba_cache import digest_directory, holds


def zigzag(n: int) -> bytes:
    u = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        b = u & 0x7F
        u >>= 7
        if u:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def raw_record(
    offset_delta: int,
    ts_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[bytes, bytes | None]] = (),  # type: ignore[assignment]
    *,
    attributes: int = 0,
) -> bytes:
    body = bytearray([attributes])
    body += zigzag(ts_delta) + zigzag(offset_delta)
    body += zigzag(-1) if key is None else zigzag(len(key)) + key
    body += zigzag(-1) if value is None else zigzag(len(value)) + value
    body += zigzag(len(headers))
    for hk, hv in headers:
        body += zigzag(len(hk)) + hk
        body += zigzag(-1) if hv is None else zigzag(len(hv)) + hv
    return zigzag(len(body)) + bytes(body)


def raw_batch(
    records: bytes,
    *,
    count: int,
    base_offset: int = 0,
    last_delta: int | None = None,
    attributes: int = 0,
    base_ts: int = 1_000,
    max_ts: int = 2_000,
    producer: tuple[int, int, int] = (-1, -1, -1),
    epoch: int = 7,
) -> bytes:
    """A v2 batch laid out byte by byte (DESIGN.md's header table), CRC computed here."""
    last = count - 1 if last_delta is None else last_delta
    body = struct.pack(">hiqqqhii", attributes, last, base_ts, max_ts, *producer, count) + records
    crc = crc32c(body)
    length = 4 + 1 + 4 + len(body)
    return struct.pack(">qiibI", base_offset, length, epoch, 2, crc) + body


def decode_all(buf: bytes, **kw: Any) -> tuple[list[dict[str, Any]], list[tuple[int, str]]]:
    scan = scan_batches(buf)
    _, errors = verify_batches(buf, scan)
    select = np.array([e is None for e in errors], dtype=bool)
    bad = [(int(p), e) for p, e in zip(scan.position.tolist(), errors, strict=True) if e]
    rows = []
    for d in decode_records(buf, scan, select=select, **kw):
        rows.extend(d.records.to_pylist())
        bad.extend((e.position, e.reason) for e in d.errors)
    return rows, bad


def test_hand_built_batch_fields() -> None:
    recs = (
        raw_record(0, 0, b"k0", b"v0")
        + raw_record(1, 5, None, b"")
        + raw_record(2, -3, b"", None, [(b"h1", b"x"), (b"h2", None)])
    )
    buf = raw_batch(recs, count=3, base_offset=100, producer=(42, 3, 9), attributes=0x10)
    rows, bad = decode_all(buf)
    assert bad == []
    assert [r["offset"] for r in rows] == [100, 101, 102]
    assert [r["timestamp"] for r in rows] == [1_000, 1_005, 997]
    assert [r["key"] for r in rows] == [b"k0", None, b""]
    assert [r["value"] for r in rows] == [b"v0", b"", None]
    assert rows[2]["headers"] == [{"key": "h1", "value": b"x"}, {"key": "h2", "value": None}]
    assert rows[0]["headers"] == []
    assert {(r["producer_id"], r["producer_epoch"], r["base_sequence"]) for r in rows} == {
        (42, 3, 9)
    }
    assert all(r["is_transactional"] and r["leader_epoch"] == 7 for r in rows)
    assert {r["codec"] for r in rows} == {"none"}


def test_nulls_of_a_rolled_back_batch_leave_no_trace_in_the_validity() -> None:
    # The first batch writes rows with null keys and values, then fails (its last record is
    # cut short) and is rolled back: the next batch's rows take the same slots, all present.
    nulls = b"".join(raw_record(i, 0, None, None) for i in range(9))
    damaged = raw_batch(nulls + raw_record(9, 0, b"k", b"v")[:-1], count=10, base_offset=0)
    present = b"".join(raw_record(i, 0, b"k%d" % i, b"v%d" % i) for i in range(9))
    mixed = raw_record(0, 0, None, b"x") + raw_record(1, 0, b"y", None)
    buf = damaged + raw_batch(present, count=9, base_offset=10)
    buf += raw_batch(mixed, count=2, base_offset=19)
    rows, bad = decode_all(buf)
    assert len(bad) == 1 and bad[0][0] == 0
    assert [(r["offset"], r["key"], r["value"]) for r in rows] == [
        *((10 + i, b"k%d" % i, b"v%d" % i) for i in range(9)),
        (19, None, b"x"),
        (20, b"y", None),
    ]


def test_log_append_time_uses_max_timestamp() -> None:
    recs = raw_record(0, 1, b"a", b"b") + raw_record(1, 2, b"c", b"d")
    buf = raw_batch(recs, count=2, attributes=0x08, base_ts=10, max_ts=99)
    rows, _ = decode_all(buf)
    assert [(r["timestamp"], r["timestamp_type"]) for r in rows] == [(99, 1), (99, 1)]


def test_large_varints_and_multibyte_lengths() -> None:
    value = bytes(range(256)) * 3
    recs = raw_record(0, 2**40, b"k" * 200, value)
    buf = raw_batch(recs, count=1, base_ts=-(2**40))
    rows, _ = decode_all(buf)
    assert rows[0]["timestamp"] == 0
    assert rows[0]["key"] == b"k" * 200 and rows[0]["value"] == value


def test_control_batch_is_counted_not_emitted() -> None:
    control = raw_batch(
        raw_record(0, 0, b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x05"),
        count=1, attributes=0x30, producer=(5, 0, -1),
    )  # fmt: skip
    data = raw_batch(raw_record(0, 0, b"k", b"v"), count=1, base_offset=1)
    buf = control + data
    scan = scan_batches(buf)
    assert scan.is_control.tolist() == [True, False]
    rows, bad = decode_all(buf)
    assert bad == [] and [r["offset"] for r in rows] == [1]


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_kafka_python_built_batches_every_codec(codec: int) -> None:
    buf = bytearray()
    expected = []
    for b in range(3):
        builder = DefaultRecordBatchBuilder(
            magic=2, compression_type=codec, is_transactional=False,
            producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 20,
        )  # fmt: skip
        for i in range(50):
            key = None if i % 7 == 0 else f"key-{b}-{i}".encode()
            value = None if i % 11 == 0 else bytes([i]) * i
            headers = [("trace", b"%d" % i)] if i % 3 == 0 else []
            builder.append(i, 1_700_000_000_000 + i, key, value, headers)
            expected.append((b * 50 + i, key, value))
        batch = builder.build()
        batch[0:8] = (b * 50).to_bytes(8, "big")
        buf += batch
    rows, bad = decode_all(bytes(buf))
    assert bad == []
    assert [(r["offset"], r["key"], r["value"]) for r in rows] == expected
    ref, ref_bad, _ = reference_decode(buf)
    assert ref_bad == []
    assert [dict(r, headers=[(h["key"], h["value"]) for h in r["headers"]]) for r in rows] == ref


def test_raw_snappy_as_librdkafka_writes_it() -> None:
    recs = raw_record(0, 0, b"k", b"snappy value") + raw_record(1, 0, None, b"x" * 100)
    buf = raw_batch(bytes(cramjam.snappy.compress_raw(recs)), count=2, attributes=2)
    rows, bad = decode_all(buf)
    assert bad == [] and [r["value"] for r in rows] == [b"snappy value", b"x" * 100]


def test_chunking_gives_the_same_rows() -> None:
    buf = b"".join(
        raw_batch(raw_record(0, 0, b"k%d" % i, b"v" * i), count=1, base_offset=i) for i in range(40)
    )
    whole, _ = decode_all(buf)
    scan = scan_batches(buf)
    chunks = list(decode_records(buf, scan, max_chunk_bytes=300))
    assert len(chunks) > 3
    assert [r for c in chunks for r in c.records.to_pylist()] == whole


def lz4_frame(data: bytes, declared_delta: int | None = 0) -> bytes:
    """An lz4 frame of ``data`` whose header declares ``len(data) + declared_delta`` bytes
    (a valid header checksum either way); ``None``: no content size in the header."""
    if declared_delta is None:
        return bytes(lz4.frame.compress(data, store_size=False))
    out = lz4.frame.LZ4FrameCompressor()
    body = out.begin(source_size=len(data)) + out.compress(data) + out.flush()
    header = lz4.frame.LZ4FrameCompressor().begin(source_size=len(data) + declared_delta)
    return header + body[len(header) :]


def lz4_variants(data: bytes) -> dict[str, bytes]:
    """``data`` as lz4 frames of every shape a producer may write."""
    f = lz4.frame
    return {
        "one block": f.compress(data),
        "block checksums": f.compress(data, block_checksum=True),
        "content checksum": f.compress(data, content_checksum=True),
        "both checksums": f.compress(data, block_checksum=True, content_checksum=True),
        "independent blocks": f.compress(data, block_linked=False),
        "4 MiB blocks": f.compress(data, block_size=f.BLOCKSIZE_MAX4MB),
        "no size": f.compress(data, store_size=False),
        # the Java client's frames: independent 64 KiB blocks, no size, no content checksum
        "java": f.compress(data, block_linked=False, store_size=False),
        "java, block checksums": f.compress(
            data, block_linked=False, store_size=False, block_checksum=True
        ),
        "independent, sized, checksums": f.compress(
            data, block_linked=False, block_checksum=True, content_checksum=True
        ),
    }


def test_lz4_frames_reads_each_frame_header() -> None:
    """Declared sizes of sized frames (-1 for unsized frames, streams too short for a sized
    header and bytes that are no lz4 frame: the full decompressor handles those), and where
    the block of a frame of exactly one block starts."""
    rng = np.random.default_rng(3)
    noise = rng.integers(0, 256, 300, np.uint8).tobytes()  # incompressible: a stored block
    big = b"".join(b"%08d" % i + noise[: i % 50] for i in range(20_000))  # several blocks
    plain = lz4_frame(b"x" * 300)
    dict_id = bytearray(plain)  # FLG bit 0: a dictionary id (4 bytes) before the checksum
    dict_id[4] |= 0x01
    dict_id[14:14] = b"\x01\x00\x00\x00"
    streams = [
        plain,
        lz4_frame(b"y" * 7, None),
        lz4_frame(b"z" * 40, 2**40),
        b"not an lz4 frame at all",
        lz4_frame(b"w" * 5)[:14],
        lz4_frame(b""),  # liblz4 writes no size for empty content
        lz4.frame.compress(noise),
        lz4.frame.compress(big),
        lz4.frame.compress(noise, block_checksum=True, content_checksum=True),
        plain + b"!",  # a byte after the end mark
        plain[:-4] + b"\x01\x00\x00\x00",  # no end mark where it belongs
        bytes(dict_id),
    ]
    buf = np.frombuffer(b"".join(streams), np.uint8)
    ends = np.cumsum([len(x) for x in streams])
    starts = ends - [len(x) for x in streams]
    frames = lz4_frames(buf, starts, ends)
    assert frames.declared.tolist() == [
        300, -1, 40 + 2**40, -1, -1, -1, 300, len(big), 300, 300, 300, 300,
    ]  # fmt: skip
    one_block = (frames.single >= 0).tolist()
    assert one_block == [True, True, True] + [False] * 3 + [True, False, True] + [False] * 3
    # blocks found for every frame of a known header (not for bytes that are no frame, a
    # truncated header or a dictionary id); an empty frame is its end mark alone
    assert (frames.first_block >= 0).tolist() == [True] * 3 + [False] * 2 + [True] * 6 + [False]
    assert frames.first_block[0] == starts[0] + 15  # magic, FLG, BD, size, HC
    assert frames.first_block[1] == starts[1] + 7  # no size
    assert frames.single[6] == LZ4_STORED | 300 and frames.single[8] == LZ4_STORED | 300
    assert 0 < frames.single[0] < 300  # compressed
    assert frames.block_max[0] == 64 << 10


@pytest.mark.parametrize("size", [1, 150, 1_000, 1 << 20])
def test_lz4_frames_of_every_shape_decode_alike(size: int) -> None:
    """One-block frames (block alone), the rest through liblz4's frame decoder, stored and
    compressed blocks, checksums or not: every shape gives the records built, at any chunk
    size, and the reference decoder agrees."""
    rng = np.random.default_rng(5)
    batches = []
    expected = []
    offset = 0
    for n_records in (1, 3, 40, 2000):  # 2000 records of ~90 bytes: three 64 KiB blocks
        for name, frame in lz4_variants(b"").items():
            del frame
            recs = []
            for j in range(n_records):
                value = rng.integers(0, 256, 40, np.uint8).tobytes() + b"v%d" % j * 10
                recs.append(raw_record(j, j, b"k%d" % j, value))
                expected.append((offset + j, value))
            data = lz4_variants(b"".join(recs))[name]
            batches.append(raw_batch(data, count=n_records, base_offset=offset, attributes=3))
            offset += n_records
    buf = b"".join(batches)
    rows, bad = decode_all(buf, max_chunk_bytes=size)
    assert bad == []
    assert [(r["offset"], r["value"]) for r in rows] == expected
    ref, ref_bad, _ = reference_decode(buf)
    assert ref_bad == [] and [r["value"] for r in ref] == [v for _, v in expected]


def test_lz4_frames_with_and_without_a_declared_size_across_chunks() -> None:
    """Sized lz4 frames go straight into the arena, unsized ones through the full
    decompressor, uncompressed batches are copied beside them; chunks of any size give the
    same rows, the values as built."""
    batches = []
    for i in range(30):
        recs = b"".join(raw_record(0, j, b"k%d" % i, b"v%d-" % j * (i + j)) for j in range(3))
        if i % 3 == 2:
            batches.append(raw_batch(recs, count=3, base_offset=3 * i))
        else:
            data = lz4_frame(recs, 0 if i % 3 == 0 else None)
            batches.append(raw_batch(data, count=3, base_offset=3 * i, attributes=3))
    buf = b"".join(batches)
    whole, bad = decode_all(buf)
    assert bad == []
    assert [r["value"] for r in whole] == [
        b"v%d-" % j * (i + j) for i in range(30) for j in range(3)
    ]
    scan = scan_batches(buf)
    for size in (1, 150, 1_000):
        chunks = list(decode_records(buf, scan, max_chunk_bytes=size))
        assert [r for c in chunks for r in c.records.to_pylist()] == whole, size


@pytest.mark.parametrize("block_size", [lz4.frame.BLOCKSIZE_MAX64KB, lz4.frame.BLOCKSIZE_MAX4MB])
def test_unsized_lz4_frames_at_lz4s_largest_ratio_decode(block_size: int) -> None:
    """Frames without a size (the Java client's) are bounded by what their blocks can hold:
    a compressed block at most 255 times its length. Zeros compress at nearly that ratio
    (4 MiB into 16459 bytes); they must still fit."""
    value = bytes(3 << 20)
    recs = raw_record(0, 0, b"k", value) + raw_record(1, 0, b"k", b"")
    frame = lz4.frame.compress(recs, block_linked=False, store_size=False, block_size=block_size)
    rows, bad = decode_all(raw_batch(frame, count=2, base_offset=0, attributes=3))
    assert bad == [] and [r["value"] for r in rows] == [value, b""]


LONG = raw_record(0, 0, b"k", b"v" * 200)  # compresses: its lz4 frame holds a compressed block
# LONG twice as the Java client frames it: independent blocks, no content size
JAVA = lz4.frame.compress(LONG * 2, block_linked=False, store_size=False)


def _damaged_block() -> bytes:
    """A one-block lz4 frame of one record whose block's first token claims a long match."""
    frame = bytearray(lz4_frame(LONG))
    frame[19] = 0x0F  # no literals, a match before any output
    return bytes(frame)


def _zstd_records(n: int) -> bytes:
    return b"".join(raw_record(j, j, b"k%d" % j, b"zstd value %d " % j * 5) for j in range(n))


ZSTD_SIZED = zstandard.ZstdCompressor().compress(_zstd_records(3))
ZSTD_UNSIZED = zstandard.ZstdCompressor(write_content_size=False).compress(_zstd_records(3))


def _java_zstd(data: bytes, **kw: Any) -> bytes:
    """A frame as a streaming compressor writes it (the Java client's): no content size."""
    c = zstandard.ZstdCompressor(**kw).compressobj()
    return c.compress(data) + c.flush()


def test_zstd_one_call_path_takes_whole_frames_only() -> None:
    """ZstdFrames decompresses whole frames, sized or not, one or several; anything else is
    left to the full decompressor (None)."""
    frames = ZstdFrames(max_size=1 << 20)
    three = _zstd_records(3)
    assert frames.decompress(memoryview(ZSTD_SIZED)) == three
    assert frames.decompress(memoryview(ZSTD_UNSIZED)) == three
    assert frames.decompress(memoryview(_java_zstd(three))) == three
    assert frames.decompress(memoryview(ZSTD_SIZED + ZSTD_UNSIZED)) == three * 2
    for other in (ZSTD_SIZED + b"!", ZSTD_SIZED[:-3], ZSTD_UNSIZED[:-3], b"no zstd", b""):
        assert frames.decompress(memoryview(other)) is None
    assert ZstdFrames(max_size=10).decompress(memoryview(ZSTD_SIZED)) is None  # over the bound
    # walked without a declared size: the bound is what the blocks can hold (128 KiB a
    # compressed block), so one compressed block is over a 100 KiB limit
    assert ZstdFrames(max_size=100 << 10).decompress(memoryview(ZSTD_UNSIZED)) is None
    # a declared size far beyond the compressed bytes is believed only if the blocks can
    # hold it: zeros (RLE blocks) can, a forged size over a small frame cannot
    zeros = zstandard.ZstdCompressor().compress(bytes(3 << 20))
    assert ZstdFrames(max_size=1 << 30).decompress(memoryview(zeros)) == bytes(3 << 20)
    forged = bytearray(zstandard.ZstdCompressor().compress(bytes(70_000)))  # one block
    assert forged[4] == 0xA0  # single segment, a 4-byte content size right after
    forged[5:9] = (900 << 20).to_bytes(4, "little")
    assert zstd_frame(memoryview(bytes(forged)), 0) == (len(forged), 128 << 10)
    assert ZstdFrames(max_size=1 << 30).decompress(memoryview(bytes(forged))) is None


@pytest.mark.parametrize(
    ("data", "kw"),
    [
        (b"", {}),
        (bytes(5 << 20), {}),  # RLE blocks
        (np.random.default_rng(2).integers(0, 256, 300_000, np.uint8).tobytes(), {}),  # raw
        (b"abc" * 100_000, {"write_checksum": True}),
        (b"abc" * 10, {"write_content_size": False}),  # single segment
        (b"abc" * 100_000, {"write_content_size": False}),  # a window descriptor
    ],
)
def test_zstd_frame_walk_ends_where_the_frame_does_and_bounds_its_output(
    data: bytes, kw: dict[str, Any]
) -> None:
    for frame in (zstandard.ZstdCompressor(**kw).compress(data), _java_zstd(data, **kw)):
        walked = zstd_frame(memoryview(b"xx" + frame + b"yy"), 2)
        assert walked is not None and walked[0] == 2 + len(frame)
        assert len(data) <= walked[1] <= len(data) + (128 << 10) * (len(data) // (128 << 10) + 1)
        assert zstd_frame(memoryview(frame[:-1]), 0) is None  # torn
    with_dict = bytearray(zstandard.ZstdCompressor().compress(data))
    with_dict[4] |= 0x01  # a dictionary id the decoder does not have
    assert zstd_frame(memoryview(bytes(with_dict)), 0) is None


@pytest.mark.parametrize(
    ("stream", "count"),
    [
        (ZSTD_SIZED, 3),
        (ZSTD_UNSIZED, 3),
        (ZSTD_SIZED + ZSTD_UNSIZED, 6),
        (ZSTD_SIZED * 2, 6),
        (_java_zstd(_zstd_records(3)), 3),
        (_java_zstd(_zstd_records(3), write_checksum=True), 3),
    ],
)
def test_zstd_streams_of_every_shape_decode(stream: bytes, count: int) -> None:
    """One sized frame (one call), an unsized one and several frames (the full decompressor)."""
    buf = good(0) + raw_batch(stream, count=count, base_offset=1, attributes=4) + good(9)
    rows, bad = decode_all(buf)
    assert bad == []
    values = [r["value"] for r in rows[1:-1]]
    assert values == [b"zstd value %d " % (j % 3) * 5 for j in range(count)]


@pytest.mark.parametrize("stream", [ZSTD_SIZED + b"!", ZSTD_SIZED[:-3], b"\x28\xb5\x2f\xfd\x00"])
def test_damaged_zstd_streams_are_quarantined(stream: bytes) -> None:
    buf = good(0) + raw_batch(stream, count=3, base_offset=1, attributes=4) + good(2)
    rows, bad = decode_all(buf)
    assert [r["offset"] for r in rows] == [0, 2]
    assert len(bad) == 1 and "zstd" in bad[0][1]


def _xerial(raw: bytes, block: int = 32 * 1024) -> bytes:
    """snappy-java's framing, as the Java client and kafka-python write it."""
    out = bytearray(XERIAL_HEADER)
    for start in range(0, len(raw), block):
        data = bytes(cramjam.snappy.compress_raw(raw[start : start + block]))
        out += len(data).to_bytes(4, "big") + data
    return bytes(out)


SNAPPY_RECORDS = b"".join(raw_record(j, j, b"k%d" % j, b"snappy %d " % j * 40) for j in range(200))


@pytest.mark.parametrize(
    "stream",
    [
        _xerial(SNAPPY_RECORDS),  # 2 blocks of 32 KiB
        _xerial(SNAPPY_RECORDS, block=1000),  # many blocks
        bytes(cramjam.snappy.compress_raw(SNAPPY_RECORDS)),  # librdkafka: one raw block
        XERIAL_HEADER + _xerial(SNAPPY_RECORDS)[16:],
    ],
)
def test_snappy_streams_of_every_shape_decode(stream: bytes) -> None:
    buf = good(0) + raw_batch(stream, count=200, base_offset=1, attributes=2) + good(201)
    rows, bad = decode_all(buf)
    assert bad == []
    assert [r["value"] for r in rows[1:-1]] == [b"snappy %d " % j * 40 for j in range(200)]


@pytest.mark.parametrize(
    "stream",
    [
        _xerial(SNAPPY_RECORDS)[:-10],  # a block running past the batch
        _xerial(SNAPPY_RECORDS)[:-10] + bytes(10),  # a damaged block
        XERIAL_HEADER[:12],  # a torn header
        _xerial(SNAPPY_RECORDS) + b"\x00\x00",  # a torn block length
        b"\xff\xff\xff\xff\x0fnot snappy",  # a raw block declaring 4 GiB
    ],
)
def test_damaged_snappy_streams_are_quarantined(stream: bytes) -> None:
    buf = good(0) + raw_batch(stream, count=200, base_offset=1, attributes=2) + good(201)
    rows, bad = decode_all(buf)
    assert [r["offset"] for r in rows] == [0, 201]
    assert len(bad) == 1 and "snappy" in bad[0][1], bad


def good(i: int) -> bytes:
    return raw_batch(raw_record(0, 0, b"k", b"v%d" % i), count=1, base_offset=i)


def framed(body: bytes) -> bytes:
    """A record of hand-written fields (attributes, deltas...), length prefix added."""
    return zigzag(len(body)) + body


KV = zigzag(1) + b"k" + zigzag(1) + b"v"  # key "k", value "v"


@pytest.mark.parametrize(
    ("damaged", "reason"),
    [
        (raw_batch(raw_record(0, 0, b"k", b"v") + b"\x00", count=1, base_offset=1), "left after"),
        (raw_batch(raw_record(0, 0, b"k", b"v")[:-2], count=1, base_offset=1), "past the end"),
        (raw_batch(raw_record(0, 0, b"k", b"v"), count=2, base_offset=1), "recordsCount"),
        (
            raw_batch(raw_record(0, 0, b"k", b"v", [(b"\xff\xfe", b"x")]), count=1, base_offset=1),
            "UTF-8",
        ),
        (raw_batch(framed(b"\x00" + b"\xff" * 10), count=1, base_offset=1), "varint"),
        (raw_batch(zigzag(-5) + b"\x00" * 8, count=1, base_offset=1), "negative record length"),
        (
            raw_batch(framed(b"\x00\x00\x00" + zigzag(9) + b"kkk"), count=1, base_offset=1),
            "disagrees",
        ),
        (raw_batch(framed(b"\x00\x00\x00" + KV + zigzag(-1)), count=1, base_offset=1), "count"),
        (
            raw_batch(framed(b"\x00\x00\x00" + KV + b"\x02" + zigzag(-1)), count=1, base_offset=1),
            "null key",
        ),
        (
            # A header value running past its record.
            raw_batch(
                framed(b"\x00\x00\x00" + KV + b"\x02\x02h" + zigzag(5) + b"x"),
                count=1,
                base_offset=1,
            ),
            "disagrees",
        ),
        (raw_batch(b"\x00garbage-not-gzip", count=1, base_offset=1, attributes=1), "gzip"),
        (raw_batch(b"not lz4 at all", count=1, base_offset=1, attributes=3), "lz4"),
        # lz4 frames that declare another content size than they hold, and one declaring more
        # than a chunk may hold (refused before anything is allocated)
        (
            raw_batch(
                lz4_frame(raw_record(0, 0, b"k", b"v"), +1), count=1, base_offset=1, attributes=3
            ),
            "lz4",
        ),
        (
            raw_batch(
                lz4_frame(raw_record(0, 0, b"k", b"v"), -1), count=1, base_offset=1, attributes=3
            ),
            "lz4",
        ),
        (
            raw_batch(
                lz4_frame(raw_record(0, 0, b"k", b"v"), 2**40), count=1, base_offset=1, attributes=3
            ),
            "decompresses to more than",
        ),
        # one-block frames (decoded without the frame decoder): a damaged block, compressed
        # blocks holding one byte more or less than declared (the frames above hold stored
        # blocks: the record is too short to compress)
        (raw_batch(_damaged_block(), count=1, base_offset=1, attributes=3), "lz4"),
        (raw_batch(lz4_frame(LONG, +1), count=1, base_offset=1, attributes=3), "lz4"),
        (raw_batch(lz4_frame(LONG, -1), count=1, base_offset=1, attributes=3), "lz4"),
        # frames walked block by block (independent blocks, no size): a block running past
        # the batch, no end mark, a byte after it
        (raw_batch(JAVA[:-6] + bytes(4), count=1, base_offset=1, attributes=3), "lz4"),
        (raw_batch(JAVA[:-4], count=1, base_offset=1, attributes=3), "lz4"),
        (raw_batch(JAVA + b"!", count=1, base_offset=1, attributes=3), "lz4"),
        (raw_batch(b"", count=0, base_offset=1, attributes=6), "codec"),
    ],
)
def test_damaged_batch_is_reported_and_neighbours_decoded(damaged: bytes, reason: str) -> None:
    first = good(0)
    buf = first + damaged + good(2)
    rows, bad = decode_all(buf)
    assert [r["offset"] for r in rows] == [0, 2]
    assert len(bad) == 1 and bad[0][0] == len(first)
    assert reason in bad[0][1]


def test_filters_skip_rows_not_checks() -> None:
    """Records outside the filters are still validated (a damaged one fails its batch), but a
    header key that is not UTF-8 only matters in a row that is kept."""
    damaged = raw_batch(
        raw_record(0, 0, b"k", b"v") + framed(b"\x00\x00\x02" + zigzag(9) + b"k"),
        count=2, base_offset=1, last_delta=1,
    )  # fmt: skip
    bad_key = raw_record(1, 0, b"k", b"v", [(b"\xff", b"x")])
    mixed = raw_batch(raw_record(0, 0, b"k", b"v") + bad_key, count=2, base_offset=3)
    buf = good(0) + damaged + mixed
    rows, bad = decode_all(buf, until=4)
    assert [r["offset"] for r in rows] == [0, 3]
    assert bad == [(len(good(0)), "record length disagrees with its fields")]
    rows, bad = decode_all(buf)
    assert [r["offset"] for r in rows] == [0]
    assert [reason for _, reason in bad] == [
        "record length disagrees with its fields",
        "record header key is not valid UTF-8",
    ]


def test_crc_mismatch_is_reported() -> None:
    damaged = bytearray(good(1))
    damaged[-1] ^= 0x01
    buf = good(0) + bytes(damaged)
    scan = scan_batches(buf)
    crc_ok, errors = verify_batches(buf, scan)
    assert crc_ok.tolist() == [True, False]
    assert errors[0] is None and "CRC mismatch" in str(errors[1])


def test_scan_stops_at_torn_tail_and_zero_fill() -> None:
    whole = good(0) + good(1)
    torn = scan_batches(whole + good(2)[:30])
    assert len(torn) == 2 and torn.stop == "torn" and torn.end == len(whole)
    filled = scan_batches(whole + bytes(4096))
    assert len(filled) == 2 and filled.stop == "end"
    bad_length = scan_batches(whole + struct.pack(">qi", 5, 3) + b"\x01" * 40)
    assert bad_length.stop == "corrupt" and bad_length.end == len(whole)


def test_magic_1_message_set_is_framed_and_reported() -> None:
    v1 = struct.pack(">qi", 1, 26) + struct.pack(">Ibbqii", 0, 1, 0, 0, -1, 4) + b"abcd"
    buf = good(0) + v1 + good(2)
    scan = scan_batches(buf)
    assert scan.magic.tolist() == [2, 1, 2]
    _, errors = verify_batches(buf, scan)
    assert errors[1] is not None and "magic 1" in errors[1]
    rows, _ = decode_all(buf)
    assert [r["offset"] for r in rows] == [0, 2]


def test_positions_are_absolute_with_base_position() -> None:
    buf = good(0) + good(1)
    scan = scan_batches(buf, base_position=4096)
    assert scan.position.tolist() == [4096, 4096 + len(good(0))]
    rows = [r for d in decode_records(buf, scan, base_position=4096) for r in d.records.to_pylist()]
    assert [r["batch_position"] for r in rows] == scan.position.tolist()


def test_the_setup_warm_up_reads_its_segments_through_the_ingest_path() -> None:
    """``python -m pipelines.decode.warmup`` (run by tools/bootstrap.sh) fills numba's cache
    by reading one uncompressed and one lz4 batch of two records each and writing them with
    the ingest job's Parquet writer: both kernel modules have a cache index afterwards, in
    the digest directory (:mod:`pipelines.numba_cache`) where :func:`holds` looks for it."""
    assert warm() == 4
    digest_dir = digest_directory()
    assert digest_dir is not None
    for module, kernel in ((_kernels, "records_to_columns"), (_parquet_kernels, "plain_binary")):
        cache = Path(getattr(module, kernel).stats.cache_path)
        assert cache.parent == digest_dir, cache
        stem = Path(module.__file__).stem  # type: ignore[arg-type]
        assert list(cache.glob(f"{stem}.{kernel}-*.nbi")), (module.__name__, kernel)
    assert holds([
        "pipelines.decode._kernels.records_to_columns",
        "pipelines.delta._parquet_kernels.plain_binary",
    ])  # fmt: skip
