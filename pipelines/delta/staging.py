"""Run markers: find and remove the data files of an earlier write whose driver was killed.

A write (:func:`pipelines.delta.direct.stage_files`) names every data file it produces with
its write id (``part-<task>-<write_id>-<attempt>-c<n>...``). Before any file is written, the
driver records a *run marker* ``<table>/_loglake_staging/<write_id>.json``: the write id, the
driver's host, pid and the pid's start time (``/proc/<pid>/stat``, so a reused pid is not
mistaken for the owner) and the start time. The marker is removed once the write committed
or aborted and its leftover files were removed. A marker that is still there when the next
write starts belongs to a write that is either still running or was killed.

:func:`reap_crashed_writes` (run by every write before its own marker) removes, for every
marker whose owner is dead — same host and the pid gone or reused, or (other hosts, where
liveness cannot be seen) a marker older than ``stale_after_s`` — the files of that write id
that no commit added (a run killed after its commit keeps its committed files; Delta's
``_delta_log`` is read for adds carrying the write id, only commits written since the marker),
then the marker. A live owner's marker and files are never touched, and files of writes
without a marker (other writers, writes older than this mechanism) neither.

Crash behaviour: the marker is written (tmp + rename) before any data file, and removed last,
so no file of a write exists without its marker. A reaper killed midway leaves the marker:
the next write finishes the job. Two reapers at once remove the same files (idempotent).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from pipelines.delta.files import cleanup_write_files

__all__ = [
    "STAGING_DIR",
    "reap_crashed_writes",
    "release_run_marker",
    "write_run_marker",
]

STAGING_DIR = "_loglake_staging"
# A marker of another host (whose pid cannot be checked) is stale after this long.
STALE_AFTER_S = 24 * 3600.0


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


def write_run_marker(root: str | Path, write_id: str) -> Path:
    """Record that this process is writing files of ``write_id`` under table ``root``."""
    directory = Path(root) / STAGING_DIR
    directory.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    marker = {
        "write_id": write_id,
        "host": socket.gethostname(),
        "pid": pid,
        "pid_start": _pid_start(pid),
        "started_at": time.time(),
    }
    path = directory / f"{write_id}.json"
    tmp = directory / f".{write_id}.json.tmp"
    tmp.write_text(json.dumps(marker), encoding="utf-8")
    os.replace(tmp, path)
    return path


def release_run_marker(root: str | Path, write_id: str) -> None:
    """The write is over (committed or aborted, leftovers removed): drop its marker."""
    (Path(root) / STAGING_DIR / f"{write_id}.json").unlink(missing_ok=True)


def _owner_dead(marker: dict[str, Any], now: float, stale_after_s: float) -> bool:
    if marker.get("host") == socket.gethostname():
        pid = int(marker.get("pid", -1))
        start = _pid_start(pid) if pid > 0 else None
        recorded = marker.get("pid_start")
        return start is None or (recorded is not None and start != recorded)
    return now - float(marker.get("started_at", now)) > stale_after_s


def _committed_paths(root: Path, write_id: str, since: float) -> set[str]:
    """Relative paths (as on disk) of the files of ``write_id`` that any commit since added."""
    log = root / "_delta_log"
    tag = f"-{write_id}-"
    out: set[str] = set()
    if not log.is_dir():
        return out
    from urllib.parse import unquote  # noqa: PLC0415

    for entry in os.scandir(log):
        if not entry.name.endswith(".json") or entry.stat().st_mtime < since - 60:
            continue
        with open(entry.path, encoding="utf-8") as fh:
            for line in fh:
                if tag not in line or '"add"' not in line:
                    continue
                action = json.loads(line)
                if "add" in action and tag in action["add"]["path"]:
                    out.add(unquote(action["add"]["path"]))
    return out


def reap_crashed_writes(root: str | Path, *, stale_after_s: float = STALE_AFTER_S) -> int:
    """Remove the uncommitted files of writes under ``root`` whose driver died; returns how
    many files were removed (see the module docstring)."""
    directory = Path(root) / STAGING_DIR
    if not directory.is_dir():
        return 0
    now = time.time()
    removed = 0
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if not entry.name.endswith(".json") or entry.name.startswith("."):
            continue
        try:
            marker = json.loads(Path(entry.path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # half-written by a live writer (tmp + rename makes this rare) or gone
        write_id = str(marker.get("write_id", ""))
        if not write_id or not all(c in "0123456789abcdef" for c in write_id):
            continue
        if not _owner_dead(marker, now, stale_after_s):
            continue
        keep = _committed_paths(Path(root), write_id, float(marker.get("started_at", 0)))
        removed += cleanup_write_files(root, write_id, keep=keep)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(entry.path)
    return removed
