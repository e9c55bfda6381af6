"""A ``spark-submit jobs/ingest.py`` killed between writing its data files and committing
leaves ``part-*.parquet`` files no commit references; the next run removes them (and only
them: a live writer's in-flight files stay), and the table is exact.

Records come from the real broker and confluent-kafka; the kill is the real failpoint
(``LOGLAKE_FAILPOINT=delta.before_commit``: SIGKILL of the whole spark-submit session).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from deltalake import DeltaTable

from pipelines.delta.staging import STAGING_DIR, reap_crashed_writes
from tests.fixtures.broker import ROOT
from tests.integration.broker.clients import new_topic

pytestmark = pytest.mark.integration


def _spark_submit(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    submit = Path(sys.executable).parent.parent / "lib" / "python3.11" / "site-packages"
    cmd = [
        str(submit / "pyspark" / "bin" / "spark-submit"),
        "--master",
        "local[2]",
        "--conf",
        "spark.ui.enabled=false",
        str(ROOT / "jobs" / "ingest.py"),
        *args,
    ]
    return subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=300, start_new_session=True,
        check=False,
    )  # fmt: skip


def _pid_start(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def _fake_write(records: Path, template: Path, write_id: str, marker: dict[str, Any]) -> Path:
    """Another writer's in-flight write: its run marker and one data file of its write id."""
    data = template.parent / f"part-00000-{write_id}-0-c000.snappy.parquet"
    shutil.copyfile(template, data)
    (records / STAGING_DIR / f"{write_id}.json").write_text(
        json.dumps({"write_id": write_id, **marker})
    )
    return data


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
    }
    args = ["--config", str(ROOT / "conf" / "pipeline.toml"), "--log-dirs", str(b.log_dir)]
    args += ["--lake", str(lake)]

    killed = _spark_submit(args, {**env, "LOGLAKE_FAILPOINT": "delta.before_commit"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    orphans = sorted(records.rglob("part-*.parquet"))
    assert orphans, "the killed run had written its data files"
    markers = list((records / STAGING_DIR).glob("*.json"))
    assert len(markers) == 1 and markers[0].stem in orphans[0].name

    # Two writers still in flight: a live process on this host, and a fresh one elsewhere.
    live = subprocess.Popen(["sleep", "600"])
    try:
        here = {
            "host": socket.gethostname(),
            "pid": live.pid,
            "pid_start": _pid_start(live.pid),
            "started_at": time.time(),
        }
        live_file = _fake_write(records, orphans[0], "a" * 32, here)
        away = {"host": "elsewhere.invalid", "pid": 1, "pid_start": 1, "started_at": time.time()}
        away_file = _fake_write(records, orphans[0], "b" * 32, away)

        ok = _spark_submit(args, env)
        assert ok.returncode == 0, ok.stderr[-3000:]
        summary = json.loads(ok.stdout.strip().splitlines()[-1])
        assert summary["records"] == 400 and summary["committed"] is True
        assert "data files of earlier runs that were killed before commit" in ok.stdout + ok.stderr
        assert not any(p.exists() for p in orphans)  # the killed run's files are gone
        assert not markers[0].exists()
        assert live_file.exists() and away_file.exists()  # in-flight writers untouched
        left = sorted(p.name for p in (records / STAGING_DIR).iterdir())
        assert left == [f"{'a' * 32}.json", f"{'b' * 32}.json"]
        table = DeltaTable(str(records))
        rows = table.to_pyarrow_table(columns=["partition", "offset", "key"]).to_pylist()
        assert sorted((r["partition"], r["offset"]) for r in rows) == sorted(
            (p, o) for p in range(2) for o in range(200)
        )
        on_disk = {str(p.relative_to(records)) for p in records.rglob("part-*.parquet")}
        referenced = {str(Path(u).relative_to(records)) for u in table.file_uris()}
        assert on_disk - referenced == {
            str(live_file.relative_to(records)),
            str(away_file.relative_to(records)),
        }
    finally:
        live.kill()
        live.wait()
    # the live writer died without committing: now its files go too (the other host's not yet)
    assert reap_crashed_writes(records) == 1
    assert not live_file.exists() and away_file.exists()
    assert reap_crashed_writes(records, stale_after_s=0.0) == 1
    assert not away_file.exists()
    assert sorted(records.rglob("part-*.parquet")) == sorted(
        Path(u) for u in DeltaTable(str(records)).file_uris()
    )
