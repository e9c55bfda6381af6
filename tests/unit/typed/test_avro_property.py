"""The vectorised Avro decoder equals fastavro's per-record reader on random schemas/records.

Schemas and records come from ``avro_strategies`` (every Avro type and logical type the
decoder maps); records are written by fastavro's ``schemaless_writer`` and framed like
Confluent's serializers. Three contracts:

1. same schema both sides: the decoder's rows equal ``decode_reference``'s (fastavro);
2. a writer -> reader evolution (fields added with defaults, dropped, reordered, promoted;
   enums widened): equal to fastavro's schema resolution;
3. damaged payloads (truncated, garbage, empty) become errors or valid rows, never an
   exception, and every other row decodes exactly as it would alone.
"""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.typed.avro import compile_decoder, decode_reference
from tests.unit.typed.avro_strategies import record_schemas, values_of, with_evolution

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
HEADER = b"\x00\x00\x00\x00\x07"


def frame(schema: dict[str, Any], records: list[Any]) -> pa.BinaryArray:
    parsed = fastavro.parse_schema(schema)
    out = []
    for r in records:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, r)
        out.append(HEADER + buf.getvalue())
    return pa.array(out, pa.binary())


@st.composite
def schema_and_records(draw: Any) -> tuple[dict[str, Any], list[Any]]:
    schema = draw(record_schemas())
    return schema, draw(st.lists(values_of(schema), max_size=6))


def assert_same(got: Any, want: Any) -> None:
    got.values.validate(full=True)
    assert got.values.type == want.values.type
    assert got.errors.is_null().to_pylist() == want.errors.is_null().to_pylist(), (
        got.errors.to_pylist(),
        want.errors.to_pylist(),
    )
    assert got.values.to_pylist() == want.values.to_pylist()


@SETTINGS
@given(schema_and_records())
def test_decoder_equals_fastavro(case: tuple[dict[str, Any], list[Any]]) -> None:
    schema, records = case
    text = json.dumps(schema)
    data = frame(schema, records)
    got = compile_decoder(text).decode(data)
    assert got.error_count == 0, got.errors.to_pylist()
    assert_same(got, decode_reference(data, text))


@SETTINGS
@given(with_evolution(), st.data())
def test_evolution_equals_fastavro_resolution(
    case: tuple[dict[str, Any], dict[str, Any], list[str]], data: st.DataObject
) -> None:
    writer, reader, _changes = case
    records = data.draw(st.lists(values_of(writer), max_size=5))
    values = frame(writer, records)
    wtext, rtext = json.dumps(writer), json.dumps(reader)
    got = compile_decoder(wtext, rtext).decode(values)
    want = decode_reference(values, wtext, rtext)
    assert got.values.type == compile_decoder(rtext).arrow_type
    assert_same(got, want)


@SETTINGS
@given(schema_and_records(), st.data())
def test_damaged_payloads_fail_alone(
    case: tuple[dict[str, Any], list[Any]], data: st.DataObject
) -> None:
    schema, records = case
    text = json.dumps(schema)
    good = frame(schema, records).to_pylist()
    damaged = list(good)
    truncated = set()
    for i in range(len(damaged)):
        how = data.draw(st.sampled_from(["keep", "truncate", "garbage", "empty", "append"]))
        raw = damaged[i]
        if how == "truncate" and len(raw) > 5:
            damaged[i] = raw[: data.draw(st.integers(5, len(raw) - 1))]
            truncated.add(i)
        elif how == "garbage":
            damaged[i] = HEADER + data.draw(st.binary(max_size=40))
        elif how == "empty":
            damaged[i] = data.draw(st.sampled_from([b"", b"\x00", HEADER[:4]]))
        elif how == "append":
            damaged[i] = raw + b"\x00"
            truncated.add(i)  # trailing bytes after a complete value: an error too
    dec = compile_decoder(text)
    got = dec.decode(pa.array(damaged, pa.binary()))
    got.values.validate(full=True)
    errors = got.errors.to_pylist()
    alone = dec.decode(pa.array(good, pa.binary())).values.to_pylist()
    rows = got.values.to_pylist()
    for i, raw in enumerate(damaged):
        if raw == good[i]:
            assert errors[i] is None and rows[i] == alone[i]
        elif i in truncated or len(raw) < 5:
            assert errors[i] is not None and rows[i] is None, (i, raw)
        else:
            assert (errors[i] is None) != (rows[i] is None)
