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

import ast
import json
import os
import re
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

from logstore.storage.cleaner import read_cleaner_checkpoint
from pipelines import exit_codes
from tests.fixtures.broker import BrokerProcess
from tests.fixtures.jobs import SHORT_JVM_OPTS
from tests.integration.broker.clients import new_topic
from tests.unit.storage.test_cleaner import read_log

# A dags test is several spark-submits (each 10-60 s to start on a loaded 2-core machine).
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]
ROOT = Path(__file__).resolve().parents[3]
AIRFLOW_VENV = ROOT / "airflow" / ".venv"
DAGS = ROOT / "airflow" / "dags"
REPORT = Path(__file__).with_name("dagbag_report.py")

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
        AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY="1",  # retries in seconds, not minutes
        AIRFLOW_CONN_LOGLAKE_SPARK=json.dumps({"conn_type": "spark", "host": "local[2]"}),
        SPARK_SUBMIT_OPTS=SHORT_JVM_OPTS,  # the tasks' spark-submit drivers (the hook passes env)
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


_ROOT_T = f"var.value.get('loglake_root', {str(ROOT)!r})"
_CONFIG_T = (
    f"{{{{ params.config or var.value.get('loglake_config', {_ROOT_T} ~ '/conf/pipeline.toml') }}}}"
)
# dag id -> [(task id, job file, extra args, switches, broker, outlets)] in run order
EXPECTED = {
    "loglake_ingest": [
        ("ingest", "ingest.py", [], {}, True, ["loglake_records"]),
        ("lookups", "build_lookups.py", [], {}, False,
         ["loglake_offset_lookup", "loglake_time_lookup"]),
        ("compact", "compact.py", [], {"full": "--full"}, False, ["loglake_topics"]),
        ("decode", "decode.py", [], {}, False, ["loglake_tables"]),
        ("quality", "quality.py", ["--run-id", "{{ run_id }}"], {}, False, []),
    ],
    "loglake_maintenance": [
        ("retention", "retention.py", [], {"dry_run": "--dry-run"}, True, []),
        ("maintain", "maintain.py", [], {"dry_run": "--dry-run"}, False, []),
        ("quality", "quality.py", ["--run-id", "{{ run_id }}"], {}, False, []),
    ],
    "loglake_log_cleaning": [
        ("clean", "compact.py", ["--log"], {"force": "--force"}, False, []),
    ],
}  # fmt: skip
PARAMS = {
    "loglake_ingest": {"config": "", "full": False},
    "loglake_maintenance": {"config": "", "dry_run": False},
    "loglake_log_cleaning": {"config": "", "force": False},
}


def test_dagbag_integrity(tmp_path: Path) -> None:
    bag = _dagbag(tmp_path)
    assert bag["import_errors"] == {}
    dags = bag["dags"]
    assert set(dags) == set(EXPECTED)
    assert dags["loglake_ingest"]["schedule"] == "@hourly"
    assert dags["loglake_maintenance"]["schedule"] == "@daily"
    assert dags["loglake_log_cleaning"]["schedule"] == "@hourly"
    for dag_id, dag in dags.items():
        assert dag["tags"] == ["loglake"]
        assert dag["catchup"] is False and dag["max_active_runs"] == 1
        assert dag["dagrun_timeout_s"] and dag["dagrun_timeout_s"] > 0, dag_id
        assert dag["params"] == PARAMS[dag_id]  # the destructive switches default to off
        assert dag["order"] == [step[0] for step in EXPECTED[dag_id]]
        for i, (task_id, job, extra, switches, broker, outlets) in enumerate(EXPECTED[dag_id]):
            task = dag["tasks"][task_id]
            assert task["type"] == "LoglakeJob"
            assert task["owner"] == "loglake"
            assert task["retries"] == 2 and task["retry_exponential_backoff"] is True
            assert task["max_retry_delay_s"] == 1800
            assert 0 < task["execution_timeout_s"] < dag["dagrun_timeout_s"], task_id
            assert task["upstream"] == dag["order"][i - 1 : i]  # a chain: each after the one before
            assert task["trigger_rule"].endswith("ALL_SUCCESS")
            assert task["application"] == f"{{{{ {_ROOT_T} }}}}/jobs/{job}"
            assert task["application_args"] == ["--config", _CONFIG_T, *extra]
            assert task["switches"] == switches
            assert task["broker_conn_id"] == ("loglake_broker" if broker else None)
            assert task["outlets"] == outlets
            assert task["properties_file"] == f"{{{{ {_ROOT_T} }}}}/conf/spark-defaults.conf"
            assert task["spark_submit"] == "{{ var.value.get('loglake_spark_submit', '') }}"
            python = f"{{{{ var.value.get('loglake_python', {_ROOT_T} ~ '/.venv/bin/python') }}}}"
            assert task["env_vars"]["PYSPARK_PYTHON"] == python
            assert task["conn_id"] == "loglake_spark"


def test_the_dag_file_reads_no_variable_at_parse_time_and_names_no_interpreter() -> None:
    """ruff's Airflow rules (AIR003: ``Variable.get`` outside a task) are clean, as the
    project's ruff config checks them; no ``python3.x`` path is written into the DAGs."""
    proc = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "ruff"), "check", "--preview", "--select", "AIR",
         "--no-cache", str(DAGS)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for path in DAGS.glob("*.py"):
        assert not re.search(r"python3\.\d+", path.read_text()), path


def test_the_dag_file_keeps_the_jobs_non_retriable_exit_codes() -> None:
    """The DAG file's own copy (it cannot import pipelines) equals pipelines/exit_codes.py."""
    tree = ast.parse((DAGS / "loglake_dags.py").read_text())
    (value,) = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "NON_RETRIABLE" for t in node.targets)
    ]
    assert isinstance(value, ast.Call) and value.func.id == "frozenset"  # type: ignore[attr-defined]
    assert frozenset(ast.literal_eval(value.args[0])) == exit_codes.NON_RETRIABLE


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


def _dags_test(
    home: Path,
    dag_id: str,
    config: Path,
    date: str,
    *,
    conf: dict[str, Any] | None = None,
    conns: dict[str, dict[str, Any]] | None = None,
    **variables: str,
) -> tuple[int, str, dict[str, str], dict[str, int]]:
    """``airflow dags test``: exit code, output, the run's task states and tries (its DB)."""
    env = _env(home, loglake_config=str(config), **variables)
    for conn_id, conn in (conns or {}).items():
        env[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps(conn)
    proc = subprocess.run(
        [str(AIRFLOW_VENV / "bin" / "airflow"), "dags", "test", dag_id, date,
         *(["--conf", json.dumps(conf)] if conf else [])],
        check=False, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    with sqlite3.connect(home / "airflow.db") as db:
        rows = db.execute(
            "SELECT ti.task_id, ti.state, ti.try_number FROM task_instance ti JOIN dag_run r "
            "ON ti.dag_id = r.dag_id AND ti.run_id = r.run_id "
            "WHERE ti.dag_id = ? AND date(r.logical_date) = ?",
            (dag_id, date),
        ).fetchall()
    states = {task: state for task, state, _ in rows}
    tries = {task: tries for task, _, tries in rows}
    return proc.returncode, proc.stdout + proc.stderr, states, tries


def _config(path: Path, log_dir: Path, lake: Path, quality: str = "") -> Path:
    path.write_text(
        f'[paths]\nlog_dirs = ["{log_dir}"]\nlake = "{lake}"\n[spark]\nmaster = "local[2]"\n'
        f"[quality]\n{quality}"
    )
    return path


@pytest.fixture(scope="module")
def ingested(
    airflow_home: Path, log_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, int, str, dict[str, str], dict[str, int]]:
    """One ``dags test`` of loglake_ingest whose quality suite fails: (lake, exit code, output,
    task states, tries).

    Records are stamped by the producer before they reach the lake, so ``max_past_skew_s = 0``
    fails ``records.timestamp_within_skew`` and nothing else. One run serves both tests below:
    the jobs before quality succeed on real data, and the failing suite fails its task and the
    run (a ``dags test`` is 5 spark-submits, 100-200 s here). A run where every task and every
    expectation succeeds is ``tests/integration/test_demo.py``'s (both DAGs, exit 0).
    """
    work = tmp_path_factory.mktemp("af-ingest")
    lake = work / "lake"
    config = _config(work / "pipeline.toml", log_dir, lake, "max_past_skew_s = 0\n")
    return (lake, *_dags_test(airflow_home, "loglake_ingest", config, "2024-02-01"))


def test_ingest_dag_runs_end_to_end(
    ingested: tuple[Path, int, str, dict[str, str], dict[str, int]],
) -> None:
    lake, _, output, states, _ = ingested
    jobs = {"ingest": "success", "lookups": "success", "compact": "success", "decode": "success"}
    assert states == {**jobs, "quality": "failed"}, (states, output[-5000:])
    records = DeltaTable(str(lake / "records")).to_pyarrow_table()
    assert records.num_rows == 40
    assert sorted(records["value"].to_pylist()) == sorted(f"event {i}".encode() for i in range(40))
    assert DeltaTable(str(lake / "offset_lookup")).to_pyarrow_table().num_rows > 0
    results = DeltaTable(str(lake / "quality_results")).to_pyarrow_table()
    run_ids = set(results["run_id"].to_pylist())
    assert len(run_ids) == 1 and next(iter(run_ids)).startswith("manual__")  # Airflow's run id
    assert (lake / "_quality" / "data_docs" / "index.html").is_file()


def test_a_failed_task_stops_its_downstream(airflow_home: Path, tmp_path: Path) -> None:
    config = _config(tmp_path / "pipeline.toml", tmp_path / "no-such-dir", tmp_path / "lake")
    code, output, states, _ = _dags_test(airflow_home, "loglake_ingest", config, "2024-02-02")
    assert code != 0
    assert states["ingest"] == "failed", states
    assert {s for t, s in states.items() if t != "ingest"} == {"upstream_failed"}, states
    assert "log dir does not exist" in output
    assert not (tmp_path / "lake" / "records").exists()


def test_a_failing_quality_suite_fails_its_task_and_the_run(
    ingested: tuple[Path, int, str, dict[str, str], dict[str, int]],
) -> None:
    lake, code, output, states, tries = ingested
    assert code != 0
    assert states["quality"] == "failed", states
    assert tries["quality"] == 1, tries  # exit 5: no retry can fix a failing suite
    t = DeltaTable(str(lake / "quality_results")).to_pyarrow_table()
    failed = t.filter(pc.invert(t["success"]))
    assert set(zip(failed["suite"].to_pylist(), failed["rule"].to_pylist(), strict=True)) == {
        ("records", "timestamp_within_skew")
    }
    assert "records.timestamp_within_skew" in output


# ------------------------------------------------------- exit codes, retries, log cleaning


def test_a_non_retriable_exit_code_fails_the_task_at_once(
    airflow_home: Path, log_dir: Path, tmp_path: Path
) -> None:
    """compact exits 2 (a topic of ``[compact] topics`` in no log dir): one try, failed,
    although the task has 2 retries."""
    config = tmp_path / "pipeline.toml"
    config.write_text(
        f'[paths]\nlog_dirs = ["{log_dir}"]\nlake = "{tmp_path / "lake"}"\n'
        '[spark]\nmaster = "local[2]"\n[compact]\ntopics = ["no-such-topic"]\n'
    )
    code, output, states, tries = _dags_test(
        airflow_home, "loglake_log_cleaning", config, "2024-02-04"
    )
    assert code != 0
    assert states == {"clean": "failed"}, states
    assert tries == {"clean": 1}, tries
    assert "no-such-topic" in output
    assert "compact.py exited 2, which no retry can fix" in output


_FAKE_JOB = """\
import json, sys
from pathlib import Path

job = Path(__file__)
with open(job.parents[1] / "calls.jsonl", "a") as f:
    f.write(json.dumps([job.name, *sys.argv[1:]]) + "\\n")
sys.exit(1 if job.name == "compact.py" else 0)
"""


def test_a_transient_exit_is_retried_and_settings_are_read_when_the_task_runs(
    airflow_home: Path, tmp_path: Path
) -> None:
    """A checkout whose compact job exits 1 (the others 0), chosen by the Variable
    ``loglake_root`` when the tasks run: compact is tried 1 + 2 retries times, its downstream
    does not run; the ``full`` param adds ``--full``, the run's ``config`` param wins over the
    Variable, the ``loglake_broker`` connection gives ingest its ``--bootstrap-server``."""
    root = tmp_path / "checkout"
    (root / "jobs").mkdir(parents=True)
    for job in ("ingest", "build_lookups", "compact", "decode", "quality"):
        (root / "jobs" / f"{job}.py").write_text(_FAKE_JOB)
    (root / "conf").mkdir()
    shutil.copy(ROOT / "conf" / "spark-defaults.conf", root / "conf")
    chosen = str(tmp_path / "chosen.toml")
    code, output, states, tries = _dags_test(
        airflow_home, "loglake_ingest", tmp_path / "variable.toml", "2024-02-05",
        conf={"full": True, "config": chosen},
        conns={"loglake_broker": {"conn_type": "generic", "host": "127.0.0.1", "port": 9}},
        loglake_root=str(root), loglake_python=str(ROOT / ".venv" / "bin" / "python"),
        loglake_spark_submit=str(ROOT / ".venv" / "bin" / "spark-submit"),
    )  # fmt: skip
    assert code != 0
    assert states == {"ingest": "success", "lookups": "success", "compact": "failed",
                      "decode": "upstream_failed", "quality": "upstream_failed"}, (
        states, output[-3000:])  # fmt: skip
    assert tries["compact"] == 3, tries
    calls = [json.loads(line) for line in (root / "calls.jsonl").read_text().splitlines()]
    assert calls == [
        ["ingest.py", "--config", chosen, "--bootstrap-server", "127.0.0.1:9"],
        ["build_lookups.py", "--config", chosen],
        *[["compact.py", "--config", chosen, "--full"]] * 3,
    ]


def test_the_cleaning_dag_cleans_a_due_compacted_topic(airflow_home: Path, tmp_path: Path) -> None:
    """A compacted topic written by the real broker (confluent-kafka), the broker stopped:
    ``loglake_log_cleaning`` cleans it (never cleaned: dirty ratio 1.0, due) and swaps the
    segments in under the log dir's ``.lock``; the log then holds one record per key below
    the cleaned end, each key's latest value."""
    broker = BrokerProcess(tmp_path / "broker", num_partitions=1)
    broker.start()
    try:
        topic = new_topic(broker.bootstrap, partitions=1, prefix="cmp",
                          **{"cleanup.policy": "compact", "segment.bytes": "1024"})  # fmt: skip
        p = ck.Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
        for i in range(300):
            p.produce(topic, key=b"k%02d" % (i % 30), value=b"v%03d" % i)
            if i % 10 == 9:
                p.flush(30)
        assert p.flush(60) == 0
        del p
    finally:
        assert broker.stop() == 0
    before = _log_records(broker.log_dir / f"{topic}-0")
    assert len(before) == 300
    config = _config(tmp_path / "pipeline.toml", broker.log_dir, tmp_path / "lake")
    code, output, states, tries = _dags_test(
        airflow_home, "loglake_log_cleaning", config, "2024-02-06"
    )
    assert code == 0, output[-5000:]
    assert states == {"clean": "success"} and tries == {"clean": 1}
    end = read_cleaner_checkpoint(broker.log_dir)[(topic, 0)]
    assert 0 < end <= 300
    after = _log_records(broker.log_dir / f"{topic}-0")
    below = [key for offset, key, _ in after if offset < end]
    assert len(below) == len(set(below)) < sum(1 for o, _, _ in before if o < end)
    latest = {key: value for _, key, value in before}
    assert {key: value for _, key, value in after} == latest
    assert [r for r in after if r[0] >= end] == [r for r in before if r[0] >= end]


def _log_records(partition_dir: Path) -> list[tuple[int, bytes, bytes]]:
    """(offset, key, value) of every record in a partition's segments, in offset order."""
    records, _ = read_log(partition_dir)
    return [(r.offset, r.key, r.value) for r in records]
