"""Confluent's wire format, decoded a batch at a time into Arrow.

Bytes of a value (or key) written by Confluent's serializers: magic byte ``0``, the schema id
(4 bytes, big-endian), then the payload: Avro binary; JSON text; for Protobuf the message
indexes (a zigzag varint count, then that many zigzag varints; a single ``0`` byte means the
first message) and the message. :func:`decode_column` reads the 5-byte headers of a whole
``BinaryArray`` in one compiled pass (no Python object per record), groups the rows by schema id and
hands each group to that schema's compiled decoder (one per (writer, reader) pair, cached by
the caller's :class:`Decoders`), then puts the rows back in their order.

Every row gets a value or an error, never both: no magic byte, shorter than the header, an
unknown schema id, a schema of another type than the topic's, a payload the decoder refuses
(truncated, a type mismatch, an incompatible change). The caller sends the errors to dead
letters. Pure but for the registry look-ups of :class:`Decoders`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numba import njit

from pipelines.typed.columns import conform, delta_type
from pipelines.typed.registry import RegisteredSchema, RegistryClient, SchemaNotFoundError

__all__ = ["HEADER_BYTES", "Decoders", "WireDecoded", "compile_for", "decode_column", "reader_type"]

HEADER_BYTES = 5


class _Decoder(Protocol):
    arrow_type: pa.DataType

    def decode(self, data: pa.BinaryArray, offsets_skip: int = 5) -> Any: ...


def compile_for(writer: RegisteredSchema, reader: RegisteredSchema) -> _Decoder:
    """The decoder of ``writer``'s values into ``reader``'s shape (same schema type)."""
    if reader.schema_type == "AVRO":
        from pipelines.typed.avro import compile_decoder  # noqa: PLC0415

        return compile_decoder(writer.text, reader.text)
    if reader.schema_type == "JSON":
        from pipelines.typed.jsonschema import compile_json  # noqa: PLC0415

        return compile_json(reader)
    from pipelines.typed.protobuf import compile_protobuf  # noqa: PLC0415

    return compile_protobuf(writer, reader)


def wrapped(reader: RegisteredSchema) -> bool:
    """Whether ``reader``'s decoded values come wrapped in ``struct<value: T>``: the Avro
    decoder wraps a top-level schema that is not a record (a primitive, array, map, enum,
    fixed or union), so that a value is always a struct of columns."""
    if reader.schema_type != "AVRO":
        return False
    doc = json.loads(reader.text)
    return not (isinstance(doc, dict) and doc.get("type") == "record")


def reader_type(reader: RegisteredSchema, *, bare: bool = False) -> pa.DataType:
    """The Delta-compatible type of ``reader``'s values: a struct (one column per field), or
    with ``bare`` the value itself where the decoder wraps a non-record schema (a key
    ``"string"`` is a string column ``_key``, not ``struct<value: string>``)."""
    t = compile_for(reader, reader).arrow_type
    if bare and wrapped(reader):
        t = t.field(0).type
    return delta_type(t)


@dataclass
class Decoders:
    """Compiled decoders of one topic's values (or keys) into ``reader``'s shape, by writer
    schema id; a failure to compile is remembered as that id's error."""

    client: RegistryClient
    reader: RegisteredSchema
    compile: Callable[[RegisteredSchema, RegisteredSchema], _Decoder] = compile_for
    bare: bool = False  # keys: a non-record schema's values unwrapped (see reader_type)
    _by_id: dict[int, _Decoder | str] = field(default_factory=dict)

    @functools.cached_property
    def unwrap(self) -> bool:
        """Whether decoded values are unwrapped from ``struct<value: T>``."""
        return self.bare and wrapped(self.reader)

    @functools.cached_property
    def arrow_type(self) -> pa.DataType:
        """The Delta-compatible type of the reader's values (computed once)."""
        return reader_type(self.reader, bare=self.bare)

    def get(self, schema_id: int) -> _Decoder | str:
        """The decoder of ``schema_id``, or why there is none."""
        if schema_id not in self._by_id:
            try:
                writer = self.client.by_id(schema_id)
            except SchemaNotFoundError:
                self._by_id[schema_id] = f"unknown schema id {schema_id}"
                return self._by_id[schema_id]
            if writer.schema_type != self.reader.schema_type:
                self._by_id[schema_id] = (
                    f"schema id {schema_id} is {writer.schema_type}, the topic's schema is "
                    f"{self.reader.schema_type}"
                )
                return self._by_id[schema_id]
            try:
                self._by_id[schema_id] = self.compile(writer, self.reader)
            except Exception as exc:
                self._by_id[schema_id] = f"incompatible change: schema id {schema_id}: {exc}"
        return self._by_id[schema_id]


@dataclass
class WireDecoded:
    """``values`` (``decoders.arrow_type``, null where ``errors`` is set), the schema id of
    each row (null without a header) and the error of each row."""

    values: pa.StructArray
    schema_ids: pa.Int32Array
    errors: pa.StringArray


def _headers(arr: pa.BinaryArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(has a 5-byte header with magic 0, schema id, first byte or -1) of every row."""
    n = len(arr)
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return np.zeros(0, dtype=bool), empty, empty
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset : arr.offset + n + 1]
    data_buf = arr.buffers()[2]
    data = (
        np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    )
    if arr.null_count:
        valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    else:
        valid = np.ones(n, dtype=bool)
    ok = np.zeros(n, dtype=bool)
    ids = np.zeros(n, dtype=np.int64)
    first = np.full(n, -1, dtype=np.int64)
    _scan_headers(offsets, data, valid, ok, ids, first)
    return ok, ids, first


@njit(cache=True, nogil=True)
def _scan_headers(  # noqa: PLR0917
    offsets: np.ndarray,
    data: np.ndarray,
    valid: np.ndarray,
    ok: np.ndarray,
    ids: np.ndarray,
    first: np.ndarray,
) -> None:
    """:func:`_headers`' one pass over the rows. Why a loop: numpy's masked gathers (five
    per batch) cost ~16 ns a row, ~7% of a decode task's decode step on
    ``tests/perf/bench_decode.py``'s schema; this ~3, ~6 with the output arrays (1M rows, one
    process, cProfile, 2026-11-28)."""
    for i in range(ok.shape[0]):
        s = offsets[i]
        if not valid[i] or offsets[i + 1] - s < 1:
            continue
        b = data[s]
        first[i] = b
        if b == 0 and offsets[i + 1] - s >= HEADER_BYTES:
            ok[i] = True
            ids[i] = (
                (np.int64(data[s + 1]) << 24)
                | (np.int64(data[s + 2]) << 16)
                | (np.int64(data[s + 3]) << 8)
                | np.int64(data[s + 4])
            )


def decode_column(arr: pa.Array, decoders: Decoders) -> WireDecoded:
    """Decode every row of ``arr`` (binary; nulls are errors: the caller drops tombstones
    first) into ``decoders.arrow_type``."""
    if pa.types.is_large_binary(arr.type):
        arr = arr.cast(pa.binary())
    target = decoders.arrow_type
    ok, ids, first = _headers(arr)
    pieces: list[pa.Array] = []
    errors: list[pa.Array] = []
    order: list[np.ndarray] = []
    bad = np.nonzero(~ok)[0]
    if len(bad):
        # rows without a header are rare: one message each
        lengths = pc.binary_length(arr.take(pa.array(bad))).fill_null(-1).to_pylist()
        why = [
            "null value"
            if length == -1
            else f"no magic byte: first byte is 0x{int(b):02x}, not 0x00"
            if b > 0
            else f"truncated: {length} bytes, shorter than the {HEADER_BYTES}-byte header"
            for b, length in zip(first[bad].tolist(), lengths, strict=True)
        ]
        pieces.append(pa.nulls(len(bad), target))
        errors.append(pa.array(why, type=pa.string()))
        order.append(bad)
    good = np.nonzero(ok)[0]
    # the usual batch: every row framed, one schema id. It is decoded in place: no take()
    # of the input, nor of the nested output back into order (measured: the two takes cost
    # about as much as the kernel itself, tests/perf/bench_decode.py --job)
    whole = len(good) == len(arr)
    for schema_id in np.unique(ids[good]):
        rows = good[ids[good] == schema_id]
        whole = whole and len(rows) == len(arr)
        decoder = decoders.get(int(schema_id))
        if isinstance(decoder, str):
            pieces.append(pa.nulls(len(rows), target))
            errors.append(pa.array([decoder] * len(rows), type=pa.string()))
        else:
            taken = arr if whole else arr.take(pa.array(rows))
            out = decoder.decode(taken, offsets_skip=HEADER_BYTES)
            # flatten() carries the wrapper's nulls (failed rows) into its only child
            values = out.values.flatten()[0] if decoders.unwrap else out.values
            pieces.append(conform(values, target))
            errors.append(out.errors.cast(pa.string()))
        order.append(rows)
    ids_arr = pa.array(ids.astype(np.int32), mask=~ok)
    if not pieces:
        return WireDecoded(pa.nulls(0, target), ids_arr, pa.nulls(0, pa.string()))
    if whole:
        return WireDecoded(pieces[0], ids_arr, errors[0])
    back = pa.array(np.argsort(np.concatenate(order), kind="stable"))
    return WireDecoded(
        pa.concat_arrays(pieces).take(back), ids_arr, pa.concat_arrays(errors).take(back)
    )
