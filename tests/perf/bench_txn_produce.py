"""Transactional produce vs idempotent produce of the same records, same broker, same run.

confluent-kafka, 100 B records, lz4, acks=all, 1 partition, linger.ms=5, batch.size=1 MB.
Case ``idempotent``: ``--records`` records produced with idempotence on, timed from the
first ``produce()`` to the end of ``flush()``. Case ``transactional``: the same records in
transactions of ``--txn-size`` (1,000) records — ``begin_transaction``, the produces,
``commit_transaction`` (which flushes) — timed from the first ``begin_transaction`` to the
last commit. Both topics live on one broker subprocess.

On a shared machine single runs swing by 2x (other processes take the 2 cores for seconds),
so the measurement is built to be robust rather than quick: ``--rounds`` (9) rounds, each
running the two cases back to back in ABBA order (idempotent, transactional, transactional,
idempotent; then the reverse), so both cases see the same load drift within a round; every
case run produces ``--records`` (200,000 = 200 transactions) records, long enough to span
scheduler hiccups. Figures: the median of the per-round ratios (each from the two runs of
each case in that round), the ratio of the medians, the ratio of each case's best run, and
the ratio of total records / total time over all rounds. For the transactional runs it also
prints where the time goes on the client: the median ``commit_transaction`` (flush of the
last records + EndTxn, whose answer waits for the markers) and ``begin + produce`` time per
transaction.

Prints one line per run and, last, one JSON object with records/s of each case and the
ratios transactional / idempotent. Target: >= 0.8.

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


def transactional(
    bootstrap: str, topic: str, n: int, values: list[bytes], txn_size: int, *, commits: list[float]
) -> float:
    """Seconds for ``n`` records in transactions; appends each transaction's
    ``commit_transaction`` seconds to ``commits``."""
    p = ck.Producer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-{topic}", **_CONF})
    p.init_transactions(30)
    p.begin_transaction()  # warm-up: connections, metadata, the partition in a transaction
    p.produce(topic, value=b"warm-up", partition=0)
    p.commit_transaction(30)
    clock = time.perf_counter
    t0 = clock()
    for first in range(0, n, txn_size):
        p.begin_transaction()
        _produce_all(p, topic, values, first, min(txn_size, n - first))
        t1 = clock()
        p.commit_transaction(60)
        commits.append(clock() - t1)
    return clock() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000, help="records per run")
    ap.add_argument("--txn-size", type=int, default=1_000)
    ap.add_argument("--rounds", type=int, default=9, help="rounds of 2 runs of each case")
    args = ap.parse_args()
    n = args.records
    values = _values()
    runs: dict[str, list[float]] = {"idempotent": [], "transactional": []}
    paired: list[float] = []
    commits: list[float] = []
    txn_times: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        b = BrokerProcess(Path(tmp), **{"num.io.threads": "2", "num.network.threads": "1"})
        b.start()
        try:
            admin = AdminClient({"bootstrap.servers": b.bootstrap})
            seq = 0
            for r in range(args.rounds):
                this: dict[str, float] = {}
                abba = ("idempotent", "transactional", "transactional", "idempotent")
                for case in abba if r % 2 == 0 else abba[::-1]:
                    seq += 1
                    topic = f"bench-{case}-{seq}"
                    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
                    if case == "idempotent":
                        elapsed = idempotent(b.bootstrap, topic, n, values)
                    else:
                        before = len(commits)
                        elapsed = transactional(
                            b.bootstrap, topic, n, values, args.txn_size, commits=commits
                        )
                        txn_times.append(elapsed / max(len(commits) - before, 1))
                    runs[case].append(elapsed)
                    this[case] = this.get(case, 0.0) + elapsed
                    print(
                        f"round {r} {case}: {n / elapsed:,.0f} records/s ({elapsed:.2f} s)",
                        flush=True,
                    )
                # same records in both cases: the ratio of rates is the inverse of the times
                paired.append(this["idempotent"] / this["transactional"])
                print(f"round {r} ratio: {paired[-1]:.3f}", flush=True)
        finally:
            code = b.stop()
        if code != 0:
            raise RuntimeError(f"broker exited with {code}:\n{b.log_tail()}")

    def rate(elapsed: float) -> float:
        return n / elapsed

    med = {c: rate(statistics.median(t)) for c, t in runs.items()}
    best = {c: rate(min(t)) for c, t in runs.items()}
    total = {c: n * len(t) / sum(t) for c, t in runs.items()}
    print(
        json.dumps(
            {
                "records_per_run": n,
                "record_bytes": 100,
                "txn_size": args.txn_size,
                "rounds": args.rounds,
                "idempotent_records_per_s_median": round(med["idempotent"]),
                "transactional_records_per_s_median": round(med["transactional"]),
                "idempotent_records_per_s_best": round(best["idempotent"]),
                "transactional_records_per_s_best": round(best["transactional"]),
                "median_round_ratio": round(statistics.median(paired), 3),
                "ratio_of_medians": round(med["transactional"] / med["idempotent"], 3),
                "ratio_of_best": round(best["transactional"] / best["idempotent"], 3),
                "ratio_of_totals": round(total["transactional"] / total["idempotent"], 3),
                "round_ratios": [round(x, 3) for x in paired],
                "txn_ms_median": round(statistics.median(txn_times) * 1000, 2),
                "commit_transaction_ms_median": round(statistics.median(commits) * 1000, 2),
                "commit_transaction_ms_p90": round(
                    statistics.quantiles(commits, n=10)[-1] * 1000, 2
                ),
                "target_ratio": 0.8,
                "load_average": [round(x, 1) for x in os.getloadavg()],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
