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
reader 3 / writer 7), unless ``[compact.deletion_vectors] <topic> = false`` (or ``[compact]
default_deletion_vectors = false``): then it is created without them (reader 1 / writer 4, the
change data feed's) and every run rewrites the buckets it changes (copy-on-write). With them,
an incremental run merges a bucket by marking the rows it replaces or deletes in a deletion
vector of their file (``pipelines.delta.deletion_vectors``: the Delta DV
format, files under ``<table>/dv/``; the file is removed and added again with its new vector in
the commit) and writing only the new rows, so its writes grow with the change, not with the
table; a bucket is rewritten instead when its files would be more than half deleted rows
(counting every row a new record matches as replaced: decided before any value is read) or it
has 16 files (``DV_MAX_DELETED_SHARE``, ``DV_MAX_FILES``). ``--full`` writes files without
vectors. Readers that honour them: delta-rs's DataFusion (``deltalake.QueryBuilder``,
``loglake sql``), polars, Spark through ``pipelines.delta`` (``read_delta``, ``format("delta")``);
deltalake 1.6's ``to_pyarrow_table``/``to_pyarrow_dataset`` refuse such a table (they do not
support the ``deletionVectors`` reader feature). The feature is fixed when the table is
created: a table created without it keeps rewriting its buckets whatever the option says, and
one created with it keeps the feature (its runs stop writing new vectors when the option turns
them off; readers lacking the feature need the table recreated: delete it and re-run).

Progress: app transactions ``loglake-compact/<topic>/<partition>`` in the table = the next
offset of ``records`` the table reflects (ingest's progress at the ``records`` snapshot read).

Under the ``timestamp`` and ``header:`` strategies a deleted key must remember its tombstone's
version (a later record with a smaller version must not bring it back), so those topics also
keep ``<lake>/topic_tombstones/<topic>`` (same layout, one row per deleted key); ``offset``
does not need it (later records always have greater offsets).

This module is the run's orchestration (``compact_topic``, ``run_compact``); its steps live in
their own modules: ``snapshot`` (steps 1-2: progress, the files), ``stage`` (step 3 on Spark,
stage 1), ``merge`` (stage 2: one bucket), ``commit`` (step 4), ``runs`` (run markers, leftovers,
reaping), ``setup`` (table creation and settings), ``layout`` (names and the schema).

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
   ``hashing.latest_indices``: the winner is a maximum, so the maximum of the tasks' maxima is
   the same), compute each row's bucket (Spark's ``pmod(xxhash64(key), N)``, computed in
   numba: ``hashing``) and write one Arrow IPC file per bucket under
   ``<table>/_loglake_staging/<write id>/`` (the run's scratch, removed when the stage-2
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
   ``E`` (``pipelines.compaction.commit`` through ``pipelines.delta.actions``: adds, removes,
   cdc and txn actions together).

``full=True`` rebuilds from all of ``records``: every bucket is recomputed from the records
alone and diffed against the old rows (so the change feed stays exact); it may change buckets
and strategy.

Crash behaviour: a run is a staged write of the Delta engine (``pipelines.delta.staging``,
through ``pipelines.compaction.runs``): before it writes anything it takes a lease under a
fresh write id in the topic table's ``_loglake_staging/`` (and one in the tombstone table's),
renewed by the driver for the run's life and released last, once its leftovers are removed
(committed or not); the driver commits only while its leases are safely live. Every file a
run writes carries its write id — data and change-data files by name (``part-<task>-<write
id>-...``, ``pipelines.delta.files``), its scratch (stage-1 files, stage-2 deletion vector
files before the move) by its place under ``_loglake_staging/<write id>/``, and its deletion
vector files in ``dv/`` (named by a uuid, as the Delta protocol wants) by their listing in the
lease, written before the driver moves them there. Every run starts by reaping the runs whose
lease expired by the store's clock (``ttl_s`` plus a margin after its last renewal; no
``flock``, no process ids, the same on local disk and on S3): their files in the topic table
and its tombstone table, except every file that any version still in the Delta log references
(adds, removes, change-data and deletion vector files: time travel may read them, and a run
killed after a commit keeps what it committed), their scratch and their leases (a takeover
tombstone stays a day). A live run's files are never touched: its lease is renewed. Writes of
a task still running on an executor after its driver died are not covered (a cluster kills
them with the driver; VACUUM removes any such file).

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

import sys
import time
from collections.abc import Sequence
from urllib.parse import unquote

from pyspark.sql import SparkSession

from logstore.errors import LoglakeError
from logstore.failpoints import failpoint, kill_session
from pipelines.compaction.commit import RunOutput, commit_topic
from pipelines.compaction.config import CompactConfig, compacted_topics
from pipelines.compaction.layout import (
    APP_PREFIX,
    BUCKET,
    CHANGE_TYPE,
    SRC,
    STAGING,
    TABLE_SCHEMA,
    VERSION,
    Log,
    app_id,
    join,
    table_path,
    tombstones_path,
)
from pipelines.compaction.merge import TaskPlan
from pipelines.compaction.model import Strategy
from pipelines.compaction.results import CompactSummary, TopicResult
from pipelines.compaction.runs import cleanup_run, reap_dead_runs, start_run
from pipelines.compaction.setup import ensure_table
from pipelines.compaction.snapshot import (
    deleted_rows,
    files_by_bucket,
    ingest_progress,
    record_files,
)
from pipelines.compaction.stage import run_stages
from pipelines.delta.commit import load_table
from pipelines.delta.errors import DeltaSinkError, first_error_line

__all__ = [
    "APP_PREFIX",
    "BUCKET",
    "CHANGE_TYPE",
    "SRC",
    "STAGING",
    "TABLE_SCHEMA",
    "VERSION",
    "CompactSummary",
    "TopicResult",
    "app_id",
    "compact_topic",
    "run_compact",
    "table_path",
    "tombstones_path",
]


def _stderr(message: str) -> None:
    print(f"[compact {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


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
    ends = ingest_progress(records_path, rec_dt, topic)
    path = table_path(config.lake, topic)
    want_dvs = config.deletion_vectors_for(topic)
    reap_dead_runs(path, tombstones_path(config.lake, topic), log)
    existing = load_table(path)
    if existing is None and not ends:
        # Every loglake table exists after its job's first run, empty if nothing went there.
        dt, _, _ = ensure_table(
            path, strategy, config.buckets, full=False, cdf=True, deletion_vectors=want_dvs
        )
        log(f"{topic}: nothing ingested yet (empty table created)")
        result.table_version = dt.version()
        return result
    # step 1: progress
    dt, buckets, metadata = ensure_table(
        path, strategy, config.buckets, full=full, cdf=True, deletion_vectors=want_dvs
    )
    has_dvs = "deletionVectors" in (dt.protocol().reader_features or [])
    if has_dvs != want_dvs:
        log(
            f"{topic}: the table was created {'with' if has_dvs else 'without'} deletion vectors "
            f"(its protocol is fixed at creation); the config says "
            f"deletion_vectors = {str(want_dvs).lower()}: "
            + (
                "buckets are rewritten, no new vectors (readers without the feature still "
                "refuse the table: delete it and re-run to recreate it without)"
                if has_dvs
                else "buckets are rewritten as before (delete the table and re-run to "
                "recreate it with them)"
            )
        )
    tomb_root = tombstones_path(config.lake, topic) if strategy.kind != "offset" else None
    tomb_dt = None
    tomb_meta = None
    if tomb_root is not None:
        tomb_dt, _, tomb_meta = ensure_table(
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
    main_files = files_by_bucket(path, dt)
    tomb_files = files_by_bucket(tomb_root, tomb_dt)
    deleted = deleted_rows(dt)
    rec_files = record_files(records_path, rec_dt, topic, ranges)
    run = start_run(path, tomb_root)  # before anything is written (see reap_dead_runs)
    write_id = run.write_id
    main_paths = {b: [join(path, unquote(f.path)) for f in fs] for b, fs in main_files.items()}
    by_path = {p: f for b, fs in main_files.items() for p, f in zip(main_paths[b], fs, strict=True)}
    tomb_paths = {
        b: [join(tomb_root, unquote(f.path)) for f in fs if tomb_root is not None]
        for b, fs in tomb_files.items()
    }
    plan = TaskPlan(
        root=path,
        tomb_root=tomb_root,
        write_id=write_id,
        strategy=strategy,
        full=full,
        compression=config.compression,
        max_rows_per_file=config.max_rows_per_file,
        # the tasks read a bucket's files themselves, except in a rebuild (see merge_bucket)
        main_files={} if full else main_paths,
        tomb_files={} if full else tomb_paths,
        deleted=deleted,
        change_data=bool(main_files),
        deletion_vectors=has_dvs and want_dvs,
    )
    log(
        f"{topic}: strategy {strategy}, {buckets} buckets; reading {len(rec_files)} records "
        "files for " + ", ".join(f"{p} [{s}, {e})" for p, (s, e) in sorted(ranges.items()))
    )
    # step 3: the merge
    result.seconds["plan"] = time.perf_counter() - started
    try:
        reports, files = run_stages(
            spark,
            plan,
            run,
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
        cleanup_run(run)
        if isinstance(exc, Exception) and not isinstance(exc, LoglakeError):
            raise DeltaSinkError(
                f"compaction of {topic} failed, nothing committed: {first_error_line(exc)}",
                path=path,
            ) from exc
        raise
    # step 4: commit
    started = time.perf_counter()
    output = RunOutput(
        root=path,
        tomb_root=tomb_root,
        topic=topic,
        full=full,
        dt=dt,
        tomb_dt=tomb_dt,
        metadata=metadata,
        tomb_meta=tomb_meta,
        main_files=main_files,
        tomb_files=tomb_files,
        by_path=by_path,
        ends=ends,
        done=done,
        ranges=ranges,
        reports=reports,
        files=files,
    )
    try:
        run.check()  # the leases are safely live: no reaper may take this run's files
        version, apps = commit_topic(output, result)
    except BaseException:
        cleanup_run(run)
        raise
    failpoint("compact.after_commit", kill=kill_session)
    result.committed = version is not None
    result.seconds["commit"] = time.perf_counter() - started
    result.table_version = version if version is not None else dt.version()
    result.progress = dict(sorted(apps.items()))
    cleanup_run(run, keep=files, committed=version is not None)
    log(
        f"{topic}: version {result.table_version}: +{result.inserted} ~{result.updated} "
        f"-{result.deleted} from {result.records_read} records, "
        f"{result.buckets_rewritten} buckets rewritten, "
        f"{result.buckets_with_deletion_vectors} with deletion vectors"
    )
    return result


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
