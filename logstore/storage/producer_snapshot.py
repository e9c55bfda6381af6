"""Producer-state snapshots: ``<offset>.snapshot`` files in Kafka's format (version 1).

A snapshot named ``<20-digit offset>.snapshot`` in the partition directory holds the producer
state after every batch below that offset, so that loading replays only the batches from
there (Kafka's ``ProducerStateManager.writeSnapshot`` / ``readSnapshot``). Bytes on disk,
big-endian::

    offset  size  field
         0     2  version                   i16  1
         2     4  crc                       u32  CRC-32C of every byte after this field
         6     4  producer entry count      i32
        10    46  per producer:
                    producerId              i64
                    epoch                   i16
                    lastSequence            i32  -1 when the producer has no batch
                    lastOffset              i64  of its last batch, -1 when none
                    offsetDelta             i32  last batch's lastOffset - firstOffset
                    timestamp               i64  of its last batch or marker
                    coordinatorEpoch        i32  of its last marker, -1 when none
                    currentTxnFirstOffset   i64  first offset of its open transaction, -1

As in Kafka only the producer's last batch is kept (duplicates of the four before it are no
longer recognised after a restart from a snapshot).

Written on roll (at the new segment's base offset) and at clean shutdown (at the log end
offset): to a ``.tmp`` file, fsynced, renamed, directory fsynced, so a snapshot is whole or
absent. A torn or corrupt file (:class:`CorruptSnapshotError`: size, version, CRC) is deleted
and an older one used. Which snapshots a log keeps is decided here too (:func:`take_snapshot`
keeps the newest :data:`MAX_SNAPSHOTS`, :func:`delete_snapshots` drops those below the log
start or above a truncation point); the log calls them under its lock. Pure functions plus
small file helpers; thread-safe.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final, NamedTuple

from crc32c import crc32c

from logstore.errors import LoglakeError, StorageError
from logstore.storage.files import (
    SNAPSHOT_SUFFIX,
    offset_from_file_name,
    segment_path,
    write_atomically,
)

__all__ = [
    "MAX_SNAPSHOTS",
    "SNAPSHOT_VERSION",
    "CorruptSnapshotError",
    "SnapshotEntry",
    "decode_snapshot",
    "delete_snapshot",
    "delete_snapshots",
    "encode_snapshot",
    "list_snapshots",
    "read_snapshot",
    "snapshot_path",
    "take_snapshot",
    "write_snapshot",
]

_log = logging.getLogger(__name__)

# producer snapshots kept per partition (the newest; Kafka keeps one per segment)
MAX_SNAPSHOTS: Final = 3

SNAPSHOT_VERSION: Final = 1
_HEAD = struct.Struct(">hIi")  # version, crc, entry count
_CRC_START = 6  # the CRC covers everything after the version and the crc fields
_ENTRY = struct.Struct(
    ">"
    "q"  # producerId
    "h"  # epoch
    "i"  # lastSequence
    "q"  # lastOffset
    "i"  # offsetDelta
    "q"  # timestamp
    "i"  # coordinatorEpoch
    "q"  # currentTxnFirstOffset
)


class CorruptSnapshotError(LoglakeError):
    """A ``.snapshot`` file that is torn, of another version or fails its CRC."""


class SnapshotEntry(NamedTuple):
    """One producer of a snapshot (the fields of the module docstring)."""

    producer_id: int
    epoch: int
    last_sequence: int
    last_offset: int
    offset_delta: int
    timestamp: int
    coordinator_epoch: int
    current_txn_first_offset: int


def encode_snapshot(entries: Iterable[SnapshotEntry]) -> bytes:
    body = bytearray()
    n = 0
    for e in entries:
        body += _ENTRY.pack(*e)
        n += 1
    counted = struct.pack(">i", n) + bytes(body)
    return struct.pack(">hI", SNAPSHOT_VERSION, crc32c(counted)) + counted


def decode_snapshot(data: bytes, *, path: str = "") -> list[SnapshotEntry]:
    """The entries of a snapshot file's bytes; :class:`CorruptSnapshotError` otherwise."""
    if len(data) < _HEAD.size:
        raise CorruptSnapshotError(
            f"snapshot of {len(data)} bytes, shorter than its {_HEAD.size}-byte header", path=path
        )
    version, crc, count = _HEAD.unpack_from(data, 0)
    if version != SNAPSHOT_VERSION:
        raise CorruptSnapshotError(
            f"snapshot version {version}, expected {SNAPSHOT_VERSION}", path=path
        )
    actual = crc32c(data[_CRC_START:])
    if actual != crc:
        raise CorruptSnapshotError(
            f"snapshot CRC {actual:#010x} does not match the stored {crc:#010x}", path=path
        )
    expected = _HEAD.size + count * _ENTRY.size
    if count < 0 or len(data) != expected:
        raise CorruptSnapshotError(
            f"snapshot of {len(data)} bytes for {count} entries (expected {expected})", path=path
        )
    return [
        SnapshotEntry(*_ENTRY.unpack_from(data, _HEAD.size + i * _ENTRY.size)) for i in range(count)
    ]


def snapshot_path(dir: Path, offset: int) -> Path:
    return segment_path(dir, offset, SNAPSHOT_SUFFIX)


def list_snapshots(dir: Path) -> list[int]:
    """Offsets of the ``.snapshot`` files in ``dir``, ascending."""
    out = []
    try:
        names = os.listdir(dir)
    except FileNotFoundError:
        return []
    for name in names:
        parsed = offset_from_file_name(name)
        if parsed is not None and parsed[1] == SNAPSHOT_SUFFIX:
            out.append(parsed[0])
    return sorted(out)


def read_snapshot(dir: Path, offset: int) -> list[SnapshotEntry]:
    path = snapshot_path(dir, offset)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise StorageError(
            f"cannot read snapshot: {exc.strerror}", path=str(path), errno=exc.errno
        ) from exc
    return decode_snapshot(data, path=str(path))


def write_snapshot(dir: Path, offset: int, entries: Iterable[SnapshotEntry]) -> Path:
    """Write ``<offset>.snapshot`` whole or not at all (tmp, fsync, rename, fsync dir);
    :class:`StorageError` when the disk refuses (no file is left behind then)."""
    path = snapshot_path(dir, offset)
    try:
        write_atomically(path, encode_snapshot(entries))
    except OSError as exc:
        raise StorageError(
            f"cannot write snapshot: {exc.strerror}", path=str(path), errno=exc.errno
        ) from exc
    return path


def delete_snapshot(dir: Path, offset: int) -> None:
    snapshot_path(dir, offset).unlink(missing_ok=True)


def delete_snapshots(dir: Path, *, below: int | None = None, above: int | None = None) -> None:
    """Delete the snapshots at offsets ``< below`` (their segments are gone) and ``> above``
    (Kafka's truncateAndReload: they describe batches that were truncated away)."""
    for offset in list_snapshots(dir):
        if (below is not None and offset < below) or (above is not None and offset > above):
            delete_snapshot(dir, offset)


def take_snapshot(
    dir: Path, offset: int, entries: Callable[[], Iterable[SnapshotEntry]], *, keep: int
) -> bool:
    """Write ``entries()`` as ``<offset>.snapshot`` unless one is there already, then keep
    only the newest ``keep``. False (logged) when the disk refused: snapshots only shorten the
    next load, they are never needed for correctness."""
    if snapshot_path(dir, offset).exists():
        return True
    try:
        write_snapshot(dir, offset, entries())
    except StorageError as exc:
        _log.warning("%s: producer snapshot not written: %s", dir.name, exc)
        return False
    for old in list_snapshots(dir)[:-keep]:
        delete_snapshot(dir, old)
    return True
