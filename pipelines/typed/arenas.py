"""The output arenas of the typed decoders' kernels (:mod:`avro_kernel`, :mod:`protobuf_kernel`).

Layout: every reader node ``n`` owns a region of ``entries`` slots, starting at ``vbase[n]``
with room for ``ecap[n]``, in both ``vals`` (int64; float values are written through
``fvals``, a float64 view of the same memory) and ``valid`` (one byte per entry), and a region
of ``dcap[n]`` bytes at ``dbase[n]`` in ``data``. ``counts[n]`` / ``dcounts[n]`` say how much
is used. What a node stores per entry is its ``STORE_*`` kind: ``STORE_VALS`` one ``vals``
slot (a scalar); ``STORE_BIN`` the length in ``vals``, the bytes in ``data``; ``STORE_FIXED``
``width`` bytes in ``data``; ``STORE_LIST`` the item count in ``vals``; ``STORE_NONE`` only
the validity byte (records, unions as structs, Arrow's null).

Both kernels write through :func:`entry` and :func:`null_entry` and return ``STATUS_FULL``
with the node whose region is full; the caller then calls :meth:`Arenas.grow` and calls the
kernel again from that row. One module so that the two kernels cannot drift apart on the
layout that the decoders' Arrow builders read.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = [
    "STORE_BIN",
    "STORE_FIXED",
    "STORE_LIST",
    "STORE_NONE",
    "STORE_VALS",
    "Arenas",
    "entry",
    "null_entry",
]

STORE_NONE = 0  # records, unions-as-structs, Arrow null
STORE_VALS = 1
STORE_BIN = 2
STORE_FIXED = 3
STORE_LIST = 4


class Arenas:
    """The kernel's output buffers: per node a region of entries in ``vals``/``valid`` and of
    bytes in ``data`` (module docstring), grown (doubled) when the kernel asks.

    ``per_row``: the nodes with exactly one entry per row (their regions hold ``rows``
    entries; the others start at ``2 * rows + 16``); ``store`` and ``width``: each node's
    ``STORE_*`` kind and fixed width; ``payload``: the bytes of all the rows' payloads (a
    bound on any one node's bytes, capped at 64 a row before the first growth)."""

    def __init__(
        self,
        *,
        per_row: np.ndarray,
        store: np.ndarray,
        width: np.ndarray,
        rows: int,
        payload: int,
    ) -> None:
        nn = len(store)
        self.ecap = np.where(per_row, rows, 2 * rows + 16).astype(np.int64)
        self.ecap = np.maximum(self.ecap, 1)
        self.width = np.asarray(width, np.int64)
        self.dcap = np.zeros(nn, np.int64)
        self.dcap[store == STORE_FIXED] = (self.ecap * self.width)[store == STORE_FIXED]
        self.dcap[store == STORE_BIN] = min(payload, 64 * rows) + 16
        self.counts = np.zeros(nn, np.int64)
        self.dcounts = np.zeros(nn, np.int64)
        self._layout()

    def _layout(self) -> None:
        self.vbase = np.concatenate([[0], np.cumsum(self.ecap)[:-1]]).astype(np.int64)
        self.dbase = np.concatenate([[0], np.cumsum(self.dcap)[:-1]]).astype(np.int64)
        self.vals = np.empty(int(self.ecap.sum()), np.int64)
        self.fvals = self.vals.view(np.float64)
        self.valid = np.empty(int(self.ecap.sum()), np.uint8)
        self.data = np.empty(int(self.dcap.sum()), np.uint8)

    def grow(self, node: int) -> None:
        """Double ``node``'s region (the others keep their size); the entries written so far
        move to the new buffers."""
        old = (self.vbase, self.dbase, self.vals, self.valid, self.data)
        self.ecap[node] *= 2
        self.dcap[node] = max(2 * self.dcap[node], self.ecap[node] * self.width[node], 16)
        self._layout()
        ovb, odb, ovals, ovalid, odata = old
        for i in range(len(self.counts)):
            c, d = int(self.counts[i]), int(self.dcounts[i])
            self.vals[self.vbase[i] : self.vbase[i] + c] = ovals[ovb[i] : ovb[i] + c]
            self.valid[self.vbase[i] : self.vbase[i] + c] = ovalid[ovb[i] : ovb[i] + c]
            self.data[self.dbase[i] : self.dbase[i] + d] = odata[odb[i] : odb[i] + d]


@njit(cache=True, nogil=True, inline="always")
def entry(counts: np.ndarray, ecap: np.ndarray, n: int) -> int:
    """The slot of node ``n``'s next entry, or -1 when its region is full."""
    c = counts[n]
    if c >= ecap[n]:
        return -1
    counts[n] = c + 1
    return int(c)


@njit(cache=True, nogil=True)
def null_entry(  # noqa: PLR0917
    node: int,
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
    valid: np.ndarray,
    data: np.ndarray,
) -> int:
    """A null entry for ``node`` and a placeholder for each of its struct descendants (valid,
    zero, empty). Returns -1, or the node whose region is full."""
    for k in range(dummy_start[node], dummy_start[node + 1]):
        n = dummy_nodes[k]
        kind = store[n]
        w = width[n]
        if kind == STORE_FIXED and dcounts[n] + w > dcap[n]:
            return int(n)
        slot = entry(counts, ecap, n)
        if slot < 0:
            return int(n)
        if track[n]:
            valid[vbase[n] + slot] = 0 if n == node else 1
        if kind in (STORE_VALS, STORE_BIN, STORE_LIST):
            vals[vbase[n] + slot] = 0
        elif kind == STORE_FIXED:
            d = dbase[n] + dcounts[n]
            for i in range(w):
                data[d + i] = 0
            dcounts[n] += w
    return -1
