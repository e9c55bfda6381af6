"""Hypothesis fuzzing of request parsing against a live broker.

Random frames and byte-level mutations of valid requests (ApiVersions, Metadata, Produce,
Fetch, ListOffsets, CreateTopics, DeleteRecords) are sent on fresh connections. Whatever the
broker does with each (answer, or close the connection), afterwards it must still answer
ApiVersions, write nothing outside its log dir, and serve a real client at the end.
"""

from __future__ import annotations

import datetime
import socket
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.create_topics.v7.request import CreatableTopic, CreateTopicsRequest
from kio.schema.delete_records.v2.request import (
    DeleteRecordsPartition,
    DeleteRecordsRequest,
    DeleteRecordsTopic,
)
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.list_offsets.v7.request import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.static.primitive import Records, i8, i16, i32, i64

from logstore.protocol.batch import iter_batches, validate_batch
from logstore.protocol.records import build_batch
from logstore.storage.files import parse_partition_dir
from tests.fixtures.broker import BrokerProcess, api_versions_probe
from tests.integration.broker.rawclient import RawClient, assert_serves_real_client

pytestmark = pytest.mark.integration

TOPIC = "fuzz-target"


def _seeds() -> list[bytes]:
    rc = RawClient.__new__(RawClient)
    rc.correlation_id = 0
    batch = bytes(build_batch([(b"k", b"v"), (None, b"w" * 30)]))
    ms = datetime.timedelta(milliseconds=10)
    reqs = [
        ApiVersionsRequest(client_software_name="fuzz", client_software_version="1"),
        MetadataRequest(
            topics=(MetadataRequestTopic(topic_id=None, name=TOPIC),),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        ),
        ProduceRequest(
            transactional_id=None,
            acks=i16(1),
            timeout=ms,
            topic_data=(
                TopicProduceData(
                    name=TOPIC,
                    partition_data=(PartitionProduceData(index=i32(0), records=Records(batch)),),
                ),
            ),
        ),
        FetchRequest(
            max_wait=ms,
            min_bytes=i32(1),
            topics=(
                FetchTopic(
                    topic=TOPIC,
                    partitions=(
                        FetchPartition(
                            partition=i32(0), fetch_offset=i64(0), partition_max_bytes=i32(4096)
                        ),
                    ),
                ),
            ),
            forgotten_topics_data=(),
        ),
        ListOffsetsRequest(
            replica_id=i32(-1),
            isolation_level=i8(0),
            topics=(
                ListOffsetsTopic(
                    name=TOPIC,
                    partitions=(ListOffsetsPartition(partition_index=i32(0), timestamp=i64(-1)),),
                ),
            ),
        ),
        CreateTopicsRequest(
            topics=(
                CreatableTopic(
                    name="fuzz-new",
                    num_partitions=i32(1),
                    replication_factor=i16(1),
                    assignments=(),
                    configs=(),
                ),
            ),
            timeout=ms,
            validate_only=True,
        ),
        DeleteRecordsRequest(
            topics=(
                DeleteRecordsTopic(
                    name=TOPIC,
                    partitions=(DeleteRecordsPartition(partition_index=i32(0), offset=i64(0)),),
                ),
            ),
            timeout=ms,
        ),
    ]
    return [rc.request_bytes(r) for r in reqs]


SEEDS = _seeds()


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and data:
            data[pos] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xFF]))
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete" and data:
            del data[pos : pos + draw(st.integers(1, 8))]
        elif kind == "truncate":
            del data[pos:]
    return bytes(data)


frames = st.one_of(
    mutated(),
    st.binary(min_size=0, max_size=64),
    # a valid header of a random (api key, version) followed by random bytes
    st.builds(
        lambda k, v, rest: struct.pack(">hhih", k, v, 1, -1) + rest,
        st.integers(-1, 80),
        st.integers(-1, 20),
        st.binary(max_size=64),
    ),
)


@pytest.fixture(scope="module")
def fuzz_broker(tmp_path_factory):
    b = BrokerProcess(tmp_path_factory.mktemp("fuzz"), **{"auto.create.topics.enable": "false"})
    b.start()
    try:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        fut = admin.create_topics([NewTopic(TOPIC, num_partitions=1, replication_factor=1)])
        fut[TOPIC].result(timeout=30)
        yield b
    finally:
        code = b.stop()
        b.kill()
    assert code == 0, b.log_tail()


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(frame=frames)
def test_fuzzed_frames_never_break_the_broker(fuzz_broker, frame):
    with socket.create_connection(("127.0.0.1", fuzz_broker.port), timeout=5) as s:
        s.sendall(struct.pack(">i", len(frame)) + frame)
        s.settimeout(0.2)
        try:
            while s.recv(65536):
                pass
        except (TimeoutError, ConnectionResetError):
            pass
    assert fuzz_broker.running, fuzz_broker.log_tail()
    assert api_versions_probe("127.0.0.1", fuzz_broker.port), fuzz_broker.log_tail()


def test_after_fuzzing_log_dir_is_sane_and_clients_are_served(fuzz_broker):
    workdir = fuzz_broker.log_dir.parent
    assert sorted(p.name for p in workdir.iterdir()) == ["broker.log", "logs"]
    for entry in fuzz_broker.log_dir.iterdir():
        if entry.is_dir() and entry.name != "topic-configs":
            assert parse_partition_dir(entry.name) is not None, entry.name
    # whatever the fuzzer appended to the target partition is whole, valid batches
    next_offset = 0
    for seg in sorted((fuzz_broker.log_dir / f"{TOPIC}-0").glob("*.log")):
        data = seg.read_bytes()
        for pos, _h in iter_batches(data):
            header = validate_batch(data, pos)  # CRC and structure
            assert header.base_offset == next_offset
            next_offset = header.next_offset
    assert "Traceback" not in fuzz_broker.log_text(), fuzz_broker.log_tail(100)
    assert_serves_real_client(fuzz_broker.bootstrap, TOPIC)
    with RawClient(fuzz_broker.bootstrap) as c:
        assert c.call(ApiVersionsRequest(client_software_name="x", client_software_version="1"))
