"""logstore.protocol.batch against batches built by kafka-python (an independent encoder)."""

from __future__ import annotations

import mmap
import struct

import pytest
from crc32c import crc32c
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from logstore.errors import (
    CorruptRecordError,
    LoglakeError,
    UnsupportedCodecError,
    UnsupportedMagicError,
)
from logstore.protocol.batch import (
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    Codec,
    TimestampType,
    compute_crc,
    iter_batches,
    read_header,
    set_log_append_time,
    stamp_batch,
    validate_batch,
)


def kp_batch(
    n: int = 3,
    *,
    codec: int = 0,
    transactional: bool = False,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    base_offset: int = 0,
) -> bytearray:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=transactional,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=1 << 20,
    )
    for i in range(n):
        builder.append(
            i,
            timestamp=1_700_000_000_000 + 7 * i,
            key=b"k%d" % i,
            value=b"value " * 20 * i,
            headers=[],
        )
    buf = builder.build()
    # kafka-python falls back to no compression when it does not pay; the values above compress
    assert buf[22] & 0x07 == codec
    struct.pack_into(">q", buf, 0, base_offset)
    return buf


def test_header_struct_is_61_bytes_in_kafka_order() -> None:
    assert HEADER.size == HEADER_SIZE == 61
    assert LOG_OVERHEAD == 12
    assert BatchHeader._fields[0] == "base_offset"
    assert BatchHeader._fields[-1] == "records_count"


def test_read_header_matches_kafka_python_reader() -> None:
    buf = kp_batch(
        5,
        transactional=True,
        producer_id=4242,
        producer_epoch=3,
        base_sequence=17,
        base_offset=1000,
    )
    h = read_header(buf)
    ref = DefaultRecordBatch(bytes(buf))
    assert h.base_offset == ref.base_offset == 1000
    assert h.size == ref.size_in_bytes == len(buf)
    assert h.batch_length == len(buf) - 12
    assert h.magic == 2
    assert h.crc == ref.crc
    assert h.last_offset_delta == ref.last_offset_delta == 4
    assert h.last_offset == ref.last_offset == 1004
    assert h.next_offset == ref.next_offset == 1005
    assert h.base_timestamp == ref.first_timestamp == 1_700_000_000_000
    assert h.max_timestamp == ref.max_timestamp == 1_700_000_000_028
    assert h.producer_id == ref.producer_id == 4242
    assert h.producer_epoch == ref.producer_epoch == 3
    assert h.base_sequence == ref.base_sequence == 17
    assert h.last_sequence == ref.last_sequence == 21
    assert h.records_count == 5
    assert h.is_transactional and not h.is_control and not h.has_delete_horizon
    assert h.codec is Codec.NONE and h.codec.label == "none"
    assert h.timestamp_type is TimestampType.CREATE_TIME


@pytest.mark.parametrize(
    ("codec_id", "label"), [(0, "none"), (1, "gzip"), (2, "snappy"), (3, "lz4"), (4, "zstd")]
)
def test_codec_bits_and_labels(codec_id: int, label: str) -> None:
    buf = kp_batch(4, codec=codec_id)
    h = validate_batch(buf)
    assert h.codec == codec_id
    assert h.codec.label == label
    assert Codec.from_label(label) == codec_id


def test_read_header_works_on_every_buffer_type_at_an_offset() -> None:
    one = kp_batch(2)
    data = b"\x00" * 5 + bytes(one)
    expected = read_header(one)
    assert read_header(data, 5) == expected
    assert read_header(bytearray(data), 5) == expected
    assert read_header(memoryview(data), 5) == expected
    with mmap.mmap(-1, len(data)) as m:
        m.write(data)
        assert read_header(m, 5) == expected
        assert validate_batch(m, 5) == expected


def test_compute_crc_is_crc32c_from_attributes_to_end() -> None:
    buf = kp_batch(3)
    assert compute_crc(buf, 0, len(buf)) == crc32c(bytes(buf[21:])) == read_header(buf).crc


def test_validate_rejects_crc_mismatch_with_position() -> None:
    buf = bytearray(bytes(kp_batch(2)) * 2)
    size = len(buf) // 2
    buf[size + 70] ^= 0x01  # inside the records
    assert validate_batch(buf, 0).records_count == 2
    with pytest.raises(CorruptRecordError, match="CRC mismatch") as err:
        validate_batch(buf, size)
    assert err.value.position == size


def test_validate_rejects_torn_batch_and_max_size() -> None:
    buf = kp_batch(3)
    with pytest.raises(CorruptRecordError, match="torn") as err:
        validate_batch(buf[:-1])
    assert err.value.position == 0
    with pytest.raises(CorruptRecordError, match="larger than the maximum"):
        validate_batch(buf, max_size=len(buf) - 1)
    assert validate_batch(buf, max_size=len(buf)).size == len(buf)


def test_short_header_and_impossible_length() -> None:
    buf = kp_batch(1)
    with pytest.raises(CorruptRecordError, match="truncated"):
        read_header(buf[:60])
    with pytest.raises(CorruptRecordError, match="truncated"):
        read_header(b"")
    bad = bytearray(buf)
    struct.pack_into(">i", bad, 8, 48)  # one less than a header after the length field
    with pytest.raises(CorruptRecordError, match="impossible batchLength"):
        read_header(bad)


def _v1_message_set() -> bytes:
    # offset i64, size i32, crc u32, magic i8 = 1, attributes i8, timestamp i64, key, value
    body = struct.pack(">bbq", 1, 0, 1234) + struct.pack(">i", -1) + struct.pack(">i", 1) + b"x"
    crc = 0  # irrelevant: the magic is rejected before anything else
    return struct.pack(">qiI", 7, len(body) + 4, crc) + body


@pytest.mark.parametrize("magic", [0, 1])
def test_magic_0_and_1_are_detected_not_misread(magic: int) -> None:
    msg = bytearray(_v1_message_set())
    msg[16] = magic
    with pytest.raises(UnsupportedMagicError, match=f"magic {magic}"):
        read_header(msg)
    with pytest.raises(UnsupportedMagicError):
        validate_batch(msg)
    with pytest.raises(UnsupportedMagicError):
        list(iter_batches(msg))
    with pytest.raises(UnsupportedMagicError):  # even when it is a short tail
        list(iter_batches(msg[:20], allow_torn_tail=True))


def test_unknown_magic_is_corrupt() -> None:
    buf = kp_batch(1)
    buf[16] = 3
    with pytest.raises(CorruptRecordError, match="bad magic 3"):
        read_header(buf)


@pytest.mark.parametrize("codec_id", [5, 6, 7])
def test_unknown_codec_bits(codec_id: int) -> None:
    buf = kp_batch(1)
    buf[22] = (buf[22] & ~0x07) | codec_id
    struct.pack_into(">I", buf, 17, compute_crc(buf, 0, len(buf)))
    h = read_header(buf)
    assert h.codec_id == codec_id
    with pytest.raises(UnsupportedCodecError):
        _ = h.codec
    with pytest.raises(UnsupportedCodecError):
        validate_batch(buf)


def test_count_and_delta_sanity() -> None:
    buf = kp_batch(3)

    def with_fields(count: int, delta: int) -> bytearray:
        b = bytearray(buf)
        struct.pack_into(">i", b, 57, count)
        struct.pack_into(">i", b, 23, delta)
        struct.pack_into(">I", b, 17, compute_crc(b, 0, len(b)))
        return b

    with pytest.raises(CorruptRecordError, match="negative lastOffsetDelta"):
        validate_batch(with_fields(3, -1))
    with pytest.raises(CorruptRecordError, match="does not fit"):
        validate_batch(with_fields(4, 2))
    with pytest.raises(CorruptRecordError, match="does not fit"):
        validate_batch(with_fields(-1, 2))
    # compaction leaves fewer records than offsets: valid on disk, not from a producer
    compacted = with_fields(3, 9)
    assert validate_batch(compacted).last_offset == 9
    with pytest.raises(CorruptRecordError, match="producer batch"):
        validate_batch(compacted, exact_count=True)
    assert validate_batch(buf, exact_count=True).records_count == 3
    with pytest.raises(CorruptRecordError, match="cannot fit"):
        validate_batch(with_fields(1000, 2000))


def test_iter_batches_positions_and_torn_tail() -> None:
    a, b, c = kp_batch(1, base_offset=0), kp_batch(2, base_offset=1), kp_batch(3, base_offset=3)
    log = bytes(a + b + c)
    got = [(pos, h.base_offset, h.last_offset) for pos, h in iter_batches(log)]
    assert got == [(0, 0, 0), (len(a), 1, 2), (len(a) + len(b), 3, 5)]
    # end bounds the walk
    assert [p for p, _ in iter_batches(log, 0, len(a) + len(b))] == [0, len(a)]
    assert [p for p, _ in iter_batches(log, len(a))] == [len(a), len(a) + len(b)]
    for cut in (1, 30, 61, len(c) - 1):
        torn = log[: len(log) - cut]
        with pytest.raises(CorruptRecordError, match="torn") as err:
            list(iter_batches(torn))
        assert err.value.position == len(a) + len(b)
        assert [p for p, _ in iter_batches(torn, allow_torn_tail=True)] == [0, len(a)]


def test_iter_batches_raises_on_zero_fill_even_with_torn_tail_allowed() -> None:
    log = bytes(kp_batch(2)) + b"\x00" * 100
    with pytest.raises(CorruptRecordError) as err:
        list(iter_batches(log, allow_torn_tail=True))
    assert err.value.position == len(log) - 100


def test_stamp_batch_keeps_crc_valid() -> None:
    buf = bytearray(b"\xff" * 3) + kp_batch(4)
    stamp_batch(buf, 3, base_offset=123456789012, partition_leader_epoch=77)
    h = validate_batch(buf, 3)
    assert h.base_offset == 123456789012
    assert h.partition_leader_epoch == 77
    assert h.last_offset == 123456789015
    ref = DefaultRecordBatch(bytes(buf[3:]))
    assert ref.validate_crc() and ref.base_offset == 123456789012 and ref.leader_epoch == 77
    with mmap.mmap(-1, len(buf)) as m:
        m.write(bytes(buf))
        stamp_batch(m, 3, base_offset=5, partition_leader_epoch=1)
        assert validate_batch(m, 3).base_offset == 5


def test_set_log_append_time_rewrites_max_timestamp_and_crc() -> None:
    buf = kp_batch(3)
    before = read_header(buf)
    set_log_append_time(buf, 0, 1_800_000_000_000)
    h = validate_batch(buf)
    assert h.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert h.max_timestamp == 1_800_000_000_000
    assert h.base_timestamp == before.base_timestamp
    assert h.attributes == before.attributes | 0x08
    assert h.crc != before.crc
    ref = DefaultRecordBatch(bytes(buf))
    assert ref.validate_crc()
    assert ref.timestamp_type == 1
    assert [r.timestamp for r in ref] == [1_800_000_000_000] * 3
    with pytest.raises(CorruptRecordError, match="torn"):
        set_log_append_time(buf[:-1], 0, 1)


def test_errors_are_loglake_errors() -> None:
    with pytest.raises(LoglakeError):
        read_header(b"\x00" * 10)
