"""Steps 1-2 of a compaction run, on the driver: what the pinned snapshots hold.

Ingest's progress in the ``records`` snapshot, the ``records`` files that may hold the new
offsets (by their stats), and the topic table's files per bucket with their deletion vectors
(from :class:`pipelines.delta.log.DeltaLog`: delta-rs's add actions lack the descriptor that a
remove must name) and deleted rows (read by delta-rs).
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
from deltalake import DeltaTable

from logstore.objectstore import LakeLocation
from pipelines.compaction.layout import (
    BUCKET,
)
from pipelines.delta import read_app_transactions
from pipelines.delta.actions import FileRef
from pipelines.delta.log import DeltaLog
from pipelines.ingest import APP_PREFIX as INGEST_PREFIX

__all__ = ["deleted_rows", "files_by_bucket", "ingest_progress", "record_files"]


def ingest_progress(records_path: str, rec_dt: DeltaTable, topic: str) -> dict[int, int]:
    """Ingest's progress per partition of ``topic`` in the pinned ``records`` snapshot."""
    out: dict[int, int] = {}
    prefix = f"{INGEST_PREFIX}/{topic}/"
    for app in read_app_transactions(records_path):
        rest = app.removeprefix(prefix)
        if rest != app and rest.isdigit():
            version = rec_dt.transaction_version(app)
            if version is not None:
                out[int(rest)] = int(version)
    return out


def files_by_bucket(root: str | None, dt: DeltaTable | None) -> dict[int, list[FileRef]]:
    """The snapshot's files per bucket, with their stats and deletion vectors (from the log:
    delta-rs's add actions lack the deletion vector, which a remove must name)."""
    out: dict[int, list[FileRef]] = {}
    if dt is None or root is None:
        return out
    for a in sorted(DeltaLog(root).live_adds(dt.version()), key=lambda a: str(a["path"])):
        bucket = int(a["partitionValues"][BUCKET])
        out.setdefault(bucket, []).append(
            FileRef(
                a["path"],
                int(a["size"]),
                {BUCKET: str(bucket)},
                stats=a.get("stats"),
                modification_time=int(a.get("modificationTime") or 0),
                deletion_vector=a.get("deletionVector"),
            )
        )
    return out


def deleted_rows(dt: DeltaTable) -> dict[str, np.ndarray]:
    """Absolute path -> deleted row positions, for the snapshot's files with a deletion
    vector (read by delta-rs)."""
    if "deletionVectors" not in (dt.protocol().reader_features or []):
        return {}
    out: dict[str, np.ndarray] = {}
    vectors = pa.table(dt.deletion_vectors())
    for uri, selection in zip(
        vectors.column("filepath").to_pylist(), vectors.column("selection_vector"), strict=True
    ):
        keep = np.asarray(selection.values.to_numpy(zero_copy_only=False), dtype=bool)
        out[LakeLocation.parse(unquote(uri)).uri] = np.nonzero(~keep)[0].astype(np.int64)
    return out


def record_files(
    records_path: str, rec_dt: DeltaTable, topic: str, ranges: Mapping[int, tuple[int, int]]
) -> list[str]:
    """Files of the ``records`` snapshot that may hold offsets in ``ranges`` (by file stats)."""
    out: list[str] = []
    actions = pa.table(rec_dt.get_add_actions(flatten=True)).to_pylist()
    for a in actions:
        if a.get("partition.topic") != topic:
            continue
        lo, hi, top = a.get("min.partition"), a.get("max.partition"), a.get("max.offset")
        if lo is not None and hi is not None and top is not None:
            starts = [s for p, (s, _e) in ranges.items() if lo <= p <= hi]
            if not starts or top < min(starts):
                continue
        out.append(LakeLocation.parse(records_path).join(unquote(a["path"])).uri)
    return out
