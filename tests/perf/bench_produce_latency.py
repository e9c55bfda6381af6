"""Produce latency (p50/p99) through the broker at a fixed moderate rate.

confluent-kafka, acks=all, idempotence on, lz4, linger.ms=0, 100 B values, ``--rate``
records/s for ``--seconds``: latency is the time from ``produce()`` to the delivery
callback (measured with one monotonic clock in this process; delivery callbacks are served
by a polling thread every 1 ms at most). Baseline in the same run: a round trip over the
same loopback to a trivial Python echo server (request of the same size, answered at once),
which is the floor any Python broker pays.

Last line: one JSON object with p50/p90/p99/max in ms for both, and the p50/p99 differences.

    .venv/bin/python tests/perf/bench_produce_latency.py [--rate 2000] [--seconds 10]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import confluent_kafka as ck  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from tests.fixtures.broker import BrokerProcess  # noqa: E402


def _percentiles(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    q = statistics.quantiles(s, n=100)
    return {
        "p50_ms": round(q[49] * 1000, 3),
        "p90_ms": round(q[89] * 1000, 3),
        "p99_ms": round(q[98] * 1000, 3),
        "max_ms": round(s[-1] * 1000, 3),
        "samples": len(s),
    }


def broker_latency(bootstrap: str, rate: int, seconds: float) -> list[float]:
    p = ck.Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "compression.type": "lz4",
            "linger.ms": 0,
        }
    )
    p.produce("lat", value=b"warm-up")
    p.flush(30)
    latencies: list[float] = []
    stop = threading.Event()

    def poller() -> None:
        while not stop.is_set():
            p.poll(0.001)

    t = threading.Thread(target=poller)
    t.start()
    value = os.urandom(50) + b"x" * 50
    interval = 1.0 / rate
    n = int(rate * seconds)
    start = time.perf_counter()
    for i in range(n):
        target = start + i * interval
        while True:
            now = time.perf_counter()
            if now >= target:
                break
            time.sleep(min(target - now, 0.0005))
        sent = time.perf_counter()
        p.produce(
            "lat",
            value=value,
            on_delivery=lambda err, _m, sent=sent: (
                latencies.append(time.perf_counter() - sent) if err is None else None
            ),
        )
    p.flush(60)
    stop.set()
    t.join()
    if len(latencies) != n:
        raise RuntimeError(f"{n - len(latencies)} records not acknowledged")
    return latencies


def echo_latency(rate: int, seconds: float, size: int = 200) -> list[float]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def serve() -> None:
        conn, _ = srv.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                conn.sendall(data)

    t = threading.Thread(target=serve)
    t.start()
    out: list[float] = []
    payload = b"x" * size
    with socket.create_connection(srv.getsockname()) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        interval = 1.0 / rate
        start = time.perf_counter()
        for i in range(int(rate * seconds)):
            target = start + i * interval
            while time.perf_counter() < target:
                time.sleep(0.0002)
            t0 = time.perf_counter()
            s.sendall(payload)
            got = 0
            while got < size:
                got += len(s.recv(65536))
            out.append(time.perf_counter() - t0)
    t.join()
    srv.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        b = BrokerProcess(Path(tmp))
        b.start()
        try:
            admin = AdminClient({"bootstrap.servers": b.bootstrap})
            admin.create_topics([NewTopic("lat", 1, 1)])["lat"].result(timeout=30)
            broker = _percentiles(broker_latency(b.bootstrap, args.rate, args.seconds))
        finally:
            b.stop()
    echo = _percentiles(echo_latency(args.rate, min(args.seconds, 5.0)))
    result = {
        "rate_records_per_s": args.rate,
        "broker": broker,
        "loopback_echo_baseline": echo,
        "p50_over_baseline_ms": round(broker["p50_ms"] - echo["p50_ms"], 3),
        "p99_over_baseline_ms": round(broker["p99_ms"] - echo["p99_ms"], 3),
    }
    print(
        f"broker p50 {broker['p50_ms']} ms p99 {broker['p99_ms']} ms; "
        f"loopback echo p50 {echo['p50_ms']} ms p99 {echo['p99_ms']} ms"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
