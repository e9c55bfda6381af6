"""The broker's schema registry (``schema.registry.listeners``) with real clients: confluent-kafka's
``SchemaRegistryClient`` and its Avro, Protobuf and JSON serializers producing to the loglake
broker and the deserializers reading back; Confluent's error answers over raw HTTP; the
``_schemas`` topic read back with a Kafka consumer and after a restart."""

from __future__ import annotations

import http.client
import json
import re
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

from tests.fixtures.broker import BrokerProcess, wait_for
from tests.integration.broker.clients import new_topic

CT = "application/vnd.schemaregistry.v1+json"
USER_V1 = {
    "type": "record",
    "name": "User",
    "namespace": "app",
    "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}],
}
# BACKWARD-compatible: a new field with a default
USER_V2 = {
    **USER_V1,
    "fields": [*USER_V1["fields"], {"name": "email", "type": ["null", "string"], "default": None}],
}
# BACKWARD-incompatible: a new field without a default, and id narrowed to int
USER_BAD = {
    **USER_V1,
    "fields": [{"name": "id", "type": "int"}, {"name": "age", "type": "int"}],
}


def _registry_url(b: BrokerProcess) -> str:
    found = re.findall(r"schema registry at (http://\S+:\d+)", b.log_text())
    assert found, b.log_tail()
    return found[-1]


def _http(
    url: str, method: str, path: str, body: Any = None, *, raw: bytes | None = None
) -> tuple[int, Any]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    conn.request(method, path, body=data, headers={"Content-Type": CT})
    resp = conn.getresponse()
    assert resp.getheader("Content-Type") == CT
    out = json.loads(resp.read())
    conn.close()
    return resp.status, out


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    p = ck.Producer({"bootstrap.servers": bootstrap})
    for v in values:
        p.produce(topic, value=v)
    assert p.flush(30) == 0


def _consume(bootstrap: str, topic: str, n: int) -> list[Any]:
    """The first ``n`` messages of partition 0 of ``topic`` (a plain Kafka consumer)."""
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "sr-test"})
    c.assign([ck.TopicPartition(topic, 0, 0)])
    got: list[Any] = []

    def poll() -> bool:
        for m in c.consume(100, 0.5):
            assert m.error() is None, m.error()
            got.append(m)
        return len(got) >= n

    try:
        wait_for(poll, 60)
    finally:
        c.close()
    return got


def _protobuf_class() -> Any:
    """A message class built at test time from a FileDescriptorProto (no protoc, no _pb2)."""
    fdp = descriptor_pb2.FileDescriptorProto(name="loglake_test/order.proto", package="shop")
    fdp.syntax = "proto3"
    msg = fdp.message_type.add(name="Order")
    F = descriptor_pb2.FieldDescriptorProto
    msg.field.add(name="id", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    msg.field.add(name="item", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    msg.field.add(name="qty", number=3, type=F.TYPE_INT32, label=F.LABEL_REPEATED)
    # a well-known type: the serializer registers its file as a referenced subject
    fdp.dependency.append("google/protobuf/timestamp.proto")
    msg.field.add(
        name="at",
        number=4,
        type=F.TYPE_MESSAGE,
        type_name=".google.protobuf.Timestamp",
        label=F.LABEL_OPTIONAL,
    )
    pool = descriptor_pool.DescriptorPool()
    ts = descriptor_pb2.FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(ts)
    pool.Add(ts)
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))


@pytest.mark.timeout(240)
def test_serializers_roundtrip_and_restart(broker_factory) -> None:
    b = broker_factory(**{"schema.registry.listeners": "http://127.0.0.1:0"})
    url = _registry_url(b)
    sr = SchemaRegistryClient({"url": url})

    # Avro: two compatible versions under the topic's value subject
    topic = new_topic(b.bootstrap, partitions=1, prefix="sr-avro")
    ctx = SerializationContext(topic, MessageField.VALUE)
    ser1 = AvroSerializer(sr, json.dumps(USER_V1))
    ser2 = AvroSerializer(sr, json.dumps(USER_V2))
    values = [
        ser1({"id": 1, "name": "ann"}, ctx),
        ser2({"id": 2, "name": "bo", "email": "b@x"}, ctx),
    ]
    assert values[0][0] == 0 and values[1][0] == 0  # Confluent's wire format: magic 0 + id
    _produce(b.bootstrap, topic, values)
    de = AvroDeserializer(SchemaRegistryClient({"url": url}))
    got = [de(m.value(), ctx) for m in _consume(b.bootstrap, topic, 2)]
    assert got == [{"id": 1, "name": "ann"}, {"id": 2, "name": "bo", "email": "b@x"}]
    assert sr.get_versions(f"{topic}-value") == [1, 2]

    # Protobuf: a message class built from a descriptor at test time
    order_cls = _protobuf_class()
    ptopic = new_topic(b.bootstrap, partitions=1, prefix="sr-proto")
    pctx = SerializationContext(ptopic, MessageField.VALUE)
    # skip.known.types off: timestamp.proto is registered as a referenced subject and looked
    # up (POST /subjects/{s}) for its version
    pser = ProtobufSerializer(
        order_cls, sr, {"use.deprecated.format": False, "skip.known.types": False}
    )
    order = order_cls(id=7, item="tea", qty=[1, 2])
    order.at.seconds = 1_700_000_000
    _produce(b.bootstrap, ptopic, [pser(order, pctx)])
    pde = ProtobufDeserializer(order_cls, {"use.deprecated.format": False})
    back = pde(_consume(b.bootstrap, ptopic, 1)[0].value(), pctx)
    assert (back.id, back.item, list(back.qty), back.at.seconds) == (
        7,
        "tea",
        [1, 2],
        1_700_000_000,
    )
    latest = sr.get_latest_version(f"{ptopic}-value")
    assert latest.schema.schema_type == "PROTOBUF"
    assert [r.name for r in latest.schema.references] == ["google/protobuf/timestamp.proto"]

    # JSON Schema
    jschema = json.dumps(
        {
            "type": "object",
            "properties": {"sku": {"type": "string"}, "price": {"type": "number"}},
            "required": ["sku"],
        }
    )
    jtopic = new_topic(b.bootstrap, partitions=1, prefix="sr-json")
    jctx = SerializationContext(jtopic, MessageField.VALUE)
    jser = JSONSerializer(jschema, sr)
    _produce(b.bootstrap, jtopic, [jser({"sku": "a1", "price": 2.5}, jctx)])
    jde = JSONDeserializer(None, schema_registry_client=SchemaRegistryClient({"url": url}))
    assert jde(_consume(b.bootstrap, jtopic, 1)[0].value(), jctx) == {"sku": "a1", "price": 2.5}

    # idempotent register; ids global: the same schema under another subject keeps its id
    v1_id = sr.register_schema(f"{topic}-value", Schema(json.dumps(USER_V1), "AVRO"))
    assert sr.register_schema("other-subject", Schema(json.dumps(USER_V1), "AVRO")) == v1_id
    assert sr.get_versions(f"{topic}-value") == [1, 2]
    before = {
        s: [(v, sr.get_version(s, v).schema_id) for v in sr.get_versions(s)]
        for s in sr.get_subjects()
    }
    assert len(before) == 5  # avro, protobuf + its timestamp.proto reference, json, other

    # _schemas is a compacted topic a Kafka consumer reads, in Confluent's record format
    msgs = _consume(b.bootstrap, "_schemas", 5)
    first_key = json.loads(msgs[0].key())
    first_val = json.loads(msgs[0].value())
    assert first_key == {"keytype": "SCHEMA", "subject": f"{topic}-value", "version": 1, "magic": 1}
    assert first_val["id"] == v1_id and json.loads(first_val["schema"]) == USER_V1
    assert first_val["deleted"] is False

    # _schemas was created compacted, one partition
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, "_schemas")
    described = admin.describe_configs([res])[res].result(timeout=30)
    assert described["cleanup.policy"].value == "compact"
    meta = admin.list_topics(timeout=30).topics["_schemas"]
    assert list(meta.partitions) == [0]

    # restart: every subject, version and id is back; a new schema gets a fresh id
    b.restart()
    url = _registry_url(b)
    sr2 = SchemaRegistryClient({"url": url})
    after = {
        s: [(v, sr2.get_version(s, v).schema_id) for v in sr2.get_versions(s)]
        for s in sr2.get_subjects()
    }
    assert after == before
    used = {i for vs in before.values() for _, i in vs}
    new_id = sr2.register_schema("fresh", Schema('{"type":"string"}', "AVRO"))
    assert new_id == max(used) + 1

    # SIGKILL right after an acknowledged registration: recovery replays it
    sr2.set_compatibility("fresh", "FORWARD")
    b.kill()
    b.start()
    sr3 = SchemaRegistryClient({"url": _registry_url(b)})
    assert sr3.get_latest_version("fresh").schema_id == new_id
    assert sr3.get_compatibility("fresh") == "FORWARD"
    assert sr3.get_versions(f"{topic}-value") == [1, 2]


@pytest.mark.timeout(180)
def test_rest_errors(broker_factory) -> None:
    b = broker_factory(**{"schema.registry.listeners": "http://127.0.0.1:0"})
    url = _registry_url(b)
    sr = SchemaRegistryClient({"url": url})
    subj = "users-value"

    status, body = _http(url, "GET", "/subjects/nope/versions")
    assert (status, body["error_code"]) == (404, 40401)
    assert _http(url, "GET", "/schemas/ids/999")[1]["error_code"] == 40403
    status, body = _http(
        url, "POST", "/compatibility/subjects/nope/versions/1", {"schema": '"int"'}
    )
    assert (status, body["error_code"]) == (404, 40402)
    status, body = _http(
        url, "POST", "/compatibility/subjects/nope/versions/latest", {"schema": '"int"'}
    )
    assert (status, body) == (200, {"is_compatible": True})
    status, body = _http(url, "POST", "/subjects/x/versions", {"schema": "not json at all"})
    assert (status, body["error_code"]) == (422, 42201)
    assert _http(url, "GET", "/schemas/types") == (200, ["JSON", "PROTOBUF", "AVRO"])
    assert _http(url, "GET", "/config") == (200, {"compatibilityLevel": "BACKWARD"})

    status, body = _http(url, "POST", f"/subjects/{subj}/versions", {"schema": json.dumps(USER_V1)})
    assert status == 200 and body["id"] >= 1
    sid = body["id"]
    assert _http(url, "GET", f"/subjects/{subj}/versions/1/schema") == (200, USER_V1)
    assert _http(url, "GET", f"/schemas/ids/{sid}/versions") == (
        200,
        [{"subject": subj, "version": 1}],
    )
    status, body = _http(url, "POST", f"/subjects/{subj}", {"schema": json.dumps(USER_V1)})
    assert (status, body["id"], body["version"]) == (200, sid, 1)
    status, body = _http(url, "POST", f"/subjects/{subj}", {"schema": json.dumps(USER_V2)})
    assert (status, body["error_code"]) == (404, 40403)
    assert _http(url, "GET", f"/subjects/{subj}/versions/7")[1]["error_code"] == 40402
    assert _http(url, "GET", f"/subjects/{subj}/versions/zero")[1]["error_code"] == 42202

    # incompatible under BACKWARD: 409 / 409, and the compatibility endpoint says why
    with pytest.raises(SchemaRegistryError) as exc:
        sr.register_schema(subj, Schema(json.dumps(USER_BAD), "AVRO"))
    assert (exc.value.http_status_code, exc.value.error_code) == (409, 409)
    status, body = _http(
        url,
        "POST",
        f"/compatibility/subjects/{subj}/versions/latest?verbose=true",
        {"schema": json.dumps(USER_BAD)},
    )
    assert status == 200 and body["is_compatible"] is False
    assert any("age" in m for m in body["messages"]) and any("long" in m for m in body["messages"])
    assert sr.test_compatibility(subj, Schema(json.dumps(USER_V2), "AVRO")) is True
    # NONE lets it through
    assert _http(url, "PUT", f"/config/{subj}", {"compatibility": "NONE"}) == (
        200,
        {"compatibility": "NONE"},
    )
    assert sr.register_schema(subj, Schema(json.dumps(USER_BAD), "AVRO")) > 0
    assert _http(url, "PUT", "/config", {"compatibility": "SIDEWAYS"})[1]["error_code"] == 42203

    # invalid schemas: 422 / 42201 with the parser's message
    for schema, stype in (
        ('{"type": "record", "name": "X"}', "AVRO"),
        ('{"type": "record", "name": "X", "fields": [{"name": "a", "type": "nosuch"}]}', "AVRO"),
        ('{"type": "wobble"}', "JSON"),
        ('syntax = "proto3"; message M { int32 a = 1; }', "PROTOBUF"),
    ):
        status, body = _http(
            url, "POST", "/subjects/bad/versions", {"schema": schema, "schemaType": stype}
        )
        assert (status, body["error_code"]) == (422, 42201), (stype, body)
        assert body["message"].startswith("Invalid schema: ")

    # hard delete only after a soft delete
    status, body = _http(url, "DELETE", f"/subjects/{subj}?permanent=true")
    assert (status, body["error_code"]) == (404, 40405)
    assert _http(url, "DELETE", f"/subjects/{subj}") == (200, [1, 2])
    assert _http(url, "GET", f"/subjects/{subj}/versions")[1]["error_code"] == 40401
    assert _http(url, "GET", "/subjects?deleted=true")[1] == [subj]
    assert _http(url, "DELETE", f"/subjects/{subj}?permanent=true") == (200, [1, 2])
    assert _http(url, "GET", "/subjects?deleted=true")[1] == []

    # READONLY refuses writes
    assert _http(url, "PUT", "/mode", {"mode": "READONLY"}) == (200, {"mode": "READONLY"})
    status, body = _http(url, "POST", "/subjects/ro/versions", {"schema": '"string"'})
    assert (status, body["error_code"]) == (422, 42205)
    assert _http(url, "PUT", "/mode", {"mode": "READWRITE"})[0] == 200

    # garbage JSON, unknown path, oversized body: Confluent's error JSON, and the server lives
    status, body = _http(url, "POST", "/subjects/x/versions", raw=b"{not json")
    assert status == 400 and "error_code" in body
    assert _http(url, "GET", "/nowhere")[0] == 404
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(
            b"POST /subjects/x/versions HTTP/1.1\r\nHost: x\r\nContent-Length: 17000000\r\n\r\n"
        )
        head = s.recv(4096)
    assert head.startswith(b"HTTP/1.1 413")
    # a client stalled mid-request holds its own thread only (the server's socket timeout
    # ends it later): others are answered meanwhile
    with socket.create_connection((host, int(port)), timeout=30) as stalled:
        stalled.sendall(b"POST /subjects/x/versions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
        assert _http(url, "GET", "/subjects")[0] == 200

    # concurrent registrations (one server thread per connection): distinct ids, no lost write
    def register(i: int) -> int:
        # BACKWARD-compatible with any other of them: g{i} has a default
        fields = [{"name": "f", "type": "int"}, {"name": f"g{i}", "type": "int", "default": 0}]
        schema = {"type": "record", "name": "C", "fields": fields}
        status, body = _http(
            url, "POST", f"/subjects/conc-{i % 4}/versions", {"schema": json.dumps(schema)}
        )
        assert status == 200, body
        return int(body["id"])

    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(register, range(32)))
    assert len(set(ids)) == 32
    assert [_http(url, "GET", f"/subjects/conc-{k}/versions")[1] for k in range(4)] == [
        list(range(1, 9))
    ] * 4


@pytest.mark.timeout(180)
def test_avro_references(broker_factory) -> None:
    """A schema referencing another subject's named type: registered, resolved for
    compatibility and for the serializers; a referenced version cannot be deleted."""
    b = broker_factory(**{"schema.registry.listeners": "http://127.0.0.1:0"})
    url = _registry_url(b)
    sr = SchemaRegistryClient({"url": url})
    address = {
        "type": "record",
        "name": "Address",
        "namespace": "app",
        "fields": [{"name": "city", "type": "string"}],
    }
    sr.register_schema("address", Schema(json.dumps(address), "AVRO"))
    ref = SchemaReference("app.Address", "address", 1)
    customer = {
        "type": "record",
        "name": "Customer",
        "namespace": "app",
        "fields": [{"name": "id", "type": "long"}, {"name": "home", "type": "app.Address"}],
    }
    status, body = _http(url, "POST", "/subjects/c/versions", {"schema": json.dumps(customer)})
    assert (status, body["error_code"]) == (422, 42201)  # app.Address unknown without the ref
    cid = sr.register_schema("c", Schema(json.dumps(customer), "AVRO", [ref]))
    assert _http(url, "GET", "/subjects/address/versions/1/referencedby") == (200, [cid])
    status, body = _http(url, "DELETE", "/subjects/address/versions/1")
    assert (status, body["error_code"]) == (422, 42206)

    # compatibility through the reference: the referenced type's field types are compared
    bad = {**customer, "fields": [{"name": "id", "type": "long"}, {"name": "home", "type": "int"}]}
    status, body = _http(
        url,
        "POST",
        "/compatibility/subjects/c/versions/latest?verbose=true",
        {"schema": json.dumps(bad)},
    )
    assert status == 200 and body["is_compatible"] is False, body

    topic = new_topic(b.bootstrap, partitions=1, prefix="sr-ref")
    ctx = SerializationContext(topic, MessageField.VALUE)
    ser = AvroSerializer(
        sr,
        Schema(json.dumps(customer), "AVRO", [ref]),
        conf={"auto.register.schemas": False, "use.latest.version": True},
    )
    sr.register_schema(f"{topic}-value", Schema(json.dumps(customer), "AVRO", [ref]))
    record = {"id": 5, "home": {"city": "Oslo"}}
    _produce(b.bootstrap, topic, [ser(record, ctx)])
    de = AvroDeserializer(SchemaRegistryClient({"url": url}))
    assert de(_consume(b.bootstrap, topic, 1)[0].value(), ctx) == record
