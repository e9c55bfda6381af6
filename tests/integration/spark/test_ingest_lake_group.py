"""Ingest commits the lake's progress to the consumer group ``[ingest] lake_group`` on the broker
(``pipelines.lake_group``), and the broker's lake-bounded retention then follows the lake.

A real broker (running while ingest reads its log dir), confluent-kafka producing and reading
the group's offsets back with ``committed()``, the shared Spark session, the ``records``
table's progress read back from its Delta log.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)
from pyspark.sql import SparkSession

from logstore.storage.checkpoints import read_offset_checkpoint
from pipelines.ingest import IngestConfig, read_progress, run_ingest
from tests.fixtures.broker import free_port, wait_for

pytestmark = pytest.mark.integration

GROUP = "loglake-ingest"


def _create(bootstrap: str, topic: str, partitions: int, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    fs = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1, config=configs)]
    )
    fs[topic].result(timeout=30)


def _produce(bootstrap: str, topic: str, n: int, *, ts: int | None = None) -> dict[int, int]:
    """``n`` records round-robin over the partitions; ``{partition: high watermark}``."""
    ends: dict[int, int] = {}
    errors: list[Any] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            ends[msg.partition()] = max(ends.get(msg.partition(), 0), msg.offset() + 1)

    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})
    meta = p.list_topics(topic, timeout=30).topics[topic].partitions
    for i in range(n):
        extra: dict[str, Any] = {} if ts is None else {"timestamp": ts + i}
        p.produce(
            topic, value=b"x" * 200, partition=i % len(meta), on_delivery=on_delivery, **extra
        )
        if i % 10 == 9:
            p.flush(30)
    assert p.flush(30) == 0
    assert not errors, errors
    return ends


def _checkpointed(log_dir: Path, topic: str, ends: dict[int, int]) -> bool:
    path = log_dir / "replication-offset-checkpoint"
    if not path.exists():
        return False
    hw = read_offset_checkpoint(path)
    return all(hw.get((topic, p)) == e for p, e in ends.items())


def _committed(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    c = ck.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False}
    )
    try:
        got = c.committed([ck.TopicPartition(topic, p) for p in range(partitions)], timeout=30)
        return {tp.partition: tp.offset for tp in got}
    finally:
        c.close()


def _config(log_dir: Path, lake: Path, bootstrap: str) -> IngestConfig:
    return IngestConfig(
        log_dirs=(str(log_dir),),
        lake=str(lake),
        progress_interval_s=0,
        bootstrap_servers=bootstrap,
        lake_group=GROUP,
    )


def test_ingest_commits_its_progress_to_the_lake_group(
    spark: SparkSession, tmp_path: Path, broker_factory: Any
) -> None:
    b = broker_factory(**{"replica.high.watermark.checkpoint.interval.ms": "100"})
    _create(b.bootstrap, "events", 2)
    ends = _produce(b.bootstrap, "events", 40)
    assert ends == {0: 20, 1: 20}
    wait_for(lambda: _checkpointed(b.log_dir, "events", ends))
    lines: list[str] = []
    config = _config(b.log_dir, tmp_path / "lake", b.bootstrap)
    s1 = run_ingest(spark, config, log=lines.append)
    assert s1.records == 40
    assert s1.lake_group_partitions == 2
    progress = read_progress(config.records_path)
    assert progress == {("events", 0): 20, ("events", 1): 20}
    assert _committed(b.bootstrap, "events", 2) == {0: 20, 1: 20}

    more = _produce(b.bootstrap, "events", 6)
    assert more == {0: 23, 1: 23}
    wait_for(lambda: _checkpointed(b.log_dir, "events", more))
    s2 = run_ingest(spark, config, log=lines.append)
    assert s2.records == 6
    assert read_progress(config.records_path) == {("events", 0): 23, ("events", 1): 23}
    assert _committed(b.bootstrap, "events", 2) == {0: 23, 1: 23}
    # nothing new: the same offsets are committed again (a fresh commit time for the valve)
    s3 = run_ingest(spark, config, log=lines.append)
    assert (s3.records, s3.lake_group_partitions) == (0, 2)
    assert _committed(b.bootstrap, "events", 2) == {0: 23, 1: 23}
    # a second topic: committed once ingested; left out of [ingest] topics, it is no longer
    # committed (its commit ages out on the broker instead of being refreshed forever)
    _create(b.bootstrap, "elsewhere", 1)
    other = _produce(b.bootstrap, "elsewhere", 3)
    wait_for(lambda: _checkpointed(b.log_dir, "elsewhere", other))
    s4 = run_ingest(spark, config, log=lines.append)
    assert (s4.records, s4.lake_group_partitions) == (3, 3)
    assert _committed(b.bootstrap, "elsewhere", 1) == {0: 3}
    s5 = run_ingest(spark, dataclasses.replace(config, topics=("events",)), log=lines.append)
    assert (s5.records, s5.lake_group_partitions) == (0, 2)
    assert lines[-1] == f"lake group {GROUP!r}: committed 2 partitions' offsets to {b.bootstrap}"


def test_an_unreachable_broker_never_fails_the_ingest(
    spark: SparkSession, tmp_path: Path, broker_factory: Any
) -> None:
    b = broker_factory(**{"replica.high.watermark.checkpoint.interval.ms": "100"})
    _create(b.bootstrap, "quiet", 1)
    ends = _produce(b.bootstrap, "quiet", 5)
    wait_for(lambda: _checkpointed(b.log_dir, "quiet", ends))
    lines: list[str] = []
    nobody = f"127.0.0.1:{free_port()}"
    s = run_ingest(spark, _config(b.log_dir, tmp_path / "lake", nobody), log=lines.append)
    assert s.records == 5
    assert s.lake_group_partitions is None
    failed = [m for m in lines if "not committed" in m]
    assert len(failed) == 1
    assert nobody in failed[0]
    assert _committed(b.bootstrap, "quiet", 1) == {0: ck.OFFSET_INVALID}


def test_broker_retention_follows_the_lake(
    spark: SparkSession, tmp_path: Path, broker_factory: Any
) -> None:
    b = broker_factory(
        **{
            "replica.high.watermark.checkpoint.interval.ms": "100",
            "log.retention.check.interval.ms": "100",
            "log.segment.delete.delay.ms": "0",
            "log.retention.lake.group": GROUP,
        }
    )
    _create(b.bootstrap, "old", 1, **{"segment.bytes": "2048"})
    part = b.log_dir / "old-0"
    old = int(time.time() * 1000) - 3_600_000
    config = _config(b.log_dir, tmp_path / "lake", b.bootstrap)
    # the lake tracks the partition before it holds anything past retention
    first = _produce(b.bootstrap, "old", 10, ts=old)
    wait_for(lambda: _checkpointed(b.log_dir, "old", first))
    run_ingest(spark, config, log=lambda _m: None)
    assert _committed(b.bootstrap, "old", 1) == {0: 10}
    ends = _produce(b.bootstrap, "old", 60, ts=old)
    wait_for(lambda: _checkpointed(b.log_dir, "old", ends))
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    res = ConfigResource(
        ConfigResource.Type.TOPIC,
        "old",
        incremental_configs=[
            ConfigEntry("retention.ms", "60000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    admin.incremental_alter_configs([res])[res].result(timeout=30)

    def bases() -> list[int]:
        return sorted(int(p.stem) for p in part.glob("*.log"))

    # everything from offset 10 on is held for the lake
    all_bases = bases()
    assert len(all_bases) > 3
    held = [x for x in all_bases if x >= max(x for x in all_bases if x <= 10)]
    wait_for(lambda: bases() == held)
    for _ in range(10):
        time.sleep(0.1)
        assert bases() == held
    s = run_ingest(spark, config, log=lambda _m: None)
    assert s.records == 60
    assert _committed(b.bootstrap, "old", 1) == {0: 70}
    # the lake has it all now: retention deletes every closed segment
    wait_for(lambda: bases() == all_bases[-1:])
