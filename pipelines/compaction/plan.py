"""Which records win, column at a time: the reference model's rule over Arrow tables.

The table merge (``pipelines.compaction.table``) and the log rewrite both decide winners here,
so they cannot disagree with each other; the tests check this module against
``pipelines.compaction.model`` on random workloads.

Input: any Arrow table with the ``records`` columns ``partition`` (int32), ``key`` (binary),
``offset`` (int64), ``timestamp`` (timestamp, any unit; or int64 milliseconds) and ``headers``
(list<struct<key: string, value: binary>>); other columns ride along. Cost: one sort of the
rows plus a pass over the header entries, no Python object per record.

For the log rewrite (output 2, later): ``winner_indices`` over a partition's cleanable records
plus the winners already known (offset map) gives exactly the offsets to keep; tombstone
retention and the lag rules are applied on top of that set, not by a second rule.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.compaction.model import Strategy
from pipelines.decode.arrow import one_array

__all__ = ["VERSION", "header_versions", "versions", "winner_indices", "winners"]

VERSION = "version"


def _timestamp_ms(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if pa.types.is_timestamp(column.type):
        unit = column.type.unit
        raw = pc.cast(column, pa.timestamp(unit)).cast(pa.int64()).to_numpy()
        per_ms = {"s": None, "ms": 1, "us": 1000, "ns": 1_000_000}[unit]
        return raw * 1000 if per_ms is None else np.floor_divide(raw, per_ms)
    return np.asarray(pc.cast(column, pa.int64()).to_numpy(zero_copy_only=False))


def header_versions(headers: pa.Array | pa.ChunkedArray, name: str) -> pa.Array:
    """Per row: the last header ``name``'s value as a big-endian signed integer of 1-8 bytes
    (int64), null when the row has no such header or its value is null, empty or too long."""
    headers = one_array(headers)
    n = len(headers)
    out = np.zeros(n, dtype=np.int64)
    valid = np.zeros(n, dtype=bool)
    if n == 0:
        return pa.array(out, mask=~valid)
    flat = headers.flatten()
    parents = np.asarray(pc.list_parent_indices(headers).to_numpy(zero_copy_only=False))
    names = pc.struct_field(flat, "key")
    match = np.asarray(pc.fill_null(pc.equal(names, name), False).to_numpy(zero_copy_only=False))
    where = np.nonzero(match)[0]
    if len(where):
        rows = parents[where]
        last = np.ones(len(where), dtype=bool)
        last[:-1] = rows[:-1] != rows[1:]  # entries are in row order: keep each row's last
        where, rows = where[last], rows[last]
        values = pc.struct_field(flat, "value").take(pa.array(where))
        values = values.cast(pa.binary())
        lengths = np.asarray(
            pc.fill_null(pc.binary_length(values), 0).to_numpy(zero_copy_only=False)
        )
        ok = (lengths >= 1) & (lengths <= 8)
        offsets = np.frombuffer(values.buffers()[1], dtype=np.int32)[
            values.offset : values.offset + len(values) + 1
        ]
        data_buf = values.buffers()[2]
        data = (
            np.frombuffer(data_buf, dtype=np.uint8)
            if data_buf is not None
            else np.zeros(1, np.uint8)
        )
        if len(data) == 0:
            data = np.zeros(1, np.uint8)
        starts = offsets[:-1].astype(np.int64)
        acc = np.zeros(len(values), dtype=np.uint64)
        for j in range(8):
            take = ok & (lengths > j)
            pos = np.minimum(starts + j, len(data) - 1)
            byte = data[pos].astype(np.uint64)
            acc = np.where(take, (acc << np.uint64(8)) | byte, acc)
        shift = (64 - 8 * np.clip(lengths, 1, 8)).astype(np.uint64)
        signed = (acc << shift).view(np.int64) >> shift.astype(np.int64)
        out[rows[ok]] = signed[ok]
        valid[rows[ok]] = True
    return pa.array(out, mask=~valid)


def versions(table: pa.Table, strategy: Strategy) -> pa.Array:
    """The ``version`` of every row under ``strategy`` (all null for ``offset``)."""
    n = table.num_rows
    if strategy.kind == "offset":
        return pa.nulls(n, pa.int64())
    if strategy.kind == "timestamp":
        return pa.array(_timestamp_ms(table.column("timestamp")), type=pa.int64())
    return header_versions(table.column("headers"), strategy.header or "")


def winner_indices(table: pa.Table, version: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Row indices of the winners: one per ``(partition, key)``, keyless rows excluded.

    Order within a key (model rule 3): rows with a version beat rows without; then the
    greater version; then the greater offset.
    """
    n = table.num_rows
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    keyed = np.asarray(table.column("key").is_valid().to_numpy(zero_copy_only=False))
    rows = np.nonzero(keyed)[0]
    if len(rows) == 0:
        return rows
    version = pa.chunked_array([version]) if isinstance(version, pa.Array) else version
    sub = pa.table(
        {
            "p": table.column("partition").take(rows),
            "k": table.column("key").take(rows),
            "h": pc.cast(version.is_valid(), pa.int8()).take(rows),
            "v": pc.fill_null(version, 0).take(rows),
            "o": table.column("offset").take(rows),
        }
    )
    order = pc.sort_indices(
        sub, sort_keys=[(c, "ascending") for c in ("p", "k", "h", "v", "o")]
    ).to_numpy()
    parts = sub.column("p").take(order).combine_chunks()
    keys = sub.column("k").take(order).combine_chunks()
    last = np.ones(len(order), dtype=bool)
    if len(order) > 1:
        same_p = pc.equal(parts[1:], parts[:-1])
        same_k = pc.equal(keys[1:], keys[:-1])
        last[:-1] = ~np.asarray(pc.and_(same_p, same_k).to_numpy(zero_copy_only=False))
    return rows[order[last]]


def winners(table: pa.Table, strategy: Strategy) -> pa.Table:
    """The winning rows of ``table`` with a ``version`` column set (replaced if present)."""
    version = (
        table.column(VERSION)
        if VERSION in table.column_names and strategy.kind != "offset"
        else versions(table, strategy)
    )
    picked = winner_indices(table, version)
    out = table.take(pa.array(picked, type=pa.int64()))
    version_col = pc.take(version, pa.array(picked, type=pa.int64()))
    if VERSION in out.column_names:
        return out.set_column(out.column_names.index(VERSION), VERSION, version_col)
    return out.append_column(VERSION, version_col)
