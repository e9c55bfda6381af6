"""Records of many batches to Arrow columns, without a Python object per record.

Pipeline for the batches a caller selected from a :class:`~pipelines.decode.batches.BatchScan`
(sound, non-control, inside the offset/time range):

1. group the batches so one group's records stream stays below ``max_chunk_bytes``;
2. per group, the records streams: uncompressed batches are used in place (``buf`` itself,
   no copy), compressed ones are decompressed (one call per batch) and laid end to end in one
   arena together with copies of the group's uncompressed streams;
3. :func:`~pipelines.decode._kernels.parse_records` finds every record's fields (varints) in
   one compiled pass, applying the offset/time filters, and flags malformed batches (their
   records are dropped, the batch is reported); a second pass locates record headers;
4. :func:`~pipelines.decode._kernels.gather` copies keys, values, header keys and header
   values into four contiguous buffers, and the Arrow arrays are assembled from offset +
   data (+ validity) buffers (``Array.from_buffers``); per-batch columns are gathered by
   the record's batch index.

Header keys must be UTF-8 (Arrow ``string``): a batch with a key that is not is reported as
corrupt rather than emitted with a broken string column. Thread-safe for distinct inputs; the
kernels release the GIL.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from logstore.errors import CorruptRecordError
from pipelines.decode import _kernels as k
from pipelines.decode.batches import (
    ATTR_CODEC_MASK,
    ATTR_CONTROL,
    ATTR_LOG_APPEND_TIME,
    ATTR_TRANSACTIONAL,
    BatchScan,
    as_uint8,
)
from pipelines.decode.codecs import CODEC_LABELS, decompress

__all__ = [
    "DECODED_SCHEMA",
    "HEADERS_TYPE",
    "MAX_OFFSET",
    "MIN_OFFSET",
    "BatchError",
    "DecodedRecords",
    "decode_records",
]

MIN_OFFSET = -(2**63)
MAX_OFFSET = 2**63 - 1
_HEADER_SIZE = 61
# Arrow binary offsets are int32: one output chunk's keys (or values) stay below 2 GiB.
_MAX_ARROW_BYTES = 2**31 - 1

HEADER_STRUCT = pa.struct(
    [pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())]
)
HEADERS_TYPE = pa.list_(pa.field("element", HEADER_STRUCT, nullable=False))

DECODED_SCHEMA = pa.schema(
    [
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.int64(), nullable=False),  # milliseconds since the epoch
        pa.field("timestamp_type", pa.int32(), nullable=False),  # 0 CreateTime, 1 LogAppendTime
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", HEADERS_TYPE, nullable=False),
        pa.field("producer_id", pa.int64(), nullable=False),
        pa.field("producer_epoch", pa.int16(), nullable=False),
        pa.field("base_sequence", pa.int32(), nullable=False),
        pa.field("is_transactional", pa.bool_(), nullable=False),
        pa.field("leader_epoch", pa.int32(), nullable=False),
        pa.field("batch_position", pa.int64(), nullable=False),
        pa.field("codec", pa.string(), nullable=False),
    ]
)
_CODEC_ARRAY = pa.array(list(CODEC_LABELS) + ["unknown"] * 3, pa.string())


class _Filters(NamedTuple):
    min_offset: int
    until: int
    min_ts: int
    max_ts: int


@dataclass(frozen=True, slots=True)
class BatchError:
    """A batch that could not be decoded: absolute file ``position`` and ``reason``."""

    position: int
    base_offset: int
    reason: str


@dataclass(slots=True)
class DecodedRecords:
    """One output chunk: the records (``DECODED_SCHEMA``) and the batches that failed."""

    records: pa.RecordBatch
    errors: list[BatchError] = field(default_factory=list)
    batches: int = 0  # batches decoded into this chunk (failed ones included)


def decode_records(
    buf: object,
    scan: BatchScan,
    *,
    select: np.ndarray | None = None,
    base_position: int = 0,
    min_offset: int = MIN_OFFSET,
    until: int = MAX_OFFSET,
    min_timestamp: int = MIN_OFFSET,
    max_timestamp: int = MAX_OFFSET,
    max_chunk_bytes: int = 8 << 20,
) -> Iterator[DecodedRecords]:
    """Decode the records of the selected batches of ``scan`` (frames inside ``buf``).

    ``select`` (bool per frame) defaults to every v2 non-control frame; the caller removes
    frames :func:`~pipelines.decode.batches.verify_batches` rejected. Control batches are
    never decoded here. Records outside ``min_offset <= offset < until`` or
    ``min_timestamp <= timestamp <= max_timestamp`` are left out; batches that cannot hold
    any such record (by their header) are not even decompressed. ``max_chunk_bytes`` bounds
    one output chunk's records streams: a few MiB keeps the gather's source and destination in
    cache (measured: 8 MiB chunks decode faster than 64 MiB ones).
    """
    data = as_uint8(buf)
    mask = (scan.magic == 2) & ((scan.attributes & ATTR_CONTROL) == 0)
    if select is not None:
        mask &= select
    mask &= scan.last_offset >= min_offset
    mask &= scan.base_offset < until
    mask &= scan.max_timestamp >= min_timestamp
    idx = np.flatnonzero(mask)
    if idx.size == 0:
        return
    rel = scan.position[idx] - base_position
    sizes = scan.size[idx]
    codec = scan.attributes[idx] & ATTR_CODEC_MASK
    limit = max(1, min(max_chunk_bytes, _MAX_ARROW_BYTES // 2))
    filters = _Filters(min_offset, until, min_timestamp, max_timestamp)
    if not codec.any():
        # All uncompressed: records are decoded in place, groups cut by raw size.
        starts = rel + _HEADER_SIZE
        ends = rel + sizes
        cuts = _cuts(np.cumsum(sizes), limit)
        for lo, hi in itertools.pairwise(cuts):
            yield _decode_group(data, scan, idx[lo:hi], starts[lo:hi], ends[lo:hi], [], filters)
        return
    view = data.data
    parts: list[object] = []
    g_idx: list[int] = []
    g_start: list[int] = []
    g_end: list[int] = []
    errors: list[BatchError] = []
    filled = 0
    for j in range(idx.size):
        i = int(idx[j])
        p = int(rel[j])
        stream = view[p + _HEADER_SIZE : p + int(sizes[j])]
        cid = int(codec[j])
        if cid:
            try:
                # Bounded before allocation: one Arrow chunk holds at most 1 GiB of records.
                stream = decompress(cid, stream, max_size=_MAX_ARROW_BYTES // 2)
            except CorruptRecordError as exc:
                errors.append(
                    BatchError(int(scan.position[i]), int(scan.base_offset[i]), exc.message)
                )
                continue
        if filled and filled + len(stream) > limit:
            yield _flush(parts, scan, g_idx, g_start, g_end, errors, filters)
            parts, g_idx, g_start, g_end, errors, filled = [], [], [], [], [], 0
        parts.append(stream)
        g_idx.append(i)
        g_start.append(filled)
        filled += len(stream)
        g_end.append(filled)
    if g_idx or errors:
        yield _flush(parts, scan, g_idx, g_start, g_end, errors, filters)


def _cuts(cum: np.ndarray, limit: int) -> list[int]:
    """Group boundaries over a cumulative-size array so each group stays near ``limit``."""
    cuts = [0]
    n = cum.shape[0]
    base = 0
    while cuts[-1] < n:
        nxt = int(np.searchsorted(cum, base + limit, side="right"))
        nxt = max(nxt, cuts[-1] + 1)
        cuts.append(min(nxt, n))
        base = int(cum[cuts[-1] - 1])
    return cuts


def _flush(  # noqa: PLR0917
    parts: list[object],
    scan: BatchScan,
    g_idx: list[int],
    g_start: list[int],
    g_end: list[int],
    errors: list[BatchError],
    filters: _Filters,
) -> DecodedRecords:
    arena = np.frombuffer(b"".join(parts), dtype=np.uint8)  # type: ignore[arg-type]
    failed_before = len(errors)
    out = _decode_group(
        arena, scan, np.asarray(g_idx, np.int64), np.asarray(g_start, np.int64),
        np.asarray(g_end, np.int64), errors, filters,
    )  # fmt: skip
    out.batches += failed_before
    return out


def _decode_group(  # noqa: PLR0917
    data: np.ndarray,
    scan: BatchScan,
    idx: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    errors: list[BatchError],
    filters: _Filters,
) -> DecodedRecords:
    attrs = scan.attributes[idx]
    counts = scan.records_count[idx]
    cap = int(counts.astype(np.int64).clip(0).sum())
    excluded = np.zeros(idx.size, np.bool_)
    while True:
        counts_run = np.where(excluded, 0, counts)
        starts_run = np.where(excluded, ends, starts)
        n, status, r_batch, r_offset, r_ts, r_kpos, r_klen, r_vpos, r_vlen, r_hpos, r_hcnt = (
            k.parse_records(
                data, starts_run, ends, counts_run, scan.base_offset[idx],
                scan.base_timestamp[idx], scan.max_timestamp[idx],
                (attrs & ATTR_LOG_APPEND_TIME) != 0,
                *filters, cap,
            )
        )  # fmt: skip
        r_hcnt = r_hcnt[:n]
        total_h = int(r_hcnt.sum())
        hk_pos, hk_len, hv_pos, hv_len = k.parse_headers(data, r_hpos, r_hcnt, n, total_h)
        hk_off, hk_data, _ = k.gather(data, hk_pos, hk_len, total_h)
        hkeys = pa.Array.from_buffers(
            pa.string(), total_h, [None, pa.py_buffer(hk_off), pa.py_buffer(hk_data)]
        )
        try:
            hkeys.validate(full=True)
            break
        except pa.ArrowInvalid:
            bad = _bad_utf8_batches(hk_data, hk_off, r_hcnt, r_batch[:n])
            excluded[bad] = True
            for b in bad.tolist():
                i = int(idx[b])
                errors.append(
                    BatchError(int(scan.position[i]), int(scan.base_offset[i]),
                               "record header key is not valid UTF-8")
                )  # fmt: skip
    for b in np.flatnonzero(status).tolist():
        i = int(idx[b])
        errors.append(
            BatchError(int(scan.position[i]), int(scan.base_offset[i]),
                       k.ERROR_REASONS[int(status[b])])
        )  # fmt: skip
    r_batch = r_batch[:n]
    hv_off, hv_data, hv_nulls = k.gather(data, hv_pos, hv_len, total_h)
    hvalues = _binary(hv_off, hv_data, hv_len, hv_nulls, total_h)
    list_offsets = np.zeros(n + 1, np.int32)
    np.cumsum(r_hcnt, out=list_offsets[1:])
    headers = pa.ListArray.from_arrays(
        pa.array(list_offsets),
        pa.StructArray.from_arrays([hkeys, hvalues], fields=list(HEADER_STRUCT)),
        type=HEADERS_TYPE,
    )
    k_off, k_data, k_nulls = k.gather(data, r_kpos, r_klen, n)
    v_off, v_data, v_nulls = k.gather(data, r_vpos, r_vlen, n)
    b_attrs = attrs[r_batch]
    columns = [
        pa.array(r_offset[:n]),
        pa.array(r_ts[:n]),
        pa.array(((b_attrs & ATTR_LOG_APPEND_TIME) != 0).astype(np.int32)),
        _binary(k_off, k_data, r_klen, k_nulls, n),
        _binary(v_off, v_data, r_vlen, v_nulls, n),
        headers,
        pa.array(scan.producer_id[idx][r_batch]),
        pa.array(scan.producer_epoch[idx][r_batch]),
        pa.array(scan.base_sequence[idx][r_batch]),
        pa.array((b_attrs & ATTR_TRANSACTIONAL) != 0),
        pa.array(scan.leader_epoch[idx][r_batch]),
        pa.array(scan.position[idx][r_batch]),
        _CODEC_ARRAY.take(pa.array((b_attrs & ATTR_CODEC_MASK).astype(np.int8))),
    ]
    records = pa.RecordBatch.from_arrays(columns, schema=DECODED_SCHEMA)
    return DecodedRecords(records, errors, int(idx.size))


def _binary(
    offsets: np.ndarray, values: np.ndarray, lengths: np.ndarray, nulls: int, n: int
) -> pa.Array:
    validity = None
    if nulls:
        validity = pa.py_buffer(np.packbits(lengths[:n] >= 0, bitorder="little"))
    return pa.Array.from_buffers(
        pa.binary(), n, [validity, pa.py_buffer(offsets), pa.py_buffer(values)], nulls
    )


def _bad_utf8_batches(
    hk_data: np.ndarray, hk_off: np.ndarray, r_hcnt: np.ndarray, r_batch: np.ndarray
) -> np.ndarray:
    """Group-local indexes of batches holding a header key that is not UTF-8 (rare path)."""
    raw = hk_data.tobytes()
    owner = np.repeat(r_batch, r_hcnt)
    bad: set[int] = set()
    for j in range(owner.shape[0]):
        try:
            raw[int(hk_off[j]) : int(hk_off[j + 1])].decode("utf-8")
        except UnicodeDecodeError:
            bad.add(int(owner[j]))
    return np.asarray(sorted(bad), np.int64)
