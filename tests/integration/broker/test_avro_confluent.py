"""Values from confluent-kafka's real ``AvroSerializer`` (registering in the broker's schema
registry) decode like its ``AvroDeserializer`` reads them, in the newest schema's shape.

The caller's way of using the decoder: group values by the schema id of Confluent's header,
fetch each writer schema from the registry, one decoder per id with the newest version as the
reader schema. Integration: starts a broker with ``schema.registry.listeners``.
"""

from __future__ import annotations

import datetime
import decimal
import json
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from pipelines.typed.avro import compile_decoder

V1: dict[str, Any] = {
    "type": "record",
    "name": "Payment",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal",
                                    "precision": 10, "scale": 2}},
        {"name": "lines", "type": {"type": "array", "items": {
            "type": "record", "name": "Line", "fields": [
                {"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}]}}},
        {"name": "legacy", "type": "string"},
    ],
}  # fmt: skip
# BACKWARD-compatible: id widened to long, legacy dropped, two fields added with defaults.
V2: dict[str, Any] = {
    **V1,
    "fields": [
        {"name": "id", "type": "long"},
        *V1["fields"][1:4],
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "state", "type": {"type": "enum", "name": "State", "symbols": ["NEW", "DONE"]},
         "default": "NEW"},
    ],
}  # fmt: skip


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_confluent_serializer_values_decode_like_its_deserializer(broker_factory: Any) -> None:
    b = broker_factory(**{"schema.registry.listeners": "http://127.0.0.1:0"})
    url = re.findall(r"schema registry at (http://\S+:\d+)", b.log_text())[-1]
    sr = SchemaRegistryClient({"url": url})
    ctx = SerializationContext("payments", MessageField.VALUE)
    at = datetime.datetime(2026, 11, 27, 12, 0, tzinfo=datetime.UTC)
    old = AvroSerializer(sr, json.dumps(V1))
    new = AvroSerializer(sr, json.dumps(V2))
    values = []
    for i in range(40):
        rec = {
            "id": i,
            "at": at + datetime.timedelta(milliseconds=i),
            "amount": decimal.Decimal(i * 101 - 2000).scaleb(-2),
            "lines": [{"sku": f"s{j}", "qty": j} for j in range(i % 4)],
        }
        if i % 2:
            values.append(new({**rec, "note": None if i % 3 else "gift", "state": "DONE"}, ctx))
        else:
            values.append(old({**rec, "legacy": "x" * i}, ctx))
    values.append(values[3][:-2])  # a truncated one: an error row, the others intact
    data = pa.array(values, pa.binary())

    # The caller's grouping: schema id from Confluent's header, one decoder per writer schema.
    ids = np.array([int.from_bytes(v[1:5], "big") for v in values])
    latest = sr.get_latest_version("payments-value").schema.schema_str
    rows: list[Any] = [None] * len(values)
    errors: list[Any] = [None] * len(values)
    for schema_id in np.unique(ids):
        pick = np.flatnonzero(ids == schema_id)
        writer = sr.get_schema(int(schema_id)).schema_str
        assert writer is not None
        dec = compile_decoder(writer, latest)
        out = dec.decode(data.take(pa.array(pick)))
        for k, i in enumerate(pick):
            rows[i], errors[i] = out.values[k].as_py(), out.errors[k].as_py()

    de = AvroDeserializer(sr, schema_str=latest)  # the reader schema
    want = [de(v, ctx) for v in values[:-1]]
    assert errors[:-1] == [None] * 40
    assert errors[-1].startswith("truncated")
    assert rows[-1] is None
    assert len({int(i) for i in ids}) == 2
    assert rows[:-1] == want
    assert rows[0]["state"] == "NEW" and rows[1]["state"] == "DONE"  # a default, a value
