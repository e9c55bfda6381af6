"""Transaction markers of a range's batches, from their headers and control records (KIP-98).

A transaction marker is a control batch (attributes bit 5) holding one record whose key is
``version i16, type i16`` (type 0 ABORT, 1 COMMIT; see :mod:`logstore.protocol.control`). Its
record sits right after the 61-byte header, uncompressed::

    length varint, attributes i8, timestampDelta varlong, offsetDelta varint,
    keyLength varint, key

:func:`marker_types` reads that key for the control batches a caller names — a few bytes per
marker, one Python step per marker (one per transaction and partition), never per record.
:func:`txn_frames` selects, in file order, the frames ``read_committed`` needs: the
transactional data batches and the markers. Pure functions over a buffer and its
:class:`~pipelines.decode.batches.BatchScan`; thread-safe for distinct inputs.
"""

from __future__ import annotations

import numpy as np

from logstore.errors import CorruptRecordError
from logstore.protocol.control import ControlType
from logstore.protocol.varint import decode_varint, decode_varlong
from pipelines.decode.batches import (
    ATTR_CODEC_MASK,
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    HEADER_SIZE,
    BatchScan,
)

__all__ = ["KIND_ABORT", "KIND_COMMIT", "KIND_DATA", "KIND_OTHER", "marker_types", "txn_frames"]

KIND_DATA = 0  # a transactional data batch
KIND_COMMIT = 1  # a COMMIT marker
KIND_ABORT = 2  # an ABORT marker
KIND_OTHER = -1  # a control batch that is no transaction marker (or whose key is unreadable)
_KEY_BYTES = 4


def _marker_kind(buf: np.ndarray, start: int, end: int) -> int:
    """The kind of the control batch in ``buf[start:end]`` (its first record's key)."""
    view = buf[start + HEADER_SIZE : end].tobytes()
    try:
        _length, pos = decode_varint(view, 0)
        pos += 1  # attributes
        _ts, pos = decode_varlong(view, pos)
        _delta, pos = decode_varint(view, pos)
        key_length, pos = decode_varint(view, pos)
    except CorruptRecordError:
        return KIND_OTHER
    if key_length < _KEY_BYTES or pos + _KEY_BYTES > len(view):
        return KIND_OTHER
    version = int.from_bytes(view[pos : pos + 2], "big", signed=True)
    control_type = int.from_bytes(view[pos + 2 : pos + 4], "big", signed=True)
    if version < 0:
        return KIND_OTHER
    if control_type == ControlType.COMMIT:
        return KIND_COMMIT
    if control_type == ControlType.ABORT:
        return KIND_ABORT
    return KIND_OTHER


def marker_types(
    buf: np.ndarray, scan: BatchScan, idx: np.ndarray, *, base_position: int = 0
) -> np.ndarray:
    """The kind (``KIND_COMMIT``, ``KIND_ABORT`` or ``KIND_OTHER``) of the control frames
    ``idx`` of ``scan`` (frames inside ``buf``). A compressed control batch (Kafka never
    writes one) or an unreadable key is ``KIND_OTHER``: it ends no transaction, so the
    transaction stays open — the safe side (nothing of it is taken as committed)."""
    out = np.full(idx.shape[0], KIND_OTHER, np.int8)
    rel = scan.position[idx] - base_position
    ends = rel + scan.size[idx]
    codec = scan.attributes[idx] & ATTR_CODEC_MASK
    count = scan.records_count[idx]
    for j, (start, end, cid, n) in enumerate(
        zip(rel.tolist(), ends.tolist(), codec.tolist(), count.tolist(), strict=True)
    ):
        if cid == 0 and n >= 1:
            out[j] = _marker_kind(buf, start, end)
    return out


def txn_frames(
    buf: np.ndarray,
    scan: BatchScan,
    select: np.ndarray,
    *,
    base_position: int = 0,
    min_offset: int,
    until: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(producer_id, kind, first_offset, last_offset)`` of the selected v2 frames that
    matter to transactions — transactional data batches and ABORT/COMMIT markers — whose
    offsets reach ``[min_offset, until)``, in file order."""
    attrs = scan.attributes
    control = (attrs & ATTR_CONTROL) != 0
    wanted = (
        select
        & (scan.magic == 2)
        & (((attrs & ATTR_TRANSACTIONAL) != 0) | control)
        & (scan.last_offset >= min_offset)
        & (scan.base_offset < until)
    )
    idx = np.flatnonzero(wanted)
    kind = np.full(idx.shape[0], KIND_DATA, np.int8)
    is_marker = control[idx]
    if is_marker.any():
        kind[is_marker] = marker_types(buf, scan, idx[is_marker], base_position=base_position)
    keep = kind != KIND_OTHER
    idx, kind = idx[keep], kind[keep]
    return (
        np.asarray(scan.producer_id[idx], np.int64),
        kind,
        np.asarray(scan.base_offset[idx], np.int64),
        np.asarray(scan.last_offset[idx], np.int64),
    )
