"""``make demo`` end to end: ``python -m pipelines.demo`` as the Makefile runs it (a smaller
``orders`` topic), then its lake read back with delta-rs.

The demo starts the real broker, produces with confluent-kafka, runs both DAGs with the Airflow
environment's ``airflow dags test`` (seven spark-submits, then three more for the re-run), so
this is one of the slow tests (minutes); it is what a new user runs first.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from logstore.storage.checkpoints import read_offset_checkpoint
from pipelines.demo import read_table
from tests.fixtures.jobs import SHORT_JVM_OPTS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(2400)]
ROOT = Path(__file__).resolve().parents[2]
STAGES = ["broker", "produce", "airflow db migrate", "ingest DAG", "maintenance DAG", "sql",
          "re-run ingest DAG", "stop broker"]  # fmt: skip

if not (ROOT / "airflow" / ".venv" / "bin" / "airflow").is_file():
    pytest.fail("the Airflow environment is missing: run tools/bootstrap.sh", pytrace=False)


def test_make_demo_shows_the_whole_lakehouse(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYSPARK"))}
    # SPARK_SUBMIT_OPTS: the DAG tasks' spark-submit drivers (Airflow's hook passes the env on)
    env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_SUBMIT_OPTS=SHORT_JVM_OPTS)  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.demo", "--dir", str(work), "--records", "400"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=2300, check=False,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    for stage in STAGES:  # every stage ran and was timed
        assert re.search(rf"\[demo\]    {re.escape(stage)}: \d+\.\d s", out), stage
    for task in ["ingest", "lookups", "compact", "quality"]:
        assert f"loglake_ingest.{task}: success" in out
    for task in ["retention", "maintain", "quality"]:
        assert f"loglake_maintenance.{task}: success" in out
    assert "the re-run changed no table" in out
    lake = work / "lake"

    # Every record produced is in records, per topic; the compacted topic's table has one row
    # per live key, at its latest update, and none of the tombstoned keys.
    records = DeltaTable(str(lake / "records")).to_pyarrow_table(
        columns=["topic", "partition", "offset", "timestamp", "value"]
    )
    counts = dict(zip(*pc.value_counts(records["topic"]).flatten(), strict=True))
    counts = {k.as_py(): v.as_py() for k, v in counts.items()}
    assert counts == {"orders": 400, "customers": 200, "profiles": 1020, "clicks": 1600}
    profiles = read_table(lake / "topics" / "profiles")
    keys = {k.decode(): v for k, v in zip(profiles["key"].to_pylist(),
                                         profiles["value"].to_pylist(), strict=True)}  # fmt: skip
    assert sorted(keys) == sorted(f"profile-{k}" for k in range(20, 200))
    assert all(b'"version": 4' in v for v in keys.values())

    # time_lookup answers "first offset at or after T" as records does, for the printed T.
    midpoint = re.search(r"max_timestamp >= TIMESTAMP '([^']+)'", out)
    assert midpoint is not None
    t = dt.datetime.fromisoformat(midpoint.group(1).replace("Z", "+00:00"))
    lookups = DeltaTable(str(lake / "time_lookup")).to_pyarrow_table()
    from_lookup: dict[int, int] = {}
    for row in lookups.to_pylist():
        if row["topic"] == "orders" and row["max_timestamp"] >= t.timestamp() * 1000:
            p = row["partition"]
            from_lookup[p] = min(from_lookup.get(p, row["first_offset"]), row["first_offset"])
    from_records: dict[int, int] = {}
    for row in records.filter(pc.equal(records["topic"], "orders")).to_pylist():
        if row["timestamp"] >= t:
            p = row["partition"]
            from_records[p] = min(from_records.get(p, row["offset"]), row["offset"])
    assert from_lookup == from_records and len(from_lookup) == 3

    # The maintenance DAG's retention deleted clicks' oldest segments (retention.bytes) through
    # the broker, each already in the lake: the broker's log start is where retention_log says
    # it went, the lake still holds every click (below the log start too), quality held.
    removed = read_table(lake / "retention_log").to_pylist()
    assert removed and {(r["source"], r["topic"], r["rule"]) for r in removed} == {
        ("log", "clicks", "retention.bytes")
    }
    log_start = max(r["end_offset"] for r in removed)
    assert min(r["segment_base_offset"] for r in removed) == 0 and 0 < log_start < 1600
    starts = read_offset_checkpoint(work / "kafka-logs" / "log-start-offset-checkpoint")
    assert starts[("clicks", 0)] == log_start
    bases = [int(f.name.split(".")[0]) for f in (work / "kafka-logs" / "clicks-0").glob("*.log")]
    assert min(bases) == log_start
    assert f"clicks/0 log start {log_start}, high watermark 1600" in out
    clicks = sorted(o for t, o in zip(records["topic"].to_pylist(), records["offset"].to_pylist(),
                                      strict=True) if t == "clicks")  # fmt: skip
    assert clicks == list(range(1600))

    # Both quality runs held; the Data Docs are where the demo says; every table exists.
    results = DeltaTable(str(lake / "quality_results")).to_pyarrow_table()
    assert len(set(results["run_id"].to_pylist())) == 2 and all(results["success"].to_pylist())
    docs = lake / "_quality" / "data_docs" / "index.html"
    assert docs.is_file() and f"Data Docs: {docs}" in out
    for name in ["quarantine", "diverged", "offset_lookup", "retention_log"]:
        DeltaTable(str(lake / name))
    assert (work / "broker.log").is_file() and (work / "dag-ingest.log").is_file()
