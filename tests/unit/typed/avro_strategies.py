"""Hypothesis strategies for the Avro decoder's tests: random schemas and records.

Schemas: records nesting records, arrays, maps, enums, fixed, unions and every logical type
the decoder maps (date, time-millis/micros, timestamp-millis/micros,
local-timestamp-millis/micros, decimal on bytes and on fixed up to decimal256, uuid,
duration). Records: values fastavro's writer accepts for them. Union branches come from
different Python kinds (the reference decoder picks a union-as-struct branch from the Python
type fastavro returns, see ``decode_reference``).
"""

from __future__ import annotations

import datetime
import decimal
import itertools
import math
from typing import Any

from hypothesis import strategies as st

__all__ = ["record_schemas", "values_of", "with_evolution"]

_LEAVES: list[Any] = [
    "null",
    "boolean",
    "int",
    "long",
    "float",
    "double",
    "bytes",
    "string",
    {"type": "int", "logicalType": "date"},
    {"type": "int", "logicalType": "time-millis"},
    {"type": "long", "logicalType": "time-micros"},
    {"type": "long", "logicalType": "timestamp-millis"},
    {"type": "long", "logicalType": "timestamp-micros"},
    {"type": "long", "logicalType": "local-timestamp-millis"},
    {"type": "long", "logicalType": "local-timestamp-micros"},
    {"type": "string", "logicalType": "uuid"},
]
# Branch groups for unions: one Avro base type and one Python kind each. Never a branch that a
# promotion reaches before the writer's own type (string + bytes, double before int): there
# the decoder takes the exact branch (as Java's Avro does) and fastavro the first promotable.
_UNION_LEAVES = ["boolean", "int", "double", "string", "bytes"]


def _decimal(draw: Any, counter: Any) -> dict[str, Any]:
    precision = draw(st.integers(1, 42))
    scale = draw(st.integers(0, min(precision, 6)))
    if draw(st.booleans()):
        return {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale}
    size = math.ceil((precision * math.log2(10) + 1) / 8)
    return {
        "type": "fixed", "name": f"D{next(counter)}", "size": size,
        "logicalType": "decimal", "precision": precision, "scale": scale,
    }  # fmt: skip


@st.composite
def _schema(draw: Any, counter: Any, depth: int) -> Any:
    choice = draw(st.integers(0, 9 if depth < 3 else 3))
    if choice <= 1:
        return draw(st.sampled_from(_LEAVES))
    if choice == 2:
        return _decimal(draw, counter)
    if choice == 3:
        kind = draw(st.sampled_from(["enum", "fixed", "duration"]))
        if kind == "enum":
            n = draw(st.integers(1, 4))
            return {
                "type": "enum",
                "name": f"E{next(counter)}",
                "symbols": [f"S{i}" for i in range(n)],
            }
        if kind == "duration":
            return {
                "type": "fixed",
                "name": f"X{next(counter)}",
                "size": 12,
                "logicalType": "duration",
            }
        return {"type": "fixed", "name": f"F{next(counter)}", "size": draw(st.integers(0, 5))}
    if choice in (4, 5):
        return draw(_record(counter, depth + 1))
    if choice == 6:
        return {"type": "array", "items": draw(_schema(counter, depth + 1))}
    if choice == 7:
        return {"type": "map", "values": draw(_schema(counter, depth + 1))}
    # a union: null and one branch (the common nullable column), or several branches
    if draw(st.booleans()):
        inner = draw(_schema(counter, depth + 1).filter(lambda s: not isinstance(s, list)))
        if inner == "null":
            return ["null"]
        return ["null", inner] if draw(st.booleans()) else [inner, "null"]
    groups = draw(st.lists(st.sampled_from([*_UNION_LEAVES, "record", "array"]), min_size=2,
                           max_size=4, unique=True))  # fmt: skip
    if "string" in groups and "bytes" in groups:
        groups.remove("bytes")  # see _UNION_ORDER
    if "int" in groups and "double" in groups and groups.index("double") < groups.index("int"):
        groups.remove("double")
        groups.append("double")
    branches: list[Any] = []
    for g in groups:
        if g == "record":
            branches.append(draw(_record(counter, depth + 1)))
        elif g == "array":
            branches.append({"type": "array", "items": draw(st.sampled_from(_UNION_LEAVES))})
        else:
            branches.append(g)
    if draw(st.booleans()):
        branches.insert(draw(st.integers(0, len(branches))), "null")
    return branches


@st.composite
def _record(draw: Any, counter: Any, depth: int) -> dict[str, Any]:
    n = draw(st.integers(0 if depth else 1, 5))
    fields = [{"name": f"f{i}", "type": draw(_schema(counter, depth))} for i in range(n)]
    return {"type": "record", "name": f"R{next(counter)}", "fields": fields}


@st.composite
def record_schemas(draw: Any) -> dict[str, Any]:
    """A random record schema (fresh names each draw)."""
    schema: dict[str, Any] = draw(_record(itertools.count(), 0))
    return schema


def _kind(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, str):
        return schema
    return str(schema.get("logicalType") or schema["type"])


_UTC = datetime.UTC
_CTX = decimal.Context(prec=100)
_MIN = datetime.datetime(1900, 1, 1)
_MAX = datetime.datetime(2200, 1, 1)


def values_of(schema: Any) -> st.SearchStrategy[Any]:
    """Values fastavro's writer accepts for ``schema``."""
    kind = _kind(schema)
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "int":
        return st.integers(-(2**31), 2**31 - 1)
    if kind == "long":
        return st.integers(-(2**63), 2**63 - 1)
    if kind == "float":
        return st.floats(width=32, allow_nan=False)
    if kind == "double":
        return st.floats(allow_nan=False)
    if kind == "bytes":
        return st.binary(max_size=12)
    if kind == "string":
        return st.text(max_size=8)
    if kind == "date":
        return st.dates()
    if kind == "time-millis":
        return st.times().map(lambda t: t.replace(microsecond=t.microsecond // 1000 * 1000))
    if kind == "time-micros":
        return st.times()
    if kind in ("timestamp-millis", "local-timestamp-millis", "timestamp-micros",
                "local-timestamp-micros"):  # fmt: skip
        ts = st.datetimes(_MIN, _MAX)
        if "millis" in kind:
            ts = ts.map(lambda t: t.replace(microsecond=t.microsecond // 1000 * 1000))
        return ts.map(lambda t: t.replace(tzinfo=_UTC)) if kind.startswith("timestamp") else ts
    if kind == "uuid":
        return st.uuids()
    if kind == "decimal":
        p, s = schema["precision"], schema["scale"]
        return st.integers(-(10**p - 1), 10**p - 1).map(
            lambda i: decimal.Decimal(i).scaleb(-s, _CTX)
        )
    if kind == "enum":
        return st.sampled_from(schema["symbols"])
    if kind in ("fixed", "duration"):
        return st.binary(min_size=schema["size"], max_size=schema["size"])
    if kind == "array":
        return st.lists(values_of(schema["items"]), max_size=4)
    if kind == "map":
        return st.dictionaries(st.text(max_size=4), values_of(schema["values"]), max_size=3)
    if kind == "record":
        return st.fixed_dictionaries({f["name"]: values_of(f["type"]) for f in schema["fields"]})
    if kind == "union":
        return st.one_of([values_of(b) for b in schema])
    raise AssertionError(f"no values for {schema!r}")


@st.composite
def with_evolution(draw: Any) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """A record schema (the writer) and a compatible reader: fields added with defaults,
    fields dropped, ints promoted (int->long/float/double, long->float/double,
    float->double, string->bytes), fields made nullable (read through a reader union), enums
    given more symbols, fields reordered."""
    writer = draw(record_schemas())
    fields = [dict(f) for f in writer["fields"]]
    changes = []
    promotions = {
        "int": ["long", "float", "double"], "long": ["float", "double"], "float": ["double"],
        "string": ["bytes"],
    }  # fmt: skip
    out = []
    for f in fields:
        action = draw(st.sampled_from(["keep", "keep", "drop", "promote", "nullable"]))
        if action == "drop":
            changes.append(f"drop {f['name']}")
            continue
        if action == "promote" and isinstance(f["type"], str) and f["type"] in promotions:
            new = draw(st.sampled_from(promotions[f["type"]]))
            changes.append(f"{f['name']}: {f['type']} -> {new}")
            f["type"] = new
        elif action == "nullable" and not isinstance(f["type"], list) and f["type"] != "null":
            f["type"] = ["null", f["type"]]  # a writer value re-resolved into a reader union
            changes.append(f"{f['name']}: nullable")
        elif action == "promote" and isinstance(f["type"], dict) and f["type"]["type"] == "enum":
            f["type"] = {**f["type"], "symbols": [*f["type"]["symbols"], "NEW"]}
            changes.append(f"{f['name']}: enum + NEW")
        out.append(f)
    for i in range(draw(st.integers(0, 3))):
        default = draw(st.sampled_from([
            ("int", 7), ("string", "dflt"), (["null", "long"], None), ("double", 1.5),
            ({"type": "array", "items": "int"}, [1, 2]), ("bytes", "ab\u0000"),
            ({"type": "map", "values": "string"}, {"a": "b"}),
            ({"type": "enum", "name": f"NewE{i}", "symbols": ["A", "B"]}, "B"),
            ({"type": "record", "name": f"NewR{i}", "fields": [{"name": "x", "type": "int"}]},
             {"x": 3}),
            ({"type": "long", "logicalType": "timestamp-millis"}, 1_700_000_000_000),
        ]))  # fmt: skip
        out.insert(draw(st.integers(0, len(out))), {"name": f"added{i}", "type": default[0],
                                                     "default": default[1]})  # fmt: skip
        changes.append(f"add added{i} default {default[1]!r}")
    if draw(st.booleans()):
        out.reverse()
        changes.append("reorder")
    return writer, {**writer, "fields": out}, changes
