"""Parsing and compatibility of the three schema types. Avro verdicts are cross-checked
against fastavro's own schema resolution: a record written with the writer schema is read
with the reader schema, which must succeed exactly when the checker says compatible."""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import fastavro
import pytest
from fastavro.read import SchemaResolutionError
from google.protobuf import descriptor_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore.registry.errors import InvalidSchemaError
from logstore.registry.formats import canonical, parse, read_problems

SAMPLE = {
    "int": 7,
    "long": 7,
    "float": 1.5,
    "double": 1.5,
    "string": "s",
    "bytes": b"b",
    "boolean": True,
}
PRIMS = list(SAMPLE)


def _record(fields: list[dict[str, Any]], name: str = "R") -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": fields}


def _fastavro_reads(writer: Any, reader: Any, datum: Any) -> bool:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(writer), datum)
    buf.seek(0)
    try:
        fastavro.schemaless_reader(
            buf, fastavro.parse_schema(writer), fastavro.parse_schema(reader)
        )
    except SchemaResolutionError:
        return False
    return True


def _verdict(reader: Any, writer: Any) -> list[str]:
    return read_problems(parse("AVRO", json.dumps(reader)), parse("AVRO", json.dumps(writer)))


CASES = [
    # (writer, reader, datum, compatible)
    (
        _record([{"name": "a", "type": "int"}]),
        _record([{"name": "a", "type": "long"}]),
        {"a": 1},
        True,
    ),
    (
        _record([{"name": "a", "type": "long"}]),
        _record([{"name": "a", "type": "int"}]),
        {"a": 1},
        False,
    ),
    (
        _record([{"name": "a", "type": "int"}]),
        _record([{"name": "a", "type": "int"}, {"name": "b", "type": "string", "default": ""}]),
        {"a": 1},
        True,
    ),
    (
        _record([{"name": "a", "type": "int"}]),
        _record([{"name": "a", "type": "int"}, {"name": "b", "type": "string"}]),
        {"a": 1},
        False,
    ),
    (
        _record([{"name": "a", "type": "int"}, {"name": "b", "type": "string"}]),
        _record([{"name": "a", "type": "int"}]),
        {"a": 1, "b": "x"},
        True,
    ),
    (
        _record([{"name": "a", "type": "string"}]),
        _record([{"name": "a", "type": ["null", "string"]}]),
        {"a": "x"},
        True,
    ),
    (
        _record([{"name": "a", "type": ["null", "string"]}]),
        _record([{"name": "a", "type": "string"}]),
        {"a": None},
        False,
    ),
    (
        _record([{"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}}]),
        _record([{"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A"]}}]),
        {"e": "B"},
        False,
    ),
    (
        _record([{"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A"]}}]),
        _record([{"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}}]),
        {"e": "A"},
        True,
    ),
    (
        _record([{"name": "xs", "type": {"type": "array", "items": "int"}}]),
        _record([{"name": "xs", "type": {"type": "array", "items": "double"}}]),
        {"xs": [1, 2]},
        True,
    ),
    (
        _record([{"name": "m", "type": {"type": "map", "values": "string"}}]),
        _record([{"name": "m", "type": {"type": "map", "values": "int"}}]),
        {"m": {"k": "v"}},
        False,
    ),
    (_record([], name="A"), _record([], name="B"), {}, False),
]


@pytest.mark.parametrize(("writer", "reader", "datum", "compatible"), CASES)
def test_avro_resolution_agrees_with_fastavro(writer, reader, datum, compatible) -> None:
    problems = _verdict(reader, writer)
    assert (not problems) is compatible, problems
    assert _fastavro_reads(writer, reader, datum) is compatible


@st.composite
def _schema_pairs(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    n = draw(st.integers(1, 5))
    wtypes = [draw(st.sampled_from(PRIMS)) for _ in range(n)]
    writer = _record([{"name": f"f{i}", "type": t} for i, t in enumerate(wtypes)])
    datum = {f"f{i}": SAMPLE[t] for i, t in enumerate(wtypes)}
    rfields = []
    for i in range(n):
        if draw(st.booleans()):
            rfields.append({"name": f"f{i}", "type": draw(st.sampled_from(PRIMS))})
    for j in range(draw(st.integers(0, 2))):
        t = draw(st.sampled_from(PRIMS))
        field: dict[str, Any] = {"name": f"new{j}", "type": t}
        if draw(st.booleans()):
            field["default"] = SAMPLE[t] if t != "bytes" else "b"
        rfields.append(field)
    return writer, _record(rfields), datum


@settings(max_examples=150, deadline=None)
@given(_schema_pairs())
def test_avro_random_records_agree_with_fastavro(pair) -> None:
    writer, reader, datum = pair
    assert (not _verdict(reader, writer)) is _fastavro_reads(writer, reader, datum)


def test_avro_invalid_and_canonical() -> None:
    with pytest.raises(InvalidSchemaError, match="no 'fields'"):
        parse("AVRO", '{"type": "record", "name": "X"}')
    with pytest.raises(InvalidSchemaError, match="nosuch"):
        parse("AVRO", json.dumps(_record([{"name": "a", "type": "nosuch"}])))
    assert parse("AVRO", '"string"').parsed == "string"
    assert canonical("AVRO", '{ "b": 1, "a": 2 }') == canonical("AVRO", '{"a":2,"b":1}')


def test_json_schema_rules() -> None:
    def js(doc: Any) -> Any:
        return parse("JSON", json.dumps(doc))

    old = js({"type": "object", "properties": {"a": {"type": "integer"}}})
    wider = js({"type": "object", "properties": {"a": {"type": "number"}}})
    required = js(
        {"type": "object", "properties": {"a": {"type": "integer"}, "b": {}}, "required": ["b"]}
    )
    assert read_problems(wider, old) == []
    assert read_problems(old, wider)  # number read as integer
    assert any("/properties/b" in p for p in read_problems(required, old))
    with pytest.raises(InvalidSchemaError, match="wobble"):
        parse("JSON", '{"type": "wobble"}')
    with pytest.raises(InvalidSchemaError, match="not JSON"):
        parse("JSON", "{")


def _proto(fields: list[tuple[str, int, int, int]], *, message: str = "M") -> str:
    fd = descriptor_pb2.FileDescriptorProto(name="t.proto", package="p", syntax="proto3")
    m = fd.message_type.add(name=message)
    for name, number, type_, label in fields:
        m.field.add(name=name, number=number, type=type_, label=label)
    return base64.b64encode(fd.SerializeToString()).decode()


def test_protobuf_rules() -> None:
    F = descriptor_pb2.FieldDescriptorProto
    base = parse("PROTOBUF", _proto([("a", 1, F.TYPE_INT32, F.LABEL_OPTIONAL)]))
    widened = parse("PROTOBUF", _proto([("a", 1, F.TYPE_INT64, F.LABEL_OPTIONAL)]))
    to_string = parse("PROTOBUF", _proto([("a", 1, F.TYPE_STRING, F.LABEL_OPTIONAL)]))
    repeated = parse("PROTOBUF", _proto([("a", 1, F.TYPE_INT32, F.LABEL_REPEATED)]))
    renamed = parse("PROTOBUF", _proto([("a", 1, F.TYPE_INT32, F.LABEL_OPTIONAL)], message="N"))
    dropped = parse("PROTOBUF", _proto([("b", 2, F.TYPE_STRING, F.LABEL_OPTIONAL)]))
    assert read_problems(widened, base) == [] and read_problems(base, widened) == []
    assert read_problems(dropped, base) == []  # a removed field reads as unknown
    assert read_problems(to_string, base) == [".p.M field 1: type changed incompatibly"]
    assert read_problems(repeated, base) == [".p.M field 1: repeated changed"]
    assert read_problems(renamed, base) == ["message .p.M removed"]
    unresolved = descriptor_pb2.FileDescriptorProto(name="u.proto", package="p")
    unresolved.message_type.add(name="U").field.add(
        name="x", number=1, type=F.TYPE_MESSAGE, type_name=".p.Nope", label=F.LABEL_OPTIONAL
    )
    with pytest.raises(InvalidSchemaError, match="Nope"):
        parse("PROTOBUF", base64.b64encode(unresolved.SerializeToString()).decode())
    # a well-known import no reference supplies (confluent-kafka's skip.known.types default)
    uses_ts = descriptor_pb2.FileDescriptorProto(name="w.proto", package="p", syntax="proto3")
    uses_ts.dependency.append("google/protobuf/timestamp.proto")
    uses_ts.message_type.add(name="W").field.add(
        name="at",
        number=1,
        type=F.TYPE_MESSAGE,
        type_name=".google.protobuf.Timestamp",
        label=F.LABEL_OPTIONAL,
    )
    encoded = base64.b64encode(uses_ts.SerializeToString()).decode()
    assert parse("PROTOBUF", encoded).parsed == uses_ts
    uses_ts.dependency[0] = "mine/other.proto"
    with pytest.raises(InvalidSchemaError, match="no reference supplies it"):
        parse("PROTOBUF", base64.b64encode(uses_ts.SerializeToString()).decode())
    with pytest.raises(InvalidSchemaError, match="base64 FileDescriptorProto"):
        parse("PROTOBUF", 'syntax = "proto3"; message M { int32 a = 1; }')
