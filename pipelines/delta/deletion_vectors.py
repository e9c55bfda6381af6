"""Deletion vectors in the Delta protocol's format, written by loglake (deltalake 1.6 cannot).

A file's deleted row positions as a 64-bit RoaringBitmapArray (magic 1681511377, the number of
32-bit bitmaps, then each as key + portable 32-bit Roaring serialization), stored ``"u"``: a
file ``<table>/<prefix>/deletion_vector_<uuid>.bin`` holding a version byte 1, then per vector
its size (int32 big-endian), its bytes, its CRC-32 (big-endian); the descriptor names the file
by ``<prefix>`` + the Z85 of its uuid (20 characters). Written here (incremental compaction),
read by delta-rs (``DeltaTable.deletion_vectors``), DataFusion, polars and Spark through
``pipelines.delta.source``.

Why written here: deltalake 1.6's Python API can neither write deletion vectors nor commit an
``add`` carrying one; the commit goes through :mod:`pipelines.delta.actions`.
"""

from __future__ import annotations

import os
import struct
import uuid
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from logstore.objectstore import LakeLocation, ObjectStore, StorageSettings

__all__ = [
    "DV_PREFIX",
    "dv_relative_path",
    "serialize_deletion_vector",
    "write_deletion_vectors",
    "z85_decode",
    "z85_encode",
]

DV_PREFIX = "dv"  # the directory of this job's deletion vector files, under the table root
_DV_MAGIC = 1681511377
_ROARING_NO_RUNS = 12346
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def z85_encode(data: bytes) -> str:
    """Z85 of ``data`` (a multiple of 4 bytes), the Delta protocol's encoding of DV uuids."""
    out = []
    for i in range(0, len(data), 4):
        value = int.from_bytes(data[i : i + 4], "big")
        chunk = []
        for _ in range(5):
            value, digit = divmod(value, 85)
            chunk.append(_Z85[digit])
        out.append("".join(reversed(chunk)))
    return "".join(out)


def z85_decode(text: str) -> bytes:
    """The bytes of Z85 ``text`` (the inverse of ``z85_encode``); ``ValueError`` on a character
    outside the alphabet or a length that is not a multiple of 5."""
    if len(text) % 5:
        raise ValueError(f"z85: length {len(text)} is not a multiple of 5")
    out = bytearray()
    for i in range(0, len(text), 5):
        value = 0
        for c in text[i : i + 5]:
            digit = _Z85.find(c)
            if digit < 0:
                raise ValueError(f"z85: {c!r} is not a Z85 digit")
            value = value * 85 + digit
        out += value.to_bytes(4, "big")
    return bytes(out)


def dv_relative_path(descriptor: Mapping[str, Any] | None) -> str | None:
    """Where a deletion vector stored as a file relative to its table lives (storage type
    ``u``: a prefix and the Z85 of the file's uuid, 20 characters, the Delta protocol's
    rule): ``<prefix>/deletion_vector_<uuid>.bin``; ``None`` for other storage types or no
    vector. ``ValueError`` when the descriptor's path is not valid."""
    if not descriptor or descriptor.get("storageType") != "u":
        return None
    text = str(descriptor.get("pathOrInlineDv") or "")
    prefix, encoded = text[:-20], text[-20:]
    file_id = uuid.UUID(bytes=z85_decode(encoded))
    return os.path.join(prefix, f"deletion_vector_{file_id}.bin")


def _distinct_sorted(positions: np.ndarray) -> np.ndarray:
    """``np.unique`` of row positions as uint32, by a sort (numpy's unique hashes them)."""
    pos = np.sort(np.asarray(positions, dtype=np.uint32))
    if len(pos) > 1:
        pos = pos[np.concatenate([[True], pos[1:] != pos[:-1]])]
    return pos


def serialize_deletion_vector(positions: np.ndarray) -> bytes:
    """The RoaringBitmapArray bytes of the deleted row ``positions`` (< 2**32, any order)."""
    pos = _distinct_sorted(positions)
    high = (pos >> 16).astype(np.uint16)
    low = (pos & 0xFFFF).astype(np.uint16)
    # high is sorted: its runs are the containers (np.unique would hash it all again)
    starts = (
        np.flatnonzero(np.concatenate([[True], high[1:] != high[:-1]])).astype(np.int64)
        if len(high)
        else np.zeros(0, dtype=np.int64)
    )
    keys = high[starts]
    counts = np.diff(np.append(starts, len(high)))
    n = len(keys)
    descriptive = np.empty((n, 2), dtype="<u2")
    descriptive[:, 0] = keys
    descriptive[:, 1] = counts - 1
    bodies = []
    for start, count in zip(starts.tolist(), counts.tolist(), strict=True):
        values = low[start : start + count]
        if count <= 4096:  # array container
            bodies.append(values.astype("<u2").tobytes())
        else:  # bitmap container: 65536 bits, little-endian 64-bit words
            bits = np.zeros(65536, dtype=bool)
            bits[values] = True
            bodies.append(np.packbits(bits, bitorder="little").tobytes())
    offsets: Any = np.cumsum([8 + 8 * n, *(len(b) for b in bodies[:-1])]) if n else []
    bitmap = (
        struct.pack("<II", _ROARING_NO_RUNS, n)
        + descriptive.tobytes()
        + np.asarray(offsets, dtype="<u4").tobytes()
        + b"".join(bodies)
    )
    return struct.pack("<iqi", _DV_MAGIC, 1, 0) + bitmap


def write_deletion_vectors(
    directory: str | Path,
    vectors: Sequence[np.ndarray],
    *,
    settings: StorageSettings | None = None,
) -> tuple[str, list[dict[str, Any]]]:
    """Write ``vectors`` (deleted positions) into one new DV file in ``directory`` (a local
    directory or an object-store URI; ``settings``: from the environment unless given);
    returns its path and one descriptor per vector (storage ``"u"``, prefix
    :data:`DV_PREFIX`)."""
    file_id = uuid.uuid4()
    name = f"deletion_vector_{file_id}.bin"
    descriptors = []
    chunks = [b"\x01"]
    offset = 1
    for positions in vectors:
        data = serialize_deletion_vector(positions)
        chunks += [struct.pack(">i", len(data)), data, struct.pack(">I", zlib.crc32(data))]
        descriptors.append(
            {
                "storageType": "u",
                "pathOrInlineDv": DV_PREFIX + z85_encode(file_id.bytes),
                "offset": offset,
                "sizeInBytes": len(data),
                "cardinality": len(_distinct_sorted(positions)),
            }
        )
        offset += 8 + len(data)
    # through the store: a local directory or an object-store prefix alike
    store = ObjectStore(LakeLocation.parse(directory), settings=settings)
    store.write(name, b"".join(chunks))
    return store.uri(name), descriptors
