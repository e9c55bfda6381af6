"""A tiny raw Kafka-protocol client over a socket (kio codecs), for bad-input tests."""

from __future__ import annotations

import datetime
import io
import socket
import struct
from typing import Any

import confluent_kafka as ck
from kio.index import load_response_schema
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i8, i32, i64


def fetch_request(
    topic: str,
    offset: int,
    *,
    isolation: int = 0,
    max_wait_ms: int = 0,
    min_bytes: int = 1,
    max_bytes: int = 50 * 1024 * 1024,
    partition_max_bytes: int = 1024 * 1024,
) -> FetchRequest:
    """A Fetch v12 of partition 0 of ``topic`` from ``offset`` (``isolation`` 0:
    read_uncommitted, 1: read_committed)."""
    return FetchRequest(
        max_wait=datetime.timedelta(milliseconds=max_wait_ms),
        min_bytes=i32(min_bytes),
        max_bytes=i32(max_bytes),
        isolation_level=i8(isolation),
        topics=(
            FetchTopic(
                topic=topic,
                partitions=(
                    FetchPartition(
                        partition=i32(0),
                        fetch_offset=i64(offset),
                        partition_max_bytes=i32(partition_max_bytes),
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
    )


class RawClient:
    def __init__(self, bootstrap: str, *, timeout: float = 10.0) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_frame(self, payload: bytes) -> None:
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)

    def request_bytes(self, request: Any, *, correlation_id: int | None = None) -> bytes:
        """Header (v1 or v2 as the request's version needs) + body for a kio request."""
        self.correlation_id += 1
        cid = self.correlation_id if correlation_id is None else correlation_id
        header = struct.pack(">hhih", request.__api_key__, request.__version__, cid, 4) + b"test"
        if request.__flexible__:
            header += b"\x00"
        buf = io.BytesIO()
        entity_writer(type(request))(buf, request)
        return header + buf.getvalue()

    def recv_frame(self) -> bytes:
        (size,) = struct.unpack(">i", self._recv(4))
        return self._recv(size)

    def call(self, request: Any) -> Any:
        """Send a kio request and parse its response."""
        self.send_frame(self.request_bytes(request))
        frame = self.recv_frame()
        (cid,) = struct.unpack_from(">i", frame, 0)
        assert cid == self.correlation_id
        cls = load_response_schema(request.__api_key__, request.__version__)
        pos = 4 + (1 if cls.__header_schema__.__flexible__ else 0)
        resp, _n = entity_reader(cls)(frame, pos)
        return resp

    def _recv(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed by the broker")
            buf += chunk
        return bytes(buf)

    def is_closed_by_peer(self, *, timeout: float = 10.0) -> bool:
        """True when the broker closes the connection (EOF or reset) within ``timeout``."""
        self.sock.settimeout(timeout)
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False


def assert_serves_real_client(bootstrap: str, topic: str) -> None:
    """A real client can still produce and read back through the broker."""
    p = ck.Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    marker = b"still-serving"
    p.produce(topic, value=marker, partition=0)
    assert p.flush(30) == 0
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "serving-check"})
    try:
        _low, high = c.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=30)
        c.assign([ck.TopicPartition(topic, 0, high - 1)])
        for _ in range(60):
            m = c.poll(0.5)
            if m is not None:
                assert not m.error(), m.error()
                assert m.value() == marker
                return
        raise AssertionError("no record read back")
    finally:
        c.close()
