"""AlterConfigs (33) and CreatePartitions (37) with confluent-kafka's and kafka-python's admins.

librdkafka sends an API only when the broker advertises it in ApiVersions, so each call
succeeding is also the check that the broker advertises it.
"""

from __future__ import annotations

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import (
    AdminClient,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    OffsetSpec,
)
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient
from kafka.errors import InvalidPartitionsError

from logstore.server.apis import API_HANDLERS
from logstore.storage.topic_config import read_topic_config
from tests.integration.broker.clients import new_topic

pytestmark = [
    pytest.mark.integration,
    # AlterConfigs is deprecated in the clients, and still what kafkajs's alterConfigs sends
    pytest.mark.filterwarnings("ignore:alter_configs has been deprecated:DeprecationWarning"),
]


def test_both_apis_are_advertised():
    assert API_HANDLERS[33][:2] == (0, 2)
    assert API_HANDLERS[37][:2] == (0, 3)


def _describe(admin: AdminClient, topic: str) -> dict:
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return admin.describe_configs([res])[res].result(timeout=30)


def test_alter_configs_replaces_the_overrides(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = new_topic(broker.bootstrap, partitions=1, prefix="legacy", **{"retention.ms": "1000"})
    res = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        set_config={"retention.bytes": "123456", "cleanup.policy": "compact"},
    )
    admin.alter_configs([res])[res].result(timeout=30)
    # the request's configs are the whole set: retention.ms went back to the default
    assert read_topic_config(broker.log_dir, topic) == {
        "retention.bytes": "123456",
        "cleanup.policy": "compact",
    }
    entries = _describe(admin, topic)
    assert entries["retention.bytes"].value == "123456"
    assert entries["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value

    for bad_config, code in (
        ({"no.such.config": "1"}, ck.KafkaError.INVALID_CONFIG),
        ({"retention.bytes": "many"}, ck.KafkaError.INVALID_CONFIG),
    ):
        bad = ConfigResource(ConfigResource.Type.TOPIC, topic, set_config=bad_config)
        with pytest.raises(ck.KafkaException) as exc:
            admin.alter_configs([bad])[bad].result(timeout=30)
        assert exc.value.args[0].code() == code
    unknown = ConfigResource(ConfigResource.Type.TOPIC, topic + "-nope", set_config={})
    with pytest.raises(ck.KafkaException) as exc:
        admin.alter_configs([unknown])[unknown].result(timeout=30)
    assert exc.value.args[0].code() == ck.KafkaError.UNKNOWN_TOPIC_OR_PART
    # validate_only checks and changes nothing
    check = ConfigResource(ConfigResource.Type.TOPIC, topic, set_config={"retention.ms": "5"})
    admin.alter_configs([check], validate_only=True)[check].result(timeout=30)
    assert read_topic_config(broker.log_dir, topic) == {
        "retention.bytes": "123456",
        "cleanup.policy": "compact",
    }


def test_kafka_python_alter_configs(broker):
    topic = new_topic(broker.bootstrap, partitions=1, prefix="kpalter", **{"retention.ms": "1000"})
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        res = KpConfigResource(ConfigResourceType.TOPIC, topic, configs={"segment.ms": "600000"})
        admin.alter_configs([res], incremental=False)
    finally:
        admin.close()
    assert read_topic_config(broker.log_dir, topic)["segment.ms"] == "600000"


def test_create_partitions(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = new_topic(broker.bootstrap, partitions=2, prefix="grow", **{"retention.ms": "99999"})
    admin.create_partitions([NewPartitions(topic, 4)])[topic].result(timeout=30)
    md = admin.list_topics(topic, timeout=30).topics[topic]
    assert sorted(md.partitions) == [0, 1, 2, 3]
    for p in (2, 3):
        assert (broker.log_dir / f"{topic}-{p}").is_dir()
    # a new partition takes records, and keeps the topic's config
    producer = ck.Producer({"bootstrap.servers": broker.bootstrap})
    producer.produce(topic, value=b"into the new partition", partition=3)
    assert producer.flush(30) == 0
    tp = ck.TopicPartition(topic, 3)
    assert admin.list_offsets({tp: OffsetSpec.latest()})[tp].result(timeout=30).offset == 1
    assert _describe(admin, topic)["retention.ms"].value == "99999"

    for count, code in (
        (3, ck.KafkaError.INVALID_PARTITIONS),
        (4, ck.KafkaError.INVALID_PARTITIONS),
    ):
        with pytest.raises(ck.KafkaException) as exc:
            admin.create_partitions([NewPartitions(topic, count)])[topic].result(timeout=30)
        assert exc.value.args[0].code() == code
    missing = topic + "-nope"
    with pytest.raises(ck.KafkaException) as exc:
        admin.create_partitions([NewPartitions(missing, 3)])[missing].result(timeout=30)
    assert exc.value.args[0].code() == ck.KafkaError.UNKNOWN_TOPIC_OR_PART
    # validate_only creates nothing
    admin.create_partitions([NewPartitions(topic, 6)], validate_only=True)[topic].result(timeout=30)
    assert len(admin.list_topics(topic, timeout=30).topics[topic].partitions) == 4
    assert not (broker.log_dir / f"{topic}-4").exists()


def test_kafka_python_create_partitions(broker):
    topic = new_topic(broker.bootstrap, partitions=1, prefix="kpgrow")
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.create_partitions({topic: 3})
        with pytest.raises(InvalidPartitionsError):
            admin.create_partitions({topic: 2})
        # manual assignment on another node: refused, nothing created
        resp = admin.create_partitions(
            {topic: {"count": 4, "assignments": [[99]]}}, raise_errors=False
        )
        assert [r.error_code for r in resp.results] == [39]  # INVALID_REPLICA_ASSIGNMENT
    finally:
        admin.close()
    assert sorted(p.name for p in broker.log_dir.glob(f"{topic}-*")) == [
        f"{topic}-0",
        f"{topic}-1",
        f"{topic}-2",
    ]
