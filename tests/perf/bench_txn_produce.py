"""Transactional produce vs idempotent produce of the same records, same broker, same run.

confluent-kafka, 100 B records, lz4, acks=all, 1 partition, linger.ms=5, batch.size=1 MB.
Case ``idempotent``: ``--records`` records produced with idempotence on, timed from the
first ``produce()`` to the end of ``flush()``. Case ``transactional``: the same records in
transactions of ``--txn-size`` (1,000) records — ``begin_transaction``, the produces,
``commit_transaction`` (which flushes) — timed from the first ``begin_transaction`` to the
last commit. Both topics live on one broker subprocess; the order of the cases alternates
over ``--rounds`` rounds. On a shared machine single runs swing by 2x, so two figures are
given: the ratio of each case's best round, and the median of the per-round ratios (the two
cases of one round run back to back, under similar load).

Prints one line per round and case and, last, one JSON object with records/s of each case
and the ratios transactional / idempotent. Target: >= 0.8.

    .venv/bin/python tests/perf/bench_txn_produce.py [--records 200000] [--txn-size 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import confluent_kafka as ck  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from tests.fixtures.broker import BrokerProcess  # noqa: E402

_CONF = {
    "acks": "all",
    "enable.idempotence": True,
    "compression.type": "lz4",
    "linger.ms": 5,
    "batch.size": 1_000_000,
    "queue.buffering.max.messages": 2_000_000,
    "queue.buffering.max.kbytes": 2_000_000,
}


def _values(size: int = 100, n: int = 1024) -> list[bytes]:
    # half random, half repeated: compresses like typical JSON-ish payloads (~2x with lz4)
    rnd = os.urandom(size * n)
    return [rnd[i * size : i * size + size // 2] + b"x" * (size - size // 2) for i in range(n)]


def _produce_all(p: ck.Producer, topic: str, values: list[bytes], first: int, count: int) -> None:
    produce = p.produce
    nv = len(values)
    for i in range(first, first + count):
        try:
            produce(topic, value=values[i % nv], partition=0)
        except BufferError:
            p.poll(0.01)
            produce(topic, value=values[i % nv], partition=0)


def idempotent(bootstrap: str, topic: str, n: int, values: list[bytes]) -> float:
    p = ck.Producer({"bootstrap.servers": bootstrap, **_CONF})
    p.produce(topic, value=b"warm-up", partition=0)
    p.flush(30)
    t0 = time.perf_counter()
    _produce_all(p, topic, values, 0, n)
    left = p.flush(120)
    elapsed = time.perf_counter() - t0
    if left:
        raise RuntimeError(f"{left} records not delivered")
    return elapsed


def transactional(bootstrap: str, topic: str, n: int, values: list[bytes], txn_size: int) -> float:
    p = ck.Producer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-{topic}", **_CONF})
    p.init_transactions(30)
    p.begin_transaction()  # warm-up: connections, metadata, the partition in a transaction
    p.produce(topic, value=b"warm-up", partition=0)
    p.commit_transaction(30)
    t0 = time.perf_counter()
    for first in range(0, n, txn_size):
        p.begin_transaction()
        _produce_all(p, topic, values, first, min(txn_size, n - first))
        p.commit_transaction(60)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--txn-size", type=int, default=1_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    n = args.records
    values = _values()
    best: dict[str, float] = {}
    paired: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        b = BrokerProcess(Path(tmp), **{"num.io.threads": "2", "num.network.threads": "1"})
        b.start()
        try:
            admin = AdminClient({"bootstrap.servers": b.bootstrap})
            for r in range(args.rounds):
                this: dict[str, float] = {}
                order = ("idempotent", "transactional")
                for case in order if r % 2 == 0 else order[::-1]:
                    topic = f"bench-{case}-{r}"
                    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
                    if case == "idempotent":
                        elapsed = idempotent(b.bootstrap, topic, n, values)
                    else:
                        elapsed = transactional(b.bootstrap, topic, n, values, args.txn_size)
                    rps = n / elapsed
                    best[case] = max(best.get(case, 0.0), rps)
                    this[case] = rps
                    print(f"round {r} {case}: {rps:,.0f} records/s ({elapsed:.2f} s)", flush=True)
                paired.append(this["transactional"] / this["idempotent"])
        finally:
            code = b.stop()
        if code != 0:
            raise RuntimeError(f"broker exited with {code}:\n{b.log_tail()}")
    ratio = best["transactional"] / best["idempotent"]
    print(
        json.dumps(
            {
                "records": n,
                "record_bytes": 100,
                "txn_size": args.txn_size,
                "idempotent_records_per_s": round(best["idempotent"]),
                "transactional_records_per_s": round(best["transactional"]),
                "ratio_of_best": round(ratio, 3),
                "median_round_ratio": round(statistics.median(paired), 3),
                "round_ratios": [round(x, 3) for x in paired],
                "target_ratio": 0.8,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
