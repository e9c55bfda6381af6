"""TLS listeners with real clients: PLAINTEXT, SSL and an mTLS listener on separate ports of
one broker, each advertised to its own clients; bad TLS input refused while good clients are
served (certificates made by the test: tests/fixtures/tls.py)."""

from __future__ import annotations

import socket
import ssl
import struct

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from tests.fixtures.broker import api_versions_probe
from tests.fixtures.tls import make_pki
from tests.integration.broker.clients import new_topic

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def tls_broker(broker_factory, pki):
    return broker_factory(
        extra_listeners=("SSL", "MTLS"),
        **{
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,MTLS:SSL",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(pki.server),
            "listener.name.mtls.ssl.truststore.type": "PEM",
            "listener.name.mtls.ssl.truststore.location": str(pki.ca),
            "listener.name.mtls.ssl.client.auth": "required",
            # Kafka's rule syntax: alice is named, any other subject is refused
            "listener.name.mtls.ssl.principal.mapping.rules": (
                "RULE:^O=loglake tests,CN=(alice)$/$1/U"
            ),
            "socket.request.read.timeout.ms": "1500",
        },
    )


def _ck_conf(b, pki, listener: str, *, cert=None, key=None) -> dict[str, object]:
    conf: dict[str, object] = {
        "bootstrap.servers": f"127.0.0.1:{b.ports[listener]}",
        "security.protocol": "SSL",
        "ssl.ca.location": str(pki.ca),
    }
    if cert is not None:
        conf["ssl.certificate.location"] = str(cert)
        conf["ssl.key.location"] = str(key)
    return conf


def _ck_roundtrip(conf: dict[str, object], topic: str, values: list[bytes]) -> list[bytes]:
    p = ck.Producer({**conf, "acks": "all", "compression.type": "lz4", "linger.ms": 5})
    for v in values:
        p.produce(topic, v, partition=0)
    assert p.flush(30) == 0
    c = ck.Consumer(
        {
            **conf,
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.assign([ck.TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    try:
        empty = 0
        while len(got) < len(values) and empty < 150:  # 30 s without a record: give up
            batch = c.consume(1000, 0.2)
            empty = 0 if batch else empty + 1
            got.extend(m.value() for m in batch if m.error() is None)
    finally:
        c.close()
    return got


def test_confluent_kafka_over_ssl_and_mtls_each_listener_advertised(tls_broker, pki):
    b = tls_broker
    topic = new_topic(b.bootstrap, partitions=1, prefix="tls-ck")
    # Fetch responses bigger than the TLS chunk (256 KiB) go out in several bounded chunks.
    values = [bytes([i % 251]) * 1000 + i.to_bytes(4, "big") for i in range(3000)]
    for listener, extra in (
        ("SSL", {}),
        ("MTLS", {"cert": pki.client_cert, "key": pki.client_key}),
    ):
        conf = _ck_conf(b, pki, listener, **extra)
        md = AdminClient(conf).list_topics(timeout=30)
        # Kafka answers with the listener the client came through: the TLS port, not 9092's.
        assert [(br.host, br.port) for br in md.brokers.values()] == [
            ("127.0.0.1", b.ports[listener])
        ]
        sub = f"{topic}-{listener.lower()}"
        new = new_topic(b.bootstrap, partitions=1, prefix=sub)
        assert _ck_roundtrip(conf, new, values) == values
    md = AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(timeout=30)
    assert [br.port for br in md.brokers.values()] == [b.port]


def test_kafka_python_over_ssl_and_mtls(tls_broker, pki):
    b = tls_broker
    values = [i.to_bytes(4, "big") * 100 for i in range(2000)]
    for listener, extra in (
        ("SSL", {}),
        ("MTLS", {"ssl_certfile": str(pki.client_cert), "ssl_keyfile": str(pki.client_key)}),
    ):
        topic = new_topic(b.bootstrap, partitions=1, prefix=f"tls-kp-{listener.lower()}")
        common = {
            "bootstrap_servers": f"127.0.0.1:{b.ports[listener]}",
            "security_protocol": "SSL",
            "ssl_cafile": str(pki.ca),
            **extra,
        }
        p = KafkaProducer(acks="all", compression_type="lz4", **common)
        for v in values:
            p.send(topic, v, partition=0)
        p.flush(30)
        p.close()
        c = KafkaConsumer(consumer_timeout_ms=10_000, **common)
        c.assign([TopicPartition(topic, 0)])
        c.seek(TopicPartition(topic, 0), 0)
        got = []
        for m in c:
            got.append(m.value)
            if len(got) == len(values):
                break
        c.close()
        assert got == values


def _closed_by_peer(s: socket.socket) -> bool:
    """True when the broker closed (EOF or reset) rather than answered."""
    s.settimeout(20)
    try:
        data = s.recv(4096)
    except (ConnectionResetError, ssl.SSLError):
        return True
    if data and not data.startswith(b"\x15"):  # a TLS alert record is a refusal too
        return False
    while data:
        try:
            data = s.recv(4096)
        except (ConnectionResetError, ssl.SSLError):
            return True
    return True


def _tls_api_versions(port: int, ca, cert, key) -> bytes:
    """An ApiVersions v0 request over TLS; the response's size prefix. Raises when the
    broker refuses: with TLS 1.3 its verdict on the client certificate arrives after the
    client's handshake has returned, so it shows at the first read."""
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key))
    body = struct.pack(">hhih", 18, 0, 7, 1) + b"x"
    with (
        socket.create_connection(("127.0.0.1", port)) as raw,
        ctx.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        tls.settimeout(20)
        tls.sendall(struct.pack(">i", len(body)) + body)
        head = tls.recv(4)
        if len(head) < 4:
            raise ConnectionResetError("closed by the broker")
        return head


def test_bad_tls_input_refused_while_good_clients_served(tls_broker, pki):
    b = tls_broker
    # Plaintext Kafka bytes (ApiVersions v0) on a TLS port: the handshake fails, closed.
    body = struct.pack(">hhih", 18, 0, 7, 1) + b"x"
    with socket.create_connection(("127.0.0.1", b.ports["SSL"])) as raw:
        raw.sendall(struct.pack(">i", len(body)) + body)
        assert _closed_by_peer(raw)
    # A handshake that never starts: closed after socket.request.read.timeout.ms.
    idle = socket.create_connection(("127.0.0.1", b.ports["SSL"]))
    # A client certificate from another CA on the mTLS listener, or none at all: refused.
    mtls = b.ports["MTLS"]
    # A certificate of the right CA whose subject no ssl.principal.mapping.rules rule names
    # (CN=bob) is refused too.
    for cert, key in ((pki.rogue_cert, pki.rogue_key), (None, None), (pki.bob_cert, pki.bob_key)):
        with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
            _tls_api_versions(mtls, pki.ca, cert, key)
    # Meanwhile the good clients of every listener are served.
    assert api_versions_probe("127.0.0.1", b.port)
    head = _tls_api_versions(mtls, pki.ca, pki.client_cert, pki.client_key)
    assert struct.unpack(">i", head)[0] > 0
    assert _closed_by_peer(idle)
    idle.close()
    log = b.log_text()
    assert "TLS handshake failed on listener SSL" in log
    assert "TLS handshake not finished within 1500 ms" in log
    assert "no ssl.principal.mapping.rules rule applies to 'O=loglake tests,CN=bob'" in log
