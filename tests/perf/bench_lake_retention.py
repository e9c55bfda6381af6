"""Soak: the broker's own retention racing spark-submit ingest and lookups, with and without the
lake bound (``log.retention.lake.group``).

For each case, against a fresh real broker on 127.0.0.1 (size retention checked every second:
``retention.bytes`` ``--retention-kib``, segments of ``--segment-kib``):

- a confluent-kafka producer (acks=all) writes ``--partitions`` partitions the whole time
  (:class:`tests.fixtures.traffic.Traffic`), starting ``--head-start`` seconds before the
  first ingest (the lake has no offset for the partitions yet);
- ``spark-submit jobs/ingest.py`` (committing the lake group) and ``spark-submit
  jobs/build_lookups.py`` run back to back, each in its own thread, overlapping as the two
  DAGs' tasks do, for ``--minutes``; then the producer stops and one last ingest runs.

Cases: ``lake`` (the broker started with ``log.retention.lake.group``: what this project
ships) and, as the in-run baseline, ``kafka`` (the same without it: Kafka's rules alone).
Printed per case: records acknowledged, in the lake (the ``records`` table read with delta-rs),
lost (acknowledged, never in the lake), duplicated, the gaps ingest reported, each job's runs
and exit codes (with the failed runs' messages), the re-planned attempts the jobs logged.
Last line one JSON object; exit 1 when the ``lake`` case lost or duplicated anything or a job
exited non-zero.

    .venv/bin/python tests/perf/bench_lake_retention.py [--minutes 2] [--only lake]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from deltalake import DeltaTable  # noqa: E402

from tests.fixtures.broker import BrokerProcess  # noqa: E402
from tests.fixtures.jobs import spark_submit  # noqa: E402
from tests.fixtures.traffic import Traffic  # noqa: E402

TOPIC = "soak"
GROUP = "loglake-ingest"


class _Runs:
    """Exit codes and output of one job run back to back until stopped."""

    def __init__(self, job: str, argv: list[str]) -> None:
        self.job, self.argv = job, argv
        self.codes: list[int] = []
        self.stdout: list[str] = []

    def once(self) -> None:
        proc = spark_submit(self.job, self.argv, timeout=600)
        self.codes.append(proc.returncode)
        self.stdout.append(proc.stdout)

    def loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.once()


def _case(args: argparse.Namespace, work: Path, *, lake_bound: bool) -> dict[str, Any]:
    overrides = {
        "log.retention.check.interval.ms": "1000",
        "log.segment.delete.delay.ms": "0",
        "replica.high.watermark.checkpoint.interval.ms": "500",
        "log.flush.start.offset.checkpoint.interval.ms": "500",
    }
    if lake_bound:
        overrides["log.retention.lake.group"] = GROUP
    broker = BrokerProcess(work / "broker", **overrides)
    broker.start()
    try:
        configs = {
            "segment.bytes": str(args.segment_kib << 10),
            "retention.bytes": str(args.retention_kib << 10),
        }
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        new = NewTopic(TOPIC, num_partitions=args.partitions, replication_factor=1, config=configs)
        admin.create_topics([new])[TOPIC].result(timeout=30)
        config = work / "pipeline.toml"
        config.write_text(
            f'[paths]\nlog_dirs = ["{broker.log_dir}"]\nlake = "{work / "lake"}"\n'
            f'[ingest]\ntopics = ["{TOPIC}"]\nbootstrap_servers = "{broker.bootstrap}"\n'
            f'lake_group = "{GROUP}"\nprogress_interval_s = 0\n'
        )
        argv = ["--config", str(config)]
        ingest, lookups = _Runs("ingest.py", argv), _Runs("build_lookups.py", argv)
        stop = threading.Event()
        with Traffic(
            broker.bootstrap,
            TOPIC,
            partitions=args.partitions,
            produce_interval_s=args.produce_interval,
        ) as bg:
            time.sleep(args.head_start)
            threads = [threading.Thread(target=r.loop, args=(stop,)) for r in (ingest, lookups)]
            for t in threads:
                t.start()
            time.sleep(args.minutes * 60)
            stop.set()
            for t in threads:
                t.join()
        time.sleep(1.5)  # the high-watermark checkpoint reaches the last acknowledged offset
        ingest.once()
        acked = set(bg.acked)
        table = DeltaTable(str(work / "lake" / "records")).to_pyarrow_table(
            columns=["partition", "offset"]
        )
        keys = list(
            zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(),
                strict=True)
        )  # fmt: skip
        counts = Counter(keys)
        gaps = [
            gap
            for out in ingest.stdout
            for line in out.splitlines()
            if line.startswith('{"records"')
            for gap in json.loads(line)["gaps"]
        ]
        # spark-submit puts the Python driver's stderr (the jobs' own lines) on stdout
        said = "".join(ingest.stdout + lookups.stdout)
        failures = [
            next((x for x in out.splitlines() if " failed: " in x), "no message")[:400]
            for r in (ingest, lookups)
            for code, out in zip(r.codes, r.stdout, strict=True)
            if code != 0
        ]
        return {
            "acked": len(acked),
            "in_lake": len(counts),
            "lost": len(acked - set(counts)),
            "duplicated": sum(1 for n in counts.values() if n > 1),
            "gap_offsets": sum(g["to_offset"] - g["from_offset"] for g in gaps),
            "ingest_exit_codes": dict(Counter(ingest.codes)),
            "lookups_exit_codes": dict(Counter(lookups.codes)),
            "replanned_attempts": said.count("planning again"),
            "produce_errors": sum(1 for e in bg.errors if e.startswith("produce")),
            "failures": failures,
        }
    finally:
        broker.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=2.0)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--segment-kib", type=int, default=64)
    ap.add_argument("--retention-kib", type=int, default=256)
    ap.add_argument("--head-start", type=float, default=10.0, help="seconds before ingest")
    ap.add_argument("--produce-interval", type=float, default=0.001, help="s between records")
    ap.add_argument("--only", choices=("lake", "kafka"))
    args = ap.parse_args()
    results: dict[str, Any] = {}
    for name in ("lake", "kafka"):
        if args.only and args.only != name:
            continue
        with tempfile.TemporaryDirectory(prefix=f"bench-lake-{name}-") as tmp:
            results[name] = _case(args, Path(tmp), lake_bound=name == "lake")
        print(f"{name}: {results[name]}", flush=True)
    print(json.dumps(results))
    lake = results.get("lake")
    bad = lake is not None and (
        lake["lost"]
        or lake["duplicated"]
        or set(lake["ingest_exit_codes"]) != {0}
        or set(lake["lookups_exit_codes"]) != {0}
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
