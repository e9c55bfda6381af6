"""The schema registry over TLS with HTTP basic auth against the broker's users
(``schema.registry.listeners=https://...``, ``schema.registry.authentication.method=BASIC``):
confluent-kafka's ``SchemaRegistryClient`` (``basic.auth.user.info``, ``ssl.ca.location``)
as a SCRAM user and as a PLAIN user, Avro produced over SASL_SSL and read back; a wrong
password, an unknown user and no credentials get 401 with Confluent's error JSON; a deleted
SCRAM credential stops working at once; plaintext on the https port harms no one; mTLS with
``schema.registry.ssl.*``."""

from __future__ import annotations

import base64
import http.client
import json
import re
import socket
import ssl

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism
from confluent_kafka.admin import UserScramCredentialDeletion as Deletion
from confluent_kafka.admin import UserScramCredentialUpsertion as Upsert
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.fixtures.tls import make_pki
from tests.integration.broker.clients import new_topic

pytestmark = pytest.mark.integration

JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_carol="carol-secret";'
SCHEMA = json.dumps(
    {
        "type": "record",
        "name": "Click",
        "fields": [{"name": "id", "type": "long"}, {"name": "page", "type": "string"}],
    }
)
SHA512 = ScramMechanism.SCRAM_SHA_512


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def _url(b) -> str:
    found = re.findall(r"schema registry at (https://\S+:\d+)", b.log_text())
    assert found, b.log_tail()
    return found[-1]


def _client(url: str, pki, user_info: str | None = None, **more: str) -> SchemaRegistryClient:
    conf = {"url": url, "ssl.ca.location": str(pki.ca), **more}
    if user_info is not None:
        conf["basic.auth.user.info"] = user_info
    return SchemaRegistryClient(conf)


def _status(url: str, pki, authorization: str | None) -> tuple[int, dict, str | None]:
    host, port = url.removeprefix("https://").rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    conn = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=30)
    headers = {} if authorization is None else {"Authorization": authorization}
    conn.request("GET", "/subjects", headers=headers)
    resp = conn.getresponse()
    body = json.loads(resp.read())
    challenge = resp.getheader("WWW-Authenticate")
    conn.close()
    return resp.status, body, challenge


def test_basic_auth_against_scram_and_plain_users_over_tls(broker_factory, pki):
    b = broker_factory(
        extra_listeners=("SASL_SSL",),
        **{
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(pki.server),
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
            "listener.name.sasl_ssl.plain.sasl.jaas.config": JAAS,
            "schema.registry.listeners": "https://127.0.0.1:0",
            "schema.registry.authentication.method": "BASIC",
        },
    )
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    for fut in admin.alter_user_scram_credentials(
        [Upsert("alice", ScramCredentialInfo(SHA512, 8192), b"alice-secret")]
    ).values():
        fut.result(30)
    url = _url(b)
    topic = new_topic(b.bootstrap, partitions=1, prefix="sr-auth")
    subject = f"{topic}-value"

    # a SCRAM user: the password checked against the salted credential the broker stores
    alice = _client(url, pki, "alice:alice-secret")
    schema_id = alice.register_schema(subject, Schema(SCHEMA, "AVRO"))
    # a PLAIN user of the listener's JAAS config: the same registry
    carol = _client(url, pki, "carol:carol-secret")
    assert json.loads(carol.get_schema(schema_id).schema_str) == json.loads(SCHEMA)
    assert carol.get_subjects() == [subject]

    # Avro produced over SASL_SSL with the schema from the authenticated registry, read back
    sasl = {
        "bootstrap.servers": f"127.0.0.1:{b.ports['SASL_SSL']}",
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(pki.ca),
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "alice",
        "sasl.password": "alice-secret",
    }
    ser = AvroSerializer(alice, SCHEMA, conf={"auto.register.schemas": False})
    ctx = SerializationContext(topic, MessageField.VALUE)
    rows = [{"id": i, "page": f"/p/{i}"} for i in range(20)]
    p = ck.Producer(sasl)
    for row in rows:
        p.produce(topic, ser(row, ctx), partition=0)
    assert p.flush(30) == 0
    c = ck.Consumer({**sasl, "group.id": "sr-auth", "auto.offset.reset": "earliest"})
    c.assign([ck.TopicPartition(topic, 0, 0)])
    de = AvroDeserializer(carol)
    got = []
    while len(got) < len(rows):
        m = c.poll(30)
        assert m is not None and not m.error()
        got.append(de(m.value(), ctx))
    c.close()
    assert got == rows

    # refused: a wrong password, an unknown user, no credentials, garbage; 401 and Confluent's
    # error JSON, with the challenge
    for user_info in ("alice:wrong", "carol:alice-secret", "mallory:x"):
        with pytest.raises(SchemaRegistryError) as info:
            _client(url, pki, user_info).get_subjects()
        assert (info.value.http_status_code, info.value.error_code) == (401, 401), user_info
    for authorization in (
        None,
        "Basic !!!",
        "Bearer abc",
        "Basic " + base64.b64encode(b"alice").decode(),
    ):
        assert _status(url, pki, authorization) == (
            401,
            {"error_code": 401, "message": "Unauthorized"},
            'Basic realm="SchemaRegistry"',
        )
    good = "Basic " + base64.b64encode(b"alice:alice-secret").decode()
    assert _status(url, pki, good)[:2] == (200, [subject])

    # plaintext HTTP on the https port: that connection fails, the registry serves on
    host, port = url.removeprefix("https://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"GET /subjects HTTP/1.1\r\nHost: x\r\n\r\n")
        assert not s.recv(4096).startswith(b"HTTP/1.1 200")
    assert carol.get_subjects() == [subject]

    # a deleted SCRAM credential stops working at once (a remembered check is per credential)
    for fut in admin.alter_user_scram_credentials([Deletion("alice", SHA512)]).values():
        fut.result(30)
    assert _status(url, pki, good)[0] == 401


def test_registry_mtls_with_its_own_ssl_keys(broker_factory, pki, tmp_path):
    b = broker_factory(
        **{
            "schema.registry.listeners": "https://127.0.0.1:0",
            "schema.registry.ssl.keystore.type": "PEM",
            "schema.registry.ssl.keystore.location": str(pki.server),
            "schema.registry.ssl.truststore.type": "PEM",
            "schema.registry.ssl.truststore.location": str(pki.ca),
            "schema.registry.ssl.client.auth": "required",
        }
    )
    url = _url(b)
    client = _client(
        url, pki, **{"ssl.certificate.location": str(pki.client_cert),
                     "ssl.key.location": str(pki.client_key)}
    )  # fmt: skip
    assert client.register_schema("m-value", Schema(SCHEMA, "AVRO")) >= 1
    assert client.get_subjects() == ["m-value"]
    # a certificate from another CA, or none: the handshake is refused
    for cert, key in ((pki.rogue_cert, pki.rogue_key), (None, None)):
        more = (
            {}
            if cert is None
            else {"ssl.certificate.location": str(cert), "ssl.key.location": str(key)}
        )
        with pytest.raises(Exception) as info:
            _client(url, pki, **more).get_subjects()
        assert not isinstance(info.value, SchemaRegistryError), info.value
    assert client.get_subjects() == ["m-value"]
