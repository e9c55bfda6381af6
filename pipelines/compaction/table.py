"""Compacted topics as Delta upsert tables: ``<lake>/topics/<topic>``, one row per live key.

Table (Delta, change data feed on): columns ``partition, key, value, headers, offset,
timestamp, timestamp_type, version, bucket`` — the winning record of each live ``(partition,
key)`` (rules: ``pipelines.compaction.model``); ``version`` is the winner's version under the
topic's strategy (null under ``offset``); ``bucket = pmod(xxhash64(key), N)`` is the partition
column, N fixed when the table is created (``[compact] buckets``). The table's description
holds ``loglake.compaction.strategy`` and ``loglake.compaction.buckets`` as JSON (delta-rs
refuses table properties it does not know); a run whose settings differ is refused unless it
is a ``--full`` rebuild.

Deletion vectors: the topic table is created with ``delta.enableDeletionVectors`` (protocol
reader 3 / writer 7). An incremental run merges a bucket by marking the rows it replaces or
deletes in a deletion vector of their file (``deltalog.write_deletion_vectors``: the Delta DV
format, files under ``<table>/dv/``; the file is removed and added again with its new vector in
the commit) and writing only the new rows, so its writes grow with the change, not with the
table; a bucket is rewritten instead when its files would be more than half deleted rows
(counting every row a new record matches as replaced: decided before any value is read) or it
has 16 files (``DV_MAX_DELETED_SHARE``, ``DV_MAX_FILES``). ``--full`` writes files without
vectors. Readers that honour them: delta-rs's DataFusion (``deltalake.QueryBuilder``,
``loglake sql``), polars, Spark through ``pipelines.delta`` (``read_delta``, ``format("delta")``);
deltalake 1.6's ``to_pyarrow_table``/``to_pyarrow_dataset`` refuse such a table (they do not
support the ``deletionVectors`` reader feature). A table created before has no such feature and
keeps rewriting its buckets.

Progress: app transactions ``loglake-compact/<topic>/<partition>`` in the table = the next
offset of ``records`` the table reflects (ingest's progress at the ``records`` snapshot read).

Under the ``timestamp`` and ``header:`` strategies a deleted key must remember its tombstone's
version (a later record with a smaller version must not bring it back), so those topics also
keep ``<lake>/topic_tombstones/<topic>`` (same layout, one row per deleted key); ``offset``
does not need it (later records always have greater offsets).

A run, per topic:

1. pins the ``records`` snapshot and reads ingest's progress ``E[p]`` in it, and the table's
   progress ``S[p]``; nothing to do when ``E == S`` everywhere (a re-run is a no-op);
2. picks the ``records`` files whose stats may hold offsets ``[S[p], E[p])`` of the topic, and
   the table's current files per bucket (same snapshot for the whole run);
3. Spark, two stages of Python tasks (no row crosses the JVM; only file names and row counts
   go through the driver): stage 1 tasks (one per core, the files spread by size) read those
   ``records`` files with pyarrow (only the table's columns, only offsets ``[S[p], E[p])``
   with a key; first the columns that pick the winners, the others then for the winners
   only), keep their own winners of those records (one hash-table pass in numba,
   ``_hash.latest_indices``: the winner is a maximum, so the maximum of the tasks' maxima is
   the same), compute each row's bucket (Spark's ``pmod(xxhash64(key), N)``, computed in
   numba: ``_hash``) and write one Arrow IPC file per bucket under
   ``<table>/_compact_staging/<write id>/`` (removed when the stage-2
   job ends, whatever its outcome); stage 2 tasks, per bucket they hold, read that bucket's
   staged rows, its current files (and tombstones), merge them (``pipelines.compaction.plan``
   picks the winners among the new records; each is matched to the key's current row by a
   hash table on the new keys probed by the ``partition`` and ``key`` columns of the bucket's
   files, ``_match.KeyIndex``, and replaces it when it ranks higher; the other columns are
   read only for the matched rows, or for all rows when the bucket is rewritten, so the cost
   is the change plus one pass over the bucket's keys), and, only when the bucket's live rows
   change, write the bucket's new rows (and deletion vectors for the rows they replace) or its
   new file(s), a change-data file (``_change_data/bucket=B``, ``_change_type`` insert /
   update_preimage / update_postimage / delete) and report which bucket's files they replace;
4. the driver commits the tombstone table (if any) and then the topic table, each in **one**
   Delta commit against the snapshot it read; the topic table's commit carries the new progress
   ``E`` (``pipelines.compaction.deltalog``: adds, removes, cdc and txn actions together).

``full=True`` rebuilds from all of ``records``: every bucket is recomputed from the records
alone and diffed against the old rows (so the change feed stays exact); it may change buckets
and strategy.

Crash behaviour: every file a run writes carries its write id — data and change-data files by
name (``part-<task>-<write id>-...``, ``pipelines.delta.files``), its staging under
``_compact_staging/<write id>/``, and its deletion vector files (named by a uuid, as the Delta
protocol wants) by a journal line in its owner marker written before the driver moves them
into ``dv/``. The marker, ``<table>/_compact_staging/<write id>.owner``, is created before the
run writes anything and holds the driver's host, pid, the pid's start time and the start
time; the driver keeps an ``flock`` on it for the run's life and removes it last, once the
run's leftovers are gone (committed or not). Every run starts by reaping the runs that died:
a marker whose lock is free and whose owner is provably dead (this host: the pid is gone or
reused; another host, where the pid cannot be seen: started more than a day ago) has its
write id's files removed from the topic table and its tombstone table, except every file
that any version still in the Delta log references (adds, removes, change-data and deletion
vector files: time travel may read them, and a run killed after a commit keeps what it
committed), then its staging and the marker. A live run's files are never touched: its lock
is held (the reaper holds the lock while it works, and a new marker is checked to still be
there after it is locked). Writes of a task still running on an executor after its driver
died are not covered (a cluster kills them with the driver; VACUUM removes any such file).

So a run killed at any point before step 4's first commit leaves the tables as they were and
files the next run removes. Killed between the two commits of step 4: the tombstone table is
ahead (its files are referenced, so kept); the re-run reads records again from ``S`` and
merges them into a state that already holds their tombstones — the winner is a maximum, so
re-applying records changes nothing — and the result is exact. Two runs at once: both write
under their own write id; the later commit finds the table moved and fails cleanly
(``ConcurrentWriteError``), removing its own files. Failpoints for the crash tests
(``LOGLAKE_FAILPOINT``, SIGKILL of the whole session): ``compact.after_stage1``,
``compact.mid_stage2`` (in the first stage-2 task, its files written),
``compact.before_commit``, ``compact.between_commits``, ``compact.after_commit`` (before the
run's own clean-up: the re-run keeps what it committed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import json
import os
import shutil
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake import Schema as DeltaSchema
from deltalake.transaction import create_table_with_add_actions
from pyspark import TaskContext
from pyspark.sql import SparkSession

from logstore.errors import LoglakeError
from logstore.failpoints import FAILPOINT_ENV, kill_session
from pipelines.compaction._hash import latest_indices, xxhash64
from pipelines.compaction._match import KeyIndex
from pipelines.compaction.config import CompactConfig, compacted_topics
from pipelines.compaction.deltalog import (
    DV_PREFIX,
    CdcFile,
    FileRef,
    commit_actions,
    dv_relative_path,
    live_adds,
    write_deletion_vectors,
)
from pipelines.compaction.model import Strategy
from pipelines.compaction.plan import VERSION, versions
from pipelines.delta import read_app_transactions
from pipelines.delta.commit import load_table
from pipelines.delta.direct import run_in_job_group
from pipelines.delta.errors import DeltaSinkError, first_error_line
from pipelines.delta.files import PartitionedFileWriter, WrittenFile, cleanup_write_files
from pipelines.delta.staging import _pid_start
from pipelines.ingest import APP_PREFIX as INGEST_PREFIX
from pipelines.sources import RECORDS_ARROW_SCHEMA
from pipelines.worker import arrow_single_threaded, start_task, without_huge_pages

__all__ = [
    "APP_PREFIX",
    "TABLE_SCHEMA",
    "CompactSummary",
    "TopicResult",
    "app_id",
    "compact_topic",
    "run_compact",
    "table_path",
    "tombstones_path",
]

APP_PREFIX = "loglake-compact"
BUCKET = "bucket"
CHANGE_DATA = "_change_data"
CHANGE_TYPE = "_change_type"
CONF_STRATEGY = "loglake.compaction.strategy"
CONF_BUCKETS = "loglake.compaction.buckets"
Log = Callable[[str], None]

TABLE_SCHEMA = pa.schema(
    [
        pa.field("partition", pa.int32()),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", RECORDS_ARROW_SCHEMA.field("headers").type),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestamp_type", pa.int32()),
        pa.field(VERSION, pa.int64()),
        pa.field(BUCKET, pa.int32()),
    ]
)
SRC = "_src"  # in the shuffle: 0 a new record, 1 a live row, 2 a tombstone row (--full)
CDC_SCHEMA = TABLE_SCHEMA.append(pa.field(CHANGE_TYPE, pa.string()))
_INPUT_COLUMNS = [f.name for f in TABLE_SCHEMA if f.name != VERSION]


def app_id(topic: str, partition: int) -> str:
    """The app-transaction id carrying the table's progress for ``topic``/``partition``."""
    return f"{APP_PREFIX}/{topic}/{partition}"


def table_path(lake: str | Path, topic: str) -> str:
    return str(Path(lake) / "topics" / topic)


def tombstones_path(lake: str | Path, topic: str) -> str:
    return str(Path(lake) / "topic_tombstones" / topic)


@dataclass
class TopicResult:
    """What a run did to one topic's table."""

    topic: str
    strategy: str
    committed: bool = False
    table_version: int | None = None
    records_read: int = 0
    buckets_rewritten: int = 0
    buckets_with_deletion_vectors: int = 0
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    progress: dict[str, int] = field(default_factory=dict)
    # wall-clock seconds of the run's steps: plan (snapshots, file lists), stage1 (read, own
    # winners, bucket, stage), stage2 (merge, write), commit; and stage2_cpu_<phase>: CPU
    # seconds of an incremental run's stage-2 phases, summed over its tasks (_merge_rows)
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class CompactSummary:
    topics: list[TopicResult] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        parts = [
            f"{t.topic}: +{t.inserted} ~{t.updated} -{t.deleted} "
            f"({t.records_read} records, {t.buckets_rewritten} buckets, "
            f"version {t.table_version}, committed={t.committed})"
            for t in self.topics
        ]
        return (
            f"compact summary: {'; '.join(parts) or 'no compacted topics'} in {self.seconds:.1f}s"
        )


def _stderr(message: str) -> None:
    print(f"[compact {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Executor side: merge one bucket


@dataclass(frozen=True)
class _TaskPlan:
    """What every merge task needs (pickled into the tasks)."""

    root: str
    tomb_root: str | None
    write_id: str
    strategy: Strategy
    full: bool
    compression: str
    max_rows_per_file: int
    main_files: dict[int, list[str]]  # bucket -> absolute paths of its current files
    tomb_files: dict[int, list[str]]
    # absolute path -> the file's deleted row positions (its deletion vector), when it has one
    deleted: dict[str, np.ndarray] = field(default_factory=dict)
    # the table takes deletion vectors: an incremental bucket merge may mark its replaced rows
    # deleted in their files and write only the new rows (see _merge_incremental)
    deletion_vectors: bool = False
    # write change-data files; not when the table has no rows yet: then every change is an
    # insert and the commit removes nothing, and a change-data reader takes a commit without
    # cdc files as its added rows (the Delta protocol's rule)
    change_data: bool = True


# An incremental run rewrites a bucket instead of adding deletion vectors when the bucket's
# files would then be more than this share deleted rows, or when it has this many files.
DV_MAX_DELETED_SHARE = 0.5
DV_MAX_FILES = 16


_FILE_SCHEMA = pa.schema([f for f in TABLE_SCHEMA if f.name != BUCKET])  # bucket: a directory
_KEY_COLUMNS = ["partition", "key"]
_VALUE_COLUMNS = [n for n in _FILE_SCHEMA.names if n not in _KEY_COLUMNS]
_TAKE_BATCH_ROWS = 65536


def _open_table_file(path: str) -> pq.ParquetFile:
    # memory-mapped: the reader decodes the pages straight from the page cache instead of
    # copying every column chunk into fresh memory first (measured on a 625k-row file of
    # 100-byte values: about half the CPU of a buffered read)
    return pq.ParquetFile(path, memory_map=True, pre_buffer=False)


def _read_file(path: str, deleted: np.ndarray | None) -> tuple[pa.Table, np.ndarray, int]:
    """A table file's live rows (without ``bucket``), their row positions in the file, and
    the file's row count."""
    data = _open_table_file(path).read(columns=_FILE_SCHEMA.names)
    n = data.num_rows
    positions = np.arange(n, dtype=np.int64)
    if deleted is not None and len(deleted):
        keep = np.ones(n, dtype=bool)
        keep[deleted[deleted < n]] = False
        positions = positions[keep]
        data = data.filter(pa.array(keep))
    return data, positions, n


def _file_rows(keys: pa.Table, values: pa.Table) -> pa.Table:
    """A file's rows from its key columns and its other columns (same rows, same order)."""
    columns = {**dict(zip(keys.column_names, keys.columns, strict=True)),
               **dict(zip(values.column_names, values.columns, strict=True))}  # fmt: skip
    return pa.table([columns[n] for n in _FILE_SCHEMA.names], names=_FILE_SCHEMA.names).cast(
        _FILE_SCHEMA
    )


def _take_from_file(path: str, positions: np.ndarray) -> pa.Table:
    """The ``_VALUE_COLUMNS`` of a file's rows at ascending ``positions``: the file read a
    batch at a time and each batch's rows taken (the file's columns never all in memory)."""
    reader = _open_table_file(path)
    parts = []
    start = 0
    for batch in reader.iter_batches(
        batch_size=_TAKE_BATCH_ROWS, columns=_VALUE_COLUMNS, use_threads=False
    ):
        lo, hi = np.searchsorted(positions, [start, start + batch.num_rows])
        if hi > lo:
            parts.append(batch.take(pa.array(positions[lo:hi] - start, type=pa.int64())))
        start += batch.num_rows
    if not parts:
        return _FILE_SCHEMA.empty_table().select(_VALUE_COLUMNS)
    return pa.Table.from_batches(parts)


@dataclass(frozen=True)
class _CurrentRows:
    """A bucket's current table files, read in two steps so that an incremental merge costs
    the change plus one pass over the bucket's keys: first only the ``partition`` and ``key``
    columns of every file (:meth:`read_keys`), to find the rows the new records replace
    (:meth:`match`); then the other columns of only those rows (:meth:`take`, the deletion
    vector path) or of every row (:meth:`read_all`, a rewrite).

    Rows are numbered physically across ``paths`` in order, the rows a deletion vector removes
    included (``live`` is False for them): file ``i`` holds rows ``starts[i]`` to
    ``starts[i + 1] - 1``.
    """

    paths: Sequence[str]
    keys: list[pa.Table]  # per file: its partition and key columns
    starts: np.ndarray
    live: np.ndarray

    @classmethod
    def read_keys(cls, paths: Sequence[str], deleted: Mapping[str, np.ndarray]) -> _CurrentRows:
        keys = [_open_table_file(p).read(columns=_KEY_COLUMNS) for p in paths]
        counts = [t.num_rows for t in keys]
        starts = np.zeros(len(keys) + 1, dtype=np.int64)
        starts[1:] = np.cumsum(counts, dtype=np.int64)
        live = np.ones(int(starts[-1]), dtype=bool)
        for path, start, n in zip(paths, starts.tolist(), counts, strict=False):
            gone = deleted.get(path)
            if gone is not None and len(gone):
                live[start + gone[gone < n]] = False
        return cls(paths, keys, starts, live)

    @property
    def physical_rows(self) -> int:
        return int(self.starts[-1])

    def match(self, index: KeyIndex) -> np.ndarray:
        """Per row of ``index``: the (physical) row of the live row with its partition and
        key, or -1."""
        out = np.full(len(index), -1, dtype=np.int64)
        for start, keys in zip(self.starts.tolist(), self.keys, strict=False):
            live = self.live[start : start + keys.num_rows]
            partition = _int32s(keys.column("partition"))
            index.locate(partition, keys.column("key"), out, base=start, rows=live)
        return out

    def take(self, rows: np.ndarray) -> pa.Table:
        """The rows (without ``bucket``) at ascending physical ``rows``."""
        parts = []
        for i, path in enumerate(self.paths):
            lo, hi = np.searchsorted(rows, self.starts[i : i + 2])
            if hi > lo:
                positions = rows[lo:hi] - self.starts[i]
                keys = self.keys[i].take(pa.array(positions, type=pa.int64()))
                parts.append(_file_rows(keys, _take_from_file(path, positions)))
        return pa.concat_tables(parts) if parts else _FILE_SCHEMA.empty_table()

    def read_all(self) -> pa.Table:
        """Every physical row (without ``bucket``), deleted ones too (see ``live``)."""
        parts = [
            _file_rows(keys, _open_table_file(path).read(columns=_VALUE_COLUMNS))
            for path, keys in zip(self.paths, self.keys, strict=True)
        ]
        return pa.concat_tables(parts) if parts else _FILE_SCHEMA.empty_table()


def _int32s(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int32)


def _with_bucket(rows: pa.Table, bucket: int) -> pa.Table:
    rows = rows.append_column(BUCKET, pa.array(np.full(rows.num_rows, bucket, np.int32)))
    return rows.cast(TABLE_SCHEMA)


def _read_bucket(
    paths: Sequence[str], bucket: int, deleted: Mapping[str, np.ndarray] | None = None
) -> pa.Table:
    """A bucket's live rows (deletion vectors applied)."""
    if not paths:
        return TABLE_SCHEMA.empty_table()
    parts = [_read_file(p, (deleted or {}).get(p))[0] for p in paths]
    return _with_bucket(pa.concat_tables(parts), bucket)


def _as_state(rows: pa.Table, strategy: Strategy) -> pa.Table:
    """New records (keyed) in the table's schema, with their versions.

    Records of aborted transactions (model rule 2) never reach ``records`` when ingest reads
    ``read_committed`` (its default); under ``read_uncommitted`` they are there and nothing
    here tells them apart (``records`` has no transaction column): a known gap (README).
    """
    rows = rows.filter(rows.column("key").is_valid())
    rows = rows.select(_INPUT_COLUMNS)
    rows = rows.cast(pa.schema([TABLE_SCHEMA.field(n) for n in _INPUT_COLUMNS]))
    rows = rows.add_column(7, VERSION, versions(rows, strategy))
    return rows


def _winners(rows: pa.Table) -> np.ndarray:
    """Ascending indices of the winning rows (one per keyed ``(partition, key)``) of rows with
    a ``version`` column: ``plan.winner_indices``'s rule in one hash-table pass (``_hash``)."""
    version = rows.column(VERSION)
    return latest_indices(
        np.asarray(rows.column("partition").to_numpy(zero_copy_only=False)),
        rows.column("key"),
        xxhash64(rows.column("key")),
        np.asarray(version.is_valid().to_numpy(zero_copy_only=False)),
        np.asarray(pc.fill_null(version, 0).to_numpy(zero_copy_only=False)),
        np.asarray(rows.column("offset").to_numpy(zero_copy_only=False)),
    )


def _diff(old: pa.Table, new: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(inserted rows of new, deleted rows of old, updated rows of old, of new): both tables
    hold one row per (partition, key); a row is unchanged when its offset is the same."""
    o = pa.table(
        {
            "partition": old.column("partition"),
            "key": old.column("key"),
            "o_off": old.column("offset"),
            "o_i": pa.array(np.arange(old.num_rows, dtype=np.int64)),
        }
    )
    n = pa.table(
        {
            "partition": new.column("partition"),
            "key": new.column("key"),
            "n_off": new.column("offset"),
            "n_i": pa.array(np.arange(new.num_rows, dtype=np.int64)),
        }
    )
    j = o.join(n, keys=["partition", "key"], join_type="full outer")
    o_i = j.column("o_i").to_numpy(zero_copy_only=False)
    n_i = j.column("n_i").to_numpy(zero_copy_only=False)
    o_valid = np.asarray(j.column("o_i").is_valid().to_numpy(zero_copy_only=False))
    n_valid = np.asarray(j.column("n_i").is_valid().to_numpy(zero_copy_only=False))
    both = o_valid & n_valid
    o_off = np.asarray(pc.fill_null(j.column("o_off"), -1).to_numpy(zero_copy_only=False))
    n_off = np.asarray(pc.fill_null(j.column("n_off"), -1).to_numpy(zero_copy_only=False))
    upd = both & (o_off != n_off)
    as_int = functools.partial(np.asarray, dtype=np.int64)
    return (
        as_int(n_i[n_valid & ~o_valid]),
        as_int(o_i[o_valid & ~n_valid]),
        as_int(o_i[upd]),
        as_int(n_i[upd]),
    )


def _tagged(table: pa.Table, rows: np.ndarray, change: str) -> pa.Table:
    part = table.take(pa.array(rows, type=pa.int64()))
    return part.append_column(CHANGE_TYPE, pa.repeat(pa.scalar(change, pa.string()), part.num_rows))


class _Clock:
    """CPU seconds of a stage-2 task's phases (``time.process_time``: unlike wall-clock, still
    telling on a loaded machine); reported to the driver (``TopicResult.seconds``)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.process_time()

    def lap(self, phase: str) -> None:
        """The CPU time since the previous lap goes to ``phase``."""
        now = time.process_time()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self._last
        self._last = now


def _merge_bucket(
    bucket: int,
    rows: pa.Table,
    plan: _TaskPlan,
    writers: dict[str, PartitionedFileWriter],
    clock: _Clock | None = None,
) -> dict[str, Any]:
    """Merge one bucket's new records into its rows; write what changed (module step 3).

    Incremental: the bucket's current rows come from its files. ``full``: they come through
    the shuffle (``_src`` 1 live, 2 tombstone; bucketed again, so N may change) and only the
    records decide the winners; every bucket is written, changed or not.
    """
    if not plan.full:
        return _merge_incremental(bucket, rows, plan, writers, clock or _Clock())
    src = rows.column(SRC)
    old_live = _old_rows(rows.filter(pc.equal(src, 1)))
    old_tomb = _old_rows(rows.filter(pc.equal(src, 2)))
    new = _as_state(rows.filter(pc.equal(src, 0)), plan.strategy)
    state = new.take(pa.array(_winners(new), type=pa.int64()))
    is_live = state.column("value").is_valid()
    live = state.filter(is_live)
    ins, dels, upd_old, upd_new = _diff(old_live, live)
    changed = bool(len(ins) or len(dels) or len(upd_old))
    report: dict[str, Any] = {"bucket": bucket, "records": new.num_rows, "changed": changed}
    if changed and plan.change_data:
        changes = pa.concat_tables(
            [
                _tagged(live, ins, "insert"),
                _tagged(old_live, upd_old, "update_preimage"),
                _tagged(live, upd_new, "update_postimage"),
                _tagged(old_live, dels, "delete"),
            ]
        )
        writers["cdc"].write(changes.cast(CDC_SCHEMA))
    if changed:
        report.update(inserted=len(ins), updated=len(upd_old), deleted=len(dels))
    if changed or plan.full:
        writers["main"].write(live)
    if plan.tomb_root is not None:
        tomb = state.filter(pc.invert(is_live))
        t_ins, t_dels, t_old, _ = _diff(old_tomb, tomb)
        report["tomb_changed"] = bool(len(t_ins) or len(t_dels) or len(t_old))
        if report["tomb_changed"] or plan.full:
            writers["tomb"].write(tomb)
    return report


def _sort_key(table: pa.Table, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(has version, version or 0, offset) of ``rows``: the model's order within a key."""
    idx = pa.array(rows, type=pa.int64())
    version = table.column(VERSION).take(idx)
    # copies: the caller updates them in place (Arrow's zero-copy views are read-only)
    has = np.array(version.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    value = np.array(pc.fill_null(version, 0).to_numpy(zero_copy_only=False), dtype=np.int64)
    offset = np.array(table.column("offset").take(idx).to_numpy(zero_copy_only=False))
    return has, value, offset


def _merge_incremental(
    bucket: int,
    rows: pa.Table,
    plan: _TaskPlan,
    writers: dict[str, PartitionedFileWriter],
    clock: _Clock,
) -> dict[str, Any]:
    """``_merge_bucket`` of an incremental run, at the cost of the change plus one pass over
    the bucket's keys.

    The winners among the new records (one per key) are matched with the bucket's current
    row of the same key (live or tombstone): a hash table on the winners' keys
    (``_match.KeyIndex``), probed by the ``partition`` and ``key`` columns of the bucket's
    files, the only columns read from every row (``_CurrentRows``). A new winner replaces the
    row it matches when it beats it by the model's order (version present, version, offset).
    Then the bucket is merged with deletion vectors when, even if every matched row were
    replaced, its files would be at most ``DV_MAX_DELETED_SHARE`` deleted rows (and it has
    fewer than ``DV_MAX_FILES`` files): only the matched rows are read in full (the change
    feed's preimages and deletes), the replaced ones marked deleted, and only the winning new
    rows written. Otherwise the bucket is rewritten: every row read, the replaced ones left
    out. The changes (and the change feed) come from the match directly, no sort or join over
    the whole bucket.
    """
    clock.lap("stage2_cpu_read_staged")
    new = _as_state(rows, plan.strategy)
    nw = new.take(pa.array(_winners(new), type=pa.int64()))
    clock.lap("stage2_cpu_winners")
    main_paths = plan.main_files.get(bucket, [])
    current = _CurrentRows.read_keys(main_paths, plan.deleted)
    old_tomb = _read_bucket(plan.tomb_files.get(bucket, []), bucket)
    clock.lap("stage2_cpu_read_keys")
    index = KeyIndex(_int32s(nw.column("partition")), nw.column("key"))
    # new winner -> the physical row of its key's live row (``current``) / its tombstone row
    # (``old_tomb``), or -1. A key has both only after a run killed between its two commits
    # (the tombstone table is ahead).
    match_l = current.match(index)
    match_t = np.full(nw.num_rows, -1, dtype=np.int64)
    index.locate(_int32s(old_tomb.column("partition")), old_tomb.column("key"), match_t)
    has_l = match_l >= 0
    has_t = match_t >= 0
    physical = current.physical_rows
    deleted_before = physical - int(np.count_nonzero(current.live))
    use_dv = (
        plan.deletion_vectors
        and len(main_paths) < DV_MAX_FILES
        and deleted_before + int(np.count_nonzero(has_l)) <= DV_MAX_DELETED_SHARE * physical
    )
    # the matched live rows in full, in the order of their physical rows; ``cur``: new winner
    # -> its live row there, or -1
    at = np.nonzero(has_l)[0]
    at = at[np.argsort(match_l[at], kind="stable")]
    clock.lap("stage2_cpu_match")
    everything = None
    if use_dv:
        matched = _with_bucket(current.take(match_l[at]), bucket)
    else:
        everything = _with_bucket(current.read_all(), bucket)
        matched = everything.take(pa.array(match_l[at], type=pa.int64()))
    cur = np.full(nw.num_rows, -1, dtype=np.int64)
    cur[at] = np.arange(len(at), dtype=np.int64)
    clock.lap("stage2_cpu_read_rows")
    # the winner of each key among (new winner, tombstone row, live row); a tie (the same
    # record applied again: a re-run after a kill) keeps the current row, so nothing changes
    src = np.zeros(nw.num_rows, dtype=np.int8)  # 0 new, 1 tombstone row, 2 live row
    bh, bv, bo = _sort_key(nw, np.arange(nw.num_rows, dtype=np.int64))
    for code, table, match in ((1, old_tomb, match_t), (2, matched, cur)):
        at = np.nonzero(match >= 0)[0]
        if not len(at):
            continue
        h, v, o_ = _sort_key(table, match[at])
        beats = (h > bh[at]) | ((h == bh[at]) & ((v > bv[at]) | ((v == bv[at]) & (o_ >= bo[at]))))
        won = at[beats]
        src[won], bh[won], bv[won], bo[won] = code, h[beats], v[beats], o_[beats]
    wins = src == 0
    is_live = np.asarray(nw.column("value").is_valid().to_numpy(zero_copy_only=False))
    ins = np.nonzero(wins & is_live & ~has_l)[0]
    upd = np.nonzero(wins & is_live & has_l)[0]
    dels = np.nonzero(has_l & (src != 2) & ~(wins & is_live))[0]  # beaten by a tombstone
    gone = match_l[has_l & (src != 2)]  # live rows replaced or deleted (physical rows)
    keep_tomb = np.ones(old_tomb.num_rows, dtype=bool)
    keep_tomb[match_t[has_t & (src != 1)]] = False
    changed = bool(len(ins) or len(upd) or len(dels))
    report: dict[str, Any] = {"bucket": bucket, "records": new.num_rows, "changed": changed}
    if changed and plan.change_data:
        changes = pa.concat_tables(
            [
                _tagged(nw, ins, "insert"),
                _tagged(matched, cur[upd], "update_preimage"),
                _tagged(nw, upd, "update_postimage"),
                _tagged(matched, cur[dels], "delete"),
            ]
        )
        writers["cdc"].write(changes.cast(CDC_SCHEMA))
    clock.lap("stage2_cpu_change_feed")
    if changed:
        report.update(inserted=len(ins), updated=len(upd), deleted=len(dels))
        if everything is None:
            # the rows stay in their files, marked deleted; only the new rows are written
            file_index = np.searchsorted(current.starts, gone, side="right") - 1
            positions = gone - current.starts[file_index]
            report["dv"] = _deletion_vectors(plan, main_paths, file_index, positions)
            writers["main"].write(nw.filter(pa.array(wins & is_live)))
        else:
            keep = current.live.copy()
            keep[gone] = False
            live = pa.concat_tables(
                [everything.filter(pa.array(keep)), nw.filter(pa.array(wins & is_live))]
            )
            writers["main"].write(live)
    if plan.tomb_root is not None:
        new_tomb = wins & ~is_live
        report["tomb_changed"] = bool(new_tomb.any() or not keep_tomb.all())
        if report["tomb_changed"]:
            tomb = pa.concat_tables(
                [old_tomb.filter(pa.array(keep_tomb)), nw.filter(pa.array(new_tomb))]
            )
            writers["tomb"].write(tomb)
    clock.lap("stage2_cpu_rows_and_vectors")
    return report


def _deletion_vectors(
    plan: _TaskPlan, paths: Sequence[str], file_index: np.ndarray, positions: np.ndarray
) -> list[list[Any]]:
    """New deletion vectors for the files of ``paths`` that lose rows (their old deleted rows
    plus ``positions``), written into one DV file in the run's staging directory; returns
    ``[path, descriptor, DV file]`` per file (the driver moves the DV file into the table)."""
    touched = np.flatnonzero(np.bincount(file_index, minlength=len(paths))).tolist()
    if not touched:
        return []
    vectors = []
    for i in touched:
        new = positions[file_index == i]
        old = plan.deleted.get(paths[i])
        vectors.append(new if old is None else np.concatenate([old, new]))
    folder = os.path.join(plan.root, STAGING, plan.write_id, "dv")
    dv_path, descriptors = write_deletion_vectors(folder, vectors)
    return [[paths[i], d, dv_path] for i, d in zip(touched, descriptors, strict=True)]


def _old_rows(rows: pa.Table) -> pa.Table:
    return rows.select(TABLE_SCHEMA.names).cast(TABLE_SCHEMA)


# Parquet options of the table's files (as ingest's RECORDS_PARQUET_OPTIONS, measured there):
# no dictionary and no statistics for the mostly distinct key, value and headers (a dictionary
# is built and then abandoned; Delta's stats skip binaries anyway), statistics for the columns
# readers filter on, delta encoding for the offsets and timestamps.
TABLE_PARQUET_OPTIONS: Mapping[str, Any] = {
    "use_dictionary": ("partition", "timestamp_type", "version", CHANGE_TYPE),
    "write_statistics": ("partition", "offset", "timestamp"),
    "column_encoding": {"offset": "DELTA_BINARY_PACKED", "timestamp": "DELTA_BINARY_PACKED"},
    "parquet_writer": "loglake",
}


def _writer(root: str, schema: pa.Schema, common: Mapping[str, Any]) -> PartitionedFileWriter:
    names = set(schema.names)
    options = {
        "use_dictionary": [c for c in TABLE_PARQUET_OPTIONS["use_dictionary"] if c in names],
        "write_statistics": [c for c in TABLE_PARQUET_OPTIONS["write_statistics"] if c in names],
        "column_encoding": TABLE_PARQUET_OPTIONS["column_encoding"],
        "parquet_writer": TABLE_PARQUET_OPTIONS["parquet_writer"],
    }
    return PartitionedFileWriter(root, **common, **options)


def _merge_rows(
    buckets: Iterator[tuple[int, pa.Table]], plan: _TaskPlan, task_id: int, attempt: int
) -> str:
    """Every bucket merged and written; one JSON line with the files and reports."""
    common: dict[str, Any] = {
        "write_id": plan.write_id,
        "task_id": task_id,
        "attempt": attempt,
        "partition_by": [BUCKET],
        "compression": plan.compression,
        "max_rows_per_file": plan.max_rows_per_file,
    }
    writers = {
        "main": _writer(plan.root, TABLE_SCHEMA, common),
        "cdc": _writer(os.path.join(plan.root, CHANGE_DATA), CDC_SCHEMA, common),
    }
    if plan.tomb_root is not None:
        writers["tomb"] = _writer(plan.tomb_root, TABLE_SCHEMA, common)
    reports = []
    clock = _Clock()
    try:
        for bucket, rows in buckets:
            reports.append(_merge_bucket(bucket, rows, plan, writers, clock))
            clock.lap("stage2_cpu_other")
        files = {name: [asdict(f) for f in w.close()] for name, w in writers.items()}
        clock.lap("stage2_cpu_write_files")
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    return json.dumps({"files": files, "reports": reports, "cpu": clock.seconds})


def _task_ids() -> tuple[int, int]:
    ctx = TaskContext.get()
    if ctx is None:
        return 0, 0
    return ctx.partitionId(), ctx.attemptNumber()


# Direct path (the run's two stages, both in the Python workers, no rows through the JVM):
# stage 1, one task per core and group of input files: read them with pyarrow (only the rows of
# the new offsets, keyed; the winners' columns but partition, offset and key only once the
# winners are known), keep each task's own winners of those records (the winner is a maximum, so
# the maximum of the tasks' maxima is the same; ``_hash.latest_indices``), bucket every row
# (Spark's pmod(xxhash64(key), N), ``_hash``), and write one Arrow IPC file per bucket under
# ``<table>/_compact_staging/<write_id>/``; stage 2, one task per group of buckets: each bucket
# read from its staged files and merged (``_merge_rows``). Only file names and row counts travel
# through the driver. The staging directory is removed when the run ends, committed or not (a
# killed run leaves it: the next run removes it, ``_reap_dead_runs``).

STAGING = "_compact_staging"
_RECORD_COLUMNS = ["partition", "key", "value", "headers", "offset", "timestamp", "timestamp_type"]
_STAGED_SCHEMA = TABLE_SCHEMA.append(pa.field(SRC, pa.int32()))


@dataclass(frozen=True)
class _StageInput:
    path: str
    src: int  # 0 records, 1 live rows, 2 tombstone rows (``--full``)
    deleted: np.ndarray | None = None  # a table file's deletion vector (deleted positions)


# Stage 1 reads a records file twice: first the columns that pick the winners (``partition``,
# ``offset``, ``key`` and what the strategy's version needs: a few bytes a row), then, once the
# task's winners are known, the other columns, of which only the winners' rows are kept (a
# file at a time, so a task holds its winners and one file's values, not all its files' rows).
_SELECT_COLUMNS = ["partition", "offset", "key"]
_PAYLOAD_BATCH = 1 << 16
_STAGED_BATCH = 1 << 17


def _strategy_columns(strategy: Strategy) -> list[str]:
    """The records columns ``plan.versions`` reads under ``strategy``."""
    return {"offset": [], "timestamp": ["timestamp"]}.get(strategy.kind, ["headers"])


def _read_input(item: _StageInput) -> pa.Table:
    """A table file's rows (``--full``: ``_src`` 1 or 2) in the table's columns, ``bucket`` not
    yet set."""
    data = _read_file(item.path, item.deleted)[0]
    data = data.select([f.name for f in TABLE_SCHEMA if f.name != BUCKET])
    return data.cast(pa.schema([f for f in TABLE_SCHEMA if f.name != BUCKET]))


def _records_file(path: str) -> pq.ParquetFile:
    """A records file for reading a few columns: memory-mapped and without pre-buffering. The
    default reads each column chunk into a fresh buffer first, which a worker process faults
    in page by page every time (measured: 5 files of 0.9M records, 0.6-1.0 s of system time
    for their non-key columns; memory-mapped 0.05 s); the decoded pages are what the columns
    keep anyway."""
    return pq.ParquetFile(path, memory_map=True, pre_buffer=False)


def _read_selection(
    item: _StageInput, ranges: Mapping[int, tuple[int, int]], columns: Sequence[str]
) -> tuple[pa.Table, np.ndarray | None]:
    """``columns`` of a records file's rows of ``ranges`` with a key, and those rows' positions
    in the file (None: every row)."""
    data = _records_file(item.path).read(columns=list(columns), use_threads=False)
    part = np.asarray(data.column("partition").to_numpy(zero_copy_only=False))
    off = np.asarray(data.column("offset").to_numpy(zero_copy_only=False))
    keep = np.zeros(data.num_rows, dtype=bool)
    for p, (lo, hi) in ranges.items():
        keep |= (part == p) & (off >= lo) & (off < hi)
    keep &= np.asarray(data.column("key").is_valid().to_numpy(zero_copy_only=False))
    if keep.all():
        return data, None
    positions = np.nonzero(keep)[0]
    return data.take(pa.array(positions, type=pa.int64())), positions


def _bucket_order(bucket: np.ndarray) -> np.ndarray:
    """A stable order of rows by ``bucket`` (numpy's radix sort for 16-bit values)."""
    if len(bucket) and int(bucket.max()) < 1 << 16:
        return np.argsort(bucket.astype(np.uint16), kind="stable")
    return np.argsort(bucket, kind="stable")


class _StagedFiles:
    """A stage-1 task's output: one Arrow IPC file per bucket, opened at its first rows. Rows
    gather per bucket and go out in record batches of at least ``_STAGED_BATCH`` rows (stage 2
    works on them as they are: small chunks would slow its takes and joins)."""

    def __init__(self, staging: str, index: int, attempt: int) -> None:
        self.staging = staging
        self.name = f"{index}-{attempt}.arrow"
        self.writers: dict[int, tuple[pa.NativeFile, pa.ipc.RecordBatchWriter]] = {}
        self.pending: dict[int, list[pa.Table]] = {}
        self.rows: dict[int, int] = {}

    def write(self, rows: pa.Table, bucket: np.ndarray, src: int) -> None:
        """``rows`` (the staged columns but ``version``, ``bucket`` and ``_src``) sorted by
        their ``bucket``."""
        n = rows.num_rows
        if n == 0:
            return
        rows = rows.append_column(VERSION, pa.nulls(n, pa.int64())) if src == 0 else rows
        rows = rows.append_column(BUCKET, pa.array(bucket))
        rows = rows.append_column(SRC, pa.array(np.full(n, src, np.int32)))
        rows = rows.select(_STAGED_SCHEMA.names).cast(_STAGED_SCHEMA)
        present, starts = np.unique(bucket, return_index=True)
        ends = [*starts[1:].tolist(), n]
        for b, lo, hi in zip(present.tolist(), starts.tolist(), ends, strict=True):
            pending = self.pending.setdefault(b, [])
            pending.append(rows.slice(lo, hi - lo))
            if sum(t.num_rows for t in pending) >= _STAGED_BATCH:
                self._flush(b)

    def _flush(self, bucket: int) -> None:
        pending = self.pending.pop(bucket, [])
        if not pending:
            return
        if bucket not in self.writers:
            folder = os.path.join(self.staging, str(bucket))
            os.makedirs(folder, exist_ok=True)
            sink = pa.OSFile(os.path.join(folder, self.name), "wb")
            self.writers[bucket] = (sink, pa.ipc.new_file(sink, _STAGED_SCHEMA))
            self.rows[bucket] = 0
        rows = pending[0] if len(pending) == 1 else pa.concat_tables(pending).combine_chunks()
        self.writers[bucket][1].write_table(rows, max_chunksize=1 << 20)
        self.rows[bucket] += rows.num_rows

    def close(self) -> list[str]:
        """Close every file; one JSON line per file (bucket, path, rows) for the driver."""
        for b in sorted(self.pending):
            self._flush(b)
        lines = []
        for b, (sink, writer) in sorted(self.writers.items()):
            writer.close()
            sink.close()
            path = os.path.join(self.staging, str(b), self.name)
            lines.append(json.dumps({"bucket": b, "path": path, "rows": self.rows[b]}))
        self.writers.clear()
        return lines

    def abort(self) -> None:
        for sink, _writer in self.writers.values():
            sink.close()
        self.writers.clear()
        self.pending.clear()


def _stage_records(
    inputs: Sequence[_StageInput],
    ranges: Mapping[int, tuple[int, int]],
    buckets: int,
    strategy: Strategy,
    out: _StagedFiles,
) -> None:
    """The task's winners among the records of ``inputs``, staged by bucket."""
    select = _SELECT_COLUMNS + [c for c in _strategy_columns(strategy) if c not in _SELECT_COLUMNS]
    chosen = [_read_selection(i, ranges, select) for i in inputs]
    rows = pa.concat_tables([t for t, _ in chosen])
    if rows.num_rows == 0:
        return
    keys = rows.column("key")
    if sum(c.nbytes for c in keys.chunks) >= 1 << 31:  # past binary's 32-bit offsets
        keys = keys.cast(pa.large_binary())
    keys = keys.combine_chunks() if keys.num_chunks != 1 else keys.chunk(0)
    hashes = xxhash64(keys)
    if strategy.kind == "offset":  # no versions: the kernel compares offsets only
        has_version, version = np.zeros(0, np.bool_), np.zeros(0, np.int64)
    else:
        v = versions(rows, strategy)
        has_version = np.asarray(v.is_valid().to_numpy(zero_copy_only=False))
        version = np.asarray(pc.fill_null(v, 0).to_numpy(zero_copy_only=False))
    keep = latest_indices(
        np.asarray(rows.column("partition").to_numpy(zero_copy_only=False)),
        keys,
        hashes,
        has_version,
        version,
        np.asarray(rows.column("offset").to_numpy(zero_copy_only=False)),
    )
    del rows, keys, has_version, version
    rest = [c for c in _RECORD_COLUMNS if c not in select]
    start = 0
    for item, (table, positions) in zip(inputs, chosen, strict=True):
        lo, hi = np.searchsorted(keep, [start, start + table.num_rows])
        local = keep[lo:hi] - start  # the file's winners, rows of ``table``
        bucket = np.mod(hashes[keep[lo:hi]], np.int64(buckets)).astype(np.int32)
        start += table.num_rows
        if len(local):
            _stage_winners(item, table, local, local if positions is None else positions[local],
                           bucket, rest, out)  # fmt: skip


def _stage_winners(  # noqa: PLR0917
    item: _StageInput,
    table: pa.Table,
    local: np.ndarray,
    at: np.ndarray,
    bucket: np.ndarray,
    rest: Sequence[str],
    out: _StagedFiles,
) -> None:
    """A records file's winners (rows ``local`` of its selection ``table``, at positions ``at``
    of the file, ascending) with the file's ``rest`` columns, staged by bucket. The file is
    read in batches of ``_PAYLOAD_BATCH`` rows: the allocator hands the same pages to every
    batch instead of faulting in each file's whole column (measured: 5 files, 1M winners,
    system time 0.28 -> 0.13 s)."""
    done = 0
    for batch in _records_file(item.path).iter_batches(
        batch_size=_PAYLOAD_BATCH, columns=list(rest), use_threads=False
    ):
        lo, hi = np.searchsorted(at, [done, done + batch.num_rows])
        if hi > lo:
            order = lo + _bucket_order(bucket[lo:hi])
            winners = table.take(pa.array(local[order], type=pa.int64()))
            payload = batch.take(pa.array(at[order] - done, type=pa.int64()))
            for name in rest:
                winners = winners.append_column(name, payload.column(name))
            out.write(winners, bucket[order], 0)
        done += batch.num_rows


def _stage_table_file(item: _StageInput, buckets: int, out: _StagedFiles) -> None:
    """A table file's rows (``--full``), staged by bucket."""
    rows = _read_input(item)
    bucket = np.mod(xxhash64(rows.column("key")), np.int64(buckets)).astype(np.int32)
    order = _bucket_order(bucket)
    out.write(rows.take(pa.array(order, type=pa.int64())), bucket[order], item.src)


def _stage_task(
    index: int,
    items: Iterator[list[_StageInput]],
    *,
    staging: str,
    ranges: Mapping[int, tuple[int, int]],
    buckets: int,
    strategy: Strategy,
) -> Iterator[str]:
    """Stage 1: this task's input files, its records' winners and the table rows, split by
    bucket into Arrow IPC files."""
    start_task()
    _task, attempt = _task_ids()
    inputs = [i for group in items for i in group]
    with arrow_single_threaded(), without_huge_pages():
        yield from _stage_inputs(inputs, index, attempt, staging, ranges, buckets, strategy)


def _stage_groups(inputs: Sequence[_StageInput], parallelism: int) -> list[list[_StageInput]]:
    """Stage 1's tasks: one per core (at most one per file), files spread by size (the largest
    next onto the lightest task). One task per core, not more: a key's records split over
    more tasks are staged once per task (each keeps its own winner), so more tasks stage more
    rows for stage 2 (10M records over 1M keys: 2.0M rows in 2 tasks, 3.7M in 4)."""
    n = max(1, min(len(inputs), parallelism))
    sizes = {i.path: os.path.getsize(i.path) for i in inputs}
    groups: list[list[_StageInput]] = [[] for _ in range(n)]
    loads = [0] * n
    for item in sorted(inputs, key=lambda i: -sizes[i.path]):
        t = loads.index(min(loads))
        groups[t].append(item)
        loads[t] += sizes[item.path]
    return [g for g in groups if g]


def _stage_inputs(  # noqa: PLR0917
    inputs: Sequence[_StageInput],
    index: int,
    attempt: int,
    staging: str,
    ranges: Mapping[int, tuple[int, int]],
    buckets: int,
    strategy: Strategy,
) -> Iterator[str]:
    out = _StagedFiles(staging, index, attempt)
    try:
        records = [i for i in inputs if i.src == 0]
        if records:
            _stage_records(records, ranges, buckets, strategy, out)
        for item in inputs:
            if item.src != 0:
                _stage_table_file(item, buckets, out)
        lines = out.close()
    except BaseException:
        out.abort()
        raise
    yield from lines


def _read_staged(paths: Sequence[str]) -> pa.Table:
    tables = []
    for path in paths:
        with pa.memory_map(path) as source:
            tables.append(pa.ipc.open_file(source).read_all())
    return pa.concat_tables(tables) if tables else _STAGED_SCHEMA.empty_table()


def _merge_staged(
    index: int, items: Iterator[dict[int, list[str]]], *, plan: _TaskPlan
) -> Iterator[str]:
    """Stage 2: this task's buckets, each read from its staged files and merged."""
    start_task()
    _task, attempt = _task_ids()
    groups = [(b, paths) for group in items for b, paths in sorted(group.items())]
    if not groups:
        return
    with arrow_single_threaded(), without_huge_pages():
        merged = _merge_rows(
            ((b, _read_staged(paths)) for b, paths in groups), plan, index, attempt
        )
    if index == 0:
        _failpoint("compact.mid_stage2")  # this task's files written, others' maybe not
    yield merged


def _clear_stale_staging(root: str, max_age_s: float = 24 * 3600) -> None:
    """Remove staging directories without an owner marker (runs from before the markers)
    that are older than ``max_age_s``; a marked run's directory goes with its marker
    (``_reap_dead_runs``)."""
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


def _owner_path(root: str, write_id: str) -> str:
    return os.path.join(root, STAGING, write_id + OWNER_SUFFIX)


def _take_ownership(root: str) -> str:
    """A new write id for a run on table ``root``, its marker created and locked."""
    base = os.path.join(root, STAGING)
    while True:
        write_id = uuid.uuid4().hex
        path = _owner_path(root, write_id)
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


def _journal_dv_files(plan: _TaskPlan, merged: Sequence[str]) -> None:
    """Record in the run's marker the deletion vector files that the stage-2 results
    ``merged`` name, before the driver moves them into ``dv/`` (their names carry no write id:
    ``deletion_vector_<uuid>.bin``)."""
    names = [
        d for row in merged for r in json.loads(row)["reports"] for _p, _d, d in r.get("dv", [])
    ]
    if not names:
        return
    with open(_owner_path(plan.root, plan.write_id), "a", encoding="utf-8") as fh:
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
        os.unlink(_owner_path(root, write_id))
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


def _dv_file_name(descriptor: Mapping[str, Any] | None) -> str | None:
    """The file name (under the table root) of a deletion vector stored as a file; ``None``
    for an inline vector, none, or a descriptor whose path is not valid."""
    try:
        return dv_relative_path(descriptor)
    except ValueError:
        return None


def _referenced_files(root: str) -> set[str]:
    """Every file (relative, as on disk) that any version of the Delta table at ``root`` still
    in its log names: adds, removes, change-data files and deletion vector files (time travel
    may read any of them)."""
    out: set[str] = set()
    log_dir = Path(root, "_delta_log")
    if not log_dir.is_dir():
        return out

    def note(action: Mapping[str, Any] | None) -> None:
        if not action or not action.get("path"):
            return
        out.add(unquote(str(action["path"])))
        dv = _dv_file_name(action.get("deletionVector"))
        if dv is not None:
            out.add(dv)

    for entry in sorted(os.scandir(log_dir), key=lambda e: e.name):
        if entry.name.endswith(".json") and not entry.name.startswith("."):
            with open(entry.path, encoding="utf-8") as fh:
                for line in fh:
                    if line.strip():
                        action = json.loads(line)
                        for kind in ("add", "remove", "cdc"):
                            note(action.get(kind))
        elif ".checkpoint" in entry.name and entry.name.endswith(".parquet"):
            data = pq.read_table(entry.path)
            for kind in ("add", "remove"):
                if kind in data.column_names:
                    for action in data.column(kind).to_pylist():
                        note(action)
    return out


def _reap_dead_runs(root: str, tomb_root: str, log: Log) -> None:
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
                referenced = {r: _referenced_files(r) for r in (root, tomb_root)}
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


# ---------------------------------------------------------------------------------------------
# Driver side


def _ingest_progress(records_path: str, rec_dt: DeltaTable, topic: str) -> dict[int, int]:
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


def _files_by_bucket(root: str | None, dt: DeltaTable | None) -> dict[int, list[FileRef]]:
    """The snapshot's files per bucket, with their stats and deletion vectors (from the log:
    delta-rs's add actions lack the deletion vector, which a remove must name)."""
    out: dict[int, list[FileRef]] = {}
    if dt is None or root is None:
        return out
    for a in sorted(live_adds(root, dt.version()), key=lambda a: str(a["path"])):
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


def _deleted_rows(dt: DeltaTable) -> dict[str, np.ndarray]:
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
        path = unquote(urlparse(uri).path) if "://" in uri else uri
        out[os.path.normpath(path)] = np.nonzero(~keep)[0].astype(np.int64)
    return out


def _with_dv(f: FileRef, descriptor: dict[str, Any]) -> FileRef:
    """``f`` re-added with a new deletion vector (its stats no longer tight)."""
    stats = f.stats
    if stats:
        parsed = json.loads(stats)
        parsed["tightBounds"] = False
        stats = json.dumps(parsed, separators=(",", ":"))
    return dataclasses.replace(f, stats=stats, deletion_vector=descriptor, data_change=True)


def _record_files(
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
        out.append(os.path.join(records_path, unquote(a["path"])))
    return out


def _settings(strategy: Strategy, buckets: int) -> str:
    return json.dumps({CONF_STRATEGY: str(strategy), CONF_BUCKETS: str(buckets)}, sort_keys=True)


def _create_table(path: str, strategy: Strategy, buckets: int, cdf: bool) -> None:
    # delta-rs refuses table properties it does not know: the settings go in the description.
    # The topic table (cdf) takes deletion vectors too (incremental runs, _merge_incremental).
    create_table_with_add_actions(
        path,
        DeltaSchema.from_arrow(TABLE_SCHEMA),
        [],
        mode="error",
        partition_by=[BUCKET],
        description=_settings(strategy, buckets),
        configuration=(
            {"delta.enableChangeDataFeed": "true", "delta.enableDeletionVectors": "true"}
            if cdf
            else None
        ),
    )


def _metadata_action(dt: DeltaTable, strategy: Strategy, buckets: int) -> dict[str, Any]:
    meta = dt.metadata()
    return {
        "id": meta.id,
        "name": meta.name,
        "description": _settings(strategy, buckets),
        "format": {"provider": "parquet", "options": {}},
        "schemaString": dt.schema().to_json(),
        "partitionColumns": list(meta.partition_columns),
        "createdTime": meta.created_time,
        "configuration": dict(meta.configuration),
    }


def _ensure_table(
    path: str, strategy: Strategy, buckets: int, *, full: bool, cdf: bool
) -> tuple[DeltaTable, int, dict[str, Any] | None]:
    """The table (created empty when absent), its bucket count, and a metaData action when a
    ``--full`` run changes the settings."""
    dt = load_table(path)
    if dt is None:
        _create_table(path, strategy, buckets, cdf)
        dt = DeltaTable(path)
    try:
        conf = json.loads(dt.metadata().description or "{}")
    except ValueError:
        conf = {}
    have = (conf.get(CONF_STRATEGY), conf.get(CONF_BUCKETS))
    want = (str(strategy), str(buckets))
    if have == want:
        return dt, buckets, None
    if not full:
        raise LoglakeError(
            f"table was built with strategy {have[0]!r} and {have[1]} buckets, the config says "
            f"{want[0]!r} and {want[1]}: re-run with --full to rebuild it",
            path=path,
        )
    return dt, buckets, _metadata_action(dt, strategy, buckets)


def _failpoint(name: str) -> None:
    if os.environ.get(FAILPOINT_ENV) == name:
        kill_session()


def compact_topic(
    spark: SparkSession,
    config: CompactConfig,
    topic: str,
    strategy: Strategy,
    *,
    full: bool = False,
    log: Log = _stderr,
) -> TopicResult:
    """One topic's run (module steps 1-4)."""
    result = TopicResult(topic, str(strategy))
    records_path = config.records_path
    rec_dt = load_table(records_path)
    if rec_dt is None:
        log(f"{topic}: no records table at {records_path} yet")
        return result
    ends = _ingest_progress(records_path, rec_dt, topic)
    path = table_path(config.lake, topic)
    _reap_dead_runs(path, tombstones_path(config.lake, topic), log)
    existing = load_table(path)
    if existing is None and not ends:
        # Every loglake table exists after its job's first run, empty if nothing went there.
        dt, _, _ = _ensure_table(path, strategy, config.buckets, full=False, cdf=True)
        log(f"{topic}: nothing ingested yet (empty table created)")
        result.table_version = dt.version()
        return result
    # step 1: progress
    dt, buckets, metadata = _ensure_table(path, strategy, config.buckets, full=full, cdf=True)
    tomb_root = tombstones_path(config.lake, topic) if strategy.kind != "offset" else None
    tomb_dt = None
    tomb_meta = None
    if tomb_root is not None:
        tomb_dt, _, tomb_meta = _ensure_table(
            tomb_root, strategy, config.buckets, full=full, cdf=False
        )
    done = {p: dt.transaction_version(app_id(topic, p)) for p in ends}
    starts = {p: 0 if full else int(done[p] or 0) for p in ends}
    ranges = {p: (starts[p], e) for p, e in ends.items() if e > starts[p]}
    if not ranges and not full:
        log(f"{topic}: nothing new since the last run (table version {dt.version()})")
        result.table_version = dt.version()
        return result
    # step 2: the files
    started = time.perf_counter()
    main_files = _files_by_bucket(path, dt)
    tomb_files = _files_by_bucket(tomb_root, tomb_dt)
    deleted = _deleted_rows(dt)
    rec_files = _record_files(records_path, rec_dt, topic, ranges)
    write_id = _take_ownership(path)  # before anything is written (see _reap_dead_runs)
    main_paths = {
        b: [os.path.normpath(os.path.join(path, unquote(f.path))) for f in fs]
        for b, fs in main_files.items()
    }
    by_path = {p: f for b, fs in main_files.items() for p, f in zip(main_paths[b], fs, strict=True)}
    tomb_paths = {
        b: [os.path.join(tomb_root or "", unquote(f.path)) for f in fs]
        for b, fs in tomb_files.items()
    }
    plan = _TaskPlan(
        root=path,
        tomb_root=tomb_root,
        write_id=write_id,
        strategy=strategy,
        full=full,
        compression=config.compression,
        max_rows_per_file=config.max_rows_per_file,
        # the tasks read a bucket's files themselves, except in a rebuild (see _merge_bucket)
        main_files={} if full else main_paths,
        tomb_files={} if full else tomb_paths,
        deleted=deleted,
        change_data=bool(main_files),
        deletion_vectors="deletionVectors" in (dt.protocol().reader_features or []),
    )
    log(
        f"{topic}: strategy {strategy}, {buckets} buckets; reading {len(rec_files)} records "
        "files for " + ", ".join(f"{p} [{s}, {e})" for p, (s, e) in sorted(ranges.items()))
    )
    # step 3: the merge
    result.seconds["plan"] = time.perf_counter() - started
    try:
        reports, files = _run_merge(
            spark,
            plan,
            rec_files,
            [p for ps in main_paths.values() for p in ps] if full else [],
            [p for ps in tomb_paths.values() for p in ps] if full else [],
            records_path,
            topic,
            ranges,
            buckets,
            result.seconds,
        )
    except BaseException as exc:
        _cleanup(plan)
        if isinstance(exc, Exception) and not isinstance(exc, LoglakeError):
            raise DeltaSinkError(
                f"compaction of {topic} failed, nothing committed: {first_error_line(exc)}",
                path=path,
            ) from exc
        raise
    # step 4: commit
    started = time.perf_counter()
    try:
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
            for b, fs in sorted(main_files.items())
            if full or (b in main_buckets and b not in dv_buckets)
            for f in fs
        ]
        # a bucket merged with deletion vectors: the files that lost rows are removed and
        # added again with their new deletion vector (same data file)
        dv_files = [(path, desc) for r in reports for path, desc, _f in r.get("dv", [])]
        main_removes += [by_path[path] for path, _desc in dv_files]
        tomb_removes = [
            f for b, fs in sorted(tomb_files.items()) if full or b in tomb_buckets for f in fs
        ]
        main_adds = [
            dataclasses.replace(
                f, data_change=int(f.partition_values[BUCKET] or -1) in main_buckets
            )
            for f in _refs(files["main"])
        ]
        main_adds += [_with_dv(by_path[path], desc) for path, desc in dv_files]
        result.inserted = sum(r.get("inserted", 0) for r in reports)
        result.updated = sum(r.get("updated", 0) for r in reports)
        result.deleted = sum(r.get("deleted", 0) for r in reports)
        apps = {app_id(topic, p): e for p, (_s, e) in ranges.items()}
        expected: dict[str, int | None] = {app_id(topic, p): done[p] for p in ranges}
        if full:
            rebuild = f"{APP_PREFIX}/{topic}/full"
            previous = dt.transaction_version(rebuild)
            apps[rebuild] = (previous or 0) + 1
            expected[rebuild] = previous
            for p in ends:
                apps.setdefault(app_id(topic, p), ends[p])
                expected.setdefault(app_id(topic, p), done[p])
        _failpoint("compact.before_commit")
        if tomb_root is not None and tomb_dt is not None and (tomb_buckets or full):
            commit_actions(
                tomb_root,
                read_version=tomb_dt.version(),
                adds=_refs(files["tomb"]),
                removes=tomb_removes,
                metadata=tomb_meta,
                operation="MERGE",
            )
            _failpoint("compact.between_commits")
        version = commit_actions(
            path,
            read_version=dt.version(),
            adds=main_adds,
            removes=main_removes,
            cdc=[
                CdcFile(f"{CHANGE_DATA}/{w.path}", w.size, w.partition_values) for w in files["cdc"]
            ],
            app_transactions=apps,
            expected_versions=expected,
            metadata=metadata,
            operation="MERGE",
            operation_parameters={"source": "records", "full": full},
        )
    except BaseException:
        _cleanup(plan)
        raise
    _failpoint("compact.after_commit")
    result.committed = version is not None
    result.seconds["commit"] = time.perf_counter() - started
    result.table_version = version if version is not None else dt.version()
    result.progress = dict(sorted(apps.items()))
    _cleanup(plan, keep=files, committed=version is not None)
    log(
        f"{topic}: version {result.table_version}: +{result.inserted} ~{result.updated} "
        f"-{result.deleted} from {result.records_read} records, "
        f"{result.buckets_rewritten} buckets rewritten, "
        f"{result.buckets_with_deletion_vectors} with deletion vectors"
    )
    return result


def _refs(files: Sequence[WrittenFile]) -> list[FileRef]:
    return [
        FileRef(f.path, f.size, f.partition_values, f.stats, f.modification_time) for f in files
    ]


def _cleanup(
    plan: _TaskPlan,
    *,
    keep: Mapping[str, Sequence[WrittenFile]] | None = None,
    committed: bool = False,
) -> None:
    """Remove this run's files: after a failure, all of them that no version references (the
    tombstone table may have committed before the topic table's commit failed); after the
    run, the attempts' leftovers (all of them if it committed nothing). Then its staging and
    its owner marker: the run is over."""
    dvs = _journaled_dv_files(_owner_path(plan.root, plan.write_id))
    if keep is None:
        referenced = _referenced_files(plan.root)
        cleanup_write_files(plan.root, plan.write_id, keep=referenced)
        if plan.tomb_root is not None:
            cleanup_write_files(
                plan.tomb_root, plan.write_id, keep=_referenced_files(plan.tomb_root)
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


def _run_merge(  # noqa: PLR0917
    spark: SparkSession,
    plan: _TaskPlan,
    rec_files: list[str],
    main_paths: list[str],
    tomb_paths: list[str],
    records_path: str,
    topic: str,
    ranges: Mapping[int, tuple[int, int]],
    buckets: int,
    seconds: dict[str, float] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, list[WrittenFile]]]:
    """Step 3 on Spark (the direct path above): returns the tasks' bucket reports and the
    files they wrote. ``records_path`` and ``topic`` are already resolved into ``rec_files``."""
    del records_path, topic
    inputs = [_StageInput(p, 0) for p in rec_files]
    if plan.full:
        # Every current row goes through the staging too, bucketed again (N may change).
        inputs += [_StageInput(p, 1, plan.deleted.get(p)) for p in main_paths]
        inputs += [_StageInput(p, 2) for p in tomb_paths]
    if not inputs:
        return [], {"main": [], "cdc": [], "tomb": []}
    sc = spark.sparkContext
    parallelism = max(1, sc.defaultParallelism)
    staging = os.path.join(plan.root, STAGING, plan.write_id)
    _clear_stale_staging(plan.root)
    try:
        groups = _stage_groups(inputs, parallelism)
        stage = functools.partial(
            _stage_task,
            staging=staging,
            ranges=dict(ranges),
            buckets=buckets,
            strategy=plan.strategy,
        )
        started = time.perf_counter()
        staged = run_in_job_group(
            spark,
            f"loglake-compact-stage-{plan.write_id}",
            sc.parallelize(groups, len(groups)).mapPartitionsWithIndex(stage).collect,
        )
        _failpoint("compact.after_stage1")
        by_bucket: dict[int, list[str]] = {}
        rows_in: dict[int, int] = {}
        for line in staged:
            item = json.loads(line)
            by_bucket.setdefault(item["bucket"], []).append(item["path"])
            rows_in[item["bucket"]] = rows_in.get(item["bucket"], 0) + item["rows"]
        if not by_bucket:
            return [], {"main": [], "cdc": [], "tomb": []}
        # buckets to tasks: largest first onto the least loaded task
        n2 = max(1, min(len(by_bucket), 2 * parallelism))
        loads = [0] * n2
        assigned: list[dict[int, list[str]]] = [{} for _ in range(n2)]
        for b in sorted(by_bucket, key=lambda b: -rows_in[b]):
            t = loads.index(min(loads))
            assigned[t][b] = by_bucket[b]
            loads[t] += rows_in[b]
        merge = functools.partial(_merge_staged, plan=plan)
        stage1 = time.perf_counter()
        rows = run_in_job_group(
            spark,
            f"loglake-compact-merge-{plan.write_id}",
            sc.parallelize(assigned, n2).mapPartitionsWithIndex(merge).collect,
        )
        if seconds is not None:
            seconds["stage1"] = stage1 - started
            seconds["stage2"] = time.perf_counter() - stage1
        # the deletion vector files the reports name, into the table (unreferenced until the
        # commit, like the data files)
        _journal_dv_files(plan, rows)
        moved: set[str] = set()
        for row in rows:
            for report in json.loads(row)["reports"]:
                for _path, _desc, dv_file in report.get("dv", []):
                    if dv_file not in moved:
                        target = os.path.join(plan.root, DV_PREFIX, os.path.basename(dv_file))
                        os.makedirs(os.path.dirname(target), exist_ok=True)
                        os.replace(dv_file, target)
                        moved.add(dv_file)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    reports: list[dict[str, Any]] = []
    files: dict[str, list[WrittenFile]] = {"main": [], "cdc": [], "tomb": []}
    for row in rows:
        item = json.loads(row)
        reports += item["reports"]
        for phase, cpu in item.get("cpu", {}).items():
            if seconds is not None:
                seconds[phase] = seconds.get(phase, 0.0) + cpu
        for name, written in item["files"].items():
            files[name] += [WrittenFile(**w) for w in written]
    return reports, files


def run_compact(
    spark: SparkSession,
    config: CompactConfig,
    *,
    full: bool = False,
    topics: Sequence[str] | None = None,
    log: Log = _stderr,
) -> CompactSummary:
    """Compact every selected topic (``config.compacted_topics``, or ``topics`` of those)."""
    started = time.monotonic()
    selected = compacted_topics(config)
    if topics:
        unknown = sorted(set(topics) - set(selected))
        if unknown:
            raise LoglakeError(f"topics {unknown} are not compacted topics (cleanup.policy)")
        selected = {t: s for t, s in selected.items() if t in topics}
    log(f"compacted topics: {', '.join(f'{t} ({s})' for t, s in selected.items()) or 'none'}")
    summary = CompactSummary()
    for topic, strategy in selected.items():
        summary.topics.append(compact_topic(spark, config, topic, strategy, full=full, log=log))
    summary.seconds = time.monotonic() - started
    return summary
