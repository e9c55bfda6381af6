"""A read-only view of a broker's log directory, as the jobs see it: the one place in
``pipelines/`` that lists partition directories, segments and offset checkpoints.

What it reads (the broker's layout, :mod:`logstore.storage.files`):

- ``<log dir>/<topic>-<partition>/``: a partition directory, recognised by the broker's own
  :func:`~logstore.storage.files.parse_partition_dir` (a valid topic name, a partition number
  in range; Kafka's ``-delete``/``-future``/``-stray`` directories and anything else are not
  partitions), never by splitting the name on ``"-"`` by hand;
- ``<base offset, 20 digits>.log`` in it: the live segments, oldest first (the last one is
  the active segment). ``.deleted``, ``.cleaned`` and ``.swap`` files are not part of the log.
  The segment's indexes are the same name with ``.index`` / ``.timeindex`` / ``.txnindex``;
- ``replication-offset-checkpoint`` (high watermarks), ``log-start-offset-checkpoint``,
  ``recovery-point-offset-checkpoint``: read with the broker's checkpoint parser.

Invariants and races: nothing here writes or locks. The broker goes on while a job reads, so
a listing is a snapshot: retention may delete the oldest segments and the cleaner may swap
some right after. A reader that finds a listed segment gone raises
:class:`SegmentVanishedError`; the job plans again (:func:`pipelines.sources.plan.replanned`).
A reader that finds the segment's whole partition directory gone raises
:class:`PartitionDirMissingError` instead: either the topic was deleted under the run (the
driver cannot see the directory either: plan again) or the executors do not share the driver's
disk (the driver still sees it: :class:`LogDirNotSharedError`, a configuration error that no
re-plan can cure).

Cost: one ``listdir`` per partition and one regex pass over its names (the retention planner
lists every partition of a broker; a ``stat`` per file would dominate it).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

from logstore.errors import InvalidConfigError, InvalidTopicError, LoglakeError
from logstore.storage.checkpoints import read_offset_checkpoint
from logstore.storage.files import (
    INDEX_SUFFIX,
    LOG_START_OFFSET_CHECKPOINT,
    LOG_SUFFIX,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    TIME_INDEX_SUFFIX,
    parse_partition_dir,
    segment_path,
)

__all__ = [
    "LOG_START_OFFSET_CHECKPOINT",
    "PARTITION_DIR_MISSING",
    "RECOVERY_POINT_CHECKPOINT",
    "REPLICATION_OFFSET_CHECKPOINT",
    "SEGMENT_VANISHED",
    "LogDirNotFoundError",
    "LogDirNotSharedError",
    "PartitionDir",
    "PartitionDirMissingError",
    "Segment",
    "SegmentVanishedError",
    "TopicPartition",
    "as_partition_dir",
    "log_segments",
    "log_start_offset",
    "merged_checkpoint",
    "partition_dirs",
    "read_checkpoint",
    "segment_bases",
]

TopicPartition = tuple[str, int]

# Starts the message of SegmentVanishedError: found again in the text of the Spark/Py4J error
# that carries it from an executor to the driver.
SEGMENT_VANISHED = "segment file vanished between planning and reading"
# Starts the message of PartitionDirMissingError (found again the same way); the directory
# follows in brackets (LoglakeError's ``path``).
PARTITION_DIR_MISSING = "partition directory not found by the task reading it"

# a live segment's name inside the "/"-joined names of one directory (one regex pass)
_SEGMENT_LOG = re.compile(r"(?<![^/])([0-9]{20})\.log(?![^/])")


class LogDirNotFoundError(LoglakeError):
    """A configured log directory does not exist (or is not a directory)."""


class LogDirNotSharedError(InvalidConfigError):
    """The executors cannot see a log dir that the driver sees: a cluster without a shared disk
    reading ``log_dirs``. A configuration error (exit 2): every re-plan and retry would fail the
    same way; ``log_dirs = []`` reads through the broker instead."""


class PartitionDirMissingError(LoglakeError):
    """A task found the partition directory of its segment missing (not just the segment).

    Raised on the executor, which cannot tell why; the driver, which planned from that
    directory, decides (:func:`pipelines.sources.plan.replanned`). Not a
    :class:`SegmentVanishedError` on purpose: the readers that skip a vanished segment (retention
    took it) must not skip a partition they cannot see."""


class SegmentVanishedError(LoglakeError):
    """A segment's ``.log`` went away (retention deleted it) between the listing and a read of
    it; planning again sees the partition as it is now."""


class Segment(NamedTuple):
    """One live segment: its base offset and ``.log`` path (the indexes are its siblings).
    A tuple, so ``for base, path in log_segments(d)`` reads naturally."""

    base_offset: int
    path: Path

    @property
    def index_path(self) -> Path:
        return self.path.with_suffix(INDEX_SUFFIX)

    @property
    def time_index_path(self) -> Path:
        return self.path.with_suffix(TIME_INDEX_SUFFIX)


class PartitionDir(NamedTuple):
    """A partition directory of a log dir: ``<log dir>/<topic>-<partition>``."""

    topic: str
    partition: int
    path: Path

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)


def segment_bases(part_dir: str | os.PathLike[str]) -> list[int]:
    """Base offsets of the live segments of ``part_dir``, ascending (one ``listdir``)."""
    names = "/".join(os.listdir(part_dir))
    return sorted(map(int, _SEGMENT_LOG.findall(names)))


def log_segments(part_dir: str | os.PathLike[str]) -> list[Segment]:
    """The live segments of ``part_dir``, oldest first; the last one is the active segment."""
    return [Segment(b, segment_path(part_dir, b, LOG_SUFFIX)) for b in segment_bases(part_dir)]


def as_partition_dir(path: str | os.PathLike[str]) -> PartitionDir:
    """``path`` as a partition directory; :class:`~logstore.errors.InvalidTopicError` when its
    name is not ``<valid topic>-<partition>`` (a bad argument, not a transient failure)."""
    p = Path(path)
    tp = parse_partition_dir(p.name)
    if tp is None:
        raise InvalidTopicError("not a <topic>-<partition> directory", path=str(p))
    return PartitionDir(tp[0], tp[1], p)


def partition_dirs(
    log_dir: str | os.PathLike[str], *, topics: Iterable[str] | None = None
) -> list[PartitionDir]:
    """The partition directories of ``log_dir`` (of ``topics``, when given), sorted by topic
    and partition. Raises :class:`LogDirNotFoundError` when ``log_dir`` is not a directory."""
    root = Path(log_dir)
    if not root.is_dir():
        raise LogDirNotFoundError("log dir does not exist", path=str(root))
    wanted = None if topics is None else set(topics)
    out = []
    with os.scandir(root) as entries:
        for entry in entries:
            tp = parse_partition_dir(entry.name)
            if tp is None or (wanted is not None and tp[0] not in wanted) or not entry.is_dir():
                continue
            out.append(PartitionDir(tp[0], tp[1], Path(entry.path)))
    out.sort(key=lambda p: p.tp)
    return out


def read_checkpoint(log_dir: str | os.PathLike[str], name: str) -> dict[TopicPartition, int] | None:
    """The offset checkpoint ``name`` of ``log_dir`` (e.g. ``replication-offset-checkpoint``);
    None when the broker has not written one. A malformed file raises the parser's error."""
    path = Path(log_dir) / name
    if not path.is_file():
        return None
    return read_offset_checkpoint(path)


def merged_checkpoint(
    log_dirs: Iterable[str | os.PathLike[str]], name: str
) -> dict[TopicPartition, int] | None:
    """The checkpoints ``name`` of every log dir in one map (a partition lives in one log
    dir); None when no log dir has one."""
    merged: dict[TopicPartition, int] = {}
    found = False
    for d in log_dirs:
        one = read_checkpoint(d, name)
        if one is not None:
            found = True
            merged.update(one)
    return merged if found else None


def log_start_offset(part: PartitionDir, checkpoint: Mapping[TopicPartition, int]) -> int:
    """The partition's log start offset: the checkpoint's, raised to its first segment's base
    (the broker may have deleted segments since it last wrote the checkpoint)."""
    bases = segment_bases(part.path)
    return max(checkpoint.get(part.tp, 0), bases[0] if bases else 0)
