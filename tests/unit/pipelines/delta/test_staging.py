"""Run markers: the files of a write whose driver died go, a live writer's never do.

Liveness is real: markers name the pid of a real process (this one, a child that exited, or
this pid with another start time, as after pid reuse).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from pipelines.delta.staging import (
    STAGING_DIR,
    reap_crashed_writes,
    release_run_marker,
    write_run_marker,
)
from tests.conftest import ROOT


def _files(root: Path, write_id: str, n: int) -> list[Path]:
    out = []
    for i in range(n):
        p = root / "topic=t" / f"date=2024-0{i + 1}-01" / f"part-{i:05d}-{write_id}-0-c000.parquet"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x")
        out.append(p)
    return out


def _marker(root: Path, write_id: str, **fields: object) -> None:
    (root / STAGING_DIR).mkdir(parents=True, exist_ok=True)
    body = {"write_id": write_id, "host": socket.gethostname(), "started_at": time.time()}
    (root / STAGING_DIR / f"{write_id}.json").write_text(json.dumps({**body, **fields}))


def test_own_marker_written_then_released(tmp_path: Path) -> None:
    path = write_run_marker(tmp_path, "ab12")
    marker = json.loads(path.read_text())
    assert marker["pid"] == os.getpid() and marker["host"] == socket.gethostname()
    assert reap_crashed_writes(tmp_path) == 0 and path.exists()  # our own: alive
    release_run_marker(tmp_path, "ab12")
    assert not path.exists()


def test_dead_owner_files_removed_committed_and_unmarked_kept(tmp_path: Path) -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    dead = "d" * 32
    files = _files(tmp_path, dead, 3)
    _marker(tmp_path, dead, pid=child.pid, pid_start=1)
    # the dead run's commit landed for its first file before it died
    log = tmp_path / "_delta_log"
    log.mkdir()
    add = {"add": {"path": files[0].relative_to(tmp_path).as_posix(), "size": 1}}
    (log / "00000000000000000000.json").write_text(json.dumps(add) + "\n")
    unmarked = _files(tmp_path, "e" * 32, 1)  # a write without a marker: not ours to judge
    assert reap_crashed_writes(tmp_path) == 2
    assert [p.exists() for p in files] == [True, False, False]
    assert unmarked[0].exists()
    assert not (tmp_path / STAGING_DIR / f"{dead}.json").exists()
    assert reap_crashed_writes(tmp_path) == 0


def test_live_owner_kept_reused_pid_and_stale_other_host_reaped(tmp_path: Path) -> None:
    stat = Path(f"/proc/{os.getpid()}/stat").read_text()
    start = int(stat[stat.rindex(")") + 2 :].split()[19])
    live, reused, away, old = "1" * 32, "2" * 32, "3" * 32, "4" * 32
    for write_id in (live, reused, away, old):
        _files(tmp_path, write_id, 1)
    _marker(tmp_path, live, pid=os.getpid(), pid_start=start)
    _marker(tmp_path, reused, pid=os.getpid(), pid_start=start - 1)
    _marker(tmp_path, away, host="elsewhere.invalid", pid=1, pid_start=1)
    _marker(tmp_path, old, host="elsewhere.invalid", pid=1, started_at=time.time() - 90_000)
    assert reap_crashed_writes(tmp_path) == 2
    left = sorted(p.name.split("-")[2] for p in tmp_path.rglob("part-*"))
    assert left == sorted([live, away])
    assert sorted(p.stem for p in (tmp_path / STAGING_DIR).glob("*.json")) == sorted([live, away])


def test_a_killed_owner_not_yet_reaped_by_its_parent_is_dead(tmp_path: Path) -> None:
    child = subprocess.Popen(["sleep", "60"])
    try:
        stat = Path(f"/proc/{child.pid}/stat").read_text()
        start = int(stat[stat.rindex(")") + 2 :].split()[19])
        _files(tmp_path, "5" * 32, 1)
        _marker(tmp_path, "5" * 32, pid=child.pid, pid_start=start)
        assert reap_crashed_writes(tmp_path) == 0  # alive
        child.kill()
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child.pid}/stat").read_text().split(") ")[1][0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert reap_crashed_writes(tmp_path) == 1  # a zombie: its files go
    finally:
        child.kill()
        child.wait()


# --- locked markers: a real writer in another process (tests/fixtures/staging_writer.py) ---


def _start_writer(root: Path, write_id: str, *flags: str) -> tuple[subprocess.Popen[str], int]:
    """A write's driver in its own process; returns it and the pid its ``ready`` names."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fixtures.staging_writer", str(root), write_id, *flags],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("ready "), f"writer did not start (exit {proc.poll()})"
    return proc, int(line.split()[1])


def _write_files(root: Path, write_id: str) -> set[Path]:
    return set(root.rglob(f"part-*-{write_id}-*"))


def _rewrite_in_place(path: Path, **fields: object) -> None:
    """Change a marker's fields without replacing its file (its lock stays with it)."""
    body = {**json.loads(path.read_text()), **fields}
    with open(path, "r+", encoding="utf-8") as fh:
        fh.write(json.dumps(body))
        fh.truncate()


def _gone(pid: int) -> None:
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, f"process {pid} still there"
        time.sleep(0.01)


def test_a_live_writer_holding_its_lock_is_never_reaped_whatever_its_marker_says(
    tmp_path: Path,
) -> None:
    done = subprocess.Popen(["true"])
    done.wait()
    write_id = "6" * 32
    writer, _ = _start_writer(tmp_path, write_id)
    try:
        marker = tmp_path / STAGING_DIR / f"{write_id}.json"
        assert json.loads(marker.read_text())["lock"] == "flock"
        files = _write_files(tmp_path, write_id)
        assert files
        # its pid looks dead (an exited process) ...
        _rewrite_in_place(marker, pid=done.pid, pid_start=1)
        assert reap_crashed_writes(tmp_path) == 0
        # ... or it looks like another host's, long stale
        _rewrite_in_place(marker, host="elsewhere.invalid", started_at=0.0)
        assert reap_crashed_writes(tmp_path, stale_after_s=0.0) == 0
        assert _write_files(tmp_path, write_id) == files and marker.exists()
        _rewrite_in_place(marker, host=socket.gethostname())
    finally:
        writer.kill()
        writer.wait()
    # killed: its lock is free and its (recorded) pid dead, so the next reaper removes it all
    assert reap_crashed_writes(tmp_path) == len(files)
    assert not _write_files(tmp_path, write_id) and not marker.exists()
    assert not list((tmp_path / STAGING_DIR).iterdir())


def test_a_killed_driver_whose_files_are_still_written_is_not_reaped_until_they_stop(
    tmp_path: Path,
) -> None:
    """The driver killed, not yet reaped by its parent (a zombie: dead by its pid), while a
    process it started, holding its lock, still writes files of the write."""
    write_id = "7" * 32
    writer, lingering = _start_writer(tmp_path, write_id, "--linger")
    try:
        marker = tmp_path / STAGING_DIR / f"{write_id}.json"
        writer.kill()
        deadline = time.monotonic() + 10
        while Path(f"/proc/{writer.pid}/stat").read_text().split(") ")[1][0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        before = len(_write_files(tmp_path, write_id))
        assert reap_crashed_writes(tmp_path) == 0 and marker.exists()
        time.sleep(0.2)
        assert len(_write_files(tmp_path, write_id)) > before  # still being written
        os.kill(lingering, signal.SIGKILL)
        _gone(lingering)
        files = _write_files(tmp_path, write_id)
        assert reap_crashed_writes(tmp_path) == len(files)
        assert not _write_files(tmp_path, write_id) and not marker.exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(lingering, signal.SIGKILL)
        writer.kill()
        writer.wait()


_REAPER = """
import sys, time
from pathlib import Path
from pipelines.delta.staging import reap_crashed_writes
root, go = sys.argv[1:3]
print("waiting", flush=True)
while not Path(go).exists():
    time.sleep(0.0005)
print(reap_crashed_writes(root), flush=True)
"""


def test_two_reapers_at_once_one_removes_the_dead_write_the_other_nothing(
    tmp_path: Path,
) -> None:
    write_id = "8" * 32
    writer, _ = _start_writer(tmp_path, write_id)
    writer.kill()
    writer.wait()
    for i in range(3000):  # enough that the two reapers' work overlaps
        extra = tmp_path / f"part={i % 30}" / f"part-{i:05d}-{write_id}-0-c000.parquet"
        extra.parent.mkdir(exist_ok=True)
        extra.write_bytes(b"x")
    files = _write_files(tmp_path, write_id)
    go = tmp_path / "go"
    reapers = [
        subprocess.Popen(
            [sys.executable, "-c", _REAPER, str(tmp_path), str(go)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for r in reapers:
        assert r.stdout is not None and r.stdout.readline() == "waiting\n"
    go.touch()  # both are polling for it
    counts = sorted(int(r.communicate(timeout=120)[0]) for r in reapers)
    assert [r.returncode for r in reapers] == [0, 0]
    assert counts == [0, len(files)]  # one took the marker's lock, the other skipped it
    assert not _write_files(tmp_path, write_id)
    assert not (tmp_path / STAGING_DIR / f"{write_id}.json").exists()


def test_a_task_still_writing_keeps_its_dead_drivers_files_until_it_stops(
    tmp_path: Path,
) -> None:
    write_id = "a" * 32
    driver, _ = _start_writer(tmp_path, write_id)
    task, _ = _start_writer(tmp_path, write_id, "--task")  # its files are written
    try:
        driver.kill()
        driver.wait()
        files = _write_files(tmp_path, write_id)
        assert reap_crashed_writes(tmp_path) == 0  # the driver is dead, its task is not
        assert _write_files(tmp_path, write_id) == files
    finally:
        task.kill()
        task.wait()
    assert reap_crashed_writes(tmp_path) == len(files)
    assert not _write_files(tmp_path, write_id)


def _has_open(pid: int, path: Path) -> bool:
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(FileNotFoundError):
            if os.readlink(fd) == str(path):
                return True
    return False


def test_a_task_writes_nothing_once_its_write_is_reaped_or_over(tmp_path: Path) -> None:
    def task(write_id: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.fixtures.staging_writer", str(tmp_path), write_id,
             "--task"],
            cwd=ROOT, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    over = "b" * 32
    write_run_marker(tmp_path, over)
    release_run_marker(tmp_path, over)
    late = task(over)
    out, _ = late.communicate(timeout=60)
    assert late.returncode == 3 and "is gone" in out
    assert not _write_files(tmp_path, over)

    # a reaper holds the marker (reaping it) when the task starts: the task waits, then finds
    # the marker gone and writes nothing
    reaped = "c" * 32
    driver, _ = _start_writer(tmp_path, reaped)
    driver.kill()
    driver.wait()
    marker = tmp_path / STAGING_DIR / f"{reaped}.json"
    fd = os.open(marker, os.O_RDONLY)
    waiting: subprocess.Popen[str] | None = None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as reap_crashed_writes does
        written = _write_files(tmp_path, reaped)
        waiting = task(reaped)
        deadline = time.monotonic() + 60
        while not _has_open(waiting.pid, marker):  # it opened the marker: now it waits
            assert waiting.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.3)
        assert waiting.poll() is None  # waits for the reaper
        for path in written:
            path.unlink()
        marker.unlink()
        os.close(fd)  # the reaper is done
        fd = -1
        out, _ = waiting.communicate(timeout=60)
    finally:
        if fd >= 0:
            os.close(fd)
        if waiting is not None and waiting.poll() is None:
            waiting.kill()
            waiting.wait()
    assert waiting.returncode == 3 and "is gone" in out
    assert not _write_files(tmp_path, reaped)


def test_a_temporary_marker_left_by_a_killed_driver_goes_once_unlocked_and_old(
    tmp_path: Path,
) -> None:
    staging = tmp_path / STAGING_DIR
    staging.mkdir()
    old, fresh, held = (staging / f".{c * 32}.json.tmp" for c in "def")
    for path in (old, fresh, held):
        path.write_text("{")
    for path in (old, held):
        os.utime(path, (time.time() - 120, time.time() - 120))
    fd = os.open(held, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # a driver still creating its marker
        assert reap_crashed_writes(tmp_path) == 0
        assert not old.exists() and fresh.exists() and held.exists()
    finally:
        os.close(fd)
    assert reap_crashed_writes(tmp_path) == 0
    assert not held.exists() and fresh.exists()
