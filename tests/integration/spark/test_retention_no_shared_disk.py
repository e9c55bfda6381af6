"""Retention on a cluster that does not share the broker's disk.

- Executors that cannot see a log dir the driver sees: exit 2's error at once, as ingest
  (``LogDirNotSharedError``, "the executors cannot see log dir ... set log_dirs = []"), nothing
  deleted and nothing logged. Made deterministic as in ingest's test: while the real Spark
  tasks run, the partition directory is away (the executors' view); it is back for the driver.
- A partition directory gone for the driver too (a topic deleted under the run) is planned
  again without it, as before.
- ``log_dirs = []``: the log side is the broker's own retention (as in Kafka); the job says so,
  starts no Spark, plans nothing, exits 0 with mode ``broker``; the table side
  (``jobs/maintain.py``) runs without log dirs, and refuses ``records = "topic"`` with exit 2
  when no broker is set either (with one: ``tests/integration/test_maintenance.py``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

import pipelines.retention.job
from pipelines.logdir import LogDirNotSharedError
from pipelines.retention.job import RETENTION_LOG_TABLE, RetentionConfig, run_retention
from pipelines.retention.model import ModelPartition, ModelSegment
from tests.fixtures.jobs import load_job
from tests.fixtures.retention_logdirs import write_log_dir

pytestmark = pytest.mark.integration

NOW = 1_800_000_000_000
DAY = 86_400_000


def _log_dir(tmp_path: Path, partitions: int = 1) -> Path:
    """``t-<n>`` partitions of four segments each (files only, no records: planning reads
    no more), the three closed ones a week past ``retention.ms`` (1 day): retention wants
    them gone."""
    old = NOW - 8 * DAY
    segs = [ModelSegment(i * 10, 100, old, old) for i in range(3)]
    segs.append(ModelSegment(30, 100, NOW, NOW))
    part = ModelPartition(segs, DAY, -1, "delete", 0, 40, None)
    log_dir = tmp_path / "logs"
    write_log_dir(log_dir, {("t", p): part for p in range(partitions)}, {"t": {}})
    (tmp_path / "broker.properties").write_text(f"log.retention.ms={DAY}\n", encoding="utf-8")
    return log_dir


def _config(tmp_path: Path, log_dir: Path) -> RetentionConfig:
    return RetentionConfig(
        log_dirs=(str(log_dir),),
        lake=str(tmp_path / "lake"),
        broker_config=str(tmp_path / "broker.properties"),
        ingest_topics=("t",),
    )


def _logs(part: Path) -> list[str]:
    return sorted(p.name for p in part.glob("*.log"))


def test_retention_whose_executors_cannot_see_the_log_dir_fails_at_once(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log_dir = _log_dir(tmp_path)
    part, away = log_dir / "t-0", tmp_path / "not-on-this-worker"
    before = _logs(part)
    real = pipelines.retention.job.plan_spark
    calls: list[int] = []

    def plan_spark(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        part.rename(away)
        try:
            return real(*args, **kwargs)
        finally:
            away.rename(part)

    monkeypatch.setattr(pipelines.retention.job, "plan_spark", plan_spark)
    lines: list[str] = []
    config = _config(tmp_path, log_dir)
    with pytest.raises(LogDirNotSharedError) as err:
        run_retention(spark, config, force=True, now_ms=NOW, log=lines.append)
    assert str(err.value).startswith(
        f"the executors cannot see log dir {log_dir} (no shared disk?): set log_dirs = []"
    )
    assert calls == [1]  # no re-plan
    assert not any("planning again" in line for line in lines), lines
    assert _logs(part) == before
    assert not (tmp_path / "lake" / RETENTION_LOG_TABLE).exists()
    # the same plan with the directory in place: the three expired segments
    monkeypatch.setattr(pipelines.retention.job, "plan_spark", real)
    summary = run_retention(spark, config, dry_run=True, force=True, now_ms=NOW, log=lines.append)
    assert (summary.errors, summary.partitions, summary.planned_segments) == ([], 1, 3)


def test_a_partition_gone_for_the_driver_too_is_planned_again_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log_dir = _log_dir(tmp_path, partitions=2)
    real = pipelines.retention.job.plan_local

    def plan_local(*args: Any, **kwargs: Any) -> Any:
        shutil.rmtree(log_dir / "t-1", ignore_errors=True)  # the topic's partition deleted
        return real(*args, **kwargs)

    monkeypatch.setattr(pipelines.retention.job, "plan_local", plan_local)
    lines: list[str] = []
    summary = run_retention(
        None, _config(tmp_path, log_dir), dry_run=True, force=True, now_ms=NOW, log=lines.append
    )
    assert sum("planning again (attempt 2 of 5)" in line for line in lines) == 1, lines
    assert (summary.partitions, summary.planned_segments) == (1, 3)


def _toml(tmp_path: Path, records: str) -> Path:
    conf = tmp_path / "pipeline.toml"
    conf.write_text(
        f'[paths]\nlog_dirs = []\nlake = "{tmp_path / "lake"}"\n'
        f'[retention]\nrecords = "{records}"\nbroker_config = "{tmp_path / "b.properties"}"\n',
        encoding="utf-8",
    )
    (tmp_path / "b.properties").write_text("", encoding="utf-8")
    return conf


def test_without_log_dirs_the_log_side_is_the_brokers_and_the_table_side_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = _toml(tmp_path, "forever")
    assert load_job("retention").main(["--config", str(conf)]) == 0
    out, err = capsys.readouterr()
    summary = json.loads(out.strip().splitlines()[-1])
    assert (summary["mode"], summary["partitions"], summary["errors"]) == ("broker", 0, [])
    assert "log retention is the broker's own here" in err
    assert DeltaTable(str(tmp_path / "lake" / RETENTION_LOG_TABLE)).to_pyarrow_table().num_rows == 0

    assert load_job("maintain").main(["--config", str(conf)]) == 0
    out, _ = capsys.readouterr()
    assert json.loads(out.strip().splitlines()[-1])["errors"] == []

    conf = _toml(tmp_path, "topic")
    assert load_job("maintain").main(["--config", str(conf)]) == 2
    _, err = capsys.readouterr()
    assert 'records = "topic" reads each topic\'s retention.ms from the log dirs' in err
