"""Real JavaScript clients against the broker: @platformatic/kafka 1.35 and kafkajs 2.2.

@platformatic/kafka is the client that found the InitProducerId bug: its idempotent producer
sends ``producer_id=0, producer_epoch=0`` (not -1/-1), and its consumer fetches with topic
ids (Fetch v13+, KIP-516). Each test runs one node process
(``tests/clients/js/produce_consume.mjs``): two idempotent producers, one after the other,
then a consumer from the earliest offset. The clients are pinned in
``tests/clients/js/package-lock.json`` and installed by ``tools/bootstrap.sh`` (``npm ci``).
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest

from logstore.protocol.batch import iter_batches
from tests.integration.broker.clients import new_topic, read_log

pytestmark = pytest.mark.integration

JS_DIR = Path(__file__).resolve().parents[2] / "clients" / "js"


def _records(rng: random.Random, n: int, tag: str, *, null_headers: bool) -> list[dict[str, Any]]:
    """Varied records as the script takes them (hex): null and empty keys, empty and binary
    values, 0-2 headers (null values where the client can send them)."""
    out = []
    for i in range(n):
        key = [None, b"", f"{tag}-k{i}".encode(), rng.randbytes(8)][i % 4]
        value = b"" if i == 3 else f"{tag}-{i}:".encode() + rng.randbytes(rng.randint(0, 300))
        headers: list[tuple[str, bytes | None]] = [
            (f"h{j}", None if null_headers and j == 1 else rng.randbytes(j + 1))
            for j in range(i % 3)
        ]
        out.append(
            {
                "key": None if key is None else key.hex(),
                "value": value.hex(),
                "headers": [[k, None if v is None else v.hex()] for k, v in headers],
            }
        )
    return out


def _run(client: str, bootstrap: str, topic: str, producers: list[list[dict[str, Any]]], tmp: Path):
    node = shutil.which("node")
    assert node is not None, "node (20+) is required for the JavaScript client tests"
    assert (JS_DIR / "node_modules" / "@platformatic" / "kafka").is_dir(), (
        f"the JavaScript clients are not installed in {JS_DIR}: run tools/bootstrap.sh"
    )
    expect = sum(len(p) for p in producers)
    spec = tmp / f"{client}.json"
    spec.write_text(
        json.dumps(
            {
                "client": client,
                "bootstrap": bootstrap,
                "topic": topic,
                "partition": 0,
                "expect": expect,
                "timeoutMs": 60_000,
                "producers": producers,
            }
        )
    )
    proc = subprocess.run(
        [node, "produce_consume.mjs", str(spec)],
        check=False,
        cwd=JS_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"node exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _log_end(bootstrap: str, topic: str) -> int:
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "js-log-end"})
    try:
        return int(c.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=30)[1])
    finally:
        c.close()


def _producer_ids(log_dir: Path, topic: str) -> list[int]:
    ids = []
    for seg in sorted((log_dir / f"{topic}-0").glob("*.log")):
        ids += [h.producer_id for _pos, h in iter_batches(seg.read_bytes())]
    return ids


def _check(out: dict[str, Any], producers: list[list[dict[str, Any]]], broker: Any, topic: str):
    sizes = [len(p) for p in producers]
    # every send acknowledged, one after the other
    assert out["acked"] == [[sum(sizes[:i]), n] for i, n in enumerate(sizes)]
    assert _log_end(broker.bootstrap, topic) == sum(sizes)
    # every acknowledged record comes back, byte for byte, in order
    sent = [r for p in producers for r in p]
    assert [c["offset"] for c in out["consumed"]] == list(range(len(sent)))
    for got, want in zip(out["consumed"], sent, strict=True):
        assert got["value"] == want["value"]
        assert got["key"] == want["key"]
        assert got["headers"] == want["headers"]
    # the independent segment reader agrees, and each producer had its own producer id
    on_disk, _codecs = read_log(broker.log_dir, topic, 0)
    assert [r.value.hex() if r.value is not None else None for r in on_disk] == [
        r["value"] for r in sent
    ]
    ids = set(_producer_ids(Path(broker.log_dir), topic))
    assert len(ids) == len(producers) and min(ids) > 0


def test_platformatic_idempotent_producers_and_topic_id_consumer(broker, tmp_path):
    topic = new_topic(broker.bootstrap, partitions=1, prefix="js-plt")
    rng = random.Random(20)
    producers = [_records(rng, 10, tag, null_headers=True) for tag in ("a", "b")]
    out = _run("platformatic", broker.bootstrap, topic, producers, tmp_path)
    # the consumer chose Fetch with topic ids (the client implements v12-v17)
    assert out["fetchVersion"] == 17
    _check(out, producers, broker, topic)


def test_kafkajs_idempotent_producers_and_consumer(broker, tmp_path):
    topic = new_topic(broker.bootstrap, partitions=1, prefix="js-kjs")
    rng = random.Random(21)
    # kafkajs cannot send a null header value
    producers = [_records(rng, 10, tag, null_headers=False) for tag in ("a", "b")]
    out = _run("kafkajs", broker.bootstrap, topic, producers, tmp_path)
    _check(out, producers, broker, topic)
