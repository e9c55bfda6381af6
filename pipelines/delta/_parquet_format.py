"""The Parquet format as :mod:`pipelines.delta.parquet`'s writer needs it: parquet.thrift's
constants, the Thrift compact protocol of the footer and page headers (:func:`thrift_struct`),
and the file schema built from an Arrow schema (its leaf columns, :class:`_Leaf`, with the
writer's per-column options applied). Pure functions of their arguments; no I/O.

A leaf column is described by its path from the top-level Arrow column: the struct and list
nodes above it (:data:`_STRUCT`, :data:`_LIST`, each nullable or not) and the leaf itself. Its
maximum definition level counts the nullable nodes, the leaf if nullable, and one for the
list's repeated group; its maximum repetition level is 1 under a list, else 0 (one list level
at most: lists of lists and maps are left to pyarrow's writer)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from logstore.protocol.varint import encode_unsigned_varint, zigzag_encode

__all__ = [
    "CREATED_BY",
    "MAGIC",
    "Fields",
    "fast_writer_supports",
    "thrift_struct",
]

MAGIC = b"PAR1"
CREATED_BY = "loglake FastParquetWriter (parquet-format 2.6)"

# parquet.thrift enums
_BOOLEAN, _INT32, _INT64, _FLOAT, _DOUBLE, _BYTE_ARRAY = 0, 1, 2, 4, 5, 6
_REQUIRED, _OPTIONAL, _REPEATED = 0, 1, 2
_PLAIN, _RLE, _DELTA_BINARY_PACKED, _RLE_DICTIONARY = 0, 3, 5, 8
_DATA_PAGE, _DICTIONARY_PAGE = 0, 2
_CODECS = {
    "none": (0, None),
    "uncompressed": (0, None),
    "snappy": (1, "snappy"),
    "gzip": (2, "gzip"),
    "brotli": (4, "brotli"),
    "zstd": (6, "zstd"),
    "lz4": (7, "lz4_raw"),
    "lz4_raw": (7, "lz4_raw"),
}
_ENCODINGS = {"PLAIN": _PLAIN, "DELTA_BINARY_PACKED": _DELTA_BINARY_PACKED}
_DICTIONARY_PAGESIZE_LIMIT = 1 << 20
_MAX_STATISTICS_SIZE = 4096
_MAX_SECONDS = (2**63 - 1) // 1000  # Parquet has no seconds: timestamp[s] is written in ms
# store_decimal_as_integer: pyarrow's (and Spark's) INT32 / INT64 decimals, by precision
_MAX_INT32_DECIMAL, _MAX_INT_DECIMAL = 9, 18


# --- Thrift compact protocol (only what parquet.thrift's footer and page headers need) ------

# compact protocol type ids: a bool field's value is its type (1 true, 2 false)
_T_TRUE, _T_FALSE = 1, 2
_KIND = {"i8": 3, "i16": 4, "i32": 5, "i64": 6, "bin": 8, "list": 9, "struct": 12}

# A struct is a list of (field id, kind, value); a None value leaves the field out. Kinds:
# i8 i16 i32 i64 bool bin struct, and ("list", element kind) with a list value.
Fields = list[tuple[int, Any, Any]]


def _value(kind: Any, value: Any) -> bytes:
    if kind == "i8":
        return bytes([value & 0xFF])
    if kind in ("i16", "i32", "i64"):
        return encode_unsigned_varint(zigzag_encode(value))
    if kind == "bin":
        raw = value.encode() if isinstance(value, str) else bytes(value)
        return encode_unsigned_varint(len(raw)) + raw
    if kind == "struct":
        return thrift_struct(value)
    _, elem = kind
    size = len(value)
    elem_type = _KIND[elem if isinstance(elem, str) else elem[0]]
    head = bytes([size << 4 | elem_type]) if size < 15 else bytes([0xF0 | elem_type])
    head += encode_unsigned_varint(size) if size >= 15 else b""
    return head + b"".join(_value(elem, v) for v in value)


def thrift_struct(fields: Fields) -> bytes:
    """One struct in Thrift's compact protocol (fields in increasing id order)."""
    out = bytearray()
    last = 0
    for fid, kind, value in fields:
        if value is None:
            continue
        if kind == "bool":
            t = _T_TRUE if value else _T_FALSE
        else:
            t = _KIND[kind if isinstance(kind, str) else kind[0]]
        if 0 < fid - last <= 15:
            out.append((fid - last) << 4 | t)
        else:
            out.append(t)
            out += encode_unsigned_varint(zigzag_encode(fid))
        last = fid
        if kind != "bool":
            out += _value(kind, value)
    out.append(0)
    return bytes(out)


# --- schema ------------------------------------------------------------------------------


_STRUCT, _LIST = 0, 1  # kinds of the nodes on a leaf's path


@dataclass
class _Leaf:
    """One Parquet leaf column and how to get its values out of a top-level Arrow column."""

    parts: tuple[str, ...]  # path_in_schema: ("value",), ("headers", "list", "element", "key")
    column: int  # index of the top-level Arrow column
    # the nodes above the leaf, top-level column first: (kind, nullable, struct field index to
    # descend to; -1 for a list, whose values are its one child)
    steps: tuple[tuple[int, bool, int], ...]
    leaf_nullable: bool
    type: pa.DataType  # the leaf's Arrow type
    physical: int
    max_def: int
    max_rep: int
    encoding: int = _PLAIN
    dictionary: bool = False
    statistics: bool = False

    @property
    def path(self) -> str:
        """The name options use, as pyarrow's: "value", "headers.list.element.key"."""
        return ".".join(self.parts)

    @property
    def under_list(self) -> bool:
        """A list on the path: the leaf has repetition levels and one entry per list item."""
        return self.max_rep > 0


def _physical(t: pa.DataType, *, decimals: bool = True) -> int | None:
    if pa.types.is_boolean(t):
        return _BOOLEAN
    if pa.types.is_integer(t) and t.bit_width <= 32 and pa.types.is_signed_integer(t):
        return _INT32
    if pa.types.is_date32(t):
        return _INT32
    if (pa.types.is_integer(t) and t.bit_width == 64 and pa.types.is_signed_integer(t)) or (
        pa.types.is_timestamp(t)
    ):
        return _INT64
    if t in (pa.string(), pa.binary()):
        return _BYTE_ARRAY
    if pa.types.is_float32(t):
        return _FLOAT
    if pa.types.is_float64(t):
        return _DOUBLE
    if decimals and pa.types.is_decimal128(t) and t.precision <= _MAX_INT_DECIMAL:
        return _INT32 if t.precision <= _MAX_INT32_DECIMAL else _INT64
    return None


def _supported(t: pa.DataType, *, under_list: bool, decimals: bool) -> bool:
    if _physical(t, decimals=decimals) is not None:
        return True
    if pa.types.is_struct(t):
        return t.num_fields > 0 and all(
            _supported(t.field(i).type, under_list=under_list, decimals=decimals)
            for i in range(t.num_fields)
        )
    if pa.types.is_list(t) and not under_list:
        return _supported(t.value_type, under_list=True, decimals=decimals)
    return False


def fast_writer_supports(schema: pa.Schema, *, store_decimal_as_integer: bool = False) -> bool:
    """Whether :class:`FastParquetWriter` can write every column of ``schema`` (with that
    ``store_decimal_as_integer``: decimals are written as INT32 / INT64 only)."""
    return all(
        _supported(f.type, under_list=False, decimals=store_decimal_as_integer) for f in schema
    )


def _element(
    name: str,
    repetition: int | None,
    t: pa.DataType | None,
    children: int | None = None,
    *,
    is_list: bool = False,
) -> Fields:
    """A SchemaElement; logical and converted types as pyarrow writes them."""
    converted = None
    logical: Fields | None = None
    scale = precision = None
    physical = None if t is None else _physical(t)
    if t is not None:
        if pa.types.is_string(t):
            converted, logical = 0, [(1, "struct", [])]
        elif pa.types.is_date32(t):
            converted, logical = 6, [(6, "struct", [])]
        elif pa.types.is_timestamp(t):
            unit = {"s": 1, "ms": 1, "us": 2, "ns": 3}[t.unit]
            utc = t.tz is not None
            logical = [(8, "struct", [(1, "bool", utc), (2, "struct", [(unit, "struct", [])])])]
            if utc and unit in (1, 2):
                converted = 9 if unit == 1 else 10
        elif pa.types.is_integer(t) and t.bit_width < 32:
            converted = {8: 15, 16: 16}[t.bit_width]
            logical = [(10, "struct", [(1, "i8", t.bit_width), (2, "bool", True)])]
        elif pa.types.is_decimal(t):
            converted, scale, precision = 5, t.scale, t.precision
            logical = [(5, "struct", [(1, "i32", t.scale), (2, "i32", t.precision)])]
    elif is_list:
        converted, logical = 3, [(3, "struct", [])]
    return [
        (1, "i32", physical),
        (3, "i32", repetition),
        (4, "bin", name),
        (5, "i32", children),
        (6, "i32", converted),
        (7, "i32", scale),
        (8, "i32", precision),
        (10, "struct", logical),
    ]


def _rep(nullable: bool) -> int:
    return _OPTIONAL if nullable else _REQUIRED


def _node(
    f: pa.Field,
    parts: tuple[str, ...],
    column: int,
    steps: tuple[tuple[int, bool, int], ...],
    *,
    elements: list[Fields],
    leaves: list[_Leaf],
) -> None:
    """The schema elements of ``f`` (depth first, as pyarrow orders them) and its leaves."""
    t = f.type
    if pa.types.is_struct(t):
        elements.append(_element(f.name, _rep(f.nullable), None, t.num_fields))
        for i in range(t.num_fields):
            sub = t.field(i)
            step = ((_STRUCT, f.nullable, i),)
            _node(sub, (*parts, sub.name), column, steps + step, elements=elements, leaves=leaves)
        return
    if pa.types.is_list(t):
        # the element is written as "element" whatever its Arrow name, as pyarrow does
        item = t.value_field.with_name("element")
        elements.append(_element(f.name, _rep(f.nullable), None, 1, is_list=True))
        elements.append(_element("list", _REPEATED, None, 1))
        step = ((_LIST, f.nullable, -1),)
        _node(
            item,
            (*parts, "list", "element"),
            column,
            steps + step,
            elements=elements,
            leaves=leaves,
        )
        return
    elements.append(_element(f.name, _rep(f.nullable), t))
    lists = sum(kind == _LIST for kind, _, _ in steps)
    leaves.append(
        _Leaf(
            parts,
            column,
            steps,
            f.nullable,
            t,
            _physical(t),  # type: ignore[arg-type]
            sum(nullable for _, nullable, _ in steps) + int(f.nullable) + lists,
            lists,
        )
    )


def _schema(schema: pa.Schema) -> tuple[list[Fields], list[_Leaf]]:
    """The Parquet schema elements of ``schema`` and its leaf columns (options not applied)."""
    elements: list[Fields] = [_element("schema", _REQUIRED, None, len(schema))]  # as pyarrow
    leaves: list[_Leaf] = []
    for ci, f in enumerate(schema):
        _node(f, (f.name,), ci, (), elements=elements, leaves=leaves)
    return elements, leaves


def _apply_options(
    leaves: list[_Leaf],
    dictionary: set[str],
    statistics: set[str],
    encodings: Mapping[str, int],
    *,
    all_statistics: bool,
) -> None:
    """Set each leaf's encoding, dictionary and statistics from the writer's options, refusing
    names that are no leaf. ``all_statistics``: statistics were asked for every column (True),
    where leaves under a list are skipped rather than refused."""
    names = {leaf.path for leaf in leaves}
    for option, chosen in (
        ("use_dictionary", dictionary),
        ("write_statistics", statistics),
        ("column_encoding", set(encodings)),
    ):
        unknown = chosen - names
        if unknown:
            raise ValueError(f"{option} names columns not in the file: {sorted(unknown)}")
    listed = sorted(leaf.path for leaf in leaves if leaf.under_list)
    asked = sorted(statistics & set(listed))
    if asked and not all_statistics:
        raise ValueError(f"write_statistics: this writer has none for leaves under a list {asked}")
    for leaf in leaves:
        leaf.encoding = encodings.get(leaf.path, _PLAIN)
        if leaf.encoding == _DELTA_BINARY_PACKED and leaf.physical not in (_INT32, _INT64):
            raise ValueError(f"DELTA_BINARY_PACKED needs an integer column, {leaf.path} is not")
        # Dictionaries for leaves not under a list only (a leaf under a list named here is
        # written PLAIN: its dictionary indices would follow the levels, not the rows).
        leaf.dictionary = (
            leaf.path in dictionary and leaf.physical != _BOOLEAN and not leaf.under_list
        )
        leaf.statistics = leaf.path in statistics and not leaf.under_list


def _names(value: bool | Iterable[str] | None, all_names: list[str]) -> set[str]:
    if value is None or value is False:
        return set()
    if value is True:
        return set(all_names)
    if isinstance(value, str):
        raise TypeError(f"expected a bool or a sequence of column names, got {value!r}")
    return set(value)
