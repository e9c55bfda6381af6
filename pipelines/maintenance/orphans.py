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

The files on disk are listed *before* the log is read: a commit landing in between can only
name files already listed as live or files younger than the horizon.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pipelines.delta.deletion_vectors import dv_relative_path
from pipelines.delta.log import DeltaLog, LogListing

__all__ = ["dv_file_name", "vacuum_orphans"]

_DV_GLOB = "deletion_vector_*.bin"
_CDC_DIR = "_change_data"


def dv_file_name(root: Path, descriptor: dict[str, Any] | None) -> Path | None:
    """The file a deletion vector descriptor points to (``None``: inline or none)."""
    if not descriptor:
        return None
    kind, where = descriptor.get("storageType"), descriptor.get("pathOrInlineDv")
    if not where:
        return None
    if kind == "u":  # <prefix><z85 of the uuid>; a bad one raises (never taken as unused)
        return (root / str(dv_relative_path(descriptor))).resolve()
    if kind == "p":
        return Path(where.removeprefix("file://")).resolve()
    return None


def _first_kept(listing: LogListing, horizon: float) -> int:
    """The oldest version readable within the horizon (see the module docstring)."""
    commits, checkpoints = listing.commits, listing.checkpoints
    oldest = 0 if 0 in commits else min(checkpoints) if checkpoints else min(commits)
    at_horizon = [v for v, entry in commits.items() if entry.mtime <= horizon]
    return max(oldest, *at_horizon)


def _old_files(paths: list[Path], horizon: float) -> list[Path]:
    out = []
    for p in paths:
        try:
            if p.stat().st_mtime < horizon:
                out.append(p)
        except FileNotFoundError:
            continue
    return out


def vacuum_orphans(
    path: str | Path, *, vacuum_hours: float, now: float | None = None, dry_run: bool = False
) -> list[str]:
    """Remove the deletion vector and change-data files no kept version needs (see the module
    docstring); returns them, relative to the table root."""
    root = Path(path).resolve()
    horizon = (time.time() if now is None else now) - vacuum_hours * 3600.0
    dv_files = [p.resolve() for p in root.rglob(_DV_GLOB) if "_delta_log" not in p.parts]
    cdc_dir = root / _CDC_DIR
    cdc_files = [p.resolve() for p in cdc_dir.rglob("*") if p.is_file()] if cdc_dir.is_dir() else []
    candidates = _old_files(dv_files, horizon) + _old_files(cdc_files, horizon)
    if not candidates:
        return []
    log = DeltaLog(root)
    listing = log.listing()
    latest = listing.latest
    if latest is None:
        return []
    first = _first_kept(listing, horizon)
    keep: set[Path] = set()
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
                keep.add((root / _unquote(action["cdc"]["path"])).resolve())
    removed: list[str] = []
    for p in candidates:
        if p in keep:
            continue
        if not dry_run:
            try:
                p.unlink()
            except FileNotFoundError:
                continue
        removed.append(str(p.relative_to(root)))
    if not dry_run:
        _remove_empty_dirs(cdc_dir)
    return sorted(removed)


def _unquote(rel: str) -> str:
    from urllib.parse import unquote  # noqa: PLC0415

    return unquote(rel)


def _remove_empty_dirs(top: Path) -> None:
    if not top.is_dir():
        return
    for d, _subdirs, _files in os.walk(top, topdown=False):
        if Path(d) != top:
            try:
                os.rmdir(d)
            except OSError:
                continue
