"""Vacuum of what delta-rs 1.6's vacuum leaves behind: deletion vector and change-data files.

delta-rs's default ("lite") vacuum removes only the data files that ``remove`` actions name: the
deletion vector files of the topic tables (``<table>/dv/deletion_vector_<uuid>.bin``, written
by incremental compaction, :mod:`pipelines.delta.deletion_vectors`) and their change-data files
(``<table>/_change_data/...``) are never named there, so they pile up forever. Its "full"
vacuum is worse: it lists *every* file the current state does not name as a data file,
**live deletion vector files included** (deleting them would bring deleted rows back or make
the table unreadable), so it is never used.

:func:`vacuum_orphans` removes, with the same horizon as the data files, only what no version
still readable within the horizon needs:

- the versions kept: the one current at the horizon instant (the newest commit not newer than
  it, by commit file time, as Delta's timestamp time travel resolves it; at least the oldest
  version the log can still rebuild) and every later one;
- a deletion vector file is kept when a file of the first of those versions carries it, or an
  ``add``/``remove`` action of a later commit names it; a change-data file is kept when a
  ``cdc`` action of one of those commits names it;
- anything else goes once its own modification time is past the horizon too (a writer's file
  not yet committed is younger than that, as with Delta's vacuum: ``vacuum_hours = 0`` is only
  safe with no concurrent writer).

The table's files are listed through :class:`~logstore.objectstore.ObjectStore` (one
recursive listing, on local disk and on an object store alike: the ages are the store's own
modification times), *before* the log is read: a commit landing in between can only name
files already listed as live or files younger than the horizon. A store that fails mid-way
raises (``logstore.errors``); what was removed before stays removed (each file was
unneeded), and the next run removes the rest.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from logstore.errors import LoglakeError
from logstore.objectstore import LakeLocation, ObjectInfo, ObjectStore
from pipelines.delta.deletion_vectors import dv_relative_path
from pipelines.delta.files import table_location
from pipelines.delta.log import DeltaLog, LogListing

__all__ = ["dv_file_name", "vacuum_orphans"]

_DV_PREFIX = "deletion_vector_"
_CDC_DIR = "_change_data"


def dv_file_name(root: LakeLocation, descriptor: dict[str, Any] | None) -> str | None:
    """The key, relative to the table ``root``, of the file a deletion vector descriptor
    points to (``None``: inline, none, or a file outside the table)."""
    if not descriptor:
        return None
    kind, where = descriptor.get("storageType"), descriptor.get("pathOrInlineDv")
    if not where:
        return None
    if kind == "u":  # <prefix><z85 of the uuid>; a bad one raises (never taken as unused)
        return os.path.normpath(str(dv_relative_path(descriptor)))
    if kind == "p":  # an absolute path or URI
        try:
            return table_location(str(where)).relative_to(root)
        except (ValueError, LoglakeError):
            return None
    return None


def _first_kept(listing: LogListing, horizon: float) -> int:
    """The oldest version readable within the horizon (see the module docstring)."""
    commits, checkpoints = listing.commits, listing.checkpoints
    oldest = 0 if 0 in commits else min(checkpoints) if checkpoints else min(commits)
    at_horizon = [v for v, entry in commits.items() if entry.mtime <= horizon]
    return max(oldest, *at_horizon)


def _is_candidate(info: ObjectInfo) -> bool:
    parts = info.path.split("/")
    if parts[0] == "_delta_log":
        return False
    if parts[0] == _CDC_DIR:
        return True
    return parts[-1].startswith(_DV_PREFIX) and parts[-1].endswith(".bin")


def vacuum_orphans(
    path: str | Path | LakeLocation,
    *,
    vacuum_hours: float,
    now: float | None = None,
    dry_run: bool = False,
) -> list[str]:
    """Remove the deletion vector and change-data files no kept version needs (see the module
    docstring); returns them, relative to the table root."""
    root = table_location(path)
    store = ObjectStore(root)
    horizon = (time.time() if now is None else now) - vacuum_hours * 3600.0
    candidates = [o.path for o in store.list() if _is_candidate(o) and o.modified < horizon]
    if not candidates:
        return []
    log = DeltaLog(root, settings=store.settings)
    listing = log.listing()
    latest = listing.latest
    if latest is None:
        return []
    first = _first_kept(listing, horizon)
    keep: set[str] = set()
    for add in log.live_adds(first, listing):
        if (f := dv_file_name(root, add.get("deletionVector"))) is not None:
            keep.add(f)
    for v in range(first, latest + 1):
        if v not in listing.commits:
            continue
        for action in log.read_commit(v):
            for kind in ("add", "remove"):
                if kind in action and v > first:
                    f = dv_file_name(root, action[kind].get("deletionVector"))
                    if f is not None:
                        keep.add(f)
            if "cdc" in action:
                keep.add(os.path.normpath(unquote(action["cdc"]["path"])))
    removed = [key for key in candidates if key not in keep]
    if not dry_run:
        for key in removed:
            store.delete(key, missing_ok=True)
        if root.is_local:
            _remove_empty_dirs(root.local_path / _CDC_DIR)
    return sorted(removed)


def _remove_empty_dirs(top: Path) -> None:
    if not top.is_dir():
        return
    for d, _subdirs, _files in os.walk(top, topdown=False):
        if Path(d) != top:
            try:
                os.rmdir(d)
            except OSError:
                continue
