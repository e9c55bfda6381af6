"""One Delta commit with adds, removes, change-data files, deletion vectors and app
transactions, written as the Delta protocol specifies, on local disk and object storage alike.

Why not delta-rs's ``create_write_transaction``: deltalake 1.6's Python API takes only add and
remove actions, without deletion vectors, so a merge committed through it carries no ``cdc``
actions (a change-data reader would see every rewritten file as all-deleted then all-inserted)
and cannot re-add a file with its new deletion vector. This module writes the commit file
itself: the actions as JSON lines in ``_delta_log/<version:020d>.json``, created with
put-if-absent through :meth:`logstore.objectstore.ObjectStore.put_if_absent` (a hard link of
a fully written temporary file on local disk; a ``PutObject`` with ``If-None-Match: *`` on
S3), so two writers can never both create one version and a reader never sees half a commit.
delta-rs, Spark (``pipelines.delta.source``), polars and DataFusion read the commit like any
other (cross-checked in ``tests/unit/pipelines/delta/test_actions.py``).

Checks (what ``pipelines.delta.commit`` checks for its own commits): the table is still at the
version the write read (else ``ConcurrentWriteError``: the removes were chosen from that
snapshot); app transactions never go backwards and, all already present, make the commit a
no-op (``check_app_transactions``). Losing the put-if-absent race to another writer is a
``ConcurrentWriteError`` too, and that writer's commit stands untouched; a put that the store
retried after a lost response and that finds its own bytes there counts as won. Every 100th version
a checkpoint is written with delta-rs.

Crash behaviour: before the put nothing is visible; the put is the commit (atomic on both
stores). A stray ``.tmp-*`` file in a local ``_delta_log`` is ignored by readers. A crash
after the put and before the checkpoint leaves a valid table without that checkpoint (readers
replay the JSON commits).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from logstore.objectstore import LakeLocation, StorageSettings
from pipelines.delta.commit import check_app_transactions
from pipelines.delta.errors import ConcurrentWriteError, DeltaSinkError
from pipelines.delta.log import LOG_DIR, DeltaLog

__all__ = ["CHECKPOINT_INTERVAL", "CdcFile", "FileRef", "commit_actions"]

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
    deletion_vector: dict[str, Any] | None = None  # the file's DV descriptor (add and remove)


@dataclass(frozen=True)
class CdcFile:
    """A change-data file (``_change_data/...``) of the commit."""

    path: str
    size: int
    partition_values: dict[str, str | None]


def _actions(
    *,
    now: int,
    read_version: int,
    operation: str,
    operation_parameters: Mapping[str, Any] | None,
    apps: Mapping[str, int],
    adds: Sequence[FileRef],
    removes: Sequence[FileRef],
    cdc: Sequence[CdcFile],
    metadata: Mapping[str, Any] | None,
    protocol: Mapping[str, Any] | None,
) -> list[dict[str, Any]]:
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
    if protocol is not None:
        lines.append({"protocol": dict(protocol)})
    if metadata is not None:
        lines.append({"metaData": dict(metadata)})
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
                **({"deletionVector": r.deletion_vector} if r.deletion_vector else {}),
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
                **({"deletionVector": a.deletion_vector} if a.deletion_vector else {}),
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
    return lines


def commit_actions(
    table: str | Path | LakeLocation | DeltaLog,
    *,
    read_version: int,
    adds: Sequence[FileRef] = (),
    removes: Sequence[FileRef] = (),
    cdc: Sequence[CdcFile] = (),
    app_transactions: Mapping[str, int] | None = None,
    expected_versions: Mapping[str, int | None] | None = None,
    metadata: Mapping[str, Any] | None = None,
    protocol: Mapping[str, Any] | None = None,
    operation: str = "MERGE",
    operation_parameters: Mapping[str, Any] | None = None,
    settings: StorageSettings | None = None,
) -> int | None:
    """Commit the actions as version ``read_version + 1``; returns it, or None for a no-op.

    ``table``: a local path, an object-store URI or an open :class:`DeltaLog`;
    ``metadata``: a replacement ``metaData`` action (e.g. new table configuration);
    ``protocol``: a replacement ``protocol`` action (e.g. to enable deletion vectors).
    """
    log = table if isinstance(table, DeltaLog) else DeltaLog(table, settings=settings)
    dt = log.table()
    if dt is None:
        raise DeltaSinkError("no Delta table here", path=log.uri)
    if dt.version() != read_version:
        raise ConcurrentWriteError(
            f"the table moved from version {read_version} to {dt.version()} during this run "
            "(another writer?); nothing committed, re-run",
            path=log.uri,
        )
    apps = {str(k): int(v) for k, v in (app_transactions or {}).items()}
    if not check_app_transactions(dt, apps, expected_versions):
        return None
    lines = _actions(
        now=int(time.time() * 1000),
        read_version=read_version,
        operation=operation,
        operation_parameters=operation_parameters,
        apps=apps,
        adds=adds,
        removes=removes,
        cdc=cdc,
        metadata=metadata,
        protocol=protocol,
    )
    version = read_version + 1
    data = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines).encode()
    key = f"{LOG_DIR}/{version:020d}.json"
    # A put retried after a lost response may find its own first attempt there: the bytes
    # (timestamps, app transactions, file names) are this commit's alone, so equal bytes mean
    # this writer won.
    if not log.store.put_if_absent(key, data) and log.store.read(key) != data:
        raise ConcurrentWriteError(
            f"another writer committed version {version} first; nothing committed, re-run",
            path=log.uri,
        )
    if version % CHECKPOINT_INTERVAL == 0:
        committed = log.table(version)
        if committed is not None:
            committed.create_checkpoint()
    return version
