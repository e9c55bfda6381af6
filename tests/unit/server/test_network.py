"""The reactor in-process with a stand-in dispatcher: framing, request order per connection,
the bounded request channel (processors stop reading when it is full), oversize frames, and
answering in-flight requests at shutdown."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from logstore.server.config import BrokerConfig
from logstore.server.network import NetworkRequest
from logstore.server.socket_server import SocketServer


def _server(dispatch, **overrides: str) -> SocketServer:
    props = {
        "listeners": "PLAINTEXT://127.0.0.1:0",
        "num.network.threads": "1",
        "num.io.threads": "1",
        **overrides,
    }
    srv = SocketServer(BrokerConfig(props), dispatch)
    srv.start()
    return srv


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def _read_frame(s: socket.socket) -> bytes:
    def exact(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = s.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf

    (size,) = struct.unpack(">i", exact(4))
    return exact(size)


def test_pipelined_requests_answered_in_order_even_when_completed_late():
    def dispatch(req: NetworkRequest) -> None:
        # answer from another thread after a delay that shrinks with the request number:
        # a reactor without per-connection ordering would reorder these
        n = int(bytes(req.frame))
        threading.Timer(0.05 * (5 - n % 5), req.respond, args=([_frame(bytes(req.frame))],)).start()

    srv = _server(dispatch)
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(b"".join(_frame(b"%d" % i) for i in range(10)))
            assert [_read_frame(s) for _ in range(10)] == [b"%d" % i for i in range(10)]
    finally:
        srv.shutdown(timeout_s=5)


def test_full_channel_stops_reading_and_recovers():
    release = threading.Event()
    seen: list[bytes] = []

    def dispatch(req: NetworkRequest) -> None:
        seen.append(bytes(req.frame))
        release.wait(30)
        req.respond([_frame(b"ok")])

    srv = _server(dispatch, **{"queued.max.requests": "1"})
    socks = []
    try:
        for i in range(8):
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
            s.sendall(_frame(b"r%d" % i))
            socks.append(s)
        time.sleep(0.5)
        # one request in the handler, one in the channel, one held by the processor: the
        # other connections' requests are still unread in their sockets
        assert len(seen) == 1
        assert srv._channel.qsize() <= 1
        release.set()
        for s in socks:
            assert _read_frame(s) == b"ok"
        assert len(seen) == 8
    finally:
        release.set()
        for s in socks:
            s.close()
        srv.shutdown(timeout_s=5)


@pytest.mark.parametrize("size", [-1, 1025])
def test_bad_size_prefix_closes_only_that_connection(size):
    srv = _server(
        lambda req: req.respond([_frame(b"pong")]), **{"socket.request.max.bytes": "1024"}
    )
    try:
        good = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        bad = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        bad.sendall(struct.pack(">i", size))
        assert bad.recv(1) == b""
        good.sendall(_frame(b"ping"))
        assert _read_frame(good) == b"pong"
        good.close()
        bad.close()
    finally:
        srv.shutdown(timeout_s=5)


def test_shutdown_answers_in_flight_requests():
    def dispatch(req: NetworkRequest) -> None:
        threading.Timer(0.3, req.respond, args=([_frame(b"late")],)).start()

    srv = _server(dispatch)
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    s.sendall(_frame(b"x"))
    time.sleep(0.1)
    srv.shutdown(timeout_s=10)
    assert _read_frame(s) == b"late"
    s.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", srv.port), timeout=2)


def test_max_connections():
    srv = _server(lambda req: req.respond([_frame(b"ok")]), **{"max.connections": "2"})
    try:
        keep = [socket.create_connection(("127.0.0.1", srv.port), timeout=10) for _ in range(2)]
        time.sleep(0.2)
        extra = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        assert extra.recv(1) == b""
        extra.close()
        keep[0].sendall(_frame(b"a"))
        assert _read_frame(keep[0]) == b"ok"
        keep[1].close()
        time.sleep(0.3)
        again = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        again.sendall(_frame(b"b"))
        assert _read_frame(again) == b"ok"
        again.close()
        keep[0].close()
    finally:
        srv.shutdown(timeout_s=5)


def test_idle_connections_are_closed():
    srv = _server(lambda req: req.respond([_frame(b"ok")]), **{"connections.max.idle.ms": "300"})
    try:
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        s.sendall(_frame(b"a"))
        assert _read_frame(s) == b"ok"
        s.settimeout(10)
        assert s.recv(1) == b""  # closed by the broker once idle
        s.close()
    finally:
        srv.shutdown(timeout_s=5)
