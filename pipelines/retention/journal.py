"""Exact ``retention_log`` lineage across a run killed between deleting and logging.

A deleting run (online or offline) first writes its intended ``retention_log`` rows, one per
segment it is about to delete, to ``<lake>/_retention_pending/<run_id>.json`` (one object
through :class:`~logstore.objectstore.ObjectStore`: on disk written to a temporary name,
fsynced, renamed; on an object store one PUT, atomic), then deletes, then appends the rows of
what actually went to ``retention_log`` under its ``run_id`` and removes the journal. A run
that dies anywhere in between leaves the journal behind; the next deleting run settles it
*before it plans*:

- when ``retention_log`` already holds rows of that ``run_id`` (the run died after its append,
  before removing the journal), the journal is just removed;
- otherwise each journal row whose segment is gone from its partition (its ``end_offset`` is at
  or below the base offset of the partition's first live segment: DeleteRecords removes whole
  segments, oldest first, and renames them ``.deleted`` before it answers) is appended under
  the dead run's ``run_id``, with ``removed_at`` the journal's write time (the deletions
  happened between then and the kill); the rows of segments still there are dropped, and the
  new run plans those segments again under its own ``run_id``.

Settling before planning is what keeps every removed segment in exactly one row: the segments
a dead run removed are no longer in the log dir, so the new plan cannot count them again, and
the ones it did not remove are counted only by the new plan. A partition whose directory is
gone (topic deleted) gets no rows from a journal: nothing tells whether the dead run or the
topic deletion removed them. Two retention runs at the same time are not supported (each would
settle the other's journal).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
from collections.abc import Callable, Iterable
from typing import Any

from logstore.errors import LoglakeError
from logstore.objectstore import LakeLocation, ObjectStore
from pipelines.retention.scan import list_segments

__all__ = ["PENDING_DIR", "clear_pending", "settle_pending", "write_pending"]

PENDING_DIR = "_retention_pending"
_TS_FIELD = "removed_at"


def _store(lake: str) -> ObjectStore:
    return ObjectStore(LakeLocation.parse(lake).join(PENDING_DIR))


def write_pending(lake: str, run_id: str, rows: list[dict[str, Any]]) -> str:
    """The journal of ``run_id``: the rows it means to log, durable before any deletion;
    returns its URI (for :func:`clear_pending`)."""
    store = _store(lake)
    payload = [
        {k: (v.isoformat() if isinstance(v, datetime.datetime) else v) for k, v in r.items()}
        for r in rows
    ]
    key = f"{run_id}.json"
    store.write(key, json.dumps(payload).encode())
    if store.root.is_local:  # the rename itself survives a power cut once the dir is synced
        fd = os.open(store.root.local_path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return store.uri(key)


def clear_pending(journal: str) -> None:
    """Remove the journal at URI ``journal`` (and, on disk, its directory once empty)."""
    loc = LakeLocation.parse(journal)
    name = loc.uri.rstrip("/").rsplit("/", 1)[-1]
    parent = LakeLocation.parse(loc.uri[: -len(name) - 1])
    ObjectStore(parent).delete(name, missing_ok=True)
    if parent.is_local:
        with contextlib.suppress(OSError):
            parent.local_path.rmdir()  # only when empty: no journal left


def _first_live_base(part_dir: str) -> int | None:
    try:
        segments = list_segments(part_dir)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return segments[0].base_offset if segments else None


def settle_pending(
    lake: str,
    partition_dirs: dict[tuple[str, int], str],
    logged_run_ids: Callable[[Iterable[str]], set[str]],
    append: Callable[[list[dict[str, Any]]], None],
) -> list[dict[str, Any]]:
    """Settle every journal left by dead runs (see the module docstring); the rows appended.

    ``partition_dirs``: each partition's directory in the log dirs; ``logged_run_ids(ids)``:
    which of ``ids`` already have rows in ``retention_log``; ``append(rows)``: one append."""
    store = _store(lake)
    if store.root.is_local and not store.root.local_path.is_dir():
        return []
    listed = store.list(recursive=False)
    journals = [o for o in listed if o.path.endswith(".json") and not o.path.startswith(".")]
    for o in listed:
        if o.path.startswith(".") and o.path.endswith(".json.tmp"):
            store.delete(o.path, missing_ok=True)  # an older writer's temporary: deleted nothing
    if not journals:
        return []
    stem = {o.path: o.path.removesuffix(".json") for o in journals}
    logged = logged_run_ids(list(stem.values()))
    rows: list[dict[str, Any]] = []
    firsts: dict[tuple[str, int], int | None] = {}
    for o in journals:
        if stem[o.path] in logged:
            continue
        try:
            pending = json.loads(store.read(o.path))
        except ValueError as exc:
            raise LoglakeError(
                f"unreadable retention journal: {exc}", path=store.uri(o.path)
            ) from None
        written = datetime.datetime.fromtimestamp(o.modified, datetime.UTC)
        for r in pending:
            key = (str(r["topic"]), int(r["partition"]))
            if key not in firsts:
                part = partition_dirs.get(key)
                firsts[key] = None if part is None else _first_live_base(part)
            first = firsts[key]
            if first is None or int(r["end_offset"]) > first:
                continue  # still there (or cannot tell): the new plan decides
            rows.append({**r, _TS_FIELD: written, "run_id": stem[o.path]})
    if rows:
        append(rows)
    for o in journals:
        clear_pending(store.uri(o.path))
    return rows
