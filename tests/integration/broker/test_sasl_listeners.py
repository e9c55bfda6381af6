"""SASL PLAIN listeners with real clients (over TLS and in the clear), and what Kafka refuses:
a wrong password, an unknown user, an oversized token, requests before authentication, an
expired session — each closing only that connection while good clients are served."""

from __future__ import annotations

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v9.request import MetadataRequest
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest as SaslHandshakeV0
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

from tests.fixtures.broker import api_versions_probe, wait_for
from tests.fixtures.tls import make_pki
from tests.integration.broker.clients import new_topic
from tests.integration.broker.rawclient import RawClient

pytestmark = pytest.mark.integration

METADATA = MetadataRequest(
    topics=None,
    allow_auto_topic_creation=False,
    include_cluster_authorized_operations=False,
    include_topic_authorized_operations=False,
)

JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required"
    ' username="admin" password="admin-secret"'
    ' user_admin="admin-secret" user_alice="alice-secret";'
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def sasl_broker(broker_factory, pki):
    return broker_factory(
        extra_listeners=("SASL_SSL", "SASL_PLAINTEXT"),
        **{
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(pki.server),
            "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_ssl.plain.sasl.jaas.config": JAAS,
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
            "connection.failed.authentication.delay.ms": "50",
        },
    )


def _ck_conf(b, pki, *, user="alice", password="alice-secret") -> dict[str, object]:
    return {
        "bootstrap.servers": f"127.0.0.1:{b.ports['SASL_SSL']}",
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(pki.ca),
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": password,
    }


def test_confluent_kafka_and_kafka_python_plain_over_tls(sasl_broker, pki):
    b = sasl_broker
    topic = new_topic(b.bootstrap, partitions=1, prefix="sasl")
    conf = _ck_conf(b, pki)
    md = AdminClient(conf).list_topics(timeout=30)
    assert [br.port for br in md.brokers.values()] == [b.ports["SASL_SSL"]]
    p = ck.Producer({**conf, "acks": "all", "compression.type": "lz4"})
    values = [f"ck-{i}".encode() * 20 for i in range(500)]
    for v in values:
        p.produce(topic, v, partition=0)
    assert p.flush(30) == 0
    kp = {
        "bootstrap_servers": f"127.0.0.1:{b.ports['SASL_SSL']}",
        "security_protocol": "SASL_SSL",
        "ssl_cafile": str(pki.ca),
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "admin",
        "sasl_plain_password": "admin-secret",
    }
    producer = KafkaProducer(acks="all", **kp)
    more = [f"kp-{i}".encode() for i in range(300)]
    for v in more:
        producer.send(topic, v, partition=0)
    producer.flush(30)
    producer.close()
    c = KafkaConsumer(consumer_timeout_ms=10_000, **kp)
    c.assign([TopicPartition(topic, 0)])
    c.seek(TopicPartition(topic, 0), 0)
    got = []
    for m in c:
        got.append(m.value)
        if len(got) == len(values) + len(more):
            break
    c.close()
    assert got == values + more


@pytest.mark.parametrize(("user", "password"), [("alice", "wrong"), ("nobody", "alice-secret")])
def test_wrong_password_or_unknown_user_refused_by_a_real_client(sasl_broker, pki, user, password):
    b = sasl_broker
    errors: list[ck.KafkaError] = []
    conf = {**_ck_conf(b, pki, user=user, password=password), "error_cb": errors.append}
    producer = ck.Producer(conf)
    for _ in range(150):  # 30 s at most
        producer.poll(0.2)
        if errors:
            break
    assert errors[0].code() == ck.KafkaError._AUTHENTICATION, errors
    assert "Invalid username or password" in errors[0].str()
    del producer
    # the good user of the same listener is served meanwhile
    assert AdminClient(_ck_conf(b, pki)).list_topics(timeout=30).brokers


def _handshake(raw: RawClient) -> None:
    resp = raw.call(SaslHandshakeRequest(mechanism="PLAIN"))
    assert resp.error_code == ErrorCode.none and resp.mechanisms == ("PLAIN",)


@pytest.mark.parametrize(
    "token",
    [
        b"\x00alice\x00wrong",
        b"\x00nobody\x00alice-secret",
        b"bob\x00alice\x00alice-secret",  # authorizing as someone else
        b"\x00alice",  # malformed
        b"\x00alice\x00" + b"x" * 400_000,  # a long wrong password
    ],
)
def test_failed_authentication_answers_then_closes(sasl_broker, token):
    b = sasl_broker
    with RawClient(f"127.0.0.1:{b.ports['SASL_PLAINTEXT']}") as raw:
        _handshake(raw)
        resp = raw.call(SaslAuthenticateRequest(auth_bytes=token))
        assert resp.error_code == ErrorCode.sasl_authentication_failed
        assert "Authentication failed" in (resp.error_message or "")
        assert raw.is_closed_by_peer()
    with RawClient(f"127.0.0.1:{b.ports['SASL_PLAINTEXT']}") as raw:
        _handshake(raw)
        ok = raw.call(SaslAuthenticateRequest(auth_bytes=b"\x00alice\x00alice-secret"))
        assert ok.error_code == ErrorCode.none
        assert raw.call(METADATA).brokers


def test_oversized_frame_before_authentication_closes_without_reading_it(sasl_broker):
    b = sasl_broker
    with RawClient(f"127.0.0.1:{b.ports['SASL_PLAINTEXT']}") as raw:
        _handshake(raw)
        # a size prefix above sasl.server.max.receive.size: closed before the body is read
        raw.sock.sendall((600_000).to_bytes(4, "big"))
        assert raw.is_closed_by_peer()
    assert "(sasl.server.max.receive.size)" in b.log_text()
    with RawClient(f"127.0.0.1:{b.ports['SASL_PLAINTEXT']}") as raw:
        _handshake(raw)
        ok = raw.call(SaslAuthenticateRequest(auth_bytes=b"\x00alice\x00alice-secret"))
        assert ok.error_code == ErrorCode.none
        assert raw.call(METADATA).brokers  # authenticated: served


def test_requests_before_authentication_close_the_connection(sasl_broker):
    b = sasl_broker
    with RawClient(f"127.0.0.1:{b.ports['SASL_PLAINTEXT']}") as raw:
        # ApiVersions is allowed before authenticating, Metadata is not
        versions = raw.call(
            ApiVersionsRequest(client_software_name="t", client_software_version="1")
        )
        assert versions.error_code == ErrorCode.none
        raw.send_frame(raw.request_bytes(METADATA))
        assert raw.is_closed_by_peer()
    with RawClient(f"127.0.0.1:{b.ports['SASL_PLAINTEXT']}") as raw:
        raw.send_frame(raw.request_bytes(SaslAuthenticateRequest(auth_bytes=b"\x00a\x00b")))
        assert raw.is_closed_by_peer()  # SaslAuthenticate before SaslHandshake
    with RawClient(f"127.0.0.1:{b.ports['SASL_PLAINTEXT']}") as raw:
        resp = raw.call(SaslHandshakeRequest(mechanism="SCRAM-SHA-512"))
        assert resp.error_code == ErrorCode.unsupported_sasl_mechanism
        assert resp.mechanisms == ("PLAIN",)
        assert raw.is_closed_by_peer()
    assert api_versions_probe("127.0.0.1", b.port)
    assert "before authentication" in b.log_text()


def test_session_lifetime_and_expiry(broker_factory):
    b = broker_factory(
        extra_listeners=("SASL_PLAINTEXT",),
        **{
            "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
            "connections.max.reauth.ms": "1500",
        },
    )
    with RawClient(f"127.0.0.1:{b.ports['SASL_PLAINTEXT']}") as raw:
        _handshake(raw)
        ok = raw.call(SaslAuthenticateRequest(auth_bytes=b"\x00alice\x00alice-secret"))
        assert ok.error_code == ErrorCode.none
        assert ok.session_lifetime.total_seconds() == 1.5
        metadata = METADATA
        assert raw.call(metadata).brokers
        # re-authentication (KIP-368) renews the session on the same connection
        _handshake(raw)
        again = raw.call(SaslAuthenticateRequest(auth_bytes=b"\x00alice\x00alice-secret"))
        assert again.error_code == ErrorCode.none
        wait_for(lambda: "expired" in _after_expiry(raw, metadata), 30)
        assert raw.is_closed_by_peer()


def _after_expiry(raw: RawClient, metadata: MetadataRequest) -> str:
    """'expired' once a request on the expired session is refused by a close."""
    try:
        raw.call(metadata)
    except (ConnectionError, OSError):
        return "expired"
    return "served"


def test_sasl_handshake_v0_then_bare_tokens(sasl_broker):
    """Before KIP-152: after SaslHandshake v0 the token is a bare frame, answered bare."""
    b = sasl_broker
    with RawClient(f"127.0.0.1:{b.ports['SASL_PLAINTEXT']}") as raw:
        assert raw.call(SaslHandshakeV0(mechanism="PLAIN")).error_code == ErrorCode.none
        raw.send_frame(b"\x00alice\x00alice-secret")
        assert raw.recv_frame() == b""  # PLAIN's (empty) server token, no Kafka header
        assert raw.call(METADATA).brokers
    with RawClient(f"127.0.0.1:{b.ports['SASL_PLAINTEXT']}") as raw:
        assert raw.call(SaslHandshakeV0(mechanism="PLAIN")).error_code == ErrorCode.none
        raw.send_frame(b"\x00alice\x00wrong")
        assert raw.is_closed_by_peer()  # v0 has no error answer: Kafka closes
