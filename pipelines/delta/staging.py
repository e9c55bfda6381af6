"""Run markers: find and remove the data files of an earlier write whose driver was killed.

A write (:func:`pipelines.delta.direct.stage_files`) names every data file it produces with
its write id (``part-<task>-<write_id>-<attempt>-c<n>...``). Before any file is written, the
driver records a *run marker* ``<table>/_loglake_staging/<write_id>.json``: the write id, the
driver's host, pid and the pid's start time (``/proc/<pid>/stat``, so a reused pid is not
mistaken for the owner), the start time and ``"lock": "flock"``. The driver holds a shared
``flock`` on the marker file itself from before it exists under its name (it is created as a
locked temporary file, then renamed) until the write committed or aborted, its leftover
files were removed and the marker unlinked (:func:`release_run_marker`). A marker that is
still there when the next write starts belongs to a write that is either still running or
was killed.

:func:`reap_crashed_writes` (run by every write before its own marker) takes, for every
marker, a non-blocking exclusive ``flock`` on it: if anyone holds the marker's lock (its
live driver, in this process or another, or another reaper), the marker and its files are
left alone, whatever its pid says. With the lock taken (and the marker checked to still be
the file under that name), the owner counts as dead when

* this host: its pid is gone, a zombie, or reused (another start time) — the lock alone is
  not trusted when the pid still runs (a file system that grants every ``flock``);
* another host: the marker is older than ``stale_after_s``. An ``flock`` is not reliable
  across hosts (a network file system may grant it locally only), so a free lock does not
  prove another host's driver dead; a held one still keeps its files;
* a marker without ``"lock"`` (written before the locks, or by an older version): the same
  pid and age rules, without the lock's protection (a killed driver whose threads still
  exit — a zombie pid — counts as dead).

The reaper then removes, still holding the lock, the files of that write id that no commit
added (a run killed after its commit keeps its committed files; Delta's ``_delta_log`` is
read for adds carrying the write id, only commits written since the marker), then the
marker. Files of writes without a marker (other writers, writes older than this mechanism)
are never touched.

The write's tasks (``stage_files``' task writer, the ``loglake_delta`` sink's when
``write_delta`` chose the write id) share the marker's lock while they write
(:func:`hold_run_marker`, a shared ``flock``): a task that still runs after its driver died
keeps the write's files from any reaper on its host until it stops. A task that finds the
marker gone (the write is over, or was reaped; it waits while a reaper holds the lock) writes
nothing and fails. Tasks on other hosts are covered only as far as ``flock`` works there (a
cluster kills them with the driver; VACUUM removes any file left).

Crash behaviour: the marker is in place (locked) before any data file and removed last, so no
file of a write exists without its marker. A driver killed while creating its marker leaves
at most a temporary ``.<write_id>.json.tmp``, which a reaper removes once its lock is free and
it is a minute old. A reaper killed midway leaves the marker (its lock goes with the reaper):
the next write finishes the job. Two reapers at once: one takes the marker's lock, the other
skips it (or finds it gone once it gets the lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from pipelines.delta.errors import DeltaSinkError
from pipelines.delta.files import cleanup_write_files
from pipelines.delta.log import DeltaLog

__all__ = [
    "STAGING_DIR",
    "hold_run_marker",
    "reap_crashed_writes",
    "release_run_marker",
    "write_run_marker",
]

STAGING_DIR = "_loglake_staging"
# A marker of another host (whose pid cannot be checked) is stale after this long.
STALE_AFTER_S = 24 * 3600.0
# A temporary marker (its driver killed between creating and renaming it) goes after this long.
_TMP_GRACE_S = 60.0
# How long a task waits for a reaper that holds its write's marker (checking it, or reaping it).
_TASK_LOCK_WAIT_S = 300.0
# Markers of this process's writes, by path: the descriptor holding the marker's lock.
_HELD: dict[str, int] = {}


def _pid_start(pid: int) -> int | None:
    """The start time (clock ticks since boot) of process ``pid``; None if it does not exist
    or is a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # field 2 (comm) may hold spaces and parentheses: split after the last ')'
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None  # killed, not yet reaped by its parent: dead all the same
    return int(fields[19])  # field 22 of the whole line


def _marker_path(root: str | Path, write_id: str) -> Path:
    return Path(root) / STAGING_DIR / f"{write_id}.json"


def write_run_marker(root: str | Path, write_id: str) -> Path:
    """Record that this process is writing files of ``write_id`` under table ``root``; the
    marker stays locked (shared ``flock``) by this process until :func:`release_run_marker`."""
    directory = Path(root) / STAGING_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = _marker_path(root, write_id)
    tmp = directory / f".{write_id}.json.tmp"
    pid = os.getpid()
    marker = {
        "write_id": write_id,
        "host": socket.gethostname(),
        "pid": pid,
        "pid_start": _pid_start(pid),
        "started_at": time.time(),
        "lock": "flock",
    }
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        # Locked before it has its name: no reaper can find the marker with its lock free.
        with contextlib.suppress(OSError):  # no flock here: the pid or the age decides
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        os.write(fd, json.dumps(marker).encode())
        os.replace(tmp, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    old = _HELD.pop(str(path), None)
    if old is not None:  # the same write id marked twice: keep the newer marker's lock
        os.close(old)
    _HELD[str(path)] = fd
    return path


def release_run_marker(root: str | Path, write_id: str) -> None:
    """The write is over (committed or aborted, leftovers removed): drop its marker, then its
    lock (in that order: a reaper that gets the lock then finds no marker)."""
    path = _marker_path(root, write_id)
    path.unlink(missing_ok=True)
    fd = _HELD.pop(str(path), None)
    if fd is not None:
        os.close(fd)


@contextlib.contextmanager
def hold_run_marker(root: str | Path, write_id: str) -> Iterator[None]:
    """In a task writing files of ``write_id`` under ``root``: share its driver's lock on the
    write's marker while the files are written, so that no reaper deems the write dead while
    this task still writes (even if its driver died). Raises ``DeltaSinkError`` (and the task
    writes nothing) when the marker is gone — the write is over, or its driver died and a
    reaper removed its files."""
    path = _marker_path(root, write_id)
    gone = DeltaSinkError(
        f"run marker {path} is gone: write {write_id} is over or its driver died;"
        " this task writes none of its files",
        path=str(root),
    )
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise gone from None
    try:
        deadline = time.monotonic() + _TASK_LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                break
            except BlockingIOError:  # a reaper checks it (and lets go) or reaps it (unlinks it)
                if time.monotonic() >= deadline:
                    raise DeltaSinkError(
                        f"run marker {path} stayed locked by a reaper for"
                        f" {_TASK_LOCK_WAIT_S:.0f} s",
                        path=str(root),
                    ) from None
                time.sleep(0.05)
            except OSError:
                break  # no flock on this file system
        try:
            if not os.path.samestat(os.fstat(fd), os.stat(path)):
                raise gone
        except FileNotFoundError:
            raise gone from None
        yield
    finally:
        os.close(fd)


def _pid_dead(marker: dict[str, Any]) -> bool:
    """The marker's driver (on this host) is gone, a zombie, or its pid was reused."""
    pid = int(marker.get("pid", -1))
    start = _pid_start(pid) if pid > 0 else None
    recorded = marker.get("pid_start")
    return start is None or (recorded is not None and start != recorded)


def _owner_dead(marker: dict[str, Any], now: float, stale_after_s: float) -> bool:
    """Whether the marker's driver is dead, its lock (if any) already taken by the caller."""
    if marker.get("host") == socket.gethostname():
        return _pid_dead(marker)
    return now - float(marker.get("started_at", now)) > stale_after_s


def _lock(fd: int) -> bool:
    """Take the exclusive lock of a marker; False if someone holds it (its live driver or
    another reaper). True as well on a file system without ``flock`` (the rules decide)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        pass  # no flock on this file system
    return True


def _committed_paths(root: Path, write_id: str, since: float) -> set[str]:
    """Relative paths (as on disk) of the files of ``write_id`` that any commit since added."""
    log = DeltaLog(root)
    tag = f"-{write_id}-"
    out: set[str] = set()
    for version, entry in log.listing().commits.items():
        if entry.mtime < since - 60:
            continue
        for action in log.read_commit(version):
            if "add" in action and tag in action["add"]["path"]:
                out.add(unquote(action["add"]["path"]))
    return out


def _is_write_id(text: str) -> bool:
    return bool(text) and all(c in "0123456789abcdef" for c in text)


def _reap_one(root: Path, path: str, now: float, stale_after_s: float) -> int:
    """Reap the write of marker ``path`` if its driver is dead; the files removed."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return 0  # released or reaped meanwhile
    try:
        if not _lock(fd):
            return 0  # its driver lives (or another reaper is at it)
        try:
            if not os.path.samestat(os.fstat(fd), os.stat(path)):
                return 0  # reaped meanwhile, and the name reused
        except FileNotFoundError:
            return 0  # released (or reaped) before we got its lock
        with os.fdopen(os.dup(fd), encoding="utf-8") as fh:
            try:
                marker = json.loads(fh.read())
            except ValueError:
                return 0  # not a marker of ours
        write_id = Path(path).name.removesuffix(".json")
        if not isinstance(marker, dict) or marker.get("write_id") != write_id:
            return 0  # not a marker of ours
        if not _owner_dead(marker, now, stale_after_s):
            return 0
        keep = _committed_paths(root, write_id, float(marker.get("started_at", 0)))
        removed = cleanup_write_files(root, write_id, keep=keep)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return removed
    finally:
        os.close(fd)  # the lock goes with it


def _reap_tmp(path: str, now: float) -> None:
    """Remove a temporary marker whose driver died before renaming it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        if _lock(fd) and now - os.fstat(fd).st_mtime > _TMP_GRACE_S:
            with contextlib.suppress(FileNotFoundError):
                if os.path.samestat(os.fstat(fd), os.stat(path)):
                    os.unlink(path)
    finally:
        os.close(fd)


def reap_crashed_writes(root: str | Path, *, stale_after_s: float = STALE_AFTER_S) -> int:
    """Remove the uncommitted files of writes under ``root`` whose driver died; returns how
    many files were removed (see the module docstring)."""
    directory = Path(root) / STAGING_DIR
    if not directory.is_dir():
        return 0
    now = time.time()
    removed = 0
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        name = entry.name
        if name.startswith(".") and name.endswith(".json.tmp"):
            if _is_write_id(name[1 : -len(".json.tmp")]):
                _reap_tmp(entry.path, now)
        elif name.endswith(".json") and _is_write_id(name[: -len(".json")]):
            removed += _reap_one(Path(root), entry.path, now, stale_after_s)
    return removed
