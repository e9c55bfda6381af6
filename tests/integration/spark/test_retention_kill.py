"""The online retention job SIGKILLed between two DeleteRecords requests, then run again.

``spark-submit jobs/retention.py --bootstrap-server`` against the real broker, two partitions
per DeleteRecords request (``[retention] delete_records_chunk = 2``) over six partitions,
killed by ``LOGLAKE_FAILPOINT=retention.after_delete_chunk`` once the broker answered the
first request, while a producer and a consumer keep running on every partition. Then:

- the broker kept serving (every produce acknowledged, the consumer without errors);
- the log start moved for the first request's partitions only (``ListOffsets(earliest)`` and
  the live segment files agree), and the job's journal of intended lineage is on disk;
- a second run settles the journal and trims the rest: every partition's log start is its
  plan's, ``ListOffsets(earliest)`` agrees, and ``retention_log`` has exactly one row per
  removed segment across the two runs (the first run's removals under its own ``run_id``);
- every record acknowledged at or above the new log start is still served, byte for byte;
- a broker SIGKILLed after all this restarts with the same log starts, no ``.deleted`` files.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import polars as pl
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from pipelines.retention.job import FAILPOINT_AFTER_CHUNK, RETENTION_LOG_TABLE
from pipelines.retention.journal import PENDING_DIR
from tests.fixtures.broker import wait_for
from tests.fixtures.traffic import Traffic

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
OLD = int(time.time() * 1000) - 86_400_000  # a day ago: past retention.ms
PARTITIONS = 6
CHUNK = 2
TOPIC_CONFIG = {"segment.bytes": "4096", "retention.ms": "3600000"}


def _spark_submit(
    toml: Path, bootstrap: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    site = Path(sys.executable).parent.parent / "lib" / "python3.11" / "site-packages"
    cmd = [
        str(site / "pyspark" / "bin" / "spark-submit"),
        "--master", "local[2]",
        "--conf", "spark.ui.enabled=false",
        str(ROOT / "jobs" / "retention.py"),
        "--config", str(toml), "--bootstrap-server", bootstrap, "--force",
    ]  # fmt: skip
    run_env = {
        **env,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.run(
        cmd, cwd=ROOT, env=run_env, capture_output=True, text=True, timeout=300,
        start_new_session=True, check=False,
    )  # fmt: skip


def _tail(stderr: str) -> str:
    return "\n".join(line for line in stderr.splitlines() if " INFO " not in line)[-3000:]


def _produce_old(bootstrap: str, topic: str) -> dict[tuple[int, int], bytes]:
    acked: dict[tuple[int, int], bytes] = {}
    errors: list[Any] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            acked[(msg.partition(), msg.offset())] = msg.value()

    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})
    for part in range(PARTITIONS):
        for i in range(150):
            p.produce(
                topic, value=f"old{part}.{i}:".encode() * 12, partition=part,
                timestamp=OLD + i, on_delivery=on_delivery,
            )  # fmt: skip
            if i % 10 == 9:
                p.flush(30)
    assert p.flush(30) == 0
    assert not errors, errors
    return acked


def _earliest(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "wm"})
    try:
        return {
            p: tuple(c.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=30))
            for p in range(PARTITIONS)
        }
    finally:
        c.close()


def _bases(part_dir: Path) -> list[int]:
    return sorted(int(f.name.split(".")[0]) for f in part_dir.glob("*.log"))


def _read_all(bootstrap: str, topic: str, marks: dict[int, tuple[int, int]]) -> dict[Any, bytes]:
    c = ck.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "check", "enable.auto.commit": False}
    )
    got: dict[tuple[int, int], bytes] = {}
    want = sum(high - low for low, high in marks.values())
    try:
        c.assign([ck.TopicPartition(topic, p, low) for p, (low, _) in marks.items()])
        deadline = time.monotonic() + 60
        while len(got) < want and time.monotonic() < deadline:
            for m in c.consume(500, timeout=0.5):
                assert not m.error(), m.error()
                if m.offset() < marks[m.partition()][1]:
                    got[(m.partition(), m.offset())] = m.value()
    finally:
        c.close()
    return got


def test_online_job_killed_between_delete_records_chunks(
    tmp_path: Path, broker_factory: Any
) -> None:
    broker = broker_factory(
        **{
            "log.retention.check.interval.ms": "3600000",  # the job, not the broker, deletes
            "replica.high.watermark.checkpoint.interval.ms": "200",
            "log.flush.start.offset.checkpoint.interval.ms": "200",
            "log.segment.delete.delay.ms": "500",
        }
    )
    topic = f"kill-{os.getpid()}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1, config=TOPIC_CONFIG)])[topic].result(30)
    acked = _produce_old(broker.bootstrap, topic)
    time.sleep(0.6)  # high watermark checkpoint
    parts = {p: broker.log_dir / f"{topic}-{p}" for p in range(PARTITIONS)}
    original = {p: _bases(d) for p, d in parts.items()}
    assert all(len(b) >= 4 for b in original.values()), original

    lake = tmp_path / "lake"
    props = tmp_path / "broker.properties"
    props.write_text("log.retention.hours=168\n", encoding="utf-8")
    toml = tmp_path / "pipeline.toml"
    toml.write_text(
        f'[paths]\nlog_dirs = ["{broker.log_dir}"]\nlake = "{lake}"\n'
        f'[spark]\nmaster = "local[2]"\n'
        f'[retention]\nbroker_config = "{props}"\ndelete_records_chunk = {CHUNK}\n',
        encoding="utf-8",
    )
    with Traffic(
        broker.bootstrap, topic, partitions=PARTITIONS, group_id="kill-consumer",
        produce_interval_s=0.01, consume_batch=5,
    ) as traffic:  # fmt: skip
        time.sleep(1.0)
        killed = _spark_submit(
            toml, broker.bootstrap, {**os.environ, "LOGLAKE_FAILPOINT": FAILPOINT_AFTER_CHUNK}
        )
        assert killed.returncode == -signal.SIGKILL, _tail(killed.stderr + killed.stdout)

        # killed after the first request: its partitions trimmed, the others untouched
        marks = killed_marks = _earliest(broker.bootstrap, topic)
        first_chunk = set(range(CHUNK))  # requests go in (topic, partition) order
        for p in range(PARTITIONS):
            live = _bases(parts[p])
            if p in first_chunk:
                assert marks[p][0] > 0 and marks[p][0] == live[0], (p, marks[p], live)
            else:
                assert marks[p][0] == 0 and live[: len(original[p])] == original[p], p
        journals = list((lake / PENDING_DIR).glob("*.json"))
        assert len(journals) == 1
        killed_run = journals[0].stem
        intended = json.loads(journals[0].read_text())
        assert {r["partition"] for r in intended} == set(range(PARTITIONS))  # six to trim
        assert not (lake / RETENTION_LOG_TABLE).exists()  # died before its lineage
        # (spark-submit relays the Python driver's stderr to its stdout, losing the tail of it
        # when killed: the journal above says that it got to deleting)
        assert "retention summary" not in killed.stdout  # it died before finishing

        rerun = _spark_submit(toml, broker.bootstrap, dict(os.environ))
        assert rerun.returncode == 0, _tail(rerun.stderr + rerun.stdout)
        summary = json.loads(rerun.stdout.strip().splitlines()[-1])
        # the consumer runs on past the new log starts (bounded wait; asserted again below)
        starts = _earliest(broker.bootstrap, topic)
        wait_for(
            lambda: all(
                any(o >= starts[p][0] for o in list(traffic.consumed[p])) for p in range(PARTITIONS)
            ),
            seconds=30,
        )
    assert not traffic.errors, traffic.errors[:5]
    assert not summary["errors"]
    assert not list((lake / PENDING_DIR).glob("*.json"))  # settled

    marks = _earliest(broker.bootstrap, topic)
    removed: dict[int, list[int]] = {}
    for p in range(PARTITIONS):
        live = _bases(parts[p])
        planned = killed_marks[p][0] if p in first_chunk else summary["log_starts"][f"{topic}/{p}"]
        assert marks[p][0] == live[0] == planned, (p, marks[p], live[0], planned)
        assert marks[p][0] >= original[p][-1]  # every old segment went (forced)
        removed[p] = [b for b in original[p] if b < live[0]]
    first_removed = sum(len(removed[p]) for p in first_chunk)
    assert summary["settled_segments"] == first_removed > 0
    assert summary["deleted_segments"] == sum(len(r) for r in removed.values()) - first_removed

    rows = pl.read_delta(str(lake / RETENTION_LOG_TABLE))
    keys = list(zip(rows["partition"], rows["segment_base_offset"], strict=True))
    assert len(keys) == len(set(keys))  # no duplicate
    assert sorted(keys) == sorted((p, b) for p, bs in removed.items() for b in bs)  # none missing
    by_part = rows.group_by("partition").agg(pl.col("end_offset").max(), pl.col("run_id").unique())
    for r in by_part.iter_rows(named=True):
        assert r["end_offset"] == marks[r["partition"]][0]
        assert len(r["run_id"]) == 1  # one run removed each partition's segments
        assert (r["run_id"][0] == killed_run) == (r["partition"] in first_chunk), r

    # nothing acknowledged at or above the new log starts is lost
    acked |= traffic.acked
    assert _read_all(broker.bootstrap, topic, marks) == {
        (p, o): v for (p, o), v in acked.items() if o >= marks[p][0]
    }
    for p in range(PARTITIONS):  # the consumer was reset and went on past the new start
        assert any(o >= marks[p][0] for o in traffic.consumed[p]), p

    # a broker killed now recovers the same log dir
    broker.kill()
    broker.start()
    for d in parts.values():
        assert not list(d.glob("*.deleted"))
    assert _earliest(broker.bootstrap, topic) == marks
    assert _read_all(broker.bootstrap, topic, marks) == {
        (p, o): v for (p, o), v in acked.items() if o >= marks[p][0]
    }
