"""The tier tests' broker set-up: a real broker tiering to the real S3 server (moto) of the
``s3`` fixture under :data:`PREFIX`, and waits on what it has tiered and checkpointed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pyarrow as pa
from deltalake import DeltaTable

from logstore.storage.checkpoints import read_offset_checkpoint
from pipelines.sources.tier import remote_segments
from tests.fixtures.broker import wait_for

__all__ = [
    "PREFIX",
    "all_tiered",
    "local_bases",
    "records_table",
    "tier_broker",
    "wait_checkpointed",
]

PREFIX = "tiered/"
ORDER = [("partition", "ascending"), ("offset", "ascending")]


def tier_broker(broker_factory: Any, s3: Any) -> Any:
    """A broker copying closed segments of ``remote.storage.enable`` topics to ``s3``."""
    return broker_factory(
        remote_log_storage_system_enable="true",
        **{
            "remote.log.manager.task.interval.ms": "200",
            "rsm.config.storage.s3.bucket.name": s3.name,
            "rsm.config.key.prefix": PREFIX,
            "rsm.config.chunk.size": "1000",
            "log.segment.delete.delay.ms": "0",
            "replica.high.watermark.checkpoint.interval.ms": "100",
        },
    )


def local_bases(b: Any, topic: str, partition: int) -> list[int]:
    """The base offsets of the partition's segments in the broker's log dir."""
    return sorted(int(p.stem) for p in (b.log_dir / f"{topic}-{partition}").glob("*.log"))


def all_tiered(b: Any, topic: str, partitions: int) -> bool:
    """Every closed segment of the topic is remote (the tier reaches the active segment)."""
    live = remote_segments(b.bootstrap)
    return all(
        (topic, p) in live and live[(topic, p)][-1].end_offset + 1 == local_bases(b, topic, p)[-1]
        for p in range(partitions)
    )


def wait_checkpointed(b: Any, topic: str, partitions: int) -> dict[int, int]:
    """Each partition's high watermark, once the log dir's checkpoint (what a log-dir run
    reads up to) has it."""
    c = ck.Consumer({"bootstrap.servers": b.bootstrap, "group.id": "x"})
    hw = {p: c.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=30)[1]
          for p in range(partitions)}  # fmt: skip
    c.close()
    checkpoint = b.log_dir / "replication-offset-checkpoint"
    wait_for(lambda: checkpoint.exists() and all(
        read_offset_checkpoint(checkpoint).get((topic, p)) == e for p, e in hw.items()
    ))  # fmt: skip
    return hw


def records_table(lake: Path) -> pa.Table:
    """The lake's ``records`` table read by delta-rs (an independent reader), in log order."""
    return DeltaTable(str(lake / "records")).to_pyarrow_table().sort_by(ORDER)
