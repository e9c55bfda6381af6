"""The typed tables job: ``records`` -> ``<lake>/tables/<topic>`` and ``<lake>/dead_letters``.

Table ``tables/<topic>`` (Delta, append-only): one column per field of the topic's newest
value schema (``pipelines.typed.wire``, types as Delta holds them: ``pipelines.typed.columns``),
``_key`` (the key decoded, when the registry has ``<topic>-key``; else absent), and ``_kafka``:
struct<partition int, offset long, timestamp timestamp, timestamp_type int, key binary,
headers array<struct<key string, value binary>>, key_schema_id int, value_schema_id int>.
Tombstones (null values) have nothing to decode and are counted, not written.

Table ``dead_letters`` (Delta, append-only): topic, partition, offset, timestamp, part
(``value`` or ``key``: which did not decode), schema_id (null without a header), error, key,
value (the raw bytes), headers.

Progress: app transactions ``loglake-decode/<topic>/<partition>`` = the next offset of
``records`` the table reflects (ingest's progress at the ``records`` snapshot read), in the
typed table's commit; the same ids in ``dead_letters`` say up to where its rows of that topic
go. A run, per topic:

1. pins the ``records`` snapshot, reads ingest's progress ``E[p]`` in it and the table's ``S[p]``
   (and ``D[p] >= S[p]`` of dead_letters); nothing to do when ``E == S`` (a re-run is a no-op);
2. asks the registry for the subject's newest version (the reader schema) and the key subject;
   a schema that adds fields grows the table first (one commit adding nullable columns, in the
   table's history; older versions' records decode into the newest shape through the schema
   type's resolution rules);
3. Spark tasks (one per group of ``records`` files that may hold offsets ``[S[p], E[p])``) read
   those files with pyarrow, decode keys and values by schema id (each task asks the registry
   for the writer schemas it meets), write the decoded rows as Parquet files of the table
   (``pipelines.delta.direct.stage_files``) and the records that did not decode (offsets
   ``>= D[p]``) as Parquet files of ``dead_letters``, under the write id of the run's staged
   write of that table (taken by the driver before step 3: its lease, no task of its own;
   :mod:`pipelines.typed.dead_letters`). No row comes back to the driver: only the files'
   metadata and counts (and the first failure, for ``on_error = "fail"``'s message);
4. the driver commits the dead letters' files (progress ``E``) and then the typed table's
   files with progress ``E``, each in one Delta commit. (Upsert tables: the tasks pick the
   winners and the driver merges them, :func:`_decode_upsert`.)

Crash behaviour: a kill before step 4's first commit leaves both tables as they were (the
staged files of both are referenced by nothing; the next run's staged write of each table
removes them once their lease expired); a failed run (a task's error, ``on_error = "fail"``)
removes them itself. Between the two commits, the next run finds ``D = E_old`` and writes no
dead letter twice; after the second, the run is done.
A kill during the schema change of step 2 leaves nullable columns and no rows: harmless, the
next run finds the table's schema already grown. A topic's first run creates its table (empty)
before step 3, as every loglake table exists from its job's first run on: a kill then leaves
it empty, with no progress. Failpoints (``LOGLAKE_FAILPOINT``):
``decode.before_dead_letters``, ``delta.before_commit`` (first reached at the dead letters'
commit), ``decode.before_commit``, and for upsert tables that keep tombstones
``decode.before_table_merge`` (:mod:`pipelines.typed.upsert`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake import Schema as DeltaSchema
from pyspark.sql import SparkSession

from logstore.errors import CorruptRecordError, InvalidConfigError
from logstore.failpoints import failpoint, kill_session
from pipelines.compaction.layout import open_input
from pipelines.compaction.model import Strategy
from pipelines.decode.arrow import one_array
from pipelines.delta.commit import create_table, ensure_table, load_table, merge_schema, open_table
from pipelines.delta.direct import StagedWrite, stage_files
from pipelines.delta.files import parquet_column_paths
from pipelines.typed.columns import SchemaChangeError, conform, merge_schemas
from pipelines.typed.config import DecodeConfig
from pipelines.typed.dead_letters import (
    DEAD_LETTERS_SCHEMA,
    HEADERS_TYPE,
    DeadLetterSink,
    DeadLetterWriter,
    commit_dead_letters,
    dead_letter_rows,
    stage_dead_letters,
)
from pipelines.typed.registry import RegisteredSchema, RegistryClient, SchemaNotFoundError
from pipelines.typed.upsert import (
    CDF,
    DELETED,
    VERSION,
    envelope_version,
    merge_winners,
    stage_winners,
    tombstones_path,
)
from pipelines.typed.wire import Decoders, decode_column, reader_type
from pipelines.worker import start_task

__all__ = [
    "APP_PREFIX",
    "DEAD_LETTERS_SCHEMA",
    "KAFKA_TYPE",
    "TYPED_PARQUET_WRITER",
    "DecodeFailedError",
    "DecodeSummary",
    "TopicResult",
    "app_id",
    "decode_topic",
    "run_decode",
    "typed_parquet_options",
]

APP_PREFIX = "loglake-decode"
KAFKA_TYPE = pa.struct(
    [
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestamp_type", pa.int32()),
        pa.field("key", pa.binary()),
        pa.field("headers", HEADERS_TYPE),
        pa.field("key_schema_id", pa.int32()),
        pa.field("value_schema_id", pa.int32()),
    ]
)
# Increasing within a partition: ~0 bytes a row as deltas, and no dictionary to build and drop.
_DELTA_ENCODED = ("_kafka.offset", "_kafka.timestamp")
_KAFKA_STATISTICS = ("_kafka.partition", "_kafka.offset", "_kafka.timestamp")
_RECORD_COLUMNS = ["partition", "offset", "timestamp", "timestamp_type", "key", "value", "headers"]
_RESERVED = ("_key", "_kafka")
_BATCH_ROWS = 65536

Log = Callable[[str], None]


class DecodeFailedError(CorruptRecordError):
    """Records did not decode under ``on_error = "fail"`` (nothing committed)."""


def app_id(topic: str, partition: int) -> str:
    """The app transaction id of ``topic``'s ``partition`` in the typed tables."""
    return f"{APP_PREFIX}/{topic}/{partition}"


@dataclass
class TopicResult:
    """What one topic's run did."""

    topic: str
    committed: bool = False
    rows: int = 0
    dead_letters: int = 0
    tombstones: int = 0
    schema_version: int | None = None
    added_columns: list[str] = field(default_factory=list)
    progress: dict[int, int] = field(default_factory=dict)
    note: str = ""


@dataclass
class DecodeSummary:
    """What a run did, per topic."""

    topics: list[TopicResult] = field(default_factory=list)

    def describe(self) -> str:
        if not self.topics:
            return "decode: no topic to decode"
        lines = [
            f"decode {r.topic}: {r.rows} rows, {r.dead_letters} dead letters, {r.tombstones} "
            f"tombstones"
            + (f", added columns {r.added_columns}" if r.added_columns else "")
            + (f" ({r.note})" if r.note else "")
            for r in self.topics
        ]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "topics": [
                vars(r) | {"progress": {str(k): v for k, v in r.progress.items()}}
                for r in self.topics
            ]
        }


@dataclass(frozen=True)
class _Task:
    """One Spark task: ``records`` files to read, the offsets of each partition to take."""

    files: tuple[str, ...]
    topic: str
    ranges: Mapping[int, tuple[int, int]]
    dead_from: Mapping[int, int]
    registry_url: str
    value_schema: RegisteredSchema
    key_schema: RegisteredSchema | None
    target: pa.Schema
    dead_letters: DeadLetterSink
    upsert: bool = False  # keep tombstones, add _deleted (and _version for a CDC field)
    cdc_order: str | None = None  # a CDC topic: "offset" or the envelope's version field
    strategy: Strategy | None = None  # an upsert topic's rule (None: CDC, by ``_version``)


# The writer of a typed table's data files: loglake's FastParquetWriter wherever it supports
# the table's schema (PartitionedFileWriter falls back to pyarrow's per file otherwise), with
# decimals of precision <= 18 as INT32/INT64 (Parquet's DECIMAL logical type over integers:
# Spark, delta-rs and polars read it; Delta's statistics are taken from the Arrow data and
# do not change). Why: on the bench's typed table (tests/perf/bench_parquet_typed.py, 1M rows,
# zstd) it writes ~364 ns a row and 3.7 bytes against pyarrow's ~428 ns and 7.7 bytes. The
# decode job at 10M records (tests/perf/bench_decode.py --job, 2026-11-29, four runs):
# 0.99-1.27 CPU-us a record, decode / raw ingest 0.45-0.60 wall, 0.51-0.65 by CPU (with
# pyarrow's writer the same day: 1.37, 0.43 wall, 0.47 by CPU).
TYPED_PARQUET_WRITER: dict[str, Any] = {
    "parquet_writer": "loglake",
    "store_decimal_as_integer": True,
}


def typed_parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """The Parquet writer options of a typed table's data files (``PartitionedFileWriter``'s).

    pyarrow's defaults but for: ``_kafka.offset`` and ``_kafka.timestamp`` DELTA_BINARY_PACKED
    (no dictionary); min/max statistics only on the top-level columns that are not nested and
    on ``_kafka``'s partition, offset and timestamp (what readers filter row groups on; Delta's
    own file statistics are computed from the Arrow data either way). Why, measured on the
    bench's 12-field schema (``tests/perf/bench_decode.py``, 1M rows, one core, zstd):
    pyarrow's defaults ~320-345 ns a row and 16.1 bytes, these ~250-280 ns and 13.8 bytes;
    statistics on every leaf of the nested columns alone cost ~30 ns a row.
    """
    paths = parquet_column_paths(schema)
    nested = {f.name for f in schema if pa.types.is_nested(f.type)}
    delta = [p for p in _DELTA_ENCODED if p in paths]
    return {
        "use_dictionary": [p for p in paths if p not in delta],
        "write_statistics": [
            p for p in paths if p in _KAFKA_STATISTICS or (p in schema.names and p not in nested)
        ],
        "column_encoding": dict.fromkeys(delta, "DELTA_BINARY_PACKED"),
    }


# ---------------------------------------------------------------------------------------------
# Executor side


def _in_ranges(
    part: pa.Array, offset: pa.Array, ranges: Mapping[int, tuple[int, int]]
) -> pa.Array | None:
    """Rows whose (partition, offset) is in ``ranges`` (vectorised: a lookup by partition);
    None when every row is (checked first by the batch's bounds: a batch of ``records`` holds
    one partition's consecutive offsets, nearly always all wanted or none)."""
    if part.null_count == 0 and offset.null_count == 0:
        parts, offs = pc.min_max(part), pc.min_max(offset)
        p = parts["min"].as_py()
        if p == parts["max"].as_py() and p in ranges:
            start, end = ranges[p]
            if start <= offs["min"].as_py() and offs["max"].as_py() < end:
                return None
    top = max(ranges) + 1
    lo = np.full(top + 1, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.zeros(top + 1, dtype=np.int64)
    for p, (s, e) in ranges.items():
        lo[p], hi[p] = s, e
    parts = np.asarray(part.to_numpy(zero_copy_only=False), dtype=np.int64)
    parts = np.where((parts >= 0) & (parts < top), parts, top)
    offs = np.asarray(offset.to_numpy(zero_copy_only=False), dtype=np.int64)
    return pa.array((offs >= lo[parts]) & (offs < hi[parts]))


def _read_records(path: str, ranges: Mapping[int, tuple[int, int]]) -> Iterator[pa.Table]:
    """The rows of ``path`` in ``ranges``, a batch at a time (a data file of ``records`` may
    hold millions of rows: never all of them in memory at once)."""
    with open_input(path) as source:  # the lake's store, with the task's settings
        reader = pq.ParquetFile(source)
        # in the task's thread: Spark runs a task per core already, and Arrow's pool on top
        # decoded the pages in other threads for more CPU in all (the ``value`` column's snappy
        # is ~0.14 us of a row's ~0.17; 2M rows, one process: ~205-225 -> ~165-180 ns a row)
        batches = reader.iter_batches(
            batch_size=_BATCH_ROWS, columns=_RECORD_COLUMNS, use_threads=False
        )
        for batch in batches:
            keep = _in_ranges(batch.column("partition"), batch.column("offset"), ranges)
            table = pa.Table.from_batches([batch])
            if keep is not None and keep.false_count:  # filter() copies every column
                table = table.filter(keep)
            if table.num_rows:
                yield table


def _kafka_column(rows: pa.Table, key_ids: pa.Array, value_ids: pa.Array) -> pa.StructArray:
    return pa.StructArray.from_arrays(
        [
            one_array(rows["partition"]).cast(pa.int32()),
            one_array(rows["offset"]).cast(pa.int64()),
            one_array(rows["timestamp"]).cast(pa.timestamp("us", tz="UTC")),
            one_array(rows["timestamp_type"]).cast(pa.int32()),
            one_array(rows["key"]).cast(pa.binary()),
            one_array(rows["headers"]).cast(HEADERS_TYPE),
            key_ids,
            value_ids,
        ],
        fields=list(KAFKA_TYPE),
    )


def _decode_rows(
    task: _Task,
    rows: pa.Table,
    value_dec: Decoders,
    key_dec: Decoders | None,
    dead: DeadLetterWriter,
) -> Iterator[Any]:
    """Decoded rows of ``rows`` (no tombstones) in ``task.target``'s shape, then reports; the
    rows that did not decode go to ``dead``."""
    n = rows.num_rows
    value = decode_column(one_array(rows["value"]), value_dec)
    errors = value.errors
    part = pa.array(["value"] * n, type=pa.string()) if errors.null_count < n else None
    ids = value.schema_ids
    key_ids = pa.nulls(n, pa.int32())
    columns: dict[str, pa.Array] = {}
    if key_dec is not None:
        keys = one_array(rows["key"])
        has_key = keys.is_valid()
        decoded = decode_column(keys.fill_null(b""), key_dec)
        key_ids = pc.if_else(has_key, decoded.schema_ids, pa.scalar(None, pa.int32()))
        key_err = pc.if_else(has_key, decoded.errors, pa.scalar(None, pa.string()))
        columns["_key"] = pc.if_else(has_key, decoded.values, pa.scalar(None, decoded.values.type))
        use_key = pc.and_(errors.is_null(), key_err.is_valid())
        if pc.any(use_key).as_py():
            errors = pc.if_else(use_key, key_err, errors)
            ids = pc.if_else(use_key, key_ids, ids)
            part = pc.if_else(
                use_key, pa.scalar("key"), part if part is not None else pa.scalar("value")
            )
    failed = errors.is_valid()
    nfailed = pc.sum(failed).as_py() or 0
    if nfailed:
        assert part is not None
        first = int(pc.index(failed, True).as_py())
        yield {
            "first_error": [
                rows["partition"][first].as_py(),
                rows["offset"][first].as_py(),
                errors[first].as_py(),
            ]
        }
        fresh = {p: (d, np.iinfo(np.int64).max) for p, d in task.dead_from.items()}
        fresh_rows = _in_ranges(rows["partition"], rows["offset"], fresh)
        keep = failed if fresh_rows is None else pc.and_(failed, fresh_rows)
        dead.write(dead_letter_rows(task.topic, rows, keep, part=part, ids=ids, errors=errors))
    ok = pc.invert(failed)
    values = value.values
    deleted = pa.nulls(n, pa.bool_()).fill_null(False)
    version = pa.nulls(n, pa.int64())
    if task.cdc_order is not None:
        envelope = values
        values = pc.struct_field(envelope, "after")
        deleted = pc.fill_null(pc.equal(pc.struct_field(envelope, "op"), "d"), False)
        if task.cdc_order != "offset":
            version = envelope_version(envelope, task.cdc_order)
    for i, f in enumerate(values.type):
        columns[f.name] = values.field(i)
    columns["_kafka"] = _kafka_column(rows, key_ids, value.schema_ids)
    arrays = [
        conform(columns[f.name], f.type) if f.name in columns else pa.nulls(n, f.type)
        for f in task.target
    ]
    out = pa.Table.from_arrays(arrays, schema=task.target)
    if task.upsert:
        out = out.append_column(DELETED, deleted)
        out = out.set_column(out.schema.get_field_index(VERSION), VERSION, version)
    if nfailed:
        out = out.filter(ok)
    yield {"rows": out.num_rows, "failed": nfailed}
    yield from out.to_batches(max_chunksize=65536)


def _tombstone_rows(task: _Task, rows: pa.Table) -> Iterator[pa.RecordBatch]:
    """Tombstones of an upsert topic: rows that delete their key."""
    n = rows.num_rows
    nulls = pa.nulls(n, pa.int32())
    arrays = [
        _kafka_column(rows, nulls, nulls) if f.name == "_kafka" else pa.nulls(n, f.type)
        for f in task.target
    ]
    out = pa.Table.from_arrays(arrays, schema=task.target)
    out = out.append_column(DELETED, pa.array(np.ones(n, dtype=bool)))
    yield from out.to_batches()


def _produce(task: _Task) -> Iterator[Any]:
    """One task: decoded record batches and reports; its dead letters written to files of
    ``dead_letters`` (reported as ``dead_files``), removed again if the task fails."""
    # the lake's settings travel with the task (an executor has the JVM's environment, not the
    # driver's): the records files are read, and dead letters written, with them
    start_task(settings=task.dead_letters.settings)
    client = RegistryClient(task.registry_url)
    value_dec = Decoders(client, task.value_schema)
    key_dec = Decoders(client, task.key_schema, bare=True) if task.key_schema is not None else None
    dead = DeadLetterWriter(task.dead_letters)
    try:
        for path in task.files:
            for rows in _read_records(path, task.ranges):
                yield from _decode_batch(task, rows, value_dec, key_dec, dead)
        report = dead.close()
    except BaseException:
        dead.abort()
        raise
    yield report


def _decode_batch(
    task: _Task,
    rows: pa.Table,
    value_dec: Decoders,
    key_dec: Decoders | None,
    dead: DeadLetterWriter,
) -> Iterator[Any]:
    """One batch of records: tombstones counted (kept for an upsert table), the rest decoded."""
    live = rows["value"].is_valid()
    tombstones = rows.num_rows - (pc.sum(live).as_py() or 0)
    if tombstones:
        yield {"tombstones": tombstones}
        if task.upsert:
            yield from _tombstone_rows(task, rows.filter(pc.invert(live)))
        rows = rows.filter(live)
    if rows.num_rows:
        yield from _decode_rows(task, rows, value_dec, key_dec, dead)


# ---------------------------------------------------------------------------------------------
# Driver side


def _ingest_progress(records_path: str, rec_dt: DeltaTable) -> dict[str, dict[int, int]]:
    """Ingest's progress per topic and partition in the pinned ``records`` snapshot."""
    # here, not at the top: the executors import this module for ``_produce``, and
    # ``pipelines.ingest`` brings the broker's client (kio, hypothesis): ~1 s a Python worker
    from pipelines.ingest import read_progress  # noqa: PLC0415

    out: dict[str, dict[int, int]] = {}
    for topic, partition in read_progress(records_path):
        version = rec_dt.transaction_version(f"loglake-ingest/{topic}/{partition}")
        if version is not None:
            out.setdefault(topic, {})[partition] = int(version)
    return out


def _progress(dt: DeltaTable | None, topic: str, partitions: Sequence[int]) -> dict[int, int]:
    if dt is None:
        return {}
    out = {}
    for p in partitions:
        v = dt.transaction_version(app_id(topic, p))
        if v is not None:
            out[p] = int(v)
    return out


def _record_files(
    records_path: str, rec_dt: DeltaTable, topic: str, ranges: Mapping[int, tuple[int, int]]
) -> list[tuple[str, int]]:
    """(path, size) of the ``records`` files of ``topic`` whose stats may hold ``ranges``."""
    out = []
    for a in pa.table(rec_dt.get_add_actions(flatten=True)).to_pylist():
        if a.get("partition.topic") != topic:
            continue
        lo, hi, top = a.get("min.partition"), a.get("max.partition"), a.get("max.offset")
        if lo is not None and hi is not None and top is not None:
            starts = [s for p, (s, _e) in ranges.items() if lo <= p <= hi]
            if not starts or top < min(starts):
                continue
        out.append((os.path.join(records_path, unquote(a["path"])), int(a.get("size_bytes") or 0)))
    return out


def _groups(files: list[tuple[str, int]], parallelism: int) -> list[tuple[str, ...]]:
    """Files spread over ``2 * parallelism`` tasks at most, by size (largest first)."""
    n = max(1, min(len(files), 2 * parallelism))
    groups: list[list[str]] = [[] for _ in range(n)]
    sizes = [0] * n
    for path, size in sorted(files, key=lambda f: -f[1]):
        i = sizes.index(min(sizes))
        groups[i].append(path)
        sizes[i] += size
    return [tuple(g) for g in groups if g]


def _table_schema(dt: DeltaTable) -> pa.Schema:
    return pa.schema(dt.schema().to_arrow())


def _grow(root: str, dt: DeltaTable, target: pa.Schema, log: Log) -> list[str]:
    """Give the table ``target``'s added columns (and nested fields): one commit."""
    current = _table_schema(dt)
    added = [f.name for f in target if f.name not in current.names]
    nested = any(target.field(n).type != current.field(n).type for n in current.names)
    if nested:
        merge_schema(root, target)  # the engine's: nested structs too, the store's settings
    elif added:
        fields = DeltaSchema.from_arrow(pa.schema([target.field(n) for n in added])).fields
        dt.alter.add_columns(list(fields))
    if added or nested:
        log(f"decode: {root}: schema grown ({', '.join(added) or 'nested fields'})")
    return added


def decode_topic(
    spark: SparkSession,
    config: DecodeConfig,
    client: RegistryClient,
    topic: str,
    *,
    records: DeltaTable,
    ingested: Mapping[int, int],
    log: Log,
) -> TopicResult:
    """One topic's run (module docstring, steps 1-4)."""
    result = TopicResult(topic)
    root = config.table_path(topic)
    dt = load_table(root)
    done = _progress(dt, topic, list(ingested))
    ranges = {p: (done.get(p, 0), e) for p, e in ingested.items() if e > done.get(p, 0)}
    result.progress = dict(ingested)
    if not ranges and dt is not None:
        result.note = "up to date"
        return result
    value_schema = client.latest(config.subject(topic))
    if value_schema is None:
        raise InvalidConfigError(
            f"topic {topic!r}: the registry at {config.registry_url} has no subject "
            f"{config.subject(topic)!r} ([decode.subject] names another)"
        )
    result.schema_version = value_schema.version
    key_schema = client.latest(f"{topic}-key")
    cdc_order = config.cdc.get(topic)
    strategy = config.compacted.get(topic)
    upsert = cdc_order is not None or strategy is not None

    def build(schema: RegisteredSchema) -> pa.Schema:
        return _target_schema(topic, schema, key_schema, cdc=cdc_order is not None, upsert=upsert)

    target = build(value_schema)
    if dt is None and upsert:
        create_table(root, target, configuration=CDF)
        dt = open_table(root)
    elif dt is None:
        ensure_table(root, target, [])
        dt = load_table(root)
        assert dt is not None
    else:
        reader, target = _fit(client, config.subject(topic), value_schema, dt, build=build, log=log)
        if reader is not value_schema:
            result.note = (
                f"version {value_schema.version} changes column types the table keeps: "
                f"decoded as version {reader.version}"
            )
            value_schema = reader
            result.schema_version = reader.version
        result.added_columns = _grow(root, dt, target, log)
    target = _table_schema(open_table(root))
    dead_dt = load_table(config.dead_letters_path)
    dead_done = _progress(dead_dt, topic, list(ingested))
    dead_from = {p: max(dead_done.get(p, 0), s) for p, (s, _e) in ranges.items()}
    files = _record_files(config.records_path, records, topic, ranges)
    parallelism = spark.sparkContext.defaultParallelism
    apps = {app_id(topic, p): e for p, e in ingested.items()}
    dead_expected = {app_id(topic, p): dead_done.get(p) for p in ingested}
    dead_staged = stage_dead_letters(
        spark, config.dead_letters_path, compression=config.compression
    )
    sink = DeadLetterSink.of(dead_staged, compression=config.compression)
    tasks = [
        _Task(group, topic, ranges, dead_from, config.registry_url, value_schema, key_schema,
              target, sink, upsert=upsert, cdc_order=cdc_order,
              strategy=None if cdc_order is not None else strategy)
        for group in _groups(files, parallelism)
    ]  # fmt: skip
    if upsert:
        return _decode_upsert(config, topic, tasks, spark, result=result, dead_staged=dead_staged,
                              done=done, apps=apps, dead_expected=dead_expected,
                              input_bytes=sum(size for _path, size in files))  # fmt: skip
    try:
        staged = stage_files(
            spark,
            root,
            tasks,
            _produce,
            schema=target,
            compression=config.compression,
            max_rows_per_file=config.max_rows_per_file,
            writer_options={**typed_parquet_options(target), **TYPED_PARQUET_WRITER},
        )
    except BaseException:
        dead_staged.abort()
        raise
    try:
        failed, first = _tally(result, staged.reports)
        if failed and config.on_error == "fail":
            _fail(topic, failed, first)
        failpoint("decode.before_dead_letters", kill=kill_session)
    except BaseException:
        staged.abort()
        dead_staged.abort()
        raise
    try:
        commit_dead_letters(dead_staged, staged.reports, apps, dead_expected)  # aborts itself
        failpoint("decode.before_commit", kill=kill_session)
    except BaseException:
        staged.abort()
        raise
    committed = staged.commit(
        app_transactions=apps,
        expected_versions={app_id(topic, p): done.get(p) for p in ingested},
    )
    result.committed = committed.committed
    return result


def _target_schema(
    topic: str,
    value_schema: RegisteredSchema,
    key_schema: RegisteredSchema | None,
    *,
    cdc: bool,
    upsert: bool,
) -> pa.Schema:
    """The typed table's columns for ``value_schema`` (the ``after`` image's for CDC)."""
    values = reader_type(value_schema)
    if cdc:
        after = values.get_field_index("after")
        if after < 0 or not pa.types.is_struct(values.field(after).type):
            raise InvalidConfigError(
                f"topic {topic!r} is declared CDC ([decode.cdc]) but its value schema has no "
                "record field 'after' (a Debezium envelope: before, after, op, source, ts_ms)"
            )
        values = values.field(after).type
    clash = [f.name for f in values if f.name in _RESERVED]
    if clash:
        raise InvalidConfigError(f"topic {topic!r}: value fields {clash} clash with loglake's")
    fields = [pa.field(f.name, f.type, nullable=True) for f in values]
    if key_schema is not None:
        fields.append(pa.field("_key", reader_type(key_schema, bare=True)))
    fields.append(pa.field("_kafka", KAFKA_TYPE))
    if upsert:
        fields.append(pa.field(VERSION, pa.int64()))
    return pa.schema(fields)


def _fit(
    client: RegistryClient,
    subject: str,
    newest: RegisteredSchema,
    dt: DeltaTable,
    *,
    build: Callable[[RegisteredSchema], pa.Schema],
    log: Log,
) -> tuple[RegisteredSchema, pa.Schema]:
    """The reader schema and the table's grown schema: the newest version of ``subject``
    whose columns the table holds with their types (added columns are fine).

    Why not widen: Delta's ``typeWidening`` table feature (int -> long, float -> double, a
    decimal's precision up, date -> timestamp_ntz) is neither written nor read by deltalake
    1.6, which every reader of the lake here is built on; rewriting the column would rewrite
    the table. So the table keeps its types: the run decodes into the last version that fits,
    and records of newer writer schemas that Avro's resolution cannot read into it (a long
    into an int) fail one by one into dead_letters (or stop the run under ``on_error =
    "fail"``). Raises :class:`SchemaChangeError` (exit 2) when no version fits."""
    table = _table_schema(dt)
    try:
        return newest, merge_schemas(table, build(newest))
    except SchemaChangeError as exc:
        refused = exc
    for version in range(int(newest.version or 1) - 1, 0, -1):
        try:
            older = client.version(subject, version)
            target = merge_schemas(table, build(older))
        except (SchemaNotFoundError, SchemaChangeError):
            continue
        log(
            f"decode: {subject} version {newest.version}: {refused}; decoding into version "
            f"{version}, the newest the table holds (records it cannot read: dead letters)"
        )
        return older, target
    raise refused


def _tally(result: TopicResult, reports: Sequence[Any]) -> tuple[int, list[Any] | None]:
    """The count of failed records in the tasks' reports and the first failure (partition,
    offset, error); counts rows, tombstones and dead letters written into ``result``."""
    failed = 0
    first: list[Any] | None = None
    for report in reports:
        failed += int(report.get("failed", 0))
        result.tombstones += int(report.get("tombstones", 0))
        result.rows += int(report.get("rows", 0))
        result.dead_letters += int(report.get("dead_letters", 0))
        if first is None and "first_error" in report:
            first = report["first_error"]
    return failed, first


def _fail(topic: str, failed: int, first: list[Any] | None) -> None:
    partition, offset, error = first or (None, None, None)
    raise DecodeFailedError(
        f"topic {topic!r}: {failed} records did not decode (first: partition "
        f"{partition} offset {offset}: {error}); "
        'nothing committed ([decode] on_error = "dead_letter" sends them to dead_letters)'
    )


def _decode_upsert(
    config: DecodeConfig,
    topic: str,
    tasks: Sequence[_Task],
    spark: SparkSession,
    *,
    result: TopicResult,
    dead_staged: StagedWrite,
    done: Mapping[int, int],
    apps: Mapping[str, int],
    dead_expected: Mapping[str, int | None],
    input_bytes: int,
) -> TopicResult:
    """Steps 3-4 for a compacted or CDC topic (:mod:`pipelines.typed.upsert`): the executors
    decode and pick the run's winners, the driver streams them into the table's merge."""
    task = tasks[0] if tasks else None
    by_key_only = topic in config.cdc
    strategy = task.strategy if task is not None else None
    try:
        staged = stage_winners(spark, tasks, _produce, strategy=strategy, by_key_only=by_key_only,
                               input_bytes=input_bytes)  # fmt: skip
    except BaseException:
        dead_staged.abort()
        raise
    try:
        try:
            failed, first = _tally(result, staged.reports if staged is not None else [])
            if failed and config.on_error == "fail":
                _fail(topic, failed, first)
            failpoint("decode.before_dead_letters", kill=kill_session)
        except BaseException:
            dead_staged.abort()
            raise
        commit_dead_letters(dead_staged, staged.reports if staged is not None else [], apps,
                             dead_expected)  # fmt: skip
        failpoint("decode.before_commit", kill=kill_session)
        root = config.table_path(topic)
        compacted = config.compacted.get(topic)
        result.committed = merge_winners(
            root,
            staged,
            schema=_table_schema(open_table(root)),
            by_key_only=by_key_only,
            apps=apps,
            expected={app_id(topic, p): done.get(p) for p in result.progress},
            tombstones=(
                None
                if config.cdc.get(topic, "") == "offset"
                or (compacted is not None and compacted.kind == "offset")
                else tombstones_path(config.lake, topic)
            ),
        )
    finally:
        if staged is not None:
            staged.release()
    return result


def run_decode(
    spark: SparkSession,
    config: DecodeConfig,
    *,
    topics: Sequence[str] | None = None,
    log: Log | None = None,
) -> DecodeSummary:
    """Decode every topic to decode (``topics``: only those) into its typed table."""
    say = log or (lambda m: None)
    summary = DecodeSummary()
    records = load_table(config.records_path)
    if not config.registry_url:
        say("decode: [decode] schema_registry_url is not set: nothing to decode")
        return summary
    if records is None:
        say(f"decode: no records table at {config.records_path}: nothing to decode")
        return summary
    ingest = _ingest_progress(config.records_path, records)
    client = RegistryClient(config.registry_url)
    named = list(topics or config.named_topics())
    if named:
        chosen = named
    else:
        chosen = [
            t
            for t in sorted(ingest)
            if not t.startswith("_") and client.latest(config.subject(t)) is not None
        ]
    for topic in chosen:
        if topic not in ingest:
            summary.topics.append(TopicResult(topic, note="not ingested yet"))
            continue
        summary.topics.append(
            decode_topic(
                spark, config, client, topic, records=records, ingested=ingest[topic], log=say
            )
        )
    return summary
