"""Fetch semantics at the protocol level (long-poll, size limits, zero-copy bytes equal the
segment file, out-of-range), and the ``loglake topics`` tool against the broker."""

from __future__ import annotations

import datetime
import struct
import subprocess
import sys
import threading

import confluent_kafka as ck
import pytest
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v4.request import FetchPartition as FetchPartitionV4
from kio.schema.fetch.v4.request import FetchRequest as FetchRequestV4
from kio.schema.fetch.v4.request import FetchTopic as FetchTopicV4
from kio.schema.fetch.v12.request import FetchRequest
from kio.static.primitive import i8, i32, i64

from logstore.protocol.batch import iter_batches
from tests.fixtures.broker import ROOT
from tests.integration.broker.clients import ck_produce, make_records, new_topic
from tests.integration.broker.rawclient import RawClient, fetch_request

pytestmark = pytest.mark.integration


def test_fetch_returns_the_segment_bytes_unchanged(broker):
    topic = new_topic(broker.bootstrap, partitions=1, prefix="zc")
    ck_produce(
        broker.bootstrap,
        topic,
        make_records(300, partitions=1, seed=11),
        codec="gzip",
        acks="all",
        idempotent=True,
        flush_every=50,
    )
    segment = (broker.log_dir / f"{topic}-0" / f"{0:020d}.log").read_bytes()
    with RawClient(broker.bootstrap) as c:
        resp = c.call(fetch_request(topic, 0))
        part = resp.responses[0].partitions[0]
        assert part.error_code == ErrorCode.none
        assert part.high_watermark == 300
        assert part.log_start_offset == 0
        assert bytes(part.records) == segment  # sendfile of the file region, byte for byte
        # partition_max_bytes smaller than a batch: still the whole first batch (KIP-74)
        resp = c.call(fetch_request(topic, 0, partition_max_bytes=10))
        data = bytes(resp.responses[0].partitions[0].records)
        batches = list(iter_batches(data))
        assert len(batches) == 1 and data == segment[: batches[0][1].size]
        # a fetch from the middle of a batch starts at that batch
        second = list(iter_batches(segment))[1][1]
        resp = c.call(fetch_request(topic, second.base_offset + 1))
        assert (
            bytes(resp.responses[0].partitions[0].records)
            == segment[list(iter_batches(segment))[1][0] :]
        )
        # at the end: nothing, no error
        resp = c.call(fetch_request(topic, 300))
        assert resp.responses[0].partitions[0].error_code == ErrorCode.none
        assert not resp.responses[0].partitions[0].records
        # beyond the end, and unknown partitions
        resp = c.call(fetch_request(topic, 301))
        assert resp.responses[0].partitions[0].error_code == ErrorCode.offset_out_of_range
        resp = c.call(fetch_request("no-such-topic-here", 0))
        assert resp.responses[0].partitions[0].error_code == ErrorCode.unknown_topic_or_partition
        # the oldest version advertised (v4) returns the same bytes
        v4 = FetchRequestV4(
            max_wait=datetime.timedelta(0),
            min_bytes=i32(1),
            max_bytes=i32(10**8),
            isolation_level=i8(0),
            topics=(
                FetchTopicV4(
                    topic=topic,
                    partitions=(
                        FetchPartitionV4(
                            partition=i32(0), fetch_offset=i64(0), partition_max_bytes=i32(10**7)
                        ),
                    ),
                ),
            ),
        )
        assert bytes(c.call(v4).responses[0].partitions[0].records) == segment


def test_fetch_long_poll_is_completed_by_a_produce(broker):
    topic = new_topic(broker.bootstrap, partitions=1, prefix="lp")
    result: dict[str, object] = {}

    def long_poll() -> None:
        with RawClient(broker.bootstrap, timeout=60) as c:
            result["resp"] = c.call(fetch_request(topic, 0, max_wait_ms=50_000, min_bytes=1))

    t = threading.Thread(target=long_poll)
    t.start()
    t.join(timeout=1.0)
    assert t.is_alive(), "the fetch must wait for data"
    p = ck.Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    p.produce(topic, value=b"wake-up")
    assert p.flush(30) == 0
    t.join(timeout=40)
    assert not t.is_alive()
    part = result["resp"].responses[0].partitions[0]
    assert part.high_watermark == 1
    ((_pos, header),) = list(iter_batches(bytes(part.records)))
    assert header.base_offset == 0 and header.records_count == 1


def test_fetch_long_poll_expires_empty(broker):
    topic = new_topic(broker.bootstrap, partitions=1, prefix="lpe")
    with RawClient(broker.bootstrap, timeout=60) as c:
        resp = c.call(fetch_request(topic, 0, max_wait_ms=200, min_bytes=1))
    part = resp.responses[0].partitions[0]
    assert part.error_code == ErrorCode.none
    assert not part.records


def _topics(broker, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "logstore.cli",
            "topics",
            "--bootstrap-server",
            broker.bootstrap,
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_topics_tool(broker):
    name = "tool-topic-1"
    out = _topics(broker, "create", name, "--partitions", "3", "--config", "retention.ms=60000")
    assert out.returncode == 0, out.stderr
    assert "Created topic tool-topic-1 with 3 partition(s)" in out.stdout
    out = _topics(broker, "create", name)
    assert out.returncode == 1 and "TOPIC_ALREADY_EXISTS" in out.stdout
    out = _topics(broker, "create", "../evil")
    assert out.returncode == 1 and "INVALID_TOPIC_EXCEPTION" in out.stdout
    assert name in _topics(broker, "list").stdout.split()
    out = _topics(broker, "describe", name)
    assert out.returncode == 0
    assert "PartitionCount: 3" in out.stdout and "retention.ms=60000" in out.stdout
    assert out.stdout.count("Leader: 0") == 3
    out = _topics(broker, "delete", name)
    assert out.returncode == 0 and "Deleted topic tool-topic-1" in out.stdout
    assert name not in _topics(broker, "list").stdout.split()
    out = _topics(broker, "describe", name)
    assert out.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in out.stdout
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "logstore.cli",
            "topics",
            "--bootstrap-server",
            "127.0.0.1:1",
            "list",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2 and "cannot connect" in out.stderr


def test_broker_config_errors_exit_2(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "logstore.cli",
            "broker",
            "--override",
            "bogus.key=1",
            "--override",
            f"log.dirs={tmp_path}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 2
    assert "bogus.key" in out.stderr


def test_sigterm_answers_a_waiting_long_poll(broker_factory):
    b = broker_factory()
    topic = new_topic(b.bootstrap, partitions=1, prefix="term-lp")
    result: dict[str, object] = {}

    def long_poll() -> None:
        with RawClient(b.bootstrap, timeout=120) as c:
            result["resp"] = c.call(fetch_request(topic, 0, max_wait_ms=100_000, min_bytes=1))

    t = threading.Thread(target=long_poll)
    t.start()
    t.join(timeout=1.0)
    assert t.is_alive()
    assert b.stop(timeout=60) == 0
    t.join(timeout=30)
    assert not t.is_alive()
    part = result["resp"].responses[0].partitions[0]
    assert part.error_code == ErrorCode.none and not part.records


def test_pipelined_requests_are_answered_in_order_across_inline_and_handler_paths(broker):
    """Fetches of loaded partitions run on the network thread, the rest on handler threads,
    long-polls in the purgatory: a connection still gets its answers in request order."""
    from kio.index import load_response_schema
    from kio.schema.api_versions.v0.request import ApiVersionsRequest
    from kio.serial import entity_reader

    topic = new_topic(broker.bootstrap, partitions=1, prefix="order")
    ck_produce(
        broker.bootstrap,
        topic,
        make_records(40, partitions=1, seed=5),
        codec="lz4",
        acks="all",
        idempotent=True,
        flush_every=10,
    )
    segment = (broker.log_dir / f"{topic}-0" / f"{0:020d}.log").read_bytes()
    requests = [
        fetch_request(topic, 0),  # the first use of the partition may go to a handler thread
        ApiVersionsRequest(),  # always a handler thread
        fetch_request(topic, 0),  # loaded now: inline on the network thread
        fetch_request(topic, 40, max_wait_ms=300),  # at the end: waits in the purgatory, then empty
        ApiVersionsRequest(),
        fetch_request(topic, 0),
    ]
    with RawClient(broker.bootstrap) as c:
        frames = b"".join(
            struct.pack(">i", len(p)) + p for p in (c.request_bytes(r) for r in requests)
        )
        c.sock.sendall(frames)  # all six in flight before the first answer is read
        answers = [c.recv_frame() for _ in requests]
    assert [struct.unpack_from(">i", a, 0)[0] for a in answers] == [1, 2, 3, 4, 5, 6]
    records = []
    for request, frame in zip(requests, answers, strict=True):
        cls = load_response_schema(request.__api_key__, request.__version__)
        pos = 4 + (1 if cls.__header_schema__.__flexible__ else 0)
        resp, _ = entity_reader(cls)(frame, pos)
        if isinstance(request, FetchRequest):
            part = resp.responses[0].partitions[0]
            assert part.error_code == ErrorCode.none
            records.append(bytes(part.records))
        else:
            assert resp.error_code == ErrorCode.none
    assert records == [segment, segment, b"", segment]
