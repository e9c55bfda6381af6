"""Arrow columns as Delta can hold them, and a table's schema grown by a newer schema.

Delta has no time-of-day, unsigned or large types: :func:`delta_type` maps a decoder's Arrow
type onto one Delta holds (time32/time64 -> int64 microseconds since midnight; uint8/16 ->
int32, uint32 -> int64, uint64 -> decimal(20, 0); large_string/large_binary/large_list ->
string/binary/list; fixed-size binary -> binary; null -> string, always null) and
:func:`conform` converts an array to it, or to a wider table type: a struct missing fields of
the target gets them as nulls (an older version's record in a newer table's shape). Pure
functions of their arguments; no I/O.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from logstore.errors import InvalidConfigError

__all__ = ["SchemaChangeError", "conform", "delta_type", "merge_schemas"]


class SchemaChangeError(InvalidConfigError):
    """A new schema changes a column's type in a way the table cannot take (not an added
    nullable column): e.g. a string field that became a record, or an int that became a long
    (Delta's type widening is a table feature deltalake 1.6 cannot write). Not retriable: a
    re-run meets the same schema (exit 2)."""


def delta_type(t: pa.DataType) -> pa.DataType:
    """The type a Delta table holds for values of Arrow type ``t``."""
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, delta_type(f.type), nullable=True) for f in t])
    if pa.types.is_map(t):
        return pa.map_(delta_type(t.key_type), delta_type(t.item_type))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return pa.list_(delta_type(t.value_type))
    if pa.types.is_time(t):
        return pa.int64()
    if t in (pa.uint8(), pa.uint16()):
        return pa.int32()
    if t == pa.uint32():
        return pa.int64()
    if t == pa.uint64():
        return pa.decimal128(20, 0)
    if pa.types.is_large_string(t) or pa.types.is_string_view(t) or pa.types.is_null(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return pa.binary()
    if pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_timestamp(t) and t.unit != "us":
        return pa.timestamp("us", tz=t.tz)
    if pa.types.is_dictionary(t):
        return delta_type(t.value_type)
    return t


def conform(arr: pa.Array, target: pa.DataType) -> pa.Array:
    """``arr`` as type ``target`` (a :func:`delta_type`, possibly wider: see module doc)."""
    t = arr.type
    if t == target:
        return arr
    if pa.types.is_dictionary(t):
        return conform(arr.dictionary_decode(), target)
    if pa.types.is_null(t):
        return pa.nulls(len(arr), target)
    if pa.types.is_struct(target):
        if not pa.types.is_struct(t):
            raise SchemaChangeError(f"a {t} column cannot become {target}")
        names = {t.field(i).name: i for i in range(t.num_fields)}
        children = [
            conform(arr.field(names[f.name]), f.type)
            if f.name in names
            else pa.nulls(len(arr), f.type)
            for f in target
        ]
        return pa.StructArray.from_arrays(
            children, fields=list(target), mask=arr.is_null() if arr.null_count else None
        )
    if pa.types.is_map(target) and pa.types.is_map(t):
        keys = conform(arr.keys, target.key_type)
        items = conform(arr.items, target.item_type)
        offsets = arr.offsets if not arr.null_count else _null_offsets(arr)
        return pa.MapArray.from_arrays(offsets, keys, items, type=target)
    if pa.types.is_list(target) and (
        pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
    ):
        if pa.types.is_fixed_size_list(t):
            arr = arr.cast(pa.list_(t.value_type))
        values = conform(arr.flatten() if not arr.null_count else arr.values, target.value_type)
        if not arr.null_count:
            start = arr.offsets[0].as_py()
            offsets = pc.subtract(arr.offsets, start).cast(pa.int32())
            return pa.ListArray.from_arrays(offsets, values, type=target)
        return pa.ListArray.from_arrays(_null_offsets(arr), values, type=target)
    if pa.types.is_time(t) and target == pa.int64():
        return arr.cast(pa.time64("us")).view(pa.int64())
    try:
        return arr.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SchemaChangeError(f"a {t} column cannot become {target}: {exc}") from None


def _null_offsets(arr: pa.Array) -> pa.Array:
    """A list/map array's offsets with nulls where the array is null (from_arrays's mask)."""
    offsets = arr.offsets.cast(pa.int32())
    mask = pa.concat_arrays([arr.is_null(), pa.array([False])])
    return pc.if_else(mask, pa.scalar(None, pa.int32()), offsets)


def _merge_type(old: pa.DataType, new: pa.DataType, where: str) -> pa.DataType:
    if old == new:
        return old
    if pa.types.is_struct(old) and pa.types.is_struct(new):
        fields = {f.name: f for f in old}
        out = [
            pa.field(f.name, _merge_type(f.type, new.field(f.name).type, f"{where}.{f.name}"))
            if new.get_field_index(f.name) >= 0
            else f
            for f in old
        ]
        out += [pa.field(f.name, f.type, nullable=True) for f in new if f.name not in fields]
        return pa.struct(out)
    if pa.types.is_list(old) and pa.types.is_list(new):
        return pa.list_(_merge_type(old.value_type, new.value_type, f"{where}[]"))
    if pa.types.is_map(old) and pa.types.is_map(new) and old.key_type == new.key_type:
        return pa.map_(old.key_type, _merge_type(old.item_type, new.item_type, f"{where}{{}}"))
    raise SchemaChangeError(
        f"column {where}: the table holds {old}, the schema makes it {new} (only added fields "
        "are taken; the table keeps its types)"
    )


def merge_schemas(table: pa.Schema, new: pa.Schema) -> pa.Schema:
    """``table``'s columns (types grown by ``new``'s added nested fields), then ``new``'s added
    columns, all nullable. Raises :class:`SchemaChangeError` on a changed type."""
    fields = [
        pa.field(f.name, _merge_type(f.type, new.field(f.name).type, f.name), nullable=True)
        if new.get_field_index(f.name) >= 0
        else f
        for f in table
    ]
    fields += [pa.field(f.name, f.type, nullable=True) for f in new if f.name not in table.names]
    return pa.schema(fields)
