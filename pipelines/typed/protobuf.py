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

Decoding: :class:`ProtobufDecoder`, compiled. The message is compiled once into tables
(:mod:`protobuf_compile`) and one numba kernel (:mod:`protobuf_kernel`) decodes the whole
batch into preallocated Arrow buffers: no Python object per record. Why our own wire decoder:
protobuf's parser (upb, C) is fast, but it hands back one Python message per record and the
walk of that message into a row is Python; that path measured 85k records/s for a 7-field
message, slower than the do-it-yourself ``MessageToDict`` per record (92k/s), and no library
here decodes a batch of Protobuf into Arrow (``protarrow`` converts already-parsed messages).
``tests/perf/bench_decode_protobuf.py`` prints the compiled decoder's records/s next to upb's
(same payloads, one core: 8-14x on a shared 2-core machine). The wire rules are
protobuf's: fields in any order, a scalar given twice keeps the last, a message given twice
merges, repeated fields append (packed and unpacked both read), a oneof keeps the branch that
came last, a map key given twice keeps the last entry, unknown fields (and known ones with
another wire type) are skipped by wire type, groups included; invalid UTF-8 in a string, a
truncated field, wire types 4/6/7, a malformed varint and field number 0 fail the row, where
upb fails (one difference: upb skips a field number 0 inside a message with no fields at all;
field number 0 is invalid in protobuf and Java's parser, which Confluent's deserializers use,
always refuses it, so the row fails here). The Struct/Value/ListValue/Any columns keep their
bytes in the kernel and become JSON per value (protobuf's ``MessageToDict``): the only
per-record work, on those columns only.

:class:`UpbDecoder` (upb per record, then a walk of the message) is the reference and the
fallback: :func:`compile_protobuf` uses it for the messages the compiler refuses (proto2
groups and closed enums; a recursive message, which neither can type). The
Hypothesis test ``tests/unit/typed/test_protobuf_property.py`` checks the two against each
other on random message descriptors and messages (serialized by protobuf), merged and unknown
fields, and damaged payloads.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from logstore.registry.formats import parse
from pipelines.decode.arrow import numpy_array
from pipelines.typed import protobuf_kernel as k
from pipelines.typed.arenas import STORE_NONE, Arenas
from pipelines.typed.protobuf_compile import Node, UnsupportedSchemaError, compile_message
from pipelines.typed.registry import RegisteredSchema

__all__ = [
    "ProtobufDecoded",
    "ProtobufDecoder",
    "UnsupportedSchemaError",
    "UpbDecoder",
    "compile_protobuf",
    "message_indexes",
    "warm",
]

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

    @property
    def error_count(self) -> int:
        return int(len(self.errors) - self.errors.null_count)


def _descriptor(reader: RegisteredSchema) -> Descriptor:
    """The descriptor of ``reader``'s first message (Confluent's message ``[0]``)."""
    pool, fdp = _pool(reader)
    if not fdp.message_type:
        raise ValueError(f"{fdp.name} declares no message")
    desc: Descriptor = pool.FindFileByName(fdp.name).message_types_by_name[fdp.message_type[0].name]
    return desc


class UpbDecoder:
    """The reference and fallback: protobuf's parser (upb) per record, then a walk of the
    message into a row. Decodes Confluent-framed payloads into the reader's first message's
    shape."""

    def __init__(self, reader: RegisteredSchema) -> None:
        self.descriptor = _descriptor(reader)
        self._cls = message_factory.GetMessageClass(self.descriptor)
        self.arrow_type, self._row = _message(self.descriptor)

    def decode(self, data: pa.BinaryArray, offsets_skip: int = 5) -> ProtobufDecoded:
        """One row per element of ``data`` (message indexes start at ``offsets_skip``)."""
        rows: list[Any] = []
        errors: list[str | None] = []
        for item in data.to_pylist():
            try:
                if item is None:
                    raise ValueError("value is null")
                indexes, pos = message_indexes(item, offsets_skip)
                if indexes != [0]:
                    raise ValueError(
                        f"message indexes {indexes}: not the topic's message "
                        f"{self.descriptor.full_name}"
                    )
                msg = self._cls.FromString(item[pos:])
                rows.append(self._row(msg))
                errors.append(None)
            except Exception as exc:  # any failure is this record's error
                rows.append(None)
                errors.append(f"{type(exc).__name__}: {exc}")
        try:
            values = pa.array(rows, type=self.arrow_type)
        except (pa.ArrowException, OverflowError, TypeError, ValueError):
            for i, row in enumerate(rows):  # the rows Arrow refuses (microseconds beyond int64)
                try:
                    pa.array([row], type=self.arrow_type)
                except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
                    rows[i] = None
                    errors[i] = f"{type(exc).__name__}: {exc}"
            values = pa.array(rows, type=self.arrow_type)
        return ProtobufDecoded(values, pa.array(errors, pa.string()))


class ProtobufDecoder:
    """The compiled decoder: the reader's first message compiled once
    (:mod:`protobuf_compile`) and a whole batch decoded by one numba pass
    (:mod:`protobuf_kernel`) into preallocated Arrow buffers. Same output as
    :class:`UpbDecoder` (the tested contract), error texts aside. Raises
    :class:`UnsupportedSchemaError` for the messages it does not compile (the caller falls
    back to :class:`UpbDecoder`). Thread-safe: buffers are local to :meth:`decode`."""

    def __init__(self, reader: RegisteredSchema) -> None:
        self.root, self.nodes, self.program = compile_message(_descriptor(reader))
        self.reference = UpbDecoder(reader)
        if self.root.arrow != self.reference.arrow_type:  # the two mappings must agree
            raise UnsupportedSchemaError(
                f"compiled type {self.root.arrow} differs from {self.reference.arrow_type}"
            )
        self.arrow_type: pa.StructType = self.root.arrow
        nn = len(self.nodes)
        self._store = np.array([n.store for n in self.nodes], np.int64)
        self._width = np.zeros(nn, np.int64)
        self._track = np.array([n.nullable for n in self.nodes], np.uint8)
        starts, dummies = [0], []
        for n in self.nodes:
            dummies.extend(_dummy(n))
            starts.append(len(dummies))
        self._dummy_start = np.array(starts, np.int64)
        self._dummy_nodes = np.array(dummies or [0], np.int64)
        self._per_row = np.zeros(nn, np.bool_)  # one entry per row (read by arenas.Arenas)
        self._per_row[_dummy(self.root)] = True
        self._classes = {
            n.id: message_factory.GetMessageClass(n.desc) for n in self.nodes if n.kind == "json"
        }
        self._parent = {c.id: n for n in self.nodes for c in n.children}
        self._checked = [n for n in self.nodes if n.kind in ("json", "timestamp", "duration")]

    def decode(self, data: pa.BinaryArray, offsets_skip: int = 5) -> ProtobufDecoded:
        """One row per element of ``data`` (message indexes start at ``offsets_skip``)."""
        if pa.types.is_large_binary(data.type):
            data = data.cast(pa.binary())
        if not pa.types.is_binary(data.type):
            raise TypeError(f"ProtobufDecoder.decode takes binary values, not {data.type}")
        n = len(data)
        bufs = data.buffers()
        offsets = np.frombuffer(bufs[1], np.int32, n + 1, data.offset * 4).astype(np.int64)
        buf = np.frombuffer(bufs[2] if bufs[2] is not None else b"", np.uint8)
        if n and (offsets.min() < 0 or offsets.max() > len(buf)):
            raise ValueError("binary array offsets point outside its data buffer")
        a = Arenas(
            per_row=self._per_row,
            store=self._store,
            width=self._width,
            rows=n,
            payload=int(offsets[-1] - offsets[0]),
        )
        err_code = np.zeros(n, np.int64)
        err_pos = np.zeros(n, np.int64)
        p = self.program
        # The occurrences of the message frames on the stack (>= 2 bytes each): grown on
        # demand up to the bound of the longest payload, at most depth x length / 2.
        lengths = np.diff(offsets)
        bound = (p.max_depth + 2) * (int(lengths.max(initial=0)) // 2 + 2) + 2
        cap = min(bound, 256 + int(lengths.max(initial=0)) // 4)
        occ, order = np.empty((4, cap), np.int64), np.empty(cap, np.int64)
        row = 0
        while True:
            status, row, full = k.decode_rows(
                p.fields, p.fstart, p.fend, p.lookup_num, p.lookup_row, p.items, p.istart,
                p.iend, p.oneof_rows, p.max_fields, p.max_depth, buf, offsets, offsets_skip,
                row, a.counts, a.dcounts, a.ecap, a.dcap, a.vbase, a.dbase, self._store,
                self._width, self._track, self._dummy_start, self._dummy_nodes, a.vals,
                a.fvals, a.valid, a.data, err_code, err_pos, occ, order,
            )  # fmt: skip
            if status == k.STATUS_DONE:
                break
            if status == k.STATUS_SCRATCH:
                if cap >= bound:
                    raise RuntimeError(f"Protobuf kernel: {cap} occurrences cannot be too few")
                cap = min(bound, 2 * cap)
                occ, order = np.empty((4, cap), np.int64), np.empty(cap, np.int64)
                continue
            a.grow(int(full))
        if data.null_count:  # a null input is a failed row
            nulls = np.flatnonzero(data.is_null().to_numpy(zero_copy_only=False))
            err_code[nulls] = k.ERR_NULL
            err_pos[nulls] = 0
            a.valid[a.vbase[0] + nulls] = 0  # the root has one entry per row, in order
        json = self._check(a, n, err_code)
        values = self._build(self.root, a, json)
        bad = np.flatnonzero(err_code)
        texts = [
            k.ERRORS[k.ERR_NULL]
            if err_code[i] == k.ERR_NULL
            else f"{k.ERRORS[int(err_code[i])]} (at byte {int(err_pos[i])} of "
            f"{int(offsets[i + 1] - offsets[i])})"
            for i in bad
        ]
        where = np.full(n, -1, np.int32)
        where[bad] = np.arange(len(bad), dtype=np.int32)
        errors = pa.array(texts, pa.string()).take(pa.array(where, mask=where < 0))
        return ProtobufDecoded(values, errors)

    def _entry_rows(self, node: Node, a: Arenas, n: int) -> np.ndarray:
        """The row of every entry of ``node`` (a list's items belong to the list's row)."""
        path = [node]
        while path[-1].id in self._parent:
            path.append(self._parent[path[-1].id])
        rows = np.arange(n)
        for up in reversed(path[1:]):
            if up.kind in ("list", "map"):
                lengths = a.vals[a.vbase[up.id] : a.vbase[up.id] + a.counts[up.id]]
                rows = np.repeat(rows, lengths)
        return rows

    def _check(self, a: Arenas, n: int, err_code: np.ndarray) -> dict[int, pa.Array]:
        """The checks the kernel leaves to Python, failing whole rows as upb would: a
        Timestamp or Duration beyond int64 microseconds, and the JSON well-known types, which
        are parsed here (per value: their columns only). Returns the JSON columns."""
        failed: list[np.ndarray] = []
        json: dict[int, pa.Array] = {}
        for node in self._checked:
            i = node.id
            c = int(a.counts[i])
            rows = self._entry_rows(node, a, n)
            if node.kind != "json":
                secs = node.children[0].id
                s = a.vals[a.vbase[secs] : a.vbase[secs] + c]
                big = np.flatnonzero(np.abs(s) > 9_000_000_000_000)  # exact check below
                ns = node.children[1].id
                nanos = a.vals[a.vbase[ns] : a.vbase[ns] + c].astype(np.int32)
                over = [
                    j
                    for j in big.tolist()
                    if not -(2**63) <= int(s[j]) * 1_000_000 + int(nanos[j]) // 1000 < 2**63
                ]
                failed.append(rows[over].astype(np.int64))
                err_code[rows[over]] = k.ERR_TIME_RANGE
                continue
            vals = a.vals[a.vbase[i] : a.vbase[i] + c]
            offs = np.zeros(c + 1, np.int64)
            np.cumsum(vals, out=offs[1:])
            db = int(a.dbase[i])
            present = a.valid[a.vbase[i] : a.vbase[i] + c] if self._track[i] else np.ones(c)
            cls = self._classes[i]
            texts: list[str | None] = []
            bad: list[int] = []
            for j in range(c):
                if not present[j]:
                    texts.append(None)
                    continue
                try:
                    texts.append(
                        _json(cls.FromString(a.data[db + offs[j] : db + offs[j + 1]].tobytes()))
                    )
                except Exception:  # as upb's walk: this row's error
                    texts.append(None)
                    bad.append(j)
            err_code[rows[bad]] = k.ERR_JSON
            failed.append(rows[bad].astype(np.int64))
            json[i] = pa.array(texts, pa.string())
        if failed:
            rows = np.concatenate(failed)
            a.valid[a.vbase[0] + rows] = 0  # the root has one entry per row, in order
        return json

    def _build(self, node: Node, a: Arenas, json: dict[int, pa.Array]) -> pa.Array:
        i = node.id
        c = int(a.counts[i])
        vb = int(a.vbase[i])
        valid = a.valid[vb : vb + c]
        nulls = c - int(np.count_nonzero(valid)) if self._track[i] else 0
        validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
        kind = node.kind
        if kind in ("message", "oneof"):
            children = [self._build(ch, a, json) for ch in node.children]
            return pa.Array.from_buffers(node.arrow, c, [validity], nulls, children=children)
        if kind in ("timestamp", "duration"):
            secs, nanos = (ch for ch in node.children)
            s = a.vals[a.vbase[secs.id] : a.vbase[secs.id] + c]
            ns = a.vals[a.vbase[nanos.id] : a.vbase[nanos.id] + c].astype(np.int32)
            micros = s * 1_000_000 + ns.astype(np.int64) // 1000
            return pa.Array.from_buffers(node.arrow, c, [validity, pa.py_buffer(micros)], nulls)
        if kind == "wrapper":
            inner = self._build(node.children[0], a, json)
            return pa.Array.from_buffers(inner.type, c, [validity, *inner.buffers()[1:]], nulls)
        vals = a.vals[vb : vb + c]
        if kind in ("list", "map", "string", "bytes", "json"):
            offs = np.zeros(c + 1, np.int64)
            np.cumsum(vals, out=offs[1:])
            if offs[-1] >= 2**31:
                raise UnsupportedSchemaError(
                    f"{node.path or '/'}: {int(offs[-1])} bytes/items in one batch exceed "
                    "Arrow's 32-bit offsets; decode smaller batches"
                )
            obuf = pa.py_buffer(offs.astype(np.int32))
            if kind in ("string", "bytes", "json"):
                db = int(a.dbase[i])
                dbuf = pa.py_buffer(a.data[db : db + int(offs[-1])])
                if kind == "json":
                    return json[i]
                return pa.Array.from_buffers(node.arrow, c, [validity, obuf, dbuf], nulls)
            if kind == "list":
                child = self._build(node.children[0], a, json)
            else:
                key, value = (self._build(ch, a, json) for ch in node.children[0].children)
                key, value, offs = _last_per_key(key, value, vals)
                obuf = pa.py_buffer(offs)
                entries = pa.struct([node.arrow.key_field, node.arrow.item_field])
                child = pa.Array.from_buffers(entries, len(key), [None], 0, children=[key, value])
            return pa.Array.from_buffers(node.arrow, c, [validity, obuf], nulls, children=[child])
        if kind == "enum":
            numbers, inverse = np.unique(vals.astype(np.int32), return_inverse=True)
            by_number = node.desc.values_by_number
            names = [by_number[v].name if v in by_number else str(v) for v in numbers.tolist()]
            idx = numpy_array(inverse.astype(np.int32), mask=valid == 0 if nulls else None)
            return pa.array(names, pa.string()).take(idx)
        if kind == "bool":
            bits = pa.py_buffer(np.packbits(vals != 0, bitorder="little"))
            return pa.Array.from_buffers(pa.bool_(), c, [validity, bits], nulls)
        raw_vals: np.ndarray
        if kind in ("float", "double"):
            floats = a.fvals[vb : vb + c]
            raw_vals = floats.astype(np.float32) if kind == "float" else floats
        elif kind in ("int32", "uint32"):
            raw_vals = vals.astype(np.int32)
        else:
            raw_vals = vals
        return pa.Array.from_buffers(node.arrow, c, [validity, pa.py_buffer(raw_vals)], nulls)


def _last_per_key(
    key: pa.Array, value: pa.Array, lengths: np.ndarray
) -> tuple[pa.Array, pa.Array, np.ndarray]:
    """A map's entries with only the last of each key per map (protobuf: a key repeated on
    the wire replaces the entry), and the maps' int32 offsets; vectorised (a group-by)."""
    parent = np.repeat(np.arange(len(lengths)), lengths)
    if len(key) > 1:
        t = pa.table({"p": parent, "k": key, "i": np.arange(len(key))})
        last = t.group_by(["p", "k"], use_threads=False).aggregate([("i", "max")])["i_max"]
        if len(last) < len(key):
            keep = np.sort(last.to_numpy())
            key, value, parent = key.take(keep), value.take(keep), parent[keep]
            lengths = np.bincount(parent, minlength=len(lengths))
    offs = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=offs[1:])
    return key, value, offs


def _json(m: Any) -> str:
    return json.dumps(json_format.MessageToDict(m), sort_keys=True)


def _dummy(node: Node) -> list[int]:
    """``node`` and its struct descendants: the entries a null of ``node`` writes."""
    out = [node.id]
    if node.store == STORE_NONE:
        for c in node.children:
            out.extend(_dummy(c))
    return out


def warm() -> int:
    """Compile the kernel into numba's on-disk cache (``cache=True``) by decoding a tiny
    batch (a string, a packed repeated double, a null, a bad row), so that Spark workers load
    machine code instead of each compiling it. Returns the rows decoded (4)."""
    fdp = descriptor_pb2.FileDescriptorProto(
        name="loglake/warm.proto", package="loglake.warm", syntax="proto3"
    )
    msg = fdp.message_type.add(name="Warm")
    msg.field.add(name="s", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    msg.field.add(name="a", number=2, type=_F.TYPE_DOUBLE, label=_F.LABEL_REPEATED)
    text = base64.b64encode(fdp.SerializeToString()).decode()
    dec = ProtobufDecoder(RegisteredSchema("PROTOBUF", text))
    header = b"\x00\x00\x00\x00\x01\x00"
    raw = [header + b"\x0a\x01h\x12\x08" + bytes(8), None, b"\x00", header + b"\x0f"]
    out = dec.decode(pa.array(raw, pa.binary()))
    if out.values[0].as_py() != {"s": "h", "a": [0.0]} or out.error_count != 3:
        raise RuntimeError(f"Protobuf kernel warm-up decoded {out.values.to_pylist()}")
    return len(out.values)


def compile_protobuf(
    writer: RegisteredSchema, reader: RegisteredSchema
) -> ProtobufDecoder | UpbDecoder:
    """The decoder of a topic's Protobuf values (any writer version) into ``reader``'s shape:
    the compiled one, or upb's where the compiler refuses the message."""
    del writer  # compatible by field number: the newest message reads every version
    try:
        return ProtobufDecoder(reader)
    except UnsupportedSchemaError as exc:
        try:
            return UpbDecoder(reader)
        except RecursionError:  # a recursive message: no Arrow type either way
            raise exc from None
