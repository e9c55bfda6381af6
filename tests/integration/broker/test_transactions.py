"""Transactions end to end with real clients on a real broker (KIP-98).

Each producer client (confluent-kafka, kafka-python, aiokafka) commits and aborts
transactions; READ_COMMITTED consumers of all three clients see exactly the committed
records, READ_UNCOMMITTED ones everything. A second producer with the same transactional id
fences the first (its commit fails, its records are aborted); a transaction left open past
``transaction.timeout.ms`` is aborted by the broker; consume-transform-produce with
``send_offsets_to_transaction`` makes the group's offset visible only with the commit, holds
``__consumer_offsets``' last stable offset meanwhile, and loses to a plain commit made while
it was pending (the later record in the log wins, as in Kafka).

Every consumer reads until an END record of a last committed transaction, so a test never
waits on a guessed time for "nothing more arrives".
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import confluent_kafka as ck
import pytest

from logstore.protocol.batch import iter_batches
from logstore.server.group.offset_store import OFFSETS_TOPIC
from logstore.server.group.schemas import partition_for
from tests.integration.broker.clients import new_topic
from tests.integration.broker.rawclient import RawClient, fetch_request

pytestmark = pytest.mark.integration

END = b"END"


# -- producers: one function per client, same script --------------------------------------
# script: list of (commit?, [values]) transactions, on partition 0


def ck_transactions(
    bootstrap: str, topic: str, txn_id: str, script: list[tuple[bool, list[bytes]]]
) -> None:
    p = ck.Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": txn_id,
            "linger.ms": 5,
            "compression.type": "lz4",
        }
    )
    p.init_transactions(30)
    for commit, values in script:
        p.begin_transaction()
        for v in values:
            p.produce(topic, key=b"k", value=v, partition=0)
        p.flush(30)
        if commit:
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)


def kp_transactions(
    bootstrap: str, topic: str, txn_id: str, script: list[tuple[bool, list[bytes]]]
) -> None:
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id, linger_ms=5)
    try:
        p.init_transactions()
        for commit, values in script:
            p.begin_transaction()
            for v in values:
                p.send(topic, key=b"k", value=v, partition=0)
            p.flush(30)
            if commit:
                p.commit_transaction()
            else:
                p.abort_transaction()
    finally:
        p.close(timeout=10)


def ak_transactions(
    bootstrap: str, topic: str, txn_id: str, script: list[tuple[bool, list[bytes]]]
) -> None:
    from aiokafka import AIOKafkaProducer

    async def run() -> None:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id, linger_ms=5)
        await p.start()
        try:
            for commit, values in script:
                await p.begin_transaction()
                for v in values:
                    await p.send(topic, key=b"k", value=v, partition=0)
                if commit:
                    await p.commit_transaction()
                else:
                    await p.abort_transaction()
        finally:
            await p.stop()

    asyncio.run(run())


PRODUCERS = {
    "confluent": ck_transactions,
    "kafka-python": kp_transactions,
    "aiokafka": ak_transactions,
}


# -- consumers: values of partition 0 until END ---------------------------------------------


def ck_read(bootstrap: str, topic: str, isolation: str, timeout: float = 60) -> list[bytes]:
    c = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    c.assign([ck.TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            for m in c.consume(num_messages=1000, timeout=0.5):
                if m.error():
                    raise AssertionError(f"consume error: {m.error()}")
                if m.value() == END:
                    return got
                got.append(m.value())
    finally:
        c.close()
    raise AssertionError(f"no END within {timeout}s; got {got}")


def kp_read(bootstrap: str, topic: str, isolation: str, timeout: float = 60) -> list[bytes]:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level=isolation,
        auto_offset_reset="earliest",
    )
    tp = TopicPartition(topic, 0)
    c.assign([tp])
    c.seek(tp, 0)
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=500).values():
                for r in recs:
                    if r.value == END:
                        return got
                    got.append(r.value)
    finally:
        c.close()
    raise AssertionError(f"no END within {timeout}s; got {got}")


def ak_read(bootstrap: str, topic: str, isolation: str, timeout: float = 60) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def run() -> list[bytes]:
        c = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            isolation_level=isolation,
            auto_offset_reset="earliest",
        )
        await c.start()
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        c.seek(tp, 0)
        got: list[bytes] = []
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                batches = await c.getmany(timeout_ms=500)
                for recs in batches.values():
                    for r in recs:
                        if r.value == END:
                            return got
                        got.append(r.value)
        finally:
            await c.stop()
        raise AssertionError(f"no END within {timeout}s; got {got}")

    return asyncio.run(run())


CONSUMERS = {"confluent": ck_read, "kafka-python": kp_read, "aiokafka": ak_read}


def _script(tag: str) -> list[tuple[bool, list[bytes]]]:
    return [
        (True, [f"{tag}-c1-{i}".encode() for i in range(5)]),
        (False, [f"{tag}-a1-{i}".encode() for i in range(7)]),
        (True, [f"{tag}-c2-{i}".encode() for i in range(3)]),
        (False, [f"{tag}-a2-{i}".encode() for i in range(2)]),
        (True, [f"{tag}-c3-0".encode(), END]),
    ]


def _committed(script: list[tuple[bool, list[bytes]]]) -> list[bytes]:
    return [v for commit, vs in script if commit for v in vs if v != END]


def _all(script: list[tuple[bool, list[bytes]]]) -> list[bytes]:
    return [v for _, vs in script for v in vs if v != END]


def _raw_fetches(bootstrap: str, topic: str, isolation: int) -> list[Any]:
    """Partition 0's answers to Fetch v12 from offset 0 on, each from the end of the last
    batch before, up to the high watermark: what the broker sends, before any client's
    filtering (a Fetch reads one segment, as Kafka's does)."""
    answers: list[Any] = []
    offset = 0
    with RawClient(bootstrap) as c:
        while True:
            req = fetch_request(topic, offset, isolation=isolation)
            answer = c.call(req).responses[0].partitions[0]
            assert answer.error_code == 0, answer
            answers.append(answer)
            batches = list(iter_batches(answer.records or b""))
            if not batches:
                return answers
            offset = batches[-1][1].last_offset + 1


@pytest.mark.parametrize("client", list(PRODUCERS))
def test_commit_and_abort_read_by_every_client(broker, client):
    """Every consumer client, both isolation levels. Segments of 512 bytes: transactions span
    segments (an ABORT marker in a later segment than its data). read_uncommitted gets every
    record, aborted ones included, and no control record, from each client; the broker's answer
    is Kafka's: no aborted_transactions list (null) at read_uncommitted, the aborted
    transactions' (producer id, first offset) at read_committed, the LSO in both."""
    topic = new_topic(
        broker.bootstrap, partitions=1, prefix=f"txn-{client}", **{"segment.bytes": "512"}
    )
    script = _script(client)
    PRODUCERS[client](broker.bootstrap, topic, f"txn-{client}-{topic}", script)
    for name, read in CONSUMERS.items():
        assert read(broker.bootstrap, topic, "read_committed") == _committed(script), name
        assert read(broker.bootstrap, topic, "read_uncommitted") == _all(script), name
    uncommitted = _raw_fetches(broker.bootstrap, topic, 0)
    hw = uncommitted[0].high_watermark
    assert hw > len(_all(script)) and len(uncommitted) > 2  # markers too; several segments
    # nothing open: the last stable offset is the high watermark
    assert {(a.aborted_transactions, a.last_stable_offset) for a in uncommitted} == {(None, hw)}
    committed = _raw_fetches(broker.bootstrap, topic, 1)
    assert len(committed) == len(uncommitted)
    assert {a.last_stable_offset for a in committed} == {hw}
    aborted = {(a.producer_id, a.first_offset) for r in committed for a in r.aborted_transactions}
    assert len(aborted) == 2  # the script's two aborted transactions, one producer
    assert len({pid for pid, _ in aborted}) == 1


def test_librdkafka_abort_purges_what_it_has_not_sent(broker):
    """Why a read_uncommitted consumer once seemed to miss aborted records (session 11's "60 of
    80", blamed on kafka-python): ``abort_transaction`` in librdkafka purges the records still
    in its queue (delivery error ``_PURGE_QUEUE``); they never reach the broker, so no client
    can read them. Every client at read_uncommitted reads exactly the records delivered."""
    topic = new_topic(broker.bootstrap, partitions=1, prefix="txn-purge")
    delivered: list[bytes] = []
    purged: list[bytes] = []

    def report(err: Any, msg: Any) -> None:
        if err is None:
            delivered.append(msg.value())
        else:
            assert err.code() == ck.KafkaError._PURGE_QUEUE, err
            purged.append(msg.value())

    # a linger longer than the test (under the transaction timeout, which bounds it): nothing
    # is sent before a flush or the commit
    conf = {"bootstrap.servers": broker.bootstrap, "transactional.id": f"purge-{topic}"}
    p = ck.Producer({**conf, "linger.ms": 30_000})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(5):
        p.produce(topic, value=b"sent-%d" % i, partition=0, on_delivery=report)
    p.flush(30)
    for i in range(5):
        p.produce(topic, value=b"queued-%d" % i, partition=0, on_delivery=report)
    p.abort_transaction(30)
    p.poll(0)  # serve the purged records' reports
    p.begin_transaction()
    p.produce(topic, value=END, partition=0, on_delivery=report)
    p.commit_transaction(30)
    assert sorted(purged) == [b"queued-%d" % i for i in range(5)]  # reports in any order
    assert delivered == [b"sent-%d" % i for i in range(5)] + [END]
    for name, read in CONSUMERS.items():
        assert read(broker.bootstrap, topic, "read_uncommitted") == delivered[:-1], name
        assert read(broker.bootstrap, topic, "read_committed") == [], name


def test_zombie_is_fenced_by_a_new_producer(broker):
    topic = new_topic(broker.bootstrap, partitions=1, prefix="txn-zombie")
    txn_id = f"zombie-{topic}"
    conf = {"bootstrap.servers": broker.bootstrap, "transactional.id": txn_id, "linger.ms": 5}
    old = ck.Producer(conf)
    old.init_transactions(30)
    old.begin_transaction()
    for i in range(4):
        old.produce(topic, value=b"zombie-%d" % i, partition=0)
    old.flush(30)
    new = ck.Producer(conf)
    new.init_transactions(30)  # aborts the old producer's open transaction first
    with pytest.raises(ck.KafkaException) as exc:
        old.produce(topic, value=b"zombie-late", partition=0)
        old.flush(10)
        old.commit_transaction(30)
    err = exc.value.args[0]
    assert err.fatal() or err.code() in (
        ck.KafkaError._FENCED,
        ck.KafkaError.PRODUCER_FENCED,
        ck.KafkaError.INVALID_PRODUCER_EPOCH,
    ), err
    new.begin_transaction()
    new.produce(topic, value=b"fresh", partition=0)
    new.produce(topic, value=END, partition=0)
    new.commit_transaction(30)
    for name, read in CONSUMERS.items():
        assert read(broker.bootstrap, topic, "read_committed") == [b"fresh"], name


@pytest.mark.parametrize("client", ["kafka-python", "aiokafka"])
def test_zombie_fenced_other_clients(broker, client):
    """The old producer is kafka-python's / aiokafka's; the new one confluent-kafka's."""
    topic = new_topic(broker.bootstrap, partitions=1, prefix=f"txn-zombie-{client}")
    txn_id = f"zombie-{topic}"
    new_conf = {"bootstrap.servers": broker.bootstrap, "transactional.id": txn_id}
    if client == "kafka-python":
        from kafka import KafkaProducer

        old = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=txn_id)
        old.init_transactions()
        old.begin_transaction()
        old.send(topic, value=b"zombie", partition=0).get(timeout=30)
        new = ck.Producer(new_conf)
        new.init_transactions(30)
        with pytest.raises(Exception) as exc:
            old.commit_transaction()
        assert "Fenced" in type(exc.value).__name__ or "Epoch" in type(exc.value).__name__, (
            exc.value
        )
        old.close(timeout=5)
    else:
        from aiokafka import AIOKafkaProducer

        async def run() -> None:
            old = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=txn_id)
            await old.start()
            try:
                await old.begin_transaction()
                await (await old.send(topic, value=b"zombie", partition=0))
                new = ck.Producer(new_conf)
                await asyncio.get_running_loop().run_in_executor(None, new.init_transactions, 30)
                with pytest.raises(Exception) as exc:
                    await old.commit_transaction()
                name = type(exc.value).__name__
                assert "Fenced" in name or "Epoch" in name, exc.value
            finally:
                await old.stop()

        asyncio.run(run())
        new = ck.Producer(new_conf)
        new.init_transactions(30)
    new.begin_transaction()
    new.produce(topic, value=END, partition=0)
    new.commit_transaction(30)
    assert ck_read(broker.bootstrap, topic, "read_committed") == []
    assert ck_read(broker.bootstrap, topic, "read_uncommitted") == [b"zombie"]


def test_transaction_past_its_timeout_is_aborted_by_the_broker(broker_factory):
    b = broker_factory(**{"transaction.abort.timed.out.transaction.cleanup.interval.ms": 200})
    topic = new_topic(b.bootstrap, partitions=1, prefix="txn-timeout")
    txn_id = f"slow-{topic}"
    p = ck.Producer(
        {
            "bootstrap.servers": b.bootstrap,
            "transactional.id": txn_id,
            "transaction.timeout.ms": 1500,
        }
    )
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, value=b"too-slow", partition=0)
    p.flush(30)
    deadline = time.monotonic() + 30
    while "timed out after" not in b.log_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "timed out after 1500 ms: aborting" in b.log_text()
    with pytest.raises(ck.KafkaException):
        p.commit_transaction(30)
    # the id is usable again by a new producer
    q = ck.Producer({"bootstrap.servers": b.bootstrap, "transactional.id": txn_id})
    q.init_transactions(30)
    q.begin_transaction()
    q.produce(topic, value=END, partition=0)
    q.commit_transaction(30)
    for name, read in CONSUMERS.items():
        assert read(b.bootstrap, topic, "read_committed") == [], name


def _committed_offset(
    bootstrap: str,
    group: str,
    topic: str,
    *,
    isolation: str = "read_uncommitted",
    timeout: float = 30,
) -> int:
    """The group's committed offset of partition 0 (negative: none). A read_committed
    consumer asks for stable offsets (OffsetFetch require_stable) and gets
    UNSTABLE_OFFSET_COMMIT, which it retries, while a transaction holds one pending."""
    c = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    try:
        (tp,) = c.committed([ck.TopicPartition(topic, 0)], timeout=timeout)
        return int(tp.offset)
    finally:
        c.close()


def test_consume_transform_produce_commits_offsets_with_the_transaction(broker):
    src = new_topic(broker.bootstrap, partitions=1, prefix="ctp-in")
    dst = new_topic(broker.bootstrap, partitions=1, prefix="ctp-out")
    group = f"ctp-{src}"
    p0 = ck.Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(10):
        p0.produce(src, value=b"in-%d" % i, partition=0)
    p0.flush(30)
    consumer = ck.Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    producer = ck.Producer(
        {"bootstrap.servers": broker.bootstrap, "transactional.id": f"ctp-{dst}"}
    )
    try:
        producer.init_transactions(30)
        consumer.subscribe([src])
        seen: list[Any] = []
        deadline = time.monotonic() + 60
        while len(seen) < 10 and time.monotonic() < deadline:
            seen += [m for m in consumer.consume(100, timeout=0.5) if not m.error()]
        assert len(seen) == 10
        producer.begin_transaction()
        for m in seen:
            producer.produce(dst, value=m.value().replace(b"in", b"out"), partition=0)
        producer.send_offsets_to_transaction(
            consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
        )
        producer.flush(30)
        assert _committed_offset(broker.bootstrap, group, src) < 0  # pending, not visible
        with pytest.raises(ck.KafkaException, match="Timed out"):
            _committed_offset(broker.bootstrap, group, src, isolation="read_committed", timeout=3)
        producer.commit_transaction(30)
        assert _committed_offset(broker.bootstrap, group, src) == 10
        assert _committed_offset(broker.bootstrap, group, src, isolation="read_committed") == 10
        # an aborted round leaves the committed offset where it was
        producer.begin_transaction()
        producer.produce(dst, value=b"never", partition=0)
        producer.flush(30)  # in the log, to be aborted there
        producer.send_offsets_to_transaction(
            [ck.TopicPartition(src, 0, 5)], consumer.consumer_group_metadata(), 30
        )
        producer.abort_transaction(30)
        assert _committed_offset(broker.bootstrap, group, src) == 10
        producer.begin_transaction()
        producer.produce(dst, value=END, partition=0)
        producer.commit_transaction(30)
    finally:
        consumer.close()
    assert ck_read(broker.bootstrap, dst, "read_committed") == [b"out-%d" % i for i in range(10)]


@pytest.mark.parametrize("client", ["kafka-python", "aiokafka"])
def test_send_offsets_to_transaction_other_clients(broker, client):
    """kafka-python's and aiokafka's AddOffsetsToTxn + TxnOffsetCommit: the offset of an
    aborted transaction never shows, the committed one does, only after the commit."""
    src = new_topic(broker.bootstrap, partitions=1, prefix=f"offs-{client}")
    group = f"offs-{src}"
    txn_id = f"offs-{client}-{src}"
    seen: list[int] = []

    def check() -> None:
        seen.append(_committed_offset(broker.bootstrap, group, src))

    if client == "kafka-python":
        from kafka import KafkaProducer
        from kafka.structs import OffsetAndMetadata
        from kafka.structs import TopicPartition as KafkaTp

        p = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=txn_id)
        try:
            p.init_transactions()
            for offset, commit in ((3, False), (7, True)):
                p.begin_transaction()
                p.send_offsets_to_transaction(
                    {KafkaTp(src, 0): OffsetAndMetadata(offset, "", -1)}, group
                )
                check()
                p.commit_transaction() if commit else p.abort_transaction()
                check()
        finally:
            p.close(timeout=10)
    else:
        from aiokafka import AIOKafkaProducer
        from aiokafka.structs import TopicPartition as AioTp

        async def run() -> None:
            p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=txn_id)
            await p.start()
            loop = asyncio.get_running_loop()
            try:
                for offset, commit in ((3, False), (7, True)):
                    await p.begin_transaction()
                    await p.send_offsets_to_transaction({AioTp(src, 0): offset}, group)
                    await loop.run_in_executor(None, check)
                    if commit:
                        await p.commit_transaction()
                    else:
                        await p.abort_transaction()
                    await loop.run_in_executor(None, check)
            finally:
                await p.stop()

        asyncio.run(run())
    assert [o < 0 for o in seen[:3]] == [True] * 3 and seen[3] == 7, seen


@pytest.mark.parametrize("client", ["kafka-python", "aiokafka"])
def test_timeout_abort_other_clients(broker_factory, client):
    b = broker_factory(**{"transaction.abort.timed.out.transaction.cleanup.interval.ms": 200})
    topic = new_topic(b.bootstrap, partitions=1, prefix=f"txn-timeout-{client}")
    txn_id = f"slow-{client}-{topic}"
    if client == "kafka-python":
        from kafka import KafkaProducer

        p = KafkaProducer(
            bootstrap_servers=b.bootstrap, transactional_id=txn_id, transaction_timeout_ms=1500
        )
        p.init_transactions()
        p.begin_transaction()
        p.send(topic, value=b"too-slow", partition=0).get(timeout=30)
        _wait_log(b, "timed out after 1500 ms: aborting")
        with pytest.raises(Exception) as exc:
            p.commit_transaction()
        p.close(timeout=5)
    else:
        from aiokafka import AIOKafkaProducer

        async def run() -> BaseException:
            p = AIOKafkaProducer(
                bootstrap_servers=b.bootstrap, transactional_id=txn_id, transaction_timeout_ms=1500
            )
            await p.start()
            try:
                await p.begin_transaction()
                await (await p.send(topic, value=b"too-slow", partition=0))
                await asyncio.get_running_loop().run_in_executor(
                    None, _wait_log, b, "timed out after 1500 ms: aborting"
                )
                try:
                    await p.commit_transaction()
                except Exception as e:
                    return e
                raise AssertionError("commit of a timed-out transaction succeeded")
            finally:
                await p.stop()

        with pytest.raises(Exception) as exc:
            raise asyncio.run(run())
    name = type(exc.value).__name__
    assert "Fenced" in name or "Epoch" in name, exc.value
    q = ck.Producer({"bootstrap.servers": b.bootstrap, "transactional.id": txn_id})
    q.init_transactions(30)
    q.begin_transaction()
    q.produce(topic, value=END, partition=0)
    q.commit_transaction(30)
    assert ck_read(b.bootstrap, topic, "read_committed") == []
    assert ck_read(b.bootstrap, topic, "read_uncommitted") == [b"too-slow"]


def _wait_log(b: Any, text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while text not in b.log_text():
        if time.monotonic() > deadline:
            raise AssertionError(f"{text!r} not in the broker log:\n{b.log_tail()}")
        time.sleep(0.1)


def _offsets_partition_watermarks(bootstrap: str, group: str, isolation: str) -> tuple[int, int]:
    """(low, high) of the group's ``__consumer_offsets`` partition as a consumer of
    ``isolation`` sees it (ListOffsets: the LSO for read_committed, the HW otherwise)."""
    c = ck.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "wm", "isolation.level": isolation}
    )
    try:
        n = len(c.list_topics(OFFSETS_TOPIC, timeout=30).topics[OFFSETS_TOPIC].partitions)
        tp = ck.TopicPartition(OFFSETS_TOPIC, partition_for(group, n))
        low, high = c.get_watermark_offsets(tp, timeout=30, cached=False)
        return int(low), int(high)
    finally:
        c.close()


def test_pending_offsets_hold_the_lso_and_a_plain_commit_made_meanwhile_wins(broker):
    src = new_topic(broker.bootstrap, partitions=1, prefix="lso-in")
    group = f"lso-{src}"
    meta_consumer = ck.Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    producer = ck.Producer(
        {"bootstrap.servers": broker.bootstrap, "transactional.id": f"lso-{src}"}
    )
    try:
        meta_consumer.commit(offsets=[ck.TopicPartition(src, 0, 3)], asynchronous=False)
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.send_offsets_to_transaction(
            [ck.TopicPartition(src, 0, 7)], meta_consumer.consumer_group_metadata(), 30
        )
        # the pending transactional offset holds __consumer_offsets' last stable offset
        _, hw = _offsets_partition_watermarks(broker.bootstrap, group, "read_uncommitted")
        _, lso = _offsets_partition_watermarks(broker.bootstrap, group, "read_committed")
        assert lso == hw - 1, (lso, hw)
        # a plain commit while the transaction is open: later in the log, so it stays
        meta_consumer.commit(offsets=[ck.TopicPartition(src, 0, 5)], asynchronous=False)
        producer.commit_transaction(30)
        _, hw = _offsets_partition_watermarks(broker.bootstrap, group, "read_uncommitted")
        _, lso = _offsets_partition_watermarks(broker.bootstrap, group, "read_committed")
        assert lso == hw
        assert _committed_offset(broker.bootstrap, group, src) == 5
        assert _committed_offset(broker.bootstrap, group, src, isolation="read_committed") == 5
        # a transaction's offset later than the plain one wins at its commit
        producer.begin_transaction()
        producer.send_offsets_to_transaction(
            [ck.TopicPartition(src, 0, 9)], meta_consumer.consumer_group_metadata(), 30
        )
        producer.commit_transaction(30)
        assert _committed_offset(broker.bootstrap, group, src) == 9
    finally:
        meta_consumer.close()
