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
says 100 and whose batch says 0).

Damage never ends a range: after a batchLength too small for a header, a frame that runs past
the range, or a frame whose CRC fails while a sound batch starts inside it (its length was
wrong), the reader *resynchronises* (:mod:`pipelines.sources.resync`): it scans the bytes that
follow (numpy, over the read buffer, only then) for the first position holding a sound
batch — magic 2, a length that fits, a base offset above the last sound batch's and inside
the segment's bounds, a matching CRC-32C,
offsets that agree with the segment's ``.index`` — and goes on from there. The bytes skipped
are one unreadable range (file, position, size), reported like a damaged batch. A frame cut by
the end of the last (active) segment may be a batch still being written: ``kind="batches"``
leaves it out, and the ingest job counts it as damage only when offsets below the high
watermark are missing (:mod:`pipelines.sources.damage`); elsewhere it is damage.

``kind="records"`` yields :data:`RECORDS_ARROW_SCHEMA` batches and skips reported batches;
with ``on_decode_error="fail"`` a batch that passed the header, CRC and bounds checks but
whose records cannot be decoded (bad varints, decompression failure, non-UTF-8 header key)
raises :class:`~logstore.errors.CorruptRecordError` (message starting with
:data:`~pipelines.sources.plan.UNDECODABLE_BATCH`) instead. A :class:`RangeReport` passed to
:func:`read_records` collects, from the same pass, what ``kind="batches"`` would say about the
range: where its sound batches end, their bytes and control batches, a ``batches`` row for
every damaged batch or unreadable range (undecodable ones included), and the damage as runs
between sound batches with the offsets around them — the ingest job needs nothing else.
With ``aborted`` (:class:`~pipelines.sources.transactions.AbortedRanges`), the batches of
aborted transactions are left undecoded (a numpy mask over each chunk's headers), while the
report still counts them as read; :func:`read_txn_frames` is the same walk for
transactions alone (the transactional batches and markers, nothing decoded), and a
:class:`RangeReport` with ``txn`` collects the same frames during the records walk.

``kind="batches"`` yields one :data:`BATCHES_ARROW_SCHEMA` row per frame (and per unreadable
stop), with the reason in ``error``; ``verify="full"`` decodes the records too so that
decompression and record-level damage also show up there.

Thread-safe: no shared state; a worker reads each range once, in order.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from logstore.errors import CorruptRecordError
from pipelines.decode.arrow import numpy_array, numpy_values, repeated_string, string_array
from pipelines.decode.batches import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchScan,
    scan_batches,
    verify_batches,
)
from pipelines.decode.codecs import CODEC_LABELS
from pipelines.decode.records import BatchError, decode_records
from pipelines.decode.transactions import txn_frames
from pipelines.logdir import PARTITION_DIR_MISSING, PartitionDirMissingError
from pipelines.sources.aborted import AbortedRanges
from pipelines.sources.plan import (
    SEGMENT_VANISHED,
    UNDECODABLE_BATCH,
    SegmentRange,
    SegmentVanishedError,
)
from pipelines.sources.resync import (
    MIN_RESYNC_READ,
    SegmentIndex,
    be_ints,
    find_sync,
)
from pipelines.sources.schema import BATCHES_ARROW_SCHEMA, RECORDS_ARROW_SCHEMA

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "RangeReport",
    "read_batches",
    "read_range",
    "read_records",
    "read_txn_frames",
]

DEFAULT_CHUNK_BYTES = 16 << 20
_MS_PER_DAY = 86_400_000
# Timestamps are carried to Spark in microseconds: beyond this many ms they would overflow.
_MAX_MS = (2**63 - 1) // 1000


# (producer_id, kind, first_offset, last_offset): see read_txn_frames
TxnFrames = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]

_CODECS = string_array([*CODEC_LABELS, "unknown", "unknown", "unknown"])


def _open(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        # Retention renames a segment to .deleted before removing it; the bytes are the same.
        try:
            return os.open(path + ".deleted", os.O_RDONLY)
        except FileNotFoundError:
            part_dir = os.path.dirname(path)
            if not os.path.isdir(part_dir):
                # the whole partition is gone from this process's view: a deleted topic, or
                # an executor without the driver's disk; the driver tells them apart
                raise PartitionDirMissingError(PARTITION_DIR_MISSING, path=part_dir) from None
            raise SegmentVanishedError(f"{SEGMENT_VANISHED}; plan again", path=path) from None


@dataclass(frozen=True, slots=True)
class _Gap:
    """Bytes ``[position, position + size)`` of a range that hold no readable batch.

    ``soft``: bytes that may be harmless — zero fill after the last batch, or a frame cut by
    the end of the active segment (in flight) — they count as damage only if they hide
    offsets below the high watermark (the driver decides, see :func:`stitch_regions`).
    """

    position: int
    size: int
    error: str
    soft: bool = False


@dataclass(frozen=True, slots=True)
class _Chunk:
    """The whole frames of one read (checked), then the gap that follows them, if any."""

    buf: np.ndarray
    base_position: int
    scan: BatchScan
    crc_ok: np.ndarray
    errors: list[str | None]
    gap: _Gap | None


def _doubtful(crc_ok: np.ndarray) -> np.ndarray:
    """Frames whose length no matching CRC vouches for (v0/v1 frames, whose CRC is not
    checked, included: a frame whose magic byte is damaged may look like one)."""
    return np.flatnonzero(~crc_ok)


def _chunks(
    rng: SegmentRange, chunk_bytes: int, data: bytes | memoryview | None = None
) -> Iterator[_Chunk]:
    """The checked frames of ``rng``, a read of about ``chunk_bytes`` at a time, with the
    unreadable byte ranges between them.

    Damage never ends the walk: after an impossible batchLength, a frame that runs past the
    range, or a frame whose CRC fails while a sound batch starts inside it (its length was
    wrong), the reader resynchronises on the next sound batch (:func:`find_sync`) and the
    bytes skipped are a :class:`_Gap`. Only the end of the range (or of the file) ends it.
    """
    fd = _open(rng.path) if data is None else -1
    # One read buffer for the whole range: every decoded column is a copy, so the next chunk
    # may overwrite it, and reusing it spares the page faults of a fresh buffer per chunk.
    area = np.empty(0, np.uint8)
    floor = rng.segment_base_offset  # a resync candidate's lowest base offset
    gap_start: int | None = None  # resynchronising: bytes from here on are unreadable so far
    gap_reason = ""
    gap_torn = False  # the damage is a frame cut short (at the active segment's end: in flight)
    need = 0  # a frame or candidate that must fit whole in the next read
    loaded: list[SegmentIndex] = []

    def index() -> SegmentIndex:  # read only when damage is found
        if not loaded:
            loaded.append(SegmentIndex.load(rng))
        return loaded[0]

    try:
        pos = rng.start
        while pos < rng.end:
            want = min(max(chunk_bytes, need), rng.end - pos)
            need = 0
            if area.shape[0] < want:
                area = np.empty(want, np.uint8)
            got = _pread(fd, data, area[:want], pos)
            shrunk = got < want
            final = pos + want >= rng.end or shrunk
            buf = area[:got]
            if gap_start is not None:
                sync = find_sync(buf, 0, got, pos, rng, floor, final, index())
                if sync.at is None:  # nothing sound up to the end of the range
                    yield _gap_chunk(
                        rng, buf, pos, gap_start, pos + got, gap_reason, gap_torn, tail=True
                    )
                    return
                if not sync.found:
                    pos += sync.at
                    need = max(sync.need, MIN_RESYNC_READ)
                    continue
                yield _gap_chunk(
                    rng, buf, pos, gap_start, pos + sync.at, gap_reason, gap_torn, tail=False
                )
                gap_start = None
                pos += sync.at
                continue
            if got == 0:
                return  # the file shrank since planning (truncation): nothing more to read
            scan = scan_batches(buf, base_position=pos)
            crc_ok, errors = verify_batches(buf, scan, base_position=pos)
            _bounds_errors(rng, scan, errors)
            # A frame that fails its checks may have a wrong length: if a sound batch starts
            # inside it, the walk went astray there and the frames after it are not frames.
            cut = None
            for i in _doubtful(crc_ok).tolist():
                start = int(scan.position[i]) - pos
                size = int(scan.size[i])
                below = _floor(floor, rng, scan, crc_ok, upto=i)
                sync = find_sync(buf, start + 1, start + size, pos, rng, below, final, index())
                if sync.found or sync.at is not None:
                    cut = (i, start, sync)
                    break
            if cut is not None:
                i, start, sync = cut
                keep = np.arange(len(scan)) < i
                head = scan.take(keep)
                head = dataclasses.replace(head, end=pos + start, stop="end")
                gap = None
                if sync.found:
                    assert sync.at is not None
                    gap = _Gap(
                        pos + start, sync.at - start,
                        f"bad batchLength {int(scan.batch_length[i])} (a sound batch starts "
                        f"inside it; {errors[i]}): {sync.at - start} bytes unreadable up to "
                        "the next sound batch",
                    )  # fmt: skip
                yield _Chunk(buf, pos, head, crc_ok[keep], errors[:i], gap)
                floor = _floor(floor, rng, scan, crc_ok, upto=i)
                if sync.found:
                    assert sync.at is not None
                    pos += sync.at
                else:  # read again from the doubtful frame, far enough to decide
                    assert sync.at is not None
                    need = max(sync.at - start + max(sync.need, HEADER_SIZE), size + HEADER_SIZE)
                    pos += start
                continue
            floor = _floor(floor, rng, scan, crc_ok)
            frames_end = int(scan.position[-1] + scan.size[-1]) if len(scan) else pos
            if scan.stop == "end":
                gap = None
                if frames_end < scan.end:
                    gap = _Gap(frames_end, scan.end - frames_end,
                               f"zero bytes after the last batch ({scan.end - frames_end} bytes)",
                               soft=True)  # fmt: skip
                yield _Chunk(buf, pos, scan, crc_ok, errors, gap)
                if final:
                    return
                pos = scan.end
                continue
            at = scan.end - pos  # relative start of the frame the walk could not take
            rest = got - at
            length = int(be_ints(buf, np.array([at + 8]), 4)[0]) if rest >= LOG_OVERHEAD else None
            fits = length is not None and scan.end + LOG_OVERHEAD + length <= rng.end
            if scan.stop == "torn" and (rest < LOG_OVERHEAD or fits) and not final:
                # Cut by the end of this read: read on from it (whole, if larger than a read).
                yield _Chunk(buf, pos, scan, crc_ok, errors, None)
                if length is not None and len(scan) == 0:
                    need = length + LOG_OVERHEAD
                pos = scan.end
                continue
            yield _Chunk(buf, pos, scan, crc_ok, errors, None)
            if length is None:
                gap_reason = "an incomplete batch header"
            elif scan.stop == "torn":
                gap_reason = f"batchLength {length} runs past the end of the range"
            else:
                gap_reason = f"impossible batchLength {length}"
            gap_torn = scan.stop == "torn"
            if final and rest < HEADER_SIZE:
                # Too short to hold a batch: nothing can follow it in the range.
                yield _gap_chunk(
                    rng, buf, pos, scan.end, pos + got, gap_reason, gap_torn, tail=True
                )
                return
            gap_start = scan.end
            pos = scan.end + 1
            need = MIN_RESYNC_READ
        if gap_start is not None:
            yield _gap_chunk(
                rng, area[:0], pos, gap_start, rng.end, gap_reason, gap_torn, tail=True
            )
    finally:
        if fd >= 0:
            os.close(fd)


def _pread(fd: int, data: bytes | memoryview | None, into: np.ndarray, pos: int) -> int:
    """Bytes from ``pos`` into ``into``: of the file ``fd``, or of ``data`` (bytes already
    in memory, e.g. a Fetch response's records) when given; the count read."""
    if data is None:
        return int(os.preadv(fd, [into.data], pos))
    got: int = max(0, min(int(into.shape[0]), len(data) - pos))
    into[:got] = np.frombuffer(data, np.uint8, got, pos)
    return got


def _floor(
    floor: int, rng: SegmentRange, scan: BatchScan, crc_ok: np.ndarray, upto: int | None = None
) -> int:
    """The lowest base offset a batch after ``scan``'s frames (the first ``upto``) may have:
    one past the last frame whose CRC matches and whose offsets fit the segment."""
    n = len(scan) if upto is None else upto
    base, last = scan.base_offset[:n], scan.last_offset[:n]
    ok = crc_ok[:n] & (base >= rng.segment_base_offset)
    if rng.next_base_offset is not None:
        ok &= last < rng.next_base_offset
    found = np.flatnonzero(ok)
    if not found.shape[0]:
        return floor
    return max(floor, int(last[found[-1]]) + 1)


def _gap_chunk(  # noqa: PLR0917
    rng: SegmentRange,
    buf: np.ndarray,
    pos: int,
    start: int,
    end: int,
    reason: str,
    torn: bool,
    *,
    tail: bool,
) -> _Chunk:
    """An empty chunk carrying the gap ``[start, end)`` (``tail``: it reaches the range's end).

    A frame cut short by the end of the active segment may be a batch still being written:
    that gap is soft.
    """
    size = end - start
    if tail and torn:
        # a frame cut short, or a wrong length: nothing sound follows to tell them apart
        error = f"torn batch or impossible batchLength ({reason}): {size} bytes at the end"
        error += " of the range"
    elif tail:
        error = f"{reason}: {size} bytes unreadable up to the end of the range"
    else:
        # a sound batch follows: the frame that ran past the range had a wrong length
        reason = f"impossible {reason}" if torn else reason
        error = f"{reason}: {size} bytes unreadable up to the next sound batch"
    soft = tail and torn and rng.is_tail
    empty = scan_batches(buf, end=0, base_position=pos)
    empty = dataclasses.replace(empty, end=end, stop="end")
    no = np.zeros(0, np.bool_)
    return _Chunk(buf, pos, empty, no, [], _Gap(start, size, error, soft=soft))


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
    damaged batch or unreadable byte range, whatever the window (damage is always reported).

    ``regions``: the damage as runs between sound batches, whatever the window — per run its
    file, first position, ``bytes`` (extent), ``from_offset`` (end of the sound batch before
    it in this range, None if none), ``to_offset`` (base offset of the sound batch after it,
    None if none), ``soft`` (only zero fill or a frame cut by the end of the active segment:
    damage only if it hides offsets below the high watermark) and its ``rows`` (the damaged
    rows). ``first_sound``/``last_end``: the first sound batch's base offset and one past the
    last one's last offset, whatever the window; with ``file``/``start`` they let the driver
    join runs across ranges (:func:`pipelines.sources.damage.stitch_regions`).
    JSON-able through :meth:`to_json`, so an executor can hand it back to the driver.

    ``txn``: when a list is given, :func:`read_records` appends to it, per chunk, what
    :func:`read_txn_frames` would return for it (the same sound frames, taken before any
    record is decoded): the ingest's single ``read_committed`` pass
    (:mod:`pipelines.ingest.committed`); :meth:`txn_frames` joins them. Not in the JSON.
    """

    topic: str
    partition: int
    next_offset: int | None = None
    bytes: int = 0
    control_batches: int = 0
    damaged: list[dict[str, Any]] = field(default_factory=list)
    file: str | None = None
    segment_base_offset: int | None = None
    start: int | None = None
    first_sound: int | None = None
    last_end: int | None = None
    regions: list[dict[str, Any]] = field(default_factory=list)
    txn: list[TxnFrames] | None = field(default=None, repr=False)
    _open: dict[str, Any] | None = field(default=None, repr=False)

    def txn_frames(self) -> TxnFrames:
        """The transaction frames collected in :attr:`txn`, in file order."""
        return _join_frames(self.txn or [])

    def add(
        self, rng: SegmentRange, chunk: _Chunk, errors: list[str | None], min_timestamp: int
    ) -> None:
        """Account one chunk's frames and gap (``errors`` final: decode failures filled in)."""
        scan = chunk.scan
        if self.file is None:
            self.file, self.segment_base_offset, self.start = (
                rng.path, rng.segment_base_offset, rng.start,
            )  # fmt: skip
        has_error = _has_error(errors)
        sound = ~has_error & _in_window(rng, scan, min_timestamp)
        if sound.any():
            end = int(scan.last_offset[sound].max()) + 1
            self.next_offset = end if self.next_offset is None else max(self.next_offset, end)
            self.bytes += int(scan.size[sound].sum())
            self.control_batches += int(scan.is_control[sound].sum())
        items: list[tuple[int, int, dict[str, Any], bool]] = []
        if has_error.any():
            bad = scan.take(has_error)
            damaged: list[str | None] = [e for e in errors if e is not None]
            rows = _batch_rows(rng, bad, chunk.crc_ok[has_error], damaged).to_pylist()
            self.damaged.extend(rows)
            items.extend(
                (p, s, row, False)
                for p, s, row in zip(bad.position.tolist(), bad.size.tolist(), rows, strict=True)
            )
        gap = chunk.gap
        if gap is not None:
            row = _stop_row(rng, gap.position, gap.size, gap.error).to_pylist()[0]
            if not gap.soft:
                self.damaged.append(row)
            items.append((gap.position, gap.size, row, gap.soft))
        self._track(rng, scan, np.flatnonzero(~has_error), items)

    def _track(
        self,
        rng: SegmentRange,
        scan: BatchScan,
        sound: np.ndarray,
        items: list[tuple[int, int, dict[str, Any], bool]],
    ) -> None:
        """Fold damaged ``items`` (in file order) into runs between the ``sound`` frames."""
        bases = scan.base_offset[sound]
        ends = scan.last_offset[sound] + 1
        if items or (self._open is not None and sound.size):
            positions = scan.position[sound]
            after = 0  # sound frames of this chunk before the open run's last item
            for position, size, row, soft in items:
                k = int(np.searchsorted(positions, position))
                if self._open is not None and k > after:
                    self._close(int(bases[after]))
                if self._open is None:
                    self._open = {
                        "file": rng.path,
                        "segment_base_offset": rng.segment_base_offset,
                        "position": position,
                        "bytes": 0,
                        "from_offset": int(ends[k - 1]) if k else self.last_end,
                        "to_offset": None,
                        "soft": True,
                        "rows": [],
                    }
                run = self._open
                run["bytes"] = position + size - run["position"]
                run["soft"] = run["soft"] and soft
                run["rows"].append(row)
                after = k
            if self._open is not None and after < sound.size:
                self._close(int(bases[after]))
        if sound.size:
            if self.first_sound is None:
                self.first_sound = int(bases[0])
            self.last_end = int(ends[-1])

    def _close(self, to_offset: int) -> None:
        assert self._open is not None
        self._open["to_offset"] = to_offset
        self.regions.append(self._open)
        self._open = None

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "next_offset": self.next_offset,
            "bytes": self.bytes,
            "control_batches": self.control_batches,
            "damaged": self.damaged,
            "file": self.file,
            "segment_base_offset": self.segment_base_offset,
            "start": self.start,
            "first_sound": self.first_sound,
            "last_end": self.last_end,
            "regions": self.regions + ([self._open] if self._open is not None else []),
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
    aborted: AbortedRanges | None = None,
    data: bytes | memoryview | None = None,
) -> Iterator[pa.RecordBatch]:
    """The records of ``rng`` as :data:`RECORDS_ARROW_SCHEMA` batches (damage skipped).

    ``on_decode_error="fail"``: raise on the first sound-looking batch that cannot be decoded.
    ``report``: filled as the range is read (complete once the iterator is exhausted).
    ``aborted``: the batches of these aborted transactions are not decoded (their offsets
    still count as read in ``report``: :mod:`pipelines.sources.transactions`).
    ``data``: the range's bytes are these (positions ``rng.start``..``rng.end`` index into
    them) instead of the file ``rng.path``: raw batches a Fetch returned
    (:mod:`pipelines.sources.fetch`), walked, checked and decoded exactly like a segment's.
    """
    for chunk in _chunks(rng, chunk_bytes, data):
        buf, base_position, scan, errors = chunk.buf, chunk.base_position, chunk.scan, chunk.errors
        select = np.fromiter((e is None for e in errors), np.bool_, len(errors))
        if report is not None and report.txn is not None and len(scan):
            frames = txn_frames(
                buf, scan, select, base_position=base_position,
                min_offset=rng.start_offset, until=rng.until,
            )  # fmt: skip
            report.txn.append(frames)
        if aborted is not None and len(aborted):
            txn = (scan.magic == 2) & scan.is_transactional & ~scan.is_control
            select &= ~aborted.mask(scan.producer_id, scan.base_offset, txn)
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
            report.add(rng, chunk, errors, min_timestamp)


def read_txn_frames(
    rng: SegmentRange,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    data: bytes | memoryview | None = None,
) -> TxnFrames:
    """``(producer_id, kind, first_offset, last_offset)`` of the sound transactional data
    batches and ABORT/COMMIT markers of ``rng`` inside its offset window, in file order
    (:func:`pipelines.decode.transactions.txn_frames`), walked exactly as
    :func:`read_records` walks the range (``data``: as there); records are not decoded."""
    parts = []
    for chunk in _chunks(rng, chunk_bytes, data):
        if len(chunk.scan):
            sound = ~_has_error(chunk.errors)
            frames = txn_frames(
                chunk.buf, chunk.scan, sound, base_position=chunk.base_position,
                min_offset=rng.start_offset, until=rng.until,
            )  # fmt: skip
            parts.append(frames)
    return _join_frames(parts)


def _join_frames(parts: list[TxnFrames]) -> TxnFrames:
    if not parts:
        empty = np.zeros(0, np.int64)
        return empty, np.zeros(0, np.int8), empty, empty
    pid, kind, first, last = zip(*parts, strict=True)
    return np.concatenate(pid), np.concatenate(kind), np.concatenate(first), np.concatenate(last)


def read_batches(
    rng: SegmentRange,
    *,
    min_timestamp: int,
    verify: str = "crc",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    data: bytes | memoryview | None = None,
) -> Iterator[pa.RecordBatch]:
    """One :data:`BATCHES_ARROW_SCHEMA` row per frame of ``rng`` (plus unreadable stops).

    Kept: frames with ``last_offset >= start_offset``, ``base_offset < until`` and
    ``max_timestamp >= min_timestamp``, and every frame with an error (damage is always
    reported, whatever the filters). ``data``: as in :func:`read_records`.
    """
    for chunk in _chunks(rng, chunk_bytes, data):
        buf, base_position, scan, errors = chunk.buf, chunk.base_position, chunk.scan, chunk.errors
        crc_ok = chunk.crc_ok
        if verify == "full":
            select = np.fromiter((e is None for e in errors), np.bool_, len(errors))
            for decoded in decode_records(buf, scan, select=select, base_position=base_position):
                _note_decode_errors(scan, errors, decoded.errors)
        keep = _in_window(rng, scan, min_timestamp) | _has_error(errors)
        rows = scan.take(keep)
        kept_errors = [e for e, k in zip(errors, keep.tolist(), strict=True) if k]
        if len(rows):
            yield _batch_rows(rng, rows, crc_ok[keep], kept_errors)
        if chunk.gap is not None and not chunk.gap.soft:
            yield _stop_row(rng, chunk.gap.position, chunk.gap.size, chunk.gap.error)


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


def _stop_row(rng: SegmentRange, position: int, size: int, error: str) -> pa.RecordBatch:
    row: dict[str, object] = dict.fromkeys(BATCHES_ARROW_SCHEMA.names)
    row.update(
        topic=rng.topic,
        partition=rng.partition,
        file=rng.path,
        segment_base_offset=rng.segment_base_offset,
        position=position,
        size=size,
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
