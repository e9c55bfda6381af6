"""Bad input gets Kafka's error code or a closed connection, is logged once, and the broker
keeps serving every other client (checked with a real client after each case)."""

from __future__ import annotations

import datetime
import socket
import struct
import time

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.static.primitive import Records, i16, i32

from logstore.protocol.batch import CRC_OFFSET
from logstore.protocol.records import build_batch
from tests.integration.broker.clients import new_topic
from tests.integration.broker.rawclient import RawClient, assert_serves_real_client

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bad_broker(tmp_path_factory):
    from tests.fixtures.broker import BrokerProcess

    b = BrokerProcess(
        tmp_path_factory.mktemp("bad-input"),
        **{
            "socket.request.max.bytes": str(1024 * 1024),
            "max.connections": "16",
            "message.max.bytes": "20000",
        },
    )
    b.start()
    try:
        yield b
    finally:
        code = b.stop()
        b.kill()
    assert code == 0, b.log_tail()


@pytest.fixture(scope="module")
def topic(bad_broker):
    return new_topic(bad_broker.bootstrap, partitions=1, prefix="bad")


def _produce_request(topic: str, records: bytes, *, acks: int = -1) -> ProduceRequest:
    return ProduceRequest(
        transactional_id=None,
        acks=i16(acks),
        timeout=datetime.timedelta(seconds=10),
        topic_data=(
            TopicProduceData(
                name=topic,
                partition_data=(PartitionProduceData(index=i32(0), records=Records(records)),),
            ),
        ),
    )


def _partition_error(resp) -> ErrorCode:
    return resp.responses[0].partition_responses[0].error_code


def test_garbage_frame_closes_connection(bad_broker, topic):
    with RawClient(bad_broker.bootstrap) as c:
        c.send_frame(b"\x00\x03\x00\x0c" + b"\xff" * 40)  # Metadata v12, absurd lengths
        assert c.is_closed_by_peer()
    with RawClient(bad_broker.bootstrap) as c:
        c.send_frame(b"\x01")  # shorter than any request header
        assert c.is_closed_by_peer()
    assert_serves_real_client(bad_broker.bootstrap, topic)


def test_truncated_request_body_closes_connection(bad_broker, topic):
    with RawClient(bad_broker.bootstrap) as c:
        full = c.request_bytes(_produce_request(topic, bytes(build_batch([(b"k", b"v")]))))
        c.send_frame(full[: len(full) - 30])  # frame size consistent, body cut short
        assert c.is_closed_by_peer()
    with RawClient(bad_broker.bootstrap) as c:
        # a size prefix promising more than is ever sent, then hang up: nothing to answer
        c.sock.sendall(struct.pack(">i", 500) + b"\x00\x12\x00\x00")
    assert_serves_real_client(bad_broker.bootstrap, topic)


def test_unknown_api_key_and_version(bad_broker, topic):
    with RawClient(bad_broker.bootstrap) as c:
        c.send_frame(struct.pack(">hhih", 9999, 0, 1, -1))
        assert c.is_closed_by_peer()
    with RawClient(bad_broker.bootstrap) as c:
        c.send_frame(struct.pack(">hhih", 0, 99, 1, -1))  # Produce v99
        assert c.is_closed_by_peer()
    with RawClient(bad_broker.bootstrap) as c:
        # ApiVersions newer than supported: Kafka answers v0 UNSUPPORTED_VERSION + its ranges
        c.send_frame(struct.pack(">hhih", 18, 77, 42, -1) + b"\x00\x00\x00")
        frame = c.recv_frame()
        cid, error, n = struct.unpack_from(">ihi", frame, 0)
        assert (cid, error) == (42, ErrorCode.unsupported_version.value)
        keys = {struct.unpack_from(">hhh", frame, 10 + 6 * i)[0] for i in range(n)}
        assert {0, 1, 2, 3, 18} <= keys
    assert_serves_real_client(bad_broker.bootstrap, topic)


def test_oversize_request_closed_before_reading(bad_broker, topic):
    with RawClient(bad_broker.bootstrap) as c:
        c.sock.sendall(struct.pack(">i", 64 * 1024 * 1024))  # only the size prefix
        assert c.is_closed_by_peer()
    with RawClient(bad_broker.bootstrap) as c:
        c.sock.sendall(struct.pack(">i", -5))
        assert c.is_closed_by_peer()
    assert "socket.request.max.bytes" in bad_broker.log_text()
    assert_serves_real_client(bad_broker.bootstrap, topic)


def test_bad_crc_batch_gets_corrupt_message(bad_broker, topic):
    batch = build_batch([(b"k%d" % i, b"v" * 50) for i in range(10)])
    batch[-1] ^= 0xFF  # flip a bit in the last record: CRC no longer matches
    with RawClient(bad_broker.bootstrap) as c:
        before = c.call(_produce_request(topic, bytes(build_batch([(b"a", b"b")]))))
        assert _partition_error(before) == ErrorCode.none
        resp = c.call(_produce_request(topic, bytes(batch)))
        assert _partition_error(resp) == ErrorCode.corrupt_message
        # wrong CRC field, intact records
        batch2 = build_batch([(b"x", b"y")])
        struct.pack_into(">I", batch2, CRC_OFFSET, 12345)
        assert (
            _partition_error(c.call(_produce_request(topic, bytes(batch2))))
            == ErrorCode.corrupt_message
        )
        # torn batch
        good = bytes(build_batch([(b"x", b"y")]))
        assert (
            _partition_error(c.call(_produce_request(topic, good[:-3])))
            == ErrorCode.corrupt_message
        )
        # too large for message.max.bytes (20000)
        big = bytes(build_batch([(None, b"z" * 30000)]))
        assert _partition_error(c.call(_produce_request(topic, big))) == ErrorCode.message_too_large
        after = c.call(_produce_request(topic, bytes(build_batch([(b"a", b"b")]))))
        assert _partition_error(after) == ErrorCode.none
        # nothing was appended in between: offsets are consecutive
        assert (
            after.responses[0].partition_responses[0].base_offset
            == before.responses[0].partition_responses[0].base_offset + 1
        )
    assert_serves_real_client(bad_broker.bootstrap, topic)


@pytest.mark.parametrize("name", ["../x", "../../etc", "a/b", "", ".", "..", "x" * 300, "bad name"])
def test_invalid_topic_names(bad_broker, topic, name):
    with RawClient(bad_broker.bootstrap) as c:
        resp = c.call(_produce_request(name, bytes(build_batch([(b"k", b"v")]))))
        assert resp.responses[0].partition_responses[0].error_code in (
            ErrorCode.invalid_topic_exception,
            ErrorCode.unknown_topic_or_partition,
        )
        md = c.call(
            MetadataRequest(
                topics=(MetadataRequestTopic(topic_id=None, name=name),),
                allow_auto_topic_creation=True,
                include_topic_authorized_operations=False,
            )
        )
        assert md.topics[0].error_code == ErrorCode.invalid_topic_exception
    root = bad_broker.log_dir.parent
    assert sorted(p.name for p in root.iterdir()) == ["broker.log", "logs"]
    assert not any(p.name == "x-0" for p in bad_broker.log_dir.iterdir())
    assert_serves_real_client(bad_broker.bootstrap, topic)


def test_connection_flood_beyond_max_connections(bad_broker, topic):
    socks = []
    try:
        for _ in range(40):
            s = socket.create_connection(("127.0.0.1", bad_broker.port), timeout=5)
            socks.append(s)
        time.sleep(0.5)
        closed = 0
        for s in socks:
            s.settimeout(0.2)
            try:
                if s.recv(1) == b"":
                    closed += 1
            except TimeoutError:
                pass
            except ConnectionResetError:
                closed += 1
        assert closed >= 40 - 16
        assert "max.connections=16 reached" in bad_broker.log_text()
    finally:
        for s in socks:
            s.close()
    time.sleep(0.5)  # the broker notices the closes
    assert_serves_real_client(bad_broker.bootstrap, topic)


def test_api_versions_v3_lists_exactly_the_registry(bad_broker):
    from logstore.server.apis import API_HANDLERS

    with RawClient(bad_broker.bootstrap) as c:
        resp = c.call(ApiVersionsRequest(client_software_name="t", client_software_version="1"))
    assert resp.error_code == ErrorCode.none
    got = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
    assert got == {k: (lo, hi) for k, (lo, hi, _h) in API_HANDLERS.items()}
    assert got[1][0] <= 4 <= got[1][1]  # Fetch v4+ keeps clients on magic 2


def test_produce_to_internal_topic_is_refused(bad_broker):
    with RawClient(bad_broker.bootstrap) as c:
        resp = c.call(_produce_request("__consumer_offsets", bytes(build_batch([(b"k", b"v")]))))
    assert _partition_error(resp) == ErrorCode.invalid_topic_exception
