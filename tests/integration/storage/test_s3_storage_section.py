"""``[storage]`` alone reaches the store: ``spark-submit jobs/ingest.py --lake s3://...`` with
the endpoint and credentials in the pipeline TOML and none in the environment (no
``AWS_*`` variable at all: without ``[storage]`` the job would try AWS itself, which this
machine cannot reach) ingests into the real S3 server (moto), read back with deltalake and
listed with boto3, independently of the job."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.jobs import spark_submit
from tests.fixtures.s3 import ACCESS_KEY, REGION, SECRET_KEY, S3Bucket
from tests.integration.storage.test_s3_ingest import _produced_log, _records

pytestmark = pytest.mark.integration


def test_storage_section_with_an_empty_environment_reaches_the_store(
    broker_factory: Any, s3: S3Bucket, tmp_path: Path
) -> None:
    log_dir, want = _produced_log(broker_factory, "s3conf", 120)
    conf = tmp_path / "pipeline.toml"
    conf.write_text(  # the rest: defaults; [paths] from the command line
        f'[storage]\nendpoint_url = "{s3.server.endpoint}"\n'
        f'access_key_id = "{ACCESS_KEY}"\nsecret_access_key = "{SECRET_KEY}"\n'
        f'region = "{REGION}"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
    )  # fmt: skip
    lake = s3.uri("conf")
    args = ["--config", str(conf), "--log-dirs", str(log_dir), "--lake", lake]
    run = spark_submit("ingest.py", args, env=env, timeout=600)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1])["records"] == 120
    assert _records(lake) == want  # this process's environment: the s3 fixture's
    assert [k for k in s3.keys("conf/records/_delta_log/") if k.endswith(".json")]

    # the same file without [storage]: nothing tells the job where the store is
    bare = tmp_path / "bare.toml"
    bare.write_text("[ingest]\n")
    args = ["--config", str(bare), "--log-dirs", str(log_dir), "--lake", lake]
    env["AWS_EC2_METADATA_DISABLED"] = "true"  # fail fast instead of asking for an instance role
    lost = spark_submit("ingest.py", args, env=env, timeout=600)
    assert lost.returncode != 0
    assert _records(lake) == want  # unchanged
