"""Produce throughput through the broker with confluent-kafka vs a raw append of the same bytes.

For each case (value size 100 B / 1 KiB, 1 / 6 partitions; lz4, acks=all, idempotence on)
a fresh broker subprocess is started, ``--records`` records are produced with librdkafka
(linger.ms=5, batch.size=1 MB) and timed from the first ``produce()`` to the end of
``flush()``. Baseline, measured in the same run: the batches the broker stored (read back
from its segment files, so exactly the bytes the producer sent) appended with
``Log.append`` in-process to a fresh log — what the storage engine alone costs.

Prints one line per case and, last, one JSON object with records/s, MB/s (uncompressed
payload) and the ratio broker / raw append per case. Target: >= 250k records/s for 100 B.

    .venv/bin/python tests/perf/bench_produce.py [--records 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import confluent_kafka as ck  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from logstore.protocol.batch import iter_batches  # noqa: E402
from logstore.storage.config import LogConfig  # noqa: E402
from logstore.storage.log import Log  # noqa: E402
from tests.fixtures.broker import BrokerProcess  # noqa: E402


def _values(size: int, n: int = 1024) -> list[bytes]:
    # half random, half repeated: compresses like typical JSON-ish payloads (~2x with lz4)
    rnd = os.urandom(size * n)
    return [rnd[i * size : i * size + size // 2] + b"x" * (size - size // 2) for i in range(n)]


def _produce(bootstrap: str, topic: str, n: int, size: int, partitions: int) -> float:
    p = ck.Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "compression.type": "lz4",
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 2_000_000,
        }
    )
    values = _values(size)
    # warm-up: connections, metadata, producer id
    p.produce(topic, value=b"warm-up", partition=0)
    p.flush(30)
    produce = p.produce
    nv = len(values)
    t0 = time.perf_counter()
    for i in range(n):
        try:
            produce(topic, value=values[i % nv], partition=i % partitions)
        except BufferError:
            p.poll(0.01)
            produce(topic, value=values[i % nv], partition=i % partitions)
    left = p.flush(120)
    elapsed = time.perf_counter() - t0
    if left:
        raise RuntimeError(f"{left} records not delivered")
    return elapsed


def _raw_append(log_dir: Path, topic: str, partitions: int) -> tuple[float, int]:
    """Append the stored batches again, in-process: (seconds, records)."""
    batches: list[bytes] = []
    for p in range(partitions):
        for seg in sorted((log_dir / f"{topic}-{p}").glob("*.log")):
            data = seg.read_bytes()
            batches += [data[pos : pos + h.size] for pos, h in iter_batches(data)]
    batches = batches[1:]  # not the warm-up batch
    with tempfile.TemporaryDirectory() as tmp:
        log = Log.open(Path(tmp) / "raw-0", LogConfig())
        bufs = [bytearray(b) for b in batches]
        records = 0
        t0 = time.perf_counter()
        for buf in bufs:
            records += log.append(buf).num_records
        elapsed = time.perf_counter() - t0
        log.close()
    return elapsed, records


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    args = ap.parse_args()
    results = {}
    for size, partitions in ((100, 1), (100, 6), (1024, 1), (1024, 6)):
        n = args.records if size == 100 else max(args.records // 5, 1000)
        with tempfile.TemporaryDirectory() as tmp:
            b = BrokerProcess(Path(tmp), **{"num.io.threads": "2", "num.network.threads": "1"})
            b.start()
            try:
                topic = f"bench-{size}-{partitions}"
                admin = AdminClient({"bootstrap.servers": b.bootstrap})
                admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=30)
                elapsed = _produce(b.bootstrap, topic, n, size, partitions)
            finally:
                b.stop()
            raw_s, raw_n = _raw_append(b.log_dir, topic, partitions)
        rps = n / elapsed
        raw_rps = raw_n / raw_s
        key = f"{size}B_{partitions}p"
        results[key] = {
            "records": n,
            "seconds": round(elapsed, 3),
            "records_per_s": round(rps),
            "mb_per_s": round(n * size / elapsed / 1e6, 1),
            "raw_append_records_per_s": round(raw_rps),
            "ratio_vs_raw_append": round(rps / raw_rps, 3),
        }
        print(
            f"{key}: {rps:,.0f} records/s, {n * size / elapsed / 1e6:.1f} MB/s "
            f"(raw append {raw_rps:,.0f} records/s, ratio {rps / raw_rps:.3f})",
            flush=True,
        )
    results["target_100B_records_per_s"] = 250_000
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
