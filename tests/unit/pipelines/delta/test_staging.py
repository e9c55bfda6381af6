"""Run markers: the files of a write whose driver died go, a live writer's never do.

Liveness is real: markers name the pid of a real process (this one, a child that exited, or
this pid with another start time, as after pid reuse).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

from pipelines.delta.staging import (
    STAGING_DIR,
    reap_crashed_writes,
    release_run_marker,
    write_run_marker,
)


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
