"""Topic ids as Kafka keeps them (KIP-516), through a real broker and real clients: random at
creation, read back from partition.metadata after a restart, new after delete + recreate with
the old id refused (Fetch v13+, Metadata and DeleteTopics by id), a real Kafka log dir's ids and
cluster id served, and a log dir of another cluster refused at start."""

from __future__ import annotations

import datetime
import shutil
import uuid
from pathlib import Path

import pytest
from confluent_kafka import TopicCollection
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.admin import KafkaAdminClient
from kio.schema.delete_topics.v6.request import DeleteTopicsRequest, DeleteTopicState
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic

from logstore.server.handlers import fetch
from logstore.storage.meta_properties import META_PROPERTIES_FILE
from logstore.storage.partition_metadata import format_topic_id, read_partition_metadata
from logstore.storage.properties import parse_properties
from tests.integration.broker.clients import ck_produce, make_records, new_topic
from tests.integration.broker.rawclient import RawClient
from tests.integration.broker.test_kafka4_versions import _fetch

pytestmark = pytest.mark.integration


def _metadata(c: RawClient, *, names: tuple[str, ...] = (), ids: tuple[uuid.UUID, ...] = ()):
    topics = tuple(MetadataRequestTopic(topic_id=None, name=n) for n in names) + tuple(
        MetadataRequestTopic(topic_id=i, name=None) for i in ids
    )
    return c.call(
        MetadataRequest(
            topics=topics if topics else None,
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
    )


def _ck_topic_id(bootstrap: str, topic: str) -> str:
    """The id librdkafka reports, in Kafka's string form (librdkafka's own ``str`` uses the
    standard base64 alphabet, so the two 64-bit halves are compared instead)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    desc = admin.describe_topics(TopicCollection([topic]))[topic].result(timeout=30)
    tid = desc.topic_id
    msb = tid.get_most_significant_bits() & (2**64 - 1)
    lsb = tid.get_least_significant_bits() & (2**64 - 1)
    return format_topic_id(uuid.UUID(int=(msb << 64) | lsb))


def test_ids_survive_restart_and_a_recreated_topic_never_answers_to_the_old_id(
    broker_factory,
) -> None:
    b = broker_factory()
    topic = new_topic(b.bootstrap, partitions=2, prefix="ids")
    ck_produce(
        b.bootstrap,
        topic,
        make_records(6, partitions=2, seed=3),
        codec="none",
        acks="all",
        idempotent=False,
    )
    on_disk = {read_partition_metadata(b.log_dir / f"{topic}-{p}") for p in (0, 1)}
    assert len(on_disk) == 1
    (tid,) = on_disk
    assert tid is not None
    assert _ck_topic_id(b.bootstrap, topic) == format_topic_id(tid)  # librdkafka's Uuid str
    kp = KafkaAdminClient(bootstrap_servers=b.bootstrap)
    try:
        (desc,) = kp.describe_topics([topic])
        assert uuid.UUID(str(desc["topic_id"])) == tid
    finally:
        kp.close()
    cluster = parse_properties((b.log_dir / META_PROPERTIES_FILE).read_text())["cluster.id"]

    b.stop()
    b.start()
    with RawClient(b.bootstrap) as c:
        r = _metadata(c, ids=(tid,))  # by id, nothing asked by name since the restart
        (t,) = r.topics
        assert (t.error_code, t.name, t.topic_id, len(t.partitions)) == (
            ErrorCode.none,
            topic,
            tid,
            2,
        )
        assert r.cluster_id == cluster
    assert _ck_topic_id(b.bootstrap, topic) == format_topic_id(tid)

    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.delete_topics([topic], operation_timeout=10)[topic].result(timeout=30)
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=1, replication_factor=1)], operation_timeout=10
    )
    futures[topic].result(timeout=30)
    new = read_partition_metadata(b.log_dir / f"{topic}-0")
    assert new is not None and new != tid
    assert _ck_topic_id(b.bootstrap, topic) == format_topic_id(new)
    ck_produce(
        b.bootstrap,
        topic,
        make_records(2, partitions=1, seed=4),
        codec="none",
        acks="all",
        idempotent=False,
    )

    with RawClient(b.bootstrap) as c:
        # Fetch by the old id: UNKNOWN_TOPIC_ID, never the new topic's records
        for v in (13, fetch.MAX_VERSION):
            (t,) = _fetch(c, v, tid, 1).responses
            assert [(p.error_code, bool(p.records)) for p in t.partitions] == [
                (ErrorCode.unknown_topic_id, False)
            ]
        (t,) = _fetch(c, 13, new, 1).responses
        assert [(p.error_code, p.high_watermark) for p in t.partitions] == [(ErrorCode.none, 2)]
        (t,) = _metadata(c, ids=(tid,)).topics
        assert (t.error_code, t.name, t.topic_id) == (ErrorCode.unknown_topic_id, None, tid)
        # DeleteTopics by the old id deletes nothing; by the new one it deletes the topic
        (res,) = c.call(
            DeleteTopicsRequest(
                topics=(DeleteTopicState(name=None, topic_id=tid),),
                timeout=datetime.timedelta(seconds=10),
            )
        ).responses
        assert (res.error_code, res.topic_id) == (ErrorCode.unknown_topic_id, tid)
        assert (b.log_dir / f"{topic}-0").is_dir()
        (res,) = c.call(
            DeleteTopicsRequest(
                topics=(DeleteTopicState(name=None, topic_id=new),),
                timeout=datetime.timedelta(seconds=10),
            )
        ).responses
        assert (res.error_code, res.name, res.topic_id) == (ErrorCode.none, topic, new)
        (t,) = _metadata(c, names=(topic,)).topics
        assert t.error_code == ErrorCode.unknown_topic_or_partition


def test_a_real_kafka_log_dir_serves_its_topic_ids_and_cluster_id(
    broker_factory, kafka_real: Path, tmp_path: Path
) -> None:
    logs = tmp_path / "kafka-data"
    shutil.copytree(kafka_real / "cdc-lakehouse-pipeline" / "kafka-data", logs)
    expected = {
        d.name.rsplit("-", 1)[0]: read_partition_metadata(d) for d in logs.iterdir() if d.is_dir()
    }
    # the broker that wrote the dir was node 1 (meta.properties): Kafka refuses another id
    b = broker_factory(log_dir=logs, node_id=1)
    with RawClient(b.bootstrap) as c:
        r = _metadata(c)
        served = {t.name: t.topic_id for t in r.topics}
        assert r.cluster_id == "Some(4L6g3nShT-eMCtK--X86sw)"
    assert served["__consumer_offsets"] == expected["__consumer_offsets"]
    assert served["connect_configs"] == expected["connect_configs"]
    assert format_topic_id(served["connect_configs"]) == "NxNymunPR8SzWhDnSV84bw"
    assert _ck_topic_id(b.bootstrap, "connect_configs") == "NxNymunPR8SzWhDnSV84bw"


def test_a_log_dir_of_another_cluster_or_node_is_refused_untouched(
    broker_factory, tmp_path: Path
) -> None:
    a = broker_factory(log_dir=tmp_path / "a")
    a.stop()
    b = broker_factory(log_dir=tmp_path / "b")
    b.stop()
    before = (tmp_path / "b" / META_PROPERTIES_FILE).read_bytes()
    with pytest.raises(RuntimeError, match="belongs to another cluster"):
        broker_factory(log_dir=tmp_path / "a", log_dirs=f"{tmp_path / 'a'},{tmp_path / 'b'}")
    with pytest.raises(RuntimeError, match="stored node id 0 doesn't match"):
        broker_factory(log_dir=tmp_path / "b", node_id=5)
    assert (tmp_path / "b" / META_PROPERTIES_FILE).read_bytes() == before
    broker_factory(log_dir=tmp_path / "b").stop()  # its own node still starts
