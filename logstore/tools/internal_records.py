"""Kafka's internal records as ``kafka-dump-log.sh`` prints them, and the consumer protocol.

``__consumer_offsets`` (``--offsets-decoder``) and ``__transaction_state``
(``--transaction-log-decoder``) records are decoded with the broker's own codecs
(:mod:`logstore.server.group.schemas`, :mod:`logstore.server.txn.schemas`) and printed in
the shape of Kafka's ``DumpLogSegments`` (3.x/4.x): the key as
``{"type":"<key version>","data":{...}}``, the payload as ``{"version":"<value version>",
"data":{...}}`` with the fields of Kafka's message JSON (``OffsetCommitKey/Value``,
``GroupMetadataKey/Value``, ``TransactionLogKey/Value``) in camelCase, ``<DELETE>`` for a
tombstone. Bytes are base64 as Jackson writes them, except that a ``consumer`` group's
member ``subscription`` and ``assignment`` are decoded (``ConsumerProtocolSubscription`` /
``ConsumerProtocolAssignment``), as Kafka does. A key of an unknown type prints
``Unknown record type N at offset O, skipping.``; bytes that do not decode print
``Error at offset O, skipping. <reason>`` (Kafka's wording; not an error of the file).

The consumer protocol (``version int16`` then, non-flexible: subscription ``topics [string],
userData bytes?, ownedPartitions [topic string, partitions [int32]] (v1+), generationId
int32 (v2+), rackId string? (v3+)``; assignment ``assignedPartitions [topic, partitions],
userData bytes?``) is also what ``loglake groups --describe`` reads from DescribeGroups.
"""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

from logstore.errors import CorruptRecordError
from logstore.server.group.schemas import (
    GroupKey,
    decode_group_value,
    decode_key,
    decode_offset_value,
)
from logstore.server.txn.schemas import decode_txn_key, decode_txn_value

__all__ = [
    "decode_assignment",
    "decode_subscription",
    "format_offsets_record",
    "format_txn_record",
]

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class _Reader:
    """Non-flexible big-endian reader of the consumer protocol's embedded bytes."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def _fixed(self, s: struct.Struct) -> int:
        if self.pos + s.size > len(self.buf):
            raise CorruptRecordError(f"consumer protocol: truncated at byte {self.pos}")
        (v,) = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return int(v)

    def i16(self) -> int:
        return self._fixed(_I16)

    def i32(self) -> int:
        return self._fixed(_I32)

    def _take(self, n: int) -> bytes:
        if n > len(self.buf) - self.pos:
            raise CorruptRecordError(f"consumer protocol: {n} bytes past the end at {self.pos}")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def string(self) -> str | None:
        n = self.i16()
        return None if n < 0 else self._take(n).decode("utf-8", "replace")

    def bytes_(self) -> bytes | None:
        n = self.i32()
        return None if n < 0 else self._take(n)

    def count(self) -> int:
        n = self.i32()
        if n > len(self.buf):
            raise CorruptRecordError(f"consumer protocol: array of {n} in {len(self.buf)} bytes")
        return max(n, 0)

    def topic_partitions(self) -> list[dict[str, Any]]:
        out = []
        for _ in range(self.count()):
            topic = self.string()
            out.append({"topic": topic, "partitions": [self.i32() for _ in range(self.count())]})
        return out


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def decode_subscription(data: bytes) -> dict[str, Any]:
    """A ``ConsumerProtocolSubscription`` as Kafka's JSON converter writes it."""
    r = _Reader(data)
    version = r.i16()
    out: dict[str, Any] = {"topics": [r.string() for _ in range(r.count())]}
    out["userData"] = _b64(r.bytes_())
    if version >= 1:
        out["ownedPartitions"] = r.topic_partitions()
    if version >= 2:
        out["generationId"] = r.i32()
    if version >= 3:
        out["rackId"] = r.string()
    return out


def decode_assignment(data: bytes) -> dict[str, Any]:
    """A ``ConsumerProtocolAssignment`` (``assignedPartitions``, ``userData``)."""
    r = _Reader(data)
    r.i16()
    partitions = r.topic_partitions()
    return {"assignedPartitions": partitions, "userData": _b64(r.bytes_())}


def _json(version: int, data: dict[str, Any], *, tag: str) -> str:
    return json.dumps({tag: str(version), "data": data}, separators=(",", ":"))


def _group_value_json(value: bytes) -> dict[str, Any]:
    version = _I16.unpack_from(value, 0)[0]
    g = decode_group_value(value)
    members = []
    for m in g.members:
        member: dict[str, Any] = {"memberId": m.member_id}
        if version >= 3:
            member["groupInstanceId"] = m.group_instance_id
        member |= {"clientId": m.client_id, "clientHost": m.client_host}
        if version >= 1:
            member["rebalanceTimeout"] = m.rebalance_timeout
        member["sessionTimeout"] = m.session_timeout
        subscription: Any = _b64(m.subscription)
        assignment: Any = _b64(m.assignment)
        if g.protocol_type == "consumer":  # as Kafka: decoded, raw bytes if they do not decode
            try:
                subscription = decode_subscription(m.subscription)
                assignment = decode_assignment(m.assignment)
            except (CorruptRecordError, UnicodeDecodeError):
                pass
        member |= {"subscription": subscription, "assignment": assignment}
        members.append(member)
    data: dict[str, Any] = {
        "protocolType": g.protocol_type,
        "generation": g.generation,
        "protocol": g.protocol,
        "leader": g.leader,
    }
    if version >= 2:
        data["currentStateTimestamp"] = g.current_state_timestamp
    data["members"] = members
    return data


def _offset_value_json(value: bytes) -> dict[str, Any]:
    version = _I16.unpack_from(value, 0)[0]
    v = decode_offset_value(value)
    data: dict[str, Any] = {"offset": v.offset}
    if version >= 3:
        data["leaderEpoch"] = v.leader_epoch
    data |= {"metadata": v.metadata, "commitTimestamp": v.commit_timestamp}
    if version == 1:
        data["expireTimestamp"] = v.expire_timestamp
    return data


def format_offsets_record(
    key: bytes | None, value: bytes | None, offset: int
) -> tuple[str, str | None]:
    """(key, payload) of one ``__consumer_offsets`` record, as the module docstring says."""
    if key is None:
        # Kafka's tool throws here; a line that says so keeps the rest of the dump
        return f"Error at offset {offset}, skipping. The record has no key.", None
    try:
        key_version = _I16.unpack_from(key, 0)[0] if len(key) >= 2 else -1
        if key_version not in (0, 1, 2):
            return f"Unknown record type {key_version} at offset {offset}, skipping.", None
        decoded = decode_key(key)
        if isinstance(decoded, GroupKey):
            key_json = _json(key_version, {"group": decoded.group}, tag="type")
        else:
            key_json = _json(
                key_version,
                {"group": decoded.group, "topic": decoded.topic, "partition": decoded.partition},
                tag="type",
            )
        if value is None:
            return key_json, "<DELETE>"
        value_version = _I16.unpack_from(value, 0)[0] if len(value) >= 2 else -1
        data = _group_value_json(value) if key_version == 2 else _offset_value_json(value)
        return key_json, _json(value_version, data, tag="version")
    except CorruptRecordError as exc:
        return f"Error at offset {offset}, skipping. {exc}", None


def format_txn_record(
    key: bytes | None, value: bytes | None, offset: int
) -> tuple[str, str | None]:
    """(key, payload) of one ``__transaction_state`` record, as the module docstring says."""
    if key is None:
        return f"Error at offset {offset}, skipping. The record has no key.", None
    try:
        key_version = _I16.unpack_from(key, 0)[0] if len(key) >= 2 else -1
        if key_version != 0:
            return f"Unknown record type {key_version} at offset {offset}, skipping.", None
        key_json = _json(0, {"transactionalId": decode_txn_key(key)}, tag="type")
        if value is None:
            return key_json, "<DELETE>"
        version = _I16.unpack_from(value, 0)[0] if len(value) >= 2 else -1
        v = decode_txn_value(value)
        data = {
            "producerId": v.producer_id,
            "producerEpoch": v.producer_epoch,
            "transactionTimeoutMs": v.timeout_ms,
            "transactionStatus": int(v.state),
            "transactionPartitions": [
                {"topic": topic, "partitionIds": list(ids)} for topic, ids in v.partitions
            ],
            "transactionLastUpdateTimestampMs": v.last_update_ms,
            "transactionStartTimestampMs": v.start_ms,
        }
        return key_json, _json(version, data, tag="version")
    except CorruptRecordError as exc:
        return f"Error at offset {offset}, skipping. {exc}", None
