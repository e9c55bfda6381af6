"""A ``spark-submit jobs/ingest.py`` killed between writing its data files and committing
leaves ``part-*.parquet`` files no commit references; the next run removes them once the
killed run's lease expired (and only them: a live writer's in-flight files, its lease renewed
by its heartbeat, stay), and the table is exact.

Records come from the real broker and confluent-kafka; the kill is the real failpoint
(``LOGLAKE_FAILPOINT=delta.before_commit``: SIGKILL of the whole spark-submit session).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from deltalake import DeltaTable

from pipelines.delta.staging import LEASE_TTL_ENV, STAGING_DIR, reap_crashed_writes
from tests.fixtures.broker import ROOT
from tests.fixtures.jobs import spark_submit
from tests.integration.broker.clients import new_topic

pytestmark = pytest.mark.integration


def test_killed_run_files_removed_by_next_run_never_a_live_writers(
    broker_factory: Any, tmp_path: Path
) -> None:
    b = broker_factory()
    topic = new_topic(b.bootstrap, partitions=2, prefix="orphans")
    producer = ck.Producer({"bootstrap.servers": b.bootstrap, "acks": "all"})
    for i in range(400):
        producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i, partition=i % 2)
    assert producer.flush(60) == 0
    b.stop()
    lake = tmp_path / "lake"
    records = lake / "records"
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        LEASE_TTL_ENV: "3",  # leases of 3 s: a dead run's expire within seconds
    }
    args = ["--config", str(ROOT / "conf" / "pipeline.toml"), "--log-dirs", str(b.log_dir)]
    args += ["--lake", str(lake)]

    killed = spark_submit("ingest.py", args, env=env, failpoint="delta.before_commit")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    orphans = sorted(records.rglob("part-*.parquet"))
    assert orphans, "the killed run had written its data files"
    leases = list((records / STAGING_DIR).glob("*.json"))
    assert len(leases) == 1 and leases[0].stem in orphans[0].name

    # A writer still in flight: a live driver (another process) renewing its lease.
    live_id = "a" * 32
    live = subprocess.Popen(
        [sys.executable, "-m", "tests.fixtures.staging_writer", str(records), live_id],
        cwd=ROOT, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert live.stdout is not None and live.stdout.readline().startswith("ready ")
        live_files = sorted(records.rglob(f"part-*-{live_id}-*.parquet"))
        assert live_files
        time.sleep(3 + 2 + 1.5)  # the killed run's lease expires (ttl + margin, whole seconds)

        ok = spark_submit("ingest.py", args, env=env)
        assert ok.returncode == 0, ok.stderr[-3000:]
        summary = json.loads(ok.stdout.strip().splitlines()[-1])
        assert summary["records"] == 400 and summary["committed"] is True
        assert "data files of earlier runs that were killed before commit" in ok.stdout + ok.stderr
        assert not any(p.exists() for p in orphans)  # the killed run's files are gone
        assert not leases[0].exists()
        assert all(p.exists() for p in live_files)  # the in-flight writer's stay
        left = sorted(p.name for p in (records / STAGING_DIR).iterdir() if p.suffix == ".json")
        assert left == [f"{live_id}.json"]
        table = DeltaTable(str(records))
        rows = table.to_pyarrow_table(columns=["partition", "offset", "key"]).to_pylist()
        assert sorted((r["partition"], r["offset"]) for r in rows) == sorted(
            (p, o) for p in range(2) for o in range(200)
        )
        on_disk = {str(p.relative_to(records)) for p in records.rglob("part-*.parquet")}
        referenced = {str(Path(u).relative_to(records)) for u in table.file_uris()}
        assert on_disk - referenced == {str(p.relative_to(records)) for p in live_files}
    finally:
        live.kill()
        live.wait()
    # the live writer died without committing: once its lease expired, its files go too
    time.sleep(3 + 2 + 1.5)
    assert reap_crashed_writes(records) == len(live_files)
    assert sorted(records.rglob("part-*.parquet")) == sorted(
        Path(u) for u in DeltaTable(str(records)).file_uris()
    )
