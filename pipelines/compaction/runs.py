"""Run ownership: a run's owner marker, its leftovers, and the reaping of dead runs.

Moved unchanged out of ``table.py`` (``flock`` and pid markers under
``<table>/_compact_staging/``; the "Crash behaviour" section of
:mod:`pipelines.compaction.table` states the rules). What a dead run may not remove, every file
a version still in the Delta log names, comes from :class:`pipelines.delta.log.DeltaLog`.
These markers are to become the Delta engine's leases in the store (as ``delta/staging.py``'s
do), after which this module goes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from pipelines.compaction.layout import (
    CHANGE_DATA,
    STAGING,
    Log,
)
from pipelines.compaction.merge import TaskPlan
from pipelines.delta.deletion_vectors import DV_PREFIX
from pipelines.delta.files import WrittenFile, cleanup_write_files
from pipelines.delta.log import DeltaLog
from pipelines.delta.staging import _pid_start

__all__ = [
    "OWNER_STALE_AFTER_S",
    "OWNER_SUFFIX",
    "cleanup_run",
    "clear_stale_staging",
    "journal_dv_files",
    "owner_path",
    "reap_dead_runs",
    "take_ownership",
]


def clear_stale_staging(root: str, max_age_s: float = 24 * 3600) -> None:
    """Remove staging directories without an owner marker (runs from before the markers)
    that are older than ``max_age_s``; a marked run's directory goes with its marker
    (``reap_dead_runs``)."""
    base = os.path.join(root, STAGING)
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        return
    now = time.time()
    for name in names:
        path = os.path.join(base, name)
        if name.endswith(OWNER_SUFFIX) or os.path.exists(path + OWNER_SUFFIX):
            continue
        try:
            if now - os.stat(path).st_mtime > max_age_s:
                shutil.rmtree(path, ignore_errors=True)
        except FileNotFoundError:
            continue


# Owner markers (module docstring, "Crash behaviour"): ``<table>/_compact_staging/<write
# id>.owner``, created before the run writes anything, flock()ed by the driver for the run's
# life; JSON of the owner (host, pid, pid start time, start time) on its first line, then one
# line ``dv <file name>`` per deletion vector file the driver is about to move into ``dv/``.
OWNER_SUFFIX = ".owner"
# A marker of another host (whose pid cannot be checked) counts as dead after this long.
OWNER_STALE_AFTER_S = 24 * 3600.0
# A marker without its first line (its run died between creating and filling it).
_EMPTY_OWNER_GRACE_S = 60.0
_EXIT_WAIT_S = 10.0  # how long a dead driver's lock may outlive its pid (see _owner_dead)
_OWNED: dict[str, int] = {}  # write id -> the locked marker's descriptor (this process's runs)


def owner_path(root: str, write_id: str) -> str:
    return os.path.join(root, STAGING, write_id + OWNER_SUFFIX)


def take_ownership(root: str) -> str:
    """A new write id for a run on table ``root``, its marker created and locked."""
    base = os.path.join(root, STAGING)
    while True:
        write_id = uuid.uuid4().hex
        path = owner_path(root, write_id)
        os.makedirs(base, exist_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileNotFoundError:  # a reaper removed the empty staging dir meanwhile
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a reaper is looking at it (unfilled: it leaves it alone)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            os.close(fd)
            continue
        except OSError:
            pass  # no flock on this file system: the pid (this host) or the age decides
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # reaped before we locked it: start again
            os.close(fd)
            continue
        pid = os.getpid()
        owner = {
            "write_id": write_id,
            "host": socket.gethostname(),
            "pid": pid,
            "pid_start": _pid_start(pid),
            "started_at": time.time(),
        }
        os.write(fd, (json.dumps(owner) + "\n").encode())
        _OWNED[write_id] = fd
        return write_id


def journal_dv_files(plan: TaskPlan, merged: Sequence[str]) -> None:
    """Record in the run's marker the deletion vector files that the stage-2 results
    ``merged`` name, before the driver moves them into ``dv/`` (their names carry no write id:
    ``deletion_vector_<uuid>.bin``)."""
    names = [
        d for row in merged for r in json.loads(row)["reports"] for _p, _d, d in r.get("dv", [])
    ]
    if not names:
        return
    with open(owner_path(plan.root, plan.write_id), "a", encoding="utf-8") as fh:
        fh.write("".join(f"dv {os.path.basename(n)}\n" for n in names))
        fh.flush()
        os.fsync(fh.fileno())


def _journaled_dv_files(marker: str) -> list[str]:
    try:
        with open(marker, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        return []
    names = [line[3:] for line in lines[1:] if line.startswith("dv ")]
    return [n for n in names if n.startswith("deletion_vector_") and "/" not in n]


def _release_ownership(root: str, write_id: str) -> None:
    """The run is over and its leftovers removed: drop its staging dir and its marker."""
    shutil.rmtree(os.path.join(root, STAGING, write_id), ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(owner_path(root, write_id))
    fd = _OWNED.pop(write_id, None)
    if fd is not None:
        os.close(fd)
    with contextlib.suppress(OSError):  # other runs' markers still there
        os.rmdir(os.path.join(root, STAGING))


def _owner_dead(fd: int, marker: str, now: float) -> bool:
    """Whether the run of ``marker`` (opened as ``fd``) is provably dead; on True the caller
    holds its lock."""
    with open(marker, encoding="utf-8") as fh:
        first = fh.readline()
    try:
        owner = json.loads(first)
    except ValueError:
        owner = None  # not yet filled
    here = owner is not None and owner.get("host") == socket.gethostname()
    gone = here and _pid_gone(owner)
    # A killed process is gone (or a zombie) a moment before its files, and so its lock, are
    # released (its other threads are still exiting): wait for that, not for a live run.
    deadline = time.monotonic() + (_EXIT_WAIT_S if gone else 0.0)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False  # its run holds it (or another reaper does)
            time.sleep(0.05)
        except OSError:
            break  # no flock here: the pid or the age decides
    if owner is None:
        # its run died between creating and filling it, or is about to fill it (it checks
        # the marker is still there after locking it, and starts again if not)
        return now - os.fstat(fd).st_mtime > _EMPTY_OWNER_GRACE_S
    if here:
        return gone
    return now - float(owner.get("started_at", now)) > OWNER_STALE_AFTER_S


def _pid_gone(owner: Mapping[str, Any]) -> bool:
    """The marker's driver (on this host) has exited: its pid is gone, a zombie, or reused."""
    pid = int(owner.get("pid", -1))
    if pid == os.getpid() and owner.get("write_id") in _OWNED:
        return False  # a run of this very process (another thread)
    start = _pid_start(pid) if pid > 0 else None
    return start is None or start != owner.get("pid_start")


def reap_dead_runs(root: str, tomb_root: str, log: Log) -> None:
    """Remove what runs on table ``root`` whose driver died wrote (data, change-data and
    deletion vector files no version references, in the table and its tombstone table, and
    their staging), then their markers. A live run's files are never touched."""
    base = os.path.join(root, STAGING)
    try:
        names = sorted(os.listdir(base))
    except FileNotFoundError:
        return
    now = time.time()
    referenced: dict[str, set[str]] | None = None
    for name in names:
        write_id = name.removesuffix(OWNER_SUFFIX)
        if (
            name == write_id
            or len(write_id) != 32
            or not all(c in "0123456789abcdef" for c in write_id)
        ):
            continue
        marker = os.path.join(base, name)
        try:
            fd = os.open(marker, os.O_RDONLY)
        except FileNotFoundError:
            continue  # released meanwhile
        try:
            try:
                if not os.path.samestat(os.fstat(fd), os.stat(marker)):
                    continue  # reaped meanwhile
                if not _owner_dead(fd, marker, now):
                    continue
            except FileNotFoundError:
                continue
            if referenced is None:
                referenced = {r: DeltaLog(r).referenced_files() for r in (root, tomb_root)}
            removed = cleanup_write_files(root, write_id, keep=referenced[root])
            removed += cleanup_write_files(tomb_root, write_id, keep=referenced[tomb_root])
            for dv in _journaled_dv_files(marker):
                if os.path.join(DV_PREFIX, dv) not in referenced[root]:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(root, DV_PREFIX, dv))
                        removed += 1
            shutil.rmtree(os.path.join(base, write_id), ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(marker)
            log(f"removed {removed} files of run {write_id}, whose driver died before its end")
        finally:
            os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(base)


def cleanup_run(
    plan: TaskPlan,
    *,
    keep: Mapping[str, Sequence[WrittenFile]] | None = None,
    committed: bool = False,
) -> None:
    """Remove this run's files: after a failure, all of them that no version references (the
    tombstone table may have committed before the topic table's commit failed); after the
    run, the attempts' leftovers (all of them if it committed nothing). Then its staging and
    its owner marker: the run is over."""
    dvs = _journaled_dv_files(owner_path(plan.root, plan.write_id))
    if keep is None:
        referenced = DeltaLog(plan.root).referenced_files()
        cleanup_write_files(plan.root, plan.write_id, keep=referenced)
        if plan.tomb_root is not None:
            cleanup_write_files(
                plan.tomb_root, plan.write_id, keep=DeltaLog(plan.tomb_root).referenced_files()
            )
        for name in dvs:
            if os.path.join(DV_PREFIX, name) not in referenced:
                Path(plan.root, DV_PREFIX, name).unlink(missing_ok=True)
        _release_ownership(plan.root, plan.write_id)
        return
    if not committed:
        for name in dvs:
            Path(plan.root, DV_PREFIX, name).unlink(missing_ok=True)
    main = {unquote(f.path) for f in keep.get("main", [])} if committed else set()
    main |= (
        {f"{CHANGE_DATA}/{unquote(f.path)}" for f in keep.get("cdc", [])} if committed else set()
    )
    cleanup_write_files(plan.root, plan.write_id, keep=main)
    if plan.tomb_root is not None:
        tomb = {unquote(f.path) for f in keep.get("tomb", [])} if committed else set()
        cleanup_write_files(plan.tomb_root, plan.write_id, keep=tomb)
    _release_ownership(plan.root, plan.write_id)
