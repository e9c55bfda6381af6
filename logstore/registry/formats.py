"""Parsing and reader/writer compatibility of the three schema types: AVRO, JSON, PROTOBUF.

:func:`parse` turns a registered schema's text (plus its already-parsed references) into a
:class:`ParsedSchema` or raises :class:`InvalidSchemaError` (422/42201) with the parser's
message. :func:`read_problems` says why data written with ``writer`` cannot be read with
``reader`` (empty: it can); the compatibility levels are built on it by the store.

- **AVRO**: parsed by ``fastavro.schema.parse_schema`` (references first, into the same named
  types). fastavro 1.13 has no compatibility checker, so :func:`_avro_problems` writes Avro's
  schema resolution rules (specification, "Schema Resolution") over fastavro's parsed form:
  type promotions int->long/float/double, long->float/double, float->double,
  string<->bytes; records match by name, every reader field is in the writer (by name or
  alias) or has a default; enums: every writer symbol is a reader symbol, or the reader has a
  default; fixed: same name and size; unions branch by branch.
- **JSON**: the schema is checked against its metaschema by ``jsonschema``
  (``validator_for(...).check_schema``). Compatibility is a documented subset of
  Confluent's rules: a property whose ``type`` changes (other than integer widened to number
  in the reader) or that the reader newly requires is incompatible; nested ``properties`` and
  ``items`` are compared the same way.
- **PROTOBUF**: accepted as what confluent-kafka's serializers register, a base64-encoded
  ``FileDescriptorProto``, parsed by ``google.protobuf.descriptor_pb2``. ``.proto`` text is
  refused with 42201: the ``protobuf`` Python package has no ``.proto`` parser (only
  ``protoc`` has). Compatibility (a subset of Confluent's): a message present in the writer
  must stay in the reader; a field number present in both keeps a wire-compatible type
  (int32/uint32/int64/uint64/bool, sint32/sint64, string/bytes, fixed32/sfixed32,
  fixed64/sfixed64, or the same type and type name) and its repeated-ness. The rules are
  symmetric, so BACKWARD and FORWARD agree for Protobuf.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import importlib
import json
import re
from typing import Any, Literal

from fastavro.schema import SchemaParseException, UnknownType, parse_schema
from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
)
from google.protobuf.message import DecodeError

from logstore.registry.errors import InvalidSchemaError

__all__ = ["SCHEMA_TYPES", "ParsedSchema", "SchemaType", "canonical", "parse", "read_problems"]

SchemaType = Literal["AVRO", "JSON", "PROTOBUF"]
SCHEMA_TYPES: tuple[SchemaType, ...] = ("JSON", "PROTOBUF", "AVRO")


@dataclasses.dataclass(frozen=True)
class ParsedSchema:
    """A parsed schema: ``parsed`` is fastavro's dict (AVRO), the JSON document (JSON) or a
    ``FileDescriptorProto`` (PROTOBUF); ``named`` the Avro named types it sees (its own and
    those of its references), or for PROTOBUF the files it needs by name (its own last)."""

    schema_type: SchemaType
    parsed: Any
    named: dict[str, Any] = dataclasses.field(default_factory=dict)


def canonical(schema_type: str, text: str) -> str:
    """The form under which two registrations are "the same schema" (same id): JSON without
    insignificant whitespace or key order for AVRO and JSON, the text itself for PROTOBUF."""
    if schema_type == "PROTOBUF":
        return text.strip()
    try:
        return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))
    except ValueError:
        return text


def parse(schema_type: str, text: str, *, references: list[ParsedSchema] = ()) -> ParsedSchema:  # type: ignore[assignment]
    """Parse ``text`` as ``schema_type``; :class:`InvalidSchemaError` with the parser's message."""
    if schema_type == "AVRO":
        return _parse_avro(text, references)
    if schema_type == "JSON":
        return _parse_json(text)
    if schema_type == "PROTOBUF":
        return _parse_protobuf(text, references)
    raise InvalidSchemaError(f"unknown schemaType {schema_type!r} (one of {list(SCHEMA_TYPES)})")


def _parse_avro(text: str, references: list[ParsedSchema]) -> ParsedSchema:
    try:
        doc = json.loads(text)
    except ValueError:
        doc = text  # a bare primitive name such as "string" is an Avro schema too
    _avro_required_attributes(doc)
    named: dict[str, Any] = {}
    for ref in references:
        named.update(ref.named)
    try:
        parsed = parse_schema(doc, named_schemas=named, _write_hint=False)
    except (SchemaParseException, UnknownType, ValueError, TypeError, KeyError) as exc:
        raise InvalidSchemaError(f"{type(exc).__name__}: {exc}") from None
    return ParsedSchema("AVRO", parsed, named)


_AVRO_REQUIRED = {"record": "fields", "error": "fields", "enum": "symbols", "fixed": "size"}


def _avro_required_attributes(doc: Any) -> None:
    """The specification's required attributes fastavro defaults silently (a record without
    ``fields`` parses as an empty record there): refused, as Avro's Java parser does."""
    if isinstance(doc, list):
        for item in doc:
            _avro_required_attributes(item)
    elif isinstance(doc, dict):
        kind = doc.get("type")
        if isinstance(kind, str) and kind in _AVRO_REQUIRED and _AVRO_REQUIRED[kind] not in doc:
            raise InvalidSchemaError(
                f"{kind} {doc.get('name', '?')!r} has no {_AVRO_REQUIRED[kind]!r}"
            )
        for key in ("type", "items", "values"):
            if isinstance(doc.get(key), (dict, list)):
                _avro_required_attributes(doc[key])
        for field in doc.get("fields", ()) if isinstance(doc.get("fields"), list) else ():
            _avro_required_attributes(field)


def _parse_json(text: str) -> ParsedSchema:
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise InvalidSchemaError(f"not JSON: {exc}") from None
    if not isinstance(doc, (dict, bool)):
        raise InvalidSchemaError(f"a JSON schema is an object or a boolean, not {doc!r:.60}")
    # imported here: ~90 ms, and every Spark worker decoding Avro imports this module
    import jsonschema  # type: ignore[import-untyped]  # noqa: PLC0415

    try:
        jsonschema.validators.validator_for(doc).check_schema(doc)
    except jsonschema.SchemaError as exc:
        raise InvalidSchemaError(exc.message) from None
    return ParsedSchema("JSON", doc)


def _parse_protobuf(text: str, references: list[ParsedSchema]) -> ParsedSchema:
    try:
        raw = base64.b64decode(text.strip(), validate=True)
        fd = descriptor_pb2.FileDescriptorProto.FromString(raw)
    except (binascii.Error, ValueError, DecodeError) as exc:
        raise InvalidSchemaError(
            "PROTOBUF schemas are accepted as a base64 FileDescriptorProto (what"
            " confluent-kafka's ProtobufSerializer registers); .proto text needs a parser the"
            f" protobuf Python package does not have ({type(exc).__name__}: {exc})"
        ) from None
    if not fd.message_type and not fd.enum_type:
        raise InvalidSchemaError("the FileDescriptorProto declares no message and no enum")
    # files by name, dependencies first: the references' files, then this one
    files: dict[str, Any] = {}
    for ref in references:
        files.update(ref.named)
    files[fd.name] = fd
    _build_protobuf(files)
    return ParsedSchema("PROTOBUF", fd, files)


def _well_known(name: str) -> Any:
    """The ``FileDescriptorProto`` of a file protobuf ships (``google/protobuf/X.proto`` is the
    module ``google.protobuf.X_pb2``), or 42201."""
    module = name.removesuffix(".proto").replace("/", ".") + "_pb2"
    if re.fullmatch(r"google/protobuf/[a-z_]+(/[a-z_]+)?\.proto", name) is None:
        raise InvalidSchemaError(f"import {name!r}: no reference supplies it")
    try:
        descriptor = importlib.import_module(module).DESCRIPTOR
    except ImportError:
        raise InvalidSchemaError(f"import {name!r}: no reference supplies it") from None
    fdp = descriptor_pb2.FileDescriptorProto()
    descriptor.CopyToProto(fdp)
    return fdp


def _build_protobuf(files: dict[str, Any]) -> None:
    """Build ``files`` into a fresh descriptor pool, as protobuf itself does for generated
    code: unresolved type names, duplicate symbols, bad field numbers are refused (42201).
    A dependency no reference supplies is taken from the well-known types protobuf ships
    (``google/protobuf/timestamp.proto``...: confluent-kafka skips registering those)."""
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(name: str) -> None:
        if name in added:
            return
        added.add(name)
        fdp = files.get(name)
        if fdp is None:
            fdp = _well_known(name)
        for dep in fdp.dependency:
            add(dep)
        try:
            pool.Add(fdp)
        except (TypeError, ValueError) as exc:
            raise InvalidSchemaError(f"{name}: {exc}") from None

    for name in files:
        add(name)


def read_problems(reader: ParsedSchema, writer: ParsedSchema) -> list[str]:
    """Why data written with ``writer`` cannot be read with ``reader`` (empty: it can)."""
    if reader.schema_type != writer.schema_type:
        return [f"schema type changed from {writer.schema_type} to {reader.schema_type}"]
    out: list[str] = []
    if reader.schema_type == "AVRO":
        _avro_problems(
            reader.parsed,
            writer.parsed,
            rn=reader.named,
            wn=writer.named,
            path="/",
            out=out,
            seen=set(),
        )
    elif reader.schema_type == "JSON":
        _json_problems(reader.parsed, writer.parsed, "#", out)
    else:
        _protobuf_problems(reader.parsed, writer.parsed, out)
    return out


# --- Avro: the specification's schema resolution ----------------------------------------------

_PROMOTIONS = {
    "int": {"int", "long", "float", "double"},
    "long": {"long", "float", "double"},
    "float": {"float", "double"},
    "double": {"double"},
    "string": {"string", "bytes"},
    "bytes": {"bytes", "string"},
}


def _avro_resolve(schema: Any, named: dict[str, Any]) -> Any:
    if isinstance(schema, str) and schema in named:
        return named[schema]
    if isinstance(schema, dict) and isinstance(schema.get("type"), (dict, list)):
        return schema["type"]  # {"type": {...}} wrapping
    if isinstance(schema, dict) and schema.get("type") in named and len(schema) == 1:
        return named[schema["type"]]
    return schema


def _avro_kind(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        return str(schema["type"])
    return str(schema)


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _avro_problems(
    r: Any,
    w: Any,
    *,
    rn: dict[str, Any],
    wn: dict[str, Any],
    path: str,
    out: list[str],
    seen: set[tuple[int, int]],
) -> None:
    r, w = _avro_resolve(r, rn), _avro_resolve(w, wn)
    pair = (id(r), id(w))
    if pair in seen:  # a recursive type already being compared
        return
    seen.add(pair)
    rk, wk = _avro_kind(r), _avro_kind(w)
    if wk == "union":
        for i, branch in enumerate(w):
            _avro_problems(
                r, branch, rn=rn, wn=wn, path=f"{path}[writer branch {i}]", out=out, seen=seen
            )
        return
    if rk == "union":
        for branch in r:
            trial: list[str] = []
            _avro_problems(branch, w, rn=rn, wn=wn, path=path, out=trial, seen=set(seen))
            if not trial:
                return
        out.append(f"{path}: reader union has no branch for writer type {wk}")
        return
    if wk in _PROMOTIONS:
        if rk not in _PROMOTIONS[wk]:
            out.append(f"{path}: writer type {wk} cannot be read as {rk}")
        return
    if rk != wk:
        out.append(f"{path}: writer type {wk} cannot be read as {rk}")
        return
    if rk in ("record", "error", "enum", "fixed"):
        rname, wname = r["name"], w["name"]
        aliases = {_short(a) for a in r.get("aliases", ())}
        if _short(rname) != _short(wname) and _short(wname) not in aliases:
            out.append(f"{path}: writer's {wk} {wname} cannot be read as {rname}")
            return
    if rk in ("record", "error"):
        wfields = {f["name"]: f for f in w["fields"]}
        for f in r["fields"]:
            names = [f["name"], *f.get("aliases", ())]
            wf = next((wfields[n] for n in names if n in wfields), None)
            if wf is not None:
                _avro_problems(
                    f["type"],
                    wf["type"],
                    rn=rn,
                    wn=wn,
                    path=f"{path}{f['name']}/",
                    out=out,
                    seen=seen,
                )
            elif "default" not in f:
                out.append(f"{path}{f['name']}: reader field missing from writer, no default")
    elif rk == "enum":
        missing = [s for s in w["symbols"] if s not in r["symbols"]]
        if missing and "default" not in r:
            out.append(f"{path}: reader enum {r['name']} lacks writer symbols {missing}")
    elif rk == "fixed":
        if r["size"] != w["size"]:
            out.append(f"{path}: fixed {r['name']} size {w['size']} read as {r['size']}")
    elif rk == "array":
        _avro_problems(r["items"], w["items"], rn=rn, wn=wn, path=f"{path}[]/", out=out, seen=seen)
    elif rk == "map":
        _avro_problems(
            r["values"], w["values"], rn=rn, wn=wn, path=f"{path}{{}}/", out=out, seen=seen
        )


# --- JSON Schema: a documented subset ---------------------------------------------------------


def _json_types(schema: Any) -> set[str] | None:
    if not isinstance(schema, dict) or "type" not in schema:
        return None
    t = schema["type"]
    return {t} if isinstance(t, str) else set(t)


def _json_problems(r: Any, w: Any, path: str, out: list[str]) -> None:
    rt, wt = _json_types(r), _json_types(w)
    if rt is not None and wt is not None:
        widened = set(rt) | ({"integer"} if "number" in rt else set())
        lost = wt - widened
        if lost:
            out.append(f"{path}: type {sorted(wt)} cannot be read as {sorted(rt)}")
            return
    if not isinstance(r, dict) or not isinstance(w, dict):
        return
    rprops, wprops = r.get("properties", {}), w.get("properties", {})
    new_required = set(r.get("required", ())) - set(w.get("required", ()))
    for name in sorted(new_required):
        out.append(f"{path}/properties/{name}: required by the reader, not by the writer")
    for name in sorted(set(rprops) & set(wprops)):
        _json_problems(rprops[name], wprops[name], f"{path}/properties/{name}", out)
    if isinstance(r.get("items"), dict) and isinstance(w.get("items"), dict):
        _json_problems(r["items"], w["items"], f"{path}/items", out)


# --- Protobuf: a subset of Confluent's rules --------------------------------------------------

_F = descriptor_pb2.FieldDescriptorProto
_WIRE_GROUPS = [
    {_F.TYPE_INT32, _F.TYPE_UINT32, _F.TYPE_INT64, _F.TYPE_UINT64, _F.TYPE_BOOL},
    {_F.TYPE_SINT32, _F.TYPE_SINT64},
    {_F.TYPE_STRING, _F.TYPE_BYTES},
    {_F.TYPE_FIXED32, _F.TYPE_SFIXED32},
    {_F.TYPE_FIXED64, _F.TYPE_SFIXED64},
]


def _messages(fd: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def walk(prefix: str, msgs: Any) -> None:
        for m in msgs:
            name = f"{prefix}.{m.name}"
            out[name] = m
            walk(name, m.nested_type)

    walk(f".{fd.package}" if fd.package else "", fd.message_type)
    return out


def _protobuf_problems(r: Any, w: Any, out: list[str]) -> None:
    rmsgs, wmsgs = _messages(r), _messages(w)
    for name, wm in wmsgs.items():
        rm = rmsgs.get(name)
        if rm is None:
            out.append(f"message {name} removed")
            continue
        rfields = {f.number: f for f in rm.field}
        for wf in wm.field:
            rf = rfields.get(wf.number)
            if rf is None:
                continue  # a removed field reads as unknown: compatible
            same = rf.type == wf.type and rf.type_name == wf.type_name
            grouped = any(rf.type in g and wf.type in g for g in _WIRE_GROUPS)
            if not (same or grouped):
                out.append(f"{name} field {wf.number}: type changed incompatibly")
            if (rf.label == _F.LABEL_REPEATED) != (wf.label == _F.LABEL_REPEATED):
                out.append(f"{name} field {wf.number}: repeated changed")
