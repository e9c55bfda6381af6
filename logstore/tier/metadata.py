"""Kafka's remote log metadata records (KIP-405's topic-based RLMM), bytes in, values out.

The list of live remote segments is kept as Kafka keeps it: records in the internal topic
``__remote_log_metadata``, never inferred from a bucket listing. A record's value is Kafka's
``AbstractApiMessageSerde`` frame::

    frame_version uvarint (1), api_key uvarint, api_version uvarint, message (flexible)

Messages written here (version 0, as Kafka 3.x and 4.x read them):

- ``RemoteLogSegmentMetadataRecord`` (api key 0): remote_log_segment_id {topic_id_partition
  {name compact string, id uuid, partition i32, tags}, id uuid, tags}, start_offset i64,
  end_offset i64, broker_id i32, max_timestamp_ms i64, event_timestamp_ms i64,
  segment_leader_epochs compact array of {leader_epoch i32, offset i64, tags},
  segment_size_in_bytes i32, custom_metadata compact nullable bytes, state i8, tags
  (tag 0: txn_index_empty bool, written when true).
- ``RemoteLogSegmentMetadataUpdateRecord`` (api key 1): remote_log_segment_id, broker_id i32,
  event_timestamp_ms i64, custom_metadata, state i8, tags (v1 tags 0 broker_leader_epoch,
  1 end_offset: read, never needed).

- ``RemotePartitionDeleteMetadataRecord`` (api key 2): topic_id_partition {name compact
  string, id uuid, partition i32, tags}, broker_id i32, event_timestamp_ms i64, state i8
  (Kafka's ``RemotePartitionDeleteState``: 0 DELETE_PARTITION_MARKED, 1 _STARTED,
  2 _FINISHED), tags: written when a topic with remote data is deleted.

States (Kafka's ``RemoteLogSegmentState`` ids): 0 COPY_SEGMENT_STARTED, 1
COPY_SEGMENT_FINISHED, 2 DELETE_SEGMENT_STARTED, 3 DELETE_SEGMENT_FINISHED.
:func:`decode_record` returns segment records and updates only (None for api keys 2 and 3, as
before, so that its callers need not know partition deletes); :func:`decode_metadata` returns
partition deletes too.

The metadata partition of a user partition is Kafka's ``RemoteLogMetadataTopicPartitioner``:
``toPositive(murmur2(int32 BE of Objects.hash(topicId.lsb, topicId.msb, partition))) % n``,
so a loglake broker and a Kafka broker agree on where a partition's records are.

Uuids print as Kafka prints them (``Uuid.toString``: URL-safe base64 of the 16 bytes, no
padding), which is also how the object keys name topics and segments.

Pure functions, no I/O; thread-safe.
"""

from __future__ import annotations

import base64
import struct
import uuid
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Final

from logstore.errors import CorruptRecordError
from logstore.protocol.varint import decode_unsigned_varint
from logstore.protocol.varint import encode_unsigned_varint as _uv

__all__ = [
    "METADATA_TOPIC",
    "PartitionDelete",
    "PartitionDeleteState",
    "RemoteSegment",
    "SegmentState",
    "SegmentUpdate",
    "decode_metadata",
    "decode_record",
    "encode_partition_delete",
    "encode_segment",
    "encode_update",
    "kafka_uuid",
    "metadata_partition",
    "murmur2",
]

METADATA_TOPIC: Final = "__remote_log_metadata"
FRAME_VERSION: Final = 1
SEGMENT_API_KEY: Final = 0
UPDATE_API_KEY: Final = 1
PARTITION_DELETE_API_KEY: Final = 2

_I8 = struct.Struct(">b")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_EPOCH = struct.Struct(">iq")
_SEG_FIXED = struct.Struct(">qqiqq")  # start, end, broker id, max timestamp, event timestamp
_UPD_FIXED = struct.Struct(">iq")  # broker id, event timestamp
_DEL_FIXED = struct.Struct(">iqb")  # broker id, event timestamp, state


class SegmentState(IntEnum):
    """Kafka's ``RemoteLogSegmentState`` ids."""

    COPY_SEGMENT_STARTED = 0
    COPY_SEGMENT_FINISHED = 1
    DELETE_SEGMENT_STARTED = 2
    DELETE_SEGMENT_FINISHED = 3


class PartitionDeleteState(IntEnum):
    """Kafka's ``RemotePartitionDeleteState`` ids."""

    DELETE_PARTITION_MARKED = 0
    DELETE_PARTITION_STARTED = 1
    DELETE_PARTITION_FINISHED = 2


@dataclass(frozen=True, slots=True)
class RemoteSegment:
    """A remote segment's metadata (Kafka's ``RemoteLogSegmentMetadata``); ``state`` is the
    state of the record that carried it (COPY_SEGMENT_STARTED when first written)."""

    topic: str
    topic_id: uuid.UUID
    partition: int
    segment_id: uuid.UUID
    start_offset: int
    end_offset: int  # inclusive: the segment's last offset
    max_timestamp_ms: int
    broker_id: int
    event_timestamp_ms: int
    segment_size: int
    leader_epochs: tuple[tuple[int, int], ...] = ()  # (epoch, start offset)
    state: SegmentState = SegmentState.COPY_SEGMENT_STARTED
    txn_index_empty: bool = True
    custom_metadata: bytes | None = None


@dataclass(frozen=True, slots=True)
class SegmentUpdate:
    """A state change of a remote segment (Kafka's ``RemoteLogSegmentMetadataUpdate``)."""

    topic: str
    topic_id: uuid.UUID
    partition: int
    segment_id: uuid.UUID
    state: SegmentState
    broker_id: int
    event_timestamp_ms: int
    custom_metadata: bytes | None = field(default=None)


@dataclass(frozen=True, slots=True)
class PartitionDelete:
    """A step of deleting a partition's remote data (Kafka's ``RemotePartitionDeleteMetadata``)."""

    topic: str
    topic_id: uuid.UUID
    partition: int
    state: PartitionDeleteState
    broker_id: int
    event_timestamp_ms: int


def kafka_uuid(value: uuid.UUID) -> str:
    """Kafka's ``Uuid.toString()``: URL-safe base64 of the 16 bytes, without padding."""
    return base64.urlsafe_b64encode(value.bytes).rstrip(b"=").decode("ascii")


def _i32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (32-bit, seed 0x9747b28c), as a signed 32-bit int."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(length // 4):
        k = int.from_bytes(data[4 * i : 4 * i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = length & ~3
    rest = length % 4
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return _i32(h)


def _long_hash(v: int) -> int:
    u = v & 0xFFFFFFFFFFFFFFFF
    return _i32(u ^ (u >> 32))


def metadata_partition(topic_id: uuid.UUID, partition: int, num_partitions: int) -> int:
    """The ``__remote_log_metadata`` partition of a user partition (Kafka's partitioner)."""
    msb = int.from_bytes(topic_id.bytes[:8], "big", signed=True)
    lsb = int.from_bytes(topic_id.bytes[8:], "big", signed=True)
    h = 1
    for part in (_long_hash(lsb), _long_hash(msb), partition):
        h = _i32(31 * h + part)
    return (murmur2(_I32.pack(h)) & 0x7FFFFFFF) % num_partitions


def _segment_id(topic: str, topic_id: uuid.UUID, partition: int, segment_id: uuid.UUID) -> bytes:
    name = topic.encode("utf-8")
    return b"".join(
        (
            _uv(len(name) + 1),
            name,
            topic_id.bytes,
            _I32.pack(partition),
            b"\x00",
            segment_id.bytes,
            b"\x00",
        )
    )


def _nullable_bytes(value: bytes | None) -> bytes:
    return b"\x00" if value is None else _uv(len(value) + 1) + value


def encode_segment(seg: RemoteSegment) -> bytes:
    """The record value of ``seg`` (api key 0, version 0)."""
    out = bytearray()
    out += _uv(FRAME_VERSION) + _uv(SEGMENT_API_KEY) + _uv(0)
    out += _segment_id(seg.topic, seg.topic_id, seg.partition, seg.segment_id)
    out += _SEG_FIXED.pack(
        seg.start_offset,
        seg.end_offset,
        seg.broker_id,
        seg.max_timestamp_ms,
        seg.event_timestamp_ms,
    )
    out += _uv(len(seg.leader_epochs) + 1)
    for epoch, offset in seg.leader_epochs:
        out += _EPOCH.pack(epoch, offset) + b"\x00"
    out += _I32.pack(seg.segment_size)
    out += _nullable_bytes(seg.custom_metadata)
    out += _I8.pack(int(seg.state))
    # tagged fields: TxnIndexEmpty (tag 0) only when it differs from its default (false)
    out += b"\x01\x00\x01\x01" if seg.txn_index_empty else b"\x00"
    return bytes(out)


def encode_update(upd: SegmentUpdate) -> bytes:
    """The record value of ``upd`` (api key 1, version 0)."""
    out = bytearray()
    out += _uv(FRAME_VERSION) + _uv(UPDATE_API_KEY) + _uv(0)
    out += _segment_id(upd.topic, upd.topic_id, upd.partition, upd.segment_id)
    out += _UPD_FIXED.pack(upd.broker_id, upd.event_timestamp_ms)
    out += _nullable_bytes(upd.custom_metadata)
    out += _I8.pack(int(upd.state))
    out += b"\x00"
    return bytes(out)


def encode_partition_delete(rec: PartitionDelete) -> bytes:
    """The record value of ``rec`` (api key 2, version 0)."""
    name = rec.topic.encode("utf-8")
    return b"".join(
        (
            _uv(FRAME_VERSION) + _uv(PARTITION_DELETE_API_KEY) + _uv(0),
            _uv(len(name) + 1),
            name,
            rec.topic_id.bytes,
            _I32.pack(rec.partition),
            b"\x00",
            _DEL_FIXED.pack(rec.broker_id, rec.event_timestamp_ms, int(rec.state)),
            b"\x00",
        )
    )


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise CorruptRecordError(
                f"remote log metadata record ends early: {n} bytes wanted at {self.pos}",
                position=self.pos,
            )
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def uvarint(self) -> int:
        value, self.pos = decode_unsigned_varint(self.buf, self.pos)
        return value

    def unpack(self, st: struct.Struct) -> tuple[int, ...]:
        return st.unpack(self.take(st.size))

    def tags(self) -> dict[int, bytes]:
        found = {}
        for _ in range(self.uvarint()):
            tag = self.uvarint()
            found[tag] = self.take(self.uvarint())
        return found

    def nullable_bytes(self) -> bytes | None:
        n = self.uvarint()
        return None if n == 0 else self.take(n - 1)

    def segment_id(self) -> tuple[str, uuid.UUID, int, uuid.UUID]:
        n = self.uvarint()
        if n == 0:
            raise CorruptRecordError("remote log metadata record: null topic name")
        topic = self.take(n - 1).decode("utf-8", "replace")
        topic_id = uuid.UUID(bytes=self.take(16))
        (partition,) = self.unpack(_I32)
        self.tags()
        seg_id = uuid.UUID(bytes=self.take(16))
        self.tags()
        return topic, topic_id, partition, seg_id


def _partition_delete(rd: _Reader) -> PartitionDelete:
    n = rd.uvarint()
    if n == 0:
        raise CorruptRecordError("remote partition delete record: null topic name")
    topic = rd.take(n - 1).decode("utf-8", "replace")
    topic_id = uuid.UUID(bytes=rd.take(16))
    (partition,) = rd.unpack(_I32)
    rd.tags()
    broker_id, event_ts, state = rd.unpack(_DEL_FIXED)
    rd.tags()
    try:
        st = PartitionDeleteState(state)
    except ValueError:
        raise CorruptRecordError(f"remote partition delete state {state} is not 0-2") from None
    return PartitionDelete(topic, topic_id, partition, st, broker_id, event_ts)


def _state(value: int) -> SegmentState:
    try:
        return SegmentState(value)
    except ValueError:
        raise CorruptRecordError(f"remote log segment state {value} is not 0-3") from None


def decode_record(value: bytes) -> RemoteSegment | SegmentUpdate | None:
    """A ``__remote_log_metadata`` segment record or update; None for the other api keys
    (2 partition delete, 3 snapshot). :class:`CorruptRecordError` for a value that does not
    parse."""
    rd = _Reader(bytes(value))
    rd.uvarint()
    if rd.uvarint() not in (SEGMENT_API_KEY, UPDATE_API_KEY):
        return None  # not parsed further: these callers skip them whatever they hold
    found = decode_metadata(value)
    return None if isinstance(found, PartitionDelete) else found


def decode_metadata(value: bytes) -> RemoteSegment | SegmentUpdate | PartitionDelete | None:
    """A ``__remote_log_metadata`` record value; None for api key 3 (snapshots, never in the
    topic). :class:`CorruptRecordError` for a value that does not parse."""
    rd = _Reader(bytes(value))
    frame = rd.uvarint()
    if frame != FRAME_VERSION:
        raise CorruptRecordError(f"remote log metadata frame version {frame}, expected 1")
    api_key = rd.uvarint()
    version = rd.uvarint()
    if api_key == PARTITION_DELETE_API_KEY:
        return _partition_delete(rd)
    if api_key not in (SEGMENT_API_KEY, UPDATE_API_KEY):
        return None
    if version > 1:
        raise CorruptRecordError(f"remote log metadata api key {api_key} version {version} > 1")
    topic, topic_id, partition, seg_id = rd.segment_id()
    if api_key == UPDATE_API_KEY:
        broker_id, event_ts = rd.unpack(_UPD_FIXED)
        custom = rd.nullable_bytes()
        (state,) = rd.unpack(_I8)
        rd.tags()
        return SegmentUpdate(
            topic, topic_id, partition, seg_id, _state(state), broker_id, event_ts, custom
        )
    start, end, broker_id, max_ts, event_ts = rd.unpack(_SEG_FIXED)
    epochs = []
    for _ in range(rd.uvarint() - 1):
        epoch, offset = rd.unpack(_EPOCH)
        rd.tags()
        epochs.append((epoch, offset))
    (size,) = rd.unpack(_I32)
    custom = rd.nullable_bytes()
    (state,) = rd.unpack(_I8)
    tags = rd.tags()
    txn_empty = tags.get(0, b"\x00") != b"\x00"
    return RemoteSegment(
        topic=topic,
        topic_id=topic_id,
        partition=partition,
        segment_id=seg_id,
        start_offset=start,
        end_offset=end,
        max_timestamp_ms=max_ts,
        broker_id=broker_id,
        event_timestamp_ms=event_ts,
        segment_size=size,
        leader_epochs=tuple(epochs),
        state=_state(state),
        txn_index_empty=txn_empty,
        custom_metadata=custom,
    )
