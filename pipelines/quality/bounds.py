"""What the broker's log directories say about each partition, for the quality suites.

Per partition: the log start offset (``log-start-offset-checkpoint``, or the first segment's
base offset when larger or when the file is absent, as ingest reads it), the high watermark
(``replication-offset-checkpoint``; None when the broker has not written it) and the ingest
progress (the ``records`` table's app transactions: the next offset ingest will read).
Only reads files; never writes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from logstore.errors import LoglakeError
from logstore.storage.checkpoints import read_offset_checkpoint
from logstore.storage.files import offset_from_file_name, parse_partition_dir

__all__ = ["PartitionBounds", "partition_bounds"]

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class PartitionBounds:
    """One partition's offsets: ``[log_start, high_watermark)`` is readable in the log."""

    topic: str
    partition: int
    log_start: int
    high_watermark: int | None
    progress: int | None


def _checkpoint(log_dirs: Iterable[str], name: str) -> dict[TopicPartition, int]:
    merged: dict[TopicPartition, int] = {}
    for d in log_dirs:
        path = Path(d) / name
        if path.is_file():
            merged.update(read_offset_checkpoint(path))
    return merged


def partition_bounds(
    log_dirs: Iterable[str],
    progress: Mapping[TopicPartition, int],
    *,
    topics: Iterable[str] | None = None,
) -> list[PartitionBounds]:
    """Bounds of every partition directory in ``log_dirs`` (of ``topics``, when given), plus
    partitions that only the progress knows (their directory is gone: log start = progress)."""
    dirs = list(log_dirs)
    wanted = set(topics) if topics else None
    starts = _checkpoint(dirs, "log-start-offset-checkpoint")
    hws = _checkpoint(dirs, "replication-offset-checkpoint")
    found: dict[TopicPartition, int] = {}
    for d in dirs:
        if not Path(d).is_dir():
            raise LoglakeError("log dir does not exist", path=str(d))
        for entry in os.scandir(d):
            tp = parse_partition_dir(entry.name)
            if tp is None or not entry.is_dir() or (wanted is not None and tp[0] not in wanted):
                continue
            bases = [
                parsed[0]
                for name in os.listdir(entry.path)
                if (parsed := offset_from_file_name(name)) is not None and parsed[1] == ".log"
            ]
            found[tp] = max(starts.get(tp, 0), min(bases) if bases else 0)
    for tp, next_offset in progress.items():
        if tp not in found and (wanted is None or tp[0] in wanted):
            found[tp] = next_offset
    return [
        PartitionBounds(t, p, start, hws.get((t, p)), progress.get((t, p)))
        for (t, p), start in sorted(found.items())
    ]
