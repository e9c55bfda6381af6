"""READ_COMMITTED fetch vs READ_UNCOMMITTED fetch of the same partition, same broker, same run.

Set-up, through the real broker: one partition written by a confluent-kafka transactional
producer, ``--records`` 100 B lz4 records in transactions of ``--txn-size`` (1,000), every
``--abort-every``-th transaction (4th) aborted, so the log holds committed data, aborted data,
COMMIT/ABORT markers and a ``.txnindex`` entry per aborted transaction (75,000 of 100,000 records
committed by default). Every transaction is complete before reading (LSO = high watermark).

Then rounds of two confluent-kafka consumers over that partition from offset 0, alternating
which goes first: ``isolation.level=read_uncommitted`` (receives every data record) and
``read_committed`` (the broker returns the aborted transactions of each fetch, librdkafka drops
their records). Each is timed from ``assign`` until it has received every record it should
(the committed ones, or all): both traverse the same offsets, the same bytes. Figures:
log offsets/s and records delivered/s of each case, the ratio of the traversal rates
(READ_COMMITTED / READ_UNCOMMITTED: >= 0.9 is the issue's target), per round, its median and
the ratio of each case's best round.

The consumers' figures include librdkafka's decoding and the hand-over to Python (a
read_committed consumer hands over fewer records, so it can come out faster than the broker
alone would). Each round therefore also reads the partition with a protocol-level Fetch v4
reader (``isolation_level`` 0 or 1, ``--fetch-kb`` per request, ``--fetch-passes`` passes,
batch headers walked, nothing decoded): the broker's own cost of READ_COMMITTED (the LSO, the
aborted-transaction lookup in the ``.txnindex`` entries, their encoding), ``fetch_*`` figures.
The machine may be shared: single rounds swing, so the load average is printed too.

    .venv/bin/python tests/perf/bench_read_committed.py [--records 300000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import confluent_kafka as ck  # noqa: E402

from tests.perf.bench_consume import bench_broker, fetch_pass  # noqa: E402

TOPIC = "bench-read-committed"


def _values(size: int = 100, n: int = 1024) -> list[bytes]:
    rnd = os.urandom(size * n)
    return [rnd[i * size : i * size + size // 2] + b"x" * (size - size // 2) for i in range(n)]


def write_log(bootstrap: str, n: int, txn_size: int, abort_every: int) -> int:
    """Produce ``n`` records in transactions; returns how many were committed."""
    p = ck.Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": "bench-read-committed",
            "compression.type": "lz4",
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 2_000_000,
        }
    )
    p.init_transactions(30)
    values = _values()
    committed = 0
    for t, first in enumerate(range(0, n, txn_size)):
        count = min(txn_size, n - first)
        p.begin_transaction()
        for i in range(first, first + count):
            try:
                p.produce(TOPIC, value=values[i % len(values)], partition=0)
            except BufferError:
                p.poll(0.01)
                p.produce(TOPIC, value=values[i % len(values)], partition=0)
        if abort_every > 0 and t % abort_every == abort_every - 1:
            p.flush(60)  # the records reach the log before the ABORT marker
            p.abort_transaction(60)
        else:
            p.commit_transaction(60)
            committed += count
    return committed


def read(bootstrap: str, isolation: str, expected: int) -> float:
    """Seconds for a consumer of ``isolation`` to receive ``expected`` records from 0."""
    c = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{isolation}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "fetch.max.bytes": 64 * 1024 * 1024,
            "max.partition.fetch.bytes": 4 * 1024 * 1024,
        }
    )
    try:
        c.list_topics(TOPIC, timeout=10)  # connection and metadata outside the timing
        got = 0
        t0 = time.perf_counter()
        c.assign([ck.TopicPartition(TOPIC, 0, 0)])
        deadline = t0 + 120
        while got < expected:
            got += len(c.consume(10_000, timeout=1.0))  # no partition-EOF events
            if time.perf_counter() > deadline:
                raise RuntimeError(f"{isolation}: {got} of {expected} records after 120 s")
        elapsed = time.perf_counter() - t0
        if got != expected:
            raise RuntimeError(f"{isolation}: {got} records, expected {expected}")
        return elapsed
    finally:
        c.close()


def _summary(best: dict[str, float], paired: list[float], prefix: str) -> dict[str, object]:
    ru, rc = best[f"{prefix}read_uncommitted"], best[f"{prefix}read_committed"]
    return {
        f"{prefix}read_uncommitted_log_records_per_s": round(ru),
        f"{prefix}read_committed_log_records_per_s": round(rc),
        f"{prefix}ratio_of_best": round(rc / ru, 3),
        f"{prefix}median_round_ratio": round(statistics.median(paired), 3),
        f"{prefix}round_ratios": [round(x, 3) for x in paired],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--txn-size", type=int, default=1_000)
    ap.add_argument("--abort-every", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument(
        "--fetch-kb", type=int, default=256, help="partition_max_bytes of the raw Fetch"
    )
    ap.add_argument("--fetch-passes", type=int, default=5, help="raw Fetch passes per round")
    args = ap.parse_args()
    n = args.records
    cases = ("read_uncommitted", "read_committed")
    best: dict[str, float] = {}
    paired: list[float] = []
    raw_paired: list[float] = []
    with bench_broker(TOPIC) as b:
        committed = write_log(b.bootstrap, n, args.txn_size, args.abort_every)
        c = ck.Consumer({"bootstrap.servers": b.bootstrap, "group.id": "bench-wm"})
        low, end = c.get_watermark_offsets(ck.TopicPartition(TOPIC, 0), timeout=10)
        c.close()
        expected = {"read_uncommitted": n, "read_committed": committed}
        print(f"log: {n:,} records, {committed:,} committed, offsets {low}-{end}", flush=True)
        for r in range(args.rounds):
            this: dict[str, float] = {}
            for case in cases if r % 2 == 0 else cases[::-1]:
                elapsed = read(b.bootstrap, case, expected[case])
                rate = n / elapsed  # offsets of data traversed per second
                this[case] = rate
                best[case] = max(best.get(case, 0.0), rate)
                print(
                    f"round {r} confluent {case}: {rate:,.0f} log records/s,"
                    f" {expected[case] / elapsed:,.0f} delivered/s ({elapsed:.3f} s)",
                    flush=True,
                )
            for case in cases if r % 2 == 1 else cases[::-1]:
                iso = 1 if case == "read_committed" else 0
                elapsed = 0.0
                for _ in range(args.fetch_passes):
                    secs, _, aborted = fetch_pass(
                        b.port, TOPIC, end, args.fetch_kb * 1024, isolation=iso, rcvbuf=None
                    )
                    elapsed += secs
                rate = n * args.fetch_passes / elapsed
                this[f"fetch_{case}"] = rate
                best[f"fetch_{case}"] = max(best.get(f"fetch_{case}", 0.0), rate)
                print(
                    f"round {r} raw Fetch {case}: {rate:,.0f} log records/s"
                    f" ({elapsed / args.fetch_passes * 1000:.1f} ms a pass,"
                    f" {aborted} aborted entries in the last)",
                    flush=True,
                )
            paired.append(this["read_committed"] / this["read_uncommitted"])
            raw_paired.append(this["fetch_read_committed"] / this["fetch_read_uncommitted"])
    print(
        json.dumps(
            {
                "records": n,
                "committed_records": committed,
                "txn_size": args.txn_size,
                "abort_every": args.abort_every,
                **_summary(best, paired, ""),
                **_summary(best, raw_paired, "fetch_"),
                "target_ratio": 0.9,
                "load_average": [round(x, 1) for x in os.getloadavg()],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
