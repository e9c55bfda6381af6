"""The delta-rs sink through Spark's Python Data Source API, read back independently.

Every table is read back with deltalake (delta-rs) and polars; SQL goes through Spark temporary
views and through deltalake.QueryBuilder.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf

from pipelines.delta import (
    ConcurrentWriteError,
    DeltaSinkError,
    SchemaMismatchError,
    StaleTransactionError,
    query_delta,
    read_app_transactions,
    read_delta,
    register_delta_view,
    write_delta,
)

pytestmark = pytest.mark.integration

DAY = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)


def _df(spark: SparkSession, start: int, n: int, topics: tuple[str, ...] = ("a", "b")) -> DataFrame:
    rows = [
        (
            topics[i % len(topics)],
            i,
            DAY + dt.timedelta(hours=7 * i),
            None if i % 5 == 0 else f"k{i}".encode(),
            bytes([i % 256]) * (i % 7),
        )
        for i in range(start, start + n)
    ]
    df = spark.createDataFrame(
        rows, "topic string, offset long, timestamp timestamp, key binary, value binary"
    )
    return df.withColumn("date", sf.to_date("timestamp"))


def _expected(start: int, n: int, topics: tuple[str, ...] = ("a", "b")) -> list[tuple]:
    return sorted(
        (
            topics[i % len(topics)],
            i,
            None if i % 5 == 0 else f"k{i}".encode(),
            bytes([i % 256]) * (i % 7),
        )
        for i in range(start, start + n)
    )


def _read_back(path: Path) -> list[tuple]:
    """Rows via delta-rs, checked equal to the rows via polars."""
    t = DeltaTable(str(path)).to_pyarrow_table()
    via_rs = sorted(
        zip(
            t.column("topic").to_pylist(),
            t.column("offset").to_pylist(),
            t.column("key").to_pylist(),
            t.column("value").to_pylist(),
            strict=True,
        )
    )
    p = pl.read_delta(str(path))
    via_pl = sorted(
        zip(
            p["topic"].to_list(),
            p["offset"].to_list(),
            p["key"].to_list(),
            p["value"].to_list(),
            strict=True,
        )
    )
    assert via_rs == via_pl
    return via_rs


def _data_files(path: Path) -> set[str]:
    return {
        p.relative_to(path).as_posix()
        for p in path.rglob("*.parquet")
        if "_delta_log" not in p.parts
    }


def _snapshot_files(path: Path) -> set[str]:
    dt_ = DeltaTable(str(path))
    return {Path(u).relative_to(path).as_posix() for u in dt_.file_uris()}


def test_append_twice_then_overwrite_with_history(spark: SparkSession, tmp_path: Path) -> None:
    t = tmp_path / "t"
    r0 = write_delta(_df(spark, 0, 20), t)
    r1 = write_delta(_df(spark, 20, 15), t)
    assert (r0.version, r0.num_rows, r1.version, r1.num_rows) == (0, 20, 1, 15)
    assert _read_back(t) == _expected(0, 35)
    r2 = write_delta(_df(spark, 100, 4), t, mode="overwrite")
    assert (r2.version, r2.committed, r2.num_removed) == (2, True, r0.num_files + r1.num_files)
    assert _read_back(t) == _expected(100, 4)
    history = DeltaTable(str(t)).history()
    assert [h["version"] for h in history] == [2, 1, 0]
    assert [h["operationParameters"]["mode"] for h in history[:2]] == ["Overwrite", "Append"]
    assert history[2]["operation"] == "CREATE TABLE"
    # time travel: version 1 still holds the 35 appended rows
    assert DeltaTable(str(t), version=1).to_pyarrow_table().num_rows == 35
    # nothing outside the snapshot was left behind but the overwritten (removed) files
    assert _snapshot_files(t) <= _data_files(t)
    assert len(_data_files(t)) == r0.num_files + r1.num_files + r2.num_files


def test_partitioned_table_layout_and_values(spark: SparkSession, tmp_path: Path) -> None:
    t = tmp_path / "p"
    r = write_delta(_df(spark, 0, 30), t, partition_by=["topic", "date"])
    dt_ = DeltaTable(str(t))
    assert dt_.metadata().partition_columns == ["topic", "date"]
    actions = pa.table(dt_.get_add_actions(flatten=True)).to_pylist()
    assert len(actions) == r.num_files
    for a in actions:
        assert a["path"].startswith(f"topic={a['partition.topic']}/date={a['partition.date']}/")
        stats_rows = a["num_records"]
        on_disk = pl.read_parquet(t / a["path"])
        assert "topic" not in on_disk.columns and on_disk.height == stats_rows
    assert _read_back(t) == _expected(0, 30)
    # partition pruning in polars and delta-rs agree on one partition
    only = pl.read_delta(str(t)).filter((pl.col("topic") == "a") & (pl.col("date") == DAY.date()))
    want = [
        i
        for i in range(30)
        if i % 2 == 0 and (DAY + dt.timedelta(hours=7 * i)).date() == DAY.date()
    ]
    assert sorted(only["offset"].to_list()) == want


def test_overwrite_by_predicate_replaces_only_matching_partitions(
    spark: SparkSession, tmp_path: Path
) -> None:
    t = tmp_path / "rw"
    write_delta(_df(spark, 0, 20), t, partition_by=["topic"])
    r = write_delta(
        _df(spark, 50, 3, topics=("a",)),
        t,
        mode="overwrite",
        predicate="topic = 'a'",
        partition_by=["topic"],
    )
    assert r.committed and r.num_removed > 0
    want = sorted([x for x in _expected(0, 20) if x[0] == "b"] + _expected(50, 3, ("a",)))
    assert _read_back(t) == want
    before = DeltaTable(str(t)).version()
    with pytest.raises(DeltaSinkError, match="replace-where"):
        write_delta(
            _df(spark, 60, 2, topics=("b",)),
            t,
            mode="overwrite",
            predicate="topic = 'a'",
            partition_by=["topic"],
        )
    with pytest.raises(DeltaSinkError, match="partition columns"):
        write_delta(
            _df(spark, 60, 2, topics=("a",)),
            t,
            mode="overwrite",
            predicate="offset > 3",
            partition_by=["topic"],
        )
    assert DeltaTable(str(t)).version() == before
    assert _data_files(t) - _snapshot_files(t) == set(
        Path(f).as_posix() for f in _data_files(t) - _snapshot_files(t) if "topic=a" in f
    )  # only the replaced partition's old files remain on disk


def test_schema_mismatch_is_refused_before_any_file(spark: SparkSession, tmp_path: Path) -> None:
    t = tmp_path / "s"
    write_delta(_df(spark, 0, 5), t)
    files = _data_files(t)
    with pytest.raises(SchemaMismatchError, match="schema mismatch"):
        write_delta(_df(spark, 5, 5).withColumn("offset", sf.col("offset").cast("int")), t)
    with pytest.raises(SchemaMismatchError, match="partition columns"):
        write_delta(_df(spark, 5, 5), t, partition_by=["topic"])
    assert _data_files(t) == files and DeltaTable(str(t)).version() == 0


def test_app_transactions_make_writes_idempotent(spark: SparkSession, tmp_path: Path) -> None:
    t = tmp_path / "idem"
    apps = {"loglake-ingest/a/0": 20, "loglake-ingest/b/0": 7}
    r = write_delta(_df(spark, 0, 10), t, app_transactions=apps)
    assert r.committed and read_app_transactions(t) == apps
    files = _data_files(t)
    again = write_delta(_df(spark, 0, 10), t, app_transactions=apps)
    assert (again.committed, again.version) == (False, 0)
    assert _data_files(t) == files and _read_back(t) == _expected(0, 10)
    with pytest.raises(StaleTransactionError, match="backwards"):
        write_delta(_df(spark, 0, 10), t, app_transactions={"loglake-ingest/a/0": 19})
    nxt = write_delta(_df(spark, 10, 5), t, app_transactions={"loglake-ingest/a/0": 25})
    assert nxt.version == 1
    assert read_app_transactions(t) == {"loglake-ingest/a/0": 25, "loglake-ingest/b/0": 7}
    dt_ = DeltaTable(str(t))
    assert dt_.transaction_version("loglake-ingest/a/0") == 25
    assert _read_back(t) == _expected(0, 15)


def _commit_from_executor(table: str, app: str, version: int):  # type: ignore[no-untyped-def]
    """A mapInArrow function: partition 0 commits to ``table`` itself (a concurrent writer)."""

    def fn(batches):  # type: ignore[no-untyped-def]
        from pyspark import TaskContext

        from pipelines.delta.commit import commit_files, load_table

        ctx = TaskContext.get()
        if ctx is not None and ctx.partitionId() == 0:
            dt_ = load_table(table)
            schema = pa.schema(dt_.schema().to_arrow()) if dt_ is not None else None
            commit_files(
                table,
                [],
                schema=schema,
                partition_by=dt_.metadata().partition_columns,
                app_transactions={app: version},
            )
        yield from batches

    return fn


def test_stale_app_transaction_raced_in_commit_is_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    t = tmp_path / "race"
    write_delta(_df(spark, 0, 4), t, app_transactions={"app": 1})
    df = _df(spark, 4, 6).repartition(2)
    df = df.mapInArrow(_commit_from_executor(str(t), "app", 100), df.schema)
    with pytest.raises(StaleTransactionError, match="backwards"):
        write_delta(df, t, app_transactions={"app": 2})
    assert read_app_transactions(t) == {"app": 100}
    assert DeltaTable(str(t)).version() == 1  # only the other writer's commit
    assert _data_files(t) == _snapshot_files(t)  # our files were removed
    assert _read_back(t) == _expected(0, 4)


def test_concurrent_commit_conflicts_with_overwrite_by_predicate(
    spark: SparkSession, tmp_path: Path
) -> None:
    t = tmp_path / "conflict"
    write_delta(_df(spark, 0, 6), t, partition_by=["topic"])
    df = _df(spark, 10, 2, topics=("a",)).repartition(2)
    df = df.mapInArrow(_commit_from_executor(str(t), "other", 1), df.schema)
    with pytest.raises(ConcurrentWriteError, match="re-run"):
        write_delta(df, t, mode="overwrite", predicate="topic = 'a'", partition_by=["topic"])
    assert DeltaTable(str(t)).version() == 1
    assert _data_files(t) == _snapshot_files(t)
    assert _read_back(t) == _expected(0, 6)


def test_concurrent_appends_from_two_threads_both_land(spark: SparkSession, tmp_path: Path) -> None:
    t = tmp_path / "two"
    write_delta(_df(spark, 0, 2), t)
    results: dict[int, object] = {}

    def run(i: int) -> None:
        results[i] = write_delta(_df(spark, 100 * (i + 1), 5), t, app_transactions={f"w{i}": 1})

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    versions = sorted(r.version for r in results.values())  # type: ignore[attr-defined]
    assert versions == [1, 2]
    assert _read_back(t) == sorted(_expected(0, 2) + _expected(100, 5) + _expected(200, 5))
    assert read_app_transactions(t) == {"w0": 1, "w1": 1}


def _fail_on(offset: int):  # type: ignore[no-untyped-def]
    def fn(batches):  # type: ignore[no-untyped-def]
        for b in batches:
            yield b
            if offset in b.column("offset").to_pylist():
                raise RuntimeError(f"injected failure at offset {offset}")

    return fn


def test_failing_writer_leaves_no_commit_and_no_files(spark: SparkSession, tmp_path: Path) -> None:
    t = tmp_path / "fail"
    write_delta(_df(spark, 0, 4), t, partition_by=["topic"])
    before = _data_files(t)
    df = _df(spark, 10, 40).repartition(4, "offset")
    df = df.mapInArrow(_fail_on(49), df.schema)
    with pytest.raises(DeltaSinkError, match="nothing committed"):
        write_delta(df, t, partition_by=["topic"])
    assert DeltaTable(str(t)).version() == 0
    assert _data_files(t) == before
    assert _read_back(t) == _expected(0, 4)


def test_many_files_in_one_commit(spark: SparkSession, tmp_path: Path) -> None:
    t = tmp_path / "many"
    df = _df(spark, 0, 400, topics=("a", "b", "c", "d")).repartition(8)
    r = write_delta(df, t, partition_by=["topic"], max_rows_per_file=5)
    assert r.num_files >= 80 and r.version == 0
    log = (t / "_delta_log" / f"{0:020d}.json").read_text().splitlines()
    adds = [json.loads(line)["add"] for line in log if '"add"' in line]
    assert len(adds) == r.num_files
    assert sum(json.loads(a["stats"])["numRecords"] for a in adds) == 400
    assert _read_back(t) == _expected(0, 400, ("a", "b", "c", "d"))


def test_sql_through_spark_views_and_querybuilder(spark: SparkSession, tmp_path: Path) -> None:
    t = tmp_path / "sql"
    write_delta(_df(spark, 0, 30), t, partition_by=["topic", "date"])
    write_delta(_df(spark, 30, 10), t, partition_by=["topic", "date"])
    register_delta_view(spark, "records_view", t)
    rows = spark.sql(
        "SELECT topic, count(*) AS n, min(offset) AS lo, max(offset) AS hi, "
        "count(key) AS keys FROM records_view GROUP BY topic ORDER BY topic"
    ).collect()
    exp = _expected(0, 40)
    want = [
        (
            tp,
            sum(1 for x in exp if x[0] == tp),
            min(x[1] for x in exp if x[0] == tp),
            max(x[1] for x in exp if x[0] == tp),
            sum(1 for x in exp if x[0] == tp and x[2]),
        )
        for tp in ("a", "b")
    ]
    assert [tuple(r) for r in rows] == want
    # a view pins its snapshot: version 0 has only the first 30 rows
    assert read_delta(spark, t, version=0).count() == 30
    day = spark.sql("SELECT offset FROM records_view WHERE date = DATE'2024-03-02'").collect()
    assert sorted(r[0] for r in day) == [
        i for i in range(40) if (DAY + dt.timedelta(hours=7 * i)).date() == dt.date(2024, 3, 2)
    ]
    qb = query_delta(
        'SELECT topic, count(*) AS n, min("offset") AS lo, max("offset") AS hi, '
        "count(key) AS keys FROM r GROUP BY topic ORDER BY topic",
        {"r": t},
    )
    assert (
        list(
            zip(
                *[qb.column(c).to_pylist() for c in ("topic", "n", "lo", "hi", "keys")], strict=True
            )
        )
        == want
    )
