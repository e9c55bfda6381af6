"""End to end: confluent-kafka -> broker (compacted topic) -> ingest -> compact -> the model.

The topic is compacted by its broker topic config alone (cleanup.policy=compact, created by
the client), with the header strategy from the pipeline config; the table, read back with
delta-rs, must equal the reference model over what the delivery reports acknowledged.
"""

from __future__ import annotations

import functools
import struct
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from pyspark.sql import SparkSession

from pipelines.compaction.config import CompactConfig
from pipelines.compaction.model import Rec, Strategy, compact
from pipelines.compaction.table import run_compact, table_path
from pipelines.ingest import IngestConfig, run_ingest
from tests.fixtures.compaction import read_topic_table
from tests.integration.broker.clients import new_topic

pytestmark = pytest.mark.integration


def _produce(bootstrap: str, topic: str, start: int, n: int, codec: str) -> list[Rec]:
    acked: list[Rec] = []

    def on_delivery(headers: tuple[tuple[str, bytes | None], ...], err: Any, msg: Any) -> None:
        assert err is None, err
        acked.append(
            Rec(msg.partition(), msg.offset(), msg.timestamp()[1], msg.key(), msg.value(), headers)
        )

    producer = ck.Producer(
        {"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 5}
    )
    for i in range(start, start + n):
        # versions go up and down; some records carry none; every 5th is a tombstone
        headers = () if i % 6 == 0 else (("version", struct.pack(">q", (i * 7) % 13)),)
        producer.produce(
            topic,
            key=f"key-{i % 9}".encode(),
            value=None if i % 5 == 0 else f"v{i}".encode(),
            partition=i % 2,
            headers=list(headers) or None,
            on_delivery=functools.partial(on_delivery, headers),
        )
    assert producer.flush(60) == 0
    return acked


def test_compacted_topic_through_broker_ingest_and_compact(
    spark: SparkSession, tmp_path: Path, broker_factory: Any
) -> None:
    broker = broker_factory()
    topic = new_topic(
        broker.bootstrap, partitions=2, prefix="orders", **{"cleanup.policy": "compact"}
    )
    lake = tmp_path / "lake"
    ingest = IngestConfig(log_dirs=(str(broker.log_dir),), lake=str(lake), progress_interval_s=0)
    strategy = Strategy("header", "version")
    config = CompactConfig(
        log_dirs=(str(broker.log_dir),), lake=str(lake), strategies={topic: strategy}, buckets=4
    )
    acked = _produce(broker.bootstrap, topic, 0, 40, "lz4")
    assert broker.stop() == 0
    run_ingest(spark, ingest, log=lambda _m: None)
    summary = run_compact(spark, config, log=lambda _m: None)
    assert [t.topic for t in summary.topics] == [topic]
    want = {pk: (r.offset, r.value, list(r.headers)) for pk, r in compact(acked, strategy).items()}
    assert read_topic_table(table_path(lake, topic)) == want

    broker.start()
    acked += _produce(broker.bootstrap, topic, 40, 25, "zstd")
    assert broker.stop() == 0
    run_ingest(spark, ingest, log=lambda _m: None)
    run_compact(spark, config, log=lambda _m: None)
    want = {pk: (r.offset, r.value, list(r.headers)) for pk, r in compact(acked, strategy).items()}
    assert read_topic_table(table_path(lake, topic)) == want
    assert not run_compact(spark, config, log=lambda _m: None).topics[0].committed


def test_compaction_strategy_topic_config_via_admin_client(tmp_path: Path, broker: Any) -> None:
    """``compaction.strategy`` is a topic config the broker accepts (validated) from
    CreateTopics and IncrementalAlterConfigs; the job reads it from the log dir."""
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewTopic,
    )

    from logstore.storage.topic_config import read_topic_config
    from pipelines.compaction.config import compacted_topics

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = new_topic(
        broker.bootstrap,
        partitions=1,
        prefix="kip280",
        **{"cleanup.policy": "compact", "compaction.strategy": "header:version"},
    )
    assert read_topic_config(broker.log_dir, topic)["compaction.strategy"] == "header:version"
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    described = admin.describe_configs([res])[res].result(timeout=30)
    assert described["compaction.strategy"].value == "header:version"
    config = CompactConfig(log_dirs=(str(broker.log_dir),), lake=str(tmp_path / "lake"))
    assert compacted_topics(config)[topic] == Strategy("header", "version")

    for bad in ("header:", "newest", "Timestamp", ""):
        name = f"kip280-bad-{abs(hash(bad)) % 10**8}"
        fut = admin.create_topics(
            [NewTopic(name, 1, 1, config={"compaction.strategy": bad})], operation_timeout=10
        )[name]
        with pytest.raises(ck.KafkaException) as info:
            fut.result(timeout=30)
        assert info.value.args[0].code() == ck.KafkaError.INVALID_CONFIG, bad
        assert name not in admin.list_topics(timeout=30).topics

    def alter(value: str) -> None:
        entry = ConfigEntry(
            "compaction.strategy", value, incremental_operation=AlterConfigOpType.SET
        )
        change = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[entry])
        admin.incremental_alter_configs([change])[change].result(timeout=30)

    alter("timestamp")
    assert compacted_topics(config)[topic] == Strategy("timestamp")
    with pytest.raises(ck.KafkaException) as info:
        alter("header:")
    assert info.value.args[0].code() == ck.KafkaError.INVALID_CONFIG
    assert read_topic_config(broker.log_dir, topic)["compaction.strategy"] == "timestamp"
