"""Protobuf -> Arrow: Confluent's Protobuf framing and messages decoded into a struct column.

Framing (Confluent's wire format for Protobuf): after the magic byte and the schema id, the
*message indexes*: a zigzag varint count, then that many zigzag varints, the path of the
message in the schema's file (``[1, 0]``: the first nested message of the second top-level
one); the single byte ``0`` stands for ``[0]``, the first message. Then the message bytes.

Schema: the registered text is a base64 ``FileDescriptorProto`` (what confluent-kafka's
``ProtobufSerializer`` registers), parsed by :func:`logstore.registry.formats.parse` with its
references; the well-known files protobuf ships fill in the imports no reference supplies.
The table's shape is the newest schema's first message (the message ``[0]``); a record whose
indexes name another message is a dead letter. Records of older versions are parsed with the
newest version's message: Protobuf is compatible by field number, so added fields read as
unset and removed ones are skipped, which is the resolution Protobuf defines.

Mapping: double/float -> float64/float32; int32, sint32, sfixed32 -> int32; int64, sint64,
sfixed64 -> int64; uint32, fixed32 -> uint32; uint64, fixed64 -> uint64 (Delta: long and
decimal(20, 0)); bool; string; bytes -> binary; enum -> string (the value's name); message ->
struct (null when unset); repeated -> list; map -> map; a oneof -> a struct named after the
oneof with one field per branch (only the set one non-null; proto3 ``optional`` is a plain
nullable field); well-known types: Timestamp -> timestamp UTC, Duration -> long microseconds,
the wrappers (Int64Value, StringValue, ...) -> the wrapped type, nullable; Struct, Value,
ListValue, Any -> string (their JSON). Scalars of proto3 without presence read as their
default when absent (0, "", false), as every Protobuf reader does.

Decoding: protobuf's own parser (upb, C) parses each record; a walk of the message then builds
the row. This is per record: no library here decodes a batch of Protobuf messages into Arrow
(``protarrow`` converts already-parsed messages, still one Python object per record), and a
hand-written wire decoder would be a second Protobuf implementation to keep right. Measured in
``tests/perf/bench_decode_protobuf.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from logstore.registry.formats import parse
from pipelines.typed.registry import RegisteredSchema

__all__ = ["ProtobufDecoded", "ProtobufDecoder", "compile_protobuf", "message_indexes"]

_F = FieldDescriptor
_SCALARS = {
    _F.TYPE_DOUBLE: pa.float64(),
    _F.TYPE_FLOAT: pa.float32(),
    _F.TYPE_INT32: pa.int32(),
    _F.TYPE_SINT32: pa.int32(),
    _F.TYPE_SFIXED32: pa.int32(),
    _F.TYPE_INT64: pa.int64(),
    _F.TYPE_SINT64: pa.int64(),
    _F.TYPE_SFIXED64: pa.int64(),
    _F.TYPE_UINT32: pa.uint32(),
    _F.TYPE_FIXED32: pa.uint32(),
    _F.TYPE_UINT64: pa.uint64(),
    _F.TYPE_FIXED64: pa.uint64(),
    _F.TYPE_BOOL: pa.bool_(),
    _F.TYPE_STRING: pa.string(),
    _F.TYPE_BYTES: pa.binary(),
}
_WRAPPERS = {
    f"google.protobuf.{n}": t
    for n, t in [
        ("DoubleValue", pa.float64()),
        ("FloatValue", pa.float32()),
        ("Int64Value", pa.int64()),
        ("UInt64Value", pa.uint64()),
        ("Int32Value", pa.int32()),
        ("UInt32Value", pa.uint32()),
        ("BoolValue", pa.bool_()),
        ("StringValue", pa.string()),
        ("BytesValue", pa.binary()),
    ]
}
_JSON_TYPES = {
    "google.protobuf.Struct",
    "google.protobuf.Value",
    "google.protobuf.ListValue",
    "google.protobuf.Any",
}


def message_indexes(data: bytes, start: int) -> tuple[list[int], int]:
    """The message indexes at ``data[start:]`` and the position after them."""

    def varint(pos: int) -> tuple[int, int]:
        shift = result = 0
        while True:
            if pos >= len(data):
                raise ValueError("truncated message indexes")
            b = data[pos]
            result |= (b & 0x7F) << shift
            pos += 1
            if not b & 0x80:
                return (result >> 1) ^ -(result & 1), pos
            shift += 7
            if shift > 63:
                raise ValueError("message index varint too long")

    count, pos = varint(start)
    if count == 0:
        return [0], pos
    if count < 0 or count > 100:
        raise ValueError(f"bad message index count {count}")
    out = []
    for _ in range(count):
        value, pos = varint(pos)
        out.append(value)
    return out, pos


def _pool(reader: RegisteredSchema) -> tuple[descriptor_pool.DescriptorPool, Any]:
    """A pool holding ``reader``'s file and its references; (pool, its FileDescriptorProto)."""

    def parsed(schema: RegisteredSchema) -> Any:
        refs = [parsed(r) for r in schema.references.values()]
        return parse("PROTOBUF", schema.text, references=refs)

    top = parsed(reader)
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(name: str) -> None:
        if name in added:
            return
        added.add(name)
        fdp = top.named.get(name)
        if fdp is None:  # a well-known file no reference supplies: protobuf's own copy
            fdp = descriptor_pb2.FileDescriptorProto()
            module = name.removesuffix(".proto").replace("/", ".") + "_pb2"
            __import__(module)
            descriptor_pool.Default().FindFileByName(name).CopyToProto(fdp)
        for dep in fdp.dependency:
            add(dep)
        pool.Add(fdp)

    for name in top.named:
        add(name)
    return pool, top.parsed


def _is_map(field: Any) -> bool:
    return bool(field.type == _F.TYPE_MESSAGE and field.message_type.GetOptions().map_entry)


def _repeated(field: Any) -> bool:
    if hasattr(field, "is_repeated"):  # protobuf >= 6 (label is gone)
        return bool(field.is_repeated)
    return bool(field.label == _F.LABEL_REPEATED)


def _real_oneof(field: Any) -> Any:
    """The oneof ``field`` belongs to, None for none or proto3 ``optional``'s synthetic one
    (named ``_<field>``, one field)."""
    oneof = field.containing_oneof
    if oneof is None or (len(oneof.fields) == 1 and oneof.name == f"_{field.name}"):
        return None
    return oneof


def _single(field: Any) -> tuple[pa.DataType, Callable[[Any], Any]]:
    """The type and converter of one (non-repeated) value of ``field``."""
    if field.type == _F.TYPE_ENUM:
        enum = field.enum_type

        def name(v: int) -> str | None:
            value = enum.values_by_number.get(v)
            return value.name if value is not None else str(v)

        return pa.string(), name
    if field.type != _F.TYPE_MESSAGE:
        return _SCALARS[field.type], _same
    full = field.message_type.full_name
    if full == "google.protobuf.Timestamp":
        return pa.timestamp("us", tz="UTC"), lambda m: m.seconds * 1_000_000 + m.nanos // 1000
    if full == "google.protobuf.Duration":
        return pa.int64(), lambda m: m.seconds * 1_000_000 + m.nanos // 1000
    if full in _WRAPPERS:
        return _WRAPPERS[full], lambda m: m.value
    if full in _JSON_TYPES:
        return pa.string(), lambda m: json.dumps(json_format.MessageToDict(m), sort_keys=True)
    return _message(field.message_type)


def _same(v: Any) -> Any:
    return v


def _message(desc: Descriptor) -> tuple[pa.DataType, Callable[[Any], Any]]:
    """The struct type of message ``desc`` and the converter of a message to its row."""
    fields: list[pa.Field] = []
    readers: list[tuple[str, Callable[[Any], Any]]] = []
    oneofs: dict[str, list[tuple[Any, pa.DataType, Callable[[Any], Any]]]] = {}
    for f in desc.fields:
        oneof = _real_oneof(f)
        if _is_map(f):
            ktype, kconv = _single(f.message_type.fields_by_name["key"])
            vtype, vconv = _single(f.message_type.fields_by_name["value"])
            fields.append(pa.field(f.name, pa.map_(ktype, vtype)))
            readers.append((f.name, _map_reader(f.name, kconv, vconv)))
        elif _repeated(f):
            t, conv = _single(f)
            fields.append(pa.field(f.name, pa.list_(t)))
            readers.append((f.name, _list_reader(f.name, conv)))
        elif oneof is not None:
            t, conv = _single(f)
            if oneof.name not in oneofs:
                oneofs[oneof.name] = []
                fields.append(pa.field(oneof.name, pa.null()))  # placeholder, typed below
                readers.append((oneof.name, _same))
            oneofs[oneof.name].append((f, t, conv))
        else:
            t, conv = _single(f)
            fields.append(pa.field(f.name, t))
            present = f.type == _F.TYPE_MESSAGE or f.has_presence
            readers.append((f.name, _field_reader(f.name, conv, present=present)))
    for name, branches in oneofs.items():
        i = [f.name for f in fields].index(name)
        fields[i] = pa.field(name, pa.struct([pa.field(b.name, t) for b, t, _ in branches]))
        readers[i] = (name, _oneof_reader(name, [(b.name, c) for b, _, c in branches]))
    names = [n for n, _ in readers]
    convs = [c for _, c in readers]

    def row(m: Any) -> dict[str, Any]:
        return {n: c(m) for n, c in zip(names, convs, strict=True)}

    return pa.struct(fields), row


def _field_reader(name: str, conv: Callable[[Any], Any], *, present: bool) -> Callable[[Any], Any]:
    if present:
        return lambda m: conv(getattr(m, name)) if m.HasField(name) else None
    return lambda m: conv(getattr(m, name))


def _list_reader(name: str, conv: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda m: [conv(v) for v in getattr(m, name)]


def _map_reader(
    name: str, kconv: Callable[[Any], Any], vconv: Callable[[Any], Any]
) -> Callable[[Any], Any]:
    return lambda m: [(kconv(k), vconv(v)) for k, v in getattr(m, name).items()]


def _oneof_reader(
    name: str, branches: list[tuple[str, Callable[[Any], Any]]]
) -> Callable[[Any], Any]:
    convs = dict(branches)

    def read(m: Any) -> dict[str, Any] | None:
        which = m.WhichOneof(name)
        if which is None:
            return None
        return {b: (convs[b](getattr(m, b)) if b == which else None) for b in convs}

    return read


@dataclass
class ProtobufDecoded:
    """As :class:`pipelines.typed.avro.Decoded`."""

    values: pa.StructArray
    errors: pa.StringArray


class ProtobufDecoder:
    """Decodes Confluent-framed Protobuf payloads into the reader's first message's shape."""

    def __init__(self, reader: RegisteredSchema) -> None:
        pool, fdp = _pool(reader)
        if not fdp.message_type:
            raise ValueError(f"{fdp.name} declares no message")
        self._file = pool.FindFileByName(fdp.name)
        self._desc = self._file.message_types_by_name[fdp.message_type[0].name]
        self._cls = message_factory.GetMessageClass(self._desc)
        self.arrow_type, self._row = _message(self._desc)

    def decode(self, data: pa.BinaryArray, offsets_skip: int = 5) -> ProtobufDecoded:
        """One row per element of ``data`` (message indexes start at ``offsets_skip``)."""
        rows: list[Any] = []
        errors: list[str | None] = []
        for item in data.to_pylist():
            try:
                indexes, pos = message_indexes(item, offsets_skip)
                if indexes != [0]:
                    raise ValueError(
                        f"message indexes {indexes}: not the topic's message {self._desc.full_name}"
                    )
                msg = self._cls.FromString(item[pos:])
                rows.append(self._row(msg))
                errors.append(None)
            except Exception as exc:  # any failure is this record's error
                rows.append(None)
                errors.append(f"{type(exc).__name__}: {exc}")
        return ProtobufDecoded(pa.array(rows, type=self.arrow_type), pa.array(errors, pa.string()))


def compile_protobuf(writer: RegisteredSchema, reader: RegisteredSchema) -> ProtobufDecoder:
    """The decoder of a topic's Protobuf values (any writer version) into ``reader``'s shape."""
    del writer  # compatible by field number: the newest message reads every version
    return ProtobufDecoder(reader)
