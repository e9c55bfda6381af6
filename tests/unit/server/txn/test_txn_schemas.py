"""``__transaction_state`` key/value formats: round trips, Kafka's v1 (flexible) value, and
bad bytes raising the project's error."""

from __future__ import annotations

import struct

import pytest

from logstore.errors import CorruptRecordError
from logstore.server.txn.schemas import (
    TxnLogValue,
    TxnState,
    decode_txn_key,
    decode_txn_value,
    encode_txn_key,
    encode_txn_value,
    partition_for,
)


def test_key_bytes_are_kafkas():
    assert encode_txn_key("tx") == b"\x00\x00\x00\x02tx"
    assert decode_txn_key(encode_txn_key("é-id")) == "é-id"


@pytest.mark.parametrize("state", list(TxnState))
def test_value_round_trip(state):
    parts = () if state is TxnState.EMPTY else (("a", (0, 2)), ("b", (1,)))
    v = TxnLogValue(123456789, 7, 60_000, state, parts, 1_700_000_000_123, 1_700_000_000_000)
    assert decode_txn_value(encode_txn_value(v)) == v


def test_empty_is_written_with_null_partitions():
    v = TxnLogValue(5, 0, 1000, TxnState.EMPTY, (), 10, -1)
    raw = encode_txn_value(v)
    # version, pid, epoch, timeout, status, then the partitions array length
    assert struct.unpack_from(">hqhibi", raw, 0) == (0, 5, 0, 1000, 0, -1)


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def test_reads_a_flexible_v1_value_with_tagged_fields():
    raw = bytearray(struct.pack(">hqhib", 1, 42, 3, 30_000, int(TxnState.ONGOING)))
    raw += _uvarint(1 + 1)  # one topic
    raw += _uvarint(len(b"orders") + 1) + b"orders"
    raw += _uvarint(2 + 1) + struct.pack(">ii", 0, 4)
    raw += _uvarint(0)  # topic struct's tagged fields
    raw += struct.pack(">qq", 99, 98)
    # tagged fields: previousProducerId (tag 0) and clientTransactionVersion (tag 2)
    raw += _uvarint(2) + _uvarint(0) + _uvarint(8) + struct.pack(">q", 41)
    raw += _uvarint(2) + _uvarint(2) + struct.pack(">h", 2)
    v = decode_txn_value(bytes(raw))
    assert v == TxnLogValue(42, 3, 30_000, TxnState.ONGOING, (("orders", (0, 4)),), 99, 98)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x00\x05" + b"\x00" * 40,  # unknown version
        struct.pack(">hqhib", 0, 1, 0, 1, 9) + b"\xff\xff\xff\xff" + b"\x00" * 16,  # status 9
        encode_txn_value(TxnLogValue(1, 0, 1, TxnState.ONGOING, (("t", (0,)),), 1, 1))[:-3],
    ],
)
def test_bad_values_raise_corrupt_record(raw):
    with pytest.raises(CorruptRecordError):
        decode_txn_value(raw)


def test_partition_for_matches_kafkas_hash():
    # Java: "hello".hashCode() == 99162322, "polygenelubricants".hashCode() == Integer.MIN_VALUE
    assert partition_for("hello", 50) == 99162322 % 50
    assert partition_for("polygenelubricants", 7) == 0
    assert partition_for("anything", 1) == 0
