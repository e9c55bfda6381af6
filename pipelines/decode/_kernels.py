"""Compiled kernels of the vectorised decoder (numba, ``cache=True``, ``nogil=True``).

Every function here walks bytes of Kafka's RecordBatch v2 format and writes into numpy arrays
its caller allocated (or returns new ones); none creates a Python object per batch or record.
Inputs are untrusted: every read is bounds-checked and a malformed batch yields a status code
(``ERR_*``) instead of an exception, because raising from a numba kernel loses the position.

Record layout (inside a batch, after the 61-byte header, decompressed when a codec is set)::

    length varint | attributes i8 | timestampDelta varlong | offsetDelta varint
    keyLength varint (< 0 = null) | key | valueLength varint (-1 = null) | value
    headerCount varint | headerCount x (keyLength varint (>= 0) | key | valueLength varint | value)

Varints are zigzag-encoded (Protocol Buffers' ``sint32``/``sint64``).

Why numba: measured against the same algorithm run by CPython and against kafka-python (see
``tests/perf/bench_decoder.py``); a record costs tens of nanoseconds compiled, microseconds
interpreted. ``cache=True`` keeps the machine code next to this file so Spark's Python workers
load it instead of compiling (about a second per kernel on first use).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = [
    "ERROR_REASONS",
    "ERR_BAD_COUNT",
    "ERR_BAD_HEADER_COUNT",
    "ERR_BAD_LENGTH",
    "ERR_NULL_HEADER_KEY",
    "ERR_OK",
    "ERR_RECORD_SIZE",
    "ERR_TRAILING",
    "ERR_TRUNCATED",
    "ERR_VARINT",
    "SCAN_BAD_LENGTH",
    "SCAN_END",
    "SCAN_TORN",
    "gather",
    "parse_headers",
    "parse_records",
    "scan_headers",
]

# Status of one batch after parse_records.
ERR_OK = 0
ERR_TRUNCATED = 1
ERR_VARINT = 2
ERR_BAD_LENGTH = 3
ERR_RECORD_SIZE = 4
ERR_BAD_HEADER_COUNT = 5
ERR_NULL_HEADER_KEY = 6
ERR_TRAILING = 7
ERR_BAD_COUNT = 8

ERROR_REASONS: dict[int, str] = {
    ERR_TRUNCATED: "record runs past the end of the batch",
    ERR_VARINT: "malformed varint in a record",
    ERR_BAD_LENGTH: "negative record length",
    ERR_RECORD_SIZE: "record length disagrees with its fields",
    ERR_BAD_HEADER_COUNT: "negative record header count",
    ERR_NULL_HEADER_KEY: "record header with a null key",
    ERR_TRAILING: "bytes left after the last record of the batch",
    ERR_BAD_COUNT: "recordsCount cannot fit in the batch's records",
}

# Why scan_headers stopped.
SCAN_END = 0  # reached the end of the range exactly
SCAN_TORN = 1  # an incomplete batch (or header) at the end of the range
SCAN_BAD_LENGTH = 2  # batchLength smaller than a header: the walk cannot continue

_HEADER_SIZE = 61
_LOG_OVERHEAD = 12


@njit(cache=True, nogil=True, inline="always")
def _be64(buf: np.ndarray, p: int) -> np.int64:
    v = np.uint64(0)
    for i in range(8):
        v = (v << np.uint64(8)) | np.uint64(buf[p + i])
    return np.int64(v)


@njit(cache=True, nogil=True, inline="always")
def _be32(buf: np.ndarray, p: int) -> np.int32:
    v = np.uint32(0)
    for i in range(4):
        v = (v << np.uint32(8)) | np.uint32(buf[p + i])
    return np.int32(v)


@njit(cache=True, nogil=True, inline="always")
def _be16(buf: np.ndarray, p: int) -> np.int16:
    return np.int16((np.uint16(buf[p]) << np.uint16(8)) | np.uint16(buf[p + 1]))


@njit(cache=True, nogil=True)
def scan_headers(buf: np.ndarray, start: int, end: int, cap: int) -> tuple:  # type: ignore[type-arg]
    """Walk batch frames in ``buf[start:end]`` and unpack every header; no CRC, no records.

    Returns ``(n, stop, stop_pos, pos, base_offset, batch_length, leader_epoch, magic, crc,
    attributes, last_offset_delta, base_ts, max_ts, producer_id, producer_epoch,
    base_sequence, records_count)``: the first ``n`` entries of each array are the whole
    frames found (magic 0/1 frames too: they share the 12-byte offset+length framing, so the
    walk can step over them; their other fields are meaningless and the caller reports them).
    ``stop`` is one of ``SCAN_*`` and ``stop_pos`` where the walk ended. ``cap`` bounds the
    number of frames (the caller passes ``(end - start) // 12 + 1``, which always suffices).
    """
    pos = np.empty(cap, np.int64)
    base_offset = np.empty(cap, np.int64)
    batch_length = np.empty(cap, np.int32)
    leader_epoch = np.empty(cap, np.int32)
    magic = np.empty(cap, np.int8)
    crc = np.empty(cap, np.uint32)
    attributes = np.empty(cap, np.int16)
    last_offset_delta = np.empty(cap, np.int32)
    base_ts = np.empty(cap, np.int64)
    max_ts = np.empty(cap, np.int64)
    producer_id = np.empty(cap, np.int64)
    producer_epoch = np.empty(cap, np.int16)
    base_sequence = np.empty(cap, np.int32)
    records_count = np.empty(cap, np.int32)
    n = 0
    p = start
    stop = SCAN_END
    while p < end:
        remaining = end - p
        if remaining < _LOG_OVERHEAD:
            stop = SCAN_TORN
            break
        length = _be32(buf, p + 8)
        mg = np.int8(buf[p + 16]) if remaining > 16 else np.int8(2)
        min_length = _HEADER_SIZE - _LOG_OVERHEAD if mg == 2 else 14  # v0/v1: crc..valueLen
        if length < min_length:
            stop = SCAN_BAD_LENGTH
            break
        size = np.int64(length) + _LOG_OVERHEAD
        if size > remaining:
            stop = SCAN_TORN
            break
        pos[n] = p
        base_offset[n] = _be64(buf, p)
        batch_length[n] = length
        magic[n] = mg
        if mg == 2:
            leader_epoch[n] = _be32(buf, p + 12)
            crc[n] = np.uint32(_be32(buf, p + 17))
            attributes[n] = _be16(buf, p + 21)
            last_offset_delta[n] = _be32(buf, p + 23)
            base_ts[n] = _be64(buf, p + 27)
            max_ts[n] = _be64(buf, p + 35)
            producer_id[n] = _be64(buf, p + 43)
            producer_epoch[n] = _be16(buf, p + 51)
            base_sequence[n] = _be32(buf, p + 53)
            records_count[n] = _be32(buf, p + 57)
        else:
            leader_epoch[n] = -1
            crc[n] = 0
            attributes[n] = 0
            last_offset_delta[n] = 0
            base_ts[n] = -1
            max_ts[n] = -1
            producer_id[n] = -1
            producer_epoch[n] = -1
            base_sequence[n] = -1
            records_count[n] = 0
        n += 1
        p += int(size)
    return (
        n,
        stop,
        p,
        pos,
        base_offset,
        batch_length,
        leader_epoch,
        magic,
        crc,
        attributes,
        last_offset_delta,
        base_ts,
        max_ts,
        producer_id,
        producer_epoch,
        base_sequence,
        records_count,
    )


@njit(cache=True, nogil=True, inline="always")
def _varint(buf: np.ndarray, p: int, end: int, max_bytes: int) -> tuple:  # type: ignore[type-arg]
    """Zigzag varint at ``p`` (at most ``max_bytes`` bytes, before ``end``): (value, next, ok)."""
    if p < end:
        b = buf[p]
        if b < 0x80:  # the common case: one byte
            u = np.uint64(b)
            return np.int64(u >> np.uint64(1)) ^ -np.int64(u & np.uint64(1)), p + 1, True
    u = np.uint64(0)
    shift = np.uint64(0)
    for i in range(max_bytes):
        q = p + i
        if q >= end:
            return np.int64(0), q, False
        b = buf[q]
        u |= np.uint64(b & 0x7F) << shift
        if b < 0x80:
            return np.int64(u >> np.uint64(1)) ^ -np.int64(u & np.uint64(1)), q + 1, True
        shift += np.uint64(7)
    return np.int64(0), p + max_bytes, False


@njit(cache=True, nogil=True)
def parse_records(  # noqa: PLR0917 (numba kernels take positional arrays)
    data: np.ndarray,
    b_start: np.ndarray,
    b_end: np.ndarray,
    b_count: np.ndarray,
    b_base_offset: np.ndarray,
    b_base_ts: np.ndarray,
    b_max_ts: np.ndarray,
    b_log_append: np.ndarray,
    min_offset: int,
    until: int,
    min_ts: int,
    max_ts: int,
    cap: int,
) -> tuple:  # type: ignore[type-arg]
    """First pass: locate every record's fields in ``data``; keep those inside the filters.

    Batch ``i``'s records (already decompressed) are ``data[b_start[i]:b_end[i]]`` and hold
    ``b_count[i]`` records. A record is kept when ``min_offset <= offset < until`` and
    ``min_ts <= timestamp <= max_ts``; its timestamp is the batch's maxTimestamp under
    LogAppendTime (as Kafka's clients report it), else baseTimestamp + timestampDelta.

    Returns ``(n, status, r_batch, r_offset, r_ts, r_kpos, r_klen, r_vpos, r_vlen, r_hpos,
    r_hcnt)``: ``n`` kept records (``cap`` is an upper bound: the sum of ``b_count``); a batch
    with ``status[i] != ERR_OK`` contributes no record at all (its partial output is rolled
    back). Lengths are -1 for null; ``r_hpos`` is where the record's first header starts.
    """
    nb = b_start.shape[0]
    status = np.zeros(nb, np.int8)
    r_batch = np.empty(cap, np.int32)
    r_offset = np.empty(cap, np.int64)
    r_ts = np.empty(cap, np.int64)
    r_kpos = np.empty(cap, np.int64)
    r_klen = np.empty(cap, np.int32)
    r_vpos = np.empty(cap, np.int64)
    r_vlen = np.empty(cap, np.int32)
    r_hpos = np.empty(cap, np.int64)
    r_hcnt = np.empty(cap, np.int32)
    n = 0
    for bi in range(nb):
        p = b_start[bi]
        end = b_end[bi]
        count = b_count[bi]
        mark = n
        err = ERR_OK
        if count < 0 or np.int64(count) * 7 > end - p:
            err = ERR_BAD_COUNT
        for _ in range(count if err == ERR_OK else 0):
            length, p, ok = _varint(data, p, end, 5)
            if not ok:
                err = ERR_VARINT
                break
            if length < 0:
                err = ERR_BAD_LENGTH
                break
            rec_end = p + length
            if rec_end > end:
                err = ERR_TRUNCATED
                break
            p += 1  # attributes: unused by magic 2
            ts_delta, p, ok = _varint(data, p, rec_end, 10)
            if not ok:
                err = ERR_VARINT
                break
            off_delta, p, ok = _varint(data, p, rec_end, 5)
            if not ok:
                err = ERR_VARINT
                break
            klen, p, ok = _varint(data, p, rec_end, 5)
            if not ok:
                err = ERR_VARINT
                break
            if klen < 0:
                klen = -1  # any negative length is null, as in Kafka's DefaultRecord
            kpos = p
            if klen > 0:
                p += klen
            vlen, p, ok = _varint(data, p, rec_end, 5)
            if not ok:
                err = ERR_VARINT if p <= rec_end else ERR_RECORD_SIZE
                break
            if vlen < 0:
                vlen = -1
            vpos = p
            if vlen > 0:
                p += vlen
            hcnt, p, ok = _varint(data, p, rec_end, 5)
            if not ok:
                err = ERR_VARINT if p <= rec_end else ERR_RECORD_SIZE
                break
            if hcnt < 0:
                err = ERR_BAD_HEADER_COUNT
                break
            hpos = p
            for _h in range(hcnt):
                hk, p, ok = _varint(data, p, rec_end, 5)
                if not ok:
                    err = ERR_VARINT if p <= rec_end else ERR_RECORD_SIZE
                    break
                if hk < 0:
                    err = ERR_NULL_HEADER_KEY
                    break
                p += hk
                hv, p, ok = _varint(data, p, rec_end, 5)
                if not ok:
                    err = ERR_VARINT if p <= rec_end else ERR_RECORD_SIZE
                    break
                if hv > 0:
                    p += hv
            if err != ERR_OK:
                break
            if p != rec_end:
                err = ERR_RECORD_SIZE
                break
            offset = b_base_offset[bi] + off_delta
            if b_log_append[bi]:
                ts = b_max_ts[bi]
            else:
                ts = b_base_ts[bi] + ts_delta
            if offset < min_offset or offset >= until or ts < min_ts or ts > max_ts:
                continue
            r_batch[n] = bi
            r_offset[n] = offset
            r_ts[n] = ts
            r_kpos[n] = kpos
            r_klen[n] = klen
            r_vpos[n] = vpos
            r_vlen[n] = vlen
            r_hpos[n] = hpos
            r_hcnt[n] = hcnt
            n += 1
        if err == ERR_OK and p != end:
            err = ERR_TRAILING
        if err != ERR_OK:
            status[bi] = err
            n = mark
    return n, status, r_batch, r_offset, r_ts, r_kpos, r_klen, r_vpos, r_vlen, r_hpos, r_hcnt


@njit(cache=True, nogil=True)
def parse_headers(
    data: np.ndarray, r_hpos: np.ndarray, r_hcnt: np.ndarray, n: int, total: int
) -> tuple:  # type: ignore[type-arg]
    """Second pass over records with headers (already validated by :func:`parse_records`).

    Returns ``(hk_pos, hk_len, hv_pos, hv_len)`` for the ``total`` headers of the first ``n``
    records, in record order.
    """
    hk_pos = np.empty(total, np.int64)
    hk_len = np.empty(total, np.int32)
    hv_pos = np.empty(total, np.int64)
    hv_len = np.empty(total, np.int32)
    j = 0
    end = data.shape[0]
    for i in range(n):
        p = r_hpos[i]
        for _ in range(r_hcnt[i]):
            hk, p, _ok = _varint(data, p, end, 5)
            hk_pos[j] = p
            hk_len[j] = hk
            p += hk
            hv, p, _ok = _varint(data, p, end, 5)
            hv_pos[j] = p
            hv_len[j] = hv if hv >= 0 else -1
            if hv > 0:
                p += hv
            j += 1
    return hk_pos, hk_len, hv_pos, hv_len


@njit(cache=True, nogil=True)
def gather(data: np.ndarray, pos: np.ndarray, length: np.ndarray, n: int) -> tuple:  # type: ignore[type-arg]
    """Copy ``n`` slices ``data[pos[i]:pos[i]+length[i]]`` end to end (null when length < 0).

    Returns ``(offsets int32[n+1], values uint8[total], nulls)`` — Arrow's binary layout;
    ``nulls`` counts the null slots. The caller keeps ``total`` below 2**31.
    """
    offsets = np.empty(n + 1, np.int32)
    total = np.int64(0)
    nulls = 0
    offsets[0] = 0
    for i in range(n):
        ln = length[i]
        if ln > 0:
            total += ln
        elif ln < 0:
            nulls += 1
        offsets[i + 1] = np.int32(total)
    out = np.empty(total, np.uint8)
    for i in range(n):
        ln = length[i]
        if ln > 0:
            o = offsets[i]
            out[o : o + ln] = data[pos[i] : pos[i] + ln]
    return offsets, out, nulls
