"""``spark-submit jobs/ingest.py --lake s3://...``: the jobs on a lake in a real S3 server (moto).

Records come from the real broker and confluent-kafka; the lake is read back with deltalake's
DataFusion reader (an independent reader) and listed with boto3. A re-run adds nothing; the
store stopped makes the run fail with exit 1 (transient, retried by Airflow) and a clear
error, and the run after it, the store back, ingests exactly once. Two runs racing on one
lake, and a run SIGKILLed before its commit (the real failpoint), leave every record exactly
once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder

from logstore.objectstore import delta_target
from pipelines.delta.staging import LEASE_TTL_ENV
from tests.fixtures.broker import ROOT
from tests.fixtures.jobs import spark_submit
from tests.fixtures.s3 import S3Bucket
from tests.integration.broker.clients import new_topic

pytestmark = pytest.mark.integration


def _ingest(
    lake: str, log_dir: Path, *, failpoint: str | None = None, **extra_env: str
) -> subprocess.CompletedProcess[str]:
    args = ["--config", str(ROOT / "conf" / "pipeline.toml"), "--log-dirs", str(log_dir)]
    env = {
        **os.environ,  # the s3 fixture's AWS_ENDPOINT_URL, keys and region
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        **extra_env,
    }
    return spark_submit(
        "ingest.py", [*args, "--lake", lake], failpoint=failpoint, env=env, timeout=600
    )


def _records(lake: str) -> list[tuple[int, int, bytes, bytes]]:
    uri, options = delta_target(f"{lake}/records")
    dt = DeltaTable(uri, storage_options=options)
    query = (
        QueryBuilder().register("r", dt).execute('select "partition", "offset", key, value from r')
    )
    got = pa.table(query.read_all()).to_pylist()
    return sorted((r["partition"], r["offset"], r["key"], r["value"]) for r in got)


def _produced_log(broker_factory: Any, prefix: str, n: int) -> tuple[Path, list[Any]]:
    """``n`` records produced with confluent-kafka to a fresh 2-partition topic of a real
    broker, which is then stopped: its log dir, and the rows the lake must hold."""
    b = broker_factory()
    topic = new_topic(b.bootstrap, partitions=2, prefix=prefix)
    producer = ck.Producer({"bootstrap.servers": b.bootstrap, "acks": "all"})
    for i in range(n):
        producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i, partition=i % 2)
    assert producer.flush(60) == 0
    b.stop()
    return b.log_dir, sorted((i % 2, i // 2, b"k%d" % i, b"v%d" % i) for i in range(n))


def test_ingest_into_an_s3_lake_exactly_once_and_a_stopped_store_fails_cleanly(
    broker_factory: Any, s3: S3Bucket
) -> None:
    log_dir, want = _produced_log(broker_factory, "s3lake", 300)
    lake = s3.uri("lake")

    s3.server.stop()
    down = _ingest(lake, log_dir)
    s3.server.start()
    assert down.returncode == 1, down.stderr[-3000:]
    said = down.stdout + down.stderr
    failed = [line for line in said.splitlines() if line.startswith("ingest failed:")]
    assert len(failed) == 1, said[-3000:]  # one line naming the object and the failure
    assert "_delta_log" in failed[0] and "connect" in failed[0].lower(), failed
    assert "Traceback" not in said
    assert [k for k in s3.keys("lake/") if "_delta_log/" in k] == []  # nothing committed

    first = _ingest(lake, log_dir)
    assert first.returncode == 0, first.stderr[-3000:]
    summary = json.loads(first.stdout.strip().splitlines()[-1])
    assert summary["records"] == 300 and summary["committed"] is True
    assert _records(lake) == want
    data = [k for k in s3.keys("lake/records/") if k.endswith(".parquet")]
    uri, options = delta_target(f"{lake}/records")
    referenced = {
        u.rsplit("/", 1)[-1] for u in DeltaTable(uri, storage_options=options).file_uris()
    }
    assert {k.rsplit("/", 1)[-1] for k in data} == referenced  # no leftover file
    assert not [k for k in s3.keys("lake/records/_loglake_staging/") if k.endswith(".json")]

    again = _ingest(lake, log_dir)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout.strip().splitlines()[-1])["records"] == 0
    assert _records(lake) == want  # nothing twice


def test_two_ingest_runs_racing_on_one_s3_lake_never_lose_or_duplicate(
    broker_factory: Any, s3: S3Bucket
) -> None:
    """Two real ``spark-submit`` processes ingest the same log into one S3 lake at once: the
    commits go through put-if-absent, so the table holds every record exactly once (row for row
    against what was produced); a run that lost the race on progress ends with exit 1 and
    a re-run afterwards adds nothing."""
    log_dir, want = _produced_log(broker_factory, "s3race", 400)
    lake = s3.uri("race")
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda _: _ingest(lake, log_dir), range(2)))
    codes = sorted(r.returncode for r in runs)
    assert codes in ([0, 0], [0, 1]), [r.stderr[-2000:] for r in runs]
    for r in runs:
        if r.returncode == 1:
            assert "ingest failed:" in r.stdout + r.stderr
    assert _records(lake) == want
    again = _ingest(lake, log_dir)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout.strip().splitlines()[-1])["records"] == 0
    assert _records(lake) == want


def test_a_run_killed_before_its_commit_leaves_the_s3_table_as_it_was(
    broker_factory: Any, s3: S3Bucket
) -> None:
    """The real failpoint (``delta.before_commit``: SIGKILL of the whole spark-submit session
    after every data file is on S3): no commit, the files stay until the dead run's lease
    expired, then the next run removes them and ingests every record once."""
    log_dir, want = _produced_log(broker_factory, "s3kill", 200)
    lake = s3.uri("kill")
    short = {LEASE_TTL_ENV: "3"}
    killed = _ingest(lake, log_dir, failpoint="delta.before_commit", **short)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    # no commit (the first run's commit also creates the table): no table, as before
    assert [k for k in s3.keys("kill/records/_delta_log/") if k.endswith(".json")] == []
    orphans = [k for k in s3.keys("kill/records/") if k.endswith(".parquet")]
    assert orphans  # its data files were written

    time.sleep(3 + 2 + 1.5)  # its lease expires by the store's clock
    ok = _ingest(lake, log_dir, **short)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert _records(lake) == want
    left = {k for k in s3.keys("kill/records/") if k.endswith(".parquet")}
    assert not left & set(orphans)  # the killed run's files are gone
    uri, options = delta_target(f"{lake}/records")
    referenced = {
        u.rsplit("/", 1)[-1] for u in DeltaTable(uri, storage_options=options).file_uris()
    }
    assert {k.rsplit("/", 1)[-1] for k in left} == referenced
