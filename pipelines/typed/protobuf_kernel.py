"""The compiled Protobuf decoder's kernel: one numba pass over many payloads, no Python objects.

Why a kernel of our own: protobuf's upb parses fast, but it returns one Python message per
record and the walk of that message into a row is Python: that path (now
:class:`~pipelines.typed.protobuf.UpbDecoder`) measured 85k records/s for a 7-field message,
slower than a per-record ``MessageToDict`` baseline (92k/s). This kernel: 1.3-2.5M records/s
of CPU time against upb's 156-174k/s on the same payloads
(``tests/perf/bench_decode_protobuf.py``). The upb path stays as the reference and the
fallback; the Hypothesis test ``tests/unit/typed/test_protobuf_property.py`` checks one
against the other.

Tables: :mod:`protobuf_compile` turns a message descriptor into a program (per message node
its fields, a by-number index and an emission order); one kernel serves every schema (the
schema is data: a Spark worker meets a new schema without a numba compilation).

Protobuf fields come in any order and repeat (last one wins for scalars, messages merge,
repeated fields append), so a message is read in two steps per *frame* (one message being
filled; a stack of them replaces recursion):

1. scan: every tag of the message's byte ranges (a message given several times is the
   concatenation of its occurrences, which is protobuf's merge) is read; a known field with a
   compatible wire type becomes an *occurrence* (slot, start, end, wire type), an unknown
   field (or a known one with another wire type, as protobuf does) is skipped by its wire
   type, groups included; the occurrences are then bucketed by slot (a counting sort, stable,
   so each slot's occurrences stay in wire order);
2. emit: the fields in schema order write their Arrow entries: a scalar its last occurrence
   (absent: null with presence, else the proto3 default), a repeated field every occurrence
   (a packed one item by item), a message pushes a frame over its occurrences, a oneof picks
   the branch that came last (a message branch merges only the occurrences after the last
   other branch, as a oneof switch clears the message).

Entries are appended depth-first in schema order, which is Arrow's order for every node. The
output arenas, null placeholders and growth (``STATUS_FULL``) are those of
:mod:`arenas` (the Avro kernel's too: ``entry`` and ``null_entry``).

Crash behaviour: inputs are untrusted. Every read is bounds-checked; a bad row restores the
counters to their values at the row's start, writes a null row and records ``(code,
position)``; the other rows go on.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pipelines.decode._kernels import _copy, utf8_valid
from pipelines.typed.arenas import entry, null_entry

__all__ = ["ERRORS", "decode_rows"]

# Field table columns (protobuf_compile.Program.fields).
FIELD_NUMBER = 0
FIELD_OP = 1
FIELD_NODE = 2  # the value's node (a repeated field's item node)
FIELD_LIST = 3  # the list / map node of a repeated field, -1 for a singular one
FIELD_PRESENCE = 4  # 1: null when absent
FIELD_WT = 5  # the wire type of one value
FIELD_DEFAULT = 6  # 1: a message read as its default instance when absent (map values)

ITEM_FIELD = 0
ITEM_ONEOF = 1

# Value ops: how one value is read.
V_VARINT = 0  # the 64 bits as written (int32/uint32/enum/bool folded by the builder)
V_SINT32 = 1
V_SINT64 = 2
V_FIXED32 = 3
V_FIXED64 = 4
V_FLOAT = 5
V_DOUBLE = 6
V_STRING = 7
V_BYTES = 8
V_MESSAGE = 9
V_RAW = 10  # a message's bytes, kept (the JSON well-known types)

STATUS_DONE = 0
STATUS_FULL = 1
STATUS_SCRATCH = 2

ERR_TRUNCATED = 1
ERR_VARINT = 2
ERR_UTF8 = 4
ERR_SHORT = 12
ERR_NULL = 13
ERR_WIRE_TYPE = 20
ERR_FIELD_ZERO = 21
ERR_INDEXES = 22
ERR_GROUP = 23
ERR_TIME_RANGE = 24  # set by the caller
ERR_JSON = 25  # set by the caller
ERR_SCRATCH = 99  # not a row's error: the occurrence scratch is full (STATUS_SCRATCH)

ERRORS: dict[int, str] = {
    ERR_TRUNCATED: "truncated: a field runs past the end of its message",
    ERR_VARINT: "malformed varint",
    ERR_UTF8: "string is not valid UTF-8",
    ERR_SHORT: "payload shorter than its header",
    ERR_NULL: "value is null",
    ERR_WIRE_TYPE: "invalid wire type (4, 6 or 7) or an unexpected end-group tag",
    ERR_FIELD_ZERO: "field number 0",
    ERR_INDEXES: "message indexes name another message than the topic's first",
    ERR_GROUP: "unterminated or mismatched group",
    ERR_TIME_RANGE: "a Timestamp or Duration beyond 64-bit microseconds",
    ERR_JSON: "a Struct, Value, ListValue or Any that protobuf cannot parse or print",
}


@njit(cache=True, nogil=True, inline="always")
def _uvarint(buf: np.ndarray, p: int, end: int, max_bytes: int) -> tuple:  # type: ignore[type-arg]
    """Varint at ``p`` (at most ``max_bytes`` bytes before ``end``): (the 64 bits as int64,
    next position, 0 ok / ERR_TRUNCATED / ERR_VARINT)."""
    if p < end and buf[p] < 0x80:
        return np.int64(buf[p]), p + 1, 0
    u = np.uint64(0)
    shift = np.uint64(0)
    for i in range(max_bytes):
        q = p + i
        if q >= end:
            return np.int64(0), q, ERR_TRUNCATED
        b = buf[q]
        u |= np.uint64(b & 0x7F) << shift
        if b < 0x80:
            return np.int64(u), q + 1, 0
        shift += np.uint64(7)
    return np.int64(0), p + max_bytes, ERR_VARINT


@njit(cache=True, nogil=True, inline="always")
def _valid_entry(  # noqa: PLR0917
    n: int, counts: np.ndarray, ecap: np.ndarray, track: np.ndarray, valid: np.ndarray,
    vbase: np.ndarray,
) -> int:  # fmt: skip
    """Node ``n``'s next entry, marked valid where ``n`` can be null; -1 when it is full."""
    slot = entry(counts, ecap, n)
    if slot >= 0 and track[n]:
        valid[vbase[n] + slot] = 1
    return slot


@njit(cache=True, nogil=True, inline="always")
def _le(buf: np.ndarray, p: int, n: int) -> np.int64:
    u = np.uint64(0)
    for i in range(n):
        u |= np.uint64(buf[p + i]) << np.uint64(8 * i)
    return np.int64(u)


@njit(cache=True, nogil=True, inline="always")
def _zigzag(u: np.int64) -> np.int64:
    v = np.uint64(u)
    return np.int64(v >> np.uint64(1)) ^ -np.int64(v & np.uint64(1))


@njit(cache=True, nogil=True)
def _skip_group(buf: np.ndarray, q: int, e: int, number: int) -> int:
    """The position after the group opened by field ``number`` (its start tag read), or -1."""
    nums = np.empty(100, np.int64)
    nums[0] = number
    d = 1
    while q < e:
        tag, q, st = _uvarint(buf, q, e, 5)
        if st != 0:
            return -1
        wt = tag & 7
        n = tag >> 3
        if wt == 0:
            _, q, st = _uvarint(buf, q, e, 10)
            if st != 0:
                return -1
        elif wt in (1, 5):
            q += 8 if wt == 1 else 4
        elif wt == 2:
            ln, q, st = _uvarint(buf, q, e, 10)
            if st != 0 or ln < 0 or ln > e - q:
                return -1
            q += ln
        elif wt == 3:
            if d >= 100:
                return -1
            nums[d] = n
            d += 1
        elif wt == 4:
            if nums[d - 1] != n:
                return -1
            d -= 1
            if d == 0:
                return q
        else:
            return -1
    return -1


@njit(cache=True, nogil=True, inline="always")
def _scalar(  # type: ignore[no-untyped-def]  # noqa: PLR0917
    op: int, buf: np.ndarray, q: int, e: int, scratch: np.ndarray, f32: np.ndarray,
    f64: np.ndarray,
):  # fmt: skip
    """One numeric value of ``op`` at ``q``: (int bits, float value, next, status); floats
    go through ``scratch`` (``f32``/``f64`` are views of it)."""
    size = 4 if op in (V_FIXED32, V_FLOAT) else 8
    if op in (V_FIXED32, V_FLOAT, V_FIXED64, V_DOUBLE):
        if e - q < size:
            return np.int64(0), 0.0, e, ERR_TRUNCATED
        f = 0.0
        if op in (V_FLOAT, V_DOUBLE):
            for i in range(size):
                scratch[i] = buf[q + i]
            f = np.float64(f32[0]) if op == V_FLOAT else f64[0]
        return _le(buf, q, size), f, q + size, 0
    v, q2, st = _uvarint(buf, q, e, 10)
    if op == V_SINT32:
        v = _zigzag(v & 0xFFFFFFFF)
    elif op == V_SINT64:
        v = _zigzag(v)
    return v, 0.0, q2, st


@njit(cache=True, nogil=True)
def decode_rows(  # noqa: PLR0917
    fields: np.ndarray,
    fstart: np.ndarray,
    fend: np.ndarray,
    lookup_num: np.ndarray,
    lookup_row: np.ndarray,
    items: np.ndarray,
    istart: np.ndarray,
    iend: np.ndarray,
    oneof_rows: np.ndarray,
    max_fields: int,
    max_depth: int,
    buf: np.ndarray,
    offsets: np.ndarray,
    skip: int,
    row0: int,
    counts: np.ndarray,
    dcounts: np.ndarray,
    ecap: np.ndarray,
    dcap: np.ndarray,
    vbase: np.ndarray,
    dbase: np.ndarray,
    store: np.ndarray,
    width: np.ndarray,
    track: np.ndarray,
    dummy_start: np.ndarray,
    dummy_nodes: np.ndarray,
    vals: np.ndarray,
    fvals: np.ndarray,
    valid: np.ndarray,
    data: np.ndarray,
    err_code: np.ndarray,
    err_pos: np.ndarray,
    occ: np.ndarray,
    order: np.ndarray,
) -> tuple:  # type: ignore[type-arg]
    """Decode payloads ``row0..`` (payload ``i``: ``buf[offsets[i] + skip:offsets[i + 1]]``,
    message indexes first). Returns ``(status, row, node)`` as ``avro_kernel.decode_rows``,
    or ``STATUS_SCRATCH`` when row ``row`` has more occurrences on the frame stack than
    ``occ`` (``int64[4, cap]``: slot, start, end, wire type) and ``order`` (``int64[cap]``)
    hold: the caller grows both and calls again from that row."""
    nrows = offsets.shape[0] - 1
    nnodes = counts.shape[0]
    frames = max_depth + 2
    cap = occ.shape[1]
    occ_slot = occ[0]
    occ_start = occ[1]
    occ_end = occ[2]
    occ_wt = occ[3]
    slots = np.empty(frames * (2 * max_fields + 2), np.int64)
    f_node = np.empty(frames, np.int64)
    f_occ0 = np.empty(frames, np.int64)
    f_ord0 = np.empty(frames, np.int64)
    f_slot0 = np.empty(frames, np.int64)
    f_item = np.empty(frames, np.int64)
    f_k = np.empty(frames, np.int64)
    snap = np.empty(nnodes, np.int64)
    dsnap = np.empty(nnodes, np.int64)
    scratch = np.zeros(8, np.uint8)
    f32 = scratch[:4].view(np.float32)
    f64 = scratch.view(np.float64)
    for row in range(row0, nrows):
        for n in range(nnodes):
            snap[n] = counts[n]
            dsnap[n] = dcounts[n]
        start = offsets[row]
        end = offsets[row + 1]
        p = start + skip
        err = 0
        full = -1
        if p > end:
            err = ERR_SHORT
            p = end
        else:  # Confluent's message indexes: [0] (a 0 byte, or count 1 and index 0)
            c, q, st = _uvarint(buf, p, end, 10)
            err = st
            if st == 0:
                p = q
                c = _zigzag(c)
                if c == 1:
                    i, q, st = _uvarint(buf, p, end, 10)
                    err = st
                    if st == 0:
                        p = q
                        if _zigzag(i) != 0:
                            err = ERR_INDEXES
                elif c != 0:
                    err = ERR_INDEXES
        occ_start[0] = p
        occ_end[0] = end
        order[0] = 0
        top_occ = 1
        top_ord = 1
        top_slot = 0
        depth = -1
        push_node = 0
        push_lo = 0
        push_hi = 1
        pushing = True
        while err == 0 and full < 0:
            if pushing:  # 1. a new frame: its entry, the scan and the bucketing
                pushing = False
                m = push_node
                slot = _valid_entry(m, counts, ecap, track, valid, vbase)
                if slot < 0:
                    full = m
                    break
                depth += 1
                f_node[depth] = m
                f_occ0[depth] = top_occ
                f_slot0[depth] = top_slot
                f_item[depth] = istart[m]
                f_k[depth] = 0
                fs = fstart[m]
                nf = fend[m] - fs
                for t in range(push_lo, push_hi):
                    o = order[t]
                    q = occ_start[o]
                    e = occ_end[o]
                    while q < e:
                        p = q
                        tag, q, st = _uvarint(buf, q, e, 5)
                        if st != 0 or tag > 0xFFFFFFFF:
                            err = st if st != 0 else ERR_VARINT
                            break
                        num = tag >> 3
                        wt = tag & 7
                        if num == 0:
                            err = ERR_FIELD_ZERO
                            break
                        vs = q
                        if wt == 0:
                            _, q, st = _uvarint(buf, q, e, 10)
                            err = st
                        elif wt in (1, 5):
                            q += 8 if wt == 1 else 4
                            if q > e:
                                err = ERR_TRUNCATED
                        elif wt == 2:
                            ln, q, st = _uvarint(buf, q, e, 10)
                            err = st
                            if st == 0 and (ln < 0 or ln > e - q):
                                err = ERR_TRUNCATED
                            vs = q
                            q += ln
                        elif wt == 3:
                            q = _skip_group(buf, q, e, num)
                            if q < 0:
                                err = ERR_GROUP
                        else:
                            err = ERR_WIRE_TYPE
                        if err != 0:
                            break
                        lo = fs
                        hi = fs + nf
                        while lo < hi:  # binary search of the message's field numbers
                            mid = (lo + hi) >> 1
                            if lookup_num[mid] < num:
                                lo = mid + 1
                            else:
                                hi = mid
                        if lo < fs + nf and lookup_num[lo] == num:
                            r = lookup_row[lo]
                            fwt = fields[r, FIELD_WT]
                            if wt == fwt or (wt == 2 and fields[r, FIELD_LIST] >= 0 and fwt != 2):
                                if top_occ >= cap:
                                    err = ERR_SCRATCH
                                    break
                                occ_slot[top_occ] = r - fs
                                occ_start[top_occ] = vs
                                occ_end[top_occ] = q
                                occ_wt[top_occ] = wt
                                top_occ += 1
                    if err != 0:
                        break
                if err != 0:
                    break
                s0 = top_slot
                cur = s0 + nf + 1
                for j in range(nf + 1):
                    slots[s0 + j] = 0
                for o in range(f_occ0[depth], top_occ):
                    slots[s0 + occ_slot[o] + 1] += 1
                for j in range(nf):
                    slots[s0 + j + 1] += slots[s0 + j]
                    slots[cur + j] = slots[s0 + j]
                for o in range(f_occ0[depth], top_occ):
                    sl = occ_slot[o]
                    order[top_ord + slots[cur + sl]] = o
                    slots[cur + sl] += 1
                f_ord0[depth] = top_ord
                top_ord += top_occ - f_occ0[depth]
                top_slot += 2 * nf + 1
                continue
            # 2. the frame's next item, in schema order
            m = f_node[depth]
            it = f_item[depth]
            if it >= iend[m]:  # the message is complete
                top_occ = f_occ0[depth]
                top_ord = f_ord0[depth]
                top_slot = f_slot0[depth]
                depth -= 1
                if depth < 0:
                    break
                continue
            s0 = f_slot0[depth]
            ord0 = f_ord0[depth]
            fs = fstart[m]
            if items[it, 0] == ITEM_ONEOF:
                f_item[depth] = it + 1
                holder = items[it, 3]
                best = -1
                best_r = -1
                for x in range(items[it, 1], items[it, 2]):
                    r = oneof_rows[x]
                    b = ord0 + slots[s0 + r - fs + 1]
                    if b > ord0 + slots[s0 + r - fs] and order[b - 1] > best:
                        best = order[b - 1]
                        best_r = r
                if best_r < 0:
                    full = null_entry(
                        holder, counts, dcounts, ecap, dcap, vbase, dbase, store, width, track,
                        dummy_start, dummy_nodes, vals, valid, data,
                    )  # fmt: skip
                    continue
                slot = entry(counts, ecap, holder)
                if slot < 0:
                    full = holder
                    break
                valid[vbase[holder] + slot] = 1
                cutoff = -1  # the last occurrence of another branch
                for x in range(items[it, 1], items[it, 2]):
                    r = oneof_rows[x]
                    a = ord0 + slots[s0 + r - fs]
                    b = ord0 + slots[s0 + r - fs + 1]
                    if r != best_r:
                        if b > a:
                            cutoff = max(cutoff, order[b - 1])
                        full = null_entry(
                            fields[r, FIELD_NODE], counts, dcounts, ecap, dcap, vbase, dbase,
                            store, width, track, dummy_start, dummy_nodes, vals, valid, data,
                        )  # fmt: skip
                        if full >= 0:
                            break
                if full >= 0:
                    break
                r = best_r
                a = ord0 + slots[s0 + r - fs]
                b = ord0 + slots[s0 + r - fs + 1]
                while order[a] < cutoff:
                    a += 1
            else:
                r = items[it, 1]
                a = ord0 + slots[s0 + r - fs]
                b = ord0 + slots[s0 + r - fs + 1]
            op = fields[r, FIELD_OP]
            node = fields[r, FIELD_NODE]
            lst = fields[r, FIELD_LIST]
            if lst >= 0 and op == V_MESSAGE:  # repeated messages, map entries: a frame each
                kk = f_k[depth]
                if kk == 0:
                    slot = entry(counts, ecap, lst)
                    if slot < 0:
                        full = lst
                        break
                    vals[vbase[lst] + slot] = b - a
                if kk < b - a:
                    f_k[depth] = kk + 1
                    push_node = node
                    push_lo = a + kk
                    push_hi = a + kk + 1
                    pushing = True
                    continue
                f_k[depth] = 0
                f_item[depth] = it + 1
                continue
            if items[it, 0] == ITEM_FIELD:
                f_item[depth] = it + 1
            if op == V_MESSAGE:
                if b > a or fields[r, FIELD_DEFAULT]:
                    push_node = node
                    push_lo = a
                    push_hi = b
                    pushing = True
                    continue
                full = null_entry(
                    node, counts, dcounts, ecap, dcap, vbase, dbase, store, width, track,
                    dummy_start, dummy_nodes, vals, valid, data,
                )  # fmt: skip
                continue
            if lst < 0 and b == a and fields[r, FIELD_PRESENCE] and not fields[r, FIELD_DEFAULT]:
                full = null_entry(
                    node, counts, dcounts, ecap, dcap, vbase, dbase, store, width, track,
                    dummy_start, dummy_nodes, vals, valid, data,
                )  # fmt: skip
                continue
            # Values: a singular field's last occurrence (or its default), a repeated field's
            # every occurrence (packed ones item by item); raw messages: all, concatenated.
            first = a
            if lst < 0 and op != V_RAW and b > a:
                first = b - 1
            n_items = 0
            if op in (V_STRING, V_BYTES, V_RAW):
                if lst < 0 and op == V_RAW:  # one value: the occurrences merged
                    total = 0
                    for t in range(first, b):
                        total += occ_end[order[t]] - occ_start[order[t]]
                    if dcounts[node] + total > dcap[node]:
                        full = node
                        break
                    slot = _valid_entry(node, counts, ecap, track, valid, vbase)
                    if slot < 0:
                        full = node
                        break
                    vals[vbase[node] + slot] = total
                    for t in range(first, b):
                        o = order[t]
                        ln = occ_end[o] - occ_start[o]
                        _copy(data, dbase[node] + dcounts[node], buf, occ_start[o], ln)
                        dcounts[node] += ln
                    continue
                last = b if (b > first or lst >= 0) else first + 1  # absent: the default
                for t in range(first, last):
                    qs = 0
                    ln = 0
                    if t < b:
                        o = order[t]
                        qs = occ_start[o]
                        ln = occ_end[o] - qs
                        if op == V_STRING and not utf8_valid(buf, qs, qs + ln):
                            err = ERR_UTF8
                            p = qs
                            break
                    if dcounts[node] + ln > dcap[node]:
                        full = node
                        break
                    slot = _valid_entry(node, counts, ecap, track, valid, vbase)
                    if slot < 0:
                        full = node
                        break
                    vals[vbase[node] + slot] = ln
                    _copy(data, dbase[node] + dcounts[node], buf, qs, ln)
                    dcounts[node] += ln
                    n_items += 1
                if lst < 0 or err != 0 or full >= 0:
                    continue
                n_items = b - a
            else:
                last = b if (b > first or lst >= 0) else first + 1
                for t in range(first, last):
                    v = np.int64(0)
                    f = 0.0
                    if t < b:  # else the default
                        o = order[t]
                        q = occ_start[o]
                        e = occ_end[o]
                        packed = occ_wt[o] == 2
                        if packed and q == e:
                            continue  # an empty packed run
                        while True:
                            v, f, q, st = _scalar(op, buf, q, e, scratch, f32, f64)
                            if st != 0:
                                err = st
                                p = q
                                break
                            if not packed or q >= e:
                                break
                            # a packed run: every item but the last is written here
                            slot = entry(counts, ecap, node)
                            if slot < 0:
                                full = node
                                break
                            if op in (V_FLOAT, V_DOUBLE):
                                fvals[vbase[node] + slot] = f
                            else:
                                vals[vbase[node] + slot] = v
                            n_items += 1
                        if err != 0 or full >= 0:
                            break
                    slot = _valid_entry(node, counts, ecap, track, valid, vbase)
                    if slot < 0:
                        full = node
                        break
                    if op in (V_FLOAT, V_DOUBLE):
                        fvals[vbase[node] + slot] = f
                    else:
                        vals[vbase[node] + slot] = v
                    n_items += 1
                if lst < 0 or err != 0 or full >= 0:
                    continue
            slot = entry(counts, ecap, lst)
            if slot < 0:
                full = lst
                break
            vals[vbase[lst] + slot] = n_items
            f_item[depth] = it + 1
        if full < 0 and err == 0:
            err_code[row] = 0
            err_pos[row] = 0
            continue
        for n in range(nnodes):
            counts[n] = snap[n]
            dcounts[n] = dsnap[n]
        if full >= 0:
            return STATUS_FULL, row, full
        if err == ERR_SCRATCH:
            return STATUS_SCRATCH, row, -1
        err_code[row] = err
        err_pos[row] = p - start
        full = null_entry(
            0, counts, dcounts, ecap, dcap, vbase, dbase, store, width, track,
            dummy_start, dummy_nodes, vals, valid, data,
        )  # fmt: skip
        if full >= 0:
            for n in range(nnodes):
                counts[n] = snap[n]
                dcounts[n] = dsnap[n]
            return STATUS_FULL, row, full
    return STATUS_DONE, nrows, -1
