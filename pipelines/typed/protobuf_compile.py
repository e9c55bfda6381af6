"""Protobuf message descriptors -> Arrow types and the tables the compiled kernel interprets.

:func:`compile_message` walks a message descriptor (the one :mod:`pipelines.typed.protobuf`
resolves from the registry, Confluent's message ``[0]``) into

1. a tree of :class:`Node`, one per Arrow array the decoder builds, ids in depth-first order
   from 0 (the root is the message's struct); the Arrow types are those of the mapping in
   :mod:`pipelines.typed.protobuf`. The well-known types are *message* nodes here (the kernel
   parses them like any message) whose children the builder folds: Timestamp and Duration
   (``seconds``, ``nanos``) into microseconds, a wrapper into its ``value`` with the
   wrapper's nulls; Struct, Value, ListValue and Any are raw nodes (their bytes, turned into
   JSON per value by the builder: the only per-record work, on those columns only);
2. a :class:`Program`: per message node its fields (number, wire type, how to read the value,
   the node it goes to, presence), a by-number index for the scan, and the emission order
   (schema order, a oneof at its first branch, as ``protobuf.py``'s walk builds its struct).

Refused with :class:`UnsupportedSchemaError` (the caller falls back to upb): a message that
contains itself (Arrow types cannot recurse; the upb walk cannot either), proto2 groups, and
closed (proto2) enums, whose unknown values protobuf moves to the unknown fields.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pyarrow as pa
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from logstore.errors import LoglakeError
from pipelines.typed import arenas
from pipelines.typed import protobuf_kernel as k

__all__ = ["Node", "Program", "UnsupportedSchemaError", "compile_message"]

_F = FieldDescriptor

# Field type -> (value op, wire type, Arrow type)
_SCALAR_OPS: dict[int, tuple[int, int, pa.DataType]] = {
    _F.TYPE_DOUBLE: (k.V_DOUBLE, 1, pa.float64()),
    _F.TYPE_FLOAT: (k.V_FLOAT, 5, pa.float32()),
    _F.TYPE_INT32: (k.V_VARINT, 0, pa.int32()),
    _F.TYPE_SINT32: (k.V_SINT32, 0, pa.int32()),
    _F.TYPE_SFIXED32: (k.V_FIXED32, 5, pa.int32()),
    _F.TYPE_INT64: (k.V_VARINT, 0, pa.int64()),
    _F.TYPE_SINT64: (k.V_SINT64, 0, pa.int64()),
    _F.TYPE_SFIXED64: (k.V_FIXED64, 1, pa.int64()),
    _F.TYPE_UINT32: (k.V_VARINT, 0, pa.uint32()),
    _F.TYPE_FIXED32: (k.V_FIXED32, 5, pa.uint32()),
    _F.TYPE_UINT64: (k.V_VARINT, 0, pa.uint64()),
    _F.TYPE_FIXED64: (k.V_FIXED64, 1, pa.uint64()),
    _F.TYPE_BOOL: (k.V_VARINT, 0, pa.bool_()),
    _F.TYPE_STRING: (k.V_STRING, 2, pa.string()),
    _F.TYPE_BYTES: (k.V_BYTES, 2, pa.binary()),
    _F.TYPE_ENUM: (k.V_VARINT, 0, pa.string()),
}
_WRAPPERS = {
    f"google.protobuf.{n}": t
    for n, t in [
        ("DoubleValue", _F.TYPE_DOUBLE),
        ("FloatValue", _F.TYPE_FLOAT),
        ("Int64Value", _F.TYPE_INT64),
        ("UInt64Value", _F.TYPE_UINT64),
        ("Int32Value", _F.TYPE_INT32),
        ("UInt32Value", _F.TYPE_UINT32),
        ("BoolValue", _F.TYPE_BOOL),
        ("StringValue", _F.TYPE_STRING),
        ("BytesValue", _F.TYPE_BYTES),
    ]
}
_TIMES = {"google.protobuf.Timestamp": "timestamp", "google.protobuf.Duration": "duration"}
_JSON_TYPES = {
    "google.protobuf.Struct",
    "google.protobuf.Value",
    "google.protobuf.ListValue",
    "google.protobuf.Any",
}


class UnsupportedSchemaError(LoglakeError):
    """A message the compiled decoder does not read (recursive, groups, closed enums): the
    decoder falls back to protobuf's own parser for it."""


@dataclasses.dataclass(eq=False)
class Node:
    """One Arrow array of the output. ``kind``: ``message`` (a struct the kernel fills from
    a message), ``oneof`` (a struct of branches), ``entry`` (a map's key/value struct),
    ``timestamp`` / ``duration`` / ``wrapper`` (messages folded by the builder), ``list`` /
    ``map``, ``json`` (raw message bytes), ``enum`` or a scalar (``int32``, ``uint64``,
    ``double``, ``bool``, ``string``, ``bytes``, ...)."""

    kind: str
    arrow: pa.DataType
    path: str
    names: list[str] = dataclasses.field(default_factory=list)
    children: list[Node] = dataclasses.field(default_factory=list)
    nullable: bool = False
    desc: Any = None  # the message descriptor (json nodes), the enum descriptor (enums)
    id: int = -1
    width: int = 0  # the Avro arenas' fixed width: unused here

    @property
    def store(self) -> int:
        if self.kind in ("list", "map"):
            return arenas.STORE_LIST
        if self.kind in ("message", "oneof", "entry", "timestamp", "duration", "wrapper"):
            return arenas.STORE_NONE
        if self.kind in ("string", "bytes", "json"):
            return arenas.STORE_BIN
        return arenas.STORE_VALS


@dataclasses.dataclass
class Program:
    """The kernel's tables (see :mod:`protobuf_kernel`), indexed by node id for messages."""

    fields: np.ndarray  # int64[n, 7]: FIELD_* columns
    fstart: np.ndarray  # per node: its rows in ``fields`` (schema order) and ``lookup``
    fend: np.ndarray
    lookup_num: np.ndarray  # per message, its field numbers sorted (binary search) ...
    lookup_row: np.ndarray  # ... and the row of each
    items: np.ndarray  # int64[n, 4]: (ITEM_FIELD, row, 0, node) or (ITEM_ONEOF, lo, hi, node)
    istart: np.ndarray
    iend: np.ndarray
    oneof_rows: np.ndarray  # the field rows of each oneof, ``items[i, 1:3]`` a range here
    max_fields: int
    max_depth: int  # deepest nesting of message frames


def _repeated(field: Any) -> bool:
    if hasattr(field, "is_repeated"):
        return bool(field.is_repeated)
    return bool(field.label == _F.LABEL_REPEATED)


def _is_map(field: Any) -> bool:
    return bool(field.type == _F.TYPE_MESSAGE and field.message_type.GetOptions().map_entry)


def _real_oneof(field: Any) -> Any:
    oneof = field.containing_oneof
    if oneof is None or (len(oneof.fields) == 1 and oneof.name == f"_{field.name}"):
        return None
    return oneof


class _Builder:
    def __init__(self) -> None:
        self.rows: list[list[int]] = []  # field rows, appended per message
        self.per_msg: dict[int, tuple[list[int], list[tuple[int, int, int, int]]]] = {}
        self.oneof_rows: list[int] = []
        self.depth = 0

    def value_node(self, f: Any, path: str, stack: tuple[str, ...]) -> tuple[Node, int, int]:
        """The node of one (non-repeated) value of ``f``: (node, value op, wire type)."""
        if f.type == _F.TYPE_GROUP:
            raise UnsupportedSchemaError(f"{path}: proto2 groups are not compiled")
        if f.type == _F.TYPE_ENUM:
            if getattr(f.enum_type, "is_closed", False):
                raise UnsupportedSchemaError(f"{path}: closed (proto2) enum {f.enum_type.name}")
            return Node("enum", pa.string(), path, desc=f.enum_type), k.V_VARINT, 0
        if f.type != _F.TYPE_MESSAGE:
            op, wt, arrow = _SCALAR_OPS[f.type]
            return Node(_F_KINDS[f.type], arrow, path), op, wt
        full = f.message_type.full_name
        if full in _JSON_TYPES:
            return Node("json", pa.string(), path, desc=f.message_type), k.V_RAW, 2
        return self.message(f.message_type, path, stack), k.V_MESSAGE, 2

    def message(self, desc: Descriptor, path: str, stack: tuple[str, ...]) -> Node:
        full = desc.full_name
        if full in stack:
            raise UnsupportedSchemaError(
                f"recursive Protobuf message: {full} contains itself at {path or '/'}"
            )
        stack = (*stack, full)
        self.depth = max(self.depth, len(stack))
        if full in _TIMES:
            node = Node(_TIMES[full], pa.timestamp("us", tz="UTC") if full.endswith("Timestamp")
                        else pa.int64(), path)  # fmt: skip
        elif full in _WRAPPERS:
            node = Node("wrapper", pa.null(), path)  # typed below: its value's type
        elif desc.GetOptions().map_entry:
            node = Node("entry", pa.null(), path)  # typed by the map node
        else:
            node = Node("message", pa.null(), path)
        rows: list[int] = []
        items: list[tuple[int, int, int, int]] = []
        oneofs: dict[str, tuple[Node, list[int], int]] = {}
        fields: list[pa.Field] = []
        for f in desc.fields:
            fpath = f"{path}/{f.name}"
            oneof = _real_oneof(f)
            if _is_map(f) or _repeated(f):
                entry_desc = f.message_type if _is_map(f) else None
                if entry_desc is not None:
                    item = self.message(entry_desc, f"{fpath}{{}}", stack)
                    op, wt = k.V_MESSAGE, 2
                    key, value = item.children
                    arrow: pa.DataType = pa.map_(key.arrow, pa.field("value", value.arrow))
                    holder = Node("map", arrow, fpath, children=[item])
                else:
                    item, op, wt = self.value_node(f, f"{fpath}[]", stack)
                    holder = Node("list", pa.list_(item.arrow), fpath, children=[item])
                row = self.row(f.number, op, item, wt, list_node=holder, presence=False)
                node.children.append(holder)
                node.names.append(f.name)
                fields.append(pa.field(f.name, holder.arrow))
                items.append((k.ITEM_FIELD, row, 0, -1))
                rows.append(row)
                continue
            child, op, wt = self.value_node(f, fpath, stack)
            in_entry = node.kind == "entry"
            default = in_entry and f.name == "value" and op in (k.V_MESSAGE, k.V_RAW)
            presence = not in_entry and (f.type == _F.TYPE_MESSAGE or bool(f.has_presence))
            child.nullable = presence or oneof is not None
            row = self.row(f.number, op, child, wt, presence=presence, default=default)
            rows.append(row)
            if oneof is None:
                node.children.append(child)
                node.names.append(f.name)
                fields.append(pa.field(f.name, child.arrow))
                items.append((k.ITEM_FIELD, row, 0, -1))
                continue
            if oneof.name not in oneofs:
                holder = Node("oneof", pa.null(), f"{path}/{oneof.name}", nullable=True)
                oneofs[oneof.name] = (holder, [], len(items))
                node.children.append(holder)
                node.names.append(oneof.name)
                fields.append(pa.field(oneof.name, pa.null()))
                items.append((k.ITEM_ONEOF, 0, 0, id(holder)))  # rows filled below
            holder, branch_rows, _ = oneofs[oneof.name]
            holder.children.append(child)
            holder.names.append(f.name)
            branch_rows.append(row)
        for holder, branch_rows, at in oneofs.values():
            holder.arrow = pa.struct(
                [pa.field(n, c.arrow) for n, c in zip(holder.names, holder.children, strict=True)]
            )
            i = node.children.index(holder)
            fields[i] = pa.field(node.names[i], holder.arrow)
            lo = len(self.oneof_rows)
            items[at] = (k.ITEM_ONEOF, lo, lo + len(branch_rows), id(holder))
            self.oneof_rows.extend(branch_rows)
        if node.kind == "wrapper":
            node.arrow = node.children[0].arrow
        elif node.kind in ("message", "entry"):
            node.arrow = pa.struct(fields)
        self.per_msg[id(node)] = (rows, items)
        return node

    def row(self, number: int, op: int, node: Node, wt: int, *, list_node: Node | None = None,
            presence: bool, default: bool = False) -> int:  # fmt: skip
        self.rows.append([number, op, id(node), id(list_node) if list_node else -1,
                          int(presence), wt, int(default)])  # fmt: skip
        return len(self.rows) - 1


_F_KINDS = {
    _F.TYPE_DOUBLE: "double",
    _F.TYPE_FLOAT: "float",
    _F.TYPE_INT32: "int32",
    _F.TYPE_SINT32: "int32",
    _F.TYPE_SFIXED32: "int32",
    _F.TYPE_INT64: "int64",
    _F.TYPE_SINT64: "int64",
    _F.TYPE_SFIXED64: "int64",
    _F.TYPE_UINT32: "uint32",
    _F.TYPE_FIXED32: "uint32",
    _F.TYPE_UINT64: "uint64",
    _F.TYPE_FIXED64: "uint64",
    _F.TYPE_BOOL: "bool",
    _F.TYPE_STRING: "string",
    _F.TYPE_BYTES: "bytes",
}


def compile_message(desc: Descriptor) -> tuple[Node, list[Node], Program]:
    """The node tree (root, nodes by id) and the kernel's program for message ``desc``."""
    b = _Builder()
    root = b.message(desc, "", ())
    root.nullable = True
    nodes: list[Node] = []

    def number(n: Node) -> None:
        n.id = len(nodes)
        nodes.append(n)
        for c in n.children:
            number(c)

    number(root)
    by_obj = {id(n): n.id for n in nodes}
    fields = np.array(b.rows or [[0] * 7], np.int64).reshape(-1, 7)
    for r in fields[: len(b.rows)]:
        r[k.FIELD_NODE] = by_obj[int(r[k.FIELD_NODE])]
        if r[k.FIELD_LIST] != -1:
            r[k.FIELD_LIST] = by_obj[int(r[k.FIELD_LIST])]
    nn = len(nodes)
    fstart = np.zeros(nn, np.int64)
    fend = np.zeros(nn, np.int64)
    istart = np.zeros(nn, np.int64)
    iend = np.zeros(nn, np.int64)
    lookup_num: list[int] = []
    lookup_row: list[int] = []
    items: list[list[int]] = []
    order: list[int] = []  # field rows regrouped per message, consecutive
    remap: dict[int, int] = {}
    for n in nodes:
        if id(n) not in b.per_msg:
            continue
        rows, its = b.per_msg[id(n)]
        fstart[n.id] = len(order)
        for r in rows:
            remap[r] = len(order)
            order.append(r)
        fend[n.id] = len(order)
        for num, r in sorted((int(fields[r, k.FIELD_NUMBER]), r) for r in rows):
            lookup_num.append(num)
            lookup_row.append(remap[r])
        istart[n.id] = len(items)
        for kind, a, c, holder in its:
            if kind == k.ITEM_FIELD:
                items.append([kind, remap[a], 0, -1])
            else:
                items.append([kind, a, c, by_obj[holder]])
        iend[n.id] = len(items)
    ftab = fields[order] if order else fields[:1]
    oneof_rows = np.array([remap[r] for r in b.oneof_rows] or [0], np.int64)
    max_fields = int(max((fend - fstart).max(initial=0), 1))
    prog = Program(
        ftab, fstart, fend,
        np.array(lookup_num or [0], np.int64), np.array(lookup_row or [0], np.int64),
        np.array(items or [[0, 0, 0, 0]], np.int64).reshape(-1, 4), istart, iend, oneof_rows,
        max_fields, b.depth,
    )  # fmt: skip
    return root, nodes, prog
