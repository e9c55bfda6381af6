"""Kafka's record formats for the ``__consumer_offsets`` topic (sans-IO).

Each record's key starts with an int16 *key version* that says what the record is; its value
starts with an int16 *value version*. Strings are int16 length + UTF-8 (nullable: -1), bytes
are int32 length + data, arrays int32 count; value version 4 is "flexible" (compact
lengths as unsigned varint N+1, and a tagged-field section after each struct), as in Kafka's
``OffsetCommitValue.json`` / ``GroupMetadataValue.json``.

- key versions 0 and 1 — offset commit: ``group string, topic string, partition int32``;
  value (:class:`OffsetValue`): v0 ``offset int64, metadata string, commitTimestamp int64``;
  v1 adds ``expireTimestamp int64`` at the end; v2 = v0; v3 ``offset int64, leaderEpoch
  int32, metadata string, commitTimestamp int64``; v4 = v3 flexible. Written: key v1,
  value v3 (v1 when an explicit expire timestamp is given, as Kafka does).
- key version 2 — group metadata: ``group string``; value (:class:`GroupValue`):
  ``protocolType string, generation int32, protocol string?, leader string?,
  currentStateTimestamp int64 (v2+), members [memberId string, groupInstanceId string? (v3+),
  clientId string, clientHost string, rebalanceTimeout int32 (v1+), sessionTimeout int32,
  subscription bytes, assignment bytes]``. Written: v3.
- A null value is a tombstone: the offset (or the whole group) is deleted; compaction keeps
  the tombstone until ``delete.retention.ms`` and then drops the key.

Decoders raise :class:`~logstore.errors.CorruptRecordError` on truncated or unknown data;
they never return partial values.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from logstore.errors import CorruptRecordError

__all__ = [
    "GROUP_METADATA_KEY_VERSION",
    "OFFSET_COMMIT_KEY_VERSION",
    "GroupKey",
    "GroupValue",
    "MemberValue",
    "OffsetKey",
    "OffsetValue",
    "decode_group_value",
    "decode_key",
    "decode_offset_value",
    "encode_group_key",
    "encode_group_value",
    "encode_offset_key",
    "encode_offset_value",
    "java_string_hash",
    "partition_for",
    "subscribed_topics",
]

OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class OffsetKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupKey:
    group: str


@dataclass(frozen=True, slots=True)
class OffsetValue:
    """A committed offset. ``leader_epoch`` -1 = unknown; ``expire_timestamp`` -1 = none."""

    offset: int
    metadata: str
    commit_timestamp: int
    leader_epoch: int = -1
    expire_timestamp: int = -1


@dataclass(frozen=True, slots=True)
class MemberValue:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout: int
    session_timeout: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int
    members: tuple[MemberValue, ...]


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode`` (UTF-16 code units, 32-bit wrap-around), signed."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(group_id: str, num_partitions: int) -> int:
    """The ``__consumer_offsets`` partition of a group: Kafka's ``Utils.abs(hash) % n``."""
    return (java_string_hash(group_id) & 0x7FFFFFFF) % num_partitions


# --- writing ---------------------------------------------------------------------------


class _Writer:
    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = bytearray()

    def i16(self, v: int) -> None:
        self.buf += _I16.pack(v)

    def i32(self, v: int) -> None:
        self.buf += _I32.pack(v)

    def i64(self, v: int) -> None:
        self.buf += _I64.pack(v)

    def string(self, s: str | None) -> None:
        if s is None:
            self.i16(-1)
            return
        data = s.encode()
        if len(data) > 0x7FFF:
            raise ValueError(f"string of {len(data)} bytes exceeds int16 length")
        self.i16(len(data))
        self.buf += data

    def bytes_(self, b: bytes) -> None:
        self.i32(len(b))
        self.buf += b


def encode_offset_key(group: str, topic: str, partition: int) -> bytes:
    w = _Writer()
    w.i16(OFFSET_COMMIT_KEY_VERSION)
    w.string(group)
    w.string(topic)
    w.i32(partition)
    return bytes(w.buf)


def encode_group_key(group: str) -> bytes:
    w = _Writer()
    w.i16(GROUP_METADATA_KEY_VERSION)
    w.string(group)
    return bytes(w.buf)


def encode_offset_value(value: OffsetValue) -> bytes:
    w = _Writer()
    if value.expire_timestamp >= 0:
        w.i16(1)
        w.i64(value.offset)
        w.string(value.metadata)
        w.i64(value.commit_timestamp)
        w.i64(value.expire_timestamp)
    else:
        w.i16(3)
        w.i64(value.offset)
        w.i32(value.leader_epoch)
        w.string(value.metadata)
        w.i64(value.commit_timestamp)
    return bytes(w.buf)


def encode_group_value(value: GroupValue) -> bytes:
    w = _Writer()
    w.i16(3)
    w.string(value.protocol_type)
    w.i32(value.generation)
    w.string(value.protocol)
    w.string(value.leader)
    w.i64(value.current_state_timestamp)
    w.i32(len(value.members))
    for m in value.members:
        w.string(m.member_id)
        w.string(m.group_instance_id)
        w.string(m.client_id)
        w.string(m.client_host)
        w.i32(m.rebalance_timeout)
        w.i32(m.session_timeout)
        w.bytes_(m.subscription)
        w.bytes_(m.assignment)
    return bytes(w.buf)


# --- reading ---------------------------------------------------------------------------


class _Reader:
    """Big-endian reader over one key or value; ``compact`` selects flexible encodings."""

    __slots__ = ("buf", "compact", "pos", "what")

    def __init__(self, buf: bytes | memoryview, what: str) -> None:
        self.buf = memoryview(buf)
        self.pos = 0
        self.compact = False
        self.what = what

    def _take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise CorruptRecordError(
                f"{self.what}: truncated, need {n} bytes at {self.pos}, have "
                f"{len(self.buf) - self.pos}",
                position=self.pos,
            )
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def i16(self) -> int:
        v: int = _I16.unpack(self._take(2))[0]
        return v

    def i32(self) -> int:
        v: int = _I32.unpack(self._take(4))[0]
        return v

    def i64(self) -> int:
        v: int = _I64.unpack(self._take(8))[0]
        return v

    def uvarint(self) -> int:
        result = 0
        shift = 0
        while True:
            b = self._take(1)[0]
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 28:
                raise CorruptRecordError(f"{self.what}: varint too long", position=self.pos)

    def _length(self, *, wide: bool) -> int:
        if self.compact:
            return self.uvarint() - 1
        return self.i32() if wide else self.i16()

    def nullable_string(self) -> str | None:
        n = self._length(wide=False)
        if n < 0:
            return None
        try:
            return bytes(self._take(n)).decode()
        except UnicodeDecodeError as e:
            raise CorruptRecordError(
                f"{self.what}: invalid UTF-8 ({e})", position=self.pos
            ) from None

    def string(self) -> str:
        s = self.nullable_string()
        if s is None:
            raise CorruptRecordError(
                f"{self.what}: null where a string is required", position=self.pos
            )
        return s

    def bytes_(self) -> bytes:
        n = self._length(wide=True)
        if n < 0:
            return b""
        return bytes(self._take(n))

    def array_len(self) -> int:
        n = self._length(wide=True)
        if n < 0:
            raise CorruptRecordError(f"{self.what}: null array", position=self.pos)
        return n

    def tagged_fields(self) -> None:
        if not self.compact:
            return
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self._take(self.uvarint())


def decode_key(key: bytes | memoryview) -> OffsetKey | GroupKey:
    """An ``__consumer_offsets`` key; raises ``CorruptRecordError`` on unknown versions."""
    r = _Reader(key, "__consumer_offsets key")
    version = r.i16()
    if version in (0, 1):
        return OffsetKey(r.string(), r.string(), r.i32())
    if version == 2:
        return GroupKey(r.string())
    raise CorruptRecordError(f"__consumer_offsets key: unknown key version {version}")


def decode_offset_value(value: bytes | memoryview) -> OffsetValue:
    r = _Reader(value, "offset commit value")
    version = r.i16()
    if version in (0, 2):
        offset = r.i64()
        metadata = r.string()
        return OffsetValue(offset, metadata, r.i64())
    if version == 1:
        offset = r.i64()
        metadata = r.string()
        ts = r.i64()
        return OffsetValue(offset, metadata, ts, expire_timestamp=r.i64())
    if version in (3, 4):
        r.compact = version == 4
        offset = r.i64()
        epoch = r.i32()
        metadata = r.string()
        ts = r.i64()
        r.tagged_fields()
        return OffsetValue(offset, metadata, ts, leader_epoch=epoch)
    raise CorruptRecordError(f"offset commit value: unknown version {version}")


def decode_group_value(value: bytes | memoryview) -> GroupValue:
    r = _Reader(value, "group metadata value")
    version = r.i16()
    if not 0 <= version <= 4:
        raise CorruptRecordError(f"group metadata value: unknown version {version}")
    r.compact = version >= 4
    protocol_type = r.string()
    generation = r.i32()
    protocol = r.nullable_string()
    leader = r.nullable_string()
    state_ts = r.i64() if version >= 2 else -1
    members = []
    for _ in range(r.array_len()):
        member_id = r.string()
        instance_id = r.nullable_string() if version >= 3 else None
        client_id = r.string()
        client_host = r.string()
        session_timeout = rebalance_timeout = 0
        if version >= 1:
            rebalance_timeout = r.i32()
        session_timeout = r.i32()
        if version == 0:
            rebalance_timeout = session_timeout
        subscription = r.bytes_()
        assignment = r.bytes_()
        r.tagged_fields()
        members.append(
            MemberValue(
                member_id,
                instance_id,
                client_id,
                client_host,
                rebalance_timeout,
                session_timeout,
                subscription,
                assignment,
            )
        )
    r.tagged_fields()
    return GroupValue(protocol_type, generation, protocol, leader, state_ts, tuple(members))


def subscribed_topics(metadata: bytes | memoryview) -> set[str]:
    """The topics of a ``consumer`` protocol member's metadata (Kafka's
    ``ConsumerProtocolSubscription``, any version: ``version int16, topics [string], ...``;
    only the leading fields are read). Raises ``CorruptRecordError`` when unreadable."""
    r = _Reader(metadata, "consumer subscription")
    version = r.i16()
    if version < 0:
        raise CorruptRecordError(f"consumer subscription: bad version {version}")
    return {r.string() for _ in range(r.array_len())}
