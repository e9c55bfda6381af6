"""Control records: transaction markers (KIP-98) and the KRaft control types.

A control batch has attributes bit 5 set (and bit 4 for transaction markers) and holds one
record whose bytes are::

    key    version i16 (0), type i16   (0 ABORT, 1 COMMIT, 2 LEADER_CHANGE, 3 SNAPSHOT_HEADER,
                                        4 SNAPSHOT_FOOTER, 5 KRAFT_VERSION, 6 KRAFT_VOTERS)
    value  for ABORT/COMMIT (EndTransactionMarker): version i16 (0), coordinatorEpoch i32;
           for the KRaft types a versioned message this module does not decode

A newer key/value version is read as far as the fields above reach (Kafka does the same);
a negative version or too few bytes is :class:`CorruptRecordError`. Pure functions.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from logstore.errors import CorruptRecordError
from logstore.protocol.batch import Codec
from logstore.protocol.records import Record, build_batch

__all__ = [
    "ControlRecord",
    "ControlType",
    "build_control_batch",
    "decode_control_record",
    "encode_control_key",
    "encode_end_txn_marker_value",
]

_KEY = struct.Struct(">hh")  # version, type
_END_TXN_VALUE = struct.Struct(">hi")  # version, coordinatorEpoch
CONTROL_KEY_VERSION = 0
END_TXN_MARKER_VERSION = 0


class ControlType(IntEnum):
    """Kafka's ``ControlRecordType`` ids."""

    ABORT = 0
    COMMIT = 1
    LEADER_CHANGE = 2
    SNAPSHOT_HEADER = 3
    SNAPSHOT_FOOTER = 4
    KRAFT_VERSION = 5
    KRAFT_VOTERS = 6


@dataclass(frozen=True, slots=True)
class ControlRecord:
    """A decoded control record. ``type`` stays a plain ``int`` for ids Kafka added later;
    ``coordinator_epoch`` is set for ABORT/COMMIT only."""

    version: int
    type: ControlType | int
    coordinator_epoch: int | None = None

    @property
    def is_transaction_marker(self) -> bool:
        return self.type in (ControlType.ABORT, ControlType.COMMIT)


def encode_control_key(
    control_type: ControlType | int, *, version: int = CONTROL_KEY_VERSION
) -> bytes:
    return _KEY.pack(version, int(control_type))


def encode_end_txn_marker_value(
    coordinator_epoch: int, *, version: int = END_TXN_MARKER_VERSION
) -> bytes:
    return _END_TXN_VALUE.pack(version, coordinator_epoch)


def decode_control_record(key: bytes | None, value: bytes | None) -> ControlRecord:
    """Decode the key (and, for ABORT/COMMIT, the value) of a control record."""
    if key is None or len(key) < _KEY.size:
        raise CorruptRecordError(
            f"control record key of {0 if key is None else len(key)} bytes (need {_KEY.size})"
        )
    version, type_id = _KEY.unpack_from(key, 0)
    if version < 0:
        raise CorruptRecordError(f"control record key version {version}")
    control_type: ControlType | int
    try:
        control_type = ControlType(type_id)
    except ValueError:
        control_type = type_id
    if control_type not in (ControlType.ABORT, ControlType.COMMIT):
        return ControlRecord(version, control_type)
    if value is None or len(value) < _END_TXN_VALUE.size:
        raise CorruptRecordError(
            f"transaction marker value of {0 if value is None else len(value)} bytes "
            f"(need {_END_TXN_VALUE.size})"
        )
    value_version, coordinator_epoch = _END_TXN_VALUE.unpack_from(value, 0)
    if value_version < 0:
        raise CorruptRecordError(f"transaction marker value version {value_version}")
    return ControlRecord(version, control_type, coordinator_epoch)


def build_control_batch(
    control_type: ControlType,
    *,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int = 0,
    timestamp: int,
    base_offset: int = 0,
    partition_leader_epoch: int = 0,
) -> bytearray:
    """A transaction marker batch (ABORT or COMMIT), as a transaction coordinator writes it:
    control + transactional bits, the producer's id and epoch, no sequence, one record."""
    if control_type not in (ControlType.ABORT, ControlType.COMMIT):
        raise ValueError(f"only ABORT and COMMIT markers are built, not {control_type!r}")
    record = Record(
        offset=base_offset,
        timestamp=timestamp,
        key=encode_control_key(control_type),
        value=encode_end_txn_marker_value(coordinator_epoch),
    )
    return build_batch(
        [record],
        base_offset=base_offset,
        codec=Codec.NONE,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=-1,
        is_transactional=True,
        is_control=True,
        partition_leader_epoch=partition_leader_epoch,
    )
