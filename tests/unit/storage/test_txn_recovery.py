"""Recovery of transaction state: ``.txnindex`` rebuilt, producer snapshots, torn markers.

A crash is simulated as in ``test_recovery.py``: the partition directory is copied while the
log is open (what a SIGKILL leaves: page cache contents, no snapshot at the log end), then
damaged and opened without the clean-shutdown flag.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest
from crc32c import crc32c

from logstore.protocol.records import build_batch
from logstore.storage.log import MAX_SNAPSHOTS, Log, LogConfig
from logstore.storage.partition import IsolationLevel, Partition
from logstore.storage.producer_snapshot import (
    CorruptSnapshotError,
    SnapshotEntry,
    decode_snapshot,
    encode_snapshot,
    list_snapshots,
)
from logstore.storage.segment import LogSegment
from logstore.storage.txn_index import ENTRY_SIZE, decode_entries

CFG = LogConfig(segment_bytes=1 << 20, segment_ms=2**62)


def txn(n: int, *, pid: int, seq: int = 0, epoch: int = 0) -> bytearray:
    return build_batch(
        [(b"k%d" % i, b"v" * 30) for i in range(n)],
        base_timestamp=1_000,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        is_transactional=True,
    )


def _open(d: Path, *, clean: bool = False, recovery_point: int = 0) -> Partition:
    lg = Log.open(d, CFG, clean_shutdown=clean, recovery_point=recovery_point)
    lg.high_watermark = lg.log_end_offset
    return Partition.load("t", 0, lg)


def _workload(p: Partition) -> None:
    """Three segments: aborts in each, one transaction spanning a roll, one left open."""
    p.append_as_leader(txn(2, pid=1))  # 0..1 A
    p.append_as_leader(txn(1, pid=2))  # 2 B
    p.write_txn_marker(1, 0, commit=False, coordinator_epoch=0)  # 3 A aborted
    p.log.roll()
    p.append_as_leader(txn(1, pid=3))  # 4 C
    p.write_txn_marker(2, 0, commit=False, coordinator_epoch=0)  # 5 B aborted (began in seg 0)
    p.write_txn_marker(3, 0, commit=True, coordinator_epoch=0)  # 6 C committed
    p.log.roll()
    p.append_as_leader(txn(1, pid=1, seq=2))  # 7 A again
    p.write_txn_marker(1, 0, commit=False, coordinator_epoch=0)  # 8
    p.append_as_leader(txn(2, pid=4))  # 9..10 D open


def _txn_files(d: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(d.glob("*.txnindex"))}


def _state(p: Partition) -> list[SnapshotEntry]:
    return sorted(p.producers.snapshot_entries())


def _crash_copy(p: Partition, tmp_path: Path) -> Path:
    crashed = tmp_path / "crash" / "t-0"
    shutil.copytree(p.log.dir, crashed)
    return crashed


def test_txnindex_entries_are_kafkas(tmp_path: Path) -> None:
    p = _open(tmp_path / "t-0")
    _workload(p)
    files = _txn_files(p.log.dir)
    assert sorted(files) == [f"{b:020d}.txnindex" for b in (0, 4, 7)]
    entry = struct.Struct(">hqqqq")  # version, producerId, first, last (marker), LSO
    assert files[f"{0:020d}.txnindex"] == entry.pack(0, 1, 0, 3, 2)  # B still open: LSO 2
    assert files[f"{4:020d}.txnindex"] == entry.pack(0, 2, 2, 5, 4)  # C open: LSO 4
    assert files[f"{7:020d}.txnindex"] == entry.pack(0, 1, 7, 8, 9)
    assert all(len(b) % ENTRY_SIZE == 0 for b in files.values())
    assert [e.producer_id for e in decode_entries(files[f"{4:020d}.txnindex"])] == [2]
    p.log.close()


@pytest.mark.parametrize("damage", ["deleted", "torn", "garbage"])
def test_txnindex_and_producer_state_rebuilt_after_a_crash(tmp_path: Path, damage: str) -> None:
    p = _open(tmp_path / "t-0")
    _workload(p)
    expected_files = _txn_files(p.log.dir)
    expected_state = _state(p)
    crashed = _crash_copy(p, tmp_path)
    p.log.close()
    for f in crashed.glob("*.txnindex"):
        if damage == "deleted":
            f.unlink()
        elif damage == "torn":
            f.write_bytes(f.read_bytes()[:-5])
        else:
            f.write_bytes(struct.pack(">hqqqq", 7, 1, 2, 3, 4))
    again = _open(crashed)
    try:
        assert _txn_files(crashed) == expected_files
        assert _state(again) == expected_state
        assert again.producers.ongoing == {4: 9}
        assert again.last_stable_offset == 9
        rd = again.read(0, 10**6, isolation=IsolationLevel.READ_COMMITTED)
        assert [(a.producer_id, a.first_offset) for a in rd.aborted_transactions or []] == [
            (1, 0),
            (2, 2),
        ]
    finally:
        again.log.close()


def test_a_corrupt_txnindex_is_rebuilt_even_after_a_clean_shutdown(tmp_path: Path) -> None:
    p = _open(tmp_path / "t-0")
    _workload(p)
    expected = _txn_files(p.log.dir)
    p.log.close()
    f = tmp_path / "t-0" / f"{4:020d}.txnindex"
    f.write_bytes(f.read_bytes() + b"\x00\x01")  # torn entry
    again = _open(tmp_path / "t-0", clean=True)
    try:
        assert _txn_files(tmp_path / "t-0") == expected
        assert again.log.producer_load.rebuilt_txn_indexes == [4]
    finally:
        again.log.close()


def test_crash_mid_marker_write_truncates_the_torn_marker(tmp_path: Path) -> None:
    p = _open(tmp_path / "t-0")
    p.append_as_leader(txn(2, pid=5))  # 0..1
    p.write_txn_marker(5, 0, commit=False, coordinator_epoch=3)  # 2, torn below
    crashed = _crash_copy(p, tmp_path)
    p.log.close()
    log_file = crashed / f"{0:020d}.log"
    log_file.write_bytes(log_file.read_bytes()[:-7])  # the marker batch is cut short
    (crashed / f"{0:020d}.txnindex").unlink()  # its entry never made it either
    again = _open(crashed)
    try:
        assert again.log_end_offset == 2  # the torn marker is gone
        assert not (crashed / f"{0:020d}.txnindex").exists()
        # the transaction is open again: nothing of it is stable, the coordinator retries
        assert again.producers.ongoing == {5: 0}
        assert again.last_stable_offset == 0
        assert again.write_txn_marker(5, 0, commit=False, coordinator_epoch=3) == 2
        assert again.last_stable_offset == 3
        assert _txn_files(crashed) == {f"{0:020d}.txnindex": struct.pack(">hqqqq", 0, 5, 0, 2, 3)}
    finally:
        again.log.close()


# -- producer-state snapshots ---------------------------------------------------------------


def test_snapshot_bytes_are_kafkas_version_1() -> None:
    e = SnapshotEntry(7, 2, 41, 100, 4, 1_700, 9, 96)
    data = encode_snapshot([e])
    body = struct.pack(">i", 1) + struct.pack(">qhiqiqiq", 7, 2, 41, 100, 4, 1_700, 9, 96)
    assert data == struct.pack(">hI", 1, crc32c(body)) + body
    assert len(data) == 2 + 4 + 4 + 46
    assert decode_snapshot(data) == [e]
    assert decode_snapshot(encode_snapshot([])) == []
    with pytest.raises(CorruptSnapshotError, match="CRC"):
        decode_snapshot(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(CorruptSnapshotError, match="version"):
        decode_snapshot(struct.pack(">h", 2) + data[2:])
    with pytest.raises(CorruptSnapshotError):
        decode_snapshot(data[:5])


def test_snapshots_on_roll_and_close_make_a_clean_load_replay_nothing(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    p = _open(d)
    _workload(p)
    assert list_snapshots(d) == [4, 7]  # one per roll, at the new segment's base
    expected = _state(p)
    p.log.close()
    assert list_snapshots(d) == [4, 7, 11]  # clean shutdown: at the log end
    again = _open(d, clean=True)
    try:
        load = again.log.producer_load
        assert (load.snapshot_offset, load.batches_replayed) == (11, 0)
        assert _state(again) == expected
        assert again.producers.ongoing == {4: 9}
        # the retained last batch still answers a retry with its original offsets
        assert again.append_as_leader(txn(2, pid=4)).duplicate
    finally:
        again.log.close()


def test_recovery_rescans_only_from_the_latest_snapshot(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    p = _open(d)
    _workload(p)
    crashed = _crash_copy(p, tmp_path)  # no snapshot at the log end: a crash
    expected = _state(p)
    p.log.close()
    again = _open(crashed, recovery_point=7)
    try:
        load = again.log.producer_load
        assert load.snapshot_offset == 7
        assert load.batches_replayed == 3  # offsets 7, 8, 9..10: the active segment only
        assert _state(again) == expected
    finally:
        again.log.close()
    # the same state without any snapshot: a full replay
    for f in crashed.glob("*.snapshot"):
        f.unlink()
    full = _open(crashed)
    try:
        assert full.log.producer_load.snapshot_offset is None
        assert full.log.producer_load.batches_replayed == 9  # every batch of the log
        assert _state(full) == expected
    finally:
        full.log.close()


def test_a_corrupt_snapshot_falls_back_to_an_older_one(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    p = _open(d)
    _workload(p)
    crashed = _crash_copy(p, tmp_path)
    expected = _state(p)
    p.log.close()
    snap = crashed / f"{7:020d}.snapshot"
    snap.write_bytes(snap.read_bytes()[:-3])
    again = _open(crashed, recovery_point=7)
    try:
        assert again.log.producer_load.snapshot_offset == 4
        assert not snap.exists()
        assert _state(again) == expected
    finally:
        again.log.close()


def test_snapshots_are_bounded_and_go_with_the_segments(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    p = _open(d)
    for i in range(6):
        p.append_as_leader(txn(1, pid=1, seq=i))
        p.write_txn_marker(1, 0, commit=i % 2 == 0, coordinator_epoch=0)
        p.log.roll()
    # one per roll (2, 4, ... 12), the newest kept
    assert MAX_SNAPSHOTS == 3 and list_snapshots(d) == [8, 10, 12]
    # the aborts (odd i) left an entry with their marker: segments 2, 6 and 10
    assert sorted(_txn_files(d)) == [f"{b:020d}.txnindex" for b in (2, 6, 10)]
    p.delete_records_before(10)
    assert list_snapshots(d) == [10, 12]  # below the log start: gone
    assert sorted(_txn_files(d)) == [f"{10:020d}.txnindex"]  # deleted with their segments
    p.log.close()


def test_truncation_drops_later_snapshots_txnindex_entries_and_state(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    p = _open(d)
    _workload(p)
    p.log.truncate_to(5)  # keeps 0..4: A aborted, B and C open again
    try:
        assert list_snapshots(d) == [4]
        assert sorted(_txn_files(d)) == [f"{0:020d}.txnindex"]
        assert p.producers.ongoing == {2: 2, 3: 4}
        p.log.high_watermark = p.log.log_end_offset
        assert p.last_stable_offset == 2
    finally:
        p.log.close()


def test_a_compaction_swap_carries_the_aborted_transactions(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    p = _open(d)
    p.append_as_leader(txn(2, pid=1))  # 0..1
    p.write_txn_marker(1, 0, commit=False, coordinator_epoch=0)  # 2
    p.log.roll()
    p.append_as_leader(build_batch([(b"k", b"v")]))  # 3
    expected = _txn_files(d)[f"{0:020d}.txnindex"]
    # the cleaner's output for segment 0 (here: the same batches), swapped in as the broker does
    old = p.log.segments[0]
    (d / f"{0:020d}.log.swap").write_bytes(old.path.read_bytes())
    new = LogSegment.open(d, 0, file_suffix=".swap", preallocate=False)
    new.recover()
    p.log.replace_segments(new, [old])
    new.change_file_suffixes(".swap", "")
    try:
        assert _txn_files(d) == {f"{0:020d}.txnindex": expected}
        rd = p.read(0, 10**6, isolation=IsolationLevel.READ_COMMITTED)
        assert [(a.producer_id, a.first_offset) for a in rd.aborted_transactions or []] == [(1, 0)]
    finally:
        p.log.close()
