"""One Delta commit with adds, removes, change-data files and app transactions, written directly.

Why not delta-rs's ``create_write_transaction``: deltalake 1.6's Python API takes only add and
remove actions, so a merge committed through it carries no ``cdc`` actions and a change-data
reader would see every rewritten file as all-deleted then all-inserted. This module writes the
commit file itself, as the Delta protocol specifies for a local file system: the actions as
JSON lines in ``_delta_log/<version:020d>.json``, created with put-if-absent semantics (a tmp
file hard-linked to the final name: ``link`` fails if the name exists, so two writers can never
both create one version). Readers (delta-rs, Spark, polars) see the commit like any other.

Checks (what ``pipelines.delta.commit`` checks for its own commits): the table is still at the
version the write read (else ``ConcurrentWriteError``: the removes were chosen from that
snapshot); app transactions never go backwards and, all already present, make the commit a
no-op (``check_app_transactions``). Every 100th version a checkpoint is written with delta-rs.

Crash behaviour: before the link nothing is visible; the link is the commit. A stray tmp file
in ``_delta_log`` (name starting with ``.tmp-``) is ignored by readers.
"""

from __future__ import annotations

import json
import os
import struct
import time
import uuid
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from deltalake import DeltaTable

from pipelines.delta.commit import _CHECKPOINT, _COMMIT, check_app_transactions, load_table
from pipelines.delta.errors import ConcurrentWriteError, DeltaSinkError

__all__ = [
    "DV_PREFIX",
    "CdcFile",
    "FileRef",
    "commit_actions",
    "dv_descriptor_id",
    "live_adds",
    "serialize_deletion_vector",
    "write_deletion_vectors",
]

CHECKPOINT_INTERVAL = 100


@dataclass(frozen=True)
class FileRef:
    """A data file as an add/remove action names it (``path`` relative, URI-encoded)."""

    path: str
    size: int
    partition_values: dict[str, str | None]
    stats: str | None = None
    modification_time: int = 0
    data_change: bool = True
    deletion_vector: dict[str, Any] | None = None  # the file's DV descriptor (add and remove)


@dataclass(frozen=True)
class CdcFile:
    """A change-data file (``_change_data/...``) of the commit."""

    path: str
    size: int
    partition_values: dict[str, str | None]


def commit_actions(
    root: str | Path,
    *,
    read_version: int,
    adds: Sequence[FileRef] = (),
    removes: Sequence[FileRef] = (),
    cdc: Sequence[CdcFile] = (),
    app_transactions: Mapping[str, int] | None = None,
    expected_versions: Mapping[str, int | None] | None = None,
    metadata: dict[str, Any] | None = None,
    protocol: dict[str, Any] | None = None,
    operation: str = "MERGE",
    operation_parameters: Mapping[str, Any] | None = None,
) -> int | None:
    """Commit the actions as version ``read_version + 1``; returns it, or None for a no-op.

    ``metadata``: a replacement ``metaData`` action (e.g. new table configuration);
    ``protocol``: a replacement ``protocol`` action (e.g. to enable deletion vectors).
    """
    table = str(root)
    dt: DeltaTable | None = load_table(table)
    if dt is None:
        raise DeltaSinkError("no Delta table here", path=table)
    if dt.version() != read_version:
        raise ConcurrentWriteError(
            f"the table moved from version {read_version} to {dt.version()} during this run "
            "(another writer?); nothing committed, re-run",
            path=table,
        )
    apps = {str(k): int(v) for k, v in (app_transactions or {}).items()}
    if not check_app_transactions(dt, apps, expected_versions):
        return None
    now = int(time.time() * 1000)
    lines: list[dict[str, Any]] = [
        {
            "commitInfo": {
                "timestamp": now,
                "operation": operation,
                "operationParameters": dict(operation_parameters or {}),
                "readVersion": read_version,
                "isBlindAppend": not removes,
                "engineInfo": "loglake-compaction",
                "clientVersion": "loglake",
            }
        }
    ]
    if protocol is not None:
        lines.append({"protocol": protocol})
    if metadata is not None:
        lines.append({"metaData": metadata})
    lines += [{"txn": {"appId": a, "version": v, "lastUpdated": now}} for a, v in apps.items()]
    lines += [
        {
            "remove": {
                "path": r.path,
                "deletionTimestamp": now,
                "dataChange": r.data_change,
                "extendedFileMetadata": True,
                "partitionValues": r.partition_values,
                "size": r.size,
                **({"deletionVector": r.deletion_vector} if r.deletion_vector else {}),
            }
        }
        for r in removes
    ]
    lines += [
        {
            "add": {
                "path": a.path,
                "partitionValues": a.partition_values,
                "size": a.size,
                "modificationTime": a.modification_time or now,
                "dataChange": a.data_change,
                "stats": a.stats,
                **({"deletionVector": a.deletion_vector} if a.deletion_vector else {}),
            }
        }
        for a in adds
    ]
    lines += [
        {
            "cdc": {
                "path": c.path,
                "partitionValues": c.partition_values,
                "size": c.size,
                "dataChange": False,
            }
        }
        for c in cdc
    ]
    version = read_version + 1
    log_dir = Path(table) / "_delta_log"
    tmp = log_dir / f".tmp-{uuid.uuid4().hex}.json"
    target = log_dir / f"{version:020d}.json"
    data = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, target)
    except FileExistsError:
        raise ConcurrentWriteError(
            f"another writer committed version {version} first; nothing committed, re-run",
            path=table,
        ) from None
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(log_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    if version % CHECKPOINT_INTERVAL == 0:
        DeltaTable(table).create_checkpoint()
    return version


# ---------------------------------------------------------------------------------------------
# Deletion vectors (Delta protocol, "Deletion Vector Format"): a file's deleted row positions
# as a 64-bit RoaringBitmapArray (magic 1681511377, the number of 32-bit bitmaps, then each as
# key + portable 32-bit Roaring serialization), stored ``"u"`` (a file
# ``<table>/<prefix>/deletion_vector_<uuid>.bin``: a version byte 1, then per vector its size
# (int32 big-endian), its bytes, its CRC-32 (big-endian)). Written here, read by delta-rs
# (``DeltaTable.deletion_vectors``), DataFusion and polars.

DV_PREFIX = "dv"  # the directory of this job's deletion vector files, under the table root
_DV_MAGIC = 1681511377
_ROARING_NO_RUNS = 12346
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def _z85(data: bytes) -> str:
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
    """The bytes of Z85 ``text`` (the inverse of ``_z85``); ``ValueError`` on a character
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
    starts = np.flatnonzero(np.concatenate([[True], high[1:] != high[:-1]])) if len(high) else []
    starts = np.asarray(starts, dtype=np.int64)
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
    directory: str | Path, vectors: Sequence[np.ndarray]
) -> tuple[str, list[dict[str, Any]]]:
    """Write ``vectors`` (deleted positions) into one new DV file in ``directory``; returns its
    path and one descriptor per vector (storage ``"u"``, prefix :data:`DV_PREFIX`)."""
    file_id = uuid.uuid4()
    path = Path(directory) / f"deletion_vector_{file_id}.bin"
    descriptors = []
    chunks = [b"\x01"]
    offset = 1
    for positions in vectors:
        data = serialize_deletion_vector(positions)
        chunks += [struct.pack(">i", len(data)), data, struct.pack(">I", zlib.crc32(data))]
        descriptors.append(
            {
                "storageType": "u",
                "pathOrInlineDv": DV_PREFIX + _z85(file_id.bytes),
                "offset": offset,
                "sizeInBytes": len(data),
                "cardinality": len(_distinct_sorted(positions)),
            }
        )
        offset += 8 + len(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(chunks))
    return str(path), descriptors


def dv_descriptor_id(descriptor: Mapping[str, Any] | None) -> str | None:
    """A DV's unique id (with the path, it names a file in the table's state)."""
    if not descriptor or descriptor.get("storageType") is None:
        return None
    offset = descriptor.get("offset")
    suffix = f"@{offset}" if offset is not None else ""
    return f"{descriptor['storageType']}{descriptor['pathOrInlineDv']}{suffix}"


def live_adds(root: str | Path, version: int) -> list[dict[str, Any]]:
    """The ``add`` actions of the table's files at ``version``, as the log holds them (with
    ``stats`` JSON and ``deletionVector``, which delta-rs's ``get_add_actions`` does not give):
    the newest classic checkpoint at or below ``version``, then the JSON commits up to it."""
    log = Path(root) / "_delta_log"
    checkpoints: dict[int, list[Path]] = {}
    commits: dict[int, Path] = {}
    for p in log.iterdir():
        if (m := _CHECKPOINT.match(p.name)) and int(m.group(1)) <= version:
            checkpoints.setdefault(int(m.group(1)), []).append(p)
        elif (m := _COMMIT.match(p.name)) and int(m.group(1)) <= version:
            commits[int(m.group(1))] = p
    files: dict[tuple[str, str | None], dict[str, Any]] = {}
    start = -1
    if checkpoints:
        start = max(checkpoints)
        for part in sorted(checkpoints[start]):
            for add in pq.read_table(part, columns=["add"]).column("add").to_pylist():
                if add is None or add.get("path") is None:
                    continue
                pv = add.get("partitionValues")
                if isinstance(pv, list):  # a map column reads as (key, value) pairs
                    add["partitionValues"] = dict(pv)
                dv = add.get("deletionVector")
                add["deletionVector"] = (
                    {k: v for k, v in dv.items() if v is not None}
                    if dv and dv.get("storageType") is not None
                    else None
                )
                files[(add["path"], dv_descriptor_id(add.get("deletionVector")))] = add
    for v in sorted(c for c in commits if c > start):
        with commits[v].open(encoding="utf-8") as fh:
            for line in fh:
                action = json.loads(line)
                if "add" in action:
                    add = action["add"]
                    files[(add["path"], dv_descriptor_id(add.get("deletionVector")))] = add
                elif "remove" in action:
                    rm = action["remove"]
                    files.pop((rm["path"], dv_descriptor_id(rm.get("deletionVector"))), None)
    return list(files.values())
