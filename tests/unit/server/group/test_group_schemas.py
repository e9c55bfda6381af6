"""The __consumer_offsets key/value formats against bytes laid out by hand from Kafka's
message definitions (OffsetCommitKey/Value, GroupMetadataKey/Value)."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore.errors import CorruptRecordError
from logstore.server.group.schemas import (
    GroupKey,
    GroupValue,
    MemberValue,
    OffsetKey,
    OffsetValue,
    decode_group_value,
    decode_key,
    decode_offset_value,
    encode_group_key,
    encode_group_value,
    encode_offset_key,
    encode_offset_value,
    java_string_hash,
    partition_for,
)


def _s(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def test_offset_key_bytes() -> None:
    assert encode_offset_key("g1", "t", 3) == (
        b"\x00\x01" + _s("g1") + _s("t") + b"\x00\x00\x00\x03"
    )
    assert decode_key(encode_offset_key("g1", "t", 3)) == OffsetKey("g1", "t", 3)
    # key version 0 is the same layout
    assert decode_key(b"\x00\x00" + _s("g") + _s("x") + b"\x00\x00\x00\x07") == OffsetKey(
        "g", "x", 7
    )


def test_group_key_bytes() -> None:
    assert encode_group_key("grp") == b"\x00\x02" + _s("grp")
    assert decode_key(b"\x00\x02" + _s("grp")) == GroupKey("grp")


def test_offset_value_v3_bytes() -> None:
    v = OffsetValue(offset=42, metadata="m", commit_timestamp=1_700_000_000_000, leader_epoch=5)
    expected = (
        b"\x00\x03"
        + struct.pack(">q", 42)
        + struct.pack(">i", 5)
        + _s("m")
        + struct.pack(">q", 1_700_000_000_000)
    )
    assert encode_offset_value(v) == expected
    assert decode_offset_value(expected) == v


def test_offset_value_v1_with_expire_timestamp() -> None:
    v = OffsetValue(offset=7, metadata="", commit_timestamp=10, expire_timestamp=99)
    data = encode_offset_value(v)
    assert data == b"\x00\x01" + struct.pack(">q", 7) + _s("") + struct.pack(">qq", 10, 99)
    assert decode_offset_value(data) == v


def test_offset_value_v0_and_v4_flexible() -> None:
    v0 = b"\x00\x00" + struct.pack(">q", 11) + _s("meta") + struct.pack(">q", 12)
    assert decode_offset_value(v0) == OffsetValue(11, "meta", 12)
    # v4: compact string (length + 1 as uvarint) and an empty tagged-field section
    v4 = (
        b"\x00\x04"
        + struct.pack(">q", 13)
        + struct.pack(">i", 2)
        + b"\x03ab"
        + struct.pack(">q", 14)
        + b"\x00"
    )
    assert decode_offset_value(v4) == OffsetValue(13, "ab", 14, leader_epoch=2)


def test_group_value_v3_bytes_and_older_versions() -> None:
    member = MemberValue("m-1", "inst", "client", "/127.0.0.1", 30_000, 10_000, b"sub", b"asg")
    value = GroupValue("consumer", 4, "range", "m-1", 1234, (member,))
    data = encode_group_value(value)
    expected = (
        b"\x00\x03"
        + _s("consumer")
        + struct.pack(">i", 4)
        + _s("range")
        + _s("m-1")
        + struct.pack(">q", 1234)
        + struct.pack(">i", 1)
        + _s("m-1")
        + _s("inst")
        + _s("client")
        + _s("/127.0.0.1")
        + struct.pack(">ii", 30_000, 10_000)
        + struct.pack(">i", 3)
        + b"sub"
        + struct.pack(">i", 3)
        + b"asg"
    )
    assert data == expected
    assert decode_group_value(data) == value
    # v0: no currentStateTimestamp, no rebalanceTimeout, no groupInstanceId
    v0 = (
        b"\x00\x00"
        + _s("consumer")
        + struct.pack(">i", 1)
        + b"\xff\xff"
        + b"\xff\xff"
        + struct.pack(">i", 1)
        + _s("m")
        + _s("c")
        + _s("h")
        + struct.pack(">i", 6000)
        + struct.pack(">i", 0)
        + struct.pack(">i", 0)
    )
    decoded = decode_group_value(v0)
    assert decoded.protocol is None and decoded.leader is None
    assert decoded.current_state_timestamp == -1
    assert decoded.members == (MemberValue("m", None, "c", "h", 6000, 6000, b"", b""),)


@pytest.mark.parametrize(
    "data",
    [b"", b"\x00", b"\x00\x09" + _s("g"), b"\x00\x01" + _s("g") + _s("t"), b"\x00\x01\x00\x05ab"],
)
def test_bad_keys_raise_corrupt_record(data: bytes) -> None:
    with pytest.raises(CorruptRecordError):
        decode_key(data)


def test_bad_values_raise_corrupt_record() -> None:
    good = encode_offset_value(OffsetValue(1, "x", 2))
    for cut in range(len(good)):
        with pytest.raises(CorruptRecordError):
            decode_offset_value(good[:cut])
    with pytest.raises(CorruptRecordError):
        decode_offset_value(b"\x00\x07" + good[2:])
    with pytest.raises(CorruptRecordError):
        decode_group_value(b"\x00\x05")


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_only_raise_project_errors(data: bytes) -> None:
    for fn in (decode_key, decode_offset_value, decode_group_value):
        with contextlib.suppress(CorruptRecordError):
            fn(data)


@settings(max_examples=60, deadline=None)
@given(
    st.text(max_size=20),
    st.text(max_size=20),
    st.integers(0, 2**31 - 1),
    st.integers(-1, 2**62),
    st.text(max_size=30),
)
def test_offset_round_trip(group: str, topic: str, partition: int, offset: int, meta: str) -> None:
    assert decode_key(encode_offset_key(group, topic, partition)) == OffsetKey(
        group, topic, partition
    )
    v = OffsetValue(offset, meta, 5, leader_epoch=3)
    assert decode_offset_value(encode_offset_value(v)) == v


def test_java_string_hash_and_partitioning() -> None:
    # Values of java.lang.String#hashCode
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -(2**31)  # Integer.MIN_VALUE
    # Utils.abs(MIN_VALUE) is 0 in Kafka (x & 0x7fffffff)
    assert partition_for("polygenelubricants", 50) == 0
    assert partition_for("hello", 50) == 99162322 % 50
    assert all(0 <= partition_for(f"g{i}", 7) < 7 for i in range(100))
