"""Real JavaScript clients against the broker: @platformatic/kafka 1.35 and kafkajs 2.2.

@platformatic/kafka is the client that found the InitProducerId bug: its idempotent producer
sends ``producer_id=0, producer_epoch=0`` (not -1/-1), and its consumer fetches with topic
ids (Fetch v13+, KIP-516). Each test runs one node process
(``tests/clients/js/produce_consume.mjs``): two idempotent producers, one after the other,
then a consumer from the earliest offset. The clients are pinned in
``tests/clients/js/package-lock.json`` and installed by ``tools/bootstrap.sh`` (``npm ci``).

kafkajs also runs against the security listeners (issue 23's client matrix): SCRAM-SHA-512
over TLS (the user made with confluent-kafka's AdminClient, KIP-554), PLAIN over TLS (a user
of the listener's JAAS config) and mTLS (the client certificate from the test CA), each
producing and consuming byte for byte; a wrong password is refused.
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
from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism
from confluent_kafka.admin import UserScramCredentialUpsertion as Upsert

from logstore.protocol.batch import iter_batches
from tests.fixtures.broker import BrokerProcess
from tests.fixtures.tls import make_pki, secure_listeners
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


def _run(
    client: str,
    bootstrap: str,
    topic: str,
    producers: list[list[dict[str, Any]]],
    tmp: Path,
    *,
    security: dict[str, Any] | None = None,
):
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
                "security": security,
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


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory, pki):
    """A broker with SASL_SSL (PLAIN, SCRAM-SHA-512) and SSL (mTLS: client certificates
    required) listeners beside PLAINTEXT; user ``alice`` has a SCRAM-SHA-512 credential."""
    b = BrokerProcess(
        tmp_path_factory.mktemp("js-secure"),
        extra_listeners=("SASL_SSL", "SSL"),
        **secure_listeners(pki, plain_users={"carol": "carol-secret"}),
    )
    b.start()
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)
        for fut in admin.alter_user_scram_credentials(
            [Upsert("alice", info, b"alice-secret")]
        ).values():
            fut.result(30)
        yield b
    finally:
        assert b.stop() == 0, b.log_tail()


@pytest.mark.parametrize("how", ["scram-sha-512", "plain", "mtls"])
def test_kafkajs_over_tls_with_sasl_and_mtls(secure_broker, pki, tmp_path, how):
    b = secure_broker
    security: dict[str, Any] = {"ca": str(pki.ca)}
    if how == "mtls":
        listener = "SSL"
        security |= {"cert": str(pki.client_cert), "key": str(pki.client_key)}
    else:
        listener = "SASL_SSL"
        user, password = ("alice", "alice-secret") if how != "plain" else ("carol", "carol-secret")
        security["sasl"] = {"mechanism": how, "username": user, "password": password}
    topic = new_topic(b.bootstrap, partitions=1, prefix=f"js-{how}")
    rng = random.Random(f"js-{how}")
    producers = [_records(rng, 10, tag, null_headers=False) for tag in ("a", "b")]
    out = _run(
        "kafkajs", f"127.0.0.1:{b.ports[listener]}", topic, producers, tmp_path, security=security
    )
    _check(out, producers, b, topic)


def test_kafkajs_wrong_password_is_refused(secure_broker, pki, tmp_path):
    b = secure_broker
    topic = new_topic(b.bootstrap, partitions=1, prefix="js-bad")
    security = {
        "ca": str(pki.ca),
        "sasl": {"mechanism": "scram-sha-512", "username": "alice", "password": "wrong"},
    }
    with pytest.raises(AssertionError, match="node exited 1") as info:
        _run(
            "kafkajs", f"127.0.0.1:{b.ports['SASL_SSL']}", topic, [[]], tmp_path, security=security
        )
    assert "KafkaJSSASLAuthenticationError" in str(info.value)
    assert _log_end(b.bootstrap, topic) == 0
