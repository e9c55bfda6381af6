"""Hostile and numerous connections against the real broker (a subprocess), with a real
client (confluent-kafka) producing and consuming meanwhile.

- Hundreds of connections that announce a ~100 MB frame and send nothing more, and slow
  clients that send part of a frame: the broker's RSS (``/proc/PID/status``) stays under a
  stated bound and the real client's records come back exactly.
- A pool exhausted by slow clients: the real client waits (back-pressure), is served once
  the slow connections pass ``socket.request.read.timeout.ms``, and loses nothing.
- Idle connections are closed after ``connections.max.idle.ms``, slow requests after
  ``socket.request.read.timeout.ms``; a connection in use is not.
- 2,000 connections are accepted and each is answered (the rate is printed, not asserted).
- A tiny ``queued.max.request.bytes`` with concurrent ~1 MB produce requests: every record
  is acknowledged and read back exactly once.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable

import pytest

from tests.fixtures.broker import BrokerProcess
from tests.integration.broker.clients import (
    by_partition,
    ck_consume,
    ck_produce,
    expected,
    make_records,
    new_topic,
)

pytestmark = pytest.mark.integration

MiB = 1024 * 1024
# The bound asserted for the broker's RSS under hostile connections. An idle broker holds
# ~60 MB; with the defaults, request buffers are bounded by queued.max.request.bytes (128
# MiB) plus one overdrawing frame. Before the bound, 400 announced 100 MB frames took the
# broker to 20.5 GB (20 of them: 2.1 GB).
RSS_BOUND_MB = 400


def _status_mb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) // 1024
    raise AssertionError(f"{field} not in /proc/{pid}/status")


def _pid(b: BrokerProcess) -> int:
    assert b.proc is not None
    return b.proc.pid


def _connect(b: BrokerProcess, first: bytes = b"") -> socket.socket:
    s = socket.create_connection((b.host, b.port), timeout=30)
    if first:
        s.sendall(first)
    return s


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


def _api_versions_v0(correlation_id: int) -> bytes:
    body = struct.pack(">hhih", 18, 0, correlation_id, 4) + b"test"
    return struct.pack(">i", len(body)) + body


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed by the broker")
        buf += chunk
    return bytes(buf)


def _answered(s: socket.socket, correlation_id: int) -> bool:
    (size,) = struct.unpack(">i", _recv_exact(s, 4))
    cid, error = struct.unpack_from(">ih", _recv_exact(s, size))
    return cid == correlation_id and error == 0


def _round_trip(b: BrokerProcess, n: int, seed: int, **produce: object) -> None:
    """Produce ``n`` records with confluent-kafka and read back exactly those."""
    topic = new_topic(b.bootstrap, partitions=2, prefix="hostile")
    records = make_records(n, partitions=2, seed=seed)
    ck_produce(b.bootstrap, topic, records, codec="lz4", acks="all", idempotent=True, **produce)
    want = expected(records)
    got = ck_consume(b.bootstrap, topic, {p: len(v) for p, v in want.items()}, timeout=60)
    assert by_partition(got) == want


def _close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        s.close()


def test_announced_frames_and_slow_senders_keep_rss_bounded(broker_factory):
    b = broker_factory()
    pid = _pid(b)
    start_mb = _status_mb(pid, "VmRSS")
    hostile: list[socket.socket] = []
    try:
        # 400 connections that only announce a frame just under socket.request.max.bytes
        for _ in range(400):
            hostile.append(_connect(b, struct.pack(">i", 104_857_000)))
        # 40 slow senders: a 100 MB frame of which 1 MiB arrives, then nothing
        for _ in range(40):
            hostile.append(_connect(b, struct.pack(">i", 104_857_000) + b"s" * MiB))
        time.sleep(1.0)
        _round_trip(b, 2000, seed=11)
        rss_mb = _status_mb(pid, "VmRSS")
        peak_mb = _status_mb(pid, "VmHWM")
        print(
            f"broker RSS: {start_mb} MB idle, {rss_mb} MB with 440 hostile connections open"
            f" (peak {peak_mb} MB; bound {RSS_BOUND_MB} MB)"
        )
        assert peak_mb < RSS_BOUND_MB
        # the hostile connections are still open: nothing was closed to get there
        assert not any(_closed_by_peer(s, 0.01) for s in hostile[:20])
    finally:
        _close_all(hostile)
    time.sleep(0.5)
    _round_trip(b, 200, seed=12)


def test_pool_exhausted_by_slow_senders_recovers_without_loss(broker_factory):
    b = broker_factory(
        **{"queued.max.request.bytes": str(4 * MiB), "socket.request.read.timeout.ms": "2000"}
    )
    topic_first = new_topic(b.bootstrap, partitions=2, prefix="before")  # metadata is warm
    slow = [_connect(b, struct.pack(">i", 10 * MiB) + b"s" * MiB) for _ in range(8)]
    try:
        # 8 MiB of partial frames against a 4 MiB pool: the pool is full and the rest of the
        # slow senders wait in line; the real client queues behind them and is served once
        # the slow ones pass their deadline (time spent in line does not count, so this
        # takes a few deadlines, not one)
        t0 = time.monotonic()
        _round_trip(b, 500, seed=21)
        print(f"real client served {time.monotonic() - t0:.1f}s after the pool filled")
        assert all(_closed_by_peer(s, 30) for s in slow)
    finally:
        _close_all(slow)
    assert "socket.request.read.timeout.ms" in b.log_text()
    assert topic_first


def test_idle_and_slow_header_connections_are_closed(broker_factory):
    b = broker_factory(
        **{"connections.max.idle.ms": "1500", "socket.request.read.timeout.ms": "1000"}
    )
    idle = [_connect(b) for _ in range(10)]
    half_prefix = [_connect(b, b"\x00\x00") for _ in range(10)]
    partial_body = [_connect(b, struct.pack(">i", 5000) + b"x" * 100) for _ in range(10)]
    busy = _connect(b)
    stop = threading.Event()
    busy_errors: list[BaseException] = []

    def keep_busy() -> None:
        # one request every 300 ms: in use, so never idle
        cid = 0
        try:
            while not stop.is_set():
                cid += 1
                busy.sendall(_api_versions_v0(cid))
                assert _answered(busy, cid)
                stop.wait(0.3)
        except BaseException as exc:
            busy_errors.append(exc)

    worker = threading.Thread(target=keep_busy)
    worker.start()
    try:
        assert all(_closed_by_peer(s, 30) for s in half_prefix + partial_body)
        assert all(_closed_by_peer(s, 30) for s in idle)
        time.sleep(1.0)  # one more idle period for the busy connection
    finally:
        stop.set()
        worker.join(10)
        _close_all([*idle, *half_prefix, *partial_body, busy])
    assert busy_errors == []
    assert "request not received whole within 1000 ms (socket.request.read.timeout.ms" in (
        b.log_text()
    )
    _round_trip(b, 100, seed=31)


def test_two_thousand_connections_accepted_and_served(broker_factory):
    b = broker_factory()
    n = 2000
    socks: list[socket.socket] = []
    try:
        t0 = time.monotonic()
        for i in range(n):
            socks.append(_connect(b, _api_versions_v0(i)))
        t1 = time.monotonic()
        served = sum(_answered(s, i) for i, s in enumerate(socks))
        t2 = time.monotonic()
        print(
            f"{n} connections: connected and sent in {t1 - t0:.2f}s, all answered after"
            f" {t2 - t0:.2f}s ({n / (t2 - t0):,.0f} connections/s)"
        )
        assert served == n
    finally:
        _close_all(socks)


def test_tiny_request_pool_serves_concurrent_big_produces(broker_factory):
    b = broker_factory(**{"queued.max.request.bytes": str(MiB)})
    pid = _pid(b)
    producers, per_producer = 6, 600
    topic = new_topic(b.bootstrap, partitions=producers, prefix="pressure")
    records = [
        r._replace(partition=p)
        for p in range(producers)
        for r in make_records(per_producer, partitions=1, seed=40 + p, value_size=16_000)
    ]
    errors: list[BaseException] = []

    def produce(p: int) -> Callable[[], None]:
        def run() -> None:
            try:
                mine = [r for r in records if r.partition == p]
                # uncompressed, so each produce request is close to librdkafka's 1 MB batch
                ck_produce(b.bootstrap, topic, mine, codec="none", acks="all", idempotent=True)
            except BaseException as exc:
                errors.append(exc)

        return run

    threads = [threading.Thread(target=produce(p)) for p in range(producers)]
    # Half the pool held by a partial frame while the producers start: their ~1 MB requests
    # then find it full whatever the machine's load (left to themselves, six producers on a
    # busy machine were once read one request at a time and never filled it; seen under
    # pytest-xdist). The frame is let go once the broker says so, and the producers go on.
    hold = _connect(b, struct.pack(">i", MiB) + b"h" * (MiB // 2))
    t0 = time.monotonic()
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120
        while "request memory full" not in b.log_text() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        hold.close()
    for t in threads:
        t.join(300)
    elapsed = time.monotonic() - t0
    assert errors == []
    want = expected(records)
    got = ck_consume(b.bootstrap, topic, {p: len(v) for p, v in want.items()}, timeout=120)
    assert by_partition(got) == want  # every acknowledged record, once, in order
    peak_mb = _status_mb(pid, "VmHWM")
    mb = sum(len(r.value or b"") for r in records) / MiB
    print(
        f"{producers} producers, {mb:.0f} MiB through a 1 MiB request pool in {elapsed:.1f}s;"
        f" broker peak RSS {peak_mb} MB"
    )
    assert peak_mb < RSS_BOUND_MB
    assert "request memory full" in b.log_text()  # back-pressure did happen
