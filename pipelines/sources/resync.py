"""Resynchronising a segment read after damage: where the next sound batch starts.

:mod:`pipelines.sources.read` reads a range chunk by chunk; when a frame's length cannot be
trusted (a batchLength too small for a header, a frame past the range, a CRC that fails while
a sound batch starts inside it) it calls :func:`find_sync` to scan the bytes that follow for
the first position holding a batch it can vouch for, checked against the segment's ``.index``
(:class:`SegmentIndex`). Runs only on damage: vectorised over the read buffer with numpy, one
CRC-32C per candidate that passes the header checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from crc32c import crc32c

from pipelines.decode.batches import ATTR_CODEC_MASK, HEADER_SIZE, LOG_OVERHEAD
from pipelines.sources.plan import SegmentRange

__all__ = [
    "MIN_RESYNC_READ",
    "SegmentIndex",
    "Sync",
    "be_ints",
    "find_sync",
]

# A resync read is at least this long, so that its last unexamined header start moves on.
MIN_RESYNC_READ = 4 * HEADER_SIZE


def be_ints(buf: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """Big-endian signed integers of ``width`` bytes at positions ``at`` of ``buf``."""
    v = np.zeros(at.shape[0], np.uint64)
    for i in range(width):
        v = (v << np.uint64(8)) | buf[at + i].astype(np.uint64)
    bits = 8 * width
    if bits == 64:
        return v.view(np.int64)
    signed = v.astype(np.int64)
    return np.where(signed >= 1 << (bits - 1), signed - (1 << bits), signed)


@dataclass(frozen=True, slots=True)
class SegmentIndex:
    """The usable prefix of a segment's ``.index``: ``last_offset[i]`` (absolute) is the last
    offset of the batch that starts at ``position[i]``."""

    last_offset: np.ndarray
    position: np.ndarray

    @staticmethod
    def load(rng: SegmentRange) -> SegmentIndex:
        try:
            raw = np.fromfile(Path(rng.path).with_suffix(".index"), dtype=">i4")
        except OSError:
            raw = np.empty(0, ">i4")
        pairs = raw[: raw.shape[0] // 2 * 2].reshape(-1, 2).astype(np.int64)
        rel, pos = pairs[:, 0], pairs[:, 1]
        # A preallocated or stale tail: keep the prefix where both columns strictly increase.
        good = np.ones(rel.shape[0], np.bool_)
        good[1:] = (np.diff(rel) > 0) & (np.diff(pos) > 0)
        bad = np.flatnonzero(~good | (rel < 0) | (pos < 0))
        stop = int(bad[0]) if bad.shape[0] else rel.shape[0]
        return SegmentIndex(rel[:stop] + rng.segment_base_offset, pos[:stop])

    def agrees(self, position: int, base_offset: int, last_offset: int) -> bool:
        """Whether a batch ``[base_offset, last_offset]`` at ``position`` fits the index: an
        entry there names its last offset, entries before it name lower offsets, entries
        after it higher ones (an empty index agrees with anything)."""
        j = int(np.searchsorted(self.position, position))
        if j > 0 and int(self.last_offset[j - 1]) >= base_offset:
            return False
        if j < self.position.shape[0]:
            if int(self.position[j]) == position:
                return int(self.last_offset[j]) == last_offset
            return int(self.last_offset[j]) > last_offset
        return True


@dataclass(frozen=True, slots=True)
class Sync:
    """What a resync search found: ``at`` (relative) is a verified batch start when ``found``;
    else the search must go on from ``at`` with at least ``need`` bytes read (``at`` None:
    nothing more to look at)."""

    found: bool
    at: int | None
    need: int = 0


def find_sync(  # noqa: PLR0917
    buf: np.ndarray,
    lo: int,
    hi: int,
    base_position: int,
    rng: SegmentRange,
    floor: int,
    final: bool,
    index: SegmentIndex,
) -> Sync:
    """The first position in ``buf[lo:hi]`` where a sound v2 batch starts, by scanning.

    A candidate has magic 2, a batchLength that fits before the range's end, a base offset at
    or above ``floor`` (the end of the last sound batch, or the segment's base offset) and
    below the next segment's, sane lastOffsetDelta/recordsCount/codec, a CRC-32C that
    matches, and offsets that agree with the segment's ``.index`` (which knows where later
    batches start and what they hold): bytes that merely look like a header are never taken.
    Vectorised over the buffer (numpy); one CRC per candidate that passes the header checks.
    Runs only on damage.
    """
    got = buf.shape[0]
    top = min(hi, got - HEADER_SIZE + 1)  # candidates whose whole header is in buf
    # Windows that double from 64 KiB: the next sound batch is usually close, and a buffer of
    # many MB is only scanned as far as needed.
    start, width = lo, 1 << 16
    while start < top:
        stop = min(top, start + width)
        found = _sync_in(buf, start, stop, base_position, rng, floor, final, index)
        if found is not None:
            return found
        start, width = stop, width * 2
    if not final and hi > top:
        return Sync(False, max(top, lo), 0)
    return Sync(False, None)


def _sync_in(  # noqa: PLR0917
    buf: np.ndarray,
    lo: int,
    hi: int,
    base_position: int,
    rng: SegmentRange,
    floor: int,
    final: bool,
    index: SegmentIndex,
) -> Sync | None:
    """:func:`find_sync` over candidates ``[lo, hi)`` (whole headers in ``buf``); None: none."""
    got = buf.shape[0]
    cands = lo + np.flatnonzero(buf[lo + 16 : hi + 16] == 2).astype(np.int64)
    if not cands.shape[0]:
        return None
    length = be_ints(buf, cands + 8, 4)
    base = be_ints(buf, cands, 8)
    delta = be_ints(buf, cands + 23, 4)
    count = be_ints(buf, cands + 57, 4)
    codec = buf[cands + 22] & ATTR_CODEC_MASK
    ok = (
        (length >= HEADER_SIZE - LOG_OVERHEAD)
        & (base_position + cands + LOG_OVERHEAD + length <= rng.end)
        & (base >= floor)
        & (delta >= 0)
        & (count >= 0)
        & (count <= delta + 1)
        & (codec <= 4)
    )
    # a segment's offsets fit in 32 bits above its base (relative offsets in its indexes)
    span = rng.segment_base_offset + 2**31
    ok &= (base < span) & (delta < span - base)
    if rng.next_base_offset is not None:
        ok &= base <= rng.next_base_offset - 1 - np.maximum(delta, 0)
    view = buf.data
    for i in np.flatnonzero(ok).tolist():
        c = int(cands[i])
        size = int(length[i]) + LOG_OVERHEAD
        if c + size > got:  # cannot be checked in this read: read again from there
            if final:
                continue  # the file ends before it (it shrank): not a batch
            return Sync(False, c, size)
        stored = int.from_bytes(view[c + 17 : c + 21], "big")
        if crc32c(view[c + 21 : c + size]) == stored and index.agrees(
            base_position + c, int(base[i]), int(base[i]) + int(delta[i])
        ):
            return Sync(True, c)
    return None
