"""LogManager: locks, loading, clean-shutdown marker, checkpoints, topic configs, deletion."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from logstore.errors import InvalidTopicError, LogDirLockedError
from logstore.protocol.records import build_batch
from logstore.storage.checkpoints import read_offset_checkpoint
from logstore.storage.dirlock import DirLock
from logstore.storage.log import LogConfig
from logstore.storage.log_manager import LogManager
from logstore.storage.scheduler import Scheduler
from logstore.storage.topic_config import read_topic_configs

CFG = LogConfig(segment_bytes=2000, index_interval_bytes=200, segment_index_bytes=4096)


def _batch(n: int = 2) -> bytearray:
    return build_batch([(b"k", b"v" * 100)] * n, base_timestamp=1000)


def test_second_manager_on_same_dir_is_refused(tmp_path: Path) -> None:
    mgr = LogManager(tmp_path, default_config=CFG, background=False)
    with pytest.raises(LogDirLockedError):
        LogManager(tmp_path, default_config=CFG, background=False)
    code = (
        "import sys\nfrom logstore.storage.dirlock import DirLock\n"
        "from logstore.errors import LogDirLockedError\n"
        f"try:\n    DirLock({str(tmp_path)!r}).acquire()\nexcept LogDirLockedError:\n"
        "    sys.exit(3)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], check=False, cwd=Path(__file__).parents[3])
    assert proc.returncode == 3  # another process is refused too
    mgr.shutdown()
    lock = DirLock(tmp_path)
    lock.acquire()  # released at shutdown
    lock.release()


def test_create_append_shutdown_reload(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    mgr = LogManager(dirs, default_config=CFG, background=False)
    logs = [mgr.get_or_create_log("orders", p) for p in range(4)]
    assert mgr.get_or_create_log("orders", 0) is logs[0]
    assert {mgr.log_dir_of("orders", p) for p in range(4)} == {d.resolve() for d in dirs}
    for lg in logs:
        for _ in range(30):
            lg.append(_batch())
        lg.high_watermark = lg.log_end_offset - 4
    logs[1].high_watermark = 60
    logs[1].delete_records(30)
    mgr.shutdown()
    for d in dirs:
        assert (d / ".kafka_cleanshutdown").exists()
    d0 = mgr.log_dir_of("orders", 1)
    assert d0 is not None
    assert read_offset_checkpoint(d0 / "recovery-point-offset-checkpoint")[("orders", 1)] == 60
    assert read_offset_checkpoint(d0 / "replication-offset-checkpoint")[("orders", 1)] == 60
    assert read_offset_checkpoint(d0 / "log-start-offset-checkpoint")[("orders", 1)] == 30

    again = LogManager(dirs, default_config=CFG, background=False)
    try:
        assert all(again.had_clean_shutdown.values())
        assert not any((d / ".kafka_cleanshutdown").exists() for d in dirs)  # deleted on load
        for p in range(4):
            lg = again.get_log("orders", p)
            assert lg is not None and lg.log_end_offset == 60
            assert lg.load_result.recovered_segments == []
        assert again.get_log("orders", 1).log_start_offset == 30  # type: ignore[union-attr]
        assert again.get_log("orders", 0).high_watermark == 56  # type: ignore[union-attr]
    finally:
        again.shutdown()


def test_missing_marker_means_recovery(tmp_path: Path) -> None:
    mgr = LogManager(tmp_path, default_config=CFG, background=False)
    lg = mgr.get_or_create_log("t", 0)
    for _ in range(5):
        lg.append(_batch())
    active = lg.segments[-1].path
    mgr.shutdown()
    (tmp_path / ".kafka_cleanshutdown").unlink()
    with open(active, "ab") as f:
        f.write(b"\x00" * 100)  # a tail that only recovery removes
    mgr2 = LogManager(tmp_path, default_config=CFG, background=False)
    lg2 = mgr2.get_log("t", 0)
    assert lg2 is not None
    assert lg2.load_result.recovered_segments == [s.base_offset for s in lg2.segments]
    assert lg2.load_result.truncated_bytes == 100 and lg2.log_end_offset == 10
    mgr2.shutdown()


def test_marker_present_skips_recovery(tmp_path: Path) -> None:
    mgr = LogManager(tmp_path, default_config=CFG, background=False)
    lg = mgr.get_or_create_log("t", 0)
    for _ in range(5):
        lg.append(_batch())
    mgr.shutdown()
    mgr2 = LogManager(tmp_path, default_config=CFG, background=False)
    lg2 = mgr2.get_log("t", 0)
    assert lg2 is not None and lg2.load_result.recovered_segments == []
    assert lg2.recovery_point == lg2.log_end_offset == 10
    mgr2.shutdown()


def test_topic_configs_persist_and_apply(tmp_path: Path) -> None:
    mgr = LogManager(tmp_path, default_config=CFG, background=False)
    cfg = mgr.set_topic_config("compacted", {"cleanup.policy": "compact", "segment.bytes": "5000"})
    assert cfg.compact and cfg.segment_bytes == 5000 and cfg.index_interval_bytes == 200
    lg = mgr.get_or_create_log("compacted", 0)
    assert lg.config == cfg
    mgr.shutdown()
    assert read_topic_configs(tmp_path) == {
        "compacted": {"cleanup.policy": "compact", "segment.bytes": "5000"}
    }
    mgr2 = LogManager(tmp_path, default_config=CFG, background=False)
    assert mgr2.get_log("compacted", 0).config == cfg  # type: ignore[union-attr]
    with pytest.raises(InvalidTopicError):
        mgr2.get_or_create_log("../escape", 0)
    mgr2.shutdown()


def test_delete_log_and_interrupted_delete(tmp_path: Path) -> None:
    mgr = LogManager(tmp_path, default_config=CFG, background=False)
    lg = mgr.get_or_create_log("gone", 0)
    lg.append(_batch())
    mgr.get_or_create_log("stays", 0).append(_batch())
    assert mgr.delete_log("gone", 0)
    assert not mgr.delete_log("gone", 0)
    assert not (tmp_path / "gone-0").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith("-delete")]
    mgr.shutdown()
    shutil.copytree(tmp_path / "stays-0", tmp_path / "stays-0.abcdef-delete")
    mgr2 = LogManager(tmp_path, default_config=CFG, background=False)
    assert [(lg.topic, lg.partition) for lg in mgr2.all_logs()] == [("stays", 0)]
    assert not (tmp_path / "stays-0.abcdef-delete").exists()
    mgr2.shutdown()


def test_flush_and_retention_tasks(tmp_path: Path) -> None:
    cfg = LogConfig(segment_bytes=1000, flush_ms=0, retention_ms=1000, file_delete_delay_ms=0)
    mgr = LogManager(tmp_path, default_config=cfg, background=False)
    lg = mgr.get_or_create_log("t", 0)
    for _ in range(20):
        lg.append(build_batch([(b"k", b"v" * 100)] * 2, base_timestamp=1000))
    lg.high_watermark = lg.log_end_offset
    assert mgr.flush_dirty_logs() == 1 and lg.recovery_point == lg.log_end_offset
    n = len(lg.segments)
    assert mgr.cleanup_logs(now_ms=1000 + 1001) == n - 1
    assert len(lg.segments) == 1
    mgr.shutdown()


def test_lake_bound_and_its_time_valve(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = LogConfig(segment_bytes=1000, retention_ms=1000, file_delete_delay_ms=0)
    mgr = LogManager(tmp_path, default_config=cfg, background=False)
    lg = mgr.get_or_create_log("t", 0)
    other = mgr.get_or_create_log("u", 0)
    internal = mgr.get_or_create_log("__internal", 0)
    for log_ in (lg, other, internal):
        for _ in range(20):
            log_.append(build_batch([(b"k", b"v" * 100)] * 2, base_timestamp=1000))
        log_.high_watermark = log_.log_end_offset
    bases = [s.base_offset for s in lg.segments]
    assert len(bases) > 4
    assert [s.base_offset for s in other.segments] == bases
    commits = {("t", 0): (bases[2] + 1, 5_000)}  # "u" has no commit yet: held from its start
    mgr.set_lake_bound(lambda t, p: commits.get((t, p)), max_ms=10_000)
    # the commit is 1 s old: segments holding offsets >= bases[2] + 1 stay; "u" keeps all;
    # Kafka's internal topics are never held
    assert mgr.cleanup_logs(now_ms=6_000) == 2 + len(bases) - 1
    assert [s.base_offset for s in lg.segments] == bases[2:]
    assert [s.base_offset for s in other.segments] == bases
    assert len(internal.segments) == 1
    assert "has not ingested" not in caplog.text
    # 10 s is not past max_ms; 10.001 s is: retained as in Kafka, with a WARN
    assert mgr.cleanup_logs(now_ms=15_000) == 0
    assert mgr.cleanup_logs(now_ms=15_001) == len(bases) - 3
    assert [s.base_offset for s in lg.segments] == bases[-1:]
    assert f"t-0: retention deletes offsets [{bases[2] + 1}, {bases[-1]})" in caplog.text
    assert "log.retention.lake.max.ms=10000" in caplog.text
    # "u" was first seen without an offset at 6 s: its valve opens 10 s later
    assert [s.base_offset for s in other.segments] == bases
    assert mgr.cleanup_logs(now_ms=16_000) == 0
    assert mgr.cleanup_logs(now_ms=16_001) == len(bases) - 1
    assert [s.base_offset for s in other.segments] == bases[-1:]
    assert f"u-0: retention deletes offsets [0, {bases[-1]})" in caplog.text
    assert "has committed no offset for it in the 10001 ms" in caplog.text
    mgr.shutdown()


def test_lake_bound_holds_a_partition_without_offset_until_the_first_commit(
    tmp_path: Path,
) -> None:
    cfg = LogConfig(segment_bytes=1000, retention_bytes=2000, file_delete_delay_ms=0)
    mgr = LogManager(tmp_path, default_config=cfg, background=False)
    lg = mgr.get_or_create_log("t", 0)
    for _ in range(20):
        lg.append(build_batch([(b"k", b"v" * 100)] * 2, base_timestamp=1000))
    lg.high_watermark = lg.log_end_offset
    bases = [s.base_offset for s in lg.segments]
    commits: dict[tuple[str, int], tuple[int, int]] = {}
    mgr.set_lake_bound(lambda t, p: commits.get((t, p)), max_bytes=-1, max_ms=-1)
    for now in (1_000, 10**9):  # no valve: held however long
        assert mgr.cleanup_logs(now_ms=now) == 0
    assert [s.base_offset for s in lg.segments] == bases
    # the first commit: size retention proceeds up to it, not past it
    commits[("t", 0)] = (bases[3], 10**9)
    assert mgr.cleanup_logs(now_ms=10**9) == 3
    assert [s.base_offset for s in lg.segments] == bases[3:]
    mgr.shutdown()
    # the size valve opens for a partition without an offset too
    cfg2 = LogConfig(segment_bytes=1000, retention_bytes=2000, file_delete_delay_ms=0)
    mgr2 = LogManager(tmp_path / "b", default_config=cfg2, background=False)
    lg2 = mgr2.get_or_create_log("t", 0)
    for _ in range(20):
        lg2.append(build_batch([(b"k", b"v" * 100)] * 2, base_timestamp=1000))
    lg2.high_watermark = lg2.log_end_offset
    mgr2.set_lake_bound(lambda t, p: None, max_bytes=3000, max_ms=-1)
    assert mgr2.cleanup_logs(now_ms=1_000) > 0
    assert sum(s.size for s in lg2.segments) <= 3000
    mgr2.shutdown()


def test_background_tasks_run_on_the_scheduler(tmp_path: Path) -> None:
    sched = Scheduler()
    sched.start()
    cfg = LogConfig(flush_ms=0)
    mgr = LogManager(
        tmp_path,
        default_config=cfg,
        scheduler=sched,
        flush_check_interval_ms=10,
        checkpoint_interval_ms=10,
    )
    lg = mgr.get_or_create_log("t", 0)
    lg.append(_batch())
    done = threading.Event()
    sched.schedule("probe", done.set, delay_ms=300)
    assert done.wait(10)
    assert lg.recovery_point == 2
    assert read_offset_checkpoint(tmp_path / "recovery-point-offset-checkpoint") == {("t", 0): 2}
    mgr.shutdown()
    sched.shutdown()


def test_scheduler_runs_in_order_and_survives_failures() -> None:
    sched = Scheduler()
    sched.start()
    seen: list[str] = []
    done = threading.Event()

    def boom() -> None:
        seen.append("boom")
        raise RuntimeError("task failure must not stop the scheduler")

    sched.schedule("b", lambda: seen.append("b"), delay_ms=40)
    sched.schedule("a", lambda: seen.append("a"), delay_ms=0)
    sched.schedule("x", boom, delay_ms=10)
    cancelled = sched.schedule("never", lambda: seen.append("never"), delay_ms=20)
    cancelled.cancel()
    sched.schedule("done", done.set, delay_ms=80)
    assert done.wait(10)
    assert seen == ["a", "boom", "b"]
    late: list[int] = []
    sched.schedule("late", lambda: late.append(1), delay_ms=60_000)
    sched.shutdown(run_pending=True)
    assert late == [1]
