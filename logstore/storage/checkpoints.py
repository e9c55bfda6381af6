"""Kafka's checkpoint files: small text files replaced atomically.

Offset checkpoints (``recovery-point-offset-checkpoint``, ``replication-offset-checkpoint``,
``log-start-offset-checkpoint``, ``cleaner-offset-checkpoint``), one per log directory::

    0                     version
    2                     number of entries
    orders 0 1234         topic partition offset
    orders 1 99

The per-partition ``leader-epoch-checkpoint`` has the same shape with ``epoch start_offset``
entries (Kafka's ``LeaderEpochCheckpointFile``).

Writes go to ``<file>.tmp``, which is fsynced, renamed over the file, and the directory fsynced
(Kafka's ``CheckpointFile.write``): after a crash the file holds either the old or the new
content, never a mix. A write that fails (a full disk) raises
:class:`~logstore.errors.StorageError` naming the file, removes its ``.tmp`` and leaves the
previous checkpoint in place. Readers raise :class:`CorruptCheckpointError` on anything malformed —
unknown version, wrong count, bad line — naming the file and line. A missing file reads as
empty. Functions are thread-safe as long as two threads do not write the same path at once.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from logstore.errors import LoglakeError, StorageError
from logstore.storage.files import fsync_dir, write_atomically

__all__ = [
    "CorruptCheckpointError",
    "LeaderEpochCache",
    "read_checkpoint_lines",
    "read_leader_epoch_checkpoint",
    "read_offset_checkpoint",
    "write_checkpoint_lines",
    "write_leader_epoch_checkpoint",
    "write_offset_checkpoint",
]

_VERSION = 0


class CorruptCheckpointError(LoglakeError):
    """A checkpoint file that does not parse."""


def write_checkpoint_lines(path: str | os.PathLike[str], lines: Iterable[str]) -> None:
    """Write a version-0 checkpoint of ``lines`` atomically (tmp, fsync, rename, dir fsync).

    :class:`StorageError` when the disk refuses (the old file stays, the ``.tmp`` goes)."""
    target = Path(path)
    body = list(lines)
    text = f"{_VERSION}\n{len(body)}\n" + "".join(line + "\n" for line in body)
    try:
        write_atomically(target, text.encode("utf-8"), sync_dir=False)
    except OSError as exc:
        raise StorageError(
            f"cannot write checkpoint: {exc.strerror or exc}", path=str(target), errno=exc.errno
        ) from exc
    try:
        fsync_dir(target.parent)
    except OSError as exc:
        raise StorageError(
            f"checkpoint written but its directory not synced: {exc.strerror or exc}",
            path=str(target),
            errno=exc.errno,
        ) from exc


def read_checkpoint_lines(path: str | os.PathLike[str], *, fields: int) -> list[list[str]]:
    """The entry lines of a version-0 checkpoint split into ``fields`` fields; [] if missing."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except UnicodeDecodeError as exc:
        raise CorruptCheckpointError(f"checkpoint is not UTF-8 text: {exc}", path=str(p)) from None
    if text == "":
        # Kafka leaves empty files behind (e.g. cleaner-offset-checkpoint never written).
        return []
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) < 2:
        raise CorruptCheckpointError(
            f"checkpoint has {len(lines)} lines, expected a version and a count", path=str(p)
        )
    if lines[0].strip() != str(_VERSION):
        raise CorruptCheckpointError(
            f"unsupported checkpoint version {lines[0]!r} (expected 0)", path=str(p)
        )
    try:
        count = int(lines[1].strip())
    except ValueError:
        raise CorruptCheckpointError(f"bad entry count {lines[1]!r}", path=str(p)) from None
    entries = lines[2:]
    if count != len(entries):
        raise CorruptCheckpointError(
            f"checkpoint says {count} entries, holds {len(entries)}", path=str(p)
        )
    out: list[list[str]] = []
    for n, line in enumerate(entries, start=3):
        parts = line.split(" ")
        if len(parts) != fields or any(part == "" for part in parts):
            raise CorruptCheckpointError(
                f"line {n}: {line!r} does not have {fields} space-separated fields", path=str(p)
            )
        out.append(parts)
    return out


def _int(value: str, path: str | os.PathLike[str], what: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise CorruptCheckpointError(f"bad {what} {value!r}", path=str(path)) from None


def read_offset_checkpoint(path: str | os.PathLike[str]) -> dict[tuple[str, int], int]:
    """``{(topic, partition): offset}`` from an offset checkpoint; ``{}`` when missing."""
    out: dict[tuple[str, int], int] = {}
    for topic, partition, offset in read_checkpoint_lines(path, fields=3):
        out[(topic, _int(partition, path, "partition"))] = _int(offset, path, "offset")
    return out


def write_offset_checkpoint(
    path: str | os.PathLike[str], entries: Mapping[tuple[str, int], int]
) -> None:
    """Replace the offset checkpoint at ``path`` with ``entries`` (sorted for stable output)."""
    write_checkpoint_lines(
        path,
        (f"{topic} {partition} {offset}" for (topic, partition), offset in sorted(entries.items())),
    )


def read_leader_epoch_checkpoint(path: str | os.PathLike[str]) -> list[tuple[int, int]]:
    """``[(epoch, start_offset), ...]`` in file order; ``[]`` when missing."""
    return [
        (_int(epoch, path, "epoch"), _int(start, path, "start offset"))
        for epoch, start in read_checkpoint_lines(path, fields=2)
    ]


def write_leader_epoch_checkpoint(
    path: str | os.PathLike[str], entries: Iterable[tuple[int, int]]
) -> None:
    write_checkpoint_lines(path, (f"{epoch} {start}" for epoch, start in entries))


class LeaderEpochCache:
    """Kafka's ``LeaderEpochFileCache``: which leader epoch started at which offset.

    Invariant: epochs and start offsets both strictly increase. Persisted to the partition's
    ``leader-epoch-checkpoint`` on every change (changes are rare: once per new leader epoch),
    before the change is made in memory.
    Not thread-safe on its own; the owning log serialises calls.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._entries: list[tuple[int, int]] = []
        for epoch, start in read_leader_epoch_checkpoint(self.path):
            if self._entries and (epoch <= self._entries[-1][0] or start < self._entries[-1][1]):
                raise CorruptCheckpointError(
                    f"entry ({epoch}, {start}) does not follow {self._entries[-1]}",
                    path=str(self.path),
                )
            self._entries.append((epoch, start))

    def entries(self) -> list[tuple[int, int]]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int | None:
        return self._entries[-1][0] if self._entries else None

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` starts at ``start_offset`` (no-op unless it is a newer epoch)."""
        if epoch < 0:
            return
        if self._entries and epoch <= self._entries[-1][0]:
            return
        # A newer epoch starting at or before existing entries replaces them (Kafka keeps the
        # offsets monotonic the same way).
        self._replace(
            [*[(e, s) for e, s in self._entries if s < start_offset], (epoch, start_offset)]
        )

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """Kafka's ``endOffsetFor``: ``(largest epoch <= epoch, its end offset)``; (-1, -1)."""
        for i in range(len(self._entries) - 1, -1, -1):
            e, _ = self._entries[i]
            if e <= epoch:
                end = self._entries[i + 1][1] if i + 1 < len(self._entries) else log_end_offset
                return e, end
        return -1, -1

    def truncate_from_end(self, end_offset: int) -> None:
        """Drop entries starting at or after ``end_offset`` (the log was truncated there)."""
        kept = [(e, s) for e, s in self._entries if s < end_offset]
        if kept != self._entries:
            self._replace(kept)

    def truncate_from_start(self, start_offset: int) -> None:
        """The log start moved to ``start_offset``: clamp the first surviving epoch to it."""
        kept: list[tuple[int, int]] = []
        for i, (e, s) in enumerate(self._entries):
            nxt = self._entries[i + 1][1] if i + 1 < len(self._entries) else None
            if nxt is not None and nxt <= start_offset:
                continue
            kept.append((e, max(s, start_offset)))
        if kept != self._entries:
            self._replace(kept)

    def clear(self) -> None:
        self._replace([])

    def _replace(self, entries: list[tuple[int, int]]) -> None:
        """Persist ``entries``, then adopt them: a failed write (:class:`StorageError`) leaves
        the cache as it was, so that the change is written by the next call that makes it."""
        if self.path.parent.exists():
            write_leader_epoch_checkpoint(self.path, entries)
        self._entries = entries
