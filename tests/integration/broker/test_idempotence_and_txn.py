"""Idempotent produce at the protocol level (duplicates, sequence gaps, fencing, state rebuilt
after a restart), InitProducerId, the transactional APIs' checks of the producer (raw requests), and
LogAppendTime topics."""

from __future__ import annotations

import datetime
import time

import confluent_kafka as ck
import pytest
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.static.primitive import Records, i16, i32, i64

from logstore.protocol.records import build_batch
from tests.integration.broker.clients import new_topic, read_log
from tests.integration.broker.rawclient import RawClient

pytestmark = pytest.mark.integration


def _produce(topic: str, batch: bytes) -> ProduceRequest:
    return ProduceRequest(
        transactional_id=None,
        acks=i16(-1),
        timeout=datetime.timedelta(seconds=10),
        topic_data=(
            TopicProduceData(
                name=topic,
                partition_data=(PartitionProduceData(index=i32(0), records=Records(batch)),),
            ),
        ),
    )


def _init_pid(c: RawClient, transactional_id: str | None = None) -> tuple[ErrorCode, int, int]:
    r = c.call(
        InitProducerIdRequest(
            transactional_id=transactional_id,
            transaction_timeout=datetime.timedelta(seconds=60),
            producer_id=i64(-1),
            producer_epoch=i16(-1),
        )
    )
    return r.error_code, r.producer_id, r.producer_epoch


def _batch(pid: int, epoch: int, seq: int, n: int, tag: bytes) -> bytes:
    return bytes(
        build_batch(
            [(b"k", tag + b"-%d" % i) for i in range(n)],
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=seq,
        )
    )


def _result(resp) -> tuple[ErrorCode, int]:
    p = resp.responses[0].partition_responses[0]
    return p.error_code, p.base_offset


def test_duplicates_gaps_and_fencing_survive_a_restart(broker_factory):
    b = broker_factory()
    topic = new_topic(b.bootstrap, partitions=1, prefix="idem")
    with RawClient(b.bootstrap) as c:
        error, pid, epoch = _init_pid(c)
        assert error == ErrorCode.none and pid >= 0 and epoch == 0
        assert _result(c.call(_produce(topic, _batch(pid, 0, 0, 3, b"a")))) == (ErrorCode.none, 0)
        assert _result(c.call(_produce(topic, _batch(pid, 0, 3, 2, b"b")))) == (ErrorCode.none, 3)
        # a retry of the first batch: acknowledged with its original offset, not appended
        assert _result(c.call(_produce(topic, _batch(pid, 0, 0, 3, b"a")))) == (ErrorCode.none, 0)
        # a gap in the sequence
        assert _result(c.call(_produce(topic, _batch(pid, 0, 9, 1, b"c"))))[0] == (
            ErrorCode.out_of_order_sequence_number
        )
        # another producer id is independent
        _e, pid2, _ep = _init_pid(c)
        assert pid2 != pid
        assert _result(c.call(_produce(topic, _batch(pid2, 0, 0, 1, b"z")))) == (ErrorCode.none, 5)
    b.kill()  # no clean shutdown: the state must come back from the log itself
    b.start()
    with RawClient(b.bootstrap) as c:
        assert _result(c.call(_produce(topic, _batch(pid, 0, 3, 2, b"b")))) == (ErrorCode.none, 3)
        assert _result(c.call(_produce(topic, _batch(pid, 0, 6, 1, b"c"))))[0] == (
            ErrorCode.out_of_order_sequence_number
        )
        assert _result(c.call(_produce(topic, _batch(pid, 0, 5, 1, b"c")))) == (ErrorCode.none, 6)
        # an older epoch is fenced once a newer one wrote
        assert _result(c.call(_produce(topic, _batch(pid, 1, 0, 1, b"d")))) == (ErrorCode.none, 7)
        assert _result(c.call(_produce(topic, _batch(pid, 0, 6, 1, b"e"))))[0] == (
            ErrorCode.invalid_producer_epoch
        )
    b.stop()
    records, _ = read_log(b.log_dir, topic, 0)
    assert [r.value for r in records] == [
        b"a-0",
        b"a-1",
        b"a-2",
        b"b-0",
        b"b-1",
        b"z-0",
        b"c-0",
        b"d-0",
    ]


def test_transactional_id_gets_a_producer_id_and_fences_the_previous_one(broker):
    with RawClient(broker.bootstrap) as c:
        error, pid, epoch = _init_pid(c, "my-txn")
        assert (error, epoch) == (ErrorCode.none, 0) and pid >= 0
        error, pid2, epoch2 = _init_pid(c, "my-txn")
        assert (error, pid2, epoch2) == (ErrorCode.none, pid, 1)


def test_log_append_time_topic(broker):
    topic = new_topic(
        broker.bootstrap, partitions=1, prefix="lat", **{"message.timestamp.type": "LogAppendTime"}
    )
    before = int(time.time() * 1000)
    with RawClient(broker.bootstrap) as c:
        resp = c.call(_produce(topic, bytes(build_batch([(b"k", b"v", (), 1000)]))))
    part = resp.responses[0].partition_responses[0]
    assert part.error_code == ErrorCode.none
    after = int(time.time() * 1000)
    append_ms = int(part.log_append_time.timestamp() * 1000)
    assert before - 1000 <= append_ms <= after + 1000
    c2 = ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "lat"})
    try:
        c2.assign([ck.TopicPartition(topic, 0, 0)])
        m = None
        for _ in range(60):
            m = c2.poll(0.5)
            if m is not None:
                break
        assert m is not None and not m.error()
        ts_type, ts = m.timestamp()
        assert ts_type == ck.TIMESTAMP_LOG_APPEND_TIME
        assert ts == append_ms
    finally:
        c2.close()


def test_transactional_apis_check_the_producer(broker):
    from kio.schema.add_partitions_to_txn.v1.request import (
        AddPartitionsToTxnRequest as AddV1,
    )
    from kio.schema.add_partitions_to_txn.v1.request import (
        AddPartitionsToTxnTopic as TopicV1,
    )
    from kio.schema.add_partitions_to_txn.v3.request import (
        AddPartitionsToTxnRequest,
        AddPartitionsToTxnTopic,
    )
    from kio.schema.end_txn.v3.request import EndTxnRequest

    topic = new_topic(broker.bootstrap, partitions=2, prefix="txnapi")
    with RawClient(broker.bootstrap) as c:
        _, pid, _ = _init_pid(c, "t-api")
        _init_pid(c, "t-api")  # epoch 1: epoch 0 is fenced now

        def add(epoch: int, name: str) -> list[ErrorCode]:
            r = c.call(
                AddPartitionsToTxnRequest(
                    v3_and_below_transactional_id="t-api",
                    v3_and_below_producer_id=i64(pid),
                    v3_and_below_producer_epoch=i16(epoch),
                    v3_and_below_topics=(
                        AddPartitionsToTxnTopic(name=name, partitions=(i32(0), i32(1))),
                    ),
                )
            )
            return [
                p.partition_error_code
                for p in r.results_by_topic_v3_and_below[0].results_by_partition
            ]

        assert add(0, topic) == [ErrorCode.producer_fenced] * 2
        # before v2 (KIP-588) the same is INVALID_PRODUCER_EPOCH
        r = c.call(
            AddV1(
                v3_and_below_transactional_id="t-api",
                v3_and_below_producer_id=i64(pid),
                v3_and_below_producer_epoch=i16(0),
                v3_and_below_topics=(TopicV1(name=topic, partitions=(i32(0),)),),
            )
        )
        assert r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == (
            ErrorCode.invalid_producer_epoch
        )
        assert add(1, "no-such-topic-xyz") == [ErrorCode.unknown_topic_or_partition] * 2
        assert add(1, "__transaction_state") == [ErrorCode.invalid_topic_exception] * 2
        r = c.call(
            EndTxnRequest(
                transactional_id="t-api",
                producer_id=i64(pid),
                producer_epoch=i16(1),
                committed=True,
            )
        )
        assert r.error_code == ErrorCode.invalid_txn_state  # nothing to commit
        assert add(1, topic) == [ErrorCode.none] * 2
        r = c.call(
            EndTxnRequest(
                transactional_id="t-api",
                producer_id=i64(pid),
                producer_epoch=i16(1),
                committed=False,
            )
        )
        assert r.error_code == ErrorCode.none
        r = c.call(
            EndTxnRequest(
                transactional_id="t-ghost",
                producer_id=i64(pid),
                producer_epoch=i16(1),
                committed=False,
            )
        )
        assert r.error_code == ErrorCode.invalid_producer_id_mapping


def test_find_coordinator_of_a_transactional_id_is_this_broker(broker):
    from kio.schema.find_coordinator.v3.request import FindCoordinatorRequest
    from kio.static.primitive import i8

    with RawClient(broker.bootstrap) as c:
        r = c.call(FindCoordinatorRequest(key="some-txn", key_type=i8(1)))
        assert (r.error_code, r.node_id, r.port) == (ErrorCode.none, 0, broker.port)
        r = c.call(FindCoordinatorRequest(key="x", key_type=i8(2)))
        assert r.error_code == ErrorCode.invalid_request
