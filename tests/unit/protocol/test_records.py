"""logstore.protocol.records: decode kafka-python's batches, and kafka-python decodes ours."""

from __future__ import annotations

import struct

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from logstore.errors import CorruptRecordError, UnsupportedCodecError
from logstore.protocol.batch import (
    Codec,
    TimestampType,
    compute_crc,
    read_header,
    set_log_append_time,
    validate_batch,
)
from logstore.protocol.records import (
    Record,
    build_batch,
    decode_batch,
    encode_record,
    first_record_at_time,
)
from logstore.protocol.varint import encode_varint

T0 = 1_700_000_000_000

# (timestamp, key, value, headers): nulls, empties, binary, unicode header keys, a timestamp
# below the first one (negative delta) — what real producers send.
ROWS: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]] = [
    (T0, b"user-1", b'{"a": 1}', []),
    (T0 + 5, None, b"value without key " * 30, [("trace-id", b"abc"), ("empty", b"")]),
    (T0 - 1000, b"", None, [("null-value", None)]),
    (T0 + 7, bytes(range(256)), bytes(range(255, -1, -1)) * 4, [("ключ", b"\x00\xff")]),
    (T0 + 7, b"k", b"", []),
]


def kafka_python_batch(codec: Codec, *, base_offset: int = 0) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=int(codec),
        is_transactional=False,
        producer_id=99,
        producer_epoch=1,
        base_sequence=10,
        batch_size=1 << 20,
    )
    for i, (ts, key, value, headers) in enumerate(ROWS):
        builder.append(i, timestamp=ts, key=key, value=value, headers=headers)
    buf = builder.build()
    struct.pack_into(">q", buf, 0, base_offset)
    return bytes(buf)


def expected_records(base_offset: int) -> list[Record]:
    return [
        Record(base_offset + i, ts, key, value, tuple(headers))
        for i, (ts, key, value, headers) in enumerate(ROWS)
    ]


@pytest.mark.parametrize("codec", list(Codec))
def test_decode_kafka_python_batches(codec: Codec) -> None:
    buf = kafka_python_batch(codec, base_offset=500)
    header, records = decode_batch(buf)
    assert header.codec is codec
    assert header.records_count == len(ROWS)
    assert header.base_timestamp == T0
    assert header.max_timestamp == T0 + 7
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (99, 1, 10)
    assert records == expected_records(500)


@pytest.mark.parametrize("codec", list(Codec))
def test_kafka_python_decodes_ours(codec: Codec) -> None:
    rows = [(key, value, headers, ts) for ts, key, value, headers in ROWS]
    buf = build_batch(
        rows, base_offset=42, codec=codec, producer_id=7, producer_epoch=2, base_sequence=3
    )
    ref = DefaultRecordBatch(bytes(buf))
    assert ref.validate_crc()
    assert ref.compression_type == int(codec)
    assert (ref.base_offset, ref.last_offset, ref.producer_id, ref.base_sequence) == (42, 46, 7, 3)
    got = [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in ref]
    want = [(42 + i, ts, key, value, headers) for i, (ts, key, value, headers) in enumerate(ROWS)]
    assert got == want
    assert decode_batch(buf)[1] == expected_records(42)


def test_same_bytes_as_kafka_python_uncompressed() -> None:
    rows = [(key, value, headers, ts) for ts, key, value, headers in ROWS]
    ours = build_batch(rows, producer_id=99, producer_epoch=1, base_sequence=10)
    assert bytes(ours) == kafka_python_batch(Codec.NONE)


def test_build_header_fields() -> None:
    buf = build_batch(
        [(b"k", b"v", [], 10), (b"k2", b"v2", [], 5)],
        base_offset=3,
        partition_leader_epoch=4,
        is_transactional=True,
        producer_id=1,
        producer_epoch=0,
        base_sequence=0,
    )
    h = validate_batch(buf, exact_count=True)
    assert (h.base_offset, h.last_offset, h.partition_leader_epoch) == (3, 4, 4)
    assert (h.base_timestamp, h.max_timestamp) == (10, 10)
    assert h.is_transactional and not h.is_control
    assert h.timestamp_type is TimestampType.CREATE_TIME


def test_records_without_timestamp_take_the_base_timestamp() -> None:
    _, records = decode_batch(build_batch([(b"a", b"1"), (b"b", b"2")], base_timestamp=777))
    assert [r.timestamp for r in records] == [777, 777]
    header, records = decode_batch(build_batch([(b"a", b"1")]))
    assert header.base_timestamp == -1 and records[0].timestamp == -1


def test_log_append_time_gives_every_record_the_max_timestamp() -> None:
    buf = build_batch([(b"a", b"1", [], 1), (b"b", b"2", [], 2)])
    set_log_append_time(buf, 0, 9_999)
    _, records = decode_batch(buf)
    assert [r.timestamp for r in records] == [9_999, 9_999]


def test_keep_offsets_builds_a_compacted_batch() -> None:
    kept = [Record(10, 1, b"a", b"x"), Record(13, 2, b"b", None)]
    buf = build_batch(kept, base_offset=10, keep_offsets=True, last_offset_delta=5)
    header, records = decode_batch(buf)
    assert (header.records_count, header.last_offset) == (2, 15)
    assert records == kept
    ref = DefaultRecordBatch(bytes(buf))
    assert [r.offset for r in ref] == [10, 13]
    with pytest.raises(ValueError, match="does not increase"):
        build_batch([Record(5, 1, None, None), Record(5, 1, None, None)], keep_offsets=True)


def test_empty_batch_as_the_cleaner_leaves_it() -> None:
    buf = build_batch([], base_offset=100, last_offset_delta=9, producer_id=5, producer_epoch=0)
    header, records = decode_batch(buf)
    assert records == []
    assert (header.records_count, header.last_offset, header.max_timestamp) == (0, 109, -1)


def test_delete_horizon_sets_bit_6_and_base_timestamp() -> None:
    buf = build_batch([(b"k", None, [], 500)], delete_horizon_ms=1_000)
    header, records = decode_batch(buf)
    assert header.has_delete_horizon and header.delete_horizon_ms == 1_000
    assert records[0].timestamp == 500  # delta -500 from the horizon


def test_build_rejects_wrong_items() -> None:
    with pytest.raises(TypeError):
        build_batch([b"not a tuple"])  # type: ignore[list-item]
    with pytest.raises(UnsupportedCodecError):
        build_batch([(b"k", b"v")], codec=6)


def _rebuild(section: bytes, *, count: int, delta: int) -> bytearray:
    """A batch with the given records section and header counts, CRC fixed."""
    good = build_batch([(b"k", b"v", [], 1)])
    buf = bytearray(good[:61]) + section
    struct.pack_into(">i", buf, 8, len(buf) - 12)
    struct.pack_into(">i", buf, 23, delta)
    struct.pack_into(">i", buf, 57, count)
    struct.pack_into(">I", buf, 17, compute_crc(buf, 0, len(buf)))
    return buf


def framed(body: bytes) -> bytes:
    """A record: zigzag varint length, then ``body`` (hand-written zigzag bytes)."""
    return encode_varint(len(body)) + body


def rec(**kw: object) -> bytes:
    args: dict[str, object] = {
        "offset_delta": 0,
        "timestamp_delta": 0,
        "key": b"k",
        "value": b"v",
        "headers": (),
    }
    args.update(kw)
    return encode_record(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("section", "count", "delta", "message"),
    [
        (rec() + rec(offset_delta=1), 1, 1, "bytes left after 1 records"),
        (rec() + rec(offset_delta=0), 2, 1, "offsetDelta 0 after 0"),
        (rec(offset_delta=3), 1, 1, "offsetDelta 3"),
        (rec()[:-1], 1, 0, "length"),
        (framed(b"\x00\x00\x00\x0ak\x02v\x00"), 1, 0, "key length 5"),
        (framed(b"\x00\x00\x00\x02k\x02v\x02\x01"), 1, 0, "null header key"),
        (framed(b"\x00\x00\x00\x02k\x02v\x02\x02\xff\x01"), 1, 0, "not UTF-8"),
        (framed(b"\x00\x00\x00\x02k\x02v\x00\x00"), 1, 0, "left over inside its length"),
        (framed(b"\x00\x00\x00\x02k\x05v\x00"), 1, 0, "value length -3"),
        (framed(b"\x00\x00\x00\x02k\x02v\x03"), 1, 0, "header count -2"),
        (b"\xff\xff\xff\xff\xff\xff\x00", 1, 0, "longer than 5 bytes"),
    ],
)
def test_malformed_records(section: bytes, count: int, delta: int, message: str) -> None:
    buf = b"\x00" * 7 + bytes(_rebuild(section, count=count, delta=delta))
    with pytest.raises(CorruptRecordError, match=message) as err:
        decode_batch(buf, 7)
    assert err.value.position == 7


def test_corrupt_compressed_payload_names_the_batch_position() -> None:
    buf = bytearray(b"\x00" * 3) + build_batch([(b"k", b"v" * 200)], codec=Codec.ZSTD)
    buf[3 + 70] ^= 0xFF
    struct.pack_into(">I", buf, 3 + 17, compute_crc(buf, 3, len(buf) - 3))
    with pytest.raises(CorruptRecordError, match="zstd") as err:
        decode_batch(buf, 3)
    assert err.value.position == 3


def test_verify_crc_false_still_decodes_a_bad_crc_batch() -> None:
    buf = build_batch([(b"k", b"v", [], 1)])
    buf[17] ^= 1
    with pytest.raises(CorruptRecordError, match="CRC"):
        decode_batch(buf)
    assert decode_batch(buf, verify_crc=False)[1][0].value == b"v"
    assert read_header(buf).crc != compute_crc(buf, 0, len(buf))


def test_first_record_at_time_picks_by_timestamp_offset_and_exactness() -> None:
    # offsets 100..104, timestamps out of order as producers may send them
    batch = build_batch(
        [(b"k", b"v", [], ts) for ts in (10, 30, 20, 30, 40)], codec=Codec.LZ4, base_offset=100
    )
    buf = bytes(7) + batch  # not at position 0, as in a segment window
    assert first_record_at_time(buf, 7, timestamp=25) == (101, 30)
    assert first_record_at_time(buf, 7, timestamp=25, min_offset=102) == (103, 30)
    assert first_record_at_time(buf, 7, timestamp=15, min_offset=102) == (102, 20)
    assert first_record_at_time(buf, 7, timestamp=41) is None
    assert first_record_at_time(buf, 7, timestamp=20, exact=True) == (102, 20)
    assert first_record_at_time(buf, 7, timestamp=25, exact=True) is None
    assert first_record_at_time(buf, 7, timestamp=30, min_offset=104) == (104, 40)
    assert first_record_at_time(buf, 7, timestamp=30, min_offset=104, exact=True) is None


def test_first_record_at_time_under_log_append_time_is_the_first_record() -> None:
    buf = build_batch([(b"a", b"1", [], 1), (b"b", b"2", [], 2)], base_offset=5)
    set_log_append_time(buf, 0, 9_999)
    assert first_record_at_time(buf, timestamp=9_999, exact=True) == (5, 9_999)
    assert first_record_at_time(buf, timestamp=2) == (5, 9_999)


def test_first_record_at_time_refuses_a_corrupt_batch() -> None:
    buf = bytearray(b"\x00" * 3) + build_batch([(b"k", b"v", [], 1)])
    buf[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="CRC") as err:
        first_record_at_time(buf, 3, timestamp=0)
    assert err.value.position == 3
