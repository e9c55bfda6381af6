"""Records of many batches to Arrow columns, without a Python object per record.

Pipeline for the batches a caller selected from a :class:`~pipelines.decode.batches.BatchScan`
(sound, non-control, inside the offset/time range):

1. group the batches so one group's records stream stays below ``max_chunk_bytes``;
2. per group, the records streams: uncompressed batches are used in place (``buf`` itself,
   no copy), compressed ones are decompressed (one call per batch) and laid end to end in one
   arena together with copies of the group's uncompressed streams (lz4 and snappy block by
   block straight into the arena; see :mod:`pipelines.decode.codecs`; the arena is reused
   from group to group);
3. :func:`~pipelines.decode._kernels.records_to_columns` walks every record once, applying
   the offset/time filters, and writes the final Arrow buffers as it goes: offsets and
   timestamps, keys and values (offsets + bytes + validity), the headers' list offsets;
   malformed batches are rolled back and reported (so are header keys that are not UTF-8:
   Arrow ``string``). The rare headers are copied by a second, short pass
   (:func:`~pipelines.decode._kernels.copy_headers`) into buffers of their exact size;
4. the per-batch columns (producer, epochs, position, codec...) are repeated by the number of
   rows each batch kept (``np.repeat``), and the Arrow arrays wrap the buffers
   (``Array.from_buffers``, no copy).

The output buffers come from Arrow's memory pool (see :func:`_empty`). Thread-safe for
distinct inputs; the kernels release the GIL.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from logstore.errors import CorruptRecordError
from logstore.protocol.batch import Codec
from pipelines.decode import _kernels as k
from pipelines.decode.arrow import numpy_array, repeated_string, string_array
from pipelines.decode.batches import (
    ATTR_CODEC_MASK,
    ATTR_CONTROL,
    ATTR_LOG_APPEND_TIME,
    ATTR_TRANSACTIONAL,
    HEADER_SIZE,
    BatchScan,
    as_uint8,
)
from pipelines.decode.codecs import (
    CODEC_LABELS,
    LZ4_INDEPENDENT,
    decompress,
    decompress_lz4_blocks_into,
    decompress_lz4_into,
    decompress_snappy_blocks_into,
    lz4_blocks,
    lz4_bound,
    lz4_frames,
    snappy_blocks,
)

__all__ = [
    "DECODED_SCHEMA",
    "HEADERS_TYPE",
    "MAX_CHUNK_BYTES",
    "MAX_OFFSET",
    "MIN_OFFSET",
    "BatchError",
    "DecodedRecords",
    "decode_records",
]

MIN_OFFSET = -(2**63)
MAX_OFFSET = 2**63 - 1
# Arrow binary offsets are int32: one output chunk's keys (or values) stay below 2 GiB.
_MAX_ARROW_BYTES = 2**31 - 1
# The default bound of one output chunk's records streams (decompressed). Why 32 MiB: every
# chunk costs its consumer a fixed price (its Arrow arrays, the ingest writer's partition
# checks and statistics, Parquet pages cut at the chunk's end), and with the segment reader's
# 16 MiB reads (``pipelines.sources.read``) a chunk is then, mostly, one read's records. One
# ingest task end to end (decode + the records table's Parquet writer, 1.43M records of 100
# bytes, CPU-s medians of 7 interleaved runs, load 1.5-3.5): lz4 212-214 ns a record with
# 8 MiB, 195-202 with 32 MiB (48 MiB alike); uncompressed 194-203 -> 184-193; 2 MiB +8%.
# The decoder alone is as fast with 2-8 MiB as with 32 (its source and output stay in cache:
# the measurement that first set 8 MiB); end to end, the consumer's per-chunk cost wins.
MAX_CHUNK_BYTES = 32 << 20

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
_LZ4 = int(Codec.LZ4)
_SNAPPY = int(Codec.SNAPPY)
_CODEC_LABELS = [label.encode() for label in CODEC_LABELS] + [b"unknown"] * 3
_CODEC_ARRAY = string_array([label.decode() for label in _CODEC_LABELS])


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
    max_chunk_bytes: int = MAX_CHUNK_BYTES,
) -> Iterator[DecodedRecords]:
    """Decode the records of the selected batches of ``scan`` (frames inside ``buf``).

    ``select`` (bool per frame) defaults to every v2 non-control frame; the caller removes
    frames :func:`~pipelines.decode.batches.verify_batches` rejected. Control batches are
    never decoded here. Records outside ``min_offset <= offset < until`` or
    ``min_timestamp <= timestamp <= max_timestamp`` are left out; batches that cannot hold
    any such record (by their header) are not even decompressed. ``max_chunk_bytes`` bounds
    one output chunk's records streams (:data:`MAX_CHUNK_BYTES`).
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
        starts = rel + HEADER_SIZE
        ends = rel + sizes
        cuts = _cuts(np.cumsum(sizes), limit)
        for lo, hi in itertools.pairwise(cuts):
            yield _decode_group(data, scan, idx[lo:hi], starts[lo:hi], ends[lo:hi], [], filters)
        return
    # Compressed batches (and the uncompressed ones among them) are laid end to end in an
    # arena, reused for every group: the decoded columns are copies, never views of it.
    view = data.data
    arena = _empty(limit, np.uint8)
    g_idx: list[int] = []
    g_start: list[int] = []
    g_end: list[int] = []
    errors: list[BatchError] = []
    filled = 0
    max_size = _MAX_ARROW_BYTES // 2  # one Arrow chunk holds at most 1 GiB of records
    frames = lz4_frames(data, rel + HEADER_SIZE, rel + sizes)
    lz4 = codec == _LZ4
    # One Python step per batch (not per record): plain ints, not numpy scalars.
    for i, p, end, cid, declared, first, block_max, single, flg in zip(
        idx.tolist(),
        rel.tolist(),
        (rel + sizes).tolist(),
        codec.tolist(),
        np.where(lz4, frames.declared, -1).tolist(),
        np.where(lz4, frames.first_block, -1).tolist(),
        frames.block_max.tolist(),
        frames.single.tolist(),
        frames.flg.tolist(),
        strict=True,
    ):
        stream = view[p + HEADER_SIZE : end]
        raw = None
        blocks = None
        snappy = None
        try:
            if declared > max_size:
                raise CorruptRecordError(f"lz4 data decompresses to more than {max_size} bytes")
            # lz4 block by block (no frame decoder) where the frame allows: one block, or
            # independent blocks; bounded by the declared size or what the blocks can hold.
            if first >= 0 and single >= 0:
                blocks = [(first + 4, single)]
            elif first >= 0 and flg & LZ4_INDEPENDENT:
                blocks = lz4_blocks(view, first, end, flg)
            if blocks is not None:
                size = declared if declared >= 0 else lz4_bound(blocks, block_max, max_size)
            elif declared >= 0:
                size = declared  # a linked frame of several blocks: liblz4's frame decoder
            elif cid == _SNAPPY and (snappy := snappy_blocks(stream)) is not None:
                size = sum(block[2] for block in snappy)
                if size > max_size:
                    raise CorruptRecordError(
                        f"snappy data decompresses to more than {max_size} bytes"
                    )
            else:
                # Bounded before allocation; no declared size: the full decompressor.
                raw = decompress(cid, stream, max_size=max_size) if cid else stream
                size = len(raw)
            if filled and filled + size > arena.shape[0]:
                yield _flush(arena[:filled], scan, g_idx, g_start, g_end, errors, filters)
                g_idx, g_start, g_end, errors, filled = [], [], [], [], 0
            if size > arena.shape[0]:
                arena = _empty(size, np.uint8)
            out = arena[filled : filled + size]
            if blocks is not None:
                held = decompress_lz4_blocks_into(view, blocks, block_max, out)
                if declared >= 0 and held != declared:
                    raise CorruptRecordError(f"lz4 frame declares {declared} bytes, holds {held}")
                size = held
            elif snappy is not None:
                decompress_snappy_blocks_into(stream, snappy, out)
            elif raw is None:
                decompress_lz4_into(stream, out)
            else:
                out[:] = np.frombuffer(raw, np.uint8)
        except CorruptRecordError as exc:
            errors.append(BatchError(int(scan.position[i]), int(scan.base_offset[i]), exc.message))
            continue
        g_idx.append(i)
        g_start.append(filled)
        filled += size
        g_end.append(filled)
    if g_idx or errors:
        yield _flush(arena[:filled], scan, g_idx, g_start, g_end, errors, filters)


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
    arena: np.ndarray,
    scan: BatchScan,
    g_idx: list[int],
    g_start: list[int],
    g_end: list[int],
    errors: list[BatchError],
    filters: _Filters,
) -> DecodedRecords:
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
    cap = int(counts.clip(0).sum(dtype=np.int64))
    space = int((ends - starts).sum())
    offsets, timestamps = _empty(cap, np.int64), _empty(cap, np.int64)
    keys = _BinaryOut(cap, space)
    values = _BinaryOut(cap, space)
    h_list = _empty(cap + 1, np.int32)
    h_raw = _empty(space, np.uint8)
    n, status, kept, keys.nulls, values.nulls, h_raw_bytes, nh, hk_bytes, hv_bytes = (
        k.records_to_columns(
            data, starts, ends, counts, scan.base_offset[idx], scan.base_timestamp[idx],
            scan.max_timestamp[idx], (attrs & ATTR_LOG_APPEND_TIME) != 0, *filters,
            offsets, timestamps, keys.offsets, keys.data, keys.validity,
            values.offsets, values.data, values.validity, h_list, h_raw,
        )
    )  # fmt: skip
    for b in np.flatnonzero(status).tolist():
        i = int(idx[b])
        errors.append(
            BatchError(int(scan.position[i]), int(scan.base_offset[i]),
                       k.ERROR_REASONS[int(status[b])])
        )  # fmt: skip
    h_keys = _BinaryOut(nh, hk_bytes)
    h_values = _BinaryOut(nh, hv_bytes)
    if nh:
        h_values.nulls = k.copy_headers(
            h_raw, h_raw_bytes, h_keys.offsets, h_keys.data,
            h_values.offsets, h_values.data, h_values.validity,
        )  # fmt: skip
    else:
        h_keys.offsets[0] = h_values.offsets[0] = 0
    headers = pa.Array.from_buffers(
        HEADERS_TYPE, n, [None, pa.py_buffer(h_list[: n + 1])], 0,
        children=[pa.StructArray.from_arrays(
            [h_keys.array(pa.string(), nh), h_values.array(pa.binary(), nh)],
            fields=list(HEADER_STRUCT),
        )],
    )  # fmt: skip
    b_attrs = np.repeat(attrs, kept)
    columns = [
        numpy_array(offsets[:n]),
        numpy_array(timestamps[:n]),
        numpy_array(((b_attrs & ATTR_LOG_APPEND_TIME) != 0).astype(np.int32)),
        keys.array(pa.binary(), n),
        values.array(pa.binary(), n),
        headers,
        numpy_array(np.repeat(scan.producer_id[idx], kept)),
        numpy_array(np.repeat(scan.producer_epoch[idx], kept)),
        numpy_array(np.repeat(scan.base_sequence[idx], kept)),
        numpy_array((b_attrs & ATTR_TRANSACTIONAL) != 0),
        numpy_array(np.repeat(scan.leader_epoch[idx], kept)),
        numpy_array(np.repeat(scan.position[idx], kept)),
        _codec_column(attrs & ATTR_CODEC_MASK, kept, n),
    ]
    records = pa.RecordBatch.from_arrays(columns, schema=DECODED_SCHEMA)
    return DecodedRecords(records, errors, int(idx.size))


def _empty(count: int, dtype: type[np.generic]) -> np.ndarray:
    """An uninitialised array in Arrow's memory pool.

    The pool (mimalloc) hands back the pages of the chunks the consumer already released,
    where fresh numpy/numba allocations of this size are new mappings: a page fault for every
    4 KiB written (measured: allocating in the kernel doubled the decoding time).
    """
    return np.frombuffer(pa.allocate_buffer(count * np.dtype(dtype).itemsize), dtype)


class _BinaryOut:
    """Buffers of one Arrow binary column of at most ``count`` slots and ``size`` bytes."""

    def __init__(self, count: int, size: int) -> None:
        self.offsets = _empty(count + 1, np.int32)
        self.data = _empty(size, np.uint8)
        self.validity = _empty((count + 7) // 8, np.uint8)
        self.nulls = 0

    def array(self, type_: pa.DataType, n: int) -> pa.Array:
        """The first ``n`` slots (the validity bitmap only when one is null)."""
        used = int(self.offsets[n])
        data = self.data[:used]
        if 2 * used < self.data.shape[0]:
            # Sized by the whole records stream, mostly unused (keys, typically): the chunk
            # keeps an exact copy rather than holding the large buffer.
            data = _empty(used, np.uint8)
            data[:] = self.data[:used]
        bitmap = pa.py_buffer(self.validity[: (n + 7) // 8]) if self.nulls else None
        buffers = [bitmap, pa.py_buffer(self.offsets[: n + 1]), pa.py_buffer(data)]
        return pa.Array.from_buffers(type_, n, buffers, self.nulls)


def _codec_column(codec: np.ndarray, kept: np.ndarray, n: int) -> pa.Array:
    """The ``codec`` labels of ``n`` rows, ``kept[i]`` of them from batch ``i``."""
    if codec.size and (codec == codec[0]).all():
        # One codec in the chunk (the usual case): the label repeated, without a gather.
        return repeated_string(_CODEC_LABELS[int(codec[0])], n)
    return _CODEC_ARRAY.take(numpy_array(np.repeat(codec, kept).astype(np.int8)))
