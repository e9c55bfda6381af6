"""The retention job against the real broker, with real clients running meanwhile.

Online: a producer and a consumer (confluent-kafka) run while the job deletes through
DeleteRecords; segments not yet in the lake survive, ``--force`` deletes them and the next
ingest reports the gap; ``ListOffsets(earliest)`` moves to the job's new log start; every
record acknowledged at or above it is still there, byte for byte. Offline: refused while the
broker holds the lock, applied under the lock once it is stopped. The CLI: ``--dry-run``
prints the table and deletes nothing; the summary is the last stdout line.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import polars as pl
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession

from logstore.errors import LoglakeError
from pipelines.ingest import IngestConfig, run_ingest
from pipelines.retention.job import RETENTION_LOG_TABLE, RetentionConfig, run_retention
from tests.fixtures.traffic import Traffic

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
OLD = int(time.time() * 1000) - 86_400_000  # a day ago: past the topic's retention.ms
TOPIC_CONFIG = {"segment.bytes": "4096", "retention.ms": "3600000"}


def _produce(bootstrap: str, topic: str, start: int, n: int, ts: int | None) -> dict[int, bytes]:
    acked: dict[int, bytes] = {}
    errors: list[Any] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            acked[msg.offset()] = msg.value()

    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})
    for i in range(start, start + n):
        kwargs: dict[str, Any] = {} if ts is None else {"timestamp": ts + i}
        p.produce(topic, value=f"v{i}:".encode() * 20, on_delivery=on_delivery, **kwargs)
        if i % 10 == 9:
            p.flush(30)
    assert p.flush(30) == 0
    assert not errors, errors
    return acked


def _watermarks(bootstrap: str, topic: str) -> tuple[int, int]:
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "wm"})
    try:
        low, high = c.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=30)
        return int(low), int(high)
    finally:
        c.close()


def _read_all(bootstrap: str, topic: str, start: int, end: int) -> dict[int, bytes]:
    c = ck.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "check", "enable.auto.commit": False}
    )
    got: dict[int, bytes] = {}
    try:
        c.assign([ck.TopicPartition(topic, 0, start)])
        deadline = time.monotonic() + 60
        while len(got) < end - start and time.monotonic() < deadline:
            for m in c.consume(500, timeout=0.5):
                assert not m.error(), m.error()
                got[m.offset()] = m.value()
    finally:
        c.close()
    return got


def _configs(tmp_path: Path, log_dir: Path) -> tuple[IngestConfig, RetentionConfig]:
    lake = tmp_path / "lake"
    props = tmp_path / "broker.properties"
    props.write_text("log.retention.hours=168\n", encoding="utf-8")
    ingest = IngestConfig(log_dirs=(str(log_dir),), lake=str(lake), progress_interval_s=0)
    retention = RetentionConfig(log_dirs=(str(log_dir),), lake=str(lake), broker_config=str(props))
    return ingest, retention


def _topic(bootstrap: str) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    name = f"ret-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    fut = admin.create_topics([NewTopic(name, 1, 1, config=TOPIC_CONFIG)])
    fut[name].result(timeout=30)
    return name


def test_online_retention_lake_aware_then_forced(
    spark: SparkSession, tmp_path: Path, broker_factory: Any
) -> None:
    broker = broker_factory(
        **{
            "log.retention.check.interval.ms": "3600000",  # the job, not the broker, deletes
            "replica.high.watermark.checkpoint.interval.ms": "200",
            "log.flush.start.offset.checkpoint.interval.ms": "200",
            "log.segment.delete.delay.ms": "1000",
        }
    )
    topic = _topic(broker.bootstrap)
    ingest_cfg, cfg = _configs(tmp_path, broker.log_dir)
    acked = _produce(broker.bootstrap, topic, 0, 300, OLD)
    time.sleep(0.6)  # high watermark checkpoint
    ingested = run_ingest(spark, ingest_cfg, log=lambda _m: None)
    progress = ingested.progress[f"loglake-ingest/{topic}/0"]
    assert progress == 300
    acked |= _produce(broker.bootstrap, topic, 300, 300, OLD)  # old too, but not in the lake
    time.sleep(0.6)
    part = broker.log_dir / f"{topic}-0"
    segments_before = sorted(part.glob("*.log"))
    assert len(segments_before) > 10

    with Traffic(broker.bootstrap, topic) as bg:
        time.sleep(1.0)
        first = run_retention(spark, cfg, bootstrap=broker.bootstrap)
        low, _ = _watermarks(broker.bootstrap, topic)
        deadline = time.monotonic() + 30  # until the consumer got past the new log start
        while time.monotonic() < deadline and not any(o >= low for o in bg.consumed[0]):
            time.sleep(0.1)
    assert not bg.errors, bg.errors[:5]
    assert first.mode == "online" and not first.errors
    assert first.deleted_segments > 0 and first.held_segments > 0
    assert first.by_rule["retention.ms"] == first.deleted_segments
    new_start = first.log_starts[f"{topic}/0"]
    assert low == new_start <= progress  # nothing beyond the lake went
    bases = [int(p.name.split(".")[0]) for p in segments_before]
    assert new_start in bases
    # the consumer was reset to the new log start and kept consuming, past it
    seen = bg.consumed[0]
    assert seen[0] == 0
    jumps = [(a, b) for a, b in itertools.pairwise(seen) if b != a + 1]
    assert len(jumps) == 1 and jumps[0][0] < new_start - 1 and jumps[0][1] == new_start, jumps
    time.sleep(1.5)  # file.delete.delay.ms: the .deleted files are gone
    assert not list(part.glob("*.deleted"))
    assert min(int(p.name.split(".")[0]) for p in part.glob("*.log")) == new_start

    forced = run_retention(spark, cfg, bootstrap=broker.bootstrap, force=True)
    assert forced.deleted_segments > 0 and forced.held_segments == 0 and not forced.errors
    forced_start = forced.log_starts[f"{topic}/0"]
    assert forced_start > progress
    assert _watermarks(broker.bootstrap, topic)[0] == forced_start

    acked |= {o: v for (_, o), v in bg.acked.items()}  # the one partition
    _, high = _watermarks(broker.bootstrap, topic)
    kept = _read_all(broker.bootstrap, topic, forced_start, high)
    assert kept == {o: v for o, v in acked.items() if o >= forced_start}

    time.sleep(0.6)
    after = run_ingest(spark, ingest_cfg, log=lambda _m: None)
    assert [(g.topic, g.from_offset, g.to_offset) for g in after.gaps] == [
        (topic, progress, forced_start)
    ]
    log_rows = pl.read_delta(str(Path(cfg.lake) / RETENTION_LOG_TABLE)).sort("segment_base_offset")
    assert log_rows.height == first.deleted_segments + forced.deleted_segments
    assert log_rows["end_offset"].max() == forced_start
    assert (log_rows["forced"] == (log_rows["end_offset"] > progress)).all()
    assert log_rows["forced"].sum() == forced.deleted_segments  # all beyond the lake
    assert set(log_rows["rule"]) == {"retention.ms"}


def test_offline_under_the_lock_and_cli_dry_run(
    spark: SparkSession, tmp_path: Path, broker_factory: Any
) -> None:
    broker = broker_factory(**{"log.retention.check.interval.ms": "3600000"})
    topic = _topic(broker.bootstrap)
    _, cfg = _configs(tmp_path, broker.log_dir)
    acked = _produce(broker.bootstrap, topic, 0, 200, OLD)
    with pytest.raises(LoglakeError, match="broker is running"):
        run_retention(spark, cfg, force=True)  # offline while the broker holds .lock

    assert broker.stop() == 0
    toml = tmp_path / "pipeline.toml"
    toml.write_text(
        f'[paths]\nlog_dirs = ["{broker.log_dir}"]\nlake = "{cfg.lake}"\n'
        f'[spark]\nmaster = "local[2]"\n[retention]\nbroker_config = "{cfg.broker_config}"\n',
        encoding="utf-8",
    )
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    dry = subprocess.run(
        [sys.executable, "jobs/retention.py", "--config", str(toml), "--dry-run", "--force"],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr[-3000:]
    summary = json.loads(dry.stdout.strip().splitlines()[-1])
    assert summary["mode"] == "dry-run" and summary["deleted_segments"] == 0
    table = [line for line in dry.stdout.splitlines() if line.startswith(topic)]
    assert len(table) == summary["planned_segments"] > 0
    assert all(line.split()[-2:] == ["retention.ms", "forced"] for line in table)
    part = broker.log_dir / f"{topic}-0"
    before = sorted(p.name for p in part.glob("*.log"))

    offline = run_retention(spark, cfg, force=True)
    assert offline.mode == "offline" and not offline.errors
    assert offline.deleted_segments == summary["planned_segments"]
    start = offline.log_starts[f"{topic}/0"]
    after = sorted(p.name for p in part.glob("*.log"))
    assert len(after) == len(before) - offline.deleted_segments
    assert not list(part.glob("*.deleted"))
    checkpoint = (broker.log_dir / "log-start-offset-checkpoint").read_text()
    assert f"{topic} 0 {start}" in checkpoint

    broker.start()  # the broker agrees: new log start, everything above it intact
    assert _watermarks(broker.bootstrap, topic) == (start, 200)
    assert _read_all(broker.bootstrap, topic, start, 200) == {
        o: v for o, v in acked.items() if o >= start
    }


def test_broker_killed_after_the_job_recovers_the_new_log_start(
    spark: SparkSession, tmp_path: Path, broker_factory: Any
) -> None:
    """SIGKILL right after DeleteRecords: the segments are renamed .deleted but not removed
    (file.delete.delay.ms), no clean shutdown. The restarted broker recovers: the log starts at
    the job's new log start, the .deleted files are gone, everything above is served."""
    broker = broker_factory(
        **{
            "log.retention.check.interval.ms": "3600000",
            "replica.high.watermark.checkpoint.interval.ms": "200",
            "log.flush.start.offset.checkpoint.interval.ms": "3600000",
            "log.segment.delete.delay.ms": "3600000",
        }
    )
    topic = _topic(broker.bootstrap)
    _, cfg = _configs(tmp_path, broker.log_dir)
    acked = _produce(broker.bootstrap, topic, 0, 300, OLD)
    time.sleep(0.6)
    summary = run_retention(spark, cfg, bootstrap=broker.bootstrap, force=True)
    start = summary.log_starts[f"{topic}/0"]
    assert start > 0 and summary.deleted_segments > 0
    part = broker.log_dir / f"{topic}-0"
    assert len(list(part.glob("*.log.deleted"))) == summary.deleted_segments
    broker.kill()
    broker.start()
    assert not list(part.glob("*.deleted"))
    assert _watermarks(broker.bootstrap, topic) == (start, 300)
    assert _read_all(broker.bootstrap, topic, start, 300) == {
        o: v for o, v in acked.items() if o >= start
    }
