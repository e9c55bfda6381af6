"""Step 4 of a compaction run, on the driver: the tombstone table's commit, then the topic
table's, each **one** Delta commit against the snapshot the run read.

The topic table's commit carries the new progress (app transactions
``loglake-compact/<topic>/<partition>``), the removes of the files whose buckets were
rewritten, the files with a new deletion vector removed and added again, the new files and the
change-data files: written by :func:`pipelines.delta.actions.commit_actions` (deltalake 1.6's
Python API writes neither ``cdc`` actions nor deletion vectors). Failpoints:
``compact.before_commit``, ``compact.between_commits`` (see :mod:`pipelines.compaction.table`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from deltalake import DeltaTable

from logstore.failpoints import failpoint, kill_session
from pipelines.compaction.layout import APP_PREFIX, BUCKET, CHANGE_DATA, app_id
from pipelines.compaction.results import TopicResult
from pipelines.delta.actions import CdcFile, FileRef, commit_actions
from pipelines.delta.files import WrittenFile

__all__ = ["RunOutput", "commit_topic", "file_refs", "with_deletion_vector"]


@dataclass(frozen=True)
class RunOutput:
    """What the run read and what its stages produced, for the commit."""

    root: str
    tomb_root: str | None
    topic: str
    full: bool
    dt: DeltaTable
    tomb_dt: DeltaTable | None
    metadata: dict[str, Any] | None  # a new metaData action (--full changing the settings)
    tomb_meta: dict[str, Any] | None
    main_files: Mapping[int, Sequence[FileRef]]
    tomb_files: Mapping[int, Sequence[FileRef]]
    by_path: Mapping[str, FileRef]  # absolute path -> the snapshot's file
    ends: Mapping[int, int]  # ingest's progress per partition
    done: Mapping[int, int | None]  # the table's progress per partition
    ranges: Mapping[int, tuple[int, int]]
    reports: Sequence[Mapping[str, Any]]
    files: Mapping[str, Sequence[WrittenFile]]


def file_refs(files: Sequence[WrittenFile]) -> list[FileRef]:
    """Add actions of files a run wrote."""
    return [
        FileRef(f.path, f.size, f.partition_values, f.stats, f.modification_time) for f in files
    ]


def with_deletion_vector(f: FileRef, descriptor: dict[str, Any]) -> FileRef:
    """``f`` re-added with a new deletion vector (its stats no longer tight)."""
    stats = f.stats
    if stats:
        parsed = json.loads(stats)
        parsed["tightBounds"] = False
        stats = json.dumps(parsed, separators=(",", ":"))
    return dataclasses.replace(f, stats=stats, deletion_vector=descriptor, data_change=True)


def commit_topic(out: RunOutput, result: TopicResult) -> tuple[int | None, dict[str, int]]:
    """Commit the run (the tombstone table first); returns the topic table's new version
    (None: a no-op, every app transaction already there) and the progress committed. Fills
    ``result``'s counts."""
    reports, full, topic = out.reports, out.full, out.topic
    result.records_read = sum(r["records"] for r in reports)
    main_buckets = {r["bucket"] for r in reports if r["changed"]}
    dv_buckets = {r["bucket"] for r in reports if "dv" in r}
    tomb_buckets = {r["bucket"] for r in reports if r.get("tomb_changed")}
    result.buckets_rewritten = len(main_buckets - dv_buckets)
    result.buckets_with_deletion_vectors = len(dv_buckets)
    # A rebuild replaces every file; files whose rows did not change are no data change
    # (Delta's dataChange=false, as OPTIMIZE writes), so change-data readers skip them.
    changed_any = bool(main_buckets)
    main_removes = [
        dataclasses.replace(f, data_change=changed_any)
        for b, fs in sorted(out.main_files.items())
        if full or (b in main_buckets and b not in dv_buckets)
        for f in fs
    ]
    # a bucket merged with deletion vectors: the files that lost rows are removed and
    # added again with their new deletion vector (same data file)
    dv_files = [(path, desc) for r in reports for path, desc, _f in r.get("dv", [])]
    main_removes += [out.by_path[path] for path, _desc in dv_files]
    tomb_removes = [
        f for b, fs in sorted(out.tomb_files.items()) if full or b in tomb_buckets for f in fs
    ]
    main_adds = [
        dataclasses.replace(f, data_change=int(f.partition_values[BUCKET] or -1) in main_buckets)
        for f in file_refs(out.files["main"])
    ]
    main_adds += [with_deletion_vector(out.by_path[path], desc) for path, desc in dv_files]
    result.inserted = sum(r.get("inserted", 0) for r in reports)
    result.updated = sum(r.get("updated", 0) for r in reports)
    result.deleted = sum(r.get("deleted", 0) for r in reports)
    apps = {app_id(topic, p): e for p, (_s, e) in out.ranges.items()}
    expected: dict[str, int | None] = {app_id(topic, p): out.done[p] for p in out.ranges}
    if full:
        rebuild = f"{APP_PREFIX}/{topic}/full"
        previous = out.dt.transaction_version(rebuild)
        apps[rebuild] = (previous or 0) + 1
        expected[rebuild] = previous
        for p in out.ends:
            apps.setdefault(app_id(topic, p), out.ends[p])
            expected.setdefault(app_id(topic, p), out.done[p])
    failpoint("compact.before_commit", kill=kill_session)
    if out.tomb_root is not None and out.tomb_dt is not None and (tomb_buckets or full):
        commit_actions(
            out.tomb_root,
            read_version=out.tomb_dt.version(),
            adds=file_refs(out.files["tomb"]),
            removes=tomb_removes,
            metadata=out.tomb_meta,
            operation="MERGE",
        )
        failpoint("compact.between_commits", kill=kill_session)
    version = commit_actions(
        out.root,
        read_version=out.dt.version(),
        adds=main_adds,
        removes=main_removes,
        cdc=[
            CdcFile(f"{CHANGE_DATA}/{w.path}", w.size, w.partition_values) for w in out.files["cdc"]
        ],
        app_transactions=apps,
        expected_versions=expected,
        metadata=out.metadata,
        operation="MERGE",
        operation_parameters={"source": "records", "full": full},
    )
    return version, apps
