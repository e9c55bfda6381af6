"""The one reader of a table's Delta log, on local disk and object storage alike.

A table's log is ``<table>/_delta_log/``: JSON commits ``<version:020d>.json`` (one action per
line: ``add``, ``remove``, ``cdc``, ``txn``, ``commitInfo``, ``metaData``, ``protocol``) and
classic checkpoints ``<version:020d>.checkpoint[.<part>.<parts>].parquet`` (the state at that
version, one action per row). The snapshot at version ``v`` is the newest checkpoint at or
below ``v``, then the JSON commits after it up to ``v``. Every job reads it through
:class:`DeltaLog`; nothing else in ``pipelines/`` opens ``_delta_log``.

What delta-rs answers (through :meth:`DeltaLog.table`, with the location's
``storage_options``): the table at a version (``DeltaTable``, ``load_as_version``), one app's
transaction version (``transaction_version``), commit infos (``history``, with loglake's own
``commitInfo`` keys). What it cannot, so this module replays the log itself (the same rule:
the newest checkpoint, then the commits after it):

- **live add actions as the log holds them** (:meth:`DeltaLog.live_adds`): deltalake 1.6's
  ``get_add_actions`` gives neither the deletion-vector descriptor (a ``remove`` of a file
  with a vector must name it) nor the ``stats`` JSON and ``modificationTime`` a re-add keeps;
- **every app id's transaction version** (:meth:`DeltaLog.app_transactions`): delta-rs answers
  only for an app id one already knows;
- **every file any version names** (:meth:`DeltaLog.referenced_files`): a reaper of dead runs
  must keep what time travel may still read, removed files and change-data files included;
- **the versions present** (:meth:`DeltaLog.listing`: commits and checkpoints, with their
  modification times) for vacuum's horizon.

Reads go through :class:`logstore.objectstore.ObjectStore` (retries, errors from the
``logstore.errors`` tree). A reader never writes; a commit landing while it reads is either
seen whole or not at all (a commit file appears atomically: put-if-absent). A log being
cleaned up concurrently (old commits deleted after a checkpoint) may make a replay that
listed a commit fail with ``ObjectNotFoundError``: re-read. Thread-safe: no shared state.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from logstore.objectstore import LakeLocation, ObjectStore, StorageSettings
from pipelines.delta.deletion_vectors import dv_relative_path

__all__ = [
    "LOG_DIR",
    "DeltaLog",
    "LogEntry",
    "LogListing",
    "dv_descriptor_id",
    "open_log",
]

LOG_DIR = "_delta_log"
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.\d{10}\.\d{10})?\.parquet$")
_COMMIT = re.compile(r"^(\d{20})\.json$")
_HISTORY_FIRST_PAGE = 4


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One file of ``_delta_log``: its key below the table root and modification time (s)."""

    key: str
    mtime: float


@dataclass(frozen=True)
class LogListing:
    """The versions present in a log: commit files by version, checkpoint parts by version."""

    commits: dict[int, LogEntry] = field(default_factory=dict)
    checkpoints: dict[int, list[LogEntry]] = field(default_factory=dict)

    @property
    def latest(self) -> int | None:
        """The newest version the log holds (commit or checkpoint), None when empty."""
        versions = [*self.commits, *self.checkpoints]
        return max(versions) if versions else None

    def replay_from(self, version: int) -> tuple[int, list[LogEntry], list[int]]:
        """How to rebuild ``version``: the newest checkpoint at or below it (-1: none), its
        parts, and the commit versions after it up to ``version``, ascending."""
        start = max((v for v in self.checkpoints if v <= version), default=-1)
        parts = sorted(self.checkpoints.get(start, []), key=lambda e: e.key)
        commits = sorted(v for v in self.commits if start < v <= version)
        return start, parts, commits


def dv_descriptor_id(descriptor: Mapping[str, Any] | None) -> str | None:
    """A deletion vector's unique id (with the path, it names a file in the table's state,
    the Delta protocol's rule), None for none."""
    if not descriptor or descriptor.get("storageType") is None:
        return None
    offset = descriptor.get("offset")
    suffix = f"@{offset}" if offset is not None else ""
    return f"{descriptor['storageType']}{descriptor['pathOrInlineDv']}{suffix}"


class DeltaLog:
    """The log of the table at ``location`` (a local path or an object-store URI)."""

    def __init__(
        self, location: str | Path | LakeLocation, *, settings: StorageSettings | None = None
    ) -> None:
        if isinstance(location, LakeLocation):
            self.location = location
        elif isinstance(location, Path) or "://" not in str(location):
            # a local path as callers hold it (``a/../b`` included: normalised, not refused)
            self.location = LakeLocation.parse(os.path.abspath(location))
        else:
            self.location = LakeLocation.parse(location)
        self.store = ObjectStore(self.location, settings=settings)

    def __repr__(self) -> str:
        return f"DeltaLog({self.location.uri!r})"

    @property
    def uri(self) -> str:
        """The table's URI as delta-rs takes it (a plain path on local disk)."""
        return self.location.uri

    @property
    def storage_options(self) -> dict[str, str]:
        """delta-rs ``storage_options`` for this table (empty on local disk)."""
        return self.store.settings.delta_options(self.location)

    # ---- delta-rs ----

    def table(self, version: int | None = None) -> DeltaTable | None:
        """The table at ``version`` (latest when None) read by delta-rs, None when there is no
        Delta table here."""
        try:
            return DeltaTable(
                self.uri, version=version, storage_options=self.storage_options or None
            )
        except TableNotFoundError:
            return None

    def commit_infos(self, dt: DeltaTable | None = None) -> Iterator[dict[str, Any]]:
        """The ``commitInfo`` of each commit, newest first, each with its ``version``
        (delta-rs's ``history``, fetched in growing pages so that a caller stopping at the
        newest commit reads only a few)."""
        dt = dt if dt is not None else self.table()
        if dt is None:
            return
        seen = dt.version() + 1
        limit = _HISTORY_FIRST_PAGE
        while seen > 0:
            page = dt.history(limit=limit)
            for info in page:
                version = int(info["version"])
                if version < seen:
                    seen = version
                    yield info
            if len(page) < limit:
                return
            limit *= 4

    # ---- the log's files ----

    def listing(self) -> LogListing:
        """The commits and checkpoints present (empty when there is no log). One listing of
        the store's filesystem, for the modification times that come with it on disk and on S3
        (``ObjectStore.list`` gives none); unlike the store's operations it is not retried."""
        base = self.location.join(LOG_DIR)
        selector = pafs.FileSelector(base.fs_path, recursive=False, allow_not_found=True)
        out = LogListing()
        for info in self.store.filesystem.get_file_info(selector):
            if info.type != pafs.FileType.File:
                continue
            name = info.base_name
            mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
            entry = LogEntry(f"{LOG_DIR}/{name}", mtime)
            if m := _COMMIT.match(name):
                out.commits[int(m.group(1))] = entry
            elif m := _CHECKPOINT.match(name):
                out.checkpoints.setdefault(int(m.group(1)), []).append(entry)
        return out

    def read_commit(self, version: int) -> list[dict[str, Any]]:
        """The actions of commit ``version`` (its JSON lines), in file order."""
        data = self.store.read(f"{LOG_DIR}/{version:020d}.json")
        return [json.loads(line) for line in data.splitlines() if line.strip()]

    def _checkpoint_column(self, part: LogEntry, column: str) -> list[dict[str, Any] | None]:
        source = pa.BufferReader(self.store.read(part.key))
        if column not in pq.read_schema(source).names:
            return []
        table = pq.read_table(source, columns=[column])
        rows: list[dict[str, Any] | None] = table.column(column).to_pylist()
        return rows

    # ---- snapshots replayed here (see the module docstring for why) ----

    def live_adds(self, version: int, listing: LogListing | None = None) -> list[dict[str, Any]]:
        """The ``add`` actions of the table's files at ``version``, as the log holds them
        (``path`` URI-encoded, ``partitionValues`` a dict, ``stats`` JSON text,
        ``deletionVector`` the descriptor or None)."""
        start, parts, commits = (listing or self.listing()).replay_from(version)
        files: dict[tuple[str, str | None], dict[str, Any]] = {}
        for part in parts:
            for add in self._checkpoint_column(part, "add"):
                if add is None or add.get("path") is None:
                    continue
                pv = add.get("partitionValues")
                if isinstance(pv, list):  # a map column reads as (key, value) pairs
                    add["partitionValues"] = dict(pv)
                dv = add.get("deletionVector")
                add["deletionVector"] = (
                    {k: v for k, v in dv.items() if v is not None}
                    if dv and dv.get("storageType") is not None
                    else None
                )
                files[(add["path"], dv_descriptor_id(add["deletionVector"]))] = add
        del start
        for v in commits:
            for action in self.read_commit(v):
                if "add" in action:
                    add = action["add"]
                    files[(add["path"], dv_descriptor_id(add.get("deletionVector")))] = add
                elif "remove" in action:
                    rm = action["remove"]
                    files.pop((rm["path"], dv_descriptor_id(rm.get("deletionVector"))), None)
        return list(files.values())

    def app_transactions(self) -> dict[str, int]:
        """Every app id's latest transaction version (empty: no table)."""
        listing = self.listing()
        latest = listing.latest
        if latest is None:
            return {}
        _start, parts, commits = listing.replay_from(latest)
        txns: dict[str, int] = {}
        for part in parts:
            for row in self._checkpoint_column(part, "txn"):
                if row is not None and row.get("appId") is not None:
                    txns[row["appId"]] = int(row["version"])
        for v in commits:
            for action in self.read_commit(v):
                if "txn" in action:
                    txns[action["txn"]["appId"]] = int(action["txn"]["version"])
        return txns

    def referenced_files(self) -> set[str]:
        """Every file (relative to the table root, decoded as stored) that any version still
        in the log names: adds, removes, change-data files and deletion vector files stored
        beside the table (time travel may read any of them)."""
        out: set[str] = set()

        def note(action: Mapping[str, Any] | None) -> None:
            if not action or not action.get("path"):
                return
            out.add(unquote(str(action["path"])))
            try:
                dv = dv_relative_path(action.get("deletionVector"))
            except ValueError:
                dv = None  # not a valid descriptor: nothing of ours
            if dv is not None:
                out.add(dv)

        listing = self.listing()
        for v in sorted(listing.commits):
            for action in self.read_commit(v):
                for kind in ("add", "remove", "cdc"):
                    note(action.get(kind))
        for parts in listing.checkpoints.values():
            for part in parts:
                for kind in ("add", "remove"):
                    for row in self._checkpoint_column(part, kind):
                        note(row)
        return out


def open_log(
    location: str | Path | LakeLocation, *, settings: StorageSettings | None = None
) -> DeltaLog:
    """The log of the table at ``location`` (settings from the environment unless given)."""
    return DeltaLog(location, settings=settings)
