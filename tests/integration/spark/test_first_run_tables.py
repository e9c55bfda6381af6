"""Every loglake table exists after the pipeline's first run, empty where nothing went there.

One first run of every job, in the order of the two DAGs (ingest, build_lookups, compact,
quality; retention, maintain), each through its ``jobs/<job>.py`` main on the shared Spark
session, over a log dir written by the storage engine: a topic with records, a compacted topic
(``cleanup.policy=compact``) with none, nothing damaged, nothing old enough for retention.
Each table is then read back with delta-rs.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from logstore.protocol.records import build_batch
from logstore.storage.topic_config import write_topic_config
from pipelines.demo import read_table
from pipelines.sources.synthetic import write_batches, write_high_watermarks
from tests.fixtures.jobs import load_job

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]


def test_every_table_exists_after_the_first_run(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log_dir, lake = tmp_path / "logs", tmp_path / "lake"
    now = int(time.time() * 1000)  # recent: within quality's skew, not due for retention
    batches = [build_batch([(f"k{i}".encode(), b"v", [], now + i) for i in range(5)])]
    _, end = write_batches(log_dir, "events", 0, batches)
    write_batches(log_dir, "profiles", 0, [])  # a compacted topic nobody produced to yet
    write_topic_config(log_dir, "profiles", {"cleanup.policy": "compact"})
    write_high_watermarks(log_dir, {("events", 0): end, ("profiles", 0): 0})
    config = tmp_path / "pipeline.toml"
    config.write_text(
        f'[paths]\nlog_dirs = ["{log_dir}"]\nlake = "{lake}"\n'
        f'[retention]\nbroker_config = "{ROOT / "conf" / "broker.properties"}"\n'
    )
    for job in ["ingest", "build_lookups", "compact", "quality", "retention", "maintain"]:
        code = load_job(job).main(["--config", str(config)])
        out = capsys.readouterr()
        assert code == 0, f"{job}: {out.err[-3000:]}"
        json.loads(out.out.strip().splitlines()[-1])  # the summary line

    rows = {
        name: read_table(lake / name).num_rows
        for name in [
            "records", "quarantine", "diverged", "offset_lookup", "time_lookup",
            "topics/profiles", "retention_log", "quality_results",
        ]
    }  # fmt: skip
    assert rows["records"] == 5 and rows["offset_lookup"] == 1 and rows["time_lookup"] == 1
    assert rows["quality_results"] > 0
    assert {n: rows[n] for n in ["quarantine", "diverged", "topics/profiles", "retention_log"]} == {
        "quarantine": 0, "diverged": 0, "topics/profiles": 0, "retention_log": 0,
    }  # fmt: skip
