"""Avro schemas -> Arrow types and decoder programs (the kernel's instructions).

Two steps, both pure functions of the schemas:

1. :func:`reader_tree` maps the reader schema onto a tree of :class:`Node` (one per Arrow
   array the decoder builds) with the Arrow type of each; the mapping is documented in
   :mod:`pipelines.typed.avro`.
2. :func:`compile_program` walks the *writer* schema alongside that tree and emits the
   instructions of :mod:`pipelines.typed.avro_kernel`, applying Avro's schema resolution
   (specification, "Schema Resolution"): writer fields the reader lacks are read and
   discarded; reader fields the writer lacks are filled from their defaults after the kernel
   ran (``Program.defaults``); int->long->float->double and string<->bytes are promoted;
   unions are resolved branch by branch (the first reader branch of the same type, else the
   first that a promotion reaches); enum symbols map by name (or to the reader's default).
   A writer branch the reader cannot read becomes an ``OP_ERROR``: only the rows that take
   it fail, as Avro's readers fail at read time.

Schemas arrive as fastavro's parsed form (``logstore.registry.formats.parse``): full names,
named types defined once and then referenced by name. Recursive types are refused
(:class:`UnsupportedSchemaError`): Arrow types are finite trees.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pyarrow as pa

from logstore.errors import LoglakeError
from pipelines.typed import arenas
from pipelines.typed import avro_kernel as k

__all__ = ["Node", "Program", "UnsupportedSchemaError", "compile_program", "reader_tree"]

_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
_NAMED = {"record", "error", "enum", "fixed"}


class UnsupportedSchemaError(LoglakeError):
    """A valid Avro schema that has no Arrow form (a recursive type) or that the decoder
    cannot read with the given reader schema at all."""


@dataclasses.dataclass(eq=False)
class Node:
    """One Arrow array of the output: ``kind`` is the Avro type (or ``"union"`` for a union
    read as a struct of branches), ``schema`` its resolved Avro schema (a dict or a primitive
    name), ``children`` the struct fields / list item / map key and value."""

    kind: str
    arrow: pa.DataType
    schema: Any
    path: str
    logical: str | None = None
    nullable: bool = False
    names: list[str] = dataclasses.field(default_factory=list)  # struct field names
    children: list[Node] = dataclasses.field(default_factory=list)
    symbols: list[str] = dataclasses.field(default_factory=list)
    width: int = 0  # bytes per entry of fixed / decimal nodes
    has_null: bool = False  # a union read as a struct that also has a null branch
    id: int = -1

    @property
    def store(self) -> int:
        if self.kind in ("record", "union", "null"):
            return arenas.STORE_NONE
        if self.kind == "fixed" or self.logical == "decimal":
            return arenas.STORE_FIXED
        if self.kind in ("bytes", "string"):
            return arenas.STORE_BIN
        if self.kind in ("array", "map"):
            return arenas.STORE_LIST
        return arenas.STORE_VALS


def _resolve(schema: Any, named: dict[str, Any]) -> Any:
    """A named type's definition for its name; anything else unchanged."""
    if isinstance(schema, str) and schema not in _PRIMITIVES:
        if schema not in named:
            raise UnsupportedSchemaError(f"unknown Avro type name {schema!r}")
        return named[schema]
    return schema


def _kind(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, str):
        return schema
    kind = schema["type"]
    if isinstance(kind, (dict, list)):
        return _kind(kind)
    return "record" if kind == "error" else str(kind)


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _logical(schema: Any) -> str | None:
    """The logical type the Arrow type follows, or None (Avro ignores invalid ones)."""
    if not isinstance(schema, dict):
        return None
    lt = schema.get("logicalType")
    kind = _kind(schema)
    valid = {
        "date": ("int",),
        "time-millis": ("int",),
        "time-micros": ("long",),
        "timestamp-millis": ("long",),
        "timestamp-micros": ("long",),
        "local-timestamp-millis": ("long",),
        "local-timestamp-micros": ("long",),
        "uuid": ("string",),
        "decimal": ("bytes", "fixed"),
        "duration": ("fixed",),
    }
    if lt not in valid or kind not in valid[lt]:
        return None
    if lt == "decimal":
        p, s = schema.get("precision"), schema.get("scale", 0)
        if not isinstance(p, int) or not isinstance(s, int) or p < 1 or not 0 <= s <= p:
            return None
        if p > 76:  # beyond Arrow's widest decimal: the base type's column, bytes as written
            return None
        if kind == "fixed" and schema["size"] * 8 - 1 < p * 3.32192809488736:
            return None  # the fixed cannot hold the precision: Avro ignores the logical type
    if lt == "duration" and schema.get("size") != 12:
        return None
    return str(lt)


_SCALARS = {
    "null": pa.null(),
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
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


def reader_tree(schema: Any, named: dict[str, Any]) -> Node:
    """The tree of nodes for a parsed reader schema, ids in depth-first order from 0. The
    root is always a struct: the record itself, or a wrapper (``schema`` None) with one
    field ``value`` around any other type."""
    root = _node(schema, named, path="", stack=())
    if root.kind != "record":
        field = pa.field("value", root.arrow, nullable=root.nullable)
        root = Node("record", pa.struct([field]), None, "", names=["value"], children=[root])
    nodes: list[Node] = []

    def number(n: Node) -> None:
        n.id = len(nodes)
        nodes.append(n)
        for c in n.children:
            number(c)

    number(root)
    return root


def _node(schema: Any, named: dict[str, Any], *, path: str, stack: tuple[str, ...]) -> Node:
    schema = _resolve(schema, named)
    kind = _kind(schema)
    if kind == "union":
        return _union_node(schema, named, path=path, stack=stack)
    logical = _logical(schema)
    if logical == "decimal":  # on bytes or fixed: 16 or 32 little-endian bytes per value
        p, s = schema["precision"], schema.get("scale", 0)
        arrow = pa.decimal128(p, s) if p <= 38 else pa.decimal256(p, s)
        return Node(kind, arrow, schema, path, logical, width=16 if p <= 38 else 32)
    if kind in _SCALARS:
        arrow = _LOGICAL.get(logical or "", _SCALARS[kind])
        return Node(kind, arrow, schema, path, logical, nullable=kind == "null")
    if kind == "fixed":
        size = int(schema["size"])
        return Node(kind, pa.binary(size), schema, path, logical, width=size)
    if kind == "enum":
        return Node(kind, pa.string(), schema, path, symbols=list(schema["symbols"]))
    if kind == "array":
        item = _node(schema["items"], named, path=f"{path}[]", stack=stack)
        arrow = pa.list_(pa.field("item", item.arrow, nullable=item.nullable))
        return Node(kind, arrow, schema, path, children=[item])
    if kind == "map":
        key = Node("string", pa.string(), "string", f"{path}{{key}}")
        value = _node(schema["values"], named, path=f"{path}{{}}", stack=stack)
        arrow = pa.map_(pa.string(), pa.field("value", value.arrow, nullable=value.nullable))
        return Node(kind, arrow, schema, path, children=[key, value])
    if kind == "record":
        name = schema["name"]
        if name in stack:
            raise UnsupportedSchemaError(
                f"recursive Avro schema: {name} contains itself at {path or '/'}"
                " (Arrow types cannot recurse)"
            )
        children, fields = [], []
        for f in schema["fields"]:
            child = _node(f["type"], named, path=f"{path}/{f['name']}", stack=(*stack, name))
            children.append(child)
            fields.append(pa.field(f["name"], child.arrow, nullable=child.nullable))
        names = [f["name"] for f in schema["fields"]]
        return Node("record", pa.struct(fields), schema, path, names=names, children=children)
    raise UnsupportedSchemaError(f"unknown Avro type {kind!r} at {path or '/'}")


def _union_node(
    branches: list[Any], named: dict[str, Any], *, path: str, stack: tuple[str, ...]
) -> Node:
    others = [b for b in branches if _kind(_resolve(b, named)) != "null"]
    has_null = len(others) < len(branches)
    if not others:
        return Node("null", pa.null(), "null", path, nullable=True)
    if len(others) == 1:
        node = _node(others[0], named, path=path, stack=stack)
        node.nullable = has_null or node.nullable
        return node
    children = [
        _node(b, named, path=f"{path}<member{i}>", stack=stack) for i, b in enumerate(others)
    ]
    for c in children:
        c.nullable = True  # one branch is set, the others are null
    names = [f"member{i}" for i in range(len(children))]
    arrow = pa.struct(
        [pa.field(n, c.arrow, nullable=True) for n, c in zip(names, children, strict=True)]
    )
    return Node(
        "union", arrow, others, path, nullable=has_null, names=names, children=children,
        has_null=has_null,
    )  # fmt: skip


@dataclasses.dataclass
class Program:
    """What the kernel runs for one (writer, reader) pair; see :mod:`avro_kernel`."""

    prog: np.ndarray  # int64[n, 4]
    enum_maps: np.ndarray  # int64
    messages: list[str]  # OP_ERROR message texts (error code ERR_SCHEMA + index)
    defaults: dict[int, Any]  # node id -> the Avro default (JSON form) of a reader-only field
    max_depth: int  # deepest nesting of arrays and maps


class _Emitter:
    def __init__(self, wnamed: dict[str, Any], rnamed: dict[str, Any]) -> None:
        self.wnamed, self.rnamed = wnamed, rnamed
        self.code: list[list[int]] = []
        self.enum_maps: list[int] = []
        self.messages: list[str] = []
        self.defaults: dict[int, Any] = {}
        self.written: set[int] = set()  # reader fields some writer record fills
        self.max_depth = 0

    def op(self, op: int, a: int = -1, b: int = 0, c: int = 0) -> int:
        self.code.append([op, a, b, c])
        return len(self.code) - 1

    def error(self, message: str) -> None:
        self.messages.append(message)
        self.op(k.OP_ERROR, -1, len(self.messages) - 1)

    def emit(self, w: Any, node: Node | None, depth: int, stack: tuple[str, ...]) -> None:
        """Read one writer value of schema ``w`` into ``node`` (None: discard)."""
        w = _resolve(w, self.wnamed)
        if _kind(w) == "union":
            self.union(w, node, depth, stack)
        else:
            self.value(w, node, depth, stack)

    def union(self, w: list[Any], node: Node | None, depth: int, stack: tuple[str, ...]) -> None:
        self.op(k.OP_UNION, -1, len(w))
        jumps = [self.op(k.OP_JUMP) for _ in w]
        ends = []
        for jump, branch in zip(jumps, w, strict=True):
            self.code[jump][2] = len(self.code)
            self.value(_resolve(branch, self.wnamed), node, depth, stack)
            ends.append(self.op(k.OP_JUMP))
        for e in ends:
            self.code[e][2] = len(self.code)

    def value(self, w: Any, node: Node | None, depth: int, stack: tuple[str, ...]) -> None:
        wk = _kind(w)
        if wk == "union":  # a union directly inside a union is invalid Avro; read it anyway
            self.union(w, node, depth, stack)
            return
        if node is None:
            self.skip(w, depth, stack)
            return
        if wk == "null" and node.nullable and node.kind != "null":
            self.op(k.OP_NULL, node.id)
            return
        if node.kind == "union":
            j = _pick_branch(w, node.children, self.rnamed)
            if j < 0:
                self.error(f"writer {_describe(w)} matches no branch of the reader's union at "
                           f"{node.path or '/'}")  # fmt: skip
                return
            self.op(k.OP_ENTRY, node.id)
            for i, c in enumerate(node.children):
                if i != j:
                    self.op(k.OP_NULL, c.id)
            self.value(w, node.children[j], depth, stack)
            return
        if not _matches(w, node.schema, self.rnamed, promote=True):
            self.error(f"writer {_describe(w)} cannot be read as reader {_describe(node.schema)} "
                       f"at {node.path or '/'}")  # fmt: skip
            return
        self.resolved(w, wk, node, depth, stack)

    def resolved(self, w: Any, wk: str, node: Node, depth: int, stack: tuple[str, ...]) -> None:
        rk, nid = node.kind, node.id
        if rk == "null":
            self.op(k.OP_NULLV, nid)
        elif rk == "boolean":
            self.op(k.OP_BOOL, nid)
        elif wk in ("int", "long") and rk in ("int", "long", "float", "double"):
            # Arrow's time32[ms] / time64[us] hold a time of day: anything else is an error
            day = {"time-millis": 86_400_000, "time-micros": 86_400_000_000}
            op = k.OP_INT if wk == "int" else k.OP_LONG
            self.op(op, nid, int(rk in ("float", "double")), day.get(node.logical or "", 0))
        elif wk in ("float", "double"):
            self.op(k.OP_FLOAT if wk == "float" else k.OP_DOUBLE, nid)
        elif node.logical == "decimal":
            wl = _logical(w)
            if wl != "decimal" or w.get("scale", 0) != node.schema.get("scale", 0):
                self.error(f"writer {_describe(w)} is not a decimal of the reader's scale at "
                           f"{node.path or '/'}")  # fmt: skip
            elif wk == "bytes":
                self.op(k.OP_DEC_BYTES, nid, node.width)
            else:
                self.op(k.OP_DEC_FIXED, nid, int(w["size"]), node.width)
        elif rk in ("bytes", "string"):
            self.op(k.OP_BYTES, nid, int(rk == "string"))
        elif rk == "fixed":
            self.op(k.OP_FIXED, nid, int(w["size"]))
        elif rk == "enum":
            offset = len(self.enum_maps)
            default = node.schema.get("default")
            for s in w["symbols"]:
                if s in node.symbols:
                    self.enum_maps.append(node.symbols.index(s))
                else:
                    self.enum_maps.append(node.symbols.index(default) if default else -1)
            self.op(k.OP_ENUM, nid, offset, len(w["symbols"]))
        elif rk in ("array", "map"):
            self.loop(w, node, depth, stack)
        else:
            self.record(w, node, depth, stack)

    def loop(self, w: Any, node: Node | None, depth: int, stack: tuple[str, ...]) -> None:
        self.max_depth = max(self.max_depth, depth + 1)
        items = w["items"] if _kind(w) == "array" else w["values"]
        smallest = _min_size(items, self.wnamed, stack) + (_kind(w) == "map")
        start = self.op(k.OP_ARRAY, -1 if node is None else node.id, 0, smallest)
        if _kind(w) == "map":
            self.op(k.OP_BYTES, -1 if node is None else node.children[0].id, 1)
            self.emit(items, None if node is None else node.children[1], depth + 1, stack)
        else:
            self.emit(items, None if node is None else node.children[0], depth + 1, stack)
        self.op(k.OP_LOOP, -1 if node is None else node.id, start + 1)
        self.code[start][2] = len(self.code)

    def record(self, w: Any, node: Node, depth: int, stack: tuple[str, ...]) -> None:
        if w["name"] in stack:
            raise UnsupportedSchemaError(f"recursive Avro writer schema: {w['name']} contains "
                                         f"itself at {node.path or '/'}")  # fmt: skip
        by_name: dict[str, int] = {}
        for i, f in enumerate(node.schema["fields"]):
            by_name.setdefault(f["name"], i)
        for i, f in enumerate(node.schema["fields"]):
            for alias in f.get("aliases", ()):
                by_name.setdefault(alias, i)
        matched = set()
        plan = []
        for f in w["fields"]:
            i = by_name.get(f["name"], -1)
            if i in matched:
                i = -1
            if i >= 0:
                matched.add(i)
            plan.append((f, node.children[i] if i >= 0 else None))
        for i, f in enumerate(node.schema["fields"]):
            if i in matched:
                continue
            if "default" not in f:
                self.error(f"reader field {node.path}/{f['name']} is not in the writer schema "
                           "and has no default")  # fmt: skip
                return
            self.defaults[node.children[i].id] = f["default"]
        self.written.update(child.id for _, child in plan if child is not None)
        self.op(k.OP_ENTRY, node.id)
        for f, child in plan:
            self.emit(f["type"], child, depth, (*stack, w["name"]))

    def skip(self, w: Any, depth: int, stack: tuple[str, ...]) -> None:
        wk = _kind(w)
        if wk == "null":
            return
        if wk in ("boolean", "float", "double"):
            self.op({"boolean": k.OP_BOOL, "float": k.OP_FLOAT, "double": k.OP_DOUBLE}[wk])
        elif wk in ("int", "long"):
            self.op(k.OP_LONG)
        elif wk in ("bytes", "string"):
            self.op(k.OP_BYTES)
        elif wk == "fixed":
            self.op(k.OP_FIXED, -1, int(w["size"]))
        elif wk == "enum":
            offset = len(self.enum_maps)
            self.enum_maps.extend([0] * len(w["symbols"]))
            self.op(k.OP_ENUM, -1, offset, len(w["symbols"]))
        elif wk in ("array", "map"):
            self.loop(w, None, depth, stack)
        elif wk == "record":
            if w["name"] in stack:
                raise UnsupportedSchemaError(f"recursive Avro writer schema: {w['name']}")
            for f in w["fields"]:
                self.emit(f["type"], None, depth, (*stack, w["name"]))
        else:
            raise UnsupportedSchemaError(f"unknown Avro type {wk!r} in the writer schema")


def _describe(schema: Any) -> str:
    kind = _kind(schema)
    if kind in ("record", "enum", "fixed"):
        return f"{kind} {schema['name']}"
    return kind


def _names(schema: Any) -> set[str]:
    names = {schema["name"], _short(schema["name"])}
    for a in schema.get("aliases", ()):
        names |= {a, _short(a)}
    return names


def _matches(w: Any, r: Any, rnamed: dict[str, Any], *, promote: bool) -> bool:
    """Whether a writer value of (non-union) schema ``w`` can be read as ``r`` (non-union):
    the same kind (named types: the same name, unqualified, or a reader alias), or with
    ``promote`` a promotion Avro allows."""
    wk, rk = _kind(w), _kind(r)
    if wk != rk:
        if not promote:
            return False
        allowed = {
            "int": ("long", "float", "double"),
            "long": ("float", "double"),
            "float": ("double",),
            "string": ("bytes",),
            "bytes": ("string",),
        }
        return rk in allowed.get(wk, ())
    if rk in ("record", "enum", "fixed"):
        if not (_names(w) & _names(r)) and _short(w["name"]) != _short(r["name"]):
            return False
        return rk != "fixed" or w["size"] == r["size"]
    return True


def _pick_branch(w: Any, branches: list[Node], rnamed: dict[str, Any]) -> int:
    """The reader branch a writer value goes to: the first of the same type, else the first
    that a promotion reaches (Avro's rule; Java's resolver does the same)."""
    for promote in (False, True):
        for i, b in enumerate(branches):
            if _matches(w, b.schema, rnamed, promote=promote):
                return i
    return -1


def _min_size(schema: Any, named: dict[str, Any], stack: tuple[str, ...]) -> int:
    """The fewest bytes a value of ``schema`` takes (for bounding block counts)."""
    schema = _resolve(schema, named)
    kind = _kind(schema)
    if kind == "union":
        return 1
    if kind == "null":
        return 0
    if kind == "float":
        return 4
    if kind == "double":
        return 8
    if kind == "fixed":
        return int(schema["size"])
    if kind == "record":
        if schema["name"] in stack:
            return 0
        return sum(_min_size(f["type"], named, (*stack, schema["name"])) for f in schema["fields"])
    return 1


def compile_program(
    writer: Any, wnamed: dict[str, Any], root: Node, rnamed: dict[str, Any]
) -> Program:
    """The program reading ``writer`` values into the reader tree ``root`` (from
    :func:`reader_tree`; a non-record reader is wrapped by the caller as ``root``'s only
    child)."""
    e = _Emitter(wnamed, rnamed)
    if root.schema is not None:
        e.emit(writer, root, 0, ())
    else:  # the wrapper struct of a non-record value
        e.op(k.OP_ENTRY, root.id)
        e.emit(writer, root.children[0], 0, ())
    e.op(k.OP_END)
    both = e.written & set(e.defaults)
    if both:  # only with aliases: two writer records resolving to one reader record
        raise UnsupportedSchemaError(
            "two writer records resolve to one reader record with different fields"
            f" (node ids {sorted(both)}): a default and a written value in one column"
        )
    prog = np.array(e.code, dtype=np.int64).reshape(-1, 4)
    return Program(
        prog, np.array(e.enum_maps or [0], np.int64), e.messages, e.defaults, e.max_depth
    )
