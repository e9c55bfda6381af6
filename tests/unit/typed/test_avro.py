"""The Avro decoder on chosen cases: the type mapping, resolution corners, every error path,
growing buffers; values checked against fastavro (``decode_reference``) or by hand."""

from __future__ import annotations

import decimal
import io
import json
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
import pytest

from logstore.errors import LoglakeError
from logstore.protocol.varint import encode_varlong
from pipelines.typed.avro import (
    UnsupportedSchemaError,
    arrow_type,
    compile_decoder,
    decode_reference,
    warm,
)

HEADER = b"\x00\x00\x00\x00\x01"


def frame(schema: Any, records: list[Any]) -> pa.BinaryArray:
    parsed = fastavro.parse_schema(schema)
    out = []
    for r in records:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, r)
        out.append(HEADER + buf.getvalue())
    return pa.array(out, pa.binary())


def record(*fields: tuple[str, Any], name: str = "R", **extra: Any) -> dict[str, Any]:
    return {
        "type": "record",
        "name": name,
        "fields": [{"name": n, "type": t, **extra.get(n, {})} for n, t in fields],
    }


def decode(writer: Any, data: pa.Array, reader: Any = None, **kw: Any) -> Any:
    rtext = None if reader is None else json.dumps(reader)
    out = compile_decoder(json.dumps(writer), rtext).decode(data, **kw)
    out.values.validate(full=True)
    return out


def test_type_mapping() -> None:
    schema = record(
        ("b", "boolean"), ("i", "int"), ("l", "long"), ("f", "float"), ("d", "double"),
        ("by", "bytes"), ("s", "string"),
        ("fx", {"type": "fixed", "name": "F", "size": 4}),
        ("e", {"type": "enum", "name": "E", "symbols": ["A", "B"]}),
        ("a", {"type": "array", "items": ["null", "int"]}),
        ("m", {"type": "map", "values": "long"}),
        ("n", ["null", "string"]), ("n2", ["string", "null"]), ("nn", ["null"]),
        ("u", ["int", "string", {"type": "record", "name": "Sub", "fields": []}]),
        ("un", ["null", "int", "string"]),
        ("date", {"type": "int", "logicalType": "date"}),
        ("tm", {"type": "int", "logicalType": "time-millis"}),
        ("tu", {"type": "long", "logicalType": "time-micros"}),
        ("tsm", {"type": "long", "logicalType": "timestamp-millis"}),
        ("tsu", {"type": "long", "logicalType": "timestamp-micros"}),
        ("ltm", {"type": "long", "logicalType": "local-timestamp-millis"}),
        ("ltu", {"type": "long", "logicalType": "local-timestamp-micros"}),
        ("dec", {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}),
        ("dec40", {"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 3}),
        ("decf", {"type": "fixed", "name": "DF", "size": 8, "logicalType": "decimal",
                  "precision": 18, "scale": 4}),
        ("uuid", {"type": "string", "logicalType": "uuid"}),
        ("dur", {"type": "fixed", "name": "Dur", "size": 12, "logicalType": "duration"}),
        ("bad", {"type": "string", "logicalType": "date"}),  # wrong base: ignored
        ("huge", {"type": "bytes", "logicalType": "decimal", "precision": 77}),  # > Arrow's
        ("F2", "F"),  # a named type referenced by name
    )  # fmt: skip
    want = pa.struct([
        pa.field("b", pa.bool_(), False), pa.field("i", pa.int32(), False),
        pa.field("l", pa.int64(), False), pa.field("f", pa.float32(), False),
        pa.field("d", pa.float64(), False), pa.field("by", pa.binary(), False),
        pa.field("s", pa.string(), False), pa.field("fx", pa.binary(4), False),
        pa.field("e", pa.string(), False),
        pa.field("a", pa.list_(pa.field("item", pa.int32(), True)), False),
        pa.field("m", pa.map_(pa.string(), pa.field("value", pa.int64(), False)), False),
        pa.field("n", pa.string(), True), pa.field("n2", pa.string(), True),
        pa.field("nn", pa.null(), True),
        pa.field("u", pa.struct([pa.field("member0", pa.int32()),
                                 pa.field("member1", pa.string()),
                                 pa.field("member2", pa.struct([]))]), False),
        pa.field("un", pa.struct([pa.field("member0", pa.int32()),
                                  pa.field("member1", pa.string())]), True),
        pa.field("date", pa.date32(), False), pa.field("tm", pa.time32("ms"), False),
        pa.field("tu", pa.time64("us"), False),
        pa.field("tsm", pa.timestamp("ms", "UTC"), False),
        pa.field("tsu", pa.timestamp("us", "UTC"), False),
        pa.field("ltm", pa.timestamp("ms"), False), pa.field("ltu", pa.timestamp("us"), False),
        pa.field("dec", pa.decimal128(10, 2), False),
        pa.field("dec40", pa.decimal256(40, 3), False),
        pa.field("decf", pa.decimal128(18, 4), False),
        pa.field("uuid", pa.string(), False), pa.field("dur", pa.binary(12), False),
        pa.field("bad", pa.string(), False), pa.field("huge", pa.binary(), False),
        pa.field("F2", pa.binary(4), False),
    ])  # fmt: skip
    assert arrow_type(schema) == want
    assert compile_decoder(json.dumps(schema)).arrow_type == want
    assert arrow_type("string") == pa.string()
    assert compile_decoder('"string"').arrow_type == pa.struct(
        [pa.field("value", pa.string(), False)]
    )


def test_recursive_schema_is_refused() -> None:
    node = record(("value", "int"), ("next", ["null", "Node"]), name="Node")
    with pytest.raises(UnsupportedSchemaError, match="recursive Avro schema: Node"):
        arrow_type(node)
    assert issubclass(UnsupportedSchemaError, LoglakeError)


def test_defaults_follow_the_specification() -> None:
    writer = record(("a", "int"))
    reader = record(
        ("a", "int"),
        ("raw", "bytes"),
        ("amount", {"type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 2}),
        (
            "sub",
            record(
                ("x", "int"),
                (
                    "y",
                    "string",
                ),
                name="S",
            ),
        ),
        ("u", ["int", "string"]),
        ("n", ["null", "int"]),
        raw={"default": "\u00ff\u0000A"},  # code points 0-255 are the bytes (ISO-8859-1)
        amount={"default": "\u0001\u0000"},  # 256 -> 2.56
        sub={"default": {"x": 1, "y": "why"}},
        u={"default": 5},
        n={"default": None},
    )
    out = decode(writer, frame(writer, [{"a": 1}, {"a": 2}]), reader)
    assert out.values.to_pylist() == [
        {"a": a, "raw": b"\xff\x00A", "amount": decimal.Decimal("2.56"),
         "sub": {"x": 1, "y": "why"}, "u": {"member0": 5, "member1": None}, "n": None}
        for a in (1, 2)
    ]  # fmt: skip


def test_union_resolution_prefers_the_exact_branch() -> None:
    writer = record(("v", "bytes"))
    reader = record(("v", ["string", "bytes"]))
    out = decode(writer, frame(writer, [{"v": b"\xff"}]), reader)
    assert out.values.to_pylist() == [{"v": {"member0": None, "member1": b"\xff"}}]
    promoted = decode(record(("v", "int")), frame(record(("v", "int")), [{"v": 3}]),
                      record(("v", ["null", "string", "double"])))  # fmt: skip
    assert promoted.values.to_pylist() == [{"v": {"member0": None, "member1": 3.0}}]


def test_unreadable_branch_fails_only_its_rows() -> None:
    writer = record(("v", ["null", "string"]), ("w", "int"))
    reader = record(("v", "string"), ("w", "long"))
    data = frame(writer, [{"v": "a", "w": 1}, {"v": None, "w": 2}, {"v": "c", "w": 3}])
    out = decode(writer, data, reader)
    assert out.values.to_pylist() == [{"v": "a", "w": 1}, None, {"v": "c", "w": 3}]
    errors = out.errors.to_pylist()
    assert errors[0] is None and errors[2] is None
    assert errors[1] == "writer null cannot be read as reader string at /v (at byte 6 of 7)"
    assert out.error_count == 1


def test_reader_field_without_default_fails_every_row() -> None:
    writer = record(("a", "int"))
    out = decode(writer, frame(writer, [{"a": 1}]), record(("a", "int"), ("b", "int")))
    assert out.values.to_pylist() == [None]
    assert out.errors[0].as_py().startswith("reader field /b is not in the writer schema")


def test_enum_symbols_resolve_by_name_or_default() -> None:
    writer = record(("e", {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}))
    data = frame(writer, [{"e": "A"}, {"e": "B"}, {"e": "C"}])
    narrow = {"type": "enum", "name": "E", "symbols": ["C", "A"]}
    out = decode(writer, data, record(("e", {**narrow, "default": "A"})))
    assert out.values.to_pylist() == [{"e": "A"}, {"e": "A"}, {"e": "C"}]
    out = decode(writer, data, record(("e", narrow)))
    assert out.values.to_pylist() == [{"e": "A"}, None, {"e": "C"}]
    assert "enum symbol unknown to the reader" in out.errors[1].as_py()


def test_errors_name_the_failure_and_position() -> None:
    schema = record(("s", "string"), ("i", "int"), ("d", "double"))
    good = frame(schema, [{"s": "abc", "i": 5, "d": 1.0}])[0].as_py()
    bad_utf8 = HEADER + b"\x04\xff\xfe\x02" + b"\x00" * 8
    too_big = HEADER + b"\x00" + encode_varlong(2**40) + b"\x00" * 8
    values = [good, good[:-1], None, b"\x00\x00", good + b"!", bad_utf8, too_big,
              HEADER + b"\x7f"]  # fmt: skip
    out = decode(schema, pa.array(values, pa.binary()))
    assert out.errors.to_pylist() == [
        None,
        "truncated: the value ends inside a field (at byte 10 of 17)",
        "value is null",
        "payload shorter than its header (at byte 2 of 2)",
        "bytes left after the value (at byte 18 of 19)",
        "string is not valid UTF-8 (at byte 6 of 17)",
        "int value outside 32 bits (at byte 6 of 20)",
        "negative string/bytes length (at byte 5 of 6)",
    ]
    assert out.values.to_pylist()[0] == {"s": "abc", "i": 5, "d": 1.0}
    assert out.values.null_count == 7
    ref = decode_reference(pa.array(values, pa.binary()), json.dumps(schema))
    assert ref.errors.is_null().to_pylist() == out.errors.is_null().to_pylist()


@pytest.mark.parametrize("kernel", ["interpreter", "generated"])
def test_a_time_of_day_outside_the_day_fails_its_row(kernel: str) -> None:
    """Arrow's time32[ms] / time64[us] hold a time of day: a value outside [0, 24h) would make
    an invalid array (and files Spark misreads), so it is an error of its row."""
    schema = record(
        ("ms", {"type": "int", "logicalType": "time-millis"}),
        ("us", {"type": "long", "logicalType": "time-micros"}),
    )
    day_ms, day_us = 86_400_000, 86_400_000_000
    raw = [
        HEADER + encode_varlong(ms) + encode_varlong(us)
        for ms, us in ((0, 0), (day_ms - 1, day_us - 1), (day_ms, 0), (-1, 0), (0, day_us),
                       (0, -1))
    ]  # fmt: skip
    dec = compile_decoder(json.dumps(schema), kernel=kernel)
    out = dec.decode(pa.array(raw, pa.binary()))
    out.values.validate(full=True)
    assert out.errors.to_pylist() == [None, None] + [
        f"time of day outside 00:00-24:00 (time-millis / time-micros) (at byte {at} of {n})"
        for at, n in ((5, 10), (5, 7), (6, 12), (6, 7))
    ]
    assert out.values.field("ms").cast(pa.int32()).to_pylist()[:2] == [0, day_ms - 1]
    assert out.values.field("us").cast(pa.int64()).to_pylist()[:2] == [0, day_us - 1]


def test_hostile_block_counts_end_quickly() -> None:
    schema = record(
        ("a", {"type": "array", "items": "null"}), ("b", {"type": "array", "items": "long"})
    )
    nulls = HEADER + encode_varlong(2**40)  # 2**40 zero-byte items
    longs = HEADER + b"\x00" + encode_varlong(10**6) + b"\x00" * 10  # a million longs, 10 bytes
    negative = HEADER + encode_varlong(-(2**63)) + b"\x00"
    out = decode(schema, pa.array([nulls, longs, negative], pa.binary()))
    assert out.values.to_pylist() == [None, None, None]
    assert "block count" in out.errors[0].as_py() and "truncated" in out.errors[1].as_py()


def test_decimals_in_range_and_overflowing() -> None:
    big = {"type": "bytes", "logicalType": "decimal", "precision": 60, "scale": 5}
    small = {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}
    fixed = {"type": "fixed", "name": "Fx", "size": 20, "logicalType": "decimal",
             "precision": 38, "scale": 0}  # fmt: skip
    schema = record(("big", big), ("small", small), ("fx", fixed))
    ctx = decimal.Context(prec=80)
    rows = [
        {"big": decimal.Decimal(-(10**59) + 7).scaleb(-5, ctx),
         "small": decimal.Decimal("-1234567.89"), "fx": decimal.Decimal(-(10**38) + 1)},
        {"big": decimal.Decimal(0).scaleb(-5, ctx), "small": decimal.Decimal("0.01"),
         "fx": decimal.Decimal(12345)},
    ]  # fmt: skip
    data = frame(schema, rows)
    out = decode(schema, data)
    assert out.error_count == 0
    assert out.values.to_pylist() == decode_reference(data, json.dumps(schema)).values.to_pylist()
    # A writer's 17-byte value that the reader's decimal(9, 2) (16 bytes) cannot hold.
    wide = record(("small", {**big, "scale": 2}), ("big", big), ("fx", fixed))
    reader = record(("big", big), ("small", small), ("fx", fixed))
    data = frame(
        wide,
        [
            {
                "small": decimal.Decimal(2**130).scaleb(-2, ctx),
                "big": decimal.Decimal(0),
                "fx": decimal.Decimal(0),
            }
        ],
    )
    out = decode(wide, data, reader)
    assert out.values.to_pylist() == [None]
    assert "decimal has more digits than its precision" in out.errors[0].as_py()


@pytest.mark.parametrize("precision", [3, 18, 38, 40, 60])
def test_decimals_beyond_their_precision_fail(precision: int) -> None:
    writer = record(("d", {"type": "bytes", "logicalType": "decimal", "precision": 76}))
    reader = record(("d", {"type": "bytes", "logicalType": "decimal", "precision": precision}))
    top = 10**precision - 1
    ints = [top, -top, top + 1, -top - 1, 0, -1, 2**63, -(2**63)]
    data = frame(writer, [{"d": decimal.Decimal(i)} for i in ints])
    out = decode(writer, data, reader)
    fits = [abs(i) <= top for i in ints]
    assert out.errors.is_null().to_pylist() == fits
    assert out.values.to_pylist() == [
        {"d": decimal.Decimal(i)} if ok else None for i, ok in zip(ints, fits, strict=True)
    ]
    ref = decode_reference(data, json.dumps(writer), json.dumps(reader))
    assert ref.errors.is_null().to_pylist() == fits


def test_buffers_grow_for_long_lists() -> None:
    inner = {"type": "array", "items": "string"}
    schema = record(
        ("rows", {"type": "array", "items": inner}), ("m", {"type": "map", "values": inner})
    )
    records = [
        {"rows": [[f"{i}-{j}-{k}" for k in range(j % 7)] for j in range(i * 40)],
         "m": {str(j): ["x" * j] for j in range(i % 50)}}
        for i in range(60)
    ]  # fmt: skip
    data = frame(schema, records)
    out = decode(schema, data)
    assert out.error_count == 0
    assert out.values.to_pylist() == decode_reference(data, json.dumps(schema)).values.to_pylist()


def test_input_forms() -> None:
    schema = record(("s", "string"))
    data = frame(schema, [{"s": str(i)} for i in range(10)])
    want = [{"s": str(i)} for i in range(10)]
    assert decode(schema, data.cast(pa.large_binary())).values.to_pylist() == want
    assert decode(schema, data.slice(3, 4)).values.to_pylist() == want[3:7]
    bare = pa.array([v[5:] for v in data.to_pylist()], pa.binary())
    assert decode(schema, bare, offsets_skip=0).values.to_pylist() == want
    assert decode(schema, data.slice(0, 0)).values.to_pylist() == []
    with pytest.raises(TypeError, match="binary"):
        compile_decoder(json.dumps(schema)).decode(pa.array(["x"]))


def test_non_record_values_are_wrapped() -> None:
    cases: list[tuple[Any, list[Any]]] = [
        ("string", ["a", "bc"]),
        (["null", "long"], [None, 5]),
        ({"type": "map", "values": "int"}, [{"a": 1}, {}]),
    ]
    for schema, values in cases:
        data = frame(schema, values)
        out = decode(schema, data)
        want = decode_reference(data, json.dumps(schema))
        assert out.values.to_pylist() == want.values.to_pylist()
        assert out.values.type.names == ["value"]


def test_type_mismatch_fails_rows_not_the_compile() -> None:
    writer = record(("v", "string"))
    out = decode(writer, frame(writer, [{"v": "x"}]), record(("v", "int")))
    assert out.errors.to_pylist() == [
        "writer string cannot be read as reader int at /v (at byte 5 of 7)"
    ]


def test_warm_decodes_both_input_flavours() -> None:
    assert warm() == 8


def test_null_inputs_fail_even_when_their_slot_has_bytes() -> None:
    schema = record(("s", "string"))
    good = frame(schema, [{"s": "a"}, {"s": "b"}]).to_pylist()
    # An Arrow binary array whose null slot spans bytes (Arrow allows it).
    raw = good[0] + good[1] + good[1]
    offsets = np.array([0, len(good[0]), len(good[0]) + len(good[1]), len(raw)], np.int32)
    validity = np.packbits(np.array([1, 0, 1], np.bool_), bitorder="little")
    data = pa.Array.from_buffers(
        pa.binary(), 3, [pa.py_buffer(validity), pa.py_buffer(offsets), pa.py_buffer(raw)], 1
    )
    out = decode(schema, data)
    assert out.values.to_pylist() == [{"s": "a"}, None, {"s": "b"}]
    assert out.errors.to_pylist() == [None, "value is null", None]


def test_string_check_matches_python_utf8_around_the_ascii_fast_path() -> None:
    # The kernel tests a string for all-ASCII first (an OR over its bytes) and walks only the
    # others; a bad byte anywhere in a long ASCII run (vector body or tail) must still fail.
    schema = record(("s", "string"))
    cases = [b"", b"a" * 100, "é".encode(), b"\xed\xa0\x80", b"\xc0\xaf", b"\x80"]
    for at in (0, 7, 8, 15, 16, 31, 32, 63, 99):
        for bad in (b"\xff", b"\x80", "é".encode(), "\U0001f600".encode(), b"\xe2\x82"):
            s = bytearray(b"x" * 100)
            s[at : at + len(bad)] = bad
            cases.append(bytes(s[:100]))
    values = [HEADER + encode_varlong(len(c)) + c for c in cases]
    out = decode(schema, pa.array(values, pa.binary()))

    def valid(c: bytes) -> bool:
        try:
            c.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return True

    assert [e is None for e in out.errors.to_pylist()] == [valid(c) for c in cases]
    assert sum(valid(c) for c in cases) not in (0, len(cases))
    got = out.values.to_pylist()
    for c, v in zip(cases, got, strict=True):
        assert v == ({"s": c.decode("utf-8")} if valid(c) else None)
