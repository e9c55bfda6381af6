"""``make demo DEMO_ARGS=--s3``, its pieces before Airflow (tests/integration/test_demo.py runs
the local demo whole): the demo starts moto's S3 server and its bucket, writes a pipeline TOML
whose ``[paths] lake`` is ``s3://loglake-demo/lake`` and whose ``[storage]`` says where the
store is, and the DAG runs get no ``AWS_*`` variable. Ingest and compact, run as the DAG runs them
(``spark-submit --config`` that file, no ``AWS_*`` in their environment: their Spark tasks too
must take the settings from the file), fill the bucket; the demo's queries (``loglake sql
--config``), its snapshot and its listing of the lake agree with boto3 and delta-rs opened by
hand. Stopping the demo's server takes the lake with it."""

from __future__ import annotations

import csv
import io
import os
import socket
import sys
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, QueryBuilder

from pipelines.demo import PROFILE_KEYS, TOMBSTONES, Demo, show_lake
from pipelines.demo_s3 import ACCESS_KEY, BUCKET, REGION, SECRET_KEY, LocalS3
from tests.fixtures.jobs import spark_submit

pytestmark = pytest.mark.integration


def test_s3_demo_runs_the_jobs_on_its_local_s3_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # a shell with AWS settings of its own: none of them may reach the demo's jobs
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "not-the-demo")
    demo = Demo(work=tmp_path / "demo", records=40, s3=LocalS3())
    demo.work.mkdir()
    try:
        demo.start_s3()
        demo.start_broker()
        demo.produce()
        demo.wait_for_checkpoints()
        demo.write_config()
        conf = demo.config.read_text()
        assert f'lake = "s3://{BUCKET}/lake"' in conf
        assert f'endpoint_url = "http://127.0.0.1:{demo.s3.port}"' in conf
        env = demo.airflow_env()
        assert not [k for k in env if k.startswith("AWS_")]
        env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
                   PYSPARK_DRIVER_PYTHON=sys.executable)  # fmt: skip
        for job in ("ingest.py", "compact.py"):  # compact's executors too get [storage]
            run = spark_submit(job, ["--config", str(demo.config)], env=env, timeout=600)
            assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]

        # independently: boto3 lists the bucket, delta-rs opened with its own options reads it
        client = boto3.client(
            "s3", endpoint_url=demo.s3.endpoint, aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY, region_name=REGION,
        )  # fmt: skip
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET)["Contents"]]
        assert "lake/records/_delta_log/00000000000000000000.json" in keys
        options = {
            "AWS_ENDPOINT_URL": demo.s3.endpoint, "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
        }  # fmt: skip
        records = DeltaTable(f"s3://{BUCKET}/lake/records", storage_options=options)
        topics = pa.table(records.to_pyarrow_table(columns=["topic"]))["topic"]
        counts = {v["values"]: v["counts"] for v in pc.value_counts(topics).to_pylist()}
        assert counts == demo.sent
        profiles = DeltaTable(f"s3://{BUCKET}/lake/topics/profiles", storage_options=options)
        live = QueryBuilder().register("t", profiles).execute("SELECT key FROM t").read_all()
        assert sorted(k.decode() for k in pa.table(live)["key"].to_pylist()) == sorted(
            f"profile-{k}" for k in range(TOMBSTONES, PROFILE_KEYS)
        )

        # the demo's own views of it: its snapshot, loglake sql --config, its listing
        snapshot = demo.snapshot()
        assert snapshot["records"] == (records.version(), sum(demo.sent.values()))
        capsys.readouterr()
        demo.sql(
            "SELECT topic, count(*) AS n FROM records GROUP BY topic ORDER BY topic", fmt="csv"
        )
        out = capsys.readouterr().out
        assert f"$ loglake sql --config {demo.config}" in out
        rows = list(csv.DictReader(io.StringIO(out[out.index("topic,n") :])))
        assert {r["topic"]: int(r["n"]) for r in rows} == demo.sent
        show_lake(demo)
        out = capsys.readouterr().out
        assert f"the lake: s3://{BUCKET}/lake, on the local S3 server {demo.s3.endpoint}" in out
        listed = sum(1 for k in keys if k.startswith("lake/records/") and not k.endswith("/"))
        (line,) = [x for x in out.splitlines() if x.split()[1:2] == ["records"]]
        assert line.split()[2:6] == ["version", str(records.version()), str(listed), "objects"]
        protocol = records.protocol()
        assert f"Delta reader {protocol.min_reader_version} / writer " in line
    finally:
        demo.stop_broker()
        demo.stop_s3()
    with pytest.raises(OSError):  # the server, and the lake in its memory, are gone
        socket.create_connection(("127.0.0.1", demo.s3.port), timeout=2).close()
    assert "AWS_ENDPOINT_URL" in os.environ  # the test's own environment untouched by the demo
