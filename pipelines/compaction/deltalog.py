"""One Delta commit with adds, removes, change-data files and app transactions, written directly.

Why not delta-rs's ``create_write_transaction``: deltalake 1.6's Python API takes only add and
remove actions, so a merge committed through it carries no ``cdc`` actions and a change-data
reader would see every rewritten file as all-deleted then all-inserted. This module writes the
commit file itself, as the Delta protocol specifies for a local file system: the actions as
JSON lines in ``_delta_log/<version:020d>.json``, created with put-if-absent semantics (a tmp
file hard-linked to the final name: ``link`` fails if the name exists, so two writers can never
both create one version). Readers (delta-rs, Spark, polars) see the commit like any other.

Checks (what ``pipelines.delta.commit`` checks for its own commits): the table is still at the
version the write read (else ``ConcurrentWriteError``: the removes were chosen from that
snapshot); app transactions never go backwards and, all already present, make the commit a
no-op (``check_app_transactions``). Every 100th version a checkpoint is written with delta-rs.

Crash behaviour: before the link nothing is visible; the link is the commit. A stray tmp file
in ``_delta_log`` (name starting with ``.tmp-``) is ignored by readers.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from pipelines.delta.commit import check_app_transactions, load_table
from pipelines.delta.errors import ConcurrentWriteError, DeltaSinkError

__all__ = ["CdcFile", "FileRef", "commit_actions"]

CHECKPOINT_INTERVAL = 100


@dataclass(frozen=True)
class FileRef:
    """A data file as an add/remove action names it (``path`` relative, URI-encoded)."""

    path: str
    size: int
    partition_values: dict[str, str | None]
    stats: str | None = None
    modification_time: int = 0
    data_change: bool = True


@dataclass(frozen=True)
class CdcFile:
    """A change-data file (``_change_data/...``) of the commit."""

    path: str
    size: int
    partition_values: dict[str, str | None]


def commit_actions(
    root: str | Path,
    *,
    read_version: int,
    adds: Sequence[FileRef] = (),
    removes: Sequence[FileRef] = (),
    cdc: Sequence[CdcFile] = (),
    app_transactions: Mapping[str, int] | None = None,
    expected_versions: Mapping[str, int | None] | None = None,
    metadata: dict[str, Any] | None = None,
    operation: str = "MERGE",
    operation_parameters: Mapping[str, Any] | None = None,
) -> int | None:
    """Commit the actions as version ``read_version + 1``; returns it, or None for a no-op.

    ``metadata``: a replacement ``metaData`` action (e.g. new table configuration).
    """
    table = str(root)
    dt: DeltaTable | None = load_table(table)
    if dt is None:
        raise DeltaSinkError("no Delta table here", path=table)
    if dt.version() != read_version:
        raise ConcurrentWriteError(
            f"the table moved from version {read_version} to {dt.version()} during this run "
            "(another writer?); nothing committed, re-run",
            path=table,
        )
    apps = {str(k): int(v) for k, v in (app_transactions or {}).items()}
    if not check_app_transactions(dt, apps, expected_versions):
        return None
    now = int(time.time() * 1000)
    lines: list[dict[str, Any]] = [
        {
            "commitInfo": {
                "timestamp": now,
                "operation": operation,
                "operationParameters": dict(operation_parameters or {}),
                "readVersion": read_version,
                "isBlindAppend": not removes,
                "engineInfo": "loglake-compaction",
                "clientVersion": "loglake",
            }
        }
    ]
    if metadata is not None:
        lines.append({"metaData": metadata})
    lines += [{"txn": {"appId": a, "version": v, "lastUpdated": now}} for a, v in apps.items()]
    lines += [
        {
            "remove": {
                "path": r.path,
                "deletionTimestamp": now,
                "dataChange": r.data_change,
                "extendedFileMetadata": True,
                "partitionValues": r.partition_values,
                "size": r.size,
            }
        }
        for r in removes
    ]
    lines += [
        {
            "add": {
                "path": a.path,
                "partitionValues": a.partition_values,
                "size": a.size,
                "modificationTime": a.modification_time or now,
                "dataChange": a.data_change,
                "stats": a.stats,
            }
        }
        for a in adds
    ]
    lines += [
        {
            "cdc": {
                "path": c.path,
                "partitionValues": c.partition_values,
                "size": c.size,
                "dataChange": False,
            }
        }
        for c in cdc
    ]
    version = read_version + 1
    log_dir = Path(table) / "_delta_log"
    tmp = log_dir / f".tmp-{uuid.uuid4().hex}.json"
    target = log_dir / f"{version:020d}.json"
    data = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, target)
    except FileExistsError:
        raise ConcurrentWriteError(
            f"another writer committed version {version} first; nothing committed, re-run",
            path=table,
        ) from None
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(log_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    if version % CHECKPOINT_INTERVAL == 0:
        DeltaTable(table).create_checkpoint()
    return version
