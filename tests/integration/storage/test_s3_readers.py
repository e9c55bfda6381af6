"""The lake's readers on S3 (moto): ``loglake sql``, ``query_delta``, ``register_lake_views``
and ``format("delta")`` read tables that delta-rs (an independent writer) put in the bucket,
row for row, including a table with deletion vectors and a table in ``_quality`` (skipped)."""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder, write_deltalake
from pyspark.sql import SparkSession

from logstore.cli import main
from logstore.objectstore import LakeLocation, StorageSettings
from pipelines.catalog import find_tables
from pipelines.delta.actions import FileRef, commit_actions
from pipelines.delta.deletion_vectors import write_deletion_vectors
from pipelines.delta.log import DeltaLog
from pipelines.delta.source import STORAGE_OPTION_PREFIX
from pipelines.delta.sql import query_delta, read_delta, register_lake_views
from tests.fixtures.s3 import S3Bucket

N = 3000


def _rows(start: int, n: int) -> pa.Table:
    k = np.arange(start, start + n, dtype=np.int64)
    return pa.table(
        {
            "topic": pa.array(["a" if i % 3 else "b" for i in range(start, start + n)]),
            "offset": pa.array(k),
            "value": pa.array([f"v{i}".encode() for i in range(start, start + n)], pa.binary()),
        }
    )


def _write_records(uri: str) -> pa.Table:
    """``records`` on S3: two commits, partitioned by topic, written by delta-rs itself."""
    options = StorageSettings.from_environment().delta_options(LakeLocation.parse(uri))
    first, second = _rows(0, N), _rows(N, N // 2)
    write_deltalake(uri, first, partition_by=["topic"], storage_options=options)
    write_deltalake(uri, second, partition_by=["topic"], mode="append", storage_options=options)
    return pa.concat_tables([first, second])


def _dv_table(local: Path, s3: S3Bucket, key: str) -> np.ndarray:
    """A table with deletion vectors, made on disk (delta-rs cannot write them), copied up
    object by object; returns the offsets that stay."""
    write_deltalake(
        local,
        pa.table({"offset": np.arange(N, dtype=np.int64)}),
        configuration={"delta.enableDeletionVectors": "true"},
    )
    (add,) = DeltaLog(local).live_adds(0)
    deleted = np.arange(0, N, 7)
    _, (descriptor,) = write_deletion_vectors(local / "dv", [deleted])
    ref = FileRef(add["path"], add["size"], add["partitionValues"], add.get("stats"))
    commit_actions(
        local,
        read_version=0,
        removes=[ref],
        adds=[
            FileRef(ref.path, ref.size, {}, ref.stats, int(time.time() * 1000), True, descriptor)
        ],
        operation="DELETE",
    )
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        s3.put(f"{key}/{path.relative_to(local).as_posix()}", path.read_bytes())
    return np.setdiff1d(np.arange(N), deleted)


@pytest.fixture
def s3_lake(s3: S3Bucket, tmp_path: Path) -> tuple[str, pa.Table, np.ndarray]:
    lake = s3.uri("lake")
    expected = _write_records(f"{lake}/records")
    kept = _dv_table(tmp_path / "dv_table", s3, "lake/topics/dv")
    # a table under _quality is not one of the lake's tables
    write_deltalake(
        f"{lake}/_quality/x",
        pa.table({"a": [1]}),
        storage_options=StorageSettings.from_environment().delta_options(LakeLocation.parse(lake)),
    )
    return lake, expected, kept


def _sorted(table: pa.Table) -> list[dict[str, object]]:
    return sorted(table.select(["topic", "offset", "value"]).to_pylist(), key=lambda r: r["offset"])


def test_catalog_and_loglake_sql_on_s3(
    s3_lake: tuple[str, pa.Table, np.ndarray], capsys: pytest.CaptureFixture[str]
) -> None:
    lake, expected, kept = s3_lake
    tables = find_tables(lake)
    assert [(t.name, t.path) for t in tables] == [
        ("records", f"{lake}/records"),
        ("topics_dv", f"{lake}/topics/dv"),
    ]
    code = main(
        ["sql", "--lake", lake, "--format", "csv",
         'SELECT topic, "offset", value FROM records ORDER BY "offset"']
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == expected.num_rows
    want = _sorted(expected)
    for got, row in zip(rows, want, strict=True):
        assert (got["topic"], int(got["offset"])) == (row["topic"], row["offset"])
    code = main(["sql", "--lake", lake, "--format", "json", 'SELECT "offset" FROM topics_dv'])
    out, err = capsys.readouterr()
    assert code == 0, err
    got_offsets = sorted(json.loads(line)["offset"] for line in out.splitlines() if line)
    assert got_offsets == kept.tolist()


def test_query_delta_on_s3(s3_lake: tuple[str, pa.Table, np.ndarray]) -> None:
    lake, expected, kept = s3_lake
    got = query_delta('SELECT topic, "offset", value FROM r', {"r": f"{lake}/records"})
    assert _sorted(got) == _sorted(expected)
    dv = query_delta('SELECT "offset" FROM t ORDER BY "offset"', {"t": f"{lake}/topics/dv"})
    assert dv.column("offset").to_pylist() == kept.tolist()


def test_spark_readers_on_s3(
    spark: SparkSession, s3_lake: tuple[str, pa.Table, np.ndarray]
) -> None:
    lake, expected, kept = s3_lake
    views = register_lake_views(spark, lake)
    assert sorted(views) == ["records", "topics_dv"]
    got = spark.sql("SELECT topic, `offset`, value FROM records").toArrow()
    assert _sorted(got) == _sorted(expected)
    dv = spark.sql("SELECT `offset` FROM topics_dv ORDER BY `offset`").toArrow()
    assert dv.column("offset").to_pylist() == kept.tolist()
    # an older version, through read_delta
    v0 = read_delta(spark, f"{lake}/records", version=0).toArrow()
    assert _sorted(v0) == _sorted(expected.slice(0, N))
    # format("delta") straight, settings as options (Spark's workers have the JVM's environment)
    reader = spark.read.format("delta")
    for key, value in StorageSettings.from_environment().to_overrides().items():
        reader = reader.option(STORAGE_OPTION_PREFIX + key, value)
    df = reader.load(f"{lake}/records")
    assert _sorted(df.toArrow()) == _sorted(expected)
    assert df.where("topic = 'b'").count() == sum(1 for r in _sorted(expected) if r["topic"] == "b")


def test_an_independent_reader_agrees(s3_lake: tuple[str, pa.Table, np.ndarray]) -> None:
    """delta-rs opened by hand (not through logstore.objectstore) sees the table we read."""
    lake, expected, _ = s3_lake
    options = StorageSettings.from_environment().delta_options(LakeLocation.parse(lake))
    dt = DeltaTable(f"{lake}/records", storage_options=options)
    assert dt.version() == 1
    got = pa.table(QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all())
    assert got.num_rows == expected.num_rows


def test_concurrent_delta_rs_commits_on_s3_lose_nothing(s3: S3Bucket) -> None:
    """Two writers append to one table at once through ``delta_options`` (conditional_put
    etag): every commit lands once, at its own version, and every row is there."""
    import threading

    uri = s3.uri("lake/records")
    options = StorageSettings.from_environment().delta_options(LakeLocation.parse(uri))
    write_deltalake(uri, _rows(0, 1), storage_options=options)
    errors: list[BaseException] = []

    def writer(who: int) -> None:
        try:
            for i in range(5):
                start = 1000 * (who + 1) + 100 * i
                write_deltalake(uri, _rows(start, 10), mode="append", storage_options=options)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    dt = DeltaTable(uri, storage_options=options)
    assert dt.version() == 10
    assert sorted(k for k in s3.keys("lake/records/_delta_log/") if k.endswith(".json")) == [
        f"lake/records/_delta_log/{v:020d}.json" for v in range(11)
    ]
    got = query_delta('SELECT "offset" FROM t', {"t": uri}).column("offset").to_pylist()
    want = [0] + [
        1000 * (w + 1) + 100 * i + j for w in range(2) for i in range(5) for j in range(10)
    ]
    assert sorted(got) == sorted(want)
