"""Random bytes into the typed tables' decoders (Confluent's wire format, then Avro, JSON or
Protobuf): every row comes back with a value or an error, never both, never an exception, and
well-formed records among the garbage still decode to what their serializer wrote."""

from __future__ import annotations

import base64
import io
import json

import fastavro
import pyarrow as pa
from google.protobuf import descriptor_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.typed.registry import RegisteredSchema
from pipelines.typed.wire import Decoders, decode_column

AVRO = {"type": "record", "name": "R", "fields": [
    {"name": "n", "type": "long"}, {"name": "s", "type": ["null", "string"]},
    {"name": "xs", "type": {"type": "array", "items": "int"}}]}  # fmt: skip
JSON_SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"},
                                                "s": {"type": "string"}}}  # fmt: skip


def _proto_text() -> str:
    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="fuzz.proto", package="f", syntax="proto3")
    msg = fdp.message_type.add(name="M")
    msg.field.add(name="n", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    msg.field.add(name="s", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    return base64.b64encode(fdp.SerializeToString()).decode()


SCHEMAS = {
    "AVRO": RegisteredSchema("AVRO", json.dumps(AVRO), id=1),
    "JSON": RegisteredSchema("JSON", json.dumps(JSON_SCHEMA), id=1),
    "PROTOBUF": RegisteredSchema("PROTOBUF", _proto_text(), id=1),
}


class _Registry:
    """Schema id 1 is the schema under test; every other id is unknown."""

    def __init__(self, schema: RegisteredSchema) -> None:
        self.schema = schema

    def by_id(self, schema_id: int) -> RegisteredSchema:
        from pipelines.typed.registry import SchemaNotFoundError

        if schema_id != 1:
            raise SchemaNotFoundError(f"no schema {schema_id}")
        return self.schema


def _avro_record(n: int, s: str | None) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(AVRO), {"n": n, "s": s, "xs": [n % 7]})
    return b"\x00\x00\x00\x00\x01" + buf.getvalue()


payload = st.one_of(
    st.binary(max_size=40),
    st.binary(max_size=30).map(lambda b: b"\x00\x00\x00\x00\x01" + b),  # a known id, garbage
    st.binary(max_size=30).map(lambda b: b"\x00\x00\x00\x00\x01\x00" + b),
)


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(sorted(SCHEMAS)), data=st.lists(payload, max_size=20))
def test_random_payloads_give_a_value_or_an_error_per_row(kind: str, data: list[bytes]) -> None:
    schema = SCHEMAS[kind]
    out = decode_column(pa.array(data, pa.binary()), Decoders(_Registry(schema), schema))
    assert len(out.values) == len(out.errors) == len(out.schema_ids) == len(data)
    for value, error in zip(out.values.to_pylist(), out.errors.to_pylist(), strict=True):
        assert (value is None) != (error is None)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(
        st.one_of(
            st.tuples(st.integers(-(2**63), 2**63 - 1), st.one_of(st.none(), st.text(max_size=8))),
            st.binary(max_size=12),
        ),
        max_size=20,
    )
)
def test_good_avro_records_among_garbage_decode_as_written(rows: list) -> None:
    data = [_avro_record(*r) if isinstance(r, tuple) else r for r in rows]
    schema = SCHEMAS["AVRO"]
    out = decode_column(pa.array(data, pa.binary()), Decoders(_Registry(schema), schema))
    for r, raw, value in zip(rows, data, out.values.to_pylist(), strict=True):
        if isinstance(r, tuple):
            assert value == {"n": r[0], "s": r[1], "xs": [r[0] % 7]}, raw
