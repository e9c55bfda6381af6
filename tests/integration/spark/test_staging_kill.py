"""The staged write on local disk and on a real S3 server (moto), through the shared Spark
session: a write's driver SIGKILLed (a real process: ``tests/fixtures/staging_writer.py``,
which committed part of its rows, then staged more) leaves files no commit names; the next
real write (``write_direct``) removes them once the dead write's lease expired, keeps what the
killed run committed, and the table holds exactly the rows committed (read back with
deltalake's DataFusion reader and listed with boto3 / ``os.walk``, independently)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder
from pyspark.sql import SparkSession

from logstore.objectstore import delta_target
from pipelines.delta.direct import stage_files, write_direct
from pipelines.delta.staging import LEASE_TTL_ENV, STAGING_DIR
from tests.conftest import ROOT
from tests.fixtures.s3 import S3Bucket
from tests.fixtures.staging_writer import SCHEMA

pytestmark = pytest.mark.integration


def _produce(task: tuple[int, int]) -> Iterator[pa.RecordBatch]:
    lo, hi = task
    rows = range(lo, hi)
    yield pa.record_batch(
        [pa.array(["a" if n % 2 else "b" for n in rows]), pa.array(rows, pa.int64())], SCHEMA
    )


@pytest.fixture(params=["local", "s3"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, S3Bucket | None]:
    """The table: a local directory, or a prefix in a fresh bucket of the moto server."""
    if request.param == "local":
        return str(tmp_path / "t"), None
    bucket: S3Bucket = request.getfixturevalue("s3")
    return bucket.uri("lake", "t"), bucket


def _listing(uri: str, bucket: S3Bucket | None) -> list[str]:
    if bucket is not None:
        prefix = uri.removeprefix(f"s3://{bucket.name}/") + "/"
        return [k[len(prefix) :] for k in bucket.keys(prefix) if not k.endswith("/")]
    return sorted(str(Path(d, n).relative_to(uri)) for d, _, names in os.walk(uri) for n in names)


def _table(uri: str) -> DeltaTable:
    target, options = delta_target(uri)
    return DeltaTable(target, storage_options=options or None)


def _rows(uri: str) -> list[int]:
    got = QueryBuilder().register("t", _table(uri)).execute("select n from t").read_all()
    return sorted(got.column("n").to_pylist())


def test_a_killed_writers_uncommitted_files_go_with_the_next_write(
    spark: SparkSession, where: tuple[str, S3Bucket | None]
) -> None:
    uri, bucket = where
    killed = "9" * 32
    writer = subprocess.Popen(
        [sys.executable, "-m", "tests.fixtures.staging_writer", uri, killed, "--commit-first"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, LEASE_TTL_ENV: "3"},
    )  # fmt: skip
    try:
        assert writer.stdout is not None and writer.stdout.readline().startswith("ready ")
    finally:
        writer.kill()
        writer.wait()
    assert _table(uri).version() == 0  # its first part committed
    staged = [k for k in _listing(uri, bucket) if f"-{killed}-" in k]
    assert len(staged) == 4 and f"{STAGING_DIR}/{killed}.json" in _listing(uri, bucket)

    time.sleep(3 + 2 + 1.5)  # its lease's ttl + margin, and S3's whole-second Last-Modified
    result = write_direct(
        spark, uri, [(1000, 1005), (2000, 2003)], _produce, schema=SCHEMA, partition_by=["part"]
    )
    assert result.committed
    referenced = {u.rsplit("/", 1)[-1] for u in _table(uri).file_uris()}
    data = [k for k in _listing(uri, bucket) if k.endswith(".parquet")]
    assert {k.rsplit("/", 1)[-1] for k in data} == referenced  # no leftover of the killed run
    assert len(referenced) == 6  # its committed two, and this write's four (2 tasks x 2 parts)
    leases = [k for k in _listing(uri, bucket) if k.endswith(".json") and STAGING_DIR in k]
    assert leases == []  # the dead write's lease reaped, the new write's released
    assert _rows(uri) == [*range(10), *range(1000, 1005), *range(2000, 2003)]


def test_a_running_writes_files_survive_another_writes_reaper(
    spark: SparkSession, where: tuple[str, S3Bucket | None]
) -> None:
    """A write staged (its lease renewed by its heartbeat) while another write runs to the end
    with its reaper: the first write's files stay, and it commits afterwards."""
    uri, bucket = where
    first = stage_files(spark, uri, [(0, 3)], _produce, schema=SCHEMA, partition_by=["part"],
                        lease_ttl_s=3.0)  # fmt: skip
    time.sleep(3 + 2 + 1.5)  # longer than its ttl + margin: only the heartbeat keeps it
    second = write_direct(spark, uri, [(10, 12)], _produce, schema=SCHEMA, partition_by=["part"])
    assert second.committed
    assert all(f"-{first.write_id}-" in k for k in (f.path for f in first.files))
    assert first.commit().committed
    assert _rows(uri) == [0, 1, 2, 10, 11]
    data = {k.rsplit("/", 1)[-1] for k in _listing(uri, bucket) if k.endswith(".parquet")}
    assert data == {u.rsplit("/", 1)[-1] for u in _table(uri).file_uris()}
