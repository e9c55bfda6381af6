"""SIGKILL the broker while an acks=all idempotent producer runs: after a restart every
acknowledged record is there exactly once, the segments are valid (CRC, indexes: checked by
``loglake dump-log --index-sanity-check``), the producer state was rebuilt from the log (a
retried batch is not appended twice) and consumers continue. Also: SIGTERM is a clean
shutdown (exit 0, clean-shutdown marker, checkpoints)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import confluent_kafka as ck
import pytest

from tests.fixtures.broker import ROOT
from tests.integration.broker.clients import new_topic, read_log

pytestmark = pytest.mark.integration


def _dump_log_sanity(files: list[str]) -> list[dict]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "logstore.cli",
            "dump-log",
            "--index-sanity-check",
            "--json",
            "--files",
            *files,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    assert out.returncode == 0, (out.returncode, out.stderr, lines[:5])
    return lines


def test_sigkill_during_acks_all_producer_loses_no_acknowledged_record(broker_factory):
    b = broker_factory(**{"log.segment.bytes": "65536", "log.index.interval.bytes": "512"})
    topic = new_topic(b.bootstrap, partitions=2, prefix="crash")
    acked: dict[tuple[int, bytes], int] = {}
    errors: list[str] = []
    stop = threading.Event()

    def produce() -> None:
        p = ck.Producer(
            {
                "bootstrap.servers": b.bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "compression.type": "lz4",
                "linger.ms": 2,
                "message.timeout.ms": 60000,
                "retry.backoff.ms": 50,
                "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": 200,
            }
        )

        def cb(err, msg) -> None:
            if err is None:
                acked[(msg.partition(), msg.value())] = msg.offset()
            else:
                errors.append(str(err))

        i = 0
        while not stop.is_set():
            try:
                p.produce(
                    topic, key=b"k%d" % i, value=b"value-%08d" % i, partition=i % 2, on_delivery=cb
                )
                i += 1
            except BufferError:
                p.poll(0.05)
            if i % 200 == 0:
                p.poll(0)
        assert p.flush(90) == 0

    t = threading.Thread(target=produce)
    t.start()
    deadline = time.monotonic() + 30
    while len(acked) < 3000 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(acked) >= 3000, "producer made no progress"
    b.kill()
    acked_at_kill = dict(acked)
    time.sleep(0.5)
    b.start()
    # keep producing a little after the restart, through the same idempotent producer
    time.sleep(2)
    stop.set()
    t.join(timeout=120)
    assert not t.is_alive()
    assert not errors, errors[:5]
    assert len(acked) > len(acked_at_kill)

    b.stop()
    files: list[str] = []
    for p in (0, 1):
        records, _codecs = read_log(b.log_dir, topic, p)  # CRC-checked decode of every batch
        offsets = [r.offset for r in records]
        assert offsets == list(range(len(offsets))), "offsets must be dense and ordered"
        values = [r.value for r in records]
        assert len(values) == len(set(values)), "a retried batch was appended twice"
        by_value = {r.value: r.offset for r in records}
        for (part, value), offset in acked.items():
            if part == p:
                assert by_value.get(value) == offset, (p, value, offset)
        files += [
            str(f)
            for f in sorted((b.log_dir / f"{topic}-{p}").iterdir())
            if f.suffix in (".log", ".index", ".timeindex")
        ]
    assert len([f for f in files if f.endswith(".log")]) > 2  # several segments were rolled
    checks = _dump_log_sanity(files)
    assert not [c for c in checks if "error" in c]
    assert sum(1 for c in checks if c.get("sanity_check") == "passed") == len(
        [f for f in files if not f.endswith(".log")]
    )

    # consumers continue from where they were: a fresh start serves everything
    b.start()
    c = ck.Consumer({"bootstrap.servers": b.bootstrap, "group.id": "crash-reader"})
    try:
        total = 0
        c.assign([ck.TopicPartition(topic, p, 0) for p in (0, 1)])
        deadline = time.monotonic() + 30
        while total < len(acked) and time.monotonic() < deadline:
            for m in c.consume(1000, timeout=0.5):
                assert not m.error(), m.error()
                total += 1
        assert total == len(acked)
    finally:
        c.close()


def test_sigterm_is_a_clean_shutdown(broker_factory):
    b = broker_factory()
    topic = new_topic(b.bootstrap, partitions=1, prefix="term")
    p = ck.Producer({"bootstrap.servers": b.bootstrap, "acks": "all"})
    for i in range(100):
        p.produce(topic, value=b"%d" % i)
    assert p.flush(30) == 0
    assert b.stop() == 0
    assert (b.log_dir / ".kafka_cleanshutdown").exists()
    hw = (b.log_dir / "replication-offset-checkpoint").read_text().splitlines()
    assert f"{topic} 0 100" in hw
    assert "shut down cleanly" in b.log_text()
    # a clean restart keeps serving the same data
    b.start()
    low, high = ck.Consumer(
        {"bootstrap.servers": b.bootstrap, "group.id": "x"}
    ).get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=30)
    assert (low, high) == (0, 100)
