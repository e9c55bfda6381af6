"""Executor side of the ``logsegments`` source: one :class:`SegmentRange` to Arrow batches.

The range is read with ``os.preadv`` into one reused buffer, in chunks of about
``chunk_bytes`` (never ``mmap``: a broker truncating the file during the read must not kill
the worker with SIGBUS); each chunk's
whole frames are scanned, checked and decoded by :mod:`pipelines.decode`, and a frame cut by the
chunk boundary is read again at the start of the next chunk. A frame larger than a chunk gets a
chunk of its own size.

Checks beyond the batch's own (CRC, header, records): a batch whose offsets fall below the
segment's base offset (file name) or reach the next segment's base offset is reported, not
emitted — Kafka would never serve it from this segment (one real fixture has a file whose name
says 100 and whose batch says 0). The end of a range: a torn frame at the end of the last
(active) segment is in-flight data and is silently left for the next run; anywhere else it is
damage and reported, like an impossible batchLength (after which nothing can be framed).

``kind="records"`` yields :data:`RECORDS_ARROW_SCHEMA` batches and skips reported batches;
with ``on_decode_error="fail"`` a batch that passed the header, CRC and bounds checks but
whose records cannot be decoded (bad varints, decompression failure, non-UTF-8 header key)
raises :class:`~logstore.errors.CorruptRecordError` (message starting with
:data:`~pipelines.sources.plan.UNDECODABLE_BATCH`) instead. A :class:`RangeReport` passed to
:func:`read_records` collects, from the same pass, what ``kind="batches"`` would say about the
range: where its sound batches end, their bytes and control batches, and a ``batches`` row
for every damaged batch (undecodable ones included) — the ingest job needs nothing else.

``kind="batches"`` yields one :data:`BATCHES_ARROW_SCHEMA` row per frame (and per unreadable
stop), with the reason in ``error``; ``verify="full"`` decodes the records too so that
decompression and record-level damage also show up there.

Thread-safe: no shared state; a worker reads each range once, in order.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from logstore.errors import CorruptRecordError, LoglakeError
from pipelines.decode.arrow import numpy_array, numpy_values, repeated_string, string_array
from pipelines.decode.batches import BatchScan, scan_batches, verify_batches
from pipelines.decode.codecs import CODEC_LABELS
from pipelines.decode.records import BatchError, decode_records
from pipelines.sources.plan import UNDECODABLE_BATCH, SegmentRange
from pipelines.sources.schema import BATCHES_ARROW_SCHEMA, RECORDS_ARROW_SCHEMA

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "RangeReport",
    "read_batches",
    "read_range",
    "read_records",
]

DEFAULT_CHUNK_BYTES = 16 << 20
_MS_PER_DAY = 86_400_000
# Timestamps are carried to Spark in microseconds: beyond this many ms they would overflow.
_MAX_MS = (2**63 - 1) // 1000


_CODECS = string_array([*CODEC_LABELS, "unknown", "unknown", "unknown"])


def _open(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        # Retention renames a segment to .deleted before removing it; the bytes are the same.
        try:
            return os.open(path + ".deleted", os.O_RDONLY)
        except FileNotFoundError:
            raise LoglakeError(
                "segment file vanished between planning and reading; plan again", path=path
            ) from None


def _chunks(
    rng: SegmentRange, chunk_bytes: int
) -> Iterator[tuple[np.ndarray, int, BatchScan, str | None]]:
    """``(buf, base_position, scan, stop_error)`` per chunk of whole frames of ``rng``."""
    fd = _open(rng.path)
    # One read buffer for the whole range: every decoded column is a copy, so the next chunk
    # may overwrite it, and reusing it spares the page faults of a fresh buffer per chunk.
    area = np.empty(0, np.uint8)
    try:
        pos = rng.start
        while pos < rng.end:
            want = min(chunk_bytes, rng.end - pos)
            if area.shape[0] < want:
                area = np.empty(want, np.uint8)
            got = os.preadv(fd, [area[:want].data], pos)
            if got == 0:
                return  # the file shrank since planning (truncation): nothing more to read
            shrunk = got < want
            final = pos + want >= rng.end
            buf = area[:got]
            scan = scan_batches(buf, base_position=pos)
            if scan.stop == "torn" and len(scan) == 0 and not final and not shrunk:
                # One frame larger than a chunk: read it whole.
                chunk_bytes = int.from_bytes(buf[8:12].tobytes(), "big", signed=True) + 12
                continue
            error = None
            if scan.stop == "corrupt":
                error = "impossible batchLength: the rest of the range cannot be framed"
            elif scan.stop == "torn" and (final or shrunk) and not rng.is_tail:
                error = f"torn batch: {rng.end - scan.end} bytes at the end of the range"
            yield buf, pos, scan, error
            if scan.stop == "corrupt" or final or shrunk:
                return
            pos = scan.end
    finally:
        os.close(fd)


def _bounds_errors(rng: SegmentRange, scan: BatchScan, errors: list[str | None]) -> None:
    base = scan.base_offset
    low = np.flatnonzero((base < rng.segment_base_offset) & (scan.magic == 2))
    for i in low.tolist():
        if errors[i] is None:
            errors[i] = (
                f"offset {int(base[i])} below the segment's base offset "
                f"{rng.segment_base_offset} (file name)"
            )
    if rng.next_base_offset is not None:
        high = np.flatnonzero((scan.last_offset >= rng.next_base_offset) & (scan.magic == 2))
        for i in high.tolist():
            if errors[i] is None:
                errors[i] = (
                    f"offset {int(scan.last_offset[i])} reaches the next segment's base offset "
                    f"{rng.next_base_offset}"
                )


@dataclass
class RangeReport:
    """What one pass of :func:`read_records` saw in its range, besides the records.

    ``next_offset``: one past the last offset of the last sound batch (control batches
    included) inside the range's offset window, or None; ``bytes`` and ``control_batches``
    count those sound batches; ``damaged``: one :data:`BATCHES_ARROW_SCHEMA` row (a dict) per
    damaged batch or unreadable stop, whatever the window (damage is always reported).
    JSON-able through :meth:`to_json`, so an executor can hand it back to the driver.
    """

    topic: str
    partition: int
    next_offset: int | None = None
    bytes: int = 0
    control_batches: int = 0
    damaged: list[dict[str, Any]] = field(default_factory=list)

    def add(  # noqa: PLR0917
        self,
        rng: SegmentRange,
        scan: BatchScan,
        crc_ok: np.ndarray,
        errors: list[str | None],
        stop_error: str | None,
        min_timestamp: int,
    ) -> None:
        """Account one chunk's frames (``errors`` final: decode failures filled in)."""
        has_error = _has_error(errors)
        sound = ~has_error & _in_window(rng, scan, min_timestamp)
        if sound.any():
            end = int(scan.last_offset[sound].max()) + 1
            self.next_offset = end if self.next_offset is None else max(self.next_offset, end)
            self.bytes += int(scan.size[sound].sum())
            self.control_batches += int(scan.is_control[sound].sum())
        if has_error.any():
            rows = scan.take(has_error)
            damaged: list[str | None] = [e for e in errors if e is not None]
            self.damaged.extend(_batch_rows(rng, rows, crc_ok[has_error], damaged).to_pylist())
        if stop_error is not None:
            self.damaged.extend(_stop_row(rng, scan.end, stop_error).to_pylist())

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "next_offset": self.next_offset,
            "bytes": self.bytes,
            "control_batches": self.control_batches,
            "damaged": self.damaged,
        }


def _in_window(rng: SegmentRange, scan: BatchScan, min_timestamp: int) -> np.ndarray:
    """Frames that can hold a record of ``rng``'s offset window at or after ``min_timestamp``."""
    return np.asarray(
        (scan.last_offset >= rng.start_offset)
        & (scan.base_offset < rng.until)
        & (scan.max_timestamp >= min_timestamp)
    )


def _has_error(errors: list[str | None]) -> np.ndarray:
    return np.fromiter((e is not None for e in errors), np.bool_, len(errors))


def _note_decode_errors(
    scan: BatchScan, errors: list[str | None], batch_errors: list[BatchError]
) -> None:
    """Put the decoder's per-batch failures into ``errors`` (indexed like ``scan``)."""
    if not batch_errors:
        return
    where = {int(p): i for i, p in enumerate(scan.position.tolist())}
    for err in batch_errors:
        errors[where[err.position]] = err.reason


def read_records(
    rng: SegmentRange,
    *,
    min_timestamp: int,
    max_timestamp: int,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    on_decode_error: str = "skip",
    report: RangeReport | None = None,
) -> Iterator[pa.RecordBatch]:
    """The records of ``rng`` as :data:`RECORDS_ARROW_SCHEMA` batches (damage skipped).

    ``on_decode_error="fail"``: raise on the first sound-looking batch that cannot be decoded.
    ``report``: filled as the range is read (complete once the iterator is exhausted).
    """
    for buf, base_position, scan, stop_error in _chunks(rng, chunk_bytes):
        crc_ok, errors = verify_batches(buf, scan, base_position=base_position)
        _bounds_errors(rng, scan, errors)
        select = np.fromiter((e is None for e in errors), np.bool_, len(errors))
        for decoded in decode_records(
            buf, scan, select=select, base_position=base_position,
            min_offset=rng.start_offset, until=rng.until,
            min_timestamp=min_timestamp, max_timestamp=max_timestamp,
        ):  # fmt: skip
            if decoded.errors and on_decode_error == "fail":
                err = decoded.errors[0]
                raise CorruptRecordError(
                    f"{UNDECODABLE_BATCH} at base offset {err.base_offset} of "
                    f"{rng.topic}-{rng.partition}: {err.reason}",
                    path=rng.path,
                    position=err.position,
                )
            if decoded.errors and report is not None:
                _note_decode_errors(scan, errors, decoded.errors)
            out = decoded.records
            n = out.num_rows
            if n == 0:
                continue
            ms = numpy_values(out.column("timestamp"), np.int64)
            us = np.clip(ms, -_MAX_MS, _MAX_MS) * 1000
            columns = [
                repeated_string(rng.topic, n),
                numpy_array(np.full(n, rng.partition, np.int32)),
                out.column("offset"),
                numpy_array(us, pa.timestamp("us", tz="UTC")),
                out.column("timestamp_type"),
                out.column("key"),
                out.column("value"),
                out.column("headers"),
                out.column("producer_id"),
                out.column("producer_epoch"),
                out.column("base_sequence"),
                out.column("is_transactional"),
                out.column("leader_epoch"),
                numpy_array(np.full(n, rng.segment_base_offset, np.int64)),
                out.column("batch_position"),
                out.column("codec"),
                numpy_array((ms // _MS_PER_DAY).astype(np.int32), pa.date32()),
            ]
            yield pa.RecordBatch.from_arrays(columns, schema=RECORDS_ARROW_SCHEMA)
        if report is not None:
            report.add(rng, scan, crc_ok, errors, stop_error, min_timestamp)


def read_batches(
    rng: SegmentRange,
    *,
    min_timestamp: int,
    verify: str = "crc",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> Iterator[pa.RecordBatch]:
    """One :data:`BATCHES_ARROW_SCHEMA` row per frame of ``rng`` (plus unreadable stops).

    Kept: frames with ``last_offset >= start_offset``, ``base_offset < until`` and
    ``max_timestamp >= min_timestamp``, and every frame with an error (damage is always
    reported, whatever the filters).
    """
    for buf, base_position, scan, stop_error in _chunks(rng, chunk_bytes):
        crc_ok, errors = verify_batches(buf, scan, base_position=base_position)
        _bounds_errors(rng, scan, errors)
        if verify == "full":
            select = np.fromiter((e is None for e in errors), np.bool_, len(errors))
            for decoded in decode_records(buf, scan, select=select, base_position=base_position):
                _note_decode_errors(scan, errors, decoded.errors)
        keep = _in_window(rng, scan, min_timestamp) | _has_error(errors)
        rows = scan.take(keep)
        kept_errors = [e for e, k in zip(errors, keep.tolist(), strict=True) if k]
        if len(rows):
            yield _batch_rows(rng, rows, crc_ok[keep], kept_errors)
        if stop_error is not None:
            yield _stop_row(rng, scan.end, stop_error)


def _batch_rows(
    rng: SegmentRange, scan: BatchScan, crc_ok: np.ndarray, errors: list[str | None]
) -> pa.RecordBatch:
    n = len(scan)
    v2 = scan.magic == 2

    def v2_only(values: np.ndarray, typ: pa.DataType) -> pa.Array:
        return numpy_array(values, typ, mask=~v2)

    columns = [
        repeated_string(rng.topic, n),
        numpy_array(np.full(n, rng.partition, np.int32)),
        repeated_string(rng.path, n),
        numpy_array(np.full(n, rng.segment_base_offset, np.int64)),
        numpy_array(scan.position),
        numpy_array(scan.size),
        numpy_array(scan.base_offset),
        v2_only(scan.last_offset, pa.int64()),
        v2_only(scan.records_count, pa.int32()),
        v2_only(scan.base_timestamp, pa.int64()),
        v2_only(scan.max_timestamp, pa.int64()),
        v2_only(scan.timestamp_type, pa.int32()),
        _codec_column(scan, v2),
        v2_only(scan.is_control, pa.bool_()),
        v2_only(scan.is_transactional, pa.bool_()),
        v2_only(scan.producer_id, pa.int64()),
        v2_only(scan.producer_epoch, pa.int16()),
        v2_only(scan.base_sequence, pa.int32()),
        v2_only(scan.leader_epoch, pa.int32()),
        numpy_array(scan.magic.astype(np.int32)),
        v2_only(scan.crc.astype(np.int64), pa.int64()),
        numpy_array(crc_ok),
        string_array(errors),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=BATCHES_ARROW_SCHEMA)


def _codec_column(scan: BatchScan, v2: np.ndarray) -> pa.Array:
    labels = _CODECS.take(numpy_array(scan.codec))
    if v2.all():
        return labels
    return pc.if_else(numpy_array(v2), labels, pa.scalar(None, pa.string()))


def _stop_row(rng: SegmentRange, position: int, error: str) -> pa.RecordBatch:
    row: dict[str, object] = dict.fromkeys(BATCHES_ARROW_SCHEMA.names)
    row.update(
        topic=rng.topic,
        partition=rng.partition,
        file=rng.path,
        segment_base_offset=rng.segment_base_offset,
        position=position,
        size=rng.end - position,
        crc_valid=False,
        error=error,
    )
    return pa.RecordBatch.from_pylist([row], schema=BATCHES_ARROW_SCHEMA)


def read_range(
    rng: SegmentRange,
    *,
    kind: str,
    min_timestamp: int,
    max_timestamp: int,
    verify: str = "crc",
    on_decode_error: str = "skip",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> Iterator[pa.RecordBatch]:
    """``read_records`` or ``read_batches`` of ``rng`` by ``kind``."""
    if kind == "records":
        return read_records(
            rng, min_timestamp=min_timestamp, max_timestamp=max_timestamp,
            chunk_bytes=chunk_bytes, on_decode_error=on_decode_error,
        )  # fmt: skip
    return read_batches(rng, min_timestamp=min_timestamp, verify=verify, chunk_bytes=chunk_bytes)
