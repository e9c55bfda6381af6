"""Consumer groups against the real broker with real clients.

- confluent-kafka (librdkafka): two members of one group split a 4-partition topic; the
  second commits part-way and leaves; the first takes its partitions over and resumes
  exactly at the committed offsets; committed offsets survive a broker restart and a new
  member continues from them.
- kafka-python and aiokafka: join a group, consume, commit, read the commits back (their own
  ``committed()`` and an admin client's group offsets, list and describe).

Timeouts in the loops below only bound how long a broken broker can hang a test; nothing
asserts on elapsed time.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from tests.fixtures.broker import BrokerProcess

pytestmark = pytest.mark.integration

PARTITIONS = 4
PER_PARTITION = 50


@pytest.fixture(scope="module")
def group_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker of this module's own: short initial rebalance delay, restartable."""
    b = BrokerProcess(
        tmp_path_factory.mktemp("groups-broker"),
        group_initial_rebalance_delay_ms=200,
    )
    b.start()
    try:
        yield b
    finally:
        code = b.stop()
        print(f"--- group broker log tail ({b.log_path}) ---\n{b.log_tail()}")
        b.kill()
        assert code == 0, b.log_tail()


def _create_topic(bootstrap: str, partitions: int = PARTITIONS) -> str:
    name = f"groups-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1)], operation_timeout=10
    )
    futures[name].result(timeout=30)
    return name


def _produce(bootstrap: str, topic: str, per_partition: int, tag: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    errors: list[Any] = []
    for p in range(PARTITIONS):
        for i in range(per_partition):
            producer.produce(
                topic,
                key=f"{tag}-{p}-{i}".encode(),
                value=f"value-{tag}-{p}-{i}".encode(),
                partition=p,
                on_delivery=lambda err, _msg: err and errors.append(err),
            )
    assert producer.flush(30) == 0
    assert errors == []


def _ck_consumer(bootstrap: str, group: str, client_id: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "client.id": client_id,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "partition.assignment.strategy": "range",
            "session.timeout.ms": 15000,  # nothing waits on it; robust under load
            "heartbeat.interval.ms": 300,
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )


def _poll_until(
    consumers: list[Consumer],
    done: Callable[[], bool],
    seen: dict[int, list[tuple[int, int, bytes]]] | None = None,
    *,
    timeout: float = 60.0,
) -> None:
    """Poll every consumer in turn (a rebalance needs all members polling) until ``done()``;
    records go to ``seen[consumer index]`` as (partition, offset, key)."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached while polling the group")
        for i, c in enumerate(consumers):
            msg = c.poll(0.1)
            if msg is None:
                continue
            if msg.error() is not None:
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                continue
            assert seen is not None, "no records were expected yet"
            seen.setdefault(i, []).append((msg.partition(), msg.offset(), msg.key()))


def _parts(consumer: Consumer) -> set[int]:
    return {tp.partition for tp in consumer.assignment()}


def test_confluent_group_split_takeover_and_restart(group_broker: BrokerProcess) -> None:
    bootstrap = group_broker.bootstrap
    topic = _create_topic(bootstrap)
    group = f"cg-{uuid.uuid4().hex[:8]}"
    c1 = _ck_consumer(bootstrap, group, "member-one")
    c2 = _ck_consumer(bootstrap, group, "member-two")
    try:
        c1.subscribe([topic])
        c2.subscribe([topic])
        # 1. the group splits the partitions between the two members
        _poll_until(
            [c1, c2],
            lambda: (
                len(_parts(c1)) + len(_parts(c2)) == PARTITIONS
                and bool(_parts(c1))
                and bool(_parts(c2))
            ),
        )
        p1, p2 = _parts(c1), _parts(c2)
        assert p1.isdisjoint(p2) and p1 | p2 == set(range(PARTITIONS))
        assert (len(p1), len(p2)) == (2, 2)  # the range assignor over 4 partitions

        # 2. each member reads exactly its own partitions
        _produce(bootstrap, topic, PER_PARTITION, "a")
        seen: dict[int, list[tuple[int, int, bytes]]] = {}
        _poll_until(
            [c1, c2], lambda: sum(len(v) for v in seen.values()) >= PARTITIONS * PER_PARTITION, seen
        )
        for idx, parts in ((0, p1), (1, p2)):
            got = sorted((p, o) for p, o, _ in seen[idx])
            assert got == [(p, o) for p in sorted(parts) for o in range(PER_PARTITION)]
            assert all(k == f"a-{p}-{o}".encode() for p, o, k in seen[idx])

        # 3. member one commits everything, member two only up to offset 30, then leaves
        c1.commit(asynchronous=False)
        committed_two = [TopicPartition(topic, p, 30) for p in sorted(p2)]
        c2.commit(offsets=committed_two, asynchronous=False)
        assert {tp.partition: tp.offset for tp in c1.committed(committed_two, timeout=10)} == {
            p: 30 for p in p2
        }
        c2.close()

        # 4. member one takes over and resumes at the committed offsets of the leaver
        seen = {}
        _poll_until(
            [c1],
            lambda: (
                _parts(c1) == set(range(PARTITIONS))
                and len(seen.get(0, [])) >= len(p2) * (PER_PARTITION - 30)
            ),
            seen,
        )
        resumed = sorted((p, o) for p, o, _ in seen[0])
        assert resumed == [(p, o) for p in sorted(p2) for o in range(30, PER_PARTITION)]
        c1.commit(asynchronous=False)
        everything = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        assert [tp.offset for tp in c1.committed(everything, timeout=10)] == [
            PER_PARTITION
        ] * PARTITIONS
    finally:
        c1.close()
        c2.close()

    # 5. the commits survive a broker restart; a new member continues from them
    assert group_broker.stop() == 0
    group_broker.start()
    _produce(bootstrap, topic, 2, "b")
    c3 = _ck_consumer(bootstrap, group, "member-three")
    try:
        everything = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        assert [tp.offset for tp in c3.committed(everything, timeout=30)] == [
            PER_PARTITION
        ] * PARTITIONS
        c3.subscribe([topic])
        seen = {}
        _poll_until([c3], lambda: len(seen.get(0, [])) >= PARTITIONS * 2, seen)
        assert sorted((p, o, k) for p, o, k in seen[0]) == [
            (p, PER_PARTITION + i, f"b-{p}-{i}".encode())
            for p in range(PARTITIONS)
            for i in range(2)
        ]
    finally:
        c3.close()


def test_confluent_static_member_restart_keeps_assignment(group_broker: BrokerProcess) -> None:
    """KIP-345: a member with ``group.instance.id`` that comes back is given its old
    partitions without a rebalance (the other member keeps its partitions throughout)."""
    bootstrap = group_broker.bootstrap
    topic = _create_topic(bootstrap)
    group = f"static-{uuid.uuid4().hex[:8]}"

    def member(instance: str) -> Consumer:
        c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "group.instance.id": instance,
                "client.id": instance,
                "session.timeout.ms": 15000,  # nothing waits on it; robust under load
                "heartbeat.interval.ms": 300,
                "partition.assignment.strategy": "range",
            }
        )
        return c

    revoked: list[list[int]] = []
    one, two = member("static-one"), member("static-two")
    try:
        one.subscribe(
            [topic], on_revoke=lambda _c, parts: revoked.append([tp.partition for tp in parts])
        )
        # "static-one" joins first and so leads: a returning leader rebalances (as Kafka
        # does for JoinGroup < v9, which librdkafka uses); a returning follower must not.
        _poll_until([one], lambda: len(_parts(one)) == PARTITIONS)
        two.subscribe([topic])
        _poll_until([one, two], lambda: len(_parts(one)) == 2 and len(_parts(two)) == 2)
        before = (_parts(one), _parts(two))
        revoked.clear()
        two.close()  # a static member leaves no LeaveGroup behind
        two = member("static-two")
        two.subscribe([topic])
        _poll_until([one, two], lambda: len(_parts(two)) == 2)
        assert (_parts(one), _parts(two)) == before
        assert revoked == []
        admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive its futures
        described = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
        assert described.state.name == "STABLE"
        assert sorted(m.group_instance_id for m in described.members) == [
            "static-one",
            "static-two",
        ]
    finally:
        one.close()
        two.close()


def test_confluent_admin_lists_and_describes_groups(group_broker: BrokerProcess) -> None:
    bootstrap = group_broker.bootstrap
    topic = _create_topic(bootstrap, partitions=2)
    group = f"adm-{uuid.uuid4().hex[:8]}"
    consumer = _ck_consumer(bootstrap, group, "described-member")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        consumer.subscribe([topic])
        _poll_until([consumer], lambda: len(_parts(consumer)) == 2)
        consumer.commit(
            offsets=[TopicPartition(topic, 0, 3), TopicPartition(topic, 1, 4)], asynchronous=False
        )
        listed = admin.list_consumer_groups(request_timeout=10).result()
        states = {g.group_id: g.state.name for g in listed.valid}
        assert states.get(group) == "STABLE"
        described = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
        assert described.state.name == "STABLE"
        assert described.partition_assignor == "range"
        [member] = described.members
        assert member.client_id == "described-member"
        assert member.host == "/127.0.0.1"
        assert sorted(tp.partition for tp in member.assignment.topic_partitions) == [0, 1]
    finally:
        consumer.close()
    offsets = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group)], request_timeout=10
    )[group].result()
    assert sorted((tp.partition, tp.offset) for tp in offsets.topic_partitions) == [(0, 3), (1, 4)]
    described = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
    assert described.state.name == "EMPTY"
    assert described.members == []
    # DeleteGroups: the empty group and its offsets go
    admin.delete_consumer_groups([group], request_timeout=10)[group].result()
    listed = admin.list_consumer_groups(request_timeout=10).result()
    assert group not in {g.group_id for g in listed.valid}
    offsets = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group)], request_timeout=10
    )[group].result()
    assert offsets.topic_partitions == []


def test_kafka_python_group_commit_and_fetch(group_broker: BrokerProcess) -> None:
    from kafka import KafkaConsumer, OffsetAndMetadata
    from kafka import TopicPartition as KTopicPartition
    from kafka.admin import KafkaAdminClient

    bootstrap = group_broker.bootstrap
    topic = _create_topic(bootstrap, partitions=2)
    _produce_n(bootstrap, topic, 2, 10, "kp")
    group = f"kp-{uuid.uuid4().hex[:8]}"
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=1000,
        client_id="kafka-python-member",
    )
    try:
        got: list[tuple[int, int]] = []
        deadline = time.monotonic() + 60
        while len(got) < 20 and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                got.extend((m.partition, m.offset) for m in batch)
        assert sorted(got) == [(p, o) for p in range(2) for o in range(10)]
        consumer.commit(
            {
                KTopicPartition(topic, 0): OffsetAndMetadata(10, "done-0", -1),
                KTopicPartition(topic, 1): OffsetAndMetadata(7, "", -1),
            }
        )
        assert consumer.committed(KTopicPartition(topic, 0)) == 10
        assert consumer.committed(KTopicPartition(topic, 1)) == 7
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            offsets = admin.list_group_offsets({group: None})[group]
            assert {tp.partition: (om.offset, om.metadata) for tp, om in offsets.items()} == {
                0: (10, "done-0"),
                1: (7, ""),
            }
            listed = {g["group_id"]: g for g in admin.list_groups()}
            assert (listed[group]["protocol_type"], listed[group]["group_state"]) == (
                "consumer",
                "Stable",
            )
            desc = admin.describe_groups([group])[group]
            assert (desc["group_state"], desc["protocol_data"]) == ("Stable", "range")
            [member] = desc["members"]
            assert member["client_id"] == "kafka-python-member"
            assert member["member_assignment"]["assigned_partitions"] == [
                {"topic": topic, "partitions": [0, 1]}
            ]
        finally:
            admin.close()
    finally:
        consumer.close()


def test_aiokafka_group_commit_and_fetch(group_broker: BrokerProcess) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as ATopicPartition

    bootstrap = group_broker.bootstrap
    topic = _create_topic(bootstrap, partitions=2)
    _produce_n(bootstrap, topic, 2, 6, "aio")
    group = f"aio-{uuid.uuid4().hex[:8]}"

    async def run() -> tuple[list[tuple[int, int]], dict[int, int | None], dict[int, int | None]]:
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await consumer.start()
        try:
            got: list[tuple[int, int]] = []
            deadline = time.monotonic() + 60
            while len(got) < 12 and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=500)
                for msgs in batches.values():
                    got.extend((m.partition, m.offset) for m in msgs)
            await consumer.commit({ATopicPartition(topic, 0): 6, ATopicPartition(topic, 1): 2})
            first = {p: await consumer.committed(ATopicPartition(topic, p)) for p in range(2)}
        finally:
            await consumer.stop()
        # A second consumer of the group sees the same commits after the first left.
        again = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
        await again.start()
        try:
            second = {p: await again.committed(ATopicPartition(topic, p)) for p in range(2)}
        finally:
            await again.stop()
        return got, first, second

    got, first, second = asyncio.run(run())
    assert sorted(got) == [(p, o) for p in range(2) for o in range(6)]
    assert first == second == {0: 6, 1: 2}


def _produce_n(bootstrap: str, topic: str, partitions: int, per_partition: int, tag: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for p in range(partitions):
        for i in range(per_partition):
            producer.produce(topic, key=f"{tag}-{p}-{i}".encode(), value=b"x", partition=p)
    assert producer.flush(30) == 0


def test_committed_offsets_survive_sigkill(group_broker: BrokerProcess) -> None:
    """An acknowledged commit is in the log: recovery after SIGKILL keeps it."""
    bootstrap = group_broker.bootstrap
    topic = _create_topic(bootstrap, partitions=2)
    group = f"kill-{uuid.uuid4().hex[:8]}"
    consumer = _ck_consumer(bootstrap, group, "killed-member")
    try:
        for n in range(1, 6):  # several commits, the last one wins
            consumer.commit(
                offsets=[TopicPartition(topic, 0, 10 * n), TopicPartition(topic, 1, n)],
                asynchronous=False,
            )
    finally:
        consumer.close()
    group_broker.kill()
    group_broker.start()
    fresh = _ck_consumer(bootstrap, group, "after-kill")
    try:
        committed = fresh.committed([TopicPartition(topic, p) for p in range(2)], timeout=30)
        assert [(tp.partition, tp.offset) for tp in committed] == [(0, 50), (1, 5)]
    finally:
        fresh.close()


def test_offsets_topic_on_disk_is_compacted_kafka_format(group_broker: BrokerProcess) -> None:
    """The commits of this module are in __consumer_offsets as Kafka's records."""
    from logstore.protocol.batch import iter_batches
    from logstore.protocol.records import decode_batch
    from logstore.server.group.schemas import OffsetKey, decode_key, decode_offset_value

    log_dir = Path(group_broker.log_dir)
    dirs = sorted(log_dir.glob("__consumer_offsets-*"))
    assert dirs, "no __consumer_offsets partition was written"
    props = (log_dir / "topic-configs" / "__consumer_offsets.properties").read_text()
    assert "cleanup.policy=compact" in props
    keys = []
    for d in dirs:
        for seg in sorted(d.glob("*.log")):
            data = seg.read_bytes()
            for pos, _ in iter_batches(data):
                for rec in decode_batch(data, pos)[1]:
                    assert rec.key is not None
                    key = decode_key(rec.key)
                    if isinstance(key, OffsetKey) and rec.value is not None:
                        keys.append((key.group, decode_offset_value(rec.value).offset))
    assert any(g.startswith("cg-") and o == PER_PARTITION for g, o in keys)
