"""jobs/compact.py's table output on real Spark: the Delta topic tables equal the model.

The input is a ``records`` table as ingest leaves it (rows + ingest progress in one commit,
written with delta-rs); the output is read back with delta-rs, not with the job's code.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logstore.errors import LoglakeError
from logstore.storage.topic_config import write_topic_config
from pipelines.compaction.config import CompactConfig, compacted_topics, load_compact_config
from pipelines.compaction.model import Rec, Strategy, compact, parse_strategy
from pipelines.compaction.table import STAGING, run_compact, table_path, tombstones_path
from pipelines.delta.staging import LEASE_TTL_ENV
from tests.conftest import ROOT
from tests.fixtures.compaction import (
    append_records,
    read_table_rows,
    read_topic_table,
    timestamp_rounds,
)
from tests.fixtures.jobs import spark_submit, unreferenced_files

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration


CONF = {"spark.sql.shuffle.partitions": "2"}  # spark-submit's settings in the kill tests


def _quiet(_: str) -> None:
    pass


def _config(lake: Path, strategy: Strategy, buckets: int = 4, topic: str = "t") -> CompactConfig:
    logs = lake / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return CompactConfig(
        log_dirs=(str(logs),),
        lake=str(lake),
        topics=(topic,),
        strategies={topic: strategy},
        buckets=buckets,
    )


def _expected(recs: list[Rec], strategy: Strategy) -> dict:
    return {pk: (r.offset, r.value, list(r.headers)) for pk, r in compact(recs, strategy).items()}


workload = st.lists(
    st.tuples(
        st.integers(0, 2),  # partition
        st.one_of(st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f"]), st.none()),
        st.one_of(st.binary(min_size=1, max_size=3), st.none()),  # None: tombstone
        st.integers(0, 3),  # timestamp (ties are frequent)
        st.one_of(st.none(), st.binary(max_size=2)),  # header "v" (None: no header)
    ),
    min_size=1,
    max_size=30,
)


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    workload,
    st.sampled_from(["offset", "timestamp", "header:v"]),
    st.sampled_from([1, 3, 8]),
    st.lists(st.integers(0, 30), max_size=2),
)
def test_incremental_runs_equal_the_model(
    spark: SparkSession, raw: list[tuple], strategy_text: str, buckets: int, cuts: list[int]
) -> None:
    strategy = parse_strategy(strategy_text)
    recs: list[Rec] = []
    offsets = [0, 0, 0]
    for p, key, value, ts, header in raw:
        headers = () if header is None else (("v", header),)
        recs.append(Rec(p, offsets[p], 1_700_000_000_000 + ts, key, value, headers))
        offsets[p] += 1
    with tempfile.TemporaryDirectory() as tmp:
        lake = Path(tmp)
        config = _config(lake, strategy, buckets)
        bounds = sorted({0, len(recs), *(c for c in cuts if c < len(recs))})
        for lo, hi in itertools.pairwise(bounds):
            part = recs[lo:hi]
            progress = {p: max(r.offset for r in recs[:hi] if r.partition == p) + 1 for p in {
                r.partition for r in recs[:hi]}}  # fmt: skip
            append_records(lake, "t", part, progress)
            summary = run_compact(spark, config, log=_quiet)
            assert summary.topics[0].committed
            assert read_topic_table(table_path(lake, "t")) == _expected(recs[:hi], strategy)
        version = DeltaTable(table_path(lake, "t")).version()
        again = run_compact(spark, config, log=_quiet).topics[0]
        assert not again.committed and again.records_read == 0
        assert DeltaTable(table_path(lake, "t")).version() == version
        run_compact(spark, config, full=True, log=_quiet)
        assert read_topic_table(table_path(lake, "t")) == _expected(recs, strategy)


def _cdf(path: str, start: int) -> list[tuple[str, int, bytes, int]]:
    rows = pa.table(DeltaTable(path).load_cdf(starting_version=start).read_all()).to_pylist()
    return sorted((r["_change_type"], r["partition"], r["key"], r["offset"]) for r in rows)


def test_change_data_feed_and_version_column(spark: SparkSession, tmp_path: Path) -> None:
    strategy = Strategy("header", "v")
    config = _config(tmp_path, strategy, buckets=2)
    v = lambda n: (("v", bytes([n])),)  # noqa: E731
    first = [
        Rec(0, 0, 1, b"a", b"a1", v(1)),
        Rec(0, 1, 1, b"b", b"b1", v(1)),
        Rec(0, 2, 1, b"c", b"c1", v(5)),
    ]
    append_records(tmp_path, "t", first, {0: 3})
    run_compact(spark, config, log=_quiet)
    path = table_path(tmp_path, "t")
    assert _cdf(path, 1) == [("insert", 0, k, o) for o, k in enumerate([b"a", b"b", b"c"])]
    second = [
        Rec(0, 3, 1, b"a", b"a2", v(2)),  # update
        Rec(0, 4, 1, b"b", None, v(2)),  # delete
        Rec(0, 5, 1, b"c", b"c2", v(4)),  # smaller version: loses, no change
        Rec(0, 6, 1, b"d", b"d1", ()),  # insert (no version)
        Rec(0, 7, 1, b"b", b"b-late", v(1)),  # smaller than its tombstone: stays deleted
    ]
    append_records(tmp_path, "t", second, {0: 8})
    result = run_compact(spark, config, log=_quiet).topics[0]
    assert (result.inserted, result.updated, result.deleted) == (1, 1, 1)
    assert _cdf(path, result.table_version) == [
        ("delete", 0, b"b", 1),
        ("insert", 0, b"d", 6),
        ("update_postimage", 0, b"a", 3),
        ("update_preimage", 0, b"a", 0),
    ]
    rows = read_table_rows(path)
    assert sorted((r["key"], r["version"]) for r in rows) == [
        (b"a", 2),
        (b"c", 5),
        (b"d", None),
    ]
    tombs = pa.table(DeltaTable(tombstones_path(tmp_path, "t")).to_pyarrow_table()).to_pylist()
    assert [(r["key"], r["offset"], r["value"]) for r in tombs] == [(b"b", 4, None)]
    # a third run with one more late record for the deleted key (a separate run this time)
    append_records(tmp_path, "t", [Rec(0, 8, 1, b"b", b"b-later", v(1))], {0: 9})
    run_compact(spark, config, log=_quiet)
    assert (0, b"b") not in read_topic_table(path)


def test_settings_change_needs_full_rebuild(spark: SparkSession, tmp_path: Path) -> None:
    recs = [Rec(p, o, o, bytes([o % 5]), bytes([o]), ()) for p in (0, 1) for o in range(20)]
    append_records(tmp_path, "t", recs, {0: 20, 1: 20})
    run_compact(spark, _config(tmp_path, Strategy(), buckets=4), log=_quiet)
    with pytest.raises(LoglakeError, match="re-run with --full"):
        run_compact(spark, _config(tmp_path, Strategy(), buckets=2), log=_quiet)
    result = run_compact(spark, _config(tmp_path, Strategy(), buckets=2), full=True, log=_quiet)
    assert result.topics[0].committed
    dt = DeltaTable(table_path(tmp_path, "t"))
    assert json.loads(dt.metadata().description or "{}")["loglake.compaction.buckets"] == "2"
    assert {
        a["partition.bucket"] for a in pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    } <= {0, 1}
    assert read_topic_table(dt.table_uri) == _expected(recs, Strategy())
    # nothing changed for readers: the rebuild's change feed is empty
    assert _cdf(dt.table_uri, dt.version()) == []


def test_topic_selection_from_topic_configs_and_pipeline_toml(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_topic_config(logs, "orders", {"cleanup.policy": "compact,delete"})
    write_topic_config(logs, "clicks", {"cleanup.policy": "delete"})
    write_topic_config(
        logs, "users", {"cleanup.policy": "compact", "compaction.strategy": "timestamp"}
    )
    conf = tmp_path / "pipeline.toml"
    conf.write_text(
        f'[paths]\nlog_dirs = ["{logs}"]\nlake = "{tmp_path / "lake"}"\n'
        '[compact]\ntopics = ["extra"]\nbuckets = 8\n'
        '[compact.strategy]\norders = "header:version"\n',
        encoding="utf-8",
    )
    config = load_compact_config(conf)
    assert config.buckets == 8
    assert compacted_topics(config) == {
        "extra": Strategy(),
        "orders": Strategy("header", "version"),
        "users": Strategy("timestamp"),
    }
    conf.write_text('[paths]\nlake = "x"\n[compact]\nbucket = 3\n', encoding="utf-8")
    with pytest.raises(LoglakeError, match=r"'bucket' in \[compact\]; did you mean 'buckets'"):
        load_compact_config(conf)
    conf.write_text('[paths]\nlake = "x"\n[compact.strategy]\nt = "newest"\n', encoding="utf-8")
    with pytest.raises(LoglakeError, match="expected a compaction strategy: offset, timestamp or"):
        load_compact_config(conf)


@pytest.mark.parametrize("failpoint", ["compact.between_commits"])
def test_killed_job_leaves_the_table_and_rerun_is_exact(
    spark: SparkSession, tmp_path: Path, failpoint: str
) -> None:
    rounds = timestamp_rounds(tmp_path)
    config = _config(tmp_path, rounds.strategy, buckets=rounds.buckets)
    append_records(tmp_path, "t", rounds.first, {0: 8})
    run_compact(spark, config, log=_quiet)
    path = table_path(tmp_path, "t")
    before = (DeltaTable(path).version(), read_topic_table(path))
    append_records(tmp_path, "t", rounds.second, {0: 11})
    args = ["--config", str(rounds.conf)]
    lease_env = {**os.environ, LEASE_TTL_ENV: "3"}  # the killed run's leases: 3 s
    killed = spark_submit("compact.py", args, failpoint=failpoint, conf=CONF, env=lease_env)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert (DeltaTable(path).version(), read_topic_table(path)) == before
    (lease,) = Path(path, STAGING).glob("*.json")
    # the tombstone table did commit (the kill came between the two commits)
    tombs = pa.table(DeltaTable(tombstones_path(tmp_path, "t")).to_pyarrow_table()).to_pylist()
    assert [(r["key"], r["offset"]) for r in tombs] == [(b"\x00", 8)]
    time.sleep(3 + 2 + 1.5)  # the killed run's leases expire (ttl + margin, whole seconds)
    result = run_compact(spark, config, log=_quiet).topics[0]
    assert result.committed
    assert read_topic_table(path) == _expected(rounds.first + rounds.second, rounds.strategy)
    assert _cdf(path, result.table_version) == [
        ("delete", 0, b"\x00", 4),
        ("insert", 0, b"\x07", 10),
    ]
    takeover = f"{STAGING}/{lease.stem}.takeover"  # stays a day, for a driver waking up late
    for table in (path, tombstones_path(tmp_path, "t")):  # the killed run's files are gone
        assert unreferenced_files(table) == [takeover]


def test_incremental_runs_mark_replaced_rows_with_deletion_vectors(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A small change to a big bucket: the replaced rows get a deletion vector in their file
    and only the new rows are written; every reader (delta-rs/DataFusion, polars, Spark's
    format("delta")) sees one row per live key; the change feed is exact; a --full rebuild and
    a re-run keep it so; a bucket whose rows are mostly replaced is rewritten instead."""
    strategy = Strategy()
    config = _config(tmp_path, strategy, buckets=2)
    recs = [Rec(0, o, 1, b"k%03d" % o, b"v0-%d" % o) for o in range(200)]
    append_records(tmp_path, "t", recs, {0: 200})
    path = table_path(tmp_path, "t")
    assert run_compact(spark, config, log=_quiet).topics[0].committed
    data_files = {a["path"] for a in pa.table(DeltaTable(path).get_add_actions()).to_pylist()}
    off = 200
    for round_, keys in enumerate([range(0, 200, 10), range(5, 200, 10), [3, 4]], start=1):
        more = [Rec(0, off + i, 1, b"k%03d" % k, b"v%d-%d" % (round_, k)) for i, k in
                enumerate(keys)]  # fmt: skip
        if round_ == 3:
            more.append(Rec(0, off + len(more), 1, b"k007", None))  # a tombstone
        off += len(more)
        recs += more
        append_records(tmp_path, "t", more, {0: off})
        result = run_compact(spark, config, log=_quiet).topics[0]
        assert result.committed
        assert result.buckets_with_deletion_vectors == 2 and result.buckets_rewritten == 0
        assert read_topic_table(path) == _expected(recs, strategy)
        cdf = _cdf(path, result.table_version)
        assert sum(1 for c in cdf if c[0] == "update_postimage") == len(keys)
        assert [c[2] for c in cdf if c[0] == "delete"] == ([b"k007"] if round_ == 3 else [])
    table = DeltaTable(path)
    vectors = pa.table(table.deletion_vectors())
    assert vectors.num_rows == len(data_files)  # the first run's files, with their vectors
    # the data files of the first run are still there, now with deletion vectors
    assert data_files <= {a["path"] for a in pa.table(table.get_add_actions()).to_pylist()}
    spark_rows = spark.read.format("delta").load(path).select("partition", "key").collect()
    assert sorted((r[0], bytes(r[1])) for r in spark_rows) == sorted(_expected(recs, strategy))
    # a re-run is a no-op; --full rewrites the table without deletion vectors, same rows
    assert not run_compact(spark, config, log=_quiet).topics[0].committed
    run_compact(spark, config, full=True, log=_quiet)
    assert read_topic_table(path) == _expected(recs, strategy)
    assert pa.table(DeltaTable(path).deletion_vectors()).num_rows == 0
    # most keys replaced at once: the buckets are rewritten, not marked
    more = [Rec(0, off + k, 1, b"k%03d" % k, b"v9") for k in range(200)]
    recs += more
    append_records(tmp_path, "t", more, {0: off + 200})
    result = run_compact(spark, config, log=_quiet).topics[0]
    assert (result.buckets_rewritten, result.buckets_with_deletion_vectors) == (2, 0)
    assert read_topic_table(path) == _expected(recs, strategy)
    assert pa.table(DeltaTable(path).deletion_vectors()).num_rows == 0


def test_an_incremental_run_reads_only_files_with_new_offsets(tmp_path: Path) -> None:
    from pipelines.compaction.snapshot import record_files

    append_records(tmp_path, "t", [Rec(0, o, 1, b"k", b"v") for o in range(5)], {0: 5})
    append_records(tmp_path, "t", [Rec(1, o, 1, b"k", b"v") for o in range(3)], {0: 5, 1: 3})
    append_records(tmp_path, "t", [Rec(0, o, 1, b"k", b"v") for o in range(5, 9)], {0: 9, 1: 3})
    append_records(tmp_path, "u", [Rec(0, o, 1, b"k", b"v") for o in range(9)], {0: 9})
    records = str(tmp_path / "records")
    dt = DeltaTable(records)

    def rows(files: list[str]) -> list[tuple[int, int]]:
        got = pa.concat_tables([pa.parquet.read_table(f) for f in files]).to_pylist()
        return sorted({(r["partition"], r["offset"]) for r in got})

    everything = record_files(records, dt, "t", {0: (0, 9), 1: (0, 3)})
    assert len(everything) == 3
    assert rows(record_files(records, dt, "t", {0: (5, 9)})) == [(0, o) for o in range(5, 9)]
    assert record_files(records, dt, "t", {}) == []


def test_job_help_and_bad_config(tmp_path: Path) -> None:
    job = str(ROOT / "jobs" / "compact.py")
    out = subprocess.run(
        [sys.executable, job, "--help"], capture_output=True, text=True, check=True, timeout=120
    )
    for flag in ("--config", "--log-dirs", "--lake", "--full", "--topic"):
        assert flag in out.stdout
    conf = tmp_path / "bad.toml"
    conf.write_text('[paths]\nlake = "x"\n[compact]\nbuckets = 0\n', encoding="utf-8")
    bad = subprocess.run(
        [sys.executable, job, "--config", str(conf)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert bad.returncode == 2
    assert "[compact] buckets = 0: expected an integer in 1..65536" in bad.stderr


def test_staging_is_removed_after_a_run_and_after_a_failed_run(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The run's scratch (``<table>/_loglake_staging/<write id>/``) and its lease do not
    outlive the run, committed or failed; a failed run leaves the table as it was."""
    strategy = Strategy("offset")
    config = _config(tmp_path, strategy, buckets=3)
    recs = [Rec(p, o, 1, bytes([o % 5]), bytes([o]), ()) for p in (0, 1) for o in range(20)]
    append_records(tmp_path, "t", recs, {0: 20, 1: 20})
    assert run_compact(spark, config, log=_quiet).topics[0].committed
    path = table_path(tmp_path, "t")
    staging = Path(path) / STAGING
    assert not list(staging.rglob("*"))  # the run's scratch and lease are gone
    assert read_topic_table(path) == _expected(recs, strategy)
    before = (DeltaTable(path).version(), read_topic_table(path))
    more = [Rec(0, o, 1, bytes([o % 7]), bytes([o]), ()) for o in range(20, 30)]
    append_records(tmp_path, "t", more, {0: 30, 1: 20})
    # one of the table's files unreadable: stage 2 fails after stage 1 staged its files
    victim = next(Path(path).glob("bucket=*/*.parquet"))
    data = victim.read_bytes()
    victim.write_bytes(b"not parquet")
    try:
        with pytest.raises(LoglakeError, match="nothing committed"):
            run_compact(spark, config, log=_quiet)
    finally:
        victim.write_bytes(data)
    assert not list(staging.rglob("*"))
    assert unreferenced_files(path) == []  # nor any file the failed run wrote
    assert (DeltaTable(path).version(), read_topic_table(path)) == before
    assert run_compact(spark, config, log=_quiet).topics[0].committed
    assert read_topic_table(path) == _expected(recs + more, strategy)
