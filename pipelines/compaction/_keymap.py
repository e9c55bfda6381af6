"""The key map's lean record walk (numba, ``cache=True``, ``nogil=True``).

The offset strategy needs, of every record of the cleanable range, only its offset, its key
and whether its value is null. :func:`record_keys` walks the records of uncompressed batches
where they lie (the segment's bytes themselves) and writes just that: the offsets, the keys
end to end (Arrow ``large_binary`` layout: int64 offsets + bytes), a key-null flag and a
value-null flag per record. Values and headers are stepped over, never copied; everything
else is what :func:`pipelines.decode._kernels.records_to_columns` does with no offset or time
filter: the same checks in the same order (lengths, varints, header count, null header keys,
trailing bytes, header keys that are not UTF-8), the same status codes
(:data:`pipelines.decode._kernels.ERROR_REASONS`), and a batch that fails leaves no record
behind. So a segment is damaged for this walk exactly when it is for the full decoder.

Record layout: see :mod:`pipelines.decode._kernels`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pipelines.decode._kernels import (
    ERR_BAD_COUNT,
    ERR_BAD_HEADER_COUNT,
    ERR_BAD_LENGTH,
    ERR_HEADER_KEY_UTF8,
    ERR_NULL_HEADER_KEY,
    ERR_OK,
    ERR_RECORD_SIZE,
    ERR_TRAILING,
    ERR_TRUNCATED,
    ERR_VARINT,
    _copy,
    _varint,
    utf8_valid,
)

__all__ = ["record_keys"]


@njit(cache=True, nogil=True)
def record_keys(  # noqa: PLR0917 (one pass, arrays)
    data: np.ndarray,
    b_start: np.ndarray,
    b_end: np.ndarray,
    b_count: np.ndarray,
    b_base_offset: np.ndarray,
    row: int,
    r_offset: np.ndarray,
    k_off: np.ndarray,
    k_data: np.ndarray,
    k_null: np.ndarray,
    v_null: np.ndarray,
) -> tuple:  # type: ignore[type-arg]
    """The records of batches ``i`` in ``data[b_start[i]:b_end[i]]`` (``b_count[i]`` records,
    uncompressed), appended from row ``row`` on: ``r_offset``, ``k_null``, ``v_null`` per
    row, the key bytes at ``k_data[k_off[row]:]`` and ``k_off[row + 1:]`` (the caller set
    ``k_off[row]``). Room needed past ``row``: the sum of the positive ``b_count`` rows and
    ``b_end - b_start`` key bytes.

    Returns ``(rows written, status per batch)``; a batch with a status other than
    ``ERR_OK`` wrote nothing."""
    nb = b_start.shape[0]
    status = np.zeros(nb, np.int8)
    n = row
    kt = k_off[row]
    for bi in range(nb):
        p = b_start[bi]
        end = b_end[bi]
        count = b_count[bi]
        mark = n
        mark_kt = kt
        err = ERR_OK
        bad_utf8 = False
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
            _ts_delta, p, ok = _varint(data, p, rec_end, 10)
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
            if klen > 0:
                if p + klen > rec_end:
                    err = ERR_RECORD_SIZE
                    break
                _copy(k_data, kt, data, p, klen)
                kt += klen
                p += klen
            vlen, p, ok = _varint(data, p, rec_end, 5)
            if not ok:
                err = ERR_VARINT
                break
            if vlen > 0:
                if p + vlen > rec_end:
                    err = ERR_RECORD_SIZE
                    break
                p += vlen
            hcnt, p, ok = _varint(data, p, rec_end, 5)
            if not ok:
                err = ERR_VARINT
                break
            if hcnt < 0:
                err = ERR_BAD_HEADER_COUNT
                break
            for _h in range(hcnt):
                hk, p, ok = _varint(data, p, rec_end, 5)
                if not ok:
                    break
                if hk < 0:
                    err = ERR_NULL_HEADER_KEY
                    break
                if not utf8_valid(data, p, min(p + hk, rec_end)):
                    bad_utf8 = True
                p += hk
                hv, p, ok = _varint(data, p, rec_end, 5)
                if not ok:
                    break
                if hv > 0:
                    p += hv
            if err != ERR_OK:
                break
            if not ok:
                err = ERR_VARINT if p <= rec_end else ERR_RECORD_SIZE
                break
            if p != rec_end:
                err = ERR_RECORD_SIZE
                break
            r_offset[n] = b_base_offset[bi] + off_delta
            k_null[n] = klen < 0
            v_null[n] = vlen < 0
            n += 1
            k_off[n] = kt
        if err == ERR_OK and p != end:
            err = ERR_TRAILING
        if err == ERR_OK and bad_utf8:
            err = ERR_HEADER_KEY_UTF8
        if err != ERR_OK:
            status[bi] = err
            n = mark
            kt = mark_kt
    return n, status
