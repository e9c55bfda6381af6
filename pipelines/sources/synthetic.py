"""Synthetic Kafka log dirs for tests and benchmarks, written through the real storage engine.

:func:`write_partition` appends batches built by :func:`logstore.protocol.records.build_batch`
to a :class:`logstore.storage.log.Log` (which assigns offsets, writes ``.index`` and
``.timeindex`` and rolls segments as a broker would), then closes it cleanly and can write the
log dir's ``replication-offset-checkpoint``. Large data sets reuse a few distinct batches:
``Log.append`` stamps the base offset in place, which the CRC does not cover, so one built
batch can be appended many times.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from logstore.protocol.batch import Codec
from logstore.protocol.records import RecordLike, build_batch
from logstore.storage.checkpoints import write_offset_checkpoint
from logstore.storage.config import LogConfig
from logstore.storage.files import partition_dir
from logstore.storage.log import Log

__all__ = ["write_batches", "write_high_watermarks", "write_partition"]


def write_batches(
    log_dir: str | os.PathLike[str],
    topic: str,
    partition: int,
    batches: Iterable[bytes | bytearray],
    *,
    segment_bytes: int = 1 << 30,
    index_interval_bytes: int = 4096,
) -> tuple[int, int]:
    """Append ``batches`` (whole v2 batches) to the partition's log; ``(records, end offset)``.

    The log is opened (created) and closed cleanly, so index files are trimmed as Kafka's are.
    """
    config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=index_interval_bytes)
    path = partition_dir(log_dir, topic, partition)
    path.mkdir(parents=True, exist_ok=True)
    log = Log.open(path, config, clean_shutdown=True)
    try:
        records = 0
        for batch in batches:
            info = log.append(bytearray(batch))
            records += info.num_records
        log.flush()
        return records, log.log_end_offset
    finally:
        log.close()


def write_partition(
    log_dir: str | os.PathLike[str],
    topic: str,
    partition: int,
    records: Sequence[RecordLike],
    *,
    batch_records: int = 100,
    codecs: Sequence[Codec] = (Codec.NONE,),
    segment_bytes: int = 1 << 30,
    index_interval_bytes: int = 4096,
) -> int:
    """Write ``records`` in batches of ``batch_records``, cycling through ``codecs``.

    Returns the log end offset.
    """
    batches = (
        build_batch(
            records[i : i + batch_records], codec=codecs[(i // batch_records) % len(codecs)]
        )
        for i in range(0, len(records), batch_records)
    )
    _, end = write_batches(
        log_dir, topic, partition, batches,
        segment_bytes=segment_bytes, index_interval_bytes=index_interval_bytes,
    )  # fmt: skip
    return end


def write_high_watermarks(
    log_dir: str | os.PathLike[str], high_watermarks: Mapping[tuple[str, int], int]
) -> Path:
    """Write ``replication-offset-checkpoint`` as the broker does; returns its path."""
    path = Path(log_dir) / "replication-offset-checkpoint"
    write_offset_checkpoint(path, high_watermarks)
    return path
