"""Produce throughput through the broker with confluent-kafka vs a raw append of the same bytes.

For each case (value size 100 B / 1 KiB, 1 / 6 partitions; lz4, acks=all, idempotence on)
a fresh broker subprocess is started, ``--records`` records are produced with librdkafka
(linger.ms=5, batch.size=1 MB) and timed from the first ``produce()`` to the end of
``flush()``. Baseline, measured in the same run: the batches the broker stored (read back
from its segment files, so exactly the bytes the producer sent) appended with
``Log.append`` in-process to a fresh log — what the storage engine alone costs.

Comparisons in the same run, alternating so that the load of a shared machine falls on
every variant alike (``--rounds`` times each, every run printed, never a best-of):

- ``--baseline REV_OR_DIR``: the broker of another commit (its ``logstore/`` is extracted
  with ``git archive`` into a temporary directory) or of another checkout, run with the
  same interpreter and clients;
- ``--metrics``: this broker with ``metrics.listeners`` on (the per-request counters and
  histograms; nothing scrapes during the run).

Prints one line per run and, last, one JSON object with every run's records/s and broker
CPU time per record (user + system, from ``/proc``: steadier than records/s when other
processes load the machine), the median per variant and case, and the ratios of medians
against this broker (``current``).
Target: >= 250k records/s for 100 B.

    .venv/bin/python tests/perf/bench_produce.py [--records 1000000] [--cases 1024x1]
        [--baseline 05e34e7] [--metrics] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
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


def _baseline_root(spec: str, tmp: Path) -> Path:
    """A checkout directory as given, or ``logstore/`` of commit ``spec`` extracted to ``tmp``."""
    if Path(spec, "logstore").is_dir():
        return Path(spec).resolve()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", spec, "logstore"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
    return tmp


def _cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of process ``pid`` so far (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _run_case(
    root: Path, size: int, partitions: int, n: int, overrides: dict[str, str]
) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        b = BrokerProcess(
            Path(tmp),
            root=root,
            **{"num.io.threads": "2", "num.network.threads": "1", **overrides},
        )
        b.start()
        try:
            topic = f"bench-{size}-{partitions}"
            admin = AdminClient({"bootstrap.servers": b.bootstrap})
            admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=30)
            assert b.proc is not None
            user0, sys0 = _cpu_seconds(b.proc.pid)
            elapsed = _produce(b.bootstrap, topic, n, size, partitions)
            user1, sys1 = _cpu_seconds(b.proc.pid)
        finally:
            b.stop()
        raw_s, raw_n = _raw_append(b.log_dir, topic, partitions)
    return {
        "records_per_s": n / elapsed,
        "raw_append_records_per_s": raw_n / raw_s,
        "broker_user_us_per_record": (user1 - user0) / n * 1e6,
        "broker_sys_us_per_record": (sys1 - sys0) / n * 1e6,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000, help="records of 100 B (1 KiB: /5)")
    ap.add_argument(
        "--cases",
        default="100x1,100x6,1024x1,1024x6",
        help="comma-separated SIZExPARTITIONS (default: %(default)s)",
    )
    ap.add_argument("--baseline", help="commit or checkout directory of a broker to compare")
    ap.add_argument("--metrics", action="store_true", help="also run with metrics.listeners on")
    ap.add_argument("--rounds", type=int, default=1, help="alternating runs of each variant")
    args = ap.parse_args()
    cases = [tuple(int(x) for x in c.split("x")) for c in args.cases.split(",")]
    with tempfile.TemporaryDirectory() as base_tmp:
        variants: list[tuple[str, Path, dict[str, str]]] = [("current", ROOT, {})]
        if args.baseline:
            variants.append(("baseline", _baseline_root(args.baseline, Path(base_tmp)), {}))
        if args.metrics:
            listener = {"metrics.listeners": "http://127.0.0.1:0"}
            variants.append(("metrics_on", ROOT, listener))
        runs: dict[str, dict[str, list[float]]] = {}
        cpu: dict[str, dict[str, list[float]]] = {}
        raw: dict[str, list[float]] = {}
        for size, partitions in cases:
            key = f"{size}B_{partitions}p"
            n = args.records if size == 100 else max(args.records // 5, 1000)
            for r in range(args.rounds):
                # alternate the order too, so neither variant always runs first
                order = variants if r % 2 == 0 else variants[::-1]
                for name, root, overrides in order:
                    res = _run_case(root, size, partitions, n, overrides)
                    rps = res["records_per_s"]
                    runs.setdefault(key, {}).setdefault(name, []).append(rps)
                    us = res["broker_user_us_per_record"] + res["broker_sys_us_per_record"]
                    cpu.setdefault(key, {}).setdefault(name, []).append(us)
                    raw.setdefault(key, []).append(res["raw_append_records_per_s"])
                    print(
                        f"{key} round {r + 1} {name}: {rps:,.0f} records/s, "
                        f"{rps * size / 1e6:.1f} MB/s "
                        f"(raw append {res['raw_append_records_per_s']:,.0f} records/s); broker "
                        f"CPU {res['broker_user_us_per_record']:.3f} user + "
                        f"{res['broker_sys_us_per_record']:.3f} sys us/record",
                        flush=True,
                    )
    results: dict[str, object] = {}
    for key, by_variant in runs.items():
        med = {name: statistics.median(v) for name, v in by_variant.items()}
        entry: dict[str, object] = {
            "runs": {name: [round(x) for x in v] for name, v in by_variant.items()},
            "median": {name: round(m) for name, m in med.items()},
            # CPU the broker spent per record: less sensitive than records/s to the load that
            # other processes put on a shared machine
            "broker_cpu_us_per_record": {
                name: [round(x, 3) for x in v] for name, v in cpu[key].items()
            },
            "raw_append_records_per_s": round(statistics.median(raw[key])),
            "ratio_vs_raw_append": round(med["current"] / statistics.median(raw[key]), 3),
        }
        for name, m in med.items():
            if name != "current":
                entry[f"ratio_current_vs_{name}"] = round(med["current"] / m, 3)
        cpu_med = {name: statistics.median(v) for name, v in cpu[key].items()}
        for name, m in cpu_med.items():
            if name != "current":
                entry[f"cpu_ratio_{name}_vs_current"] = round(m / cpu_med["current"], 3)
        if "metrics_on" in med:
            entry["ratio_metrics_on_vs_off"] = round(med["metrics_on"] / med["current"], 3)
        results[key] = entry
        print(f"{key}: " + ", ".join(f"{k}={v}" for k, v in entry.items() if "ratio" in k))
    results["target_100B_records_per_s"] = 250_000
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
