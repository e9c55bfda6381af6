"""The partition's transaction rules: transactional batches, markers, last stable offset.

Real logs in a temporary directory; batches built byte for byte by the protocol package and
markers read back from the segment file and decoded independently of the writer.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from logstore.errors import (
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    TransactionCoordinatorFencedError,
)
from logstore.protocol.batch import HEADER_SIZE, iter_batches
from logstore.protocol.control import ControlType, build_control_batch
from logstore.protocol.records import build_batch, decode_batch
from logstore.server.error_codes import error_code_for
from logstore.storage.log import Log, LogConfig
from logstore.storage.partition import IsolationLevel, Partition

# no time-based roll: the batches are stamped 1970, the markers now
CFG = LogConfig(segment_bytes=1 << 20, segment_ms=2**62)
RC = IsolationLevel.READ_COMMITTED


def txn(n: int, *, pid: int, epoch: int = 0, seq: int = 0, transactional: bool = True) -> bytearray:
    return build_batch(
        [(b"k%d" % i, b"v%d" % i) for i in range(n)],
        base_timestamp=1_000,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        is_transactional=transactional,
    )


@pytest.fixture
def part(tmp_path: Path) -> Partition:
    lg = Log.open(tmp_path / "t-0", CFG)
    p = Partition.load("t", 0, lg)
    yield p
    lg.close()


def _stored(p: Partition) -> bytes:
    sl = p.log.read(p.log_start_offset, 10**9)
    return os.pread(sl.fileno, sl.length, sl.position)


def _code(exc: pytest.ExceptionInfo[BaseException]) -> int:
    return int(error_code_for(exc.value))


def test_commit_marker_is_kafkas_control_batch_and_moves_the_lso(part: Partition) -> None:
    assert part.append_as_leader(txn(3, pid=7)).first_offset == 0
    # open transaction: nothing of it is stable, read_committed sees nothing yet
    assert (part.high_watermark, part.last_stable_offset) == (3, 0)
    assert part.fetch_limit(RC) == 0
    assert part.read(0, 10**6, isolation=RC).slice is None
    assert part.read(0, 10**6).slice is not None
    off = part.write_txn_marker(7, 0, commit=True, coordinator_epoch=5, now_ms=42)
    assert off == 3
    assert part.high_watermark == part.last_stable_offset == part.log_end_offset == 4
    batches = list(iter_batches(_stored(part)))
    pos, h = batches[-1]
    # Kafka's marker: control (0x20) + transactional (0x10), no codec, the producer's id and
    # epoch, no sequence, one record
    assert (h.base_offset, h.attributes, h.producer_id, h.producer_epoch) == (3, 0x30, 7, 0)
    assert (h.base_sequence, h.records_count, h.last_offset_delta) == (-1, 1, 0)
    assert h.max_timestamp == 42
    _, recs = decode_batch(_stored(part)[pos:])
    (rec,) = recs
    assert rec.key == struct.pack(">hh", 0, 1)  # version 0, COMMIT
    assert rec.value == struct.pack(">hi", 0, 5)  # version 0, coordinator epoch
    # the same bytes the protocol package builds for a coordinator (offset stamped)
    expected = build_control_batch(
        ControlType.COMMIT, producer_id=7, producer_epoch=0, coordinator_epoch=5, timestamp=42
    )
    assert _stored(part)[pos + HEADER_SIZE :] == bytes(expected[HEADER_SIZE:])


def test_abort_marker_key_and_read_committed_stops_at_the_lso(part: Partition) -> None:
    part.append_as_leader(build_batch([(b"a", b"1")]))  # plain, offset 0
    part.append_as_leader(txn(2, pid=9))  # 1..2
    assert part.last_stable_offset == 1
    rd = part.read(0, 10**6, isolation=RC)
    assert rd.slice is not None and rd.last_stable_offset == 1
    # the slice ends before the open transaction's first batch
    data = os.pread(rd.slice.fileno, rd.slice.length, rd.slice.position)
    assert [h.base_offset for _, h in iter_batches(data)] == [0]
    off = part.write_txn_marker(9, 0, commit=False, coordinator_epoch=0)
    assert off == 3 and part.last_stable_offset == 4
    pos, _h = list(iter_batches(_stored(part)))[-1]
    _, recs = decode_batch(_stored(part)[pos:])
    assert recs[0].key == struct.pack(">hh", 0, 0)  # ABORT


def test_lso_with_interleaved_producers(part: Partition) -> None:
    part.append_as_leader(txn(2, pid=1))  # 0..1 opens A
    part.append_as_leader(txn(2, pid=2))  # 2..3 opens B
    part.append_as_leader(txn(1, pid=1, seq=2))  # 4 A continues
    part.append_as_leader(build_batch([(b"x", b"y")]))  # 5 plain
    assert part.last_stable_offset == 0
    assert part.write_txn_marker(1, 0, commit=True, coordinator_epoch=0) == 6
    assert part.last_stable_offset == 2  # B is still open
    part.append_as_leader(txn(1, pid=1, seq=3))  # 7: A's next transaction
    assert part.last_stable_offset == 2
    assert part.write_txn_marker(2, 0, commit=False, coordinator_epoch=0) == 8
    assert part.last_stable_offset == 7
    assert part.write_txn_marker(1, 0, commit=True, coordinator_epoch=0) == 9
    assert part.last_stable_offset == part.high_watermark == 10
    assert part.producers.ongoing == {}


def test_a_marker_with_a_new_epoch_fences_the_zombie(part: Partition) -> None:
    part.append_as_leader(txn(2, pid=3, epoch=0, seq=0))
    # the coordinator aborts the zombie's transaction with the bumped epoch
    part.write_txn_marker(3, 1, commit=False, coordinator_epoch=0)
    with pytest.raises(InvalidProducerEpochError) as exc:
        part.append_as_leader(txn(1, pid=3, epoch=0, seq=2))
    assert _code(exc) == 47  # INVALID_PRODUCER_EPOCH
    # a stale marker is refused the same way, and nothing is appended
    end = part.log_end_offset
    with pytest.raises(InvalidProducerEpochError):
        part.write_txn_marker(3, 0, commit=True, coordinator_epoch=0)
    assert part.log_end_offset == end
    # the new producer epoch starts at sequence 0
    with pytest.raises(OutOfOrderSequenceError):
        part.append_as_leader(txn(1, pid=3, epoch=1, seq=2))
    assert part.append_as_leader(txn(1, pid=3, epoch=1, seq=0)).first_offset == end


def test_an_older_coordinator_epoch_is_fenced(part: Partition) -> None:
    part.append_as_leader(txn(1, pid=4))
    part.write_txn_marker(4, 0, commit=True, coordinator_epoch=3)
    part.append_as_leader(txn(1, pid=4, seq=1))
    end = part.log_end_offset
    with pytest.raises(TransactionCoordinatorFencedError) as exc:
        part.write_txn_marker(4, 0, commit=True, coordinator_epoch=2)
    assert _code(exc) == 52  # TRANSACTION_COORDINATOR_FENCED
    assert part.log_end_offset == end and part.last_stable_offset == end - 1


def test_non_transactional_batch_during_an_open_transaction(part: Partition) -> None:
    part.append_as_leader(txn(1, pid=5))
    with pytest.raises(InvalidTxnStateError) as exc:
        part.append_as_leader(txn(1, pid=5, seq=1, transactional=False))
    assert _code(exc) == 48  # INVALID_TXN_STATE
    with pytest.raises(InvalidTxnStateError):  # the same inside one request
        part.append_as_leader(txn(1, pid=6) + txn(1, pid=6, seq=1, transactional=False))
    assert part.log_end_offset == 1
    part.write_txn_marker(5, 0, commit=True, coordinator_epoch=0)
    assert part.append_as_leader(txn(1, pid=5, seq=1, transactional=False)).first_offset == 2


def test_marker_retry_without_an_open_transaction_is_written(part: Partition) -> None:
    part.append_as_leader(txn(1, pid=8))
    assert part.write_txn_marker(8, 0, commit=True, coordinator_epoch=1) == 1
    # the coordinator retries (its response was lost): a second marker, completing nothing
    assert part.write_txn_marker(8, 0, commit=True, coordinator_epoch=1) == 2
    assert part.last_stable_offset == part.high_watermark == 3
    # a marker for a producer this partition never saw
    assert part.write_txn_marker(99, 0, commit=False, coordinator_epoch=1) == 3
    assert part.last_stable_offset == 4
    # sequence numbers continue across transactions of the same epoch
    assert part.append_as_leader(txn(1, pid=8, seq=0)).duplicate
    with pytest.raises(OutOfOrderSequenceError):
        part.append_as_leader(txn(1, pid=8, seq=5))
    assert part.append_as_leader(txn(1, pid=8, seq=1)).first_offset == 4


def test_clients_cannot_write_markers(part: Partition) -> None:
    marker = build_control_batch(
        ControlType.COMMIT, producer_id=1, producer_epoch=0, coordinator_epoch=0, timestamp=1
    )
    with pytest.raises(InvalidRecordError) as exc:
        part.append_as_leader(marker)
    assert _code(exc) == 87
    assert part.log_end_offset == 0


def test_a_retried_transactional_batch_gets_its_original_offsets(part: Partition) -> None:
    part.append_as_leader(txn(2, pid=11))
    part.append_as_leader(txn(2, pid=11, seq=2))
    again = part.append_as_leader(txn(2, pid=11, seq=2))
    assert again.duplicate and again.first_offset == 2
    assert part.log_end_offset == 4 and part.producers.ongoing == {11: 0}


def test_producer_state_with_open_transactions_is_rebuilt_on_load(tmp_path: Path) -> None:
    lg = Log.open(tmp_path / "t-0", CFG)
    p = Partition.load("t", 0, lg)
    p.append_as_leader(txn(2, pid=1))
    p.append_as_leader(txn(2, pid=2))
    p.write_txn_marker(1, 0, commit=False, coordinator_epoch=0)
    lg.close()
    lg = Log.open(tmp_path / "t-0", CFG)
    try:
        again = Partition.load("t", 0, lg)
        lg.high_watermark = lg.log_end_offset  # the broker sets it from its checkpoint
        assert again.producers.ongoing == {2: 2}
        assert again.last_stable_offset == 2
        again.write_txn_marker(2, 0, commit=True, coordinator_epoch=0)
        assert again.last_stable_offset == again.high_watermark
    finally:
        lg.close()


# -- .txnindex and READ_COMMITTED reads ------------------------------------------------------


def _txnindex(p: Partition, base: int = 0) -> bytes:
    path = p.log.dir / f"{base:020d}.txnindex"
    return path.read_bytes() if path.exists() else b""


def test_an_abort_writes_kafkas_txnindex_entry_and_a_commit_none(part: Partition) -> None:
    part.append_as_leader(txn(2, pid=1))  # 0..1
    part.write_txn_marker(1, 0, commit=True, coordinator_epoch=0)  # 2
    assert not (part.log.dir / f"{0:020d}.txnindex").exists()
    part.append_as_leader(txn(2, pid=2))  # 3..4, B
    part.append_as_leader(txn(1, pid=1, seq=2))  # 5, A again
    part.write_txn_marker(1, 0, commit=False, coordinator_epoch=0)  # 6: A aborts, B open
    part.write_txn_marker(2, 0, commit=False, coordinator_epoch=0)  # 7: B aborts
    # version i16 0, producerId, firstOffset, lastOffset (the marker), lastStableOffset
    assert _txnindex(part) == struct.pack(">hqqqq", 0, 1, 5, 6, 3) + struct.pack(
        ">hqqqq", 0, 2, 3, 7, 8
    )
    assert len(_txnindex(part)) == 2 * 34


def test_read_committed_returns_the_aborted_transactions_it_overlaps(part: Partition) -> None:
    part.append_as_leader(txn(2, pid=1))  # 0..1
    part.write_txn_marker(1, 0, commit=False, coordinator_epoch=0)  # 2
    part.append_as_leader(txn(2, pid=2, seq=0))  # 3..4
    part.write_txn_marker(2, 0, commit=True, coordinator_epoch=0)  # 5
    part.append_as_leader(txn(1, pid=3))  # 6
    part.write_txn_marker(3, 0, commit=False, coordinator_epoch=0)  # 7
    part.append_as_leader(txn(1, pid=4))  # 8, still open
    assert part.last_stable_offset == 8
    rd = part.read(0, 10**6, isolation=RC)
    assert rd.slice is not None
    assert [(a.producer_id, a.first_offset) for a in rd.aborted_transactions or []] == [
        (1, 0),
        (3, 6),
    ]
    # from after the first abort's marker: only the second overlaps
    rd = part.read(3, 10**6, isolation=RC)
    assert [(a.producer_id, a.first_offset) for a in rd.aborted_transactions or []] == [(3, 6)]
    # read_uncommitted: no list at all (the response's null)
    assert part.read(0, 10**6).aborted_transactions is None
    # at the LSO: nothing to read, an empty list
    assert part.read(8, 10**6, isolation=RC) == (None, 9, 8, 0, [])


def test_an_abort_whose_marker_is_in_a_later_segment(part: Partition) -> None:
    part.append_as_leader(txn(2, pid=1))  # 0..1
    part.append_as_leader(build_batch([(b"p", b"q")]))  # 2
    part.log.roll()
    part.append_as_leader(build_batch([(b"p", b"q")]))  # 3
    assert part.write_txn_marker(1, 0, commit=False, coordinator_epoch=0) == 4
    # the entry lives with the marker, in the second segment
    assert _txnindex(part, 0) == b""
    assert _txnindex(part, 3) == struct.pack(">hqqqq", 0, 1, 0, 4, 5)
    rd = part.read(0, 10**6, isolation=RC)
    assert rd.slice is not None and rd.slice.first_offset == 0
    assert [(a.producer_id, a.first_offset) for a in rd.aborted_transactions or []] == [(1, 0)]


def test_the_lso_never_falls_below_the_log_start(part: Partition) -> None:
    part.append_as_leader(txn(2, pid=1))  # 0..1, left open
    part.append_as_leader(build_batch([(b"x", b"y")]))  # 2
    part.log.roll()
    part.append_as_leader(build_batch([(b"x", b"y")]))  # 3
    assert part.last_stable_offset == 0
    assert part.delete_records_before(3) == 3
    assert part.last_stable_offset == 3
    rd = part.read(3, 10**6, isolation=RC)
    assert rd.slice is None and rd.last_stable_offset == 3


def test_read_committed_collects_aborts_only_up_to_the_slice_not_the_segment_end(
    tmp_path: Path,
) -> None:
    # an index entry per batch: Kafka's fetchUpperBoundOffset bounds the lookup by the slice
    lg = Log.open(tmp_path / "t-0", LogConfig(segment_ms=2**62, index_interval_bytes=1))
    p = Partition.load("t", 0, lg)
    try:
        for i in range(40):  # 40 aborted transactions of 3 records + marker: offsets 4i..4i+3
            pid = 100 + i
            assert p.append_as_leader(txn(3, pid=pid)).first_offset == 4 * i
            p.write_txn_marker(pid, 0, commit=False, coordinator_epoch=0)
        size = len(txn(3, pid=100))
        # a slice of about two transactions from offset 8: the third and fourth (and at most
        # the one whose batch the bound falls on), not the 38 aborts after the fetch offset
        rd = p.read(8, 2 * size + 2 * 100, isolation=RC, min_one_batch=True)
        assert rd.slice is not None and rd.slice.first_offset == 8
        got = [a.first_offset for a in rd.aborted_transactions or []]
        assert got[:2] == [8, 12] and len(got) <= 4, got
        # the whole segment: all of them from the fetch offset on
        rd = p.read(8, 10**9, isolation=RC)
        assert [a.first_offset for a in rd.aborted_transactions or []] == list(range(8, 160, 4))
        # the bisection of the index: from a late offset only the later ones
        rd = p.read(150, 10**9, isolation=RC)
        assert [a.first_offset for a in rd.aborted_transactions or []] == [148, 152, 156]
    finally:
        lg.close()
