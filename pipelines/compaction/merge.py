"""Step 3b of a compaction run, on the executors: merge one bucket (``merge_bucket``).

A bucket's staged rows (the new records' winners, or in a rebuild every row) are merged with
the bucket's current files and tombstones: the winners among the new records
(``pipelines.compaction.plan``) replace the rows of the same keys when they rank higher; an
incremental merge marks the replaced rows in deletion vectors of their files and writes only
the new rows unless the bucket is better rewritten (``DV_MAX_DELETED_SHARE``,
``DV_MAX_FILES``). Writes the bucket's new data, change-data and deletion vector files under
the run's write id and reports what they replace; the driver commits (``commit``). See
:mod:`pipelines.compaction.table` for the whole run and its crash behaviour.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark import TaskContext

from logstore.objectstore import StorageSettings
from pipelines.compaction._match import KeyIndex
from pipelines.compaction.hashing import latest_indices, xxhash64
from pipelines.compaction.layout import (
    BUCKET,
    CDC_SCHEMA,
    CHANGE_DATA,
    CHANGE_TYPE,
    INPUT_COLUMNS,
    SRC,
    TABLE_SCHEMA,
    join,
    open_parquet,
)
from pipelines.compaction.model import Strategy
from pipelines.compaction.plan import VERSION, versions
from pipelines.delta.deletion_vectors import write_deletion_vectors
from pipelines.delta.files import PartitionedFileWriter
from pipelines.delta.staging import scratch_prefix

__all__ = [
    "DV_MAX_DELETED_SHARE",
    "DV_MAX_FILES",
    "TABLE_PARQUET_OPTIONS",
    "TaskPlan",
    "merge_bucket",
    "merge_rows",
    "read_table_file",
    "task_ids",
]


# ---------------------------------------------------------------------------------------------
# Executor side: merge one bucket


@dataclass(frozen=True)
class TaskPlan:
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
    # the lake's storage settings (the driver's: the job's [storage] over its environment,
    # StorageSettings.default): the executors' file operations, whose environment is the JVM's
    settings: StorageSettings = field(default_factory=StorageSettings.default)


# An incremental run rewrites a bucket instead of adding deletion vectors when the bucket's
# files would then be more than this share deleted rows, or when it has this many files.
DV_MAX_DELETED_SHARE = 0.5
DV_MAX_FILES = 16


_FILE_SCHEMA = pa.schema([f for f in TABLE_SCHEMA if f.name != BUCKET])  # bucket: a directory
_KEY_COLUMNS = ["partition", "key"]
_VALUE_COLUMNS = [n for n in _FILE_SCHEMA.names if n not in _KEY_COLUMNS]
_TAKE_BATCH_ROWS = 65536


def _open_table_file(path: str) -> pq.ParquetFile:
    return open_parquet(path)  # memory-mapped on local disk, ranges coalesced on a store


def read_table_file(path: str, deleted: np.ndarray | None) -> tuple[pa.Table, np.ndarray, int]:
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


def _take_from_file(reader: pq.ParquetFile, positions: np.ndarray) -> pa.Table:
    """The ``_VALUE_COLUMNS`` of a file's rows at ascending ``positions``: the file read a
    batch at a time and each batch's rows taken (the file's columns never all decoded at
    once; on an object store a row group's column chunks are fetched first, see
    ``layout.open_parquet``)."""
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
    # per file: the file opened once (an object store's file: its footer read once, and its
    # size asked once) and its partition and key columns
    files: list[pq.ParquetFile]
    keys: list[pa.Table]
    starts: np.ndarray
    live: np.ndarray

    @classmethod
    def read_keys(cls, paths: Sequence[str], deleted: Mapping[str, np.ndarray]) -> _CurrentRows:
        files = [_open_table_file(p) for p in paths]
        keys = [f.read(columns=_KEY_COLUMNS) for f in files]
        counts = [t.num_rows for t in keys]
        starts = np.zeros(len(keys) + 1, dtype=np.int64)
        starts[1:] = np.cumsum(counts, dtype=np.int64)
        live = np.ones(int(starts[-1]), dtype=bool)
        for path, start, n in zip(paths, starts.tolist(), counts, strict=False):
            gone = deleted.get(path)
            if gone is not None and len(gone):
                live[start + gone[gone < n]] = False
        return cls(paths, files, keys, starts, live)

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
        for i, file in enumerate(self.files):
            lo, hi = np.searchsorted(rows, self.starts[i : i + 2])
            if hi > lo:
                positions = rows[lo:hi] - self.starts[i]
                keys = self.keys[i].take(pa.array(positions, type=pa.int64()))
                parts.append(_file_rows(keys, _take_from_file(file, positions)))
        return pa.concat_tables(parts) if parts else _FILE_SCHEMA.empty_table()

    def read_all(self) -> pa.Table:
        """Every physical row (without ``bucket``), deleted ones too (see ``live``)."""
        parts = [
            _file_rows(keys, file.read(columns=_VALUE_COLUMNS))
            for file, keys in zip(self.files, self.keys, strict=True)
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
    parts = [read_table_file(p, (deleted or {}).get(p))[0] for p in paths]
    return _with_bucket(pa.concat_tables(parts), bucket)


def _as_state(rows: pa.Table, strategy: Strategy) -> pa.Table:
    """New records (keyed) in the table's schema, with their versions.

    Records of aborted transactions (model rule 2) never reach ``records`` when ingest reads
    ``read_committed`` (its default); under ``read_uncommitted`` they are there and nothing
    here tells them apart (``records`` has no transaction column): a known gap (README).
    """
    rows = rows.filter(rows.column("key").is_valid())
    rows = rows.select(INPUT_COLUMNS)
    rows = rows.cast(pa.schema([TABLE_SCHEMA.field(n) for n in INPUT_COLUMNS]))
    rows = rows.add_column(7, VERSION, versions(rows, strategy))
    return rows


def _winners(rows: pa.Table) -> np.ndarray:
    """Ascending indices of the winning rows (one per keyed ``(partition, key)``) of rows with
    a ``version`` column: ``plan.winner_indices``'s rule in one hash-table pass (``hashing``)."""
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


def merge_bucket(
    bucket: int,
    rows: pa.Table,
    plan: TaskPlan,
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
    plan: TaskPlan,
    writers: dict[str, PartitionedFileWriter],
    clock: _Clock,
) -> dict[str, Any]:
    """``merge_bucket`` of an incremental run, at the cost of the change plus one pass over
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
    plan: TaskPlan, paths: Sequence[str], file_index: np.ndarray, positions: np.ndarray
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
    folder = join(plan.root, scratch_prefix(plan.write_id), "dv")
    dv_path, descriptors = write_deletion_vectors(folder, vectors, settings=plan.settings)
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


def merge_rows(
    buckets: Iterator[tuple[int, pa.Table]], plan: TaskPlan, task_id: int, attempt: int
) -> str:
    """Every bucket merged and written; one JSON line with the files and reports."""
    common: dict[str, Any] = {
        "write_id": plan.write_id,
        "task_id": task_id,
        "attempt": attempt,
        "partition_by": [BUCKET],
        "compression": plan.compression,
        "max_rows_per_file": plan.max_rows_per_file,
        "settings": plan.settings,
    }
    writers = {
        "main": _writer(plan.root, TABLE_SCHEMA, common),
        "cdc": _writer(join(plan.root, CHANGE_DATA), CDC_SCHEMA, common),
    }
    if plan.tomb_root is not None:
        writers["tomb"] = _writer(plan.tomb_root, TABLE_SCHEMA, common)
    reports = []
    clock = _Clock()
    try:
        for bucket, rows in buckets:
            reports.append(merge_bucket(bucket, rows, plan, writers, clock))
            clock.lap("stage2_cpu_other")
        files = {name: [asdict(f) for f in w.close()] for name, w in writers.items()}
        clock.lap("stage2_cpu_write_files")
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    return json.dumps({"files": files, "reports": reports, "cpu": clock.seconds})


def task_ids() -> tuple[int, int]:
    ctx = TaskContext.get()
    if ctx is None:
        return 0, 0
    return ctx.partitionId(), ctx.attemptNumber()
