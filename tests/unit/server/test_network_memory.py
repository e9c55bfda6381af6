"""The reactor's request memory in-process (real sockets, a stand-in dispatcher that echoes a
digest of each frame): announced frames take no memory, buffers grow with what arrives,
back-pressure from a small ``queued.max.request.bytes`` loses nothing, a frame larger than
the pool is served, slow requests are closed after ``socket.request.read.timeout.ms`` (but
not while the broker itself keeps them waiting), and ``max.connections.per.ip``."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import struct
import threading
import time
from collections.abc import Callable

import pytest

from logstore.server.config import BrokerConfig, ConfigError
from logstore.server.network import NetworkRequest
from logstore.server.socket_server import SocketServer

MiB = 1024 * 1024


def _server(dispatch: Callable[[NetworkRequest], None], **overrides: str) -> SocketServer:
    props = {
        "listeners": "PLAINTEXT://127.0.0.1:0",
        "num.network.threads": "2",
        "num.io.threads": "2",
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


def _closed_by_peer(s: socket.socket, timeout: float) -> bool:
    s.settimeout(timeout)
    try:
        while True:
            if not s.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def _wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


class _Digest:
    """Dispatcher: answers each frame with its SHA-256 after ``delay_s`` (from a timer, as a
    deferred response would), recording the pool's peak use and line length."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.srv: SocketServer | None = None
        self.peak_used = 0
        self.peak_waiting = 0
        self.frames: list[tuple[int, bool]] = []  # (size, a read-only memoryview?)
        self.lock = threading.Lock()

    def __call__(self, req: NetworkRequest) -> None:
        assert self.srv is not None
        pool = self.srv.memory_pool
        with self.lock:
            self.peak_used = max(self.peak_used, pool.used)
            self.peak_waiting = max(self.peak_waiting, pool.waiting)
            frame = req.frame
            self.frames.append((len(frame), isinstance(frame, memoryview) and frame.readonly))
        answer = [_frame(hashlib.sha256(req.frame).digest())]
        if self.delay_s:
            threading.Timer(self.delay_s, req.respond, args=(answer,)).start()
        else:
            req.respond(answer)


def _digest_server(delay_s: float = 0.0, **overrides: str) -> tuple[SocketServer, _Digest]:
    d = _Digest(delay_s)
    srv = _server(d, **overrides)
    d.srv = srv
    return srv, d


def test_announced_frame_takes_no_memory_and_buffers_grow_with_arrival():
    srv, _d = _digest_server()
    socks = []
    try:
        pool = srv.memory_pool
        for _ in range(50):
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
            s.sendall(struct.pack(">i", 100 * MiB - 1))  # only the size prefix
            socks.append(s)
        time.sleep(0.5)
        assert pool.used == 0
        # the first bytes arrive: one first piece (64 KiB), not the announced 100 MiB
        socks[0].sendall(b"x" * 1000)
        assert _wait_for(lambda: pool.used > 0)
        time.sleep(0.2)
        assert pool.used == 64 * 1024
        # 3 MiB arrive: the buffer grows to at most twice what was read
        socks[0].sendall(b"y" * (3 * MiB))
        time.sleep(0.5)
        assert 3 * MiB < pool.used <= 2 * (3 * MiB + 1000)
        for s in socks:
            s.close()
        assert _wait_for(lambda: pool.used == 0), pool.used
    finally:
        for s in socks:
            s.close()
        srv.shutdown(timeout_s=5)


def test_back_pressure_serves_every_concurrent_big_request():
    capacity = 256 * 1024
    srv, d = _digest_server(0.02, **{"queued.max.request.bytes": str(capacity)})
    payloads = [os.urandom(MiB + i * 4099) for i in range(12)]
    answers: dict[int, bytes] = {}
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            with socket.create_connection(("127.0.0.1", srv.port), timeout=60) as s:
                for _ in range(2):  # two requests per connection, one after the other
                    s.sendall(_frame(payloads[i]))
                    answers[i] = _read_frame(s)
        except BaseException as exc:
            errors.append(exc)

    try:
        threads = [threading.Thread(target=client, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == []
        assert answers == {i: hashlib.sha256(p).digest() for i, p in enumerate(payloads)}
        # every frame was handed over whole, as one read-only buffer of exactly its size
        assert sorted(d.frames) == sorted((len(p), True) for p in payloads for _ in range(2))
        # frames larger than the pool went through one at a time with the overdraw grant
        assert d.peak_waiting > 0
        assert d.peak_used <= capacity + max(len(p) for p in payloads)
        assert _wait_for(lambda: srv.memory_pool.used == 0)
    finally:
        srv.shutdown(timeout_s=5)


def test_frame_larger_than_the_pool_is_served_when_the_pool_is_free():
    srv, _d = _digest_server(**{"queued.max.request.bytes": "65536"})
    try:
        payload = os.urandom(5 * MiB)
        with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
            s.sendall(_frame(payload))
            assert _read_frame(s) == hashlib.sha256(payload).digest()
        assert _wait_for(lambda: srv.memory_pool.used == 0)
    finally:
        srv.shutdown(timeout_s=5)


@pytest.mark.parametrize(
    "partial",
    [b"\x00\x00", struct.pack(">i", 1000) + b"x" * 10],
    ids=["half-size-prefix", "part-of-the-body"],
)
def test_slow_request_closed_after_the_read_timeout(partial):
    srv, _d = _digest_server(**{"socket.request.read.timeout.ms": "400"})
    try:
        pool = srv.memory_pool
        slow = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        slow.sendall(partial)
        good = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        # a connection that is merely idle between requests is not touched
        good.sendall(_frame(b"ping"))
        assert _read_frame(good) == hashlib.sha256(b"ping").digest()
        assert _closed_by_peer(slow, timeout=10)
        assert _wait_for(lambda: pool.used == 0)
        good.sendall(_frame(b"pong"))
        assert _read_frame(good) == hashlib.sha256(b"pong").digest()
        slow.close()
        good.close()
    finally:
        srv.shutdown(timeout_s=5)


def test_trickling_request_is_closed_though_never_idle():
    srv, _d = _digest_server(
        **{"socket.request.read.timeout.ms": "500", "connections.max.idle.ms": "60000"}
    )
    try:
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        s.sendall(struct.pack(">i", 100))
        start = time.monotonic()
        closed = False
        for _ in range(60):  # a byte every 100 ms: active, but the request never ends
            try:
                s.sendall(b"x")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            s.settimeout(0.1)
            try:
                if s.recv(1) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass
        assert closed, f"still open after {time.monotonic() - start:.1f}s"
        s.close()
    finally:
        srv.shutdown(timeout_s=5)


def test_waiting_for_memory_does_not_count_against_the_read_deadline():
    capacity = 64 * 1024
    srv, d = _digest_server(
        1.5,  # A's answer holds A's memory (and the grant) longer than the deadline
        **{"queued.max.request.bytes": str(capacity), "socket.request.read.timeout.ms": "500"},
    )
    try:
        a_payload, b_payload = os.urandom(MiB), os.urandom(MiB)
        a = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        a.sendall(_frame(a_payload))
        assert _wait_for(lambda: len(d.frames) == 1)
        b = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        b_sender = threading.Thread(target=b.sendall, args=(_frame(b_payload),))
        b_sender.start()
        assert _wait_for(lambda: srv.memory_pool.waiting == 1)  # B muted, in line
        assert _read_frame(a) == hashlib.sha256(a_payload).digest()
        assert _read_frame(b) == hashlib.sha256(b_payload).digest()
        b_sender.join(10)
        a.close()
        b.close()
    finally:
        srv.shutdown(timeout_s=5)


def test_max_connections_per_ip():
    srv, _d = _digest_server(**{"max.connections.per.ip": "3"})
    try:
        keep = [socket.create_connection(("127.0.0.1", srv.port), timeout=10) for _ in range(3)]
        extra = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        assert _closed_by_peer(extra, timeout=10)
        extra.close()
        # another client address is not affected
        other = socket.socket()
        other.bind(("127.0.0.2", 0))
        other.settimeout(10)
        other.connect(("127.0.0.1", srv.port))
        other.sendall(_frame(b"o"))
        assert _read_frame(other) == hashlib.sha256(b"o").digest()
        other.close()
        keep[0].close()
        time.sleep(0.3)  # the processor notices the close
        again = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        again.sendall(_frame(b"a"))
        assert _read_frame(again) == hashlib.sha256(b"a").digest()
        again.close()
        for s in keep[1:]:
            s.sendall(_frame(b"k"))
            assert _read_frame(s) == hashlib.sha256(b"k").digest()
            s.close()
    finally:
        srv.shutdown(timeout_s=5)


def test_memory_keys_are_validated_and_minus_one_means_unbounded():
    with pytest.raises(ConfigError, match=re.escape("socket.request.read.timeout.ms")):
        BrokerConfig({"socket.request.read.timeout.ms": "0"})
    with pytest.raises(ConfigError, match=re.escape("queued.max.request.bytes")):
        BrokerConfig({"queued.max.request.bytes": "lots"})
    assert BrokerConfig({}).get_int("queued.max.request.bytes") == 128 * MiB
    srv, _d = _digest_server(**{"queued.max.request.bytes": "-1"})
    try:
        assert srv.memory_pool.capacity is None
        payload = os.urandom(3 * MiB)
        with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
            s.sendall(_frame(payload))
            assert _read_frame(s) == hashlib.sha256(payload).digest()
        assert _wait_for(lambda: srv.memory_pool.used == 0)
    finally:
        srv.shutdown(timeout_s=5)
