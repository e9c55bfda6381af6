"""Run by the Airflow environment's Python (never imported by pytest): loads a DAG folder
into a DagBag (no database needed) and writes what the integrity tests check, as JSON, to
the file named by its second argument (Airflow logs to stdout)."""

from __future__ import annotations

import json
import sys

from airflow.dag_processing.dagbag import DagBag


def main(folder: str, out: str) -> None:
    bag = DagBag(dag_folder=folder)
    dags = {}
    for dag_id, dag in bag.dags.items():
        dags[dag_id] = {
            "schedule": str(dag.schedule),
            "tags": sorted(dag.tags),
            "catchup": dag.catchup,
            "max_active_runs": dag.max_active_runs,
            "params": {k: dag.params[k] for k in sorted(dag.params.keys())},
            "dagrun_timeout_s": dag.dagrun_timeout.total_seconds() if dag.dagrun_timeout else None,
            "order": [t.task_id for t in dag.topological_sort()],
            "tasks": {
                t.task_id: {
                    "type": type(t).__name__,
                    "owner": t.owner,
                    "retries": t.retries,
                    "retry_exponential_backoff": bool(t.retry_exponential_backoff),
                    "retry_delay_s": t.retry_delay.total_seconds(),
                    "upstream": sorted(t.upstream_task_ids),
                    "application": t.application,
                    "application_args": list(t.application_args),
                    "properties_file": t.properties_file,
                    "env_vars": dict(t.env_vars or {}),
                    "conn_id": t._conn_id,
                    "trigger_rule": str(t.trigger_rule),
                    "execution_timeout_s": (
                        t.execution_timeout.total_seconds() if t.execution_timeout else None
                    ),
                    "max_retry_delay_s": t.max_retry_delay.total_seconds(),
                    "switches": dict(getattr(t, "switches", {})),
                    "broker_conn_id": getattr(t, "broker_conn_id", None),
                    "spark_submit": getattr(t, "spark_submit", None),
                    "outlets": sorted(a.name for a in t.outlets),
                }
                for t in dag.tasks
            },
        }
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"import_errors": dict(bag.import_errors), "dags": dags}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
