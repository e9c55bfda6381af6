"""logstore.protocol.control: transaction markers and KRaft control records."""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka.record.default_records import ControlRecord as KpControlRecord
from kafka.record.default_records import DefaultRecordBatch

from logstore.errors import CorruptRecordError
from logstore.protocol.batch import iter_batches, validate_batch
from logstore.protocol.control import (
    ControlRecord,
    ControlType,
    build_control_batch,
    decode_control_record,
    encode_control_key,
    encode_end_txn_marker_value,
)
from logstore.protocol.records import decode_batch


@pytest.mark.parametrize("kind", [ControlType.ABORT, ControlType.COMMIT])
def test_marker_batch(kind: ControlType) -> None:
    buf = build_control_batch(
        kind,
        producer_id=4000,
        producer_epoch=7,
        coordinator_epoch=3,
        timestamp=123,
        base_offset=50,
    )
    header = validate_batch(buf, exact_count=True)
    assert header.is_control and header.is_transactional
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (4000, 7, -1)
    assert (header.base_offset, header.last_offset, header.max_timestamp) == (50, 50, 123)
    _, records = decode_batch(buf)
    assert decode_control_record(records[0].key, records[0].value) == ControlRecord(0, kind, 3)
    ref = DefaultRecordBatch(bytes(buf))
    assert ref.is_control_batch and ref.validate_crc()
    (marker,) = list(ref)
    assert isinstance(marker, KpControlRecord)
    assert marker.type == int(kind) and marker.version == 0


def test_marker_bytes() -> None:
    assert encode_control_key(ControlType.COMMIT) == b"\x00\x00\x00\x01"
    assert encode_end_txn_marker_value(5) == b"\x00\x00\x00\x00\x00\x05"


def test_decode_errors_and_unknown_types() -> None:
    with pytest.raises(CorruptRecordError):
        decode_control_record(None, None)
    with pytest.raises(CorruptRecordError):
        decode_control_record(b"\x00\x00\x00", None)
    with pytest.raises(CorruptRecordError, match="key version -1"):
        decode_control_record(b"\xff\xff\x00\x00", b"\x00" * 6)
    with pytest.raises(CorruptRecordError, match="marker value"):
        decode_control_record(b"\x00\x00\x00\x00", b"\x00\x00")
    assert decode_control_record(b"\x00\x00\x00\x63", None) == ControlRecord(0, 99)
    newer = decode_control_record(b"\x00\x01\x00\x01", b"\x00\x01\x00\x00\x00\x02extra")
    assert newer == ControlRecord(1, ControlType.COMMIT, 2)
    with pytest.raises(ValueError):
        build_control_batch(ControlType.LEADER_CHANGE, producer_id=1, producer_epoch=0, timestamp=0)


def test_kraft_leader_change_in_a_real_metadata_log(kafka_real: Path) -> None:
    log = (
        kafka_real
        / "cdc-lakehouse-pipeline/kafka-data/__cluster_metadata-0/00000000000000000000.log"
    )
    data = log.read_bytes()
    controls = [(p, h) for p, h in iter_batches(data) if h.is_control]
    assert [(p, h.base_offset) for p, h in controls] == [(0, 0)]
    _, records = decode_batch(data, 0)
    control = decode_control_record(records[0].key, records[0].value)
    assert control.type is ControlType.LEADER_CHANGE
    assert not control.is_transaction_marker
