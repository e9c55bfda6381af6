"""jobs/decode.py with Protobuf: values written by confluent-kafka's ``ProtobufSerializer``
(Confluent's framing with message indexes) against the project's registry, decoded into a typed
table and compared with ``ProtobufDeserializer``'s messages: nested messages, repeated fields,
maps, enums, a oneof, Timestamp and a wrapper."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    message_factory,
    timestamp_pb2,
    wrappers_pb2,
)

from pipelines.typed.job import run_decode
from tests.fixtures.compaction import read_table_rows
from tests.fixtures.typed import decode_config, ingest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

F = descriptor_pb2.FieldDescriptorProto


def _order_class() -> Any:
    fdp = descriptor_pb2.FileDescriptorProto(name="typed_test/order.proto", package="shop")
    fdp.syntax = "proto3"
    fdp.dependency.extend(["google/protobuf/timestamp.proto", "google/protobuf/wrappers.proto"])
    status = fdp.enum_type.add(name="Status")
    status.value.add(name="NEW", number=0)
    status.value.add(name="PAID", number=1)
    msg = fdp.message_type.add(name="Order")
    line = msg.nested_type.add(name="Line")
    line.field.add(name="sku", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    line.field.add(name="qty", number=2, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    entry = msg.nested_type.add(name="AttrsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    msg.oneof_decl.add(name="payment")
    add = msg.field.add
    add(name="id", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    add(name="status", number=2, type=F.TYPE_ENUM, type_name=".shop.Status", label=F.LABEL_OPTIONAL)
    add(
        name="lines",
        number=3,
        type=F.TYPE_MESSAGE,
        type_name=".shop.Order.Line",
        label=F.LABEL_REPEATED,
    )
    add(
        name="attrs",
        number=4,
        type=F.TYPE_MESSAGE,
        type_name=".shop.Order.AttrsEntry",
        label=F.LABEL_REPEATED,
    )
    add(name="card", number=5, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, oneof_index=0)
    add(name="cash_cents", number=6, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL, oneof_index=0)
    add(
        name="at",
        number=7,
        type=F.TYPE_MESSAGE,
        type_name=".google.protobuf.Timestamp",
        label=F.LABEL_OPTIONAL,
    )
    add(
        name="note",
        number=8,
        type=F.TYPE_MESSAGE,
        type_name=".google.protobuf.StringValue",
        label=F.LABEL_OPTIONAL,
    )
    add(name="tags", number=9, type=F.TYPE_STRING, label=F.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    for module in (timestamp_pb2, wrappers_pb2):
        dep = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(dep)
        pool.Add(dep)
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))


def _expected(m: Any) -> dict[str, Any]:
    """The typed-table row the message ``m`` (as the deserializer returns it) should give."""
    which = m.WhichOneof("payment")
    return {
        "id": m.id,
        "status": ["NEW", "PAID"][m.status],
        "lines": [{"sku": x.sku, "qty": x.qty} for x in m.lines],
        "attrs": sorted(m.attrs.items()),
        "payment": None if which is None else {
            "card": m.card if which == "card" else None,
            "cash_cents": m.cash_cents if which == "cash_cents" else None,
        },
        "at": m.at.ToDatetime(tzinfo=dt.UTC) if m.HasField("at") else None,
        "note": m.note.value if m.HasField("note") else None,
        "tags": list(m.tags),
    }  # fmt: skip


@pytest.mark.parametrize("skip_known_types", [True, False])
def test_protobuf_values_decode_into_typed_columns(
    spark: SparkSession, tmp_path: Path, registry_url: str, skip_known_types: bool
) -> None:
    """With ``skip.known.types`` off, timestamp.proto and wrappers.proto are registered as
    referenced subjects, which the decoder resolves through the registry."""
    order_cls = _order_class()
    sr = SchemaRegistryClient({"url": registry_url})
    ctx = SerializationContext("pb", MessageField.VALUE)
    ser = ProtobufSerializer(
        order_cls, sr, {"use.deprecated.format": False, "skip.known.types": skip_known_types}
    )
    messages = []
    for i in range(12):
        m = order_cls(id=i, status=i % 2, tags=["a"] * (i % 3))
        for j in range(i % 3):
            m.lines.add(sku=f"s{j}", qty=j + i)
        if i % 2:
            m.attrs["n"] = i
        if i % 3 == 1:
            m.card = f"card{i}"
        elif i % 3 == 2:
            m.cash_cents = i * 100
        if i % 4:
            m.at.FromDatetime(dt.datetime(2026, 1, 1, 0, 0, i, 5000, tzinfo=dt.UTC))
        if i % 5 == 0:
            m.note.value = f"note {i}"
        messages.append(m)
    values = [ser(m, ctx) for m in messages]
    ingest(tmp_path, "pb", [*values, b"\x00" + values[0][1:5] + b"\x00\xff\xff"])

    res = run_decode(spark, decode_config(tmp_path, registry_url)).topics[0]
    assert (res.rows, res.dead_letters) == (12, 1)
    de = ProtobufDeserializer(order_cls, {"use.deprecated.format": False})
    rows = sorted(read_table_rows(tmp_path / "tables" / "pb"), key=lambda r: r["_kafka"]["offset"])
    got = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
    for r in got:
        r["attrs"] = sorted(r["attrs"])
    assert got == [_expected(de(v, ctx)) for v in values]
    refs = sr.get_latest_version("pb-value").schema.references
    assert sorted(r.name for r in refs) == (
        [] if skip_known_types
        else ["google/protobuf/timestamp.proto", "google/protobuf/wrappers.proto"]
    )  # fmt: skip
