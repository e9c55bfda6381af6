"""Kafka's record formats for the ``__transaction_state`` topic (sans-IO).

One record per change of a transactional id's state, keyed by the id; later records win and
a null value (tombstone) removes the id (``transactional.id.expiration.ms``). As Kafka's
``TransactionLogKey.json`` / ``TransactionLogValue.json``:

- key, version 0: ``version int16 (0), transactionalId string`` (int16 length + UTF-8);
- value, version 0: ``version int16 (0), producerId int64, producerEpoch int16,
  transactionTimeoutMs int32, transactionStatus int8, transactionPartitions
  [topic string, partitionIds [int32]] (nullable: -1 count), lastUpdateTimestampMs int64,
  startTimestampMs int64``. Version 1 has the same fields, flexible (compact lengths as
  unsigned varint N+1, tagged fields after each struct: previousProducerId tag 0,
  nextProducerId tag 1, clientTransactionVersion tag 2). Written: v0 (what Kafka 2.x-3.x
  wrote); read: v0 and v1, tagged fields skipped.

``transactionStatus`` is Kafka's ``TransactionState`` id (:class:`TxnState`). A transaction in
Empty is written with null partitions, as Kafka does.

Decoders raise :class:`~logstore.errors.CorruptRecordError` on truncated or unknown data; they
never return partial values.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from logstore.errors import CorruptRecordError
from logstore.server.group.schemas import java_string_hash

__all__ = [
    "TxnLogValue",
    "TxnState",
    "decode_txn_key",
    "decode_txn_value",
    "encode_txn_key",
    "encode_txn_value",
    "partition_for",
]

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_VALUE_V0_HEAD = struct.Struct(">hqhib")  # version, producerId, epoch, timeout, status


class TxnState(IntEnum):
    """Kafka's ``TransactionState`` ids, as stored in ``transactionStatus``."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        """Kafka's name of the state (``TransactionState.name``): what DescribeTransactions
        and ListTransactions (KIP-664) answer and ListTransactions' state filters name."""
        return _KAFKA_NAMES[self]

    @classmethod
    def from_kafka_name(cls, name: str) -> TxnState | None:
        """The state Kafka calls ``name`` (case-sensitive, as Kafka's ``fromName``), or None."""
        return _BY_KAFKA_NAME.get(name)


_KAFKA_NAMES: dict[TxnState, str] = {
    TxnState.EMPTY: "Empty",
    TxnState.ONGOING: "Ongoing",
    TxnState.PREPARE_COMMIT: "PrepareCommit",
    TxnState.PREPARE_ABORT: "PrepareAbort",
    TxnState.COMPLETE_COMMIT: "CompleteCommit",
    TxnState.COMPLETE_ABORT: "CompleteAbort",
    TxnState.DEAD: "Dead",
    TxnState.PREPARE_EPOCH_FENCE: "PrepareEpochFence",
}
_BY_KAFKA_NAME: dict[str, TxnState] = {name: state for state, name in _KAFKA_NAMES.items()}


@dataclass(frozen=True, slots=True)
class TxnLogValue:
    """One transactional id's state as one ``__transaction_state`` record holds it.

    ``partitions`` maps topic -> sorted partition ids; empty for Empty / Complete*.
    """

    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: tuple[tuple[str, tuple[int, ...]], ...]
    last_update_ms: int
    start_ms: int


def partition_for(transactional_id: str, num_partitions: int) -> int:
    """The ``__transaction_state`` partition of an id: Kafka's ``Utils.abs(hash) % n``."""
    return (java_string_hash(transactional_id) & 0x7FFFFFFF) % num_partitions


def _string(s: str) -> bytes:
    data = s.encode()
    if len(data) > 0x7FFF:
        raise ValueError(f"string of {len(data)} bytes exceeds int16 length")
    return _I16.pack(len(data)) + data


def encode_txn_key(transactional_id: str) -> bytes:
    return _I16.pack(0) + _string(transactional_id)


def encode_txn_value(v: TxnLogValue) -> bytes:
    out = bytearray(
        _VALUE_V0_HEAD.pack(0, v.producer_id, v.producer_epoch, v.timeout_ms, int(v.state))
    )
    if v.state is TxnState.EMPTY:
        out += _I32.pack(-1)
    else:
        out += _I32.pack(len(v.partitions))
        for topic, ids in v.partitions:
            out += _string(topic)
            out += _I32.pack(len(ids))
            for p in ids:
                out += _I32.pack(p)
    out += _I64.pack(v.last_update_ms)
    out += _I64.pack(v.start_ms)
    return bytes(out)


class _Reader:
    __slots__ = ("buf", "flexible", "pos", "what")

    def __init__(self, buf: bytes, what: str) -> None:
        self.buf = buf
        self.pos = 0
        self.what = what
        self.flexible = False

    def _take(self, s: struct.Struct) -> int:
        if self.pos + s.size > len(self.buf):
            raise CorruptRecordError(f"{self.what}: truncated at byte {self.pos}")
        (v,) = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return int(v)

    def i8(self) -> int:
        return self._take(_I8)

    def i16(self) -> int:
        return self._take(_I16)

    def i32(self) -> int:
        return self._take(_I32)

    def i64(self) -> int:
        return self._take(_I64)

    def uvarint(self) -> int:
        result = shift = 0
        while True:
            if self.pos >= len(self.buf):
                raise CorruptRecordError(f"{self.what}: truncated varint at byte {self.pos}")
            b = self.buf[self.pos]
            self.pos += 1
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 28:
                raise CorruptRecordError(f"{self.what}: varint too long at byte {self.pos}")

    def string(self) -> str:
        n = self.uvarint() - 1 if self.flexible else self.i16()
        if n < 0 or self.pos + n > len(self.buf):
            raise CorruptRecordError(f"{self.what}: bad string length {n} at byte {self.pos}")
        try:
            s = self.buf[self.pos : self.pos + n].decode()
        except UnicodeDecodeError as exc:
            raise CorruptRecordError(f"{self.what}: string is not UTF-8") from exc
        self.pos += n
        return s

    def array_len(self) -> int:
        n = self.uvarint() - 1 if self.flexible else self.i32()
        if n < -1 or n > len(self.buf):
            raise CorruptRecordError(f"{self.what}: bad array length {n}")
        return n

    def skip_tags(self) -> None:
        if not self.flexible:
            return
        for _ in range(self.uvarint()):
            self.uvarint()
            size = self.uvarint()
            self.pos += size
            if self.pos > len(self.buf):
                raise CorruptRecordError(f"{self.what}: tagged field runs past the end")


def decode_txn_key(key: bytes) -> str:
    """The transactional id of a ``__transaction_state`` key (version 0)."""
    r = _Reader(key, "__transaction_state key")
    version = r.i16()
    if version != 0:
        raise CorruptRecordError(f"__transaction_state key version {version} (expected 0)")
    return r.string()


def decode_txn_value(value: bytes) -> TxnLogValue:
    """A ``__transaction_state`` value of version 0 or 1."""
    r = _Reader(value, "__transaction_state value")
    version = r.i16()
    if version not in (0, 1):
        raise CorruptRecordError(f"__transaction_state value version {version} (expected 0-1)")
    r.flexible = version >= 1
    producer_id = r.i64()
    epoch = r.i16()
    timeout = r.i32()
    status = r.i8()
    try:
        state = TxnState(status)
    except ValueError:
        raise CorruptRecordError(f"__transaction_state: unknown status {status}") from None
    partitions: list[tuple[str, tuple[int, ...]]] = []
    n = r.array_len()
    for _ in range(max(n, 0)):
        topic = r.string()
        count = r.array_len()
        ids = tuple(r.i32() for _ in range(max(count, 0)))
        r.skip_tags()
        partitions.append((topic, ids))
    last_update = r.i64()
    start = r.i64()
    r.skip_tags()
    return TxnLogValue(producer_id, epoch, timeout, state, tuple(partitions), last_update, start)
