"""logstore.protocol.varint: zigzag varints against known bytes and kafka-python."""

from __future__ import annotations

import pytest
from kafka.record.util import decode_varint as kp_decode
from kafka.record.util import encode_varint as kp_encode

from logstore.errors import CorruptRecordError
from logstore.protocol.varint import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    decode_unsigned_varint,
    decode_varint,
    decode_varlong,
    encode_unsigned_varint,
    encode_varint,
    encode_varlong,
    size_of_varint,
    size_of_varlong,
    zigzag_decode,
    zigzag_encode,
)

# (value, bytes) from the protobuf/Kafka specification of zigzag varints
KNOWN = [
    (0, b"\x00"),
    (-1, b"\x01"),
    (1, b"\x02"),
    (-2, b"\x03"),
    (63, b"\x7e"),
    (-64, b"\x7f"),
    (64, b"\x80\x01"),
    (-65, b"\x81\x01"),
    (150, b"\xac\x02"),
    (INT32_MAX, b"\xfe\xff\xff\xff\x0f"),
    (INT32_MIN, b"\xff\xff\xff\xff\x0f"),
]


@pytest.mark.parametrize(("value", "encoded"), KNOWN)
def test_known_encodings(value: int, encoded: bytes) -> None:
    assert encode_varint(value) == encoded
    assert encode_varlong(value) == encoded
    assert decode_varint(encoded) == (value, len(encoded))
    assert decode_varlong(b"\xaa" + encoded, 1) == (value, len(encoded) + 1)
    assert size_of_varint(value) == len(encoded)


@pytest.mark.parametrize(
    "value", [0, 1, -1, 300, -300, INT32_MAX, INT32_MIN, 2**40, INT64_MAX, INT64_MIN]
)
def test_varlong_matches_kafka_python(value: int) -> None:
    out = bytearray()
    kp_encode(value, out.append)
    assert encode_varlong(value) == bytes(out)
    assert decode_varlong(bytes(out)) == kp_decode(out, 0)
    assert size_of_varlong(value) == len(out)


def test_int64_extremes_are_ten_bytes() -> None:
    assert len(encode_varlong(INT64_MIN)) == 10
    assert decode_varlong(encode_varlong(INT64_MIN))[0] == INT64_MIN
    assert decode_varlong(encode_varlong(INT64_MAX))[0] == INT64_MAX


def test_zigzag_is_a_bijection_on_small_values() -> None:
    assert [zigzag_encode(v) for v in (0, -1, 1, -2, 2)] == [0, 1, 2, 3, 4]
    assert all(zigzag_decode(zigzag_encode(v)) == v for v in range(-1000, 1000))


def test_encoders_reject_out_of_range_values() -> None:
    with pytest.raises(ValueError):
        encode_varint(INT32_MAX + 1)
    with pytest.raises(ValueError):
        encode_varlong(INT64_MIN - 1)
    with pytest.raises(ValueError):
        encode_unsigned_varint(-1)


def test_too_long_varint_is_corrupt() -> None:
    with pytest.raises(CorruptRecordError, match="longer than 5 bytes") as err:
        decode_varint(b"\x00\x80\x80\x80\x80\x80\x01", 1)
    assert err.value.position == 1
    with pytest.raises(CorruptRecordError, match="longer than 10 bytes"):
        decode_varlong(b"\x80" * 10 + b"\x01")


def test_overflowing_varint_is_corrupt() -> None:
    # five bytes, but the fifth carries bits above 2**32
    with pytest.raises(CorruptRecordError, match="overflows 32 bits"):
        decode_varint(b"\xff\xff\xff\xff\x1f")
    with pytest.raises(CorruptRecordError, match="overflows 64 bits"):
        decode_varlong(b"\xff" * 9 + b"\x7f")


@pytest.mark.parametrize("data", [b"", b"\x80", b"\xff\xff", b"\x80\x80\x80\x80"])
def test_varint_running_past_the_buffer_is_corrupt(data: bytes) -> None:
    with pytest.raises(CorruptRecordError, match="past the end"):
        decode_varint(data)
    with pytest.raises(CorruptRecordError, match="past the end"):
        decode_varlong(data)


def test_unsigned_varint_round_trip() -> None:
    for value in (0, 1, 127, 128, 16383, 16384, 2**32 - 1):
        assert decode_unsigned_varint(encode_unsigned_varint(value)) == (
            value,
            len(encode_unsigned_varint(value)),
        )
