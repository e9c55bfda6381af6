"""AdminClient against the broker: topics, configs (persisted in the log dir), DeleteRecords,
ListOffsets / offsets_for_times, delete topic."""

from __future__ import annotations

import time
import uuid

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    OffsetSpec,
)

from logstore.storage.topic_config import read_topic_config
from tests.integration.broker.clients import ck_produce, make_records, new_topic

pytestmark = pytest.mark.integration


def _admin(broker) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def _describe(admin: AdminClient, topic: str) -> dict[str, ConfigEntry]:
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return admin.describe_configs([res])[res].result(timeout=30)


def test_create_topic_with_configs_is_persisted_and_described(broker):
    admin = _admin(broker)
    topic = f"cfg-{uuid.uuid4().hex[:8]}"
    fut = admin.create_topics(
        [
            NewTopic(
                topic,
                num_partitions=3,
                replication_factor=1,
                config={"cleanup.policy": "compact", "retention.ms": "3600000"},
            )
        ]
    )[topic]
    fut.result(timeout=30)
    md = admin.list_topics(topic, timeout=30).topics[topic]
    assert sorted(md.partitions) == [0, 1, 2]
    assert read_topic_config(broker.log_dir, topic) == {
        "cleanup.policy": "compact",
        "retention.ms": "3600000",
    }
    entries = _describe(admin, topic)
    assert entries["cleanup.policy"].value == "compact"
    assert entries["cleanup.policy"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert entries["retention.ms"].value == "3600000"
    assert entries["segment.bytes"].value == str(1024**3)
    assert entries["segment.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    for p in range(3):
        assert (broker.log_dir / f"{topic}-{p}").is_dir()


def test_incremental_alter_configs(broker):
    admin = _admin(broker)
    topic = new_topic(broker.bootstrap, partitions=1, prefix="alter", **{"retention.ms": "1000"})
    res = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("retention.bytes", "123456", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
            ConfigEntry(
                "cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND
            ),
        ],
    )
    admin.incremental_alter_configs([res])[res].result(timeout=30)
    assert read_topic_config(broker.log_dir, topic) == {
        "retention.bytes": "123456",
        "cleanup.policy": "delete,compact",
    }
    entries = _describe(admin, topic)
    assert entries["retention.bytes"].value == "123456"
    assert entries["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    assert entries["cleanup.policy"].value == "delete,compact"

    bad = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("no.such.config", "1", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    with pytest.raises(ck.KafkaException) as exc:
        admin.incremental_alter_configs([bad])[bad].result(timeout=30)
    assert exc.value.args[0].code() == ck.KafkaError.INVALID_CONFIG
    # nothing changed
    assert read_topic_config(broker.log_dir, topic)["retention.bytes"] == "123456"


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("../escape", ck.KafkaError.TOPIC_EXCEPTION),
        ("a/b", ck.KafkaError.TOPIC_EXCEPTION),
        ("..", ck.KafkaError.TOPIC_EXCEPTION),
        ("x" * 250, ck.KafkaError.TOPIC_EXCEPTION),
    ],
)
def test_create_invalid_topic_names(broker, name, error):
    admin = _admin(broker)
    fut = admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])[name]
    with pytest.raises(ck.KafkaException) as exc:
        fut.result(timeout=30)
    assert exc.value.args[0].code() == error
    assert not (broker.log_dir.parent / "escape-0").exists()
    assert not any(p.name.startswith("escape") for p in broker.log_dir.parent.iterdir())


def test_create_existing_and_bad_replication(broker):
    admin = _admin(broker)
    topic = new_topic(broker.bootstrap, partitions=1, prefix="dup")
    fut = admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic]
    with pytest.raises(ck.KafkaException) as exc:
        fut.result(timeout=30)
    assert exc.value.args[0].code() == ck.KafkaError.TOPIC_ALREADY_EXISTS
    other = f"rf-{uuid.uuid4().hex[:8]}"
    fut = admin.create_topics([NewTopic(other, num_partitions=1, replication_factor=3)])[other]
    with pytest.raises(ck.KafkaException) as exc:
        fut.result(timeout=30)
    assert exc.value.args[0].code() == ck.KafkaError.INVALID_REPLICATION_FACTOR


def test_list_offsets_and_offsets_for_times(broker):
    topic = new_topic(broker.bootstrap, partitions=1, prefix="lo")
    records = make_records(500, partitions=1, seed=3)
    ck_produce(broker.bootstrap, topic, records, codec="lz4", acks="all", idempotent=True)
    admin = _admin(broker)
    tp = ck.TopicPartition(topic, 0)
    ts_mid = records[123].timestamp

    def list_one(spec: OffsetSpec) -> tuple[int, int]:
        r = admin.list_offsets({tp: spec})[tp].result(timeout=30)
        return r.offset, r.timestamp

    assert list_one(OffsetSpec.earliest())[0] == 0
    assert list_one(OffsetSpec.latest())[0] == 500
    assert list_one(OffsetSpec.for_timestamp(ts_mid)) == (123, ts_mid)
    assert list_one(OffsetSpec.max_timestamp()) == (499, records[499].timestamp)
    assert list_one(OffsetSpec.for_timestamp(records[-1].timestamp + 1))[0] == -1

    c = ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "oft"})
    try:
        found = c.offsets_for_times([ck.TopicPartition(topic, 0, records[400].timestamp)], 30)
        assert found[0].offset == 400
        low, high = c.get_watermark_offsets(tp, timeout=30)
        assert (low, high) == (0, 500)
    finally:
        c.close()


def test_delete_records_moves_log_start_and_deletes_segments(broker_factory):
    b = broker_factory(**{"log.segment.bytes": "2048"})
    topic = new_topic(b.bootstrap, partitions=1, prefix="dr")
    records = make_records(400, partitions=1, seed=5)
    ck_produce(
        b.bootstrap, topic, records, codec="none", acks="all", idempotent=False, flush_every=10
    )
    part_dir = b.log_dir / f"{topic}-0"
    before = sorted(part_dir.glob("*.log"))
    assert len(before) > 3
    admin = _admin(b)
    tp = ck.TopicPartition(topic, 0, 250)
    res = admin.delete_records([tp])[tp].result(timeout=30)
    assert res.low_watermark == 250
    after = sorted(part_dir.glob("*.log"))
    assert len(after) < len(before)
    first_base = int(after[0].name.split(".")[0])
    assert first_base <= 250
    c = ck.Consumer(
        {"bootstrap.servers": b.bootstrap, "group.id": "dr", "auto.offset.reset": "earliest"}
    )
    try:
        assert c.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=30) == (250, 400)
        c.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
        offsets: list[int] = []
        deadline = time.monotonic() + 30
        while len(offsets) < 150 and time.monotonic() < deadline:
            for m in c.consume(500, timeout=0.5):
                assert not m.error(), m.error()
                offsets.append(m.offset())
        assert offsets == list(range(250, 400))
    finally:
        c.close()
    # above the high watermark: OFFSET_OUT_OF_RANGE
    tp_bad = ck.TopicPartition(topic, 0, 401)
    with pytest.raises(ck.KafkaException) as exc:
        admin.delete_records([tp_bad])[tp_bad].result(timeout=30)
    assert exc.value.args[0].code() == ck.KafkaError.OFFSET_OUT_OF_RANGE


def test_delete_topic(broker):
    admin = _admin(broker)
    topic = new_topic(broker.bootstrap, partitions=2, prefix="del", **{"retention.ms": "5000"})
    ck_produce(
        broker.bootstrap,
        topic,
        make_records(20, partitions=2, seed=1),
        codec="none",
        acks="1",
        idempotent=False,
    )
    assert (broker.log_dir / "topic-configs" / f"{topic}.properties").exists()
    admin.delete_topics([topic])[topic].result(timeout=30)
    assert topic not in admin.list_topics(timeout=30).topics
    assert not (broker.log_dir / f"{topic}-0").exists()
    assert not (broker.log_dir / f"{topic}-1").exists()
    assert not (broker.log_dir / "topic-configs" / f"{topic}.properties").exists()
    fut = admin.delete_topics([topic])[topic]
    with pytest.raises(ck.KafkaException) as exc:
        fut.result(timeout=30)
    assert exc.value.args[0].code() == ck.KafkaError.UNKNOWN_TOPIC_OR_PART


def test_describe_broker_configs(broker):
    admin = _admin(broker)
    res = ConfigResource(ConfigResource.Type.BROKER, "0")
    entries = admin.describe_configs([res])[res].result(timeout=30)
    assert entries["listeners"].value == f"PLAINTEXT://{broker.bootstrap}"
    assert entries["listeners"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert entries["num.partitions"].value == "1"
    assert entries["num.partitions"].source == ConfigSource.DEFAULT_CONFIG.value
    assert entries["log.dirs"].value == str(broker.log_dir)


def test_broker_starts_from_the_shipped_properties_file(tmp_path):
    from tests.fixtures.broker import ROOT, BrokerProcess

    class FromFile(BrokerProcess):
        def command(self) -> list[str]:
            cmd = super().command()
            return [*cmd[:4], "--config", str(ROOT / "conf" / "broker.properties"), *cmd[4:]]

    b = FromFile(tmp_path / "b")
    b.start()
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        res = ConfigResource(ConfigResource.Type.BROKER, "0")
        entries = admin.describe_configs([res])[res].result(timeout=30)
        assert entries["num.io.threads"].value == "4"  # the override wins over the file
        assert entries["node.id"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    finally:
        assert b.stop() == 0


def test_altered_retention_is_applied_by_the_running_broker(broker_factory):
    b = broker_factory(
        **{"log.retention.check.interval.ms": "200", "log.segment.delete.delay.ms": "0"}
    )
    topic = new_topic(b.bootstrap, partitions=1, prefix="ret", **{"segment.bytes": "4096"})
    records = make_records(300, partitions=1, seed=9)
    old = int(time.time() * 1000) - 3_600_000  # an hour old: beyond any retention below
    records = [r._replace(timestamp=old + i) for i, r in enumerate(records)]
    ck_produce(
        b.bootstrap, topic, records, codec="none", acks="all", idempotent=False, flush_every=20
    )
    part_dir = b.log_dir / f"{topic}-0"
    before = len(list(part_dir.glob("*.log")))
    assert before > 3
    admin = _admin(b)
    res = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("retention.ms", "60000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    admin.incremental_alter_configs([res])[res].result(timeout=30)
    tp = ck.TopicPartition(topic, 0)
    deadline = time.monotonic() + 60
    low = 0
    while time.monotonic() < deadline:
        low = admin.list_offsets({tp: OffsetSpec.earliest()})[tp].result(timeout=30).offset
        if low > 0 and len(list(part_dir.glob("*.log"))) == 1:
            break
        time.sleep(0.2)
    # every closed segment is past retention; the active one always stays
    assert len(list(part_dir.glob("*.log"))) == 1
    assert 0 < low < 300
    high = admin.list_offsets({tp: OffsetSpec.latest()})[tp].result(timeout=30).offset
    assert high == 300
