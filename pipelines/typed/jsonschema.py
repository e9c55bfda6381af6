"""JSON Schema -> Arrow, and JSON payloads decoded a batch at a time by pyarrow's JSON reader.

Mapping (:func:`arrow_type`): ``object`` with ``properties`` -> struct (properties in their
order); ``string`` -> string (``format: date-time`` -> timestamp UTC, ``format: date`` ->
date); ``integer`` -> int64; ``number`` -> float64; ``boolean`` -> bool; ``array`` -> list of
``items``; a ``type`` list with ``null`` -> the other type, nullable; ``$ref`` to
``#/definitions/...`` or ``#/$defs/...`` -> the definition; ``enum`` of strings -> string.
Not mapped (the schema is refused, so its records go to dead letters with the reason): an
object without ``properties`` (free-form maps), ``oneOf``/``anyOf`` of several types.

Decoding (:class:`JsonDecoder`): the payloads (after Confluent's 5-byte header) each get a
newline, the joined buffer goes through ``pyarrow.json.read_json`` with the schema as its
explicit schema (fields the schema does not name are ignored): one C++ pass, no Python object
per record. When that fails (a record that is not JSON, or whose types do not match), the
batch is read record by record to tell the bad records from the good ones, then the good ones
are read together again.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from pipelines.decode.arrow import one_array
from pipelines.typed.registry import RegisteredSchema

__all__ = ["JsonDecoded", "JsonDecoder", "arrow_type", "compile_json"]


class _Unsupported(ValueError):
    pass


def _resolve(node: Any, root: Any) -> Any:
    ref = node.get("$ref") if isinstance(node, dict) else None
    if ref is None:
        return node
    for prefix in ("#/definitions/", "#/$defs/"):
        if ref.startswith(prefix):
            return _resolve(root[prefix[2:-1]][ref[len(prefix) :]], root)
    raise _Unsupported(f"$ref {ref!r}: only local #/definitions/ and #/$defs/ references")


def _arrow(node: Any, root: Any) -> pa.DataType:
    node = _resolve(node, root)
    if not isinstance(node, dict):
        raise _Unsupported(f"schema {node!r}")
    kind = node.get("type")
    if kind is None and "enum" in node:
        return pa.string()
    if kind is None and "properties" in node:
        kind = "object"
    if isinstance(kind, list):
        rest = [k for k in kind if k != "null"]
        if len(rest) != 1:
            raise _Unsupported(f"type {kind!r}: one type (and null) per property")
        kind = rest[0]
    if kind == "object":
        props = node.get("properties")
        if not props:
            raise _Unsupported("an object without properties (a free-form map)")
        return pa.struct([pa.field(name, _arrow(p, root)) for name, p in props.items()])
    if kind == "array":
        return pa.list_(_arrow(node.get("items", {"type": "string"}), root))
    if kind == "string":
        fmt = node.get("format")
        return (
            pa.timestamp("us", tz="UTC")
            if fmt == "date-time"
            else pa.date32()
            if fmt == "date"
            else pa.string()
        )
    simple = {"integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_()}
    if kind in simple:
        return simple[kind]
    raise _Unsupported(f"type {kind!r}")


def arrow_type(schema: str | dict[str, Any]) -> pa.DataType:
    """The Arrow type of a JSON Schema (text or parsed) whose values are objects."""
    doc = json.loads(schema) if isinstance(schema, str) else schema
    t = _arrow(doc, doc)
    if not pa.types.is_struct(t):
        raise _Unsupported("the value schema must describe an object")
    return t


@dataclass
class JsonDecoded:
    """As :class:`pipelines.typed.avro.Decoded`."""

    values: pa.StructArray
    errors: pa.StringArray


class JsonDecoder:
    """Decodes JSON payloads into one schema's struct type."""

    def __init__(self, schema: str) -> None:
        self.arrow_type: pa.DataType = arrow_type(schema)
        self._schema = pa.schema(list(self.arrow_type))
        self._options = pj.ParseOptions(
            explicit_schema=self._schema, unexpected_field_behavior="ignore"
        )

    def _read(self, buf: bytes | pa.Buffer) -> pa.StructArray:
        table = pj.read_json(
            io.BytesIO(buf),
            parse_options=self._options,
            read_options=pj.ReadOptions(use_threads=False),
        )
        table = table.select(self._schema.names).cast(self._schema)
        return pa.StructArray.from_arrays(
            [one_array(c) for c in table.columns], fields=list(self.arrow_type)
        )

    def _joined(self, payloads: pa.BinaryArray) -> pa.Buffer:
        lines = pc.binary_join_element_wise(payloads, pa.scalar(b"\n"), pa.scalar(b""))
        offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32)
        start, end = int(offsets[lines.offset]), int(offsets[lines.offset + len(lines)])
        return lines.buffers()[2][start:end] if end > start else pa.py_buffer(b"")

    def decode(self, data: pa.BinaryArray, offsets_skip: int = 5) -> JsonDecoded:
        """One row per element of ``data`` (its first ``offsets_skip`` bytes skipped)."""
        payloads = pc.binary_slice(data.cast(pa.binary()), offsets_skip, 2**31 - 1)
        n = len(payloads)
        try:
            values = self._read(self._joined(payloads)) if n else pa.nulls(0, self.arrow_type)
            if len(values) == n:
                return JsonDecoded(values, pa.nulls(n, pa.string()))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
        # the slow path: some record is bad; find which, one by one
        errors: list[str | None] = []
        for i in range(n):
            try:
                one = payloads.slice(i, 1)
                if len(self._read(self._joined(one))) != 1:
                    raise ValueError("not one JSON object")
                errors.append(None)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
                errors.append(f"JSON does not match the schema: {exc}")
        ok = pa.array([e is None for e in errors])
        good = self._read(self._joined(payloads.filter(ok))) if pc.any(ok).as_py() else None
        rows = np.cumsum(np.asarray(ok)) - 1
        if good is None:
            values = pa.nulls(n, self.arrow_type)
        else:
            values = good.take(pa.array(np.where(np.asarray(ok), rows, 0)))
            values = pc.if_else(ok, values, pa.scalar(None, self.arrow_type))
        return JsonDecoded(values, pa.array(errors, type=pa.string()))


def compile_json(reader: RegisteredSchema) -> JsonDecoder:
    """The decoder of a topic's JSON values into its newest schema's shape (JSON has no
    writer/reader resolution: every record is read as the newest schema)."""
    return JsonDecoder(reader.text)
