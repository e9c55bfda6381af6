"""Typed tables of compacted topics and Debezium CDC topics: one row per live key, upserted.

Which record of a key wins is decided by :mod:`pipelines.compaction.plan` (``versions``,
``winner_indices``: the rule of ``topics/<topic>``, so the typed table and the topic table
agree): under the topic's compaction strategy (``offset``, ``timestamp``, ``header:<name>``),
or for a CDC topic by offset or by a field of the Debezium envelope (``source.lsn``: the
version). Rows with a version beat rows without, then the greater version, then the greater
offset. Keys: ``(partition, key bytes)`` for compacted topics as in ``topics/<topic>``; the key
bytes alone for CDC (the message key is the row's primary key, whatever partition it went to).

Table: the typed columns, ``_key``, ``_kafka``, and ``_version`` (the winner's version; null
under ``offset``); change data feed on (``delta.enableChangeDataFeed``). A run's winners are
merged in **one** Delta commit (delta-rs ``merge``, with the run's progress as app
transactions): a winner replaces the key's row when it ranks higher, a tombstone (null value)
or a CDC delete (``op = "d"``) that ranks higher deletes it.

Deleted keys remember their version, as in ``topics/<topic>`` (``topic_tombstones/``): under
``timestamp``/``header:`` or a CDC field a later record with a smaller version must not bring a
deleted key back, so those tables keep ``<lake>/table_tombstones/<topic>`` (Delta: partition,
key, offset, _version; one row per deleted key). A run's winners outranked by their key's
tombstone (same rule) are dropped; a delete that takes effect records its tombstone, a live
winner removes its key's. Under ``offset`` ordering no table is kept (later records always
have greater offsets).

Where the rows are (:func:`stage_winners`): the Spark tasks decode, keep their own winners
(the winner is a maximum, so the winner among the tasks' winners is the run's) and split them
by key bucket (Spark's ``pmod(xxhash64(key), N)``, ``N`` growing with the run's input,
:data:`BUCKET_BYTES`); after Spark's shuffle one task per bucket picks the run's winners, which
stay in the executors' block manager (memory and disk). What the driver holds, and why:

- the run's keys (partition, key bytes, offset, version, deleted: :meth:`StagedWinners.keys`),
  when the table keeps tombstones: the deletes' checks compare them with the tombstone table
  and with the table's rows of the same keys (``_rows_of``: a scan keeping only those rows).
  Bounded by the run's distinct keys times (key size + 25 bytes);
- one bucket of winners at a time, streamed into delta-rs's merge
  (:meth:`StagedWinners.batches`), which runs in the driver's process (Rust, DataFusion's
  memory pool, spilling): it reads the table's files and writes the new ones and the change
  data. It stays there because a typed table is not bucketed like ``topics/<topic>``: no task
  owns a part of the table to merge into, and delta-rs writes the change data feed that
  deltalake's Python API cannot write otherwise. Bounded by the larger of a bucket's winners
  and delta-rs's merge state.

Crash behaviour: the tombstones' merge, then the table's, each one commit with the run's
progress. A kill before the first leaves files no version references (removed by
``jobs/maintain.py``'s vacuum) and both as they were; between the two, the re-run skips the
tombstones' commit (its progress is there) and filters against what it committed: a winner is
dropped only when a tombstone ranks strictly above it, so the run's own deletes still apply.
Failpoint between them: ``decode.before_table_merge``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.transaction import CommitProperties, Transaction
from pyspark import RDD, StorageLevel
from pyspark.sql import SparkSession

from logstore.failpoints import failpoint, kill_session
from logstore.objectstore import LakeLocation
from pipelines.compaction.hashing import buckets_of
from pipelines.compaction.model import Strategy
from pipelines.compaction.plan import versions, winner_indices
from pipelines.decode.arrow import one_array
from pipelines.delta.commit import check_app_transactions, commit_files, ensure_table, open_table
from pipelines.delta.direct import run_in_job_group

__all__ = [
    "BUCKET_BYTES",
    "CDF",
    "DELETED",
    "TOMBSTONES_SCHEMA",
    "VERSION",
    "StagedWinners",
    "envelope_version",
    "merge_winners",
    "pick_winners",
    "stage_winners",
    "tombstones_path",
]

DELETED = "_deleted"  # in the decoded rows only: a tombstone or a CDC delete
VERSION = "_version"
CDF = {"delta.enableChangeDataFeed": "true"}
TOMBSTONES_SCHEMA = pa.schema(
    [
        pa.field("partition", pa.int32()),
        pa.field("key", pa.binary()),
        pa.field("offset", pa.int64()),
        pa.field(VERSION, pa.int64()),
    ]
)


def tombstones_path(lake: str | Path, topic: str) -> str:
    """``<lake>/table_tombstones/<topic>``: the deleted keys of ``tables/<topic>``."""
    return LakeLocation.parse(lake).join("table_tombstones", topic).uri


def envelope_version(envelope: pa.StructArray, path: str) -> pa.Array:
    """The int64 value of the dotted field ``path`` (``source.lsn``) of each envelope."""
    column: pa.Array = envelope
    for name in path.split("."):
        if not pa.types.is_struct(column.type) or column.type.get_field_index(name) < 0:
            raise ValueError(f"the CDC envelope has no field {path!r}")
        column = pc.struct_field(column, name)
    return column.cast(pa.int64())


# Items of the winners' shuffle: (bucket >= 0, Arrow IPC of that bucket's winners of a task),
# or (-1, a report).
_REPORT = -1
_KEYS_SCHEMA = TOMBSTONES_SCHEMA.append(pa.field(DELETED, pa.bool_()))
# Rows of one bucket the driver streams into the merge at a time (at most, on average): the
# number of buckets grows with the run's input.
BUCKET_BYTES = 32 << 20


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def _from_ipc(bufs: Iterable[bytes]) -> pa.Table | None:
    tables = [pa.ipc.open_stream(b).read_all() for b in bufs]
    return pa.concat_tables(tables) if tables else None


@dataclass
class StagedWinners:
    """The run's winners, held by the executors (Spark's block manager, memory and disk), one
    Spark partition per key bucket: the driver pulls the key columns (:meth:`keys`) and then
    the rows a bucket at a time (:meth:`batches`). :meth:`release` frees them."""

    reports: list[Any]
    num_rows: int
    _stage1: RDD[tuple[int, Any]]
    _winners: RDD[bytes]

    def keys(self) -> pa.Table:
        """partition, key, offset, ``_version``, ``_deleted`` of every winner (no values)."""
        out = _from_ipc(self._winners.map(_key_ipc).collect())
        return out if out is not None else _KEYS_SCHEMA.empty_table()

    def batches(self) -> Iterator[pa.Table]:
        """The winners, one bucket at a time (``toLocalIterator``: one Spark job per bucket,
        the shuffle's files reused)."""
        for buf in self._winners.toLocalIterator():
            table = _from_ipc([buf])
            if table is not None and table.num_rows:
                yield table

    def release(self) -> None:
        self._winners.unpersist()
        self._stage1.unpersist()


def _key_ipc(buf: bytes) -> bytes:
    table = _from_ipc([buf])
    assert table is not None
    keys = _key_columns(table)
    return _ipc(keys.append_column(DELETED, table.column(DELETED)))


def stage_winners(
    spark: SparkSession,
    tasks: Sequence[Any],
    produce: Callable[[Any], Iterable[Any]],
    *,
    strategy: Strategy | None,
    by_key_only: bool,
    input_bytes: int,
) -> StagedWinners | None:
    """Run ``produce`` over ``tasks`` in the executors and pick the run's winners there.

    Stage 1 (one Spark task per task): the decoded rows' own winners (:func:`pick_winners`),
    split by key bucket (Spark's ``pmod(xxhash64(key), N)``, ``N`` from ``input_bytes``);
    stage 2 (one Spark task per bucket, after Spark's shuffle): the winners among the tasks'
    winners, which are the run's (the winner is a maximum). Only the reports (the other
    items ``produce`` yields) reach the driver here. None: no task."""
    if not tasks:
        return None
    parallelism = spark.sparkContext.defaultParallelism
    buckets = max(2 * parallelism, -(-input_bytes // BUCKET_BYTES))

    def stage1(items: Iterable[Any]) -> Iterator[tuple[int, Any]]:
        for task in items:
            rows: list[pa.RecordBatch] = []
            for item in produce(task):
                if isinstance(item, pa.RecordBatch):
                    rows.append(item)
                else:
                    yield _REPORT, item
            if not rows:
                continue
            won = pick_winners(
                pa.Table.from_batches(rows), strategy=strategy, by_key_only=by_key_only
            )
            del rows
            kafka = one_array(won.column("_kafka"))
            bucket = buckets_of(pc.struct_field(kafka, "key"), buckets)
            for b in np.unique(bucket):
                yield int(b), _ipc(won.filter(pa.array(bucket == b)))

    def stage2(items: Iterable[tuple[int, bytes]]) -> Iterator[bytes]:
        table = _from_ipc(buf for _b, buf in items)
        if table is not None:
            yield _ipc(pick_winners(table, strategy=strategy, by_key_only=by_key_only))

    first = spark.sparkContext.parallelize(list(tasks), len(tasks)).mapPartitions(stage1)
    first = first.persist(StorageLevel.MEMORY_AND_DISK)
    winners = (
        first.filter(lambda kv: kv[0] != _REPORT)
        .partitionBy(buckets, lambda b: b)
        .mapPartitions(stage2)
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    try:
        group = f"loglake-decode-{id(first)}"
        reports = run_in_job_group(
            spark, group, first.filter(lambda kv: kv[0] == _REPORT).values().collect
        )
        num_rows = run_in_job_group(spark, group, winners.map(_num_rows).sum)
    except BaseException:
        winners.unpersist()
        first.unpersist()
        raise
    return StagedWinners(reports, int(num_rows), first, winners)


def _num_rows(buf: bytes) -> int:
    table = _from_ipc([buf])
    return 0 if table is None else table.num_rows


def pick_winners(rows: pa.Table, *, strategy: Strategy | None, by_key_only: bool) -> pa.Table:
    """The winning row of each key of ``rows`` (decoded rows with ``_deleted``), its
    ``_version`` set to the version it won with (``strategy`` None: CDC, ``_version`` as
    decoded). Idempotent: the winners of winners are the same rows with the same versions."""
    ranked = _rank_table(rows, by_key_only=by_key_only)
    version = rows.column(VERSION) if strategy is None else versions(ranked, strategy)
    picked = pa.array(winner_indices(ranked, version), type=pa.int64())
    out = rows.take(picked)
    return out.set_column(out.schema.get_field_index(VERSION), VERSION,
                          pc.take(version, picked).cast(pa.int64()))  # fmt: skip


def _rank_table(rows: pa.Table, *, by_key_only: bool) -> pa.Table:
    kafka = one_array(rows.column("_kafka"))
    part = pc.struct_field(kafka, "partition")
    return pa.table(
        {
            "partition": pa.nulls(len(part), pa.int32()).fill_null(0) if by_key_only else part,
            "key": pc.struct_field(kafka, "key"),
            "offset": pc.struct_field(kafka, "offset"),
            "timestamp": pc.struct_field(kafka, "timestamp"),
            "headers": pc.struct_field(kafka, "headers"),
        }
    )


def merge_winners(
    root: str,
    staged: StagedWinners | None,
    *,
    schema: pa.Schema,
    by_key_only: bool,
    apps: Mapping[str, int],
    expected: Mapping[str, int | None],
    tombstones: str | None = None,
) -> bool:
    """Merge the run's winners (:func:`stage_winners`: decoded rows with ``_deleted``, and
    ``_version``) into the table at ``root`` in one commit with ``apps``; False: nothing to do
    (the table already has ``apps``). ``tombstones``: the deleted keys' table, merged first
    (module docstring). The winners stream into delta-rs's merge a bucket at a time."""
    dt = open_table(root)
    if not check_app_transactions(dt, apps, expected):
        return False
    txns = [Transaction(a, int(v)) for a, v in apps.items()]
    if staged is None or staged.num_rows == 0:
        commit_files(root, [], schema=schema, app_transactions=apps, expected_versions=expected)
        return True
    columns = [f.name for f in schema]
    on = ["key"] if by_key_only else ["partition", "key"]
    dropped = None
    if tombstones is not None:
        dropped = _remember_deletes(
            tombstones, dt, staged.keys(), by_key_only=by_key_only, apps=apps
        )
        failpoint("decode.before_table_merge", kill=kill_session)
    out_schema = schema.append(pa.field(DELETED, pa.bool_()))

    def source() -> Iterator[pa.RecordBatch]:
        for bucket in staged.batches():
            rows = bucket
            if dropped is not None and dropped.num_rows:
                keys = _key_columns(bucket).select(on)
                row = pa.array(np.arange(bucket.num_rows))
                kept = keys.append_column("_row", row).join(dropped, on, join_type="left anti")
                rows = bucket.take(kept["_row"].combine_chunks())
            yield from rows.select([*columns, DELETED]).cast(out_schema).to_batches()

    updates = {c: f"s.`{c}`" for c in columns}
    match = "t._kafka.key = s._kafka.key" + (
        "" if by_key_only else " AND t._kafka.partition = s._kafka.partition"
    )
    ranks = (
        "((s._version IS NOT NULL AND t._version IS NULL) OR s._version > t._version OR "
        "((s._version = t._version OR (s._version IS NULL AND t._version IS NULL)) AND "
        "s._kafka.offset > t._kafka.offset))"
    )
    reader = pa.RecordBatchReader.from_batches(out_schema, source())
    (
        dt.merge(reader, predicate=match, source_alias="s", target_alias="t",
                 commit_properties=CommitProperties(app_transactions=txns))
        .when_matched_delete(predicate=f"s._deleted AND {ranks}")
        .when_matched_update(updates=updates, predicate=f"NOT s._deleted AND {ranks}")
        .when_not_matched_insert(updates=updates, predicate="NOT s._deleted")
        .execute()
    )  # fmt: skip
    return True


def _above(v_hi: pa.Array, o_hi: pa.Array, v_lo: pa.Array, o_lo: pa.Array) -> np.ndarray:
    """Where (``v_hi``, ``o_hi``) ranks strictly above (``v_lo``, ``o_lo``): a version beats
    none, then the greater version, then the greater offset (``pipelines.compaction.plan``'s
    rule); a null offset (nothing there) ranks below everything."""

    def np_(a: pa.Array, fill: int) -> np.ndarray:
        return np.asarray(pa.array(a).fill_null(fill).to_numpy(zero_copy_only=False))

    hv, lv = np.asarray(pa.array(v_hi).is_valid()), np.asarray(pa.array(v_lo).is_valid())
    vh, vl = np_(v_hi, 0), np_(v_lo, 0)
    oh, ol = np_(o_hi, -1), np_(o_lo, -1)
    same = (hv & lv & (vh == vl)) | (~hv & ~lv)
    beats: np.ndarray = np.asarray(pa.array(o_hi).is_valid()) & (
        (hv & ~lv) | (hv & lv & (vh > vl)) | (same & (oh > ol))
    )
    return beats


def _existing(keys: pa.Table, table: pa.Table, *, by_key_only: bool) -> tuple[pa.Array, pa.Array]:
    """(version, offset) in ``table`` (columns partition, key, offset, _version) of each row of
    ``keys`` (partition, key), null where the key is absent."""
    on = ["key"] if by_key_only else ["partition", "key"]
    left = keys.select(on).append_column("_row", pa.array(np.arange(keys.num_rows)))
    right = table.select([*on, "offset", VERSION]).rename_columns([*on, "_o", "_v"])
    joined = left.join(right, on, join_type="left outer").sort_by("_row")
    return one_array(joined["_v"]), one_array(joined["_o"])


def _key_columns(rows: pa.Table) -> pa.Table:
    """partition, key, offset (from ``_kafka``) and ``_version`` of ``rows``."""
    kafka = one_array(rows.column("_kafka"))
    return pa.table(
        {
            "partition": pc.struct_field(kafka, "partition"),
            "key": pc.struct_field(kafka, "key"),
            "offset": pc.struct_field(kafka, "offset"),
            VERSION: one_array(rows.column(VERSION)),
        }
    )


def _remember_deletes(
    path: str,
    dt: DeltaTable,
    keys: pa.Table,
    *,
    by_key_only: bool,
    apps: Mapping[str, int],
) -> pa.Table:
    """Merge the run's effective deletes into the tombstone table at ``path`` (one commit with
    ``apps``; skipped when it has them) and return the keys (``partition``, ``key``, or ``key``
    alone) of the winners a tombstone outranks, which the table's merge leaves out.

    ``keys``: every winner's partition, key, offset, ``_version`` and ``_deleted``. What this
    reads of the tombstone table and of the typed table is only the rows of the run's keys
    (``_rows_of``), so the driver holds the run's keys, never a table."""
    ensure_table(path, TOMBSTONES_SCHEMA, [])
    tdt = open_table(path)
    on = ["key"] if by_key_only else ["partition", "key"]
    tv, to = _existing(keys, _rows_of(tdt, keys, by_key_only=by_key_only), by_key_only=by_key_only)
    keep = ~_above(tv, to, keys[VERSION], keys["offset"])
    dropped = keys.filter(pa.array(~keep)).select(on)
    keys = keys.filter(pa.array(keep))
    deleted = np.asarray(one_array(keys.column(DELETED)).fill_null(False))
    if not check_app_transactions(tdt, apps) or not len(keys):
        return dropped
    effective = deleted
    if deleted.any():  # a delete takes effect only when it outranks the table's row
        current = _rows_of(dt, keys.filter(pa.array(deleted)), by_key_only=by_key_only, kafka=True)
        mv, mo = _existing(keys, current, by_key_only=by_key_only)
        effective = deleted & ~_above(mv, mo, keys[VERSION], keys["offset"])
    change = keys.select(TOMBSTONES_SCHEMA.names).filter(pa.array(effective | ~deleted))
    change = change.append_column(DELETED, pa.array(deleted[effective | ~deleted]))
    match = "t.key = s.key" + ("" if by_key_only else " AND t.partition = s.partition")
    updates = {c: f"s.`{c}`" for c in TOMBSTONES_SCHEMA.names}
    txns = [Transaction(a, int(v)) for a, v in apps.items()]
    (
        tdt.merge(change, predicate=match, source_alias="s", target_alias="t",
                  commit_properties=CommitProperties(app_transactions=txns))
        .when_matched_delete(predicate="NOT s._deleted")
        .when_matched_update(updates=updates, predicate="s._deleted")
        .when_not_matched_insert(updates=updates, predicate="s._deleted")
        .execute()
    )  # fmt: skip
    return dropped


def _rows_of(dt: DeltaTable, keys: pa.Table, *, by_key_only: bool, kafka: bool = False) -> pa.Table:
    """partition, key, offset, ``_version`` of the rows of ``dt`` whose key is one of
    ``keys``' (a scan with a filter: only those rows are kept). ``kafka``: ``dt`` is a typed
    table (the columns inside ``_kafka``), else a tombstone table."""
    wanted = pc.unique(one_array(keys.column("key")))
    if kafka:
        columns: dict[str, Any] = {
            "partition": pc.field("_kafka", "partition"),
            "key": pc.field("_kafka", "key"),
            "offset": pc.field("_kafka", "offset"),
            VERSION: pc.field(VERSION),
        }
    else:
        columns = {n: pc.field(n) for n in TOMBSTONES_SCHEMA.names}
    # filtered batch by batch, not in the scan: delta-rs's dataset may type binary columns
    # binary_view while the files' statistics are binary, and the scan's pruning then fails
    parts = []
    for batch in dt.to_pyarrow_dataset().to_batches(columns=columns):
        found = pa.Table.from_batches([batch]).cast(TOMBSTONES_SCHEMA)
        found = found.filter(pc.is_in(found["key"], value_set=wanted))
        if found.num_rows:
            parts.append(found)
    found = pa.concat_tables(parts) if parts else TOMBSTONES_SCHEMA.empty_table()
    return found.cast(TOMBSTONES_SCHEMA)
