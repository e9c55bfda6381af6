"""SCRAM-SHA-256/512: users made with confluent-kafka's AdminClient (KIP-554), durable across
a restart, logged in with by librdkafka and kafka-python over TLS; a wrong password, a bad
nonce and a bad proof refused while good clients are served; aiokafka with SCRAM and PLAIN."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac

import confluent_kafka as ck
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AkPartition
from aiokafka.helpers import create_ssl_context
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kio.schema.errors import ErrorCode
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

from tests.fixtures.tls import make_pki
from tests.integration.broker.clients import new_topic
from tests.integration.broker.rawclient import RawClient

pytestmark = pytest.mark.integration

SHA512 = ScramMechanism.SCRAM_SHA_512
SHA256 = ScramMechanism.SCRAM_SHA_256


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def scram_broker(broker_factory, pki):
    return broker_factory(
        extra_listeners=("SASL_SSL", "SASL_PLAINTEXT"),
        **{
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(pki.server),
            "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
            "connection.failed.authentication.delay.ms": "20",
        },
    )


def _alter(admin: AdminClient, alterations) -> dict[str, Exception | None]:
    out: dict[str, Exception | None] = {}
    for user, fut in admin.alter_user_scram_credentials(alterations).items():
        try:
            fut.result(30)
            out[user] = None
        except ck.KafkaException as exc:
            out[user] = exc
    return out


def _ck(b, pki, user: str, password: str, mechanism: str = "SCRAM-SHA-512") -> dict:
    return {
        "bootstrap.servers": f"127.0.0.1:{b.ports['SASL_SSL']}",
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(pki.ca),
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }


def _auth_error(conf: dict) -> str:
    errors: list[ck.KafkaError] = []
    producer = ck.Producer({**conf, "error_cb": errors.append})
    for _ in range(150):
        producer.poll(0.2)
        if errors:
            break
    del producer
    assert errors and errors[0].code() == ck.KafkaError._AUTHENTICATION, errors
    return str(errors[0].str())


def test_users_made_with_the_admin_client_log_in_and_survive_a_restart(scram_broker, pki):
    b = scram_broker
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    results = _alter(
        admin,
        [
            UserScramCredentialUpsertion("alice", ScramCredentialInfo(SHA512, 8192), b"alice-pw"),
            UserScramCredentialUpsertion("bob", ScramCredentialInfo(SHA256, 4096), b"bob-pw"),
            UserScramCredentialUpsertion("carol", ScramCredentialInfo(SHA512, 100), b"x"),
            UserScramCredentialDeletion("dave", SHA512),
        ],
    )
    assert results["alice"] is None and results["bob"] is None
    assert results["carol"].args[0].code() == ck.KafkaError.UNACCEPTABLE_CREDENTIAL
    assert results["dave"].args[0].code() == ck.KafkaError.RESOURCE_NOT_FOUND
    described = admin.describe_user_scram_credentials(["alice", "bob"])
    infos = {u: f.result(30).scram_credential_infos for u, f in described.items()}
    assert [(i.mechanism, i.iterations) for i in infos["alice"]] == [(SHA512, 8192)]
    assert [(i.mechanism, i.iterations) for i in infos["bob"]] == [(SHA256, 4096)]
    with pytest.raises(ck.KafkaException) as exc:
        admin.describe_user_scram_credentials(["nobody"])["nobody"].result(30)
    assert exc.value.args[0].code() == ck.KafkaError.RESOURCE_NOT_FOUND

    # Stored salted and iterated: neither the password nor the salted password is on disk.
    stored = (b.log_dir / "__scram_credentials.json").read_bytes()
    assert b"alice-pw" not in stored and b"stored_key" in stored
    b.stop()
    b.start()  # durable: the users log in after a restart

    topic = new_topic(b.bootstrap, partitions=1, prefix="scram")
    values = [f"v{i}".encode() * 50 for i in range(400)]
    p = ck.Producer({**_ck(b, pki, "alice", "alice-pw"), "acks": "all", "compression.type": "lz4"})
    for v in values:
        p.produce(topic, v, partition=0)
    assert p.flush(30) == 0
    bob = AdminClient(_ck(b, pki, "bob", "bob-pw", "SCRAM-SHA-256"))
    assert bob.list_topics(timeout=30).topics[topic]
    kp = {
        "bootstrap_servers": f"127.0.0.1:{b.ports['SASL_SSL']}",
        "security_protocol": "SASL_SSL",
        "ssl_cafile": str(pki.ca),
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "alice",
        "sasl_plain_password": "alice-pw",
    }
    producer = KafkaProducer(acks="all", **kp)
    more = [f"kp{i}".encode() for i in range(200)]
    for v in more:
        producer.send(topic, v, partition=0)
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer(consumer_timeout_ms=10_000, **kp)
    consumer.assign([TopicPartition(topic, 0)])
    consumer.seek(TopicPartition(topic, 0), 0)
    got = []
    for m in consumer:
        got.append(m.value)
        if len(got) == len(values) + len(more):
            break
    consumer.close()
    assert got == values + more

    # A wrong password, a mechanism the user has no credential for, a deleted user: refused.
    assert "Authentication failed" in _auth_error(_ck(b, pki, "alice", "wrong"))
    _auth_error(_ck(b, pki, "alice", "alice-pw", "SCRAM-SHA-256"))
    assert _alter(admin, [UserScramCredentialDeletion("alice", SHA512)]) == {"alice": None}
    _auth_error(_ck(b, pki, "alice", "alice-pw"))
    assert bob.list_topics(timeout=30).topics[topic]  # served meanwhile


def _client_final(first_bare: str, server_first: str, password: str, *, nonce=None, proof=None):
    attrs = dict(kv.split("=", 1) for kv in server_first.split(","))
    salted = hashlib.pbkdf2_hmac(
        "sha512", password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"])
    )
    head = f"c=biws,r={nonce or attrs['r']}"
    auth = f"{first_bare},{server_first},{head}".encode()
    client_key = hmac.new(salted, b"Client Key", "sha512").digest()
    stored = hashlib.sha512(client_key).digest()
    sig = hmac.new(stored, auth, "sha512").digest()
    good = bytes(a ^ b for a, b in zip(client_key, sig, strict=True))
    return f"{head},p={base64.b64encode(proof or good).decode()}".encode()


@pytest.mark.parametrize("bad", ["nonce", "proof", None])
def test_scram_exchange_with_bad_nonce_or_proof(scram_broker, bad):
    b = scram_broker
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    upsert = UserScramCredentialUpsertion("erin", ScramCredentialInfo(SHA512, 4096), b"erin-pw")
    assert _alter(admin, [upsert]) == {"erin": None}
    with RawClient(f"127.0.0.1:{b.ports['SASL_PLAINTEXT']}") as raw:
        hs = raw.call(SaslHandshakeRequest(mechanism="SCRAM-SHA-512"))
        assert hs.error_code == ErrorCode.none
        first_bare = "n=erin,r=clientnonce123"
        first = raw.call(SaslAuthenticateRequest(auth_bytes=f"n,,{first_bare}".encode()))
        assert first.error_code == ErrorCode.none
        server_first = first.auth_bytes.decode()
        assert server_first.startswith("r=clientnonce123") and ",i=4096" in server_first
        final = _client_final(
            first_bare,
            server_first,
            "erin-pw",
            nonce="clientnonce123forged" if bad == "nonce" else None,
            proof=b"\x00" * 64 if bad == "proof" else None,
        )
        resp = raw.call(SaslAuthenticateRequest(auth_bytes=final))
        if bad is None:
            assert resp.error_code == ErrorCode.none
            assert resp.auth_bytes.startswith(b"v=")
        else:
            assert resp.error_code == ErrorCode.sasl_authentication_failed
            assert raw.is_closed_by_peer()


def test_aiokafka_scram_and_plain_over_tls(broker_factory, pki):
    jaas = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_paul="paul-pw";'
    b = broker_factory(
        extra_listeners=("SASL_SSL",),
        **{
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(pki.server),
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
            "listener.name.sasl_ssl.plain.sasl.jaas.config": jaas,
        },
    )
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    upsert = UserScramCredentialUpsertion("sam", ScramCredentialInfo(SHA512, 4096), b"sam-pw")
    assert _alter(admin, [upsert]) == {"sam": None}
    topic = new_topic(b.bootstrap, partitions=1, prefix="scram-ak")
    values = [f"ak{i}".encode() for i in range(300)]

    async def roundtrip(mechanism: str, user: str, password: str) -> list[bytes]:
        common = {
            "bootstrap_servers": f"127.0.0.1:{b.ports['SASL_SSL']}",
            "security_protocol": "SASL_SSL",
            "ssl_context": create_ssl_context(cafile=str(pki.ca)),
            "sasl_mechanism": mechanism,
            "sasl_plain_username": user,
            "sasl_plain_password": password,
        }
        producer = AIOKafkaProducer(acks="all", **common)
        await producer.start()
        try:
            for v in values:
                await producer.send(topic, v, partition=0)
            await producer.flush()
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(**common)
        await consumer.start()
        got: list[bytes] = []
        try:
            tp = AkPartition(topic, 0)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            while len(got) < 2 * len(values):
                batch = await consumer.getmany(tp, timeout_ms=10_000)
                if not batch:
                    break
                got.extend(m.value for m in batch[tp])
        finally:
            await consumer.stop()
        return got

    assert asyncio.run(roundtrip("SCRAM-SHA-512", "sam", "sam-pw"))[: len(values)] == values
    assert asyncio.run(roundtrip("PLAIN", "paul", "paul-pw")) == values + values
