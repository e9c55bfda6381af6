"""Every Kafka 4.x topic config over the wire, with confluent-kafka's admin, producer and
consumer against the real broker: CreateTopics / IncrementalAlterConfigs / DescribeConfigs
(types, sources, synonyms), validation errors, and the effects of the implemented configs
(recompression, the timestamp window, preallocate) read back from the segment files."""

from __future__ import annotations

import os
import time

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
)
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient
from kio.schema.describe_configs.v4.request import (
    DescribeConfigsRequest,
    DescribeConfigsResource,
)

from logstore.protocol.batch import CODEC_MASK, Codec, iter_batches
from logstore.storage.topic_config import read_topic_config, write_topic_config
from logstore.storage.topic_config_defs import TOPIC_CONFIGS
from tests.fixtures.broker import BrokerProcess
from tests.integration.broker.clients import ck_consume, new_topic
from tests.integration.broker.rawclient import RawClient

pytestmark = pytest.mark.integration

# what Kafka Connect / Debezium / Terraform send and loglake used to refuse
TOOL_CONFIGS = {
    "min.cleanable.dirty.ratio": "0.1",
    "max.compaction.lag.ms": "60000",
    "compression.type": "zstd",
    "min.insync.replicas": "1",
    "unclean.leader.election.enable": "false",
    "segment.jitter.ms": "1000",
    "message.timestamp.after.max.ms": "86400000",
    "leader.replication.throttled.replicas": "*",
    "remote.storage.enable": "false",
    "local.retention.ms": "-2",
}


def _describe(admin: AdminClient, topic: str) -> dict:
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return admin.describe_configs([res])[res].result(timeout=30)


def _create_error(admin: AdminClient, configs: dict[str, str]) -> ck.KafkaError:
    name = f"bad-{time.monotonic_ns()}"
    fut = admin.create_topics([NewTopic(name, 1, 1, config=configs)])[name]
    with pytest.raises(ck.KafkaException) as exc:
        fut.result(timeout=30)
    return exc.value.args[0]


def test_tools_topic_configs_are_accepted_stored_and_described(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = new_topic(broker.bootstrap, partitions=1, prefix="tools", **TOOL_CONFIGS)
    assert read_topic_config(broker.log_dir, topic) == TOOL_CONFIGS
    entries = _describe(admin, topic)
    assert set(entries) == set(TOPIC_CONFIGS)
    for key, value in TOOL_CONFIGS.items():
        assert entries[key].value == value, key
        assert entries[key].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value, key
    dirty = entries["min.cleanable.dirty.ratio"]
    # the override, then the broker key's default (Kafka's synonym)
    assert [(s.name, s.source) for s in dirty.synonyms.values()] == [
        ("min.cleanable.dirty.ratio", ConfigSource.DYNAMIC_TOPIC_CONFIG.value),
        ("log.cleaner.min.cleanable.ratio", ConfigSource.DEFAULT_CONFIG.value),
    ]
    seg = entries["segment.bytes"]
    assert seg.source == ConfigSource.DEFAULT_CONFIG.value and seg.value == "1073741824"
    assert [s.name for s in seg.synonyms.values()] == ["log.segment.bytes"]
    assert entries["preallocate"].value == "false"

    # IncrementalAlterConfigs: SET a no-op key and an implemented one, DELETE one
    res = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("min.insync.replicas", "2", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("compression.zstd.level", "9", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("segment.jitter.ms", None, incremental_operation=AlterConfigOpType.DELETE),
        ],
    )
    admin.incremental_alter_configs([res])[res].result(timeout=30)
    stored = read_topic_config(broker.log_dir, topic)
    assert stored["min.insync.replicas"] == "2" and stored["compression.zstd.level"] == "9"
    assert "segment.jitter.ms" not in stored
    entries = _describe(admin, topic)
    assert entries["segment.jitter.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    assert entries["min.insync.replicas"].value == "2"


@pytest.mark.parametrize(
    ("configs", "fragments"),
    [
        ({"min.cleanable.dirty.ratio": "2"}, ["min.cleanable.dirty.ratio", "[0, 1]"]),
        ({"max.compaction.lag.ms": "0"}, ["max.compaction.lag.ms", ">= 1"]),
        ({"compression.type": "brotli"}, ["compression.type", "producer"]),
        ({"compression.gzip.level": "10"}, ["compression.gzip.level", "[1, 9]"]),
        ({"preallocate": "maybe"}, ["preallocate", "true or false"]),
        ({"min.cleanable.dirty.ration": "0.2"}, ["did you mean 'min.cleanable.dirty.ratio'"]),
    ],
)
def test_bad_topic_configs_are_invalid_config_naming_key_and_rule(broker, configs, fragments):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    err = _create_error(admin, configs)
    assert err.code() == ck.KafkaError.INVALID_CONFIG
    for fragment in fragments:
        assert fragment in err.str(), err.str()


def _segment_batches(log_dir, topic: str) -> list[int]:
    path = log_dir / f"{topic}-0" / "00000000000000000000.log"
    data = path.read_bytes()
    return [h.attributes & CODEC_MASK for _pos, h in iter_batches(data)]


def test_broker_recompresses_lz4_batches_into_the_topic_codec(broker):
    topic = new_topic(broker.bootstrap, partitions=1, prefix="zstd", **{"compression.type": "zstd"})
    keep = new_topic(broker.bootstrap, partitions=1, prefix="as-sent")
    values = [b"value %d " % i * 30 for i in range(300)]
    p = ck.Producer(
        {"bootstrap.servers": broker.bootstrap, "compression.type": "lz4", "linger.ms": 50}
    )
    for t in (topic, keep):
        for i, v in enumerate(values):
            p.produce(t, key=b"k%d" % i, value=v, headers=[("h", b"%d" % i)])
    assert p.flush(30) == 0
    codecs = _segment_batches(broker.log_dir, topic)
    assert codecs and set(codecs) == {Codec.ZSTD}
    assert set(_segment_batches(broker.log_dir, keep)) == {Codec.LZ4}  # producer: as sent
    for t in (topic, keep):
        got = ck_consume(broker.bootstrap, t, {0: len(values)})
        assert [g.value for g in got] == values
        assert [g.key for g in got] == [b"k%d" % i for i in range(len(values))]
        assert [g.headers for g in got] == [(("h", b"%d" % i),) for i in range(len(values))]
        assert [g.offset for g in got] == list(range(len(values)))


def _deliver(bootstrap: str, topic: str, timestamps: list[int]) -> list[ck.KafkaError | None]:
    errors: list[ck.KafkaError | None] = []
    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "retries": 0})
    for ts in timestamps:
        p.produce(topic, value=b"v", timestamp=ts, on_delivery=lambda e, _m: errors.append(e))
        p.flush(30)
    return errors


def test_timestamp_window_answers_invalid_timestamp(broker):
    topic = new_topic(
        broker.bootstrap,
        partitions=1,
        prefix="window",
        **{"message.timestamp.before.max.ms": "3600000", "message.timestamp.after.max.ms": "60000"},
    )
    now = int(time.time() * 1000)
    errors = _deliver(broker.bootstrap, topic, [now, now - 2 * 3_600_000, now + 600_000, now])
    assert errors[0] is None and errors[3] is None
    for e in errors[1:3]:
        assert e is not None and e.code() == ck.KafkaError.INVALID_TIMESTAMP, e
    got = ck_consume(broker.bootstrap, topic, {0: 2})
    assert [g.offset for g in got] == [0, 1]  # the refused records were not appended
    # LogAppendTime: the broker stamps, any producer timestamp goes
    stamped = new_topic(
        broker.bootstrap,
        partitions=1,
        prefix="append-time",
        **{"message.timestamp.type": "LogAppendTime", "message.timestamp.after.max.ms": "0"},
    )
    assert _deliver(broker.bootstrap, stamped, [now + 10 * 3_600_000]) == [None]


def test_preallocate_reserves_the_segment_and_static_broker_defaults_show(broker_factory):
    b = broker_factory(**{"log.cleaner.min.cleanable.ratio": "0.3", "log.roll.jitter.hours": "1"})
    size = 1 << 20
    topic = new_topic(
        b.bootstrap,
        partitions=1,
        prefix="prealloc",
        **{"preallocate": "true", "segment.bytes": str(size)},
    )
    seg = b.log_dir / f"{topic}-0" / "00000000000000000000.log"
    st = os.stat(seg)
    assert st.st_size == 0 and st.st_blocks * 512 >= size
    assert _deliver(b.bootstrap, topic, [int(time.time() * 1000)]) == [None]
    assert 0 < os.stat(seg).st_size < size
    entries = _describe(AdminClient({"bootstrap.servers": b.bootstrap}), topic)
    ratio = entries["min.cleanable.dirty.ratio"]
    assert ratio.value == "0.3" and ratio.source == ConfigSource.STATIC_BROKER_CONFIG.value
    # Kafka lists the broker key twice (its static value, then its default); confluent-kafka
    # keeps synonyms in a dict by name, so read the raw list with kafka-python's admin
    kp = KafkaAdminClient(bootstrap_servers=b.bootstrap)
    try:
        raw = kp.describe_configs(
            [KpConfigResource(ConfigResourceType.TOPIC, topic)],
            include_synonyms=True,
            config_filter="all",
        )["topic"][topic]
    finally:
        kp.close()
    assert raw["min.cleanable.dirty.ratio"]["config_type"] == "DOUBLE"
    assert raw["min.cleanable.dirty.ratio"]["synonyms"] == [
        {
            "name": "log.cleaner.min.cleanable.ratio",
            "value": "0.3",
            "source": "STATIC_BROKER_CONFIG",
        },
        {"name": "log.cleaner.min.cleanable.ratio", "value": "0.5", "source": "DEFAULT_CONFIG"},
    ]
    assert [s["name"] for s in raw["segment.jitter.ms"]["synonyms"]] == [
        "log.roll.jitter.hours",
        "log.roll.jitter.ms",
    ]
    jitter = entries["segment.jitter.ms"]
    assert jitter.value == "3600000" and jitter.source == ConfigSource.STATIC_BROKER_CONFIG.value


def test_a_bad_topic_config_file_stops_the_start_naming_it(tmp_path):
    logs = tmp_path / "logs"
    write_topic_config(logs, "hand-edited", {"min.cleanable.dirty.ratio": "7"})
    b = BrokerProcess(tmp_path / "b", log_dir=logs)
    try:
        with pytest.raises(RuntimeError, match="exited with 2"):
            b.start(timeout=60)
    finally:
        b.close()
    assert (
        "hand-edited.properties: min.cleanable.dirty.ratio='7': expected a value in [0, 1]"
        in b.log_text()
    )


def test_describe_configs_v4_types_and_documentation(broker):
    topic = new_topic(broker.bootstrap, partitions=1, prefix="doc")
    request = DescribeConfigsRequest(
        resources=(
            DescribeConfigsResource(
                resource_type=2,
                resource_name=topic,
                configuration_keys=("min.insync.replicas", "min.cleanable.dirty.ratio"),
            ),
        ),
        include_synonyms=False,
        include_documentation=True,
    )
    with RawClient(broker.bootstrap) as client:
        response = client.call(request)
    (result,) = response.results
    got = {c.name: (c.value, c.config_type, c.documentation) for c in result.configs}
    assert got["min.cleanable.dirty.ratio"][:2] == ("0.5", 6)  # DOUBLE
    assert "(loglake: implemented)" in got["min.cleanable.dirty.ratio"][2]
    assert got["min.insync.replicas"][:2] == ("1", 3)  # INT
    assert "(loglake: no-op)" in got["min.insync.replicas"][2]


def test_segment_jitter_rolls_segments_before_segment_ms(broker):
    # Record timestamps spanning ten segment.ms (100 s) in batches of 1 s. Without jitter a
    # segment rolls once its batches span more than 100 s: ten segments. With
    # segment.jitter.ms=100 s each segment draws its own jitter in [0, 100 s) and rolls after
    # 100 s minus it (50 s on average): about twenty. Fewer than eleven would need the ten or
    # so draws to sum below about 1 s, which no uniform draw does in practice.
    segment_ms, step_ms, count = 100_000, 100, 10_000
    topic = new_topic(
        broker.bootstrap,
        partitions=1,
        prefix="jitter",
        **{"segment.ms": str(segment_ms), "segment.jitter.ms": str(segment_ms)},
    )
    plain = new_topic(
        broker.bootstrap, partitions=1, prefix="no-jitter", **{"segment.ms": str(segment_ms)}
    )
    start = int(time.time() * 1000) - 2 * count * step_ms
    # batches of at most 10 records (1 s of timestamps): a roll is decided per appended batch
    p = ck.Producer(
        {"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "batch.num.messages": 10}
    )
    for t in (topic, plain):
        for i in range(count):
            p.produce(t, value=b"v", timestamp=start + i * step_ms)
            if i % 1000 == 999:
                p.poll(0)
    assert p.flush(60) == 0
    plain_segments = len(list((broker.log_dir / f"{plain}-0").glob("*.log")))
    jitter_segments = len(list((broker.log_dir / f"{topic}-0").glob("*.log")))
    assert plain_segments == 10
    assert jitter_segments > plain_segments
