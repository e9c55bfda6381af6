"""Idempotent producer state: duplicates, sequence order, epochs, rebuild from batches."""

from __future__ import annotations

import pytest

from logstore.protocol.batch import BatchHeader
from logstore.storage.producer_state import (
    BATCHES_RETAINED,
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
    ProducerStateManager,
)


def _append(
    m: ProducerStateManager, pid: int, epoch: int, seq: int, n: int, *, offset: int
) -> None:
    assert m.check(pid, epoch, seq, n - 1) is None
    m.update(
        pid, epoch, seq, n - 1, first_offset=offset, last_offset=offset + n - 1, max_timestamp=0
    )


def test_in_order_batches_and_duplicates():
    m = ProducerStateManager("t", 0)
    _append(m, 7, 0, 0, 10, offset=100)
    _append(m, 7, 0, 10, 5, offset=110)
    dup = m.check(7, 0, 0, 9)
    assert dup is not None and (dup.first_offset, dup.last_offset) == (100, 109)
    dup = m.check(7, 0, 10, 4)
    assert dup is not None and dup.first_offset == 110
    with pytest.raises(OutOfOrderSequenceError):
        m.check(7, 0, 20, 0)  # gap: expected 15
    with pytest.raises(OutOfOrderSequenceError):
        m.check(7, 0, 5, 2)  # overlaps but is not a retained batch


def test_only_last_five_batches_are_retained():
    m = ProducerStateManager("t", 0)
    for i in range(BATCHES_RETAINED + 2):
        _append(m, 1, 0, i, 1, offset=i)
    assert m.check(1, 0, BATCHES_RETAINED + 1, 0) is not None
    with pytest.raises(OutOfOrderSequenceError):
        m.check(1, 0, 0, 0)  # too old to be recognised as a duplicate


def test_epochs():
    m = ProducerStateManager("t", 0)
    _append(m, 1, 3, 0, 2, offset=0)
    with pytest.raises(InvalidProducerEpochError):
        m.check(1, 2, 2, 0)
    with pytest.raises(OutOfOrderSequenceError):
        m.check(1, 4, 5, 0)  # a new epoch starts at 0
    _append(m, 1, 4, 0, 1, offset=2)
    # unknown producers may start anywhere (state may have been truncated away)
    assert m.check(99, 0, 1234, 0) is None


def test_sequence_wraps():
    m = ProducerStateManager("t", 0)
    _append(m, 1, 0, 2**31 - 2, 2, offset=0)  # last sequence 2**31 - 1
    _append(m, 1, 0, 0, 1, offset=2)


def test_non_idempotent_batches_are_ignored():
    m = ProducerStateManager("t", 0)
    assert m.check(-1, -1, -1, 10) is None
    m.update(-1, -1, -1, 10, first_offset=0, last_offset=10, max_timestamp=0)
    assert m.producers == {}


def test_rebuild_matches_live_state():
    live = ProducerStateManager("t", 0)
    batches = []
    offset = 0
    for i in range(12):
        pid, n = (1 + i % 3), 1 + i % 4
        seq = sum(1 + j % 4 for j in range(i) if 1 + j % 3 == pid)
        _append(live, pid, 0, seq, n, offset=offset)
        batches.append(
            BatchHeader(
                base_offset=offset,
                batch_length=0,
                partition_leader_epoch=0,
                magic=2,
                crc=0,
                attributes=0,
                last_offset_delta=n - 1,
                base_timestamp=0,
                max_timestamp=0,
                producer_id=pid,
                producer_epoch=0,
                base_sequence=seq,
                records_count=n,
            )
        )
        offset += n
    rebuilt = ProducerStateManager("t", 0)
    rebuilt.rebuild_from_batches(batches)
    assert {p: list(e.batches) for p, e in rebuilt.producers.items()} == {
        p: list(e.batches) for p, e in live.producers.items()
    }


def test_truncate_below_forgets_old_batches():
    m = ProducerStateManager("t", 0)
    _append(m, 1, 0, 0, 10, offset=0)
    _append(m, 1, 0, 10, 10, offset=10)
    m.truncate_below(15)
    assert [b.first_offset for b in m.producers[1].batches] == [10]


def test_snapshot_entries_round_trip_keeps_the_last_batch_and_open_transactions():
    from logstore.storage.producer_snapshot import decode_snapshot, encode_snapshot

    m = ProducerStateManager("t", 0)
    _append(m, 1, 0, 0, 10, offset=0)
    _append(m, 1, 0, 10, 5, offset=10)  # only this batch survives a snapshot, as in Kafka
    _append(m, 2, 3, 2**31 - 3, 5, offset=20)  # sequence wraps inside the batch
    m.producers[2].current_txn_first_offset = 20
    m.ongoing[2] = 20
    m.complete_txn(3, 1, commit=False, coordinator_epoch=4, offset=30, timestamp=9)
    loaded = ProducerStateManager("t", 0)
    loaded.load_snapshot_entries(decode_snapshot(encode_snapshot(m.snapshot_entries())))
    assert loaded.ongoing == {2: 20} and loaded.first_unstable_offset == 20
    dup = loaded.check(1, 0, 10, 4)
    assert dup is not None and (dup.first_offset, dup.last_offset) == (10, 14)
    with pytest.raises(OutOfOrderSequenceError):  # older batches are not retained
        loaded.check(1, 0, 0, 9)
    with pytest.raises(OutOfOrderSequenceError):
        loaded.check(1, 0, 16, 0)
    assert loaded.check(1, 0, 15, 0) is None
    wrapped = loaded.check(2, 3, 2**31 - 3, 4, transactional=True)
    assert wrapped is not None and wrapped.last_seq == 1
    assert loaded.check(2, 3, 2, 0, transactional=True) is None
    # a producer known only from a marker: its epoch and coordinator epoch
    e3 = loaded.producers[3]
    assert (e3.epoch, e3.coordinator_epoch, e3.last_timestamp, len(e3.batches)) == (1, 4, 9, 0)
