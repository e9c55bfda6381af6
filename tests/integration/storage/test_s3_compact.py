"""Compaction (the table) on S3 (moto): ``jobs/compact.py --lake s3://...`` and
``run_compact`` write the same topic table as the same runs on local disk — first run, then an
incremental run with deletion vectors and change data — read back by delta-rs (DataFusion)
and by Spark's ``format("delta")`` (the Python data source), and leave no lease, scratch or
uncommitted file in the bucket."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder
from pyspark.sql import SparkSession

from logstore.objectstore import LakeLocation, StorageSettings
from pipelines.compaction.config import CompactConfig
from pipelines.compaction.model import Rec, Strategy
from pipelines.compaction.table import STAGING, run_compact, table_path, tombstones_path
from pipelines.delta.log import DeltaLog
from pipelines.delta.sql import read_delta
from tests.fixtures.compaction import append_records, read_topic_table
from tests.fixtures.jobs import spark_submit
from tests.fixtures.s3 import S3Bucket

pytestmark = pytest.mark.integration

STRATEGY = Strategy("timestamp")  # a tombstone table too: two tables on S3


def _quiet(_: str) -> None:
    pass


def _config(lake: str, logs: Path) -> CompactConfig:
    logs.mkdir(parents=True, exist_ok=True)
    return CompactConfig(
        log_dirs=(str(logs),), lake=lake, topics=("t",), strategies={"t": STRATEGY}, buckets=2
    )


def _rows(uri: str) -> dict[tuple[int, bytes], tuple[int, bytes | None]]:
    """A topic table's live rows on S3, read by delta-rs's DataFusion reader (which honours
    deletion vectors), with the store's settings."""
    options = StorageSettings.from_environment().delta_options(LakeLocation.parse(uri))
    table = DeltaTable(uri, storage_options=options)
    rows = pa.table(QueryBuilder().register("t", table).execute("SELECT * FROM t").read_all())
    out: dict[tuple[int, bytes], tuple[int, bytes | None]] = {}
    for r in rows.to_pylist():
        assert (r["partition"], r["key"]) not in out
        out[(r["partition"], r["key"])] = (r["offset"], r["value"])
    return out


def _local(rows: dict[tuple[int, bytes], tuple[int, bytes, list[Any]]]) -> dict[Any, Any]:
    return {pk: (o, v) for pk, (o, v, _h) in rows.items()}


def _first() -> list[Rec]:
    return [
        Rec(p, o, 1_000 + o, b"k%03d" % (o % 150), b"v%d-%d" % (p, o), ())
        for p in (0, 1)
        for o in range(200)
    ]


def _second() -> list[Rec]:
    return [
        Rec(0, 200, 5_000, b"k001", b"new", ()),
        Rec(0, 201, 5_000, b"k002", None, ()),  # tombstone
        Rec(0, 202, 10, b"k003", b"old", ()),  # older timestamp: loses
        Rec(1, 200, 5_000, b"k500", b"fresh", ()),
        Rec(1, 201, 5_000, b"k005", None, ()),
    ]


def test_compaction_on_s3_equals_local_disk_and_reads_back(
    spark: SparkSession, s3: S3Bucket, tmp_path: Path
) -> None:
    lake, local = s3.uri("lake"), tmp_path / "local"
    s3_config, local_config = _config(lake, tmp_path / "logs"), _config(str(local), tmp_path / "l")
    for where in (lake, str(local)):
        append_records(where, "t", _first(), {0: 200, 1: 200})
    # first run: in-process, both lakes
    s3_result = run_compact(spark, s3_config, log=_quiet).topics[0]
    local_result = run_compact(spark, local_config, log=_quiet).topics[0]
    assert s3_result.committed and local_result.committed
    path = table_path(lake, "t")
    assert path.startswith("s3://")
    assert _rows(path) == _local(read_topic_table(table_path(local, "t")))
    assert len(_rows(path)) == 2 * 150
    # incremental run: the job under spark-submit with --lake s3://... (the AWS environment)
    for where in (lake, str(local)):
        append_records(where, "t", _second(), {0: 203, 1: 202})
    conf = tmp_path / "pipeline.toml"
    conf.write_text(
        f'[paths]\nlog_dirs = ["{tmp_path / "logs"}"]\nlake = "{local}"\n'
        '[compact]\ntopics = ["t"]\nbuckets = 2\n[compact.strategy]\nt = "timestamp"\n',
        encoding="utf-8",
    )
    job = spark_submit("compact.py", ["--config", str(conf), "--lake", lake])
    assert job.returncode == 0, (job.stdout[-2000:], job.stderr[-3000:])
    local_result = run_compact(spark, local_config, log=_quiet).topics[0]
    assert local_result.buckets_with_deletion_vectors >= 1  # the change is small: vectors
    expected = _local(read_topic_table(table_path(local, "t")))
    assert _rows(path) == expected
    assert (0, b"k002") not in expected and expected[(0, b"k001")] == (200, b"new")
    # the deletion vectors and change data are in the bucket, named by the log
    referenced = DeltaLog(path).referenced_files()
    assert any(p.startswith("_change_data/") for p in referenced)
    keys = s3.keys("lake/topics/t/")
    assert any(k.startswith("lake/topics/t/dv/deletion_vector_") for k in keys)
    # Spark's format("delta") (the Python data source, settings as options) reads the same
    by_spark = read_delta(spark, path).toArrow().to_pylist()
    assert {(r["partition"], r["key"]): (r["offset"], r["value"]) for r in by_spark} == expected
    # nothing left over: no lease, no scratch, no file that no version names
    for table in (path, tombstones_path(lake, "t")):
        prefix = table.removeprefix(f"s3://{s3.name}/") + "/"
        left = {k.removeprefix(prefix) for k in s3.keys(prefix)}
        left = {k for k in left if not k.startswith("_delta_log/")}
        # no lease, no scratch (not even the empty "directory" objects of pyarrow's writers;
        # only that of the staging prefix itself may stay: one per table, not one per run)
        assert not [k for k in left if k.startswith(f"{STAGING}/") and k != f"{STAGING}/"], left
        files = {k for k in left if not k.endswith("/")}
        assert files <= DeltaLog(table).referenced_files(), left
    # a re-run is a no-op
    assert not run_compact(spark, s3_config, log=_quiet).topics[0].committed
