"""loglake's DAGs: each task is one ``spark-submit jobs/<job>.py``, nothing else.

- ``loglake_ingest`` (hourly): ingest -> lookups -> compact -> decode -> quality; its tasks
  declare the tables they update as Airflow assets (``loglake_records``,
  ``loglake_offset_lookup``, ``loglake_time_lookup``, ``loglake_topics``, ``loglake_tables``:
  the typed tables), so other DAGs can be scheduled on them
- ``loglake_maintenance`` (daily): retention -> maintain -> quality
- ``loglake_log_cleaning`` (hourly): ``jobs/compact.py --log``, the broker's log cleaner: every
  topic whose ``cleanup.policy`` contains ``compact``; the job itself decides which partitions
  are due (``min.cleanable.dirty.ratio``, ``max.compaction.lag.ms``, as Kafka's cleaner) and
  reports the others as skipped; ``log.cleaner.enable=false`` in the broker config turns it off

Steps run in order, each only after the one before succeeded (Airflow's default trigger rule).

Failures. A job's exit code says whether a retry can help (``pipelines/exit_codes.py``): codes
in :data:`NON_RETRIABLE` (2 bad arguments/config/missing topic, 3 corrupt data, 4 diverged log,
5 quality suite failed, 6 index mismatch) fail the task at once, without its retries; any other
failure (1, a lost spark-submit, a timeout) is retried :data:`RETRIES` times with exponential
backoff from Airflow's ``[core] default_task_retry_delay`` up to 30 minutes. Every task has an
``execution_timeout`` and every DAG a ``dagrun_timeout``, so a hung spark-submit cannot block
a DAG for good under ``max_active_runs=1``.

Configuration, none of it read when this file is parsed (Airflow Variables are read when a
task runs, through templates or in :meth:`LoglakeJob.execute`), each with its default:

- Variable ``loglake_root``: the loglake checkout (jobs/, conf/, .venv/); this file's ``../..``
- Variable ``loglake_config``: the pipeline TOML; ``<root>/conf/pipeline.toml``; a run's
  ``config`` param overrides it
- Variable ``loglake_python``: PYSPARK_PYTHON and PYSPARK_DRIVER_PYTHON;
  ``<root>/.venv/bin/python``
- Variable ``loglake_spark_submit``: the spark-submit to run; ``<root>/.venv/bin/spark-submit``
  (pyspark's), else ``spark-submit`` on the PATH
- Variable ``loglake_spark_local_ip``: SPARK_LOCAL_IP of the jobs; ``127.0.0.1``
- connection ``loglake_spark`` (conn_type spark): its host is the master (``local[*]``,
  ``spark://host:7077``, ``yarn``); without it the Spark provider falls back to ``yarn``
- connection ``loglake_broker``: the running broker (host and port) that ingest commits the
  lake's progress to and retention asks to delete records (``--bootstrap-server``); absent:
  ingest commits no group and retention works on the log dirs under their ``.lock``

Params of a run (the destructive switches default to off): ``config`` (empty: the Variable),
``full`` (ingest DAG: ``compact --full``, rebuild the tables), ``dry_run`` (maintenance DAG:
``retention --dry-run`` and ``maintain --dry-run``), ``force`` (cleaning DAG: clean partitions
that are not due).
"""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, Asset, BaseHook, Param
from airflow.sdk.exceptions import AirflowFailException, AirflowNotFoundException

__all__ = ["NON_RETRIABLE", "LoglakeJob", "cleaning_dag", "ingest_dag", "maintenance_dag"]

# A copy of pipelines/exit_codes.NON_RETRIABLE (this file runs in airflow/.venv, which cannot
# import pipelines); tests/integration/airflow/test_dags.py checks that the two agree.
NON_RETRIABLE = frozenset({2, 3, 4, 5, 6})

RETRIES = 2
MAX_RETRY_DELAY = dt.timedelta(minutes=30)
SPARK_CONN_ID = "loglake_spark"
BROKER_CONN_ID = "loglake_broker"

DEFAULT_ROOT = Path(__file__).resolve().parents[2]
# Jinja expressions, evaluated when a task runs (Variables are never read at parse time)
_ROOT = f"var.value.get('loglake_root', {str(DEFAULT_ROOT)!r})"
_PYTHON = f"var.value.get('loglake_python', {_ROOT} ~ '/.venv/bin/python')"
_CONFIG = f"params.config or var.value.get('loglake_config', {_ROOT} ~ '/conf/pipeline.toml')"

ASSETS = {
    name: Asset(name=f"loglake_{name}", uri=f"loglake://lake/{name}", group="loglake")
    for name in ("records", "offset_lookup", "time_lookup", "topics", "tables")
}


class LoglakeJob(SparkSubmitOperator):
    """``spark-submit <root>/jobs/<job> --config <toml> [args] [switches] [--bootstrap-server]``.

    ``switches`` maps a run param to the flag it adds when true (``{"full": "--full"}``);
    ``broker``: add ``--bootstrap-server host:port`` from the ``loglake_broker`` connection
    when it exists. The spark-submit binary is found when the task runs (Variable
    ``loglake_spark_submit``, ``<root>/.venv/bin/spark-submit``, the PATH). An exit code in
    :data:`NON_RETRIABLE` fails the task without retries (:class:`AirflowFailException`).
    """

    template_fields = (*SparkSubmitOperator.template_fields, "spark_submit")

    def __init__(
        self,
        *,
        task_id: str,
        job: str,
        args: Sequence[str] = (),
        switches: Mapping[str, str] | None = None,
        broker: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            task_id=task_id,
            application=f"{{{{ {_ROOT} }}}}/jobs/{job}",
            application_args=["--config", f"{{{{ {_CONFIG} }}}}", *args],
            conn_id=SPARK_CONN_ID,
            properties_file=f"{{{{ {_ROOT} }}}}/conf/spark-defaults.conf",
            name=f"loglake-{task_id}",
            env_vars={
                "PYSPARK_PYTHON": f"{{{{ {_PYTHON} }}}}",
                "PYSPARK_DRIVER_PYTHON": f"{{{{ {_PYTHON} }}}}",
                "SPARK_LOCAL_IP": "{{ var.value.get('loglake_spark_local_ip', '127.0.0.1') }}",
            },
            **kwargs,
        )
        self.job = job
        self.spark_submit = "{{ var.value.get('loglake_spark_submit', '') }}"
        self.switches = dict(switches or {})
        self.broker_conn_id = BROKER_CONN_ID if broker else None

    def run_args(self, params: Mapping[str, Any]) -> list[str]:
        """The rendered arguments plus the switches that ``params`` turn on and the broker."""
        args = list(self.application_args or [])
        args += [flag for param, flag in self.switches.items() if params.get(param)]
        if self.broker_conn_id is not None:
            try:
                conn = BaseHook.get_connection(self.broker_conn_id)
            except AirflowNotFoundException:
                self.log.info("no %s connection: no --bootstrap-server", self.broker_conn_id)
            else:
                if not conn.host:
                    raise AirflowFailException(f"the {self.broker_conn_id} connection has no host")
                address = f"{conn.host}:{conn.port}" if conn.port else conn.host
                args += ["--bootstrap-server", address]
        return args

    def execute(self, context: Any) -> None:
        self.application_args = self.run_args(context["params"])
        self._spark_binary = self._find_spark_submit()
        try:
            super().execute(context)
        except Exception as exc:
            process = getattr(self._hook, "_submit_sp", None)
            code = getattr(process, "returncode", None)
            if code in NON_RETRIABLE:
                raise AirflowFailException(
                    f"{self.job} exited {code}, which no retry can fix (see "
                    "pipelines/exit_codes.py): failing without retries"
                ) from exc
            raise

    def _find_spark_submit(self) -> str:
        if self.spark_submit:
            return str(self.spark_submit)
        venv = Path(self.application).parents[1] / ".venv" / "bin" / "spark-submit"
        if venv.is_file():
            return str(venv)
        found = shutil.which("spark-submit")
        if found is None:
            raise AirflowFailException(
                f"no spark-submit: not {venv}, not on the PATH; set the Variable "
                "loglake_spark_submit"
            )
        return found


def build_dag(
    dag_id: str,
    *,
    schedule: str,
    doc: str,
    timeout: dt.timedelta,
    params: Mapping[str, Param],
    tasks: Sequence[dict[str, Any]],
) -> DAG:
    """One DAG: ``tasks`` (keyword arguments of :class:`LoglakeJob`) as a chain."""
    with DAG(
        dag_id=dag_id,
        schedule=schedule,
        start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        dagrun_timeout=timeout,
        default_args={
            "owner": "loglake",
            "retries": RETRIES,
            "retry_exponential_backoff": True,
            "max_retry_delay": MAX_RETRY_DELAY,
        },
        tags=["loglake"],
        doc_md=doc,
        params={
            "config": Param(
                "",
                type="string",
                description="pipeline TOML of this run; empty: the Variable loglake_config, "
                "else <root>/conf/pipeline.toml",
            ),
            **params,
        },
    ) as dag:
        previous = None
        for kwargs in tasks:
            task = LoglakeJob(**kwargs)
            if previous is not None:
                previous >> task
            previous = task
    return dag


def _switch(description: str) -> Param:
    return Param(False, type="boolean", description=description)


_HOUR = dt.timedelta(hours=1)

ingest_dag = build_dag(
    "loglake_ingest",
    schedule="@hourly",
    doc="Broker log dirs to the lake: ingest, lookups, compaction, typed tables, quality.",
    timeout=4 * _HOUR,
    params={"full": _switch("compact --full: rebuild the compacted tables from records")},
    tasks=[
        {"task_id": "ingest", "job": "ingest.py", "broker": True,
         "execution_timeout": 2 * _HOUR, "outlets": [ASSETS["records"]]},
        {"task_id": "lookups", "job": "build_lookups.py", "execution_timeout": _HOUR,
         "outlets": [ASSETS["offset_lookup"], ASSETS["time_lookup"]]},
        {"task_id": "compact", "job": "compact.py", "switches": {"full": "--full"},
         "execution_timeout": 2 * _HOUR, "outlets": [ASSETS["topics"]]},
        {"task_id": "decode", "job": "decode.py", "execution_timeout": 2 * _HOUR,
         "outlets": [ASSETS["tables"]]},
        {"task_id": "quality", "job": "quality.py", "args": ["--run-id", "{{ run_id }}"],
         "execution_timeout": _HOUR},
    ],
)  # fmt: skip
maintenance_dag = build_dag(
    "loglake_maintenance",
    schedule="@daily",
    doc="Retention and table maintenance, then the quality suites.",
    timeout=8 * _HOUR,
    params={"dry_run": _switch("retention and maintain --dry-run: report, delete nothing")},
    tasks=[
        {"task_id": "retention", "job": "retention.py", "broker": True,
         "switches": {"dry_run": "--dry-run"}, "execution_timeout": 3 * _HOUR},
        {"task_id": "maintain", "job": "maintain.py", "switches": {"dry_run": "--dry-run"},
         "execution_timeout": 3 * _HOUR},
        {"task_id": "quality", "job": "quality.py", "args": ["--run-id", "{{ run_id }}"],
         "execution_timeout": _HOUR},
    ],
)  # fmt: skip
cleaning_dag = build_dag(
    "loglake_log_cleaning",
    schedule="@hourly",
    doc="The broker's log cleaner: compacted topics' due partitions cleaned and swapped in.",
    timeout=3 * _HOUR,
    params={"force": _switch("compact --log --force: clean partitions that are not due")},
    tasks=[
        {"task_id": "clean", "job": "compact.py", "args": ["--log"],
         "switches": {"force": "--force"}, "execution_timeout": 2 * _HOUR},
    ],
)  # fmt: skip
