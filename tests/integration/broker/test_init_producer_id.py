"""InitProducerId over the wire, answered as Kafka 4.x answers it (raw kio requests).

The regression: an idempotent producer whose request carries ``producer_id=0,
producer_epoch=0`` instead of -1/-1 (the JavaScript client @platformatic/kafka 1.35) was
given producer id 0, epoch 1; every such producer shared it, and a second producer's first
batch was acknowledged at offset 0 as a "duplicate" and never written.
"""

from __future__ import annotations

import datetime

import confluent_kafka as ck
import pytest
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.init_producer_id.v5.request import InitProducerIdRequest as InitProducerIdV5
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.static.primitive import Records, i16, i32, i64

from logstore.protocol.records import build_batch
from tests.integration.broker.clients import new_topic, read_log
from tests.integration.broker.rawclient import RawClient

pytestmark = pytest.mark.integration


def _init(
    c: RawClient, *, pid: int, epoch: int, txn: str | None = None, v5: bool = False
) -> tuple[ErrorCode, int, int]:
    cls = InitProducerIdV5 if v5 else InitProducerIdRequest
    r = c.call(
        cls(
            transactional_id=txn,
            transaction_timeout=datetime.timedelta(seconds=60),
            producer_id=i64(pid),
            producer_epoch=i16(epoch),
        )
    )
    return r.error_code, int(r.producer_id), int(r.producer_epoch)


def _produce(c: RawClient, topic: str, *, pid: int, epoch: int, tag: bytes) -> tuple[int, int]:
    batch = build_batch(
        [(b"k", tag + b"-%d" % i) for i in range(10)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=0,
    )
    r = c.call(
        ProduceRequest(
            transactional_id=None,
            acks=i16(-1),
            timeout=datetime.timedelta(seconds=10),
            topic_data=(
                TopicProduceData(
                    name=topic,
                    partition_data=(
                        PartitionProduceData(index=i32(0), records=Records(bytes(batch))),
                    ),
                ),
            ),
        )
    )
    p = r.responses[0].partition_responses[0]
    return int(p.error_code), int(p.base_offset)


def _log_end(bootstrap: str, topic: str) -> int:
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "ipid-log-end"})
    try:
        _low, high = c.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=30)
        return int(high)
    finally:
        c.close()


def test_idempotent_producers_sending_zero_zero_get_distinct_ids_and_keep_every_batch(broker):
    topic = new_topic(broker.bootstrap, partitions=1, prefix="ipid")
    with RawClient(broker.bootstrap) as a, RawClient(broker.bootstrap) as b:
        err_a, pid_a, epoch_a = _init(a, pid=0, epoch=0)
        err_b, pid_b, epoch_b = _init(b, pid=0, epoch=0, v5=True)
        assert (err_a, epoch_a, err_b, epoch_b) == (ErrorCode.none, 0, ErrorCode.none, 0)
        assert pid_a != pid_b and pid_a > 0 and pid_b > 0
        assert _produce(a, topic, pid=pid_a, epoch=0, tag=b"a") == (0, 0)
        assert _produce(b, topic, pid=pid_b, epoch=0, tag=b"b") == (0, 10)
    assert _log_end(broker.bootstrap, topic) == 20
    records, _codecs = read_log(broker.log_dir, topic, 0)
    assert [r.value for r in records] == [b"a-%d" % i for i in range(10)] + [
        b"b-%d" % i for i in range(10)
    ]


def test_an_idempotent_producer_cannot_take_over_another_producer_id(broker):
    topic = new_topic(broker.bootstrap, partitions=1, prefix="ipid")
    with RawClient(broker.bootstrap) as a, RawClient(broker.bootstrap) as thief:
        _e, pid_a, _ep = _init(a, pid=-1, epoch=-1)
        assert _produce(a, topic, pid=pid_a, epoch=0, tag=b"a") == (0, 0)
        # asking for a's id and epoch: Kafka ignores them without a transactional id
        err, pid_t, epoch_t = _init(thief, pid=pid_a, epoch=0)
        assert (err, epoch_t) == (ErrorCode.none, 0) and pid_t not in (pid_a, 0)
        # a's producer state is untouched: its next epoch-0 batch is still a duplicate of
        # the first one, and the thief's own batch is appended
        assert _produce(a, topic, pid=pid_a, epoch=0, tag=b"a") == (0, 0)
        assert _produce(thief, topic, pid=pid_t, epoch=0, tag=b"t") == (0, 10)
    assert _log_end(broker.bootstrap, topic) == 20


def test_transactional_takeover_is_fenced_and_half_given_ids_are_invalid(broker):
    with RawClient(broker.bootstrap) as c:
        err, pid1, e1 = _init(c, pid=-1, epoch=-1, txn="ipid-tx-1")
        assert (err, e1) == (ErrorCode.none, 0)
        err, pid2, _e2 = _init(c, pid=-1, epoch=-1, txn="ipid-tx-2")
        assert err == ErrorCode.none and pid2 != pid1
        # KIP-360 bump with another id's producer id: fenced, nothing handed out
        assert _init(c, pid=pid1, epoch=0, txn="ipid-tx-2") == (ErrorCode.producer_fenced, -1, -1)
        # with its own id and epoch: bumped
        assert _init(c, pid=pid2, epoch=0, txn="ipid-tx-2") == (ErrorCode.none, pid2, 1)
        # a stale epoch of its own id (neither current nor previous): fenced
        assert _init(c, pid=pid2, epoch=5, txn="ipid-tx-2")[0] == ErrorCode.producer_fenced
        # an id without an epoch, or an epoch without an id: INVALID_REQUEST (KafkaApis)
        for pid, epoch, txn in ((-1, 0, None), (7, -1, None), (-1, 3, "ipid-tx-1")):
            assert _init(c, pid=pid, epoch=epoch, txn=txn) == (ErrorCode.invalid_request, -1, -1)
