"""``spark-submit jobs/quality.py --lake s3://...`` on a real S3 server (moto): the suites over
an S3 lake ingested by the real job, ``quality_results`` committed in the bucket (read back
with deltalake) and the Data Docs site under ``<lake>/_quality/`` (listed and read with boto3,
independently of the job); a second run keeps the first run's pages and adds its own.

The ingest before is ``jobs/ingest.py``'s ``main`` in-process on the shared Spark session (its
``spark-submit`` into S3 is tests/integration/storage/test_s3_ingest.py's): a spark-submit
less, 10-20 s of a loaded 2-core machine."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from deltalake import DeltaTable

from logstore.objectstore import delta_target
from tests.fixtures.broker import ROOT
from tests.fixtures.jobs import load_job, spark_submit
from tests.fixtures.s3 import S3Bucket
from tests.integration.storage.test_s3_ingest import _produced_log

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration


def _quality(lake: str, log_dir: Path, run_id: str) -> Any:
    env = {
        **os.environ,  # the s3 fixture's AWS_ENDPOINT_URL, keys and region
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    args = [
        "--config", str(ROOT / "conf" / "pipeline.toml"), "--log-dirs", str(log_dir),
        "--lake", lake, "--run-id", run_id,
    ]  # fmt: skip
    return spark_submit("quality.py", args, env=env, timeout=900)


def test_quality_on_an_s3_lake_results_and_data_docs_in_the_bucket(
    broker_factory: Any, s3: S3Bucket, spark: SparkSession
) -> None:
    log_dir, _want = _produced_log(broker_factory, "s3qual", 200)
    lake = s3.uri("q")
    args = ["--config", str(ROOT / "conf" / "pipeline.toml"), "--log-dirs", str(log_dir)]
    assert load_job("ingest").main([*args, "--lake", lake]) == 0

    first = _quality(lake, log_dir, "run-one")
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    summary = json.loads(first.stdout.strip().splitlines()[-1])
    assert summary["success"] is True
    assert summary["docs"] == f"{lake}/_quality/data_docs/index.html"

    uri, options = delta_target(f"{lake}/quality_results")
    rows = DeltaTable(uri, storage_options=options).to_pyarrow_table().to_pylist()
    assert {r["run_id"] for r in rows} == {"run-one"}
    assert {r["suite"] for r in rows} >= {"records", "records_gaps", "quarantine"}
    assert all(r["success"] for r in rows)
    index = s3.get("q/_quality/data_docs/index.html").decode()
    assert "run-one" in index
    pages = [k for k in s3.keys("q/_quality/data_docs/validations/") if k.endswith(".html")]
    assert pages and any(k.startswith("q/_quality/gx/") for k in s3.keys("q/_quality/gx/"))

    second = _quality(lake, log_dir, "run-two")
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    rows = DeltaTable(uri, storage_options=options).to_pyarrow_table().to_pylist()
    assert {r["run_id"] for r in rows} == {"run-one", "run-two"}
    index = s3.get("q/_quality/data_docs/index.html").decode()
    assert "run-one" in index and "run-two" in index  # the first run's pages kept
    again = [k for k in s3.keys("q/_quality/data_docs/validations/") if k.endswith(".html")]
    assert set(pages) < set(again)
