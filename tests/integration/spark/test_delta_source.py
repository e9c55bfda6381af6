"""``format("delta")`` on a session without Delta's jars (pipelines.delta.source), lake views,
and ``loglake sql`` over a lake made by the real ingest and lookups jobs.

Every result is checked against an independent reader: deltalake's own read of the same
version, or Spark evaluating the same predicate over that read (no pushdown involved).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession

from logstore.cli import main
from logstore.protocol.batch import Codec
from pipelines.delta import register_lake_views
from pipelines.delta.source import PUSHDOWN_KEY
from pipelines.ingest import IngestConfig, run_ingest
from pipelines.lookups import build_lookups
from tests.integration.spark.test_ingest_records import LogDir

pytestmark = pytest.mark.integration

KEY_COLS = ["topic", "partition", "offset"]


def _quiet(_msg: str) -> None:
    pass


@pytest.fixture(scope="module")
def lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two ingest runs (versions 0 and 1 of ``records``), then the lookups."""
    root = tmp_path_factory.mktemp("source")
    logs = LogDir(root / "logs")
    lake = root / "lake"
    logs.produce("events", 0, 30, codec=Codec.ZSTD, seed=1)  # 30 hours: two UTC dates
    logs.produce("events", 1, 12, codec=Codec.LZ4, seed=50)
    logs.transaction("payments", 0, 4)
    logs.checkpoint()
    cfg = IngestConfig(log_dirs=(str(logs.root),), lake=str(lake), progress_interval_s=0)
    run_ingest(spark, cfg, log=_quiet)
    logs.produce("payments", 0, 6, codec=Codec.GZIP, seed=7)
    logs.produce("events", 1, 5, seed=90)
    logs.checkpoint()
    run_ingest(spark, cfg, log=_quiet)
    build_lookups(spark, log_dirs=[str(logs.root)], lake=str(lake), check=False)
    logs.close()
    # a table with NULLs in a partition column and in a data column, several files
    t = pa.table(
        {
            "p": ["a", "a", None, "b", None, "c"],
            "n": pa.array([1, None, 3, 4, None, 6], pa.int64()),
            "s": ["x", "y", None, "zz", "x", None],
        }
    )
    for i in range(0, 6, 2):
        write_deltalake(root / "nulls", t.slice(i, 2), partition_by=["p"], mode="append")
    return lake


def _rows(table: pa.Table, cols: list[str]) -> list[tuple[object, ...]]:
    return sorted((tuple(r[c] for c in cols) for r in table.select(cols).to_pylist()), key=repr)


def _spark_rows(df: DataFrame, cols: list[str]) -> list[tuple[object, ...]]:
    return sorted((tuple(r[c] for c in cols) for r in df.select(*cols).collect()), key=repr)


RECORD_COLS = ["topic", "partition", "offset", "key", "value", "codec", "timestamp_type"]


@pytest.mark.parametrize("version", [None, 0])
def test_format_delta_equals_deltalake(
    spark: SparkSession, lake: Path, version: int | None
) -> None:
    path = str(lake / "records")
    reader = spark.read.format("delta")  # no registration here: get_spark did it
    if version is not None:
        reader = reader.option("versionAsOf", str(version))
    df = reader.load(path)
    dtab = DeltaTable(path, version=version)
    expected = dtab.to_pyarrow_table()
    assert df.columns == expected.column_names
    assert _spark_rows(df, RECORD_COLS) == _rows(expected, RECORD_COLS)
    # timestamps and dates come out as timestamps/dates, equal to deltalake's
    got_ts = sorted(
        (r.offset, r.topic, r.partition, r.ms, r.date)
        for r in df.selectExpr("offset", "topic", "partition", "unix_millis(timestamp) AS ms",
                               "date").collect()
    )  # fmt: skip
    want_ts = sorted(
        (r["offset"], r["topic"], r["partition"], int(r["timestamp"].timestamp() * 1000), r["date"])
        for r in expected.select(["offset", "topic", "partition", "timestamp", "date"]).to_pylist()
    )
    assert got_ts == want_ts
    headers = sorted(
        (r.topic, r.partition, r.offset, [(h.key, h.value) for h in r.headers])
        for r in df.select(*KEY_COLS, "headers").collect()
    )
    assert headers == sorted(
        (r["topic"], r["partition"], r["offset"], [(h["key"], h["value"]) for h in r["headers"]])
        for r in expected.select([*KEY_COLS, "headers"]).to_pylist()
    )
    if version == 0:
        assert df.count() < DeltaTable(path).to_pyarrow_table().num_rows


def _files(path: Path, where: dict[str, str] | None = None) -> int:
    actions = pa.table(DeltaTable(str(path)).get_add_actions(flatten=True)).to_pylist()
    return sum(all(a[f"partition.{k}"] == v for k, v in (where or {}).items()) for a in actions)


@pytest.fixture
def pruning(spark: SparkSession):  # type: ignore[no-untyped-def]
    """Python filter pushdown on for the test (Spark's default is off), then restored."""
    before = spark.conf.get(PUSHDOWN_KEY)
    spark.conf.set(PUSHDOWN_KEY, "true")
    yield lambda path: spark.read.format("delta").option("pruneFiles", "true").load(str(path))
    spark.conf.set(PUSHDOWN_KEY, before)


def test_partition_pruning_plans_one_partition_per_matching_file(
    spark: SparkSession, lake: Path, pruning
) -> None:
    path = lake / "records"
    total = _files(path)
    payments = _files(path, {"topic": "payments"})
    assert 0 < payments < total
    assert pruning(path).rdd.getNumPartitions() == total
    only = pruning(path).where("topic = 'payments'")
    assert only.rdd.getNumPartitions() == payments
    expected = DeltaTable(str(path)).to_pyarrow_table(filters=[("topic", "=", "payments")])
    assert _spark_rows(pruning(path).where("topic = 'payments'"), RECORD_COLS) == _rows(
        expected, RECORD_COLS
    )
    dates = sorted(r[0] for r in pruning(path).select("date").distinct().collect())
    assert len(dates) >= 2
    by_date = pruning(path).where(f"date = DATE '{dates[0]}'")
    assert by_date.rdd.getNumPartitions() == _files(path, {"date": dates[0]}) < total
    # data skipping on file statistics: no file holds an offset this large
    assert pruning(path).where("offset > 1000000").rdd.getNumPartitions() == 1  # empty one
    assert pruning(path).where("offset > 1000000").count() == 0
    # without pruneFiles every file is planned, whatever the filter
    plain = spark.read.format("delta").load(str(path))
    assert plain.where("topic = 'payments'").rdd.getNumPartitions() == total


def test_packing_files_into_partitions(spark: SparkSession, lake: Path) -> None:
    path = str(lake / "records")
    packed = spark.read.format("delta").option("maxPartitionBytes", str(1 << 30)).load(path)
    assert packed.rdd.getNumPartitions() == 1
    assert packed.count() == DeltaTable(path).to_pyarrow_table().num_rows


def test_reused_dataframe_and_view_stay_exact(spark: SparkSession, lake: Path) -> None:
    """The default reader plans every file, so Spark 4.2 reusing a relation's plan is safe."""
    path = str(lake / "records")
    total = DeltaTable(path).to_pyarrow_table().num_rows
    df = spark.read.format("delta").load(path)
    few = df.where("topic = 'payments'").count()
    assert 0 < few < total
    assert df.count() == total
    assert df.where("offset % 2 = 1").count() == sum(
        1 for v in DeltaTable(path).to_pyarrow_table().column("offset").to_pylist() if v % 2
    )
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW again USING delta OPTIONS (path '{path}')")
    assert spark.sql("SELECT count(*) FROM again WHERE topic = 'payments'").first()[0] == few
    assert spark.sql("SELECT count(*) FROM again").first()[0] == total


RECORD_PREDICATES = [
    "key IS NULL",
    "key IS NOT NULL AND value IS NULL",
    "offset >= 5 AND offset < 9",
    "offset IN (1, 3, 100)",
    "offset = 0",
    "topic <=> 'events'",
    "NOT topic = 'events'",
    "topic IN ('payments', NULL)",
    "topic LIKE 'pay%' AND offset > 2",
    "topic LIKE '%ents'",
    "topic LIKE '%ymen%'",
    "partition = 1 AND offset <= 3",
    "timestamp >= TIMESTAMP '2024-05-02 10:00:00'",
    "timestamp < TIMESTAMP '2024-05-01 23:00:00' OR offset = 40",
    "date = DATE '2024-05-02'",
    "date > DATE '2024-05-01' AND topic != 'payments'",
    "is_transactional",
    "NOT is_transactional AND codec = 'zstd'",
]
NULLS_PREDICATES = [
    "p IS NULL",
    "p IS NOT NULL",
    "p = 'a'",
    "NOT p = 'a'",
    "p <=> NULL",
    "p IN ('a', NULL)",
    "NOT p IN ('a', 'b')",
    "p > 'a'",
    "n > 1",
    "n IS NULL",
    "NOT n = 3",
    "s = 'x' AND p IS NULL",
    "s >= 'y'",
]


@pytest.mark.parametrize(
    ("table", "predicate"),
    [("records", p) for p in RECORD_PREDICATES] + [("nulls", p) for p in NULLS_PREDICATES],
)
def test_filter_pushdown_gives_the_rows_spark_alone_gives(
    spark: SparkSession, lake: Path, pruning, table: str, predicate: str
) -> None:
    path = lake / table if table == "records" else lake.parent / table
    pushed = pruning(path).where(predicate)
    # the reference: the same predicate, evaluated by Spark over deltalake's read
    ref_table = DeltaTable(str(path)).to_pyarrow_table()
    ref = spark.createDataFrame(ref_table.to_pandas(), schema=pushed.schema).where(predicate)
    cols = KEY_COLS if table == "records" else ["p", "n", "s"]
    got, want = _spark_rows(pushed, cols), _spark_rows(ref, cols)
    assert got == want
    assert pushed.rdd.getNumPartitions() <= _files(path)


def test_nulls_table_partition_pruning_is_exact(lake: Path, pruning) -> None:
    path = lake.parent / "nulls"
    # files: p=a (rows 1, NULL), p=NULL (3) + p=b (4), p=NULL (NULL) + p=c (6)
    assert pruning(path).rdd.getNumPartitions() == 5
    assert pruning(path).where("p IS NULL").rdd.getNumPartitions() == 2
    assert pruning(path).where("p = 'a'").rdd.getNumPartitions() == 1
    # NULL partition values never satisfy a comparison, nor NOT of one
    assert pruning(path).where("NOT p = 'a'").rdd.getNumPartitions() == 2
    assert sorted(r.n for r in pruning(path).where("NOT p = 'a'").collect()) == [4, 6]
    # statistics: only the files holding n = 3 or a NULL n can match
    assert pruning(path).where("n = 3").rdd.getNumPartitions() == 1
    assert pruning(path).where("n IS NULL").rdd.getNumPartitions() == 2


def test_create_temporary_view_using_delta_and_sql(spark: SparkSession, lake: Path) -> None:
    path = str(lake / "records")
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW rec USING delta OPTIONS (path '{path}')")
    spark.sql(
        f"CREATE OR REPLACE TEMPORARY VIEW rec0 USING delta "
        f"OPTIONS (path '{path}', versionAsOf '0')"
    )
    got = {
        (r.topic, r.n)
        for r in spark.sql("SELECT topic, count(*) AS n FROM rec GROUP BY topic").collect()
    }
    t = DeltaTable(path).to_pyarrow_table()
    want = {(topic, t.column("topic").to_pylist().count(topic)) for topic in ("events", "payments")}
    assert got == want
    n0 = spark.sql("SELECT count(*) FROM rec0").first()[0]
    assert n0 == DeltaTable(path, version=0).to_pyarrow_table().num_rows < t.num_rows


def test_schema_given_reads_only_those_columns(spark: SparkSession, lake: Path) -> None:
    path = str(lake / "records")
    df = spark.read.format("delta").schema("offset long, topic string").load(path)
    assert df.columns == ["offset", "topic"]
    t = DeltaTable(path).to_pyarrow_table()
    assert _spark_rows(df, ["topic", "offset"]) == _rows(t, ["topic", "offset"])


def test_errors_are_clear(spark: SparkSession, lake: Path, tmp_path: Path) -> None:
    with pytest.raises(PySparkException, match="no Delta table here"):
        spark.read.format("delta").load(str(tmp_path)).collect()
    with pytest.raises(PySparkException, match="latest version is 1"):
        spark.read.format("delta").option("versionAsOf", "7").load(str(lake / "records")).collect()


def test_register_lake_views_and_lookup_timestamps(spark: SparkSession, lake: Path) -> None:
    views = register_lake_views(spark, lake, versions={"records": 0})
    assert {"records", "offset_lookup", "time_lookup"} <= set(views)
    n0 = spark.sql("SELECT count(*) FROM records").first()[0]
    assert n0 == DeltaTable(str(lake / "records"), version=0).to_pyarrow_table().num_rows
    for name in ("time_lookup", "offset_lookup"):
        fields = {f.name: f.dataType.simpleString() for f in views[name].schema.fields}
        assert fields["max_timestamp"] == "timestamp"
        assert fields["max_timestamp_ms"] == "bigint"
        raw = DeltaTable(str(lake / name)).to_pyarrow_table()
        got = sorted(
            (r.topic, r.first_offset, r.max_timestamp_ms, r.ms)
            for r in spark.sql(
                f"SELECT topic, first_offset, max_timestamp_ms, unix_millis(max_timestamp) AS ms "
                f"FROM {name}"
            ).collect()
        )
        want = sorted(
            (r["topic"], r["first_offset"], r["max_timestamp"], r["max_timestamp"])
            for r in raw.select(["topic", "first_offset", "max_timestamp"]).to_pylist()
        )
        assert got == want
    # a join over views: every batch of the lookups holds records of the latest records table
    register_lake_views(spark, lake)
    q = spark.sql("SELECT count(*) FROM records WHERE topic = 'payments'")
    plan = q._jdf.queryExecution().executedPlan().toString()
    assert "PartitionFilters: [isnotnull(topic" in plan and "(topic#" in plan
    total = DeltaTable(str(lake / "records")).to_pyarrow_table()
    assert q.first()[0] == total.column("topic").to_pylist().count("payments")
    assert spark.sql("SELECT count(*) FROM records").first()[0] == total.num_rows
    joined = spark.sql(
        "SELECT count(*) FROM time_lookup t JOIN records r ON r.topic = t.topic "
        "AND r.partition = t.partition AND r.offset BETWEEN t.first_offset AND t.last_offset"
    ).first()[0]
    assert joined == DeltaTable(str(lake / "records")).to_pyarrow_table().num_rows


def test_loglake_sql_over_the_ingested_lake(
    spark: SparkSession, lake: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["sql", "--lake", str(lake), "--format", "json",
         "SELECT topic, count(*) AS n, max(timestamp) AS last FROM records GROUP BY topic "
         "ORDER BY topic"]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    got = [json.loads(line) for line in out.splitlines()]
    df = spark.read.format("delta").load(str(lake / "records"))
    want = [
        {"topic": r.topic, "n": r.n, "last": r.last.replace(tzinfo=dt.UTC).isoformat()
         .replace("+00:00", "Z")}
        for r in df.groupBy("topic").agg({"*": "count", "timestamp": "max"})
        .toDF("topic", "n", "last").orderBy("topic").collect()
    ]  # fmt: skip
    assert got == want
    code = main(["sql", "--lake", str(lake), "--format", "csv",
                 "SELECT count(*) AS n FROM time_lookup WHERE max_timestamp >= "
                 "TIMESTAMP '2024-05-02T00:00:00Z'"])  # fmt: skip
    out, _ = capsys.readouterr()
    raw = DeltaTable(str(lake / "time_lookup")).to_pyarrow_table().column("max_timestamp")
    cut = int(dt.datetime(2024, 5, 2, tzinfo=dt.UTC).timestamp() * 1000)
    assert (code, out) == (0, f"n\n{sum(1 for v in raw.to_pylist() if v >= cut)}\n")


def test_column_mapped_table_is_read_through_delta_rs(spark: SparkSession, tmp_path: Path) -> None:
    """delta-rs writes physical column names into the Parquet files: a plain Parquet read
    would see none of the table's columns."""
    path = tmp_path / "mapped"
    write_deltalake(
        path,
        pa.table({"a": [1, 2, None], "b": ["x", "y", "z"]}),
        configuration={"delta.columnMapping.mode": "name"},
    )
    want = [(1, "x"), (2, "y"), (None, "z")]
    df = spark.read.format("delta").load(str(path))
    assert df.rdd.getNumPartitions() == 1
    assert _spark_rows(df, ["a", "b"]) == sorted(want, key=repr)
    views = register_lake_views(spark, tmp_path)
    assert _spark_rows(views["mapped"], ["a", "b"]) == sorted(want, key=repr)


def test_timestamp_as_of_reads_the_version_of_that_time(spark: SparkSession, lake: Path) -> None:
    path = str(lake / "records")
    commits = {h["version"]: h["timestamp"] for h in DeltaTable(path).history()}
    assert commits[1] > commits[0]
    at = dt.datetime.fromtimestamp(commits[0] / 1000, dt.UTC).isoformat()
    n = spark.read.format("delta").option("timestampAsOf", at).load(path).count()
    assert n == DeltaTable(path, version=0).to_pyarrow_table().num_rows
    assert n < DeltaTable(path).to_pyarrow_table().num_rows
