"""Confluent-framed Avro values -> Arrow columns, vectorised (issue 22's typed tables).

A :class:`AvroDecoder` is compiled once per (writer, reader) schema pair and decodes a whole
``binary`` column of values in one pass of a numba kernel (:mod:`avro_kernel`) that writes
straight into preallocated buffers; the Arrow arrays are then built from those buffers. No
Python object is created per record. :func:`decode_reference` does the same with fastavro's
per-record reader: the baseline of ``tests/perf/bench_decode.py`` and the cross-check of
``tests/unit/typed/``.

Input: payload ``i`` is ``data[i][offsets_skip:]`` (``offsets_skip=5`` skips Confluent's magic
byte and schema id, which the caller has checked and grouped by). Output: :class:`Decoded`, a
struct array in the *reader* schema's shape (one row per input, null where decoding failed)
and an error string per row (null where it succeeded) naming what went wrong and the byte
position in the value (header included). One bad payload never stops the batch.

Type mapping (Avro -> Arrow)::

    null                            null
    boolean                         bool
    int / long                      int32 / int64
    float / double                  float32 / float64
    bytes / string                  binary / string (UTF-8 checked)
    fixed(n)                        fixed_size_binary(n)
    enum                            string (the symbol)
    array<T>                        list<item: T>
    map<T>                          map<string, value: T>
    record                          struct (one field per Avro field, same order)
    union [null, T] (either order)  T, nullable
    union [null]                    null
    other unions                    struct<member0, member1, ...> of the non-null branches in
                                    order (Spark's ``from_avro`` names), exactly one set;
                                    the struct itself is null for the null branch
    date                            date32
    time-millis / time-micros       time32[ms] / time64[us]
    timestamp-millis / -micros      timestamp[ms, tz=UTC] / timestamp[us, tz=UTC]
    local-timestamp-millis / -micros timestamp[ms] / timestamp[us] (no time zone)
    decimal(p, s) on bytes or fixed decimal128(p, s); decimal256(p, s) when p > 38;
                                    the base type (binary / fixed) when p > 76
    uuid                            string (as written, not re-validated)
    duration (fixed 12)             fixed_size_binary(12): months, days, milliseconds as
                                    little-endian uint32s, Avro's own bytes

Fields that are not a union with null are non-nullable. A logical type on the wrong base
type, or a decimal whose precision/scale is invalid, is ignored (Avro's rule): the base type's
column. A top-level value that is not a record is wrapped in ``struct<value: T>``. Recursive
schemas are refused (:class:`UnsupportedSchemaError`): Arrow types cannot recurse.

Schema resolution (writer -> reader, Avro's rules): see :mod:`avro_compile`. Logical types do
not take part (as in Avro), except that decimals must keep their scale. A decimal larger than
its Arrow type, an enum symbol the reader lacks (and no reader default), a writer union branch
the reader cannot read, an int beyond 32 bits, invalid UTF-8 in a string, trailing bytes after
the value, a time-millis or time-micros outside 00:00-24:00 (Arrow's time types hold a time of
day) and any truncation are errors of that row.

Where this decoder and fastavro's ``schemaless_reader`` differ (the tests avoid these cases
in the random cross-check and pin this side's behaviour by example):

- a writer value goes to the reader union's branch of its own type before one a promotion
  reaches (Java's Avro does the same); fastavro takes the first branch a promotion reaches;
- ``bytes``/``fixed`` defaults are code points 0-255 taken as bytes (the specification, and
  Java); fastavro encodes them as UTF-8; decimal defaults become decimals (fastavro returns
  the JSON string);
- bytes after the value, and ``int`` values beyond 32 bits, are errors (fastavro ignores the
  first and returns the second).
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import functools
import io
import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa

from logstore.registry.formats import parse
from pipelines.decode.arrow import numpy_array
from pipelines.typed import avro_kernel as k
from pipelines.typed.arenas import STORE_BIN, STORE_FIXED, STORE_LIST, Arenas
from pipelines.typed.avro_codegen import (
    MAX_INSTRUCTIONS,
    Layout,
    generate_source,
    generated_kernel,
    is_cached,
)
from pipelines.typed.avro_compile import (
    Node,
    Program,
    UnsupportedSchemaError,
    compile_program,
    reader_tree,
)

__all__ = [
    "KERNELS",
    "AvroDecoder",
    "Decoded",
    "UnsupportedSchemaError",
    "arrow_type",
    "compile_decoder",
    "decode_reference",
    "warm",
]


@dataclasses.dataclass
class Decoded:
    """One row per input: ``values`` null and ``errors`` set where the payload did not
    decode; ``values`` set and ``errors`` null elsewhere (a value may itself be null when the
    writer wrote a null for a nullable top-level schema)."""

    values: pa.StructArray
    errors: pa.StringArray

    @property
    def error_count(self) -> int:
        return int(len(self.errors) - self.errors.null_count)


def _parse(schema: str | dict[str, Any] | list[Any]) -> tuple[Any, dict[str, Any]]:
    """fastavro's parsed form and named types, through the registry's parser (422 errors)."""
    text = schema if isinstance(schema, str) else json.dumps(schema)
    parsed = parse("AVRO", text)
    return parsed.parsed, parsed.named


def arrow_type(schema: str | dict[str, Any] | list[Any]) -> pa.DataType:
    """The Arrow type of values of ``schema`` (the mapping in this module's docstring): a
    struct for a record; the mapped type itself for anything else (the decoder wraps those
    in ``struct<value: T>``)."""
    parsed, named = _parse(schema)
    root = reader_tree(parsed, named)
    return root.children[0].arrow if root.schema is None else root.arrow


def compile_decoder(
    writer_schema: str, reader_schema: str | None = None, *, kernel: str = "auto"
) -> AvroDecoder:
    """A decoder of values written with ``writer_schema`` into ``reader_schema``'s shape (the
    writer's own when None). Raises ``InvalidSchemaError`` (a schema fastavro cannot parse)
    or :class:`UnsupportedSchemaError` (recursive). Incompatibilities are not raised here:
    they fail exactly the rows they concern (see the module docstring). ``kernel``: see
    :class:`AvroDecoder`."""
    return AvroDecoder(writer_schema, reader_schema, kernel=kernel)


def _nodes(root: Node) -> list[Node]:
    out = [root]
    for c in root.children:
        out.extend(_nodes(c))
    return out


_LOG = logging.getLogger(__name__)
KERNELS = ("auto", "interpreter", "generated")
# "auto" compiles the generated kernel once a process has decoded this many rows of a pair
AUTO_ROWS = 1_000_000
_AUTO_SEEN: dict[bytes, int] = {}  # rows decoded by the interpreter, by program


class AvroDecoder:
    """A compiled (writer, reader) pair. Thread-safe: :meth:`decode` keeps its buffers local
    (the kernel releases the GIL).

    ``kernel``: ``"interpreter"`` runs :mod:`avro_kernel`'s one kernel for every schema (no
    compilation: for small batches and many schemas, e.g. the tests' random ones);
    ``"generated"`` a kernel specialised to this pair (:mod:`avro_codegen`: faster, compiled
    once per machine and schema pair, the interpreter beyond its size limit); ``"auto"``
    (the default) the interpreter until the generated kernel pays (:meth:`_kernel`). All
    give the same output, errors included."""

    def __init__(
        self, writer_schema: str, reader_schema: str | None = None, *, kernel: str = "auto"
    ) -> None:
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, not {kernel!r}")
        wparsed, wnamed = _parse(writer_schema)
        rparsed, rnamed = (wparsed, wnamed) if reader_schema is None else _parse(reader_schema)
        self.root = reader_tree(rparsed, rnamed)
        self.arrow_type: pa.StructType = self.root.arrow
        self.program: Program = compile_program(wparsed, wnamed, self.root, rnamed)
        self.nodes = _nodes(self.root)
        detached = set(self.program.defaults)
        # Nodes filled per row (one entry per row): reached from the root through structs.
        self._per_row = np.zeros(len(self.nodes), np.bool_)
        starts, dummies = [0], []
        for n in self.nodes:
            dummies.extend(self._dummy(n, detached))
            starts.append(len(dummies))
        self._dummy_start = np.array(starts, np.int64)
        self._dummy_nodes = np.array(dummies or [0], np.int64)
        for i in self._dummy(self.root, detached):
            self._per_row[i] = True
        self._store = np.array([n.store for n in self.nodes], np.int64)
        self._width = np.array([n.width for n in self.nodes], np.int64)
        # Nodes that can hold a null: the root (failed rows) and the targets of OP_NULL.
        self._track = np.zeros(len(self.nodes), np.uint8)
        self._track[0] = 1
        prog = self.program.prog
        self._track[prog[prog[:, 0] == k.OP_NULL, 1]] = 1
        # Decimal nodes: the largest and the smallest value of their precision, in limbs.
        self._bound_at = np.zeros(len(self.nodes), np.int64)
        precision = np.zeros(len(self.nodes), np.int64)
        limbs: list[np.ndarray] = [np.zeros(1, np.uint64)]
        at = 1
        for n in self.nodes:
            if n.logical == "decimal":
                top = 10**n.arrow.precision - 1
                for v in (top, -top):
                    limbs.append(np.frombuffer(v.to_bytes(n.width, "little", signed=True), "<u8"))
                self._bound_at[n.id] = at
                precision[n.id] = n.arrow.precision
                at += 2 * (n.width // 8)
        self._bounds = np.concatenate(limbs).astype(np.uint64)
        self.kernel = kernel
        self._layout = Layout(
            self._track, self._store, self._width, self._dummy_start, self._dummy_nodes, precision
        )
        self._generated: Callable[..., Any] | None = None
        self._cached: bool | None = None
        if len(prog) > MAX_INSTRUCTIONS:
            self.kernel = "interpreter"  # numba's compile time grows with the code
        elif self.kernel == "generated":
            self._generated = generated_kernel(self._source)

    @functools.cached_property
    def _source(self) -> str:
        """The generated kernel's source (generated once: its SHA-256 names it)."""
        return generate_source(self.program.prog, self._layout)

    def _kernel(self, rows: int) -> Callable[..., Any]:
        """The kernel for a call of ``rows`` rows: ``"auto"`` takes the generated one when
        this machine compiled it before (its source is in the cache: loading takes ~0.2 s),
        or once this process has decoded :data:`AUTO_ROWS` rows of this pair (compiling
        takes seconds; it saves ~0.1 us a row on the bench's schema), else the interpreter.
        A generated kernel that fails to compile leaves ``"auto"`` on the interpreter (logged:
        the interpreter decodes every program); ``"generated"`` raises."""
        if self._generated is not None:
            return self._generated
        if self.kernel == "auto":
            key = self.program.prog.tobytes()
            if self._cached is None:
                self._cached = is_cached(self._source)
            if self._cached or _AUTO_SEEN.get(key, 0) + rows >= AUTO_ROWS:
                try:
                    self._generated = generated_kernel(self._source)
                except Exception as exc:  # numba's errors have no common base
                    _LOG.warning(
                        "the generated Avro kernel did not compile (%s: %s); this decoder "
                        "keeps the interpreter", type(exc).__name__, exc,
                    )  # fmt: skip
                    self.kernel = "interpreter"
                    return k.decode_rows
                return self._generated
            _AUTO_SEEN[key] = _AUTO_SEEN.get(key, 0) + rows
        return k.decode_rows

    def _dummy(self, node: Node, detached: set[int]) -> list[int]:
        """``node`` and its struct descendants that the kernel writes (not the defaults)."""
        if node.id in detached:
            return []
        out = [node.id]
        if node.kind in ("record", "union"):
            for c in node.children:
                out.extend(self._dummy(c, detached))
        return out

    def decode(self, data: pa.BinaryArray | pa.LargeBinaryArray, offsets_skip: int = 5) -> Decoded:
        """Decode every value of ``data`` (``data[i][offsets_skip:]`` is the Avro payload)."""
        if not (pa.types.is_binary(data.type) or pa.types.is_large_binary(data.type)):
            raise TypeError(f"AvroDecoder.decode takes binary values, not {data.type}")
        if offsets_skip < 0:
            raise ValueError(f"offsets_skip must be >= 0, not {offsets_skip}")
        n = len(data)
        width = 8 if pa.types.is_large_binary(data.type) else 4
        bufs = data.buffers()
        offsets = np.frombuffer(
            bufs[1], np.int64 if width == 8 else np.int32, n + 1, data.offset * width
        ).astype(np.int64)
        # Always a read-only view (numba compiles one specialisation per array flavour).
        buf = np.frombuffer(bufs[2] if bufs[2] is not None else b"", np.uint8)
        if n and (offsets.min() < 0 or offsets.max() > len(buf)):  # the kernel trusts these
            raise ValueError("binary array offsets point outside its data buffer")
        payload = int(offsets[-1] - offsets[0])
        a = Arenas(
            per_row=self._per_row, store=self._store, width=self._width, rows=n, payload=payload
        )
        err_code = np.zeros(n, np.int64)
        err_pos = np.zeros(n, np.int64)
        row = 0
        kernel = self._kernel(n)
        while True:
            status, row, full = kernel(
                self.program.prog, self.program.enum_maps, buf, offsets, offsets_skip, row,
                a.counts, a.dcounts, a.ecap, a.dcap, a.vbase, a.dbase, self._store, self._width,
                self._track, self._bounds, self._bound_at, self._dummy_start, self._dummy_nodes,
                a.vals, a.fvals, a.valid, a.data,
                err_code, err_pos, self.program.max_depth,
            )  # fmt: skip
            if status == k.STATUS_DONE:
                break
            a.grow(int(full))
        if data.null_count:  # a null input is a failed row, whatever bytes its slot spans
            nulls = np.flatnonzero(
                np.unpackbits(
                    np.frombuffer(bufs[0], np.uint8), count=data.offset + n, bitorder="little"
                )[data.offset :]
                == 0
            )
            err_code[nulls] = k.ERR_NULL
            err_pos[nulls] = 0
            a.valid[a.vbase[0] + nulls] = 0  # the root has one entry per row, in order
        values = self._build(self.root, a)
        errors = self._errors(err_code, err_pos, offsets)
        return Decoded(values, errors)

    def _errors(self, code: np.ndarray, pos: np.ndarray, offsets: np.ndarray) -> pa.Array:
        n = len(code)
        bad = np.flatnonzero(code)
        if not len(bad):
            return pa.nulls(n, pa.string())
        texts = []
        for i in bad:  # failed rows only: their count is the dead-letter count
            c = int(code[i])
            if c == k.ERR_NULL:
                texts.append(k.ERRORS[c].encode())
                continue
            what = self.program.messages[c - k.ERR_SCHEMA] if c >= k.ERR_SCHEMA else k.ERRORS[c]
            size = int(offsets[i + 1] - offsets[i])
            texts.append(f"{what} (at byte {int(pos[i])} of {size})".encode())
        lengths = np.zeros(n, np.int32)
        lengths[bad] = [len(t) for t in texts]
        offs = np.zeros(n + 1, np.int32)
        np.cumsum(lengths, out=offs[1:])
        validity = pa.py_buffer(np.packbits(code != 0, bitorder="little"))
        return pa.Array.from_buffers(
            pa.string(), n, [validity, pa.py_buffer(offs), pa.py_buffer(b"".join(texts))],
            n - len(bad),
        )  # fmt: skip

    def _build(self, node: Node, a: Arenas) -> pa.Array:
        i = node.id
        c = int(a.counts[i])
        vb = int(a.vbase[i])
        valid = a.valid[vb : vb + c]  # written only for the nodes that can be null
        nulls = c - int(np.count_nonzero(valid)) if self._track[i] else 0
        validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
        store = node.store
        if node.kind == "null":
            return pa.nulls(c)
        if node.kind in ("record", "union"):
            children = [
                _default_array(ch, self.program.defaults[ch.id], c)
                if ch.id in self.program.defaults
                else self._build(ch, a)
                for ch in node.children
            ]
            return pa.Array.from_buffers(node.arrow, c, [validity], nulls, children=children)
        if store == STORE_FIXED:
            db = int(a.dbase[i])
            buf = pa.py_buffer(a.data[db : db + c * node.width])
            return pa.Array.from_buffers(node.arrow, c, [validity, buf], nulls)
        vals = a.vals[vb : vb + c]
        if store in (STORE_BIN, STORE_LIST):
            offs = np.zeros(c + 1, np.int64)
            np.cumsum(vals, out=offs[1:])
            if offs[-1] >= 2**31:
                raise UnsupportedSchemaError(
                    f"{node.path or '/'}: {int(offs[-1])} bytes/items in one batch exceed "
                    "Arrow's 32-bit offsets; decode smaller batches"
                )
            obuf = pa.py_buffer(offs.astype(np.int32))
            if store == STORE_BIN:
                db = int(a.dbase[i])
                dbuf = pa.py_buffer(a.data[db : db + int(offs[-1])])
                return pa.Array.from_buffers(node.arrow, c, [validity, obuf, dbuf], nulls)
            if node.kind == "array":
                child = self._build(node.children[0], a)
            else:
                key, value = (self._build(ch, a) for ch in node.children)
                entries = pa.struct([node.arrow.key_field, node.arrow.item_field])
                child = pa.Array.from_buffers(entries, len(key), [None], 0, children=[key, value])
            return pa.Array.from_buffers(node.arrow, c, [validity, obuf], nulls, children=[child])
        if node.kind == "enum":
            idx = numpy_array(vals.astype(np.int32), mask=valid == 0 if nulls else None)
            return pa.array(node.symbols, pa.string()).take(idx)
        if node.kind == "boolean":
            bits = pa.py_buffer(np.packbits(vals != 0, bitorder="little"))
            return pa.Array.from_buffers(pa.bool_(), c, [validity, bits], nulls)
        if node.kind in ("float", "double"):
            floats = a.fvals[vb : vb + c]
            raw: np.ndarray = floats.astype(np.float32) if node.kind == "float" else floats
        else:
            raw = vals.astype(np.int32) if node.arrow.bit_width == 32 else vals
        return pa.Array.from_buffers(node.arrow, c, [validity, pa.py_buffer(raw)], nulls)


_CTX = decimal.Context(prec=100)  # scaleb rounds to the context (28 digits by default)


def _default_array(node: Node, default: Any, length: int) -> pa.Array:
    """``length`` copies of a reader-only field's default (one Python value, then a take)."""
    one = pa.array([_default_value(node, default)], node.arrow)
    return one.take(numpy_array(np.zeros(length, np.int32)))


def _default_value(node: Node, d: Any) -> Any:
    """An Avro default (JSON form, for the first branch of a union) as Arrow's Python value."""
    if d is None:
        return None
    if node.kind == "union":
        return {"member0": _default_value(node.children[0], d)}
    if node.kind == "record":
        fields = node.schema["fields"]
        return {
            f["name"]: _default_value(ch, d.get(f["name"], f.get("default")))
            for f, ch in zip(fields, node.children, strict=True)
        }
    if node.kind == "array":
        return [_default_value(node.children[0], v) for v in d]
    if node.kind == "map":
        return [(key, _default_value(node.children[1], v)) for key, v in d.items()]
    if node.kind in ("bytes", "fixed"):
        raw = d.encode("latin-1")
        if node.logical == "decimal":
            scale = node.schema.get("scale", 0)
            return decimal.Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(-scale, _CTX)
        return raw
    return d


def decode_reference(
    data: pa.BinaryArray | pa.LargeBinaryArray,
    writer_schema: str,
    reader_schema: str | None = None,
    *,
    offsets_skip: int = 5,
) -> Decoded:
    """The same result through fastavro's ``schemaless_reader``, one record at a time: the
    slow, trusted reference (values equal to :meth:`AvroDecoder.decode`'s; error texts are
    fastavro's). Limitation: a union read as a struct picks its branch from the Python type
    fastavro returns, so unions with two branches of one Python type are ambiguous here."""
    wparsed, wnamed = _parse(writer_schema)
    rparsed, rnamed = (wparsed, wnamed) if reader_schema is None else _parse(reader_schema)
    root = reader_tree(rparsed, rnamed)
    rows: list[Any] = []
    errors: list[str | None] = []
    for raw in data.to_pylist():
        if raw is None:
            rows.append(None)
            errors.append("value is null")
            continue
        fo = io.BytesIO(raw[offsets_skip:])
        try:
            value = fastavro.schemaless_reader(
                fo, wparsed, rparsed if reader_schema is not None else None,
                return_named_type=True, return_named_type_override=True,
            )  # fmt: skip
            if fo.tell() != len(raw) - offsets_skip:
                raise ValueError(f"{len(raw) - offsets_skip - fo.tell()} bytes left")
            row = _py(root.children[0], value) if root.schema is None else _py(root, value)
            rows.append({"value": row} if root.schema is None else row)
            errors.append(None)
        except Exception as exc:
            rows.append(None)
            errors.append(f"{type(exc).__name__}: {exc}")
    try:
        values = pa.array(rows, root.arrow)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        for i, row in enumerate(rows):  # find the rows Arrow refuses (an int beyond 32 bits)
            try:
                pa.array([row], root.arrow)
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
                rows[i] = None
                errors[i] = f"{type(exc).__name__}: {exc}"
        values = pa.array(rows, root.arrow)
    return Decoded(values, pa.array(errors, pa.string()))


_PY_KINDS: list[tuple[type | tuple[type, ...], tuple[str, ...]]] = [
    (bool, ("boolean",)),
    (int, ("int", "long")),
    (float, ("float", "double")),
    (decimal.Decimal, ("bytes", "fixed")),
    (datetime.datetime, ("long",)),
    (datetime.date, ("int",)),
    (datetime.time, ("int", "long")),
    ((str, uuid.UUID), ("string", "enum")),
    (bytes, ("bytes", "fixed")),
    (list, ("array",)),
    (dict, ("map", "record")),
]


def _py(node: Node, v: Any) -> Any:
    """fastavro's Python value as the Python value ``pa.array`` takes for ``node.arrow``."""
    if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str):
        name, v = v  # a named type inside a union (return_named_type)
        if node.kind == "union":
            for i, ch in enumerate(node.children):
                if ch.kind in ("record", "enum", "fixed") and ch.schema["name"] == name:
                    return {f"member{i}": _py(ch, v)}
    if v is None:
        return None
    if node.kind == "union":
        for kind, avro in _PY_KINDS:
            if isinstance(v, kind) and not (kind is int and isinstance(v, bool)):
                for i, ch in enumerate(node.children):
                    if ch.kind in avro:
                        return {f"member{i}": _py(ch, v)}
        raise TypeError(f"no branch of {node.path or '/'} for {type(v).__name__}")
    if node.kind == "record":
        return {
            name: _py(ch, v.get(name)) for name, ch in zip(node.names, node.children, strict=True)
        }
    if node.kind == "array":
        return [_py(node.children[0], x) for x in v]
    if node.kind == "map":
        return [(key, _py(node.children[1], x)) for key, x in v.items()]
    if isinstance(v, uuid.UUID):
        return str(v)
    return v


def warm() -> int:
    """Compile the kernel into numba's on-disk cache (``cache=True``) by decoding a tiny batch
    of each input flavour (binary, large_binary; with a null and a bad row), so that Spark
    workers load machine code instead of each compiling it (~a second or more per process).
    Returns the rows decoded (8)."""
    schema = json.dumps(
        {"type": "record", "name": "Warm", "fields": [
            {"name": "s", "type": ["null", "string"]},
            {"name": "a", "type": {"type": "array", "items": "double"}},
        ]}
    )  # fmt: skip
    dec = compile_decoder(schema)
    raw = [b"\x00\x00\x00\x00\x01\x02\x02h\x02" + bytes(8) + b"\x00", None, b"\x00", b""]
    rows = 0
    for kind in (pa.binary(), pa.large_binary()):
        out = dec.decode(pa.array(raw, kind))
        if out.values[0].as_py() != {"s": "h", "a": [0.0]} or out.error_count != 3:
            raise RuntimeError(f"Avro kernel warm-up decoded {out.values.to_pylist()}")
        rows += len(out.values)
    return rows
