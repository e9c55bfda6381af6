"""A full disk, on a real one: a few MiB of tmpfs that runs out of space.

Index files are allocated (posix_fallocate) so that no space is an error at creation or growth,
never a SIGBUS on a mapped page; a failed append leaves the segment as it was and takes the log
offline for appends while reads go on; the log comes back when there is room; the log manager
shuts down without raising and writes no clean-shutdown marker unless everything persisted; a
start on a full disk opens the logs (offline) instead of failing, and a later start with room
recovers everything. The tests that write through a map run in a subprocess so that a SIGBUS
fails the test instead of killing pytest.
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from logstore.errors import LogOfflineError, StorageError
from logstore.protocol.batch import iter_batches
from logstore.protocol.records import build_batch, decode_batch
from logstore.storage.files import CLEAN_SHUTDOWN_FILE, RECOVERY_POINT_CHECKPOINT, write_atomically
from logstore.storage.index import OffsetIndex, TimeIndex
from logstore.storage.log import Log, LogConfig
from logstore.storage.log_manager import LogManager
from tests.conftest import ROOT
from tests.fixtures.tmpfs import fill

MIB = 1 << 20
SIGBUS = -7


def _batch(i: int, size: int = 4000) -> bytearray:
    return build_batch([(b"k%d" % i, bytes([i % 251]) * size)], base_timestamp=1000 + i)


def _run_isolated(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (a SIGBUS kills it, not the test run)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _keys(log: Log) -> list[bytes | None]:
    """The key of every record from the log start to the end, read through Log.read."""
    out: list[bytes | None] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        fs = log.read(offset, 1 << 30)
        data = os.pread(fs.fileno, fs.length, fs.position)
        for pos, h in iter_batches(data):
            _, records = decode_batch(data[pos : pos + h.size])
            out += [r.key for r in records]
            offset = h.last_offset + 1
    return out


def _expected(start: int, end: int) -> list[bytes | None]:
    return [b"k%d" % i for i in range(start, end)]


# -- index allocation --------------------------------------------------------------------------


def test_index_creation_without_room_is_a_clean_error_and_leaves_no_file(tmpfs) -> None:
    d = tmpfs(2)
    with pytest.raises(StorageError) as exc_info:
        OffsetIndex(d / "00000000000000000000.index", 0, max_index_size=10 * MIB)
    assert exc_info.value.errno == errno.ENOSPC
    assert "00000000000000000000.index" in str(exc_info.value)
    assert not (d / "00000000000000000000.index").exists()
    # room enough: the file is real blocks, not a sparse length
    idx = TimeIndex(d / "00000000000000000000.timeindex", 0, max_index_size=MIB)
    st = os.stat(idx.path)
    assert st.st_size == MIB - MIB % 12
    assert st.st_blocks * 512 >= st.st_size
    idx.close()
    assert os.path.getsize(idx.path) == 0  # trimmed to its entries on close


def test_preallocated_index_can_be_filled_through_its_map_on_a_full_disk(tmpfs) -> None:
    """The SIGBUS of the issue: every slot written through the map after the disk filled."""
    d = tmpfs(4)
    result = _run_isolated(
        f"""
        from pathlib import Path
        from logstore.storage.index import OffsetIndex
        from tests.fixtures.tmpfs import fill, free_bytes
        d = Path({str(d)!r})
        idx = OffsetIndex(d / "00000000000000000000.index", 0, max_index_size=2 << 20)
        fill(d)
        assert free_bytes(d) == 0, free_bytes(d)
        for i in range(idx.max_entries):
            idx.append(i, i * 10)
        last = idx.max_entries - 1
        assert idx.is_full and idx.lookup(last).position == last * 10
        idx.close()
        print("ok", idx.max_entries)
        """
    )
    assert result.returncode != SIGBUS, "SIGBUS writing a preallocated index on a full disk"
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ok", str((2 << 20) // 8)]


def test_growing_an_index_on_a_full_disk_fails_cleanly_and_keeps_it_usable(tmpfs) -> None:
    d = tmpfs(2)
    idx = OffsetIndex(d / "00000000000000000000.index", 0, max_index_size=4096)
    idx.append(5, 100)
    idx.trim_to_valid_size()
    fill(d)
    with pytest.raises(StorageError) as exc_info:
        idx.resize(MIB)
    assert exc_info.value.errno == errno.ENOSPC
    assert idx.file_length == 8 == os.path.getsize(idx.path)
    assert idx.entries() == [(5, 100)] and idx.lookup(7) == (5, 100)
    (d / "filler").unlink()
    assert idx.resize(MIB)
    idx.append(9, 200)
    assert idx.entries() == [(5, 100), (9, 200)]
    idx.close()


# -- segment and log ---------------------------------------------------------------------------


def test_failed_append_leaves_the_segment_as_it_was(tmpfs) -> None:
    d = tmpfs(2)
    log = Log.open(d / "t-0", LogConfig(segment_index_bytes=4096))
    n = 0
    with pytest.raises(LogOfflineError) as exc_info:
        while True:
            log.append(_batch(n))
            n += 1
    assert isinstance(exc_info.value.__cause__, StorageError)
    assert exc_info.value.__cause__.errno == errno.ENOSPC
    active = log.active_segment
    # the torn write was cut back: the file holds exactly the batches the log knows
    assert os.path.getsize(active.path) == active.size
    assert log.log_end_offset == n and _keys(log) == _expected(0, n)
    log.close()


def test_offline_log_refuses_appends_serves_reads_and_comes_back_with_room(tmpfs) -> None:
    d = tmpfs(3)
    cfg = LogConfig(segment_bytes=256 * 1024, segment_index_bytes=64 * 1024)
    log = Log.open(d / "t-0", cfg)
    acked = 0
    with pytest.raises(LogOfflineError):
        while True:
            log.append(_batch(acked, size=20_000))
            acked += 1
    assert log.offline_reason is not None and "No space left" in log.offline_reason
    assert len(log.segments) > 2
    assert log.storage_errors == 1  # the broker's loglake_log_storage_errors_total
    # refused at once while offline, even with room again, until the retry delay passed
    with pytest.raises(LogOfflineError):
        log.append(_batch(acked, size=10))
    assert log.log_end_offset == acked
    assert _keys(log) == _expected(0, acked)
    # no new segment's files left behind by a failed roll
    bases = {s.base_offset for s in log.segments}
    on_disk = {int(p.name.split(".")[0]) for p in (d / "t-0").iterdir() if p.suffix == ".log"}
    assert on_disk == bases
    # room again (retention deleted the oldest segment): the next try brings it back
    log.high_watermark = log.log_end_offset
    assert log.delete_records(log.segments[2].base_offset) > 0
    log.offline_retry_ms = 0
    info = log.append(_batch(acked, size=20_000))
    assert info.first_offset == acked and log.offline_reason is None
    assert log.storage_errors == 1  # refusals while offline are not new disk errors
    log.close()


def test_a_roll_without_room_fails_cleanly_and_creates_no_segment(tmpfs) -> None:
    d = tmpfs(4)
    log = Log.open(d / "t-0", LogConfig(segment_index_bytes=256 * 1024))
    for i in range(3):
        log.append(_batch(i))
    fill(d)
    # the next segment wants 2 x 1.5 MiB of index, more than rolling frees: the roll fails
    log.config = LogConfig(segment_bytes=10_000, segment_index_bytes=1536 * 1024)
    with pytest.raises(LogOfflineError) as exc_info:
        log.append(_batch(3))
    cause = exc_info.value.__cause__
    assert isinstance(cause, StorageError) and cause.errno == errno.ENOSPC
    assert "index" in str(cause)
    assert [s.base_offset for s in log.segments] == [0]
    assert sorted(p.name for p in (d / "t-0").iterdir() if p.name[0] == "0") == [
        "00000000000000000000.index",
        "00000000000000000000.log",
        "00000000000000000000.timeindex",
    ]
    assert log.log_end_offset == 3 and _keys(log) == _expected(0, 3)
    # room again: the roll happens on the next try
    (d / "filler").unlink()
    log.offline_retry_ms = 0
    assert log.append(_batch(3)).first_offset == 3
    assert [s.base_offset for s in log.segments] == [0, 3]
    assert log.offline_reason is None and _keys(log) == _expected(0, 4)
    log.close()


def test_log_manager_shutdown_and_restart_on_a_full_disk(tmpfs, caplog) -> None:
    d = tmpfs(3)
    cfg = LogConfig(segment_bytes=200_000, segment_index_bytes=64 * 1024)
    manager = LogManager(d, default_config=cfg, background=False)
    log = manager.get_or_create_log("t", 0)
    n = 0
    with pytest.raises(LogOfflineError):
        while True:
            log.append(_batch(n, size=20_000))
            n += 1
    # offline for lack of room, but the files are what the log says: a clean shutdown
    assert log.offline_reason is not None and not log.needs_recovery
    assert manager.shutdown() is True
    assert (d / CLEAN_SHUTDOWN_FILE).exists()
    # closing trimmed every index (the preallocated room is gone), the checkpoints went out
    for p in (d / "t-0").iterdir():
        if p.suffix in (".index", ".timeindex"):
            assert os.path.getsize(p) < 1024, p
    assert (d / RECOVERY_POINT_CHECKPOINT).read_text().endswith(f"t 0 {n}\n")
    # the next start, disk still full, opens the log offline with every appended batch
    again = LogManager(d, default_config=cfg, background=False)
    assert again.had_clean_shutdown[d.resolve()] is True
    lg = again.get_log("t", 0)
    assert lg is not None and lg.log_end_offset == n
    assert lg.offline_reason is not None and "preallocate" in lg.offline_reason
    assert _keys(lg) == _expected(0, n)
    with pytest.raises(LogOfflineError):
        lg.append(_batch(n))
    assert again.shutdown() is True
    assert (d / CLEAN_SHUTDOWN_FILE).exists()
    assert "Traceback" not in caplog.text


def test_a_checkpoint_that_cannot_be_written_is_logged_once_and_blocks_the_marker(
    tmp_path: Path, caplog
) -> None:
    manager = LogManager(tmp_path, default_config=LogConfig(), background=False)
    manager.get_or_create_log("t", 0).append(_batch(1))
    # a directory where the checkpoint's .tmp goes: every write of it fails (EISDIR)
    (tmp_path / (RECOVERY_POINT_CHECKPOINT + ".tmp")).mkdir()
    with caplog.at_level(logging.ERROR, logger="logstore.storage"):
        assert manager.checkpoint() == {tmp_path.resolve()}
        assert manager.checkpoint() == {tmp_path.resolve()}
        assert manager.shutdown() is False
    errors = [r for r in caplog.records if RECOVERY_POINT_CHECKPOINT in r.getMessage()]
    assert len(errors) == 1, [r.getMessage() for r in errors]  # once for three failures
    assert "checkpoints not written" in caplog.text
    assert "Traceback" not in caplog.text
    assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()


def test_start_on_a_full_disk_opens_offline_and_recovers_later(tmpfs) -> None:
    d = tmpfs(4)
    cfg = LogConfig(segment_bytes=100_000, segment_index_bytes=256 * 1024)
    manager = LogManager(d, default_config=cfg, background=False)
    log = manager.get_or_create_log("t", 0)
    for i in range(30):
        log.append(_batch(i))
    assert manager.shutdown() is True
    fill(d)
    # clean start, no room to preallocate the active segment's indexes
    full = LogManager(d, default_config=cfg, background=False)
    lg = full.get_log("t", 0)
    assert lg is not None and lg.offline_reason is not None
    assert "preallocate" in lg.offline_reason
    assert _keys(lg) == _expected(0, 30)
    with pytest.raises(LogOfflineError):
        lg.append(_batch(30))
    # consistent on disk but the checkpoints cannot be written: no marker
    assert full.shutdown() is False
    assert not (d / CLEAN_SHUTDOWN_FILE).exists()
    # a start after a crash on a full disk, indexes to rebuild and no room to write them
    for p in (d / "t-0").iterdir():
        if p.suffix in (".index", ".timeindex"):
            p.unlink()
    fill(d, "filler2")  # the pages the index files held too
    crashed = LogManager(d, default_config=cfg, background=False)
    lg = crashed.get_log("t", 0)
    assert lg is not None and lg.offline_reason is not None
    assert "could not write its rebuilt indexes" in lg.offline_reason
    assert lg.log_end_offset == 30 and _keys(lg) == _expected(0, 30)
    assert lg.read(17, 1).first_offset == 17  # lookups scan without an index
    assert crashed.shutdown() is False
    # room again: the next start rebuilds everything and takes appends
    (d / "filler").unlink()
    (d / "filler2").unlink()
    ok = LogManager(d, default_config=cfg, background=False)
    lg = ok.get_log("t", 0)
    assert lg is not None and lg.offline_reason is None
    for seg in lg.segments:
        seg.sanity_check()
    assert len(lg.segments) > 1 and len(lg.segments[0].offset_index) > 0
    lg.append(_batch(30))
    assert _keys(lg) == _expected(0, 31)
    assert ok.shutdown() is True


def test_write_atomically_on_a_full_disk_keeps_the_old_file_and_leaves_no_tmp(tmpfs) -> None:
    """The one writer of checkpoints, topic configs, producer snapshots and cleaner manifests:
    a write the disk refuses leaves the previous contents whole and no ``.tmp`` behind; with
    room again the new contents replace them whole."""
    d = tmpfs(2)
    path = d / "recovery-point-offset-checkpoint"
    write_atomically(path, b"old\n")
    filler = fill(d)
    big = bytes(range(256)) * 4096  # 1 MiB: more than is left
    with pytest.raises(OSError) as info:
        write_atomically(path, big)
    assert info.value.errno == errno.ENOSPC
    assert path.read_bytes() == b"old\n"
    assert sorted(p.name for p in d.iterdir()) == sorted([path.name, filler.name])
    filler.unlink()
    write_atomically(path, big)
    assert path.read_bytes() == big
    assert not path.with_name(path.name + ".tmp").exists()
