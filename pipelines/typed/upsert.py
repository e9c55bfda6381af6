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
have greater offsets). The decoded rows of a run are collected on the driver (one Arrow IPC
buffer per task) before the merge, and the table's keys are read there when a run deletes:
the change of one run must fit in the driver's memory.

Crash behaviour: the tombstones' merge, then the table's, each one commit with the run's
progress. A kill before the first leaves files no version references (removed by
``jobs/maintain.py``'s vacuum) and both as they were; between the two, the re-run skips the
tombstones' commit (its progress is there) and filters against what it committed: a winner is
dropped only when a tombstone ranks strictly above it, so the run's own deletes still apply.
Failpoint between them: ``decode.before_table_merge``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.transaction import CommitProperties, Transaction
from pyspark.sql import SparkSession

from logstore.failpoints import failpoint, kill_session
from pipelines.compaction.model import Strategy
from pipelines.compaction.plan import versions, winner_indices
from pipelines.delta.commit import check_app_transactions, commit_files, ensure_table
from pipelines.delta.direct import run_in_job_group

__all__ = [
    "CDF",
    "DELETED",
    "TOMBSTONES_SCHEMA",
    "VERSION",
    "collect_tasks",
    "envelope_version",
    "merge_winners",
    "pick_winners",
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
    return str(Path(lake) / "table_tombstones" / topic)


def envelope_version(envelope: pa.StructArray, path: str) -> pa.Array:
    """The int64 value of the dotted field ``path`` (``source.lsn``) of each envelope."""
    column: pa.Array = envelope
    for name in path.split("."):
        if not pa.types.is_struct(column.type) or column.type.get_field_index(name) < 0:
            raise ValueError(f"the CDC envelope has no field {path!r}")
        column = pc.struct_field(column, name)
    return column.cast(pa.int64())


def collect_tasks(
    spark: SparkSession,
    tasks: Sequence[Any],
    produce: Callable[[Any], Iterable[Any]],
    *,
    strategy: Strategy | None,
    by_key_only: bool,
) -> tuple[pa.Table | None, list[Any]]:
    """Run ``produce`` over ``tasks`` in the executors; each task keeps only its own winners
    of the record batches it produced (:func:`pick_winners`: the winner is a maximum, so the
    winner among the tasks' winners is the run's) and sends them back to the driver as one
    table (Arrow IPC); the other items ``produce`` yields come back as reports."""

    def run(task: Any) -> tuple[bytes, list[Any]]:
        batches: list[pa.RecordBatch] = []
        reports: list[Any] = []
        for item in produce(task):
            (batches if isinstance(item, pa.RecordBatch) else reports).append(item)
        if not batches:
            return b"", reports
        rows = pick_winners(
            pa.Table.from_batches(batches), strategy=strategy, by_key_only=by_key_only
        )
        del batches
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, rows.schema) as writer:
            writer.write_table(rows)
        return sink.getvalue().to_pybytes(), reports

    if not tasks:
        return None, []
    rdd = spark.sparkContext.parallelize(list(tasks), len(tasks)).map(run)
    results = run_in_job_group(spark, f"loglake-decode-{id(rdd)}", rdd.collect)
    tables = [pa.ipc.open_stream(buf).read_all() for buf, _ in results if buf]
    reports = [r for _, rs in results for r in rs]
    return (pa.concat_tables(tables) if tables else None), reports


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
    kafka = rows.column("_kafka").combine_chunks()
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
    rows: pa.Table | None,
    *,
    schema: pa.Schema,
    strategy: Strategy | None,
    by_key_only: bool,
    apps: Mapping[str, int],
    expected: Mapping[str, int | None],
    tombstones: str | None = None,
) -> bool:
    """Merge the winners of ``rows`` (decoded rows with ``_deleted``, and ``_version`` for a
    CDC field) into the table at ``root`` in one commit with ``apps``; False: nothing to do
    (the table already has ``apps``). ``strategy`` None: CDC (versions from ``_version``).
    ``tombstones``: the deleted keys' table, merged first (module docstring)."""
    dt = DeltaTable(root)
    if not check_app_transactions(dt, apps, expected):
        return False
    txns = [Transaction(a, int(v)) for a, v in apps.items()]
    if rows is None or rows.num_rows == 0:
        commit_files(root, [], schema=schema, app_transactions=apps, expected_versions=expected)
        return True
    source = pick_winners(rows, strategy=strategy, by_key_only=by_key_only)
    columns = [f.name for f in schema]
    source = source.select([*columns, DELETED])
    if tombstones is not None:
        source = _remember_deletes(tombstones, dt, source, by_key_only=by_key_only, apps=apps)
        failpoint("decode.before_table_merge", kill=kill_session)
    updates = {c: f"s.`{c}`" for c in columns}
    match = "t._kafka.key = s._kafka.key" + (
        "" if by_key_only else " AND t._kafka.partition = s._kafka.partition"
    )
    ranks = (
        "((s._version IS NOT NULL AND t._version IS NULL) OR s._version > t._version OR "
        "((s._version = t._version OR (s._version IS NULL AND t._version IS NULL)) AND "
        "s._kafka.offset > t._kafka.offset))"
    )
    (
        dt.merge(source, predicate=match, source_alias="s", target_alias="t",
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
    return joined["_v"].combine_chunks(), joined["_o"].combine_chunks()


def _key_columns(rows: pa.Table) -> pa.Table:
    """partition, key, offset (from ``_kafka``) and ``_version`` of ``rows``."""
    kafka = rows.column("_kafka").combine_chunks()
    return pa.table(
        {
            "partition": pc.struct_field(kafka, "partition"),
            "key": pc.struct_field(kafka, "key"),
            "offset": pc.struct_field(kafka, "offset"),
            VERSION: rows.column(VERSION).combine_chunks(),
        }
    )


def _remember_deletes(
    path: str,
    dt: DeltaTable,
    source: pa.Table,
    *,
    by_key_only: bool,
    apps: Mapping[str, int],
) -> pa.Table:
    """Merge the run's effective deletes into the tombstone table at ``path`` (one commit with
    ``apps``; skipped when it has them) and return ``source`` without the winners a tombstone
    outranks."""
    ensure_table(path, TOMBSTONES_SCHEMA, [])
    tdt = DeltaTable(path)
    keys = _key_columns(source)
    tv, to = _existing(keys, tdt.to_pyarrow_table(), by_key_only=by_key_only)
    keep = ~_above(tv, to, keys[VERSION], keys["offset"])
    source, keys = source.filter(pa.array(keep)), keys.filter(pa.array(keep))
    deleted = np.asarray(source.column(DELETED).combine_chunks().fill_null(False))
    if not check_app_transactions(tdt, apps) or not len(keys):
        return source
    effective = deleted
    if deleted.any():  # a delete takes effect only when it outranks the table's row
        current = _key_columns(dt.to_pyarrow_table(columns=["_kafka", VERSION]))
        mv, mo = _existing(keys, current, by_key_only=by_key_only)
        effective = deleted & ~_above(mv, mo, keys[VERSION], keys["offset"])
    change = keys.filter(pa.array(effective | ~deleted)).append_column(
        DELETED, pa.array(deleted[effective | ~deleted])
    )
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
    return source
