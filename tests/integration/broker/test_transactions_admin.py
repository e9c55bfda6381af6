"""ListTransactions / DescribeTransactions (KIP-664) over the wire, on the real broker.

Real transactions come from confluent-kafka's transactional producer: one left open over two
partitions, one committed, one aborted, one only initialised. The broker's answers (raw
kio-encoded requests, and kafka-python's ``KafkaAdminClient.list_transactions`` /
``describe_transactions`` / ``find_hanging_transactions``) are checked against what the
producers did and against the producer id and epoch stamped in the batches of the partition
files (read from the log dir with a plain ``struct``, independent of the broker's code).

confluent-kafka 2.16's ``AdminClient`` has no list/describe transactions (librdkafka has no
such admin API), so the client-library path is kafka-python's.
"""

from __future__ import annotations

import datetime
import struct
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.list_transactions.v0.request import ListTransactionsRequest as ListV0
from kio.schema.list_transactions.v1.request import ListTransactionsRequest as ListV1
from kio.schema.list_transactions.v2.request import ListTransactionsRequest as ListV2
from kio.static.primitive import i64

from tests.integration.broker.clients import new_topic
from tests.integration.broker.rawclient import RawClient, assert_serves_real_client

pytestmark = pytest.mark.integration

TIMEOUT_MS = 45_000  # the producers' transaction.timeout.ms: well past the test's length


@dataclass
class Txns:
    """The transactions of one scenario (see the module docstring)."""

    topic: str
    open_id: str
    committed_id: str
    aborted_id: str
    empty_id: str
    open_producer: ck.Producer | None
    begun_ms: tuple[int, int]  # wall clock before the open transaction's first send, after


def _producer(bootstrap: str, txn_id: str) -> ck.Producer:
    p = ck.Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": txn_id,
            "transaction.timeout.ms": TIMEOUT_MS,
            "linger.ms": 5,
        }
    )
    p.init_transactions(30)
    return p


def _run(bootstrap: str, topic: str, txn_id: str, *, commit: bool) -> None:
    p = _producer(bootstrap, txn_id)
    p.begin_transaction()
    p.produce(topic, value=txn_id.encode(), partition=0)
    p.flush(30)
    if commit:
        p.commit_transaction(30)
    else:
        p.abort_transaction(30)


@pytest.fixture
def txns(broker: Any) -> Iterator[Txns]:
    topic = new_topic(broker.bootstrap, partitions=3, prefix="txadmin")
    tag = uuid.uuid4().hex[:8]
    ids = [f"txadmin-{k}-{tag}" for k in ("open", "commit", "abort", "empty")]
    _run(broker.bootstrap, topic, ids[1], commit=True)
    _run(broker.bootstrap, topic, ids[2], commit=False)
    _producer(broker.bootstrap, ids[3])  # InitProducerId only: Empty
    p = _producer(broker.bootstrap, ids[0])
    p.begin_transaction()
    before = int(time.time() * 1000)
    p.produce(topic, value=b"open-0", partition=0)
    p.produce(topic, value=b"open-1", partition=1)
    p.flush(30)
    after = int(time.time() * 1000)
    t = Txns(topic, ids[0], ids[1], ids[2], ids[3], p, (before, after))
    try:
        yield t
    finally:
        # Leave nothing open on the session broker, and no client behind (librdkafka's
        # producer closes when its last reference goes).
        p.abort_transaction(30)
        t.open_producer = None
        del p


# -- reading the partition files: producer id and epoch of the batches -------------------

_BATCH = struct.Struct(">qi")  # baseOffset, batchLength
_PRODUCER = struct.Struct(">qh")  # producerId, producerEpoch at byte 43 of the batch


def batch_producers(log_dir: Path, topic: str, partition: int) -> dict[bytes, tuple[int, int]]:
    """``{first record value: (producer id, epoch)}`` of the data batches of a partition.

    The record value is read only for the batches the tests write (one uncompressed record
    each): the value is the last bytes of the batch before the header count (0 headers).
    """
    out: dict[bytes, tuple[int, int]] = {}
    for f in sorted((log_dir / f"{topic}-{partition}").glob("*.log")):
        data = f.read_bytes()
        pos = 0
        while pos + 61 <= len(data):
            _base, length = _BATCH.unpack_from(data, pos)
            end = pos + 12 + length
            (attributes,) = struct.unpack_from(">h", data, pos + 21)
            if not attributes & 0x20:  # not a control batch
                pid, epoch = _PRODUCER.unpack_from(data, pos + 43)
                # one record, no key, value, 0 headers: value is data[...:end-1]
                value = data[pos + 61 : end - 1]
                out[value] = (pid, epoch)
            pos = end
    return out


def producer_of(broker: Any, topic: str, partition: int, value: bytes) -> tuple[int, int]:
    found = [
        v for k, v in batch_producers(broker.log_dir, topic, partition).items() if k.endswith(value)
    ]
    assert len(found) == 1, (topic, partition, value)
    return found[0]


# -- helpers ------------------------------------------------------------------------------


def listed(client: RawClient, request: Any, ids: set[str]) -> dict[str, tuple[int, str]]:
    resp = client.call(request)
    assert resp.error_code is ErrorCode.none
    return {
        str(s.transactional_id): (int(s.producer_id), s.transaction_state)
        for s in resp.transaction_states
        if s.transactional_id in ids
    }


def describe(client: RawClient, *ids: str) -> list[Any]:
    resp = client.call(DescribeTransactionsRequest(transactional_ids=ids))
    assert [s.transactional_id for s in resp.transaction_states] == list(ids)
    return list(resp.transaction_states)


def describe_bytes(client: RawClient, txn_id: str) -> tuple[int, str, int, int]:
    """(error code, state, timeout ms, start ms) of one id, read from the response bytes:
    kio's reader refuses the -1 start Kafka sends for an id that never began a transaction."""
    client.send_frame(
        client.request_bytes(DescribeTransactionsRequest(transactional_ids=(txn_id,)))
    )
    frame = client.recv_frame()
    pos = 4 + 1 + 4  # correlation id, header tags, throttle
    assert frame[pos] == 2  # compact array of one
    pos += 1
    (error,) = struct.unpack_from(">h", frame, pos)
    pos += 2
    for _ in range(2):  # transactional id, then state: compact strings (uvarint n + 1)
        n = frame[pos] - 1
        assert n < 127
        state = frame[pos + 1 : pos + 1 + n].decode()
        pos += 1 + n
    timeout, start = struct.unpack_from(">iq", frame, pos)
    return error, state, timeout, start


def _ms(d: datetime.datetime) -> int:
    return round(d.timestamp() * 1000)


# -- tests --------------------------------------------------------------------------------


def test_api_versions_advertises_both(broker):
    with RawClient(broker.bootstrap) as c:
        resp = c.call(ApiVersionsRequest(client_software_name="t", client_software_version="1"))
    keys = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in resp.api_keys}
    assert keys[65] == (0, 0)
    assert keys[66] == (0, 1)


def test_list_and_describe_open_committed_aborted_and_empty(broker, txns):
    ids = {txns.open_id, txns.committed_id, txns.aborted_id, txns.empty_id}
    open_pid, open_epoch = producer_of(broker, txns.topic, 0, b"open-0")
    assert producer_of(broker, txns.topic, 1, b"open-1") == (open_pid, open_epoch)
    commit_pid, commit_epoch = producer_of(broker, txns.topic, 0, txns.committed_id.encode())
    abort_pid, abort_epoch = producer_of(broker, txns.topic, 0, txns.aborted_id.encode())
    assert len({open_pid, commit_pid, abort_pid}) == 3

    with RawClient(broker.bootstrap) as c:
        for request in (ListV0(), ListV1()):
            got = listed(c, request, ids)
            assert got[txns.open_id] == (open_pid, "Ongoing")
            assert got[txns.committed_id] == (commit_pid, "CompleteCommit")
            assert got[txns.aborted_id] == (abort_pid, "CompleteAbort")
            assert got[txns.empty_id][1] == "Empty"
            assert set(got) == ids

        o, cm, ab = describe(c, txns.open_id, txns.committed_id, txns.aborted_id)
        assert all(s.error_code is ErrorCode.none for s in (o, cm, ab))
        assert (o.transaction_state, o.producer_id, o.producer_epoch) == (
            "Ongoing",
            open_pid,
            open_epoch,
        )
        assert {(t.topic, p) for t in o.topics for p in t.partitions} == {
            (txns.topic, 0),
            (txns.topic, 1),
        }
        assert o.transaction_timeout == datetime.timedelta(milliseconds=TIMEOUT_MS)
        start = _ms(o.transaction_start_time)
        # AddPartitionsToTxn comes between the two wall-clock readings around the sends.
        assert txns.begun_ms[0] <= start <= txns.begun_ms[1]

        assert (cm.transaction_state, cm.producer_id, cm.producer_epoch) == (
            "CompleteCommit",
            commit_pid,
            commit_epoch,
        )
        assert (ab.transaction_state, ab.producer_id, ab.producer_epoch) == (
            "CompleteAbort",
            abort_pid,
            abort_epoch,
        )
        assert cm.topics == () and ab.topics == ()  # a completed transaction holds none
        # never started a transaction: start -1, as Kafka answers
        assert describe_bytes(c, txns.empty_id) == (0, "Empty", TIMEOUT_MS, -1)

        # Committing the open one: CompleteCommit, no partitions, the start kept (Kafka).
        producer = txns.open_producer
        assert producer is not None
        producer.commit_transaction(30)
        (after,) = describe(c, txns.open_id)
        assert (after.transaction_state, after.producer_id) == ("CompleteCommit", open_pid)
        assert after.topics == ()
        assert _ms(after.transaction_start_time) == start
        assert listed(c, ListV1(), {txns.open_id}) == {txns.open_id: (open_pid, "CompleteCommit")}
        # A new transaction of the same producer is Ongoing again, for the fixture to abort.
        producer.begin_transaction()
        producer.produce(txns.topic, value=b"open-again", partition=2)
        producer.flush(30)
        (again,) = describe(c, txns.open_id)
        assert again.transaction_state == "Ongoing"
        assert [(t.topic, tuple(t.partitions)) for t in again.topics] == [(txns.topic, (2,))]


def test_describe_unknown_and_empty_ids(broker, txns):
    unknown = f"never-seen-{uuid.uuid4().hex}"
    with RawClient(broker.bootstrap) as c:
        nf, empty, ok, nf2 = describe(c, unknown, "", txns.open_id, unknown)
    assert nf.error_code is ErrorCode.transactional_id_not_found
    assert nf2.error_code is ErrorCode.transactional_id_not_found  # duplicates answered each
    assert empty.error_code is ErrorCode.invalid_request
    assert ok.error_code is ErrorCode.none and ok.transaction_state == "Ongoing"
    assert nf.transaction_state == "" and nf.topics == () and int(nf.producer_id) == 0


def test_list_filters(broker, txns):
    ids = {txns.open_id, txns.committed_id, txns.aborted_id, txns.empty_id}
    commit_pid, _ = producer_of(broker, txns.topic, 0, txns.committed_id.encode())
    with RawClient(broker.bootstrap) as c:
        assert set(listed(c, ListV0(state_filters=("Ongoing",)), ids)) == {txns.open_id}
        assert set(listed(c, ListV0(state_filters=("CompleteAbort", "CompleteCommit")), ids)) == {
            txns.committed_id,
            txns.aborted_id,
        }

        resp = c.call(ListV1(state_filters=("Ongoing", "Hanging", "ongoing")))
        assert resp.unknown_state_filters == ("Hanging", "ongoing")  # names are exact
        assert {s.transactional_id for s in resp.transaction_states} & ids == {txns.open_id}
        assert all(s.transaction_state == "Ongoing" for s in resp.transaction_states)

        resp = c.call(ListV1(state_filters=("Bogus",)))  # matches no state: nothing listed
        assert resp.unknown_state_filters == ("Bogus",)
        assert resp.transaction_states == ()

        # Producer ids are unique per transactional id: exactly one id has this one.
        resp = c.call(ListV0(producer_id_filters=(i64(commit_pid),)))
        assert [(s.transactional_id, s.transaction_state) for s in resp.transaction_states] == [
            (txns.committed_id, "CompleteCommit")
        ]
        assert c.call(ListV0(producer_id_filters=(i64(-7),))).transaction_states == ()
        # Both filters: an AND.
        assert (
            listed(
                c, ListV0(state_filters=("Ongoing",), producer_id_filters=(i64(commit_pid),)), ids
            )
            == {}
        )

        # Duration (v1): transactions that started more than N ms ago.
        time.sleep(0.05)
        assert txns.open_id in listed(c, ListV1(duration_filter=i64(10)), ids)
        assert txns.open_id in listed(c, ListV1(duration_filter=i64(-1)), ids)
        assert txns.open_id not in listed(c, ListV1(duration_filter=i64(3_600_000)), ids)
        long_open = listed(
            c, ListV1(state_filters=("Ongoing",), duration_filter=i64(3_600_000)), ids
        )
        assert long_open == {}


def test_kafka_python_admin_client(broker, txns):
    from kafka.admin import KafkaAdminClient
    from kafka.errors import TransactionalIdNotFoundError
    from kafka.structs import TopicPartition

    open_pid, open_epoch = producer_of(broker, txns.topic, 0, b"open-0")
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        by_broker = admin.list_transactions()
        assert len(by_broker) == 1
        (listings,) = by_broker.values()
        mine = {t.transactional_id: (t.producer_id, t.state.value) for t in listings}
        assert mine[txns.open_id] == (open_pid, "Ongoing")
        assert mine[txns.committed_id][1] == "CompleteCommit"
        assert mine[txns.aborted_id][1] == "CompleteAbort"
        ongoing = admin.list_transactions(state_filters=["Ongoing"])
        assert txns.committed_id not in {t.transactional_id for ts in ongoing.values() for t in ts}
        recent = admin.list_transactions(duration_filter_ms=3_600_000)  # needs v1
        assert txns.open_id not in {t.transactional_id for ts in recent.values() for t in ts}

        d = admin.describe_transactions([txns.open_id, txns.committed_id])
        o = d[txns.open_id]
        assert (o.state.value, o.producer_id, o.producer_epoch) == ("Ongoing", open_pid, open_epoch)
        assert o.topic_partitions == {TopicPartition(txns.topic, 0), TopicPartition(txns.topic, 1)}
        assert o.transaction_timeout_ms == TIMEOUT_MS
        assert txns.begun_ms[0] <= o.transaction_start_time_ms <= txns.begun_ms[1]
        assert d[txns.committed_id].state.value == "CompleteCommit"
        e = admin.describe_transactions([txns.empty_id])[txns.empty_id]
        assert (e.state.value, e.transaction_start_time_ms, e.topic_partitions) == (
            "Empty",
            -1,
            set(),
        )
        with pytest.raises(TransactionalIdNotFoundError):
            admin.describe_transactions([f"never-seen-{uuid.uuid4().hex}"])

        # The tool's threshold is max timeout + 5 min; -5 min makes any open transaction
        # "hanging": List then Describe of every id, as kafka-transactions.sh --find-hanging.
        hanging = admin.find_hanging_transactions(max_transaction_timeout_ms=-5 * 60 * 1000)
        found = {h["transactional_id"]: h for h in hanging}
        assert found[txns.open_id]["producer_id"] == open_pid
        assert found[txns.open_id]["topic_partitions"] == [
            TopicPartition(txns.topic, 0),
            TopicPartition(txns.topic, 1),
        ]
        assert txns.committed_id not in found
    finally:
        admin.close()


def test_malformed_and_unsupported_requests_close_only_that_connection(broker, txns):
    topic = new_topic(broker.bootstrap, partitions=1, prefix="txadmin-bad")
    with RawClient(broker.bootstrap) as bad:
        # DescribeTransactions v0 whose array claims 5 ids and holds none.
        frame = bad.request_bytes(DescribeTransactionsRequest(transactional_ids=()))
        bad.send_frame(frame[:-2] + b"\x06")
        assert bad.is_closed_by_peer()
    with RawClient(broker.bootstrap) as bad:
        # A null id inside the array (compact string length 0 = null): not allowed.
        frame = bad.request_bytes(DescribeTransactionsRequest(transactional_ids=("x",)))
        bad.send_frame(frame[:-3] + b"\x00\x00")
        assert bad.is_closed_by_peer()
    with RawClient(broker.bootstrap) as bad:
        # v2 (transactional id pattern) is not advertised.
        bad.send_frame(bad.request_bytes(ListV2(transactional_id_pattern="txadmin-.*")))
        assert bad.is_closed_by_peer()
    with RawClient(broker.bootstrap) as good:
        assert listed(good, ListV1(), {txns.open_id}) == {
            txns.open_id: (producer_of(broker, txns.topic, 0, b"open-0")[0], "Ongoing")
        }
    assert_serves_real_client(broker.bootstrap, topic)
