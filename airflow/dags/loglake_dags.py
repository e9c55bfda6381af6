"""loglake's DAGs: each task is one ``spark-submit jobs/<job>.py``, nothing else.

- ``loglake_ingest`` (hourly): ingest -> lookups -> compact -> quality
- ``loglake_maintenance`` (daily): retention -> maintain -> quality

A DAG is built from its list of job steps, and a step joins only when its ``jobs/<job>.py``
exists in the checkout: jobs that are not written yet (compact, retention, maintain) join the
DAGs by themselves once they land, without touching this file. Steps run in order, each only
after the one before succeeded (a failed task stops its downstream; Airflow's default trigger
rule); a task retries with exponential backoff.

Configuration, none of it hard-coded: Airflow Variables (or ``AIRFLOW_VAR_<NAME>`` in the
environment), read when this file is parsed unless said otherwise, each with its default:

- ``loglake_root``: the loglake checkout (jobs/, conf/, .venv/); this file's ``../..``
- ``loglake_spark_submit``: the project's own spark-submit (pyspark's);
  ``<root>/.venv/lib/python3.11/site-packages/pyspark/bin/spark-submit``
- ``loglake_python``: PYSPARK_PYTHON and PYSPARK_DRIVER_PYTHON; ``<root>/.venv/bin/python``
- ``loglake_config``: the pipeline TOML (log dirs, lake, thresholds), read by the jobs when a
  task runs; a run's ``config`` param overrides it; ``<root>/conf/pipeline.toml``
- ``loglake_spark_properties``: spark-submit ``--properties-file``;
  ``<root>/conf/spark-defaults.conf``
- ``loglake_spark_conn_id``: the Spark connection, whose host is the master (``local[*]``,
  ``spark://host:7077``, ``yarn``); ``loglake_spark``
- ``loglake_bootstrap_servers``: the running broker (``host:port``) that retention asks to
  delete records (Kafka's DeleteRecords) and ingest commits the lake's progress to (the
  consumer group ``[ingest] lake_group``); unset: retention works on the log dirs directly,
  under their ``.lock``, which a running broker holds (the task then fails and says so), and
  ingest commits no group
- ``loglake_spark_local_ip``: SPARK_LOCAL_IP of the jobs (read when a task runs); 127.0.0.1
- ``loglake_ingest_schedule``, ``loglake_maintenance_schedule``: ``@hourly``, ``@daily``
- ``loglake_retries``: retries of a task, with exponential backoff from
  ``loglake_retry_delay_s`` (60) up to 30 minutes; 2

The connection: e.g. ``AIRFLOW_CONN_LOGLAKE_SPARK='{"conn_type": "spark", "host": "local[*]"}'``
(without it the Spark provider falls back to ``yarn``).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, Param, Variable

ROOT = Path(Variable.get("loglake_root", default=str(Path(__file__).resolve().parents[2])))
SPARK_SUBMIT = Variable.get(
    "loglake_spark_submit",
    default=str(ROOT / ".venv/lib/python3.11/site-packages/pyspark/bin/spark-submit"),
)
PYTHON = Variable.get("loglake_python", default=str(ROOT / ".venv/bin/python"))
PROPERTIES = Variable.get(
    "loglake_spark_properties", default=str(ROOT / "conf" / "spark-defaults.conf")
)
CONN_ID = Variable.get("loglake_spark_conn_id", default="loglake_spark")
RETRIES = int(Variable.get("loglake_retries", default="2"))
RETRY_DELAY = dt.timedelta(seconds=float(Variable.get("loglake_retry_delay_s", default="60")))

# The running broker, for retention's DeleteRecords and ingest's lake group; unset: retention
# works on the log dirs directly under their .lock (no broker running).
BOOTSTRAP = Variable.get("loglake_bootstrap_servers", default="")

# (task id, job file, extra arguments) in run order.
INGEST_STEPS = [
    ("ingest", "ingest.py", ["--bootstrap-server", BOOTSTRAP] if BOOTSTRAP else []),
    ("lookups", "build_lookups.py", []),
    ("compact", "compact.py", []),
    ("quality", "quality.py", ["--run-id", "{{ run_id }}"]),
]
MAINTENANCE_STEPS = [
    ("retention", "retention.py", ["--bootstrap-server", BOOTSTRAP] if BOOTSTRAP else []),
    ("maintain", "maintain.py", []),
    ("quality", "quality.py", ["--run-id", "{{ run_id }}"]),
]

DEFAULT_ARGS = {
    "owner": "loglake",
    "retries": RETRIES,
    "retry_delay": RETRY_DELAY,
    "retry_exponential_backoff": True,
    "max_retry_delay": dt.timedelta(minutes=30),
}


def present_steps(steps: list[tuple[str, str, list[str]]]) -> list[tuple[str, str, list[str]]]:
    """The steps whose job file exists in the checkout, in order."""
    return [step for step in steps if (ROOT / "jobs" / step[1]).is_file()]


def build_dag(dag_id: str, schedule: str, steps: list[tuple[str, str, list[str]]], doc: str) -> DAG:
    """One DAG: the present steps as a chain of SparkSubmitOperator tasks."""
    with DAG(
        dag_id=dag_id,
        schedule=schedule,
        start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        default_args=DEFAULT_ARGS,
        tags=["loglake"],
        doc_md=doc,
        params={
            "config": Param(
                Variable.get("loglake_config", default=str(ROOT / "conf" / "pipeline.toml")),
                type="string",
                description="pipeline TOML of this run (paths, thresholds)",
            )
        },
    ) as dag:
        previous = None
        for task_id, job, extra in present_steps(steps):
            task = SparkSubmitOperator(
                task_id=task_id,
                application=str(ROOT / "jobs" / job),
                application_args=["--config", "{{ params.config }}", *extra],
                conn_id=CONN_ID,
                spark_binary=SPARK_SUBMIT,
                properties_file=PROPERTIES,
                name=f"loglake-{task_id}",
                env_vars={
                    "PYSPARK_PYTHON": PYTHON,
                    "PYSPARK_DRIVER_PYTHON": PYTHON,
                    "SPARK_LOCAL_IP": "{{ var.value.get('loglake_spark_local_ip', '127.0.0.1') }}",
                },
            )
            if previous is not None:
                previous >> task
            previous = task
    return dag


ingest_dag = build_dag(
    "loglake_ingest",
    Variable.get("loglake_ingest_schedule", default="@hourly"),
    INGEST_STEPS,
    "Broker log dirs to the lake: ingest, lookups, compaction, quality (one spark-submit each).",
)
maintenance_dag = build_dag(
    "loglake_maintenance",
    Variable.get("loglake_maintenance_schedule", default="@daily"),
    MAINTENANCE_STEPS,
    "Retention and table maintenance, then the quality suites (one spark-submit each).",
)
