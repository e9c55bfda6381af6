"""The compiled interpreter of the Avro decoder: one pass over many payloads, no Python objects.

:mod:`pipelines.typed.avro_compile` turns a (writer, reader) schema pair into a *program*, an
``int64[n, 4]`` array of instructions ``(op, a, b, c)``; :func:`decode_rows` runs it once per
payload. One kernel serves every schema (compiled once, ``cache=True``), which is why the
schema is data here rather than generated code: a Spark worker meets a new schema without a
numba compilation (about a second per function).

Output layout: :mod:`arenas` (every reader node owns a region of entries in ``vals`` /
``valid`` and of bytes in ``data``, shared with the Protobuf kernel). What a node writes per entry:

- scalars (boolean, int, long, float, double, enum index): one ``vals`` slot;
- strings and bytes: the length in ``vals``, the bytes in ``data``;
- fixed, decimals (16 or 32 little-endian two's-complement bytes): ``width`` bytes in ``data``;
- arrays and maps: the item count in ``vals`` (written when the last block ends);
- records and unions-as-structs: only the validity byte.

Validity bytes are written only for the nodes that can be null (``track[n]``: the root, and
the targets of ``OP_NULL``); the others are valid by construction, and skipping their bytes
saves a store and a memory stream per value (~15% of the kernel's time, measured).

A null (a union's null branch, or a row that failed) is a validity byte 0 and a placeholder
entry for the node and every struct-descendant (``dummy_*``), so that child arrays keep the
length of their parent, as Arrow requires.

Crash behaviour: inputs are untrusted. Every read is bounds-checked; a bad row restores the
counters to their values at the row's start, writes a null row, records ``(code, position)``
and the walk goes on. When a region is full the kernel restores the row's counters and returns
``STATUS_FULL`` with the node: the caller grows that region and calls again from that row.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from pipelines.decode._kernels import _copy, _varint, utf8_valid
from pipelines.typed.arenas import entry, null_entry

__all__ = [
    "ERRORS",
    "ERR_NULL",
    "ERR_SCHEMA",
    "OPS",
    "STATUS_DONE",
    "STATUS_FULL",
    "decode_rows",
]

# Instructions: (op, a, b, c). ``a`` is the reader node, -1 to read and discard.
OP_END = 0  # the value is complete
OP_ENTRY = 1  # a record / union-as-struct entry of node a (valid)
OP_NULLV = 2  # a null read into Arrow's null type (node a)
OP_BOOL = 3
OP_INT = 4  # b: 1 = store as float64 (promotion); c: the end of a time of day's range, or 0
OP_LONG = 5  # b: 1 = store as float64; c: as OP_INT
OP_FLOAT = 6
OP_DOUBLE = 7
OP_BYTES = 8  # b: 1 = check UTF-8 (the reader wants a string)
OP_FIXED = 9  # b: size
OP_DEC_BYTES = 10  # b: output width (16 / 32)
OP_DEC_FIXED = 11  # b: size, c: output width
OP_ENUM = 12  # b: offset of the writer->reader symbol map, c: writer symbol count
OP_ARRAY = 13  # b: pc after the loop, c: smallest encoded item (bytes)
OP_LOOP = 14  # b: pc of the loop's first item instruction
OP_UNION = 15  # b: branch count; the next b instructions are OP_JUMPs
OP_JUMP = 16  # b: target pc
OP_NULL = 17  # a null for node a (and placeholders for its struct descendants)
OP_ERROR = 18  # b: message index (the schema cannot resolve this branch)

OPS = {
    name: value for name, value in globals().items() if name.startswith("OP_")
}  # for tests and dumps

STATUS_DONE = 0
STATUS_FULL = 1

ERR_TRUNCATED = 1
ERR_VARINT = 2
ERR_NEGATIVE_LENGTH = 3
ERR_UTF8 = 4
ERR_UNION_INDEX = 5
ERR_ENUM_INDEX = 6
ERR_ENUM_SYMBOL = 7
ERR_INT_RANGE = 8
ERR_DECIMAL_RANGE = 9
ERR_BLOCK_COUNT = 10
ERR_TRAILING = 11
ERR_SHORT = 12
ERR_NULL = 13  # set by the caller: a null input value
ERR_TIME_RANGE = 14
ERR_SCHEMA = 100  # + the message index of an OP_ERROR

ERRORS: dict[int, str] = {
    ERR_TRUNCATED: "truncated: the value ends inside a field",
    ERR_VARINT: "malformed varint",
    ERR_NEGATIVE_LENGTH: "negative string/bytes length",
    ERR_UTF8: "string is not valid UTF-8",
    ERR_UNION_INDEX: "union branch index out of range",
    ERR_ENUM_INDEX: "enum index out of range",
    ERR_ENUM_SYMBOL: "enum symbol unknown to the reader schema, which has no default",
    ERR_INT_RANGE: "int value outside 32 bits",
    ERR_DECIMAL_RANGE: "decimal has more digits than its precision",
    ERR_BLOCK_COUNT: "array/map block count larger than the payload can hold",
    ERR_TRAILING: "bytes left after the value",
    ERR_SHORT: "payload shorter than its header",
    ERR_NULL: "value is null",
    ERR_TIME_RANGE: "time of day outside 00:00-24:00 (time-millis / time-micros)",
}

# Zero-size items (nulls, empty records) cost no bytes: their block counts are bounded apart.
_MAX_FREE_ITEMS = 1 << 24
_MAX_LIST = (1 << 31) - 1


@njit(cache=True, nogil=True)
def decode_rows(  # noqa: PLR0917
    prog: np.ndarray,
    enum_maps: np.ndarray,
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
    bounds: np.ndarray,
    bound_at: np.ndarray,
    dummy_start: np.ndarray,
    dummy_nodes: np.ndarray,
    vals: np.ndarray,
    fvals: np.ndarray,
    valid: np.ndarray,
    data: np.ndarray,
    err_code: np.ndarray,
    err_pos: np.ndarray,
    max_depth: int,
) -> tuple:  # type: ignore[type-arg]
    """Decode payloads ``row0..`` (payload ``i`` is ``buf[offsets[i] + skip:offsets[i + 1]]``).

    Returns ``(status, row, node)``: ``STATUS_DONE`` when every row is decoded, or
    ``STATUS_FULL`` when node ``node``'s region had no room for row ``row`` (whose writes were
    undone). ``err_code[i]`` / ``err_pos[i]`` (position in payload ``i``, header included)
    are set for every failed row; 0 elsewhere.
    """
    nrows = offsets.shape[0] - 1
    nnodes = counts.shape[0]
    snap = np.empty(nnodes, np.int64)
    dsnap = np.empty(nnodes, np.int64)
    loop_pc = np.empty(max_depth + 1, np.int64)
    remaining = np.empty(max_depth + 1, np.int64)
    total = np.empty(max_depth + 1, np.int64)
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
        depth = 0
        pc = 0
        if p > end:
            err = ERR_SHORT
            p = end
        while err == 0 and full < 0:
            op = prog[pc, 0]
            node = prog[pc, 1]
            if op == OP_END:
                if p != end:
                    err = ERR_TRAILING
                break
            if op in (OP_ENTRY, OP_NULLV):
                slot = entry(counts, ecap, node)
                if slot < 0:
                    full = node
                    break
                if track[node]:
                    valid[vbase[node] + slot] = 1
                pc += 1
            elif op == OP_BOOL:
                if p >= end:
                    err = ERR_TRUNCATED
                    break
                b = buf[p]
                p += 1
                if node >= 0:
                    slot = entry(counts, ecap, node)
                    if slot < 0:
                        full = node
                        break
                    if track[node]:
                        valid[vbase[node] + slot] = 1
                    vals[vbase[node] + slot] = 1 if b != 0 else 0
                pc += 1
            elif op in (OP_INT, OP_LONG):
                v, q, ok = _varint(buf, p, end, 10)
                if not ok:
                    err = ERR_TRUNCATED if q >= end else ERR_VARINT
                    break
                if op == OP_INT and (v < -2147483648 or v > 2147483647):
                    err = ERR_INT_RANGE
                    break
                if prog[pc, 3] > 0 and (v < 0 or v >= prog[pc, 3]):
                    err = ERR_TIME_RANGE
                    break
                p = q
                if node >= 0:
                    slot = entry(counts, ecap, node)
                    if slot < 0:
                        full = node
                        break
                    if track[node]:
                        valid[vbase[node] + slot] = 1
                    if prog[pc, 2] == 1:
                        fvals[vbase[node] + slot] = np.float64(v)
                    else:
                        vals[vbase[node] + slot] = v
                pc += 1
            elif op in (OP_FLOAT, OP_DOUBLE):
                size = 4 if op == OP_FLOAT else 8
                if end - p < size:
                    err = ERR_TRUNCATED
                    break
                if node >= 0:
                    slot = entry(counts, ecap, node)
                    if slot < 0:
                        full = node
                        break
                    for i in range(size):
                        scratch[i] = buf[p + i]
                    if track[node]:
                        valid[vbase[node] + slot] = 1
                    if op == OP_FLOAT:
                        fvals[vbase[node] + slot] = np.float64(f32[0])
                    else:
                        fvals[vbase[node] + slot] = f64[0]
                p += size
                pc += 1
            elif op in (OP_BYTES, OP_DEC_BYTES):
                ln, q, ok = _varint(buf, p, end, 10)
                if not ok:
                    err = ERR_TRUNCATED if q >= end else ERR_VARINT
                    break
                if ln < 0:
                    err = ERR_NEGATIVE_LENGTH
                    break
                if ln > end - q:
                    err = ERR_TRUNCATED
                    break
                if (
                    op == OP_BYTES
                    and prog[pc, 2] == 1
                    and not _ascii(buf, q, q + ln)
                    and not utf8_valid(buf, q, q + ln)
                ):
                    p = q
                    err = ERR_UTF8
                    break
                if node >= 0:
                    w = ln if op == OP_BYTES else prog[pc, 2]
                    if dcounts[node] + w > dcap[node]:
                        full = node
                        break
                    slot = entry(counts, ecap, node)
                    if slot < 0:
                        full = node
                        break
                    if track[node]:
                        valid[vbase[node] + slot] = 1
                    d = dbase[node] + dcounts[node]
                    if op == OP_BYTES:
                        vals[vbase[node] + slot] = ln
                        _copy(data, d, buf, q, ln)
                    elif not _decimal(buf, q, ln, data, d, w, bounds, bound_at[node]):
                        p = q
                        err = ERR_DECIMAL_RANGE
                        break
                    dcounts[node] += w
                p = q + ln
                pc += 1
            elif op in (OP_FIXED, OP_DEC_FIXED):
                size = prog[pc, 2]
                if end - p < size:
                    err = ERR_TRUNCATED
                    break
                if node >= 0:
                    w = size if op == OP_FIXED else prog[pc, 3]
                    if dcounts[node] + w > dcap[node]:
                        full = node
                        break
                    slot = entry(counts, ecap, node)
                    if slot < 0:
                        full = node
                        break
                    if track[node]:
                        valid[vbase[node] + slot] = 1
                    d = dbase[node] + dcounts[node]
                    if op == OP_FIXED:
                        _copy(data, d, buf, p, size)
                    elif not _decimal(buf, p, size, data, d, w, bounds, bound_at[node]):
                        err = ERR_DECIMAL_RANGE
                        break
                    dcounts[node] += w
                p += size
                pc += 1
            elif op == OP_ENUM:
                v, q, ok = _varint(buf, p, end, 10)
                if not ok:
                    err = ERR_TRUNCATED if q >= end else ERR_VARINT
                    break
                if v < 0 or v >= prog[pc, 3]:
                    err = ERR_ENUM_INDEX
                    break
                r = enum_maps[prog[pc, 2] + v]
                if node >= 0:
                    if r < 0:
                        err = ERR_ENUM_SYMBOL
                        break
                    slot = entry(counts, ecap, node)
                    if slot < 0:
                        full = node
                        break
                    if track[node]:
                        valid[vbase[node] + slot] = 1
                    vals[vbase[node] + slot] = r
                p = q
                pc += 1
            elif op in (OP_ARRAY, OP_LOOP):
                if op == OP_LOOP:
                    remaining[depth] -= 1
                    if remaining[depth] > 0:
                        pc = loop_pc[depth]
                        continue
                v, q, ok = _varint(buf, p, end, 10)
                if not ok:
                    err = ERR_TRUNCATED if q >= end else ERR_VARINT
                    break
                p = q
                if v < 0:
                    v = -v  # a negative count is followed by the block's size in bytes
                    _, q, ok = _varint(buf, p, end, 10)
                    if not ok:
                        err = ERR_TRUNCATED if q >= end else ERR_VARINT
                        break
                    p = q
                if op == OP_ARRAY:
                    smallest = prog[pc, 3]
                    after = prog[pc, 2]
                    first = pc + 1
                else:
                    first = prog[pc, 2]
                    smallest = prog[first - 1, 3]
                    after = pc + 1
                if v < 0 or (smallest > 0 and v > (end - p) // smallest):
                    err = ERR_TRUNCATED if v > 0 else ERR_BLOCK_COUNT
                    break
                if smallest == 0 and v > _MAX_FREE_ITEMS:
                    err = ERR_BLOCK_COUNT
                    break
                if op == OP_ARRAY:
                    if v == 0:
                        n_items = np.int64(0)
                    else:
                        depth += 1
                        loop_pc[depth] = first
                        remaining[depth] = v
                        total[depth] = v
                        pc = first
                        continue
                else:
                    if v > 0:
                        total[depth] += v
                        if total[depth] > _MAX_LIST:
                            err = ERR_BLOCK_COUNT
                            break
                        remaining[depth] = v
                        pc = first
                        continue
                    n_items = total[depth]
                    depth -= 1
                if node >= 0:
                    slot = entry(counts, ecap, node)
                    if slot < 0:
                        full = node
                        break
                    if track[node]:
                        valid[vbase[node] + slot] = 1
                    vals[vbase[node] + slot] = n_items
                pc = after
            elif op == OP_UNION:
                v, q, ok = _varint(buf, p, end, 10)
                if not ok:
                    err = ERR_TRUNCATED if q >= end else ERR_VARINT
                    break
                if v < 0 or v >= prog[pc, 2]:
                    err = ERR_UNION_INDEX
                    break
                p = q
                pc = prog[pc + 1 + v, 2]
            elif op == OP_JUMP:
                pc = prog[pc, 2]
            elif op == OP_NULL:
                full = null_entry(
                    node, counts, dcounts, ecap, dcap, vbase, dbase, store, width, track,
                    dummy_start, dummy_nodes, vals, valid, data,
                )  # fmt: skip
                if full >= 0:
                    break
                pc += 1
            else:  # OP_ERROR
                err = ERR_SCHEMA + prog[pc, 2]
                break
        if full < 0 and err == 0:
            err_code[row] = 0
            err_pos[row] = 0
            continue
        for n in range(nnodes):
            counts[n] = snap[n]
            dcounts[n] = dsnap[n]
        if full >= 0:
            return STATUS_FULL, row, full
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


@njit(cache=True, nogil=True, inline="always")
def _ascii(buf: np.ndarray, p: int, end: int) -> bool:
    """Whether ``buf[p:end]`` is all ASCII (so valid UTF-8): one branch-free OR over the
    bytes, which LLVM vectorises, before :func:`utf8_valid`'s byte-by-byte walk (a branch
    per byte). Measured 2026-11-28 on ``bench_decode.py``'s schema (five or more strings a
    row, ASCII), 1M records in one process, load 4-5 on 2 cores: the kernel took 0.41-0.44 us
    a row with the walk alone, 0.33 with no check at all, 0.34-0.38 with this test first."""
    acc = np.uint8(0)
    for i in range(p, end):
        acc |= buf[i]
    return int(acc) < 0x80


@njit(cache=True, nogil=True, inline="always")
def _limb(data: np.ndarray, d: int, i: int) -> np.uint64:
    v = np.uint64(0)
    for j in range(8):
        v |= np.uint64(data[d + 8 * i + j]) << np.uint64(8 * j)
    return v


@njit(cache=True, nogil=True)
def _compare(data: np.ndarray, d: int, limbs: int, bounds: np.ndarray, at: int) -> int:
    """Sign of (the ``limbs`` x 64-bit two's complement at ``data[d]``) - ``bounds[at:]``."""
    for i in range(limbs - 1, -1, -1):
        a = _limb(data, d, i)
        b = bounds[at + i]
        if a != b:
            if i == limbs - 1:  # the top limb carries the sign
                return -1 if np.int64(a) < np.int64(b) else 1
            return -1 if a < b else 1
    return 0


@njit(cache=True, nogil=True, inline="always")
def _decimal(  # noqa: PLR0917
    buf: np.ndarray,
    p: int,
    n: int,
    data: np.ndarray,
    d: int,
    w: int,
    bounds: np.ndarray,
    at: int,
) -> bool:
    """Avro's big-endian two's complement ``buf[p:p+n]`` as ``w`` little-endian bytes at
    ``data[d]`` (sign-extended); False when the value needs more than ``w`` bytes or more
    digits than the precision: ``bounds[at:at+w/8]`` is the largest value allowed (10^p - 1)
    and the next ``w/8`` limbs the smallest, as 64-bit limbs, least significant first."""
    negative = n > 0 and buf[p] >= 0x80
    fill = 0xFF if negative else 0x00
    extra = n - w
    for i in range(extra):  # leading bytes beyond the width must be sign extension only
        if buf[p + i] != fill:
            return False
    if extra > 0 and ((buf[p + extra] >= 0x80) != negative):
        return False
    for i in range(w):
        src = p + n - 1 - i
        data[d + i] = buf[src] if src >= p else fill
    limbs = w // 8
    if negative:
        return _compare(data, d, limbs, bounds, at + limbs) >= 0
    return _compare(data, d, limbs, bounds, at) <= 0
