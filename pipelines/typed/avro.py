"""Avro -> Arrow, the interface of the vectorised decoder, backed here by fastavro per record.

Stand-in for helper ``avro``'s compiled decoder (same interface; replaced at merge). Mapping:
boolean, int (int32), long (int64), float, double, bytes/fixed (binary), string, enum
(string), record (struct), array (list), map (map<string, V>), a union with null (the other
branch, nullable), other unions (a struct of branches named by type, one set), logical types:
date (date32), time-millis (time32[ms]), time-micros (time64[us]), timestamp-millis/micros
(timestamp UTC), local-timestamp-millis/micros (timestamp, no zone), decimal (decimal128),
uuid (string).
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from fastavro import parse_schema, schemaless_reader

__all__ = ["AvroDecoder", "Decoded", "arrow_type", "compile_decoder"]

_PRIMITIVE = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
    "null": pa.null(),
}
_LOGICAL = {
    "date": pa.date32(),
    "time-millis": pa.time32("ms"),
    "time-micros": pa.time64("us"),
    "timestamp-millis": pa.timestamp("ms", tz="UTC"),
    "timestamp-micros": pa.timestamp("us", tz="UTC"),
    "local-timestamp-millis": pa.timestamp("ms"),
    "local-timestamp-micros": pa.timestamp("us"),
    "uuid": pa.string(),
}


@dataclass
class Decoded:
    """``values``: one row per input, null where decoding failed; ``errors``: why, else null."""

    values: pa.StructArray
    errors: pa.StringArray


def _load(schema: str | dict[str, Any] | list[Any]) -> Any:
    return json.loads(schema) if isinstance(schema, str) else schema


def _branch_name(schema: Any) -> str:
    if isinstance(schema, dict):
        name = schema.get("name") or schema["type"]
        return str(name).rsplit(".", 1)[-1]
    return str(schema).rsplit(".", 1)[-1]


def _arrow(schema: Any, named: dict[str, pa.DataType]) -> pa.DataType:
    if isinstance(schema, str):
        return _PRIMITIVE[schema] if schema in _PRIMITIVE else named[schema.rsplit(".", 1)[-1]]
    if isinstance(schema, list):
        rest = [s for s in schema if s != "null"]
        if len(rest) == 1:
            return _arrow(rest[0], named)
        return pa.struct([pa.field(_branch_name(s), _arrow(s, named)) for s in rest])
    kind = schema["type"]
    logical = schema.get("logicalType")
    if logical == "decimal" and kind in ("bytes", "fixed"):
        return pa.decimal128(int(schema["precision"]), int(schema.get("scale", 0)))
    if logical in _LOGICAL:
        return _LOGICAL[logical]
    if kind == "record":
        t = pa.struct(
            [pa.field(f["name"], _arrow(f["type"], named), nullable=True) for f in schema["fields"]]
        )
        named[str(schema["name"]).rsplit(".", 1)[-1]] = t
        return t
    if kind == "enum":
        named[str(schema["name"]).rsplit(".", 1)[-1]] = pa.string()
        return pa.string()
    if kind == "fixed":
        named[str(schema["name"]).rsplit(".", 1)[-1]] = pa.binary()
        return pa.binary()
    if kind == "array":
        return pa.list_(_arrow(schema["items"], named))
    if kind == "map":
        return pa.map_(pa.string(), _arrow(schema["values"], named))
    return _arrow(kind, named)


def arrow_type(schema: str | dict[str, Any] | list[Any]) -> pa.DataType:
    """The Arrow type of the value schema ``schema`` (JSON text or parsed)."""
    return _arrow(_load(schema), {})


def _converter(schema: Any, named: dict[str, Any]) -> Callable[[Any], Any]:
    """Python value from fastavro -> what ``pa.array`` takes for :func:`arrow_type`."""
    if isinstance(schema, str):
        found: Callable[[Any], Any] = named.get(schema.rsplit(".", 1)[-1], _same)
        return found
    if isinstance(schema, list):
        rest = [s for s in schema if s != "null"]
        if len(rest) == 1:
            return _converter(rest[0], named)
        branches = [(_branch_name(s), _converter(s, named), _PY.get(_branch_name(s))) for s in rest]

        def union(v: Any) -> Any:
            if v is None:
                return None
            for name, conv, py in branches:
                if py is None or isinstance(v, py):
                    return {name: conv(v)}
            return None

        return union
    kind = schema["type"]
    if schema.get("logicalType") == "uuid":
        return lambda v: None if v is None else str(v) if isinstance(v, uuid.UUID) else v
    if kind == "record":
        fields = [(f["name"], _converter(f["type"], named)) for f in schema["fields"]]

        def record(v: Any) -> Any:
            return None if v is None else {n: c(v.get(n)) for n, c in fields}

        named[str(schema["name"]).rsplit(".", 1)[-1]] = record
        return record
    if kind == "array":
        item = _converter(schema["items"], named)
        return lambda v: None if v is None else [item(x) for x in v]
    if kind == "map":
        value = _converter(schema["values"], named)
        return lambda v: None if v is None else [(k, value(x)) for k, x in v.items()]
    return _same


def _same(v: Any) -> Any:
    return v


_PY: dict[str, type | tuple[type, ...]] = {
    "boolean": bool,
    "int": int,
    "long": int,
    "float": float,
    "double": float,
    "string": str,
    "bytes": bytes,
}


class AvroDecoder:
    """Decodes values written with one writer schema into the reader schema's shape."""

    def __init__(self, writer_schema: str, reader_schema: str | None = None) -> None:
        reader = _load(reader_schema if reader_schema is not None else writer_schema)
        self._writer = parse_schema(_load(writer_schema))
        self._reader = parse_schema(reader)
        self.arrow_type: pa.DataType = arrow_type(reader)
        self._convert = _converter(reader, {})

    def decode(self, data: pa.BinaryArray | pa.LargeBinaryArray, offsets_skip: int = 5) -> Decoded:
        """One row per element of ``data`` (its first ``offsets_skip`` bytes skipped)."""
        rows: list[Any] = []
        errors: list[str | None] = []
        for item in data.to_pylist():
            try:
                if item is None:
                    raise ValueError("null value")
                buf = io.BytesIO(item[offsets_skip:])
                value = schemaless_reader(buf, self._writer, self._reader)
                if buf.tell() != len(item) - offsets_skip:
                    raise ValueError(
                        f"{len(item) - offsets_skip - buf.tell()} bytes left after the record"
                    )
                rows.append(self._convert(value))
                errors.append(None)
            except Exception as exc:
                rows.append(None)
                errors.append(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        try:
            values = pa.array(rows, type=self.arrow_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            values, errors = self._one_by_one(rows, errors)
        return Decoded(values, pa.array(errors, type=pa.string()))

    def _one_by_one(
        self, rows: list[Any], errors: list[str | None]
    ) -> tuple[pa.StructArray, list[str | None]]:
        for i, row in enumerate(rows):
            try:
                pa.array([row], type=self.arrow_type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
                rows[i] = None
                errors[i] = f"type mismatch: {exc}"
        return pa.array(rows, type=self.arrow_type), errors


def compile_decoder(writer_schema: str, reader_schema: str | None = None) -> AvroDecoder:
    """A decoder of values written with ``writer_schema``, read as ``reader_schema``."""
    return AvroDecoder(writer_schema, reader_schema)
