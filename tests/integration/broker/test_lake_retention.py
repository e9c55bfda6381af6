"""The broker's periodic retention bounded by the lake's consumer group
(``log.retention.lake.group``): a real broker, real confluent-kafka clients, real segments."""

from __future__ import annotations

import time

import confluent_kafka as ck
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    OffsetSpec,
)

from tests.fixtures.broker import wait_for
from tests.integration.broker.clients import ck_produce, make_records, new_topic

GROUP = "loglake-ingest"
N = 300


def _fast_retention(**more: str) -> dict[str, str]:
    return {
        "log.retention.check.interval.ms": "100",
        "log.segment.delete.delay.ms": "0",
        "log.retention.lake.group": GROUP,
        **more,
    }


def _topic_with_segments(bootstrap: str) -> str:
    """One partition of N old records in many small segments, retention not yet short."""
    topic = new_topic(bootstrap, partitions=1, prefix="lake", **{"segment.bytes": "4096"})
    old = int(time.time() * 1000) - 3_600_000  # an hour old: past the retention.ms set below
    records = [
        r._replace(timestamp=old + i) for i, r in enumerate(make_records(N, partitions=1, seed=5))
    ]
    ck_produce(
        bootstrap, topic, records, codec="none", acks="all", idempotent=False, flush_every=20
    )
    return topic


def _bases(b, topic: str) -> list[int]:
    return sorted(int(p.stem) for p in (b.log_dir / f"{topic}-0").glob("*.log"))


def _commit(bootstrap: str, topic: str, offset: int) -> None:
    c = ck.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False}
    )
    try:
        c.commit(offsets=[ck.TopicPartition(topic, 0, offset)], asynchronous=False)
        got = c.committed([ck.TopicPartition(topic, 0)], timeout=30)
        assert got[0].offset == offset
    finally:
        c.close()


def _set_retention(bootstrap: str, topic: str, key: str, value: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)],
    )
    admin.incremental_alter_configs([res])[res].result(timeout=30)


def _earliest(bootstrap: str, topic: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tp = ck.TopicPartition(topic, 0)
    return int(admin.list_offsets({tp: OffsetSpec.earliest()})[tp].result(timeout=30).offset)


def _kept(b, topic: str, bases: list[int]) -> bool:
    """The log holds exactly the segments ``bases`` and starts at the first (the files go
    just before the log start offset moves: both are waited for)."""
    return _bases(b, topic) == bases and _earliest(b.bootstrap, topic) == bases[0]


def _holding(bases: list[int], offset: int) -> int:
    """The base offset of the segment holding ``offset``."""
    return max(b for b in bases if b <= offset)


def test_without_a_commit_the_partition_is_held_until_the_first(broker_factory):
    b = broker_factory(**_fast_retention())
    topic = _topic_with_segments(b.bootstrap)
    bases = _bases(b, topic)
    assert len(bases) > 5
    # the lake group has no offset for it yet: nothing goes by time or by size
    _set_retention(b.bootstrap, topic, "retention.ms", "60000")
    _set_retention(b.bootstrap, topic, "retention.bytes", "0")
    for _ in range(20):
        time.sleep(0.1)
        assert _bases(b, topic) == bases
    assert _earliest(b.bootstrap, topic) == 0
    # the first commit releases what the lake has, and no more
    lake = bases[2] + 1
    _commit(b.bootstrap, topic, lake)
    wait_for(lambda: _kept(b, topic, [x for x in bases if x >= _holding(bases, lake)]))
    assert "the lake has not ingested" not in b.log_text()


def test_a_topic_never_ingested_is_held_no_longer_than_max_ms(broker_factory):
    b = broker_factory(**_fast_retention(**{"log.retention.lake.max.ms": "1500"}))
    topic = _topic_with_segments(b.bootstrap)
    bases = _bases(b, topic)
    _set_retention(b.bootstrap, topic, "retention.ms", "60000")
    # no commit ever: retained as in Kafka once the partition has waited 1.5 s for one
    wait_for(lambda: _kept(b, topic, bases[-1:]))
    text = b.log_text()
    assert f"{topic}-0: retention deletes offsets [0, {bases[-1]})" in text
    assert "has committed no offset for it" in text and "log.retention.lake.max.ms=1500" in text


def test_committed_group_bounds_time_and_size_retention(broker_factory):
    b = broker_factory(**_fast_retention())
    topic = _topic_with_segments(b.bootstrap)
    bases = _bases(b, topic)
    assert len(bases) > 5
    lake = bases[3] + 5  # inside the fourth segment
    _commit(b.bootstrap, topic, lake)
    _set_retention(b.bootstrap, topic, "retention.ms", "60000")
    keep_from = _holding(bases, lake)
    wait_for(lambda: _kept(b, topic, [x for x in bases if x >= keep_from]))
    # many more checks run (every 100 ms): nothing at or above the lake's offset goes
    for _ in range(20):
        time.sleep(0.1)
        assert _bases(b, topic) == [x for x in bases if x >= keep_from]
    # size retention is bounded the same way
    _set_retention(b.bootstrap, topic, "retention.bytes", "0")
    for _ in range(10):
        time.sleep(0.1)
        assert _bases(b, topic) == [x for x in bases if x >= keep_from]
    assert "the lake has not ingested" not in b.log_text()
    # the lake ingests further: retention proceeds to it, then to the end
    lake2 = bases[-3] + 1
    _commit(b.bootstrap, topic, lake2)
    wait_for(lambda: _kept(b, topic, [x for x in bases if x >= _holding(bases, lake2)]))
    _commit(b.bootstrap, topic, N)
    wait_for(lambda: _kept(b, topic, bases[-1:]))


def test_safety_valve_max_bytes(broker_factory):
    b = broker_factory(**_fast_retention(**{"log.retention.lake.max.bytes": "20000"}))
    topic = _topic_with_segments(b.bootstrap)
    bases = _bases(b, topic)
    _commit(b.bootstrap, topic, 0)  # the lake has read nothing
    sizes = {int(p.stem): p.stat().st_size for p in (b.log_dir / f"{topic}-0").glob("*.log")}
    assert sum(sizes.values()) > 20000
    _set_retention(b.bootstrap, topic, "retention.ms", "60000")
    # the oldest segments go until the log is no larger than 20000 bytes, no further
    expected = list(bases)
    while sum(sizes[x] for x in expected) > 20000:
        expected.pop(0)
    wait_for(lambda: _kept(b, topic, expected))
    for _ in range(10):
        time.sleep(0.1)
        assert _bases(b, topic) == expected
    wait_for(lambda: f"{topic}-0: retention deletes offsets [0, {expected[0]})" in b.log_text())


def test_safety_valve_max_ms(broker_factory):
    b = broker_factory(**_fast_retention(**{"log.retention.lake.max.ms": "1500"}))
    topic = _topic_with_segments(b.bootstrap)
    bases = _bases(b, topic)
    _commit(b.bootstrap, topic, 0)
    _set_retention(b.bootstrap, topic, "retention.ms", "60000")
    # held while the commit is fresh, then retained as in Kafka once it is older than 1.5 s
    wait_for(lambda: _kept(b, topic, bases[-1:]))
    text = b.log_text()
    assert f"{topic}-0: retention deletes offsets [0, {bases[-1]})" in text
    assert "log.retention.lake.max.ms=1500" in text
