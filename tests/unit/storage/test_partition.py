"""Partition.append_as_leader / read: the log's rules, and their errors as Kafka codes.

Real logs in a temporary directory, batches built byte for byte by the protocol package; the
error codes come from the one table the handlers use (``logstore.server.error_codes``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from logstore.errors import (
    CorruptRecordError,
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidTxnStateError,
    LogClosedError,
    LoglakeError,
    LogOfflineError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    RecordTooLargeError,
    StorageError,
    TransactionCoordinatorFencedError,
    UnsupportedMagicError,
)
from logstore.protocol.batch import MAGIC_OFFSET, iter_batches
from logstore.protocol.records import build_batch
from logstore.server.error_codes import ERROR_CODES, error_code_for
from logstore.storage.log import Log, LogConfig
from logstore.storage.partition import IsolationLevel, Partition

CFG = LogConfig(segment_bytes=1 << 20, max_message_bytes=4000)


def _batch(n: int, *, pid: int = -1, epoch: int = -1, seq: int = -1, size: int = 10) -> bytearray:
    return build_batch(
        [(b"k%d" % i, b"v" * size) for i in range(n)],
        base_timestamp=1_000,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
    )


@pytest.fixture
def part(tmp_path: Path) -> Partition:
    lg = Log.open(tmp_path / "t-0", CFG)
    p = Partition.load("t", 0, lg)
    yield p
    lg.close()


def _log_bytes(p: Partition) -> bytes:
    sl = p.log.read(p.log_start_offset, 10**9)
    return os.pread(sl.fileno, sl.length, sl.position)


def _code(exc: pytest.ExceptionInfo[BaseException]) -> int:
    return int(error_code_for(exc.value))


def test_append_assigns_offsets_and_moves_the_high_watermark(part: Partition) -> None:
    assert (part.high_watermark, part.last_stable_offset) == (0, 0)
    r = part.append_as_leader(_batch(3) + _batch(2), now_ms=5)
    assert (r.first_offset, r.last_offset, r.duplicate, r.log_start_offset) == (0, 4, False, 0)
    assert r.log_append_time_ms == -1  # CreateTime topic
    assert part.high_watermark == part.log_end_offset == 5
    # no transaction is open: read_committed stops where read_uncommitted does
    assert part.last_stable_offset == 5
    assert part.fetch_limit(IsolationLevel.READ_COMMITTED) == 5
    stored = [(h.base_offset, h.last_offset) for _, h in iter_batches(_log_bytes(part))]
    assert stored == [(0, 2), (3, 4)]


def test_read_up_to_the_isolation_limit(part: Partition) -> None:
    part.append_as_leader(_batch(3))
    part.append_as_leader(_batch(2))
    for iso in IsolationLevel:
        rd = part.read(0, 10**6, isolation=iso)
        assert rd.slice is not None
        data = os.pread(rd.slice.fileno, rd.slice.length, rd.slice.position)
        assert [h.base_offset for _, h in iter_batches(data)] == [0, 3]
        assert (rd.high_watermark, rd.last_stable_offset, rd.log_start_offset) == (5, 5, 0)
    # at the high watermark: nothing to send, not an error
    assert part.read(5, 10**6).slice is None
    # no budget and not the first partition of the response: nothing read
    assert part.read(0, 0, min_one_batch=False).slice is None
    # min_one_batch: a whole batch even over the budget (KIP-74)
    one = part.read(0, 1, min_one_batch=True).slice
    assert one is not None and one.length == len(_batch(3))
    with pytest.raises(OffsetOutOfRangeError) as exc:
        part.read(6, 100)
    assert _code(exc) == 1


def test_idempotent_retry_is_answered_with_the_original_offsets(part: Partition) -> None:
    part.append_as_leader(_batch(1))  # offset 0, not idempotent
    first = part.append_as_leader(_batch(3, pid=7, epoch=0, seq=0))
    second = part.append_as_leader(_batch(2, pid=7, epoch=0, seq=3))
    assert (first.first_offset, second.first_offset) == (1, 4)
    before = _log_bytes(part)
    retry = part.append_as_leader(_batch(3, pid=7, epoch=0, seq=0))
    assert retry.duplicate
    assert (retry.first_offset, retry.last_offset, retry.log_append_time_ms) == (1, 3, -1)
    assert part.append_as_leader(_batch(2, pid=7, epoch=0, seq=3)).first_offset == 4
    assert _log_bytes(part) == before  # nothing appended again
    assert part.high_watermark == 6


def test_out_of_order_sequence_appends_nothing(part: Partition) -> None:
    part.append_as_leader(_batch(3, pid=7, epoch=0, seq=0))
    before = _log_bytes(part)
    with pytest.raises(OutOfOrderSequenceError) as exc:
        part.append_as_leader(_batch(1, pid=7, epoch=0, seq=10))  # expected 3
    assert _code(exc) == 45
    with pytest.raises(OutOfOrderSequenceError):
        part.append_as_leader(_batch(2, pid=7, epoch=0, seq=1))  # overlaps, not a retry
    assert _log_bytes(part) == before and part.high_watermark == 3


def test_batches_of_one_producer_in_one_request_follow_each_other(part: Partition) -> None:
    part.append_as_leader(_batch(2, pid=9, epoch=0, seq=0))
    # seq 2-3 then 4-5 in one request: the second follows the first, not the log's last
    r = part.append_as_leader(_batch(2, pid=9, epoch=0, seq=2) + _batch(2, pid=9, epoch=0, seq=4))
    assert (r.first_offset, r.last_offset) == (2, 5)
    with pytest.raises(OutOfOrderSequenceError):
        part.append_as_leader(_batch(1, pid=9, epoch=0, seq=6) + _batch(1, pid=9, epoch=0, seq=8))
    with pytest.raises(OutOfOrderSequenceError):  # a retry mixed with a new batch
        part.append_as_leader(_batch(2, pid=9, epoch=0, seq=4) + _batch(1, pid=9, epoch=0, seq=6))
    assert part.high_watermark == 6
    # the producer state recorded both batches of the request: each retry is recognised
    assert part.append_as_leader(_batch(2, pid=9, epoch=0, seq=2)).first_offset == 2
    assert part.append_as_leader(_batch(2, pid=9, epoch=0, seq=4)).first_offset == 4


def test_an_older_epoch_is_fenced(part: Partition) -> None:
    part.append_as_leader(_batch(1, pid=3, epoch=0, seq=0))
    part.append_as_leader(_batch(1, pid=3, epoch=1, seq=0))  # a new epoch starts at 0
    with pytest.raises(InvalidProducerEpochError) as exc:
        part.append_as_leader(_batch(1, pid=3, epoch=0, seq=1))  # the zombie
    assert _code(exc) == 47
    with pytest.raises(OutOfOrderSequenceError):
        part.append_as_leader(_batch(1, pid=3, epoch=2, seq=5))  # new epoch not at 0
    assert part.high_watermark == 2


def test_producer_state_is_rebuilt_when_the_partition_loads(tmp_path: Path) -> None:
    lg = Log.open(tmp_path / "t-0", CFG)
    p = Partition("t", 0, lg)
    p.append_as_leader(_batch(2, pid=5, epoch=0, seq=0))
    p.append_as_leader(_batch(1))
    p.append_as_leader(_batch(3, pid=5, epoch=0, seq=2))
    lg.close()
    lg = Log.open(tmp_path / "t-0", CFG, clean_shutdown=True)
    lg.high_watermark = lg.log_end_offset
    again = Partition.load("t", 0, lg)
    try:
        retry = again.append_as_leader(_batch(3, pid=5, epoch=0, seq=2))
        assert retry.duplicate and retry.first_offset == 3
        with pytest.raises(OutOfOrderSequenceError):
            again.append_as_leader(_batch(1, pid=5, epoch=0, seq=9))
        assert again.append_as_leader(_batch(1, pid=5, epoch=0, seq=5)).first_offset == 6
    finally:
        lg.close()


def test_bad_batches_raise_typed_errors_with_their_codes(part: Partition) -> None:
    bad_crc = _batch(2)
    bad_crc[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError) as exc:
        part.append_as_leader(bad_crc)
    assert _code(exc) == 2
    with pytest.raises(CorruptRecordError) as exc:
        part.append_as_leader(bytearray())
    assert _code(exc) == 2
    torn = _batch(2)[:-3]
    with pytest.raises(CorruptRecordError):
        part.append_as_leader(torn)
    with pytest.raises(RecordTooLargeError) as exc:
        part.append_as_leader(_batch(2, size=5000))
    assert _code(exc) == 10
    old = _batch(1)
    old[MAGIC_OFFSET] = 1
    with pytest.raises(UnsupportedMagicError) as exc:
        part.append_as_leader(old)
    assert _code(exc) == 43
    txn = build_batch([(b"k", b"v")], is_transactional=True)  # no producer id
    with pytest.raises(InvalidRecordError) as exc:
        part.append_as_leader(txn)
    assert _code(exc) == 87
    # a good batch after a bad one in the same request: nothing of the request is appended
    with pytest.raises(CorruptRecordError):
        part.append_as_leader(_batch(1) + bad_crc)
    assert part.log_end_offset == part.high_watermark == 0


def test_a_closed_log_refuses_appends(part: Partition) -> None:
    part.log.close()
    assert part.deleted
    with pytest.raises(LogClosedError) as exc:
        part.append_as_leader(_batch(1))
    assert _code(exc) == 6  # NOT_LEADER_OR_FOLLOWER: clients refresh metadata


def test_delete_records_moves_the_start_and_forgets_old_producer_batches(
    part: Partition,
) -> None:
    part.append_as_leader(_batch(2, pid=1, epoch=0, seq=0))
    part.log.roll()
    part.append_as_leader(_batch(2, pid=1, epoch=0, seq=2))
    assert part.delete_records_before(2) == 2
    assert part.log_start_offset == 2
    with pytest.raises(OffsetOutOfRangeError):
        part.delete_records_before(99)
    with pytest.raises(OffsetOutOfRangeError):
        part.read(0, 100)
    # the batch below the start offset is no longer recognised as a retry
    with pytest.raises(OutOfOrderSequenceError):
        part.append_as_leader(_batch(2, pid=1, epoch=0, seq=0))
    assert part.append_as_leader(_batch(2, pid=1, epoch=0, seq=2)).duplicate


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (LogOfflineError("offline"), 56),
        (StorageError("disk full", errno=28), 56),
        (InvalidRecordError("no key"), 87),
        (LoglakeError("a bug"), -1),
        (ValueError("not ours"), -1),
    ],
)
def test_one_table_maps_errors_to_codes(exc: BaseException, code: int) -> None:
    assert int(error_code_for(exc)) == code


def test_the_table_covers_every_error_a_partition_raises() -> None:
    for cls in (
        CorruptRecordError,
        RecordTooLargeError,
        UnsupportedMagicError,
        OutOfOrderSequenceError,
        InvalidProducerEpochError,
        InvalidTxnStateError,
        TransactionCoordinatorFencedError,
        StorageError,
        LogClosedError,
        OffsetOutOfRangeError,
    ):
        assert cls in ERROR_CODES, cls


def test_a_compacted_topic_refuses_keyless_records(tmp_path: Path) -> None:
    lg = Log.open(tmp_path / "c-0", LogConfig(cleanup_policy="compact"))
    p = Partition("c", 0, lg)
    try:
        keyless = build_batch([(b"k", b"v"), (None, b"no key")])
        with pytest.raises(InvalidRecordError) as exc:
            p.append_as_leader(keyless)
        assert _code(exc) == 87
        assert "c-0" in str(exc.value)
        assert p.log_end_offset == 0
        assert p.append_as_leader(build_batch([(b"k", None)])).first_offset == 0  # tombstone
    finally:
        lg.close()
