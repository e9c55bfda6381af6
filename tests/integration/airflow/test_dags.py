"""The Airflow DAGs (airflow/dags), run by the Airflow environment's own binaries.

pytest runs in the main environment, which must not import airflow (the two environments
are kept apart: the Spark provider's pyspark-client would corrupt pyspark), so every check
here starts ``airflow/.venv/bin/...`` as a subprocess with its own temporary AIRFLOW_HOME:

- DagBag integrity: imports, no cycles (a cycle is an import error), tags, owners, retries
  with backoff, the order of the steps, steps that join only when their job file exists;
- ``airflow dags test`` end to end on a log dir written by the real broker (confluent-kafka
  producing): the Delta tables afterwards, read with deltalake; a failing task (ingest on a
  missing log dir) stops its downstream; a failing quality suite fails its task and the run.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from tests.fixtures.broker import BrokerProcess

# A dags test is several spark-submits (each 10-60 s to start on a loaded 2-core machine).
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]
ROOT = Path(__file__).resolve().parents[3]
AIRFLOW_VENV = ROOT / "airflow" / ".venv"
DAGS = ROOT / "airflow" / "dags"
REPORT = Path(__file__).with_name("dagbag_report.py")
JOBS = ["ingest", "build_lookups", "compact", "quality", "retention", "maintain"]

if not (AIRFLOW_VENV / "bin" / "airflow").is_file():
    pytest.fail(
        f"the Airflow environment is missing ({AIRFLOW_VENV}): run tools/bootstrap.sh",
        pytrace=False,
    )


def _env(home: Path, **variables: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIRFLOW", "PYSPARK", "VIRTUAL_ENV", "PYTHONPATH"))
    }
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(DAGS),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__UNIT_TEST_MODE="False",
        AIRFLOW_CONN_LOGLAKE_SPARK=json.dumps({"conn_type": "spark", "host": "local[2]"}),
    )
    env.update({f"AIRFLOW_VAR_{k.upper()}": v for k, v in variables.items()})
    return env


def _dagbag(tmp_path: Path, **variables: str) -> dict[str, Any]:
    out = tmp_path / "dagbag.json"
    subprocess.run(
        [str(AIRFLOW_VENV / "bin" / "python"), str(REPORT), str(DAGS), str(out)],
        env=_env(tmp_path / "home", **variables),
        check=True,
        capture_output=True,
        timeout=300,
    )
    return json.loads(out.read_text())


def test_dagbag_integrity(tmp_path: Path) -> None:
    bag = _dagbag(tmp_path)
    assert bag["import_errors"] == {}
    dags = bag["dags"]
    assert set(dags) == {"loglake_ingest", "loglake_maintenance"}
    assert dags["loglake_ingest"]["schedule"] == "@hourly"
    assert dags["loglake_maintenance"]["schedule"] == "@daily"
    present = {j for j in JOBS if (ROOT / "jobs" / f"{j}.py").is_file()}
    expected = {
        "loglake_ingest": [t for t, j in [("ingest", "ingest"), ("lookups", "build_lookups"),
                                          ("compact", "compact"), ("quality", "quality")]
                           if j in present],
        "loglake_maintenance": [t for t in ("retention", "maintain", "quality") if t in present],
    }  # fmt: skip
    spark_submit = ROOT / ".venv/lib/python3.11/site-packages/pyspark/bin/spark-submit"
    for dag_id, dag in dags.items():
        assert dag["tags"] == ["loglake"]
        assert dag["catchup"] is False and dag["max_active_runs"] == 1
        assert dag["params"] == ["config"]
        assert dag["order"] == expected[dag_id]
        for i, task_id in enumerate(dag["order"]):
            task = dag["tasks"][task_id]
            assert task["type"] == "SparkSubmitOperator"
            assert task["owner"] == "loglake"
            assert task["retries"] == 2 and task["retry_exponential_backoff"] is True
            assert task["upstream"] == dag["order"][i - 1 : i]  # a chain: each after the one before
            assert task["trigger_rule"].endswith("ALL_SUCCESS")
            assert Path(task["application"]).parent == ROOT / "jobs"
            assert task["application_args"][:2] == ["--config", "{{ params.config }}"]
            assert task["spark_binary"] == str(spark_submit)
            assert task["properties_file"] == str(ROOT / "conf" / "spark-defaults.conf")
            assert task["conn_id"] == "loglake_spark"


def test_steps_join_when_their_job_lands_and_settings_come_from_variables(
    tmp_path: Path,
) -> None:
    root = tmp_path / "checkout"
    (root / "jobs").mkdir(parents=True)
    for job in JOBS:
        (root / "jobs" / f"{job}.py").write_text("")
    bag = _dagbag(tmp_path, loglake_root=str(root), loglake_ingest_schedule="*/10 * * * *",
                  loglake_retries="5", loglake_spark_conn_id="spark_cluster")  # fmt: skip
    assert bag["import_errors"] == {}
    ingest, maintenance = bag["dags"]["loglake_ingest"], bag["dags"]["loglake_maintenance"]
    assert ingest["order"] == ["ingest", "lookups", "compact", "quality"]
    assert maintenance["order"] == ["retention", "maintain", "quality"]
    assert ingest["schedule"] == "*/10 * * * *"
    assert ingest["tasks"]["compact"]["application"] == str(root / "jobs" / "compact.py")
    assert {t["retries"] for t in ingest["tasks"].values()} == {5}
    assert {t["conn_id"] for t in maintenance["tasks"].values()} == {"spark_cluster"}
    assert ingest["tasks"]["ingest"]["application_args"][2:] == []  # no broker: no lake group
    bag = _dagbag(tmp_path, loglake_root=str(root), loglake_bootstrap_servers="h:9")
    for dag_id, task_id in (("loglake_ingest", "ingest"), ("loglake_maintenance", "retention")):
        args = bag["dags"][dag_id]["tasks"][task_id]["application_args"]
        assert args[2:] == ["--bootstrap-server", "h:9"], (dag_id, args)


# ----------------------------------------------------------------- airflow dags test


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An AIRFLOW_HOME with its sqlite database migrated (what ``dags test`` needs)."""
    home = tmp_path_factory.mktemp("airflow-home")
    subprocess.run(
        [str(AIRFLOW_VENV / "bin" / "airflow"), "db", "migrate"],
        env=_env(home), check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return home


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A log dir written by the real broker: 2 partitions, 40 records, lz4."""
    broker = BrokerProcess(tmp_path_factory.mktemp("af-broker"), num_partitions=2)
    broker.start()
    try:
        p = ck.Producer({"bootstrap.servers": broker.bootstrap, "compression.type": "lz4"})
        for i in range(40):
            p.produce("events", partition=i % 2, key=f"k{i}", value=f"event {i}".encode())
        assert p.flush(60) == 0
        del p  # no reconnect attempts to the stopped broker for the rest of the module
    finally:
        assert broker.stop() == 0
    yield broker.log_dir


def _dags_test(home: Path, dag_id: str, config: Path, date: str) -> tuple[int, str, dict[str, str]]:
    """``airflow dags test``: exit code, output, and the run's task states (from its DB)."""
    proc = subprocess.run(
        [str(AIRFLOW_VENV / "bin" / "airflow"), "dags", "test", dag_id, date],
        check=False,
        env=_env(home, loglake_config=str(config), loglake_retries="0"),
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    with sqlite3.connect(home / "airflow.db") as db:
        states = dict(
            db.execute(
                "SELECT ti.task_id, ti.state FROM task_instance ti JOIN dag_run r "
                "ON ti.dag_id = r.dag_id AND ti.run_id = r.run_id "
                "WHERE ti.dag_id = ? AND date(r.logical_date) = ?",
                (dag_id, date),
            ).fetchall()
        )
    return proc.returncode, proc.stdout + proc.stderr, states


def ingested_run_ids(lake: Path) -> list[str]:
    return DeltaTable(str(lake / "quality_results")).to_pyarrow_table()["run_id"].to_pylist()


def _config(path: Path, log_dir: Path, lake: Path, quality: str = "") -> Path:
    path.write_text(
        f'[paths]\nlog_dirs = ["{log_dir}"]\nlake = "{lake}"\n[spark]\nmaster = "local[2]"\n'
        f"[quality]\n{quality}"
    )
    return path


@pytest.fixture(scope="module")
def ingested(
    airflow_home: Path, log_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, int, str, dict[str, str]]:
    """One ``dags test`` of loglake_ingest: (lake, exit code, output, task states)."""
    work = tmp_path_factory.mktemp("af-ingest")
    lake = work / "lake"
    config = _config(work / "pipeline.toml", log_dir, lake)
    return (lake, *_dags_test(airflow_home, "loglake_ingest", config, "2024-02-01"))


def test_ingest_dag_runs_end_to_end(ingested: tuple[Path, int, str, dict[str, str]]) -> None:
    lake, code, output, states = ingested
    assert code == 0, output[-5000:]
    assert set(states.values()) == {"success"}, states
    records = DeltaTable(str(lake / "records")).to_pyarrow_table()
    assert records.num_rows == 40
    assert sorted(records["value"].to_pylist()) == sorted(f"event {i}".encode() for i in range(40))
    assert DeltaTable(str(lake / "offset_lookup")).to_pyarrow_table().num_rows > 0
    results = DeltaTable(str(lake / "quality_results")).to_pyarrow_table()
    run_ids = set(results["run_id"].to_pylist())
    assert len(run_ids) == 1 and next(iter(run_ids)).startswith("manual__")  # Airflow's run id
    assert all(results["success"].to_pylist())
    assert (lake / "_quality" / "data_docs" / "index.html").is_file()


def test_a_failed_task_stops_its_downstream(airflow_home: Path, tmp_path: Path) -> None:
    config = _config(tmp_path / "pipeline.toml", tmp_path / "no-such-dir", tmp_path / "lake")
    code, output, states = _dags_test(airflow_home, "loglake_ingest", config, "2024-02-02")
    assert code != 0
    assert states["ingest"] == "failed", states
    assert {s for t, s in states.items() if t != "ingest"} == {"upstream_failed"}, states
    assert "log dir does not exist" in output
    assert not (tmp_path / "lake" / "records").exists()


def test_a_failing_quality_suite_fails_its_task_and_the_run(
    airflow_home: Path,
    log_dir: Path,
    ingested: tuple[Path, int, str, dict[str, str]],
    tmp_path: Path,
) -> None:
    lake = tmp_path / "lake"
    shutil.copytree(ingested[0], lake)
    # Records are stamped by the producer before they reach the lake: no past skew allowed.
    strict = _config(tmp_path / "strict.toml", log_dir, lake, "max_past_skew_s = 0\n")
    code, output, states = _dags_test(airflow_home, "loglake_maintenance", strict, "2024-02-03")
    assert code != 0
    assert states["quality"] == "failed", states
    t = DeltaTable(str(lake / "quality_results")).to_pyarrow_table()
    failed = t.filter(pc.invert(t["success"]))
    assert set(zip(failed["suite"].to_pylist(), failed["rule"].to_pylist(), strict=True)) == {
        ("records", "timestamp_within_skew")
    }
    assert set(failed["run_id"].to_pylist()) != set(ingested_run_ids(ingested[0]))
    assert "records.timestamp_within_skew" in output
