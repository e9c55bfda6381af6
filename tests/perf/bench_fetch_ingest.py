"""Benchmark: ingest through Fetch from the broker vs ingest of the same segments from local
files, in one run (issue 24's target: ratio >= 0.5).

A real broker (``tests.fixtures.broker.BrokerProcess``) gets ``--records`` records of
``--value-bytes`` (random, lz4, ``--partitions`` partitions) from confluent-kafka. Then, with
the same Spark session (local[2]) and the shipped ``conf/pipeline.toml`` ``[ingest]``:

- ``files_s``: the job reading the broker's log dir (``log_dirs`` set), into a fresh lake;
- ``fetch_s``: the job with no log dirs, reading everything through Fetch from the broker
  (``pipelines.sources.fetch_ingest``), into a fresh lake;

each the best of ``--runs`` after one untimed warm-up of each; every run's table must hold
exactly the records produced (read back with deltalake). ``ratio = files_s / fetch_s`` (Fetch's
throughput as a fraction of the files'). Both read the same bytes from the same page cache:
the difference is the broker's Fetch path (requests, loopback copies) against ``preadv``.
Last line: one JSON object.

    .venv/bin/python tests/perf/bench_fetch_ingest.py [--records 1000000]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import confluent_kafka as ck  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from pipelines.ingest import IngestConfig, load_config, run_ingest  # noqa: E402
from tests.fixtures.broker import BrokerProcess  # noqa: E402

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
TOPIC = "bench"


def produce(bootstrap: str, args: Any) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, args.partitions, 1)])[TOPIC].result(timeout=30)
    p = ck.Producer({"bootstrap.servers": bootstrap, "compression.type": "lz4",
                     "linger.ms": 20, "batch.size": 256 << 10, "acks": "1"})  # fmt: skip
    rnd = random.Random(24)
    values = [rnd.randbytes(args.value_bytes) for _ in range(1000)]
    for i in range(args.records):
        while True:
            try:
                p.produce(TOPIC, key=b"%d" % i, value=values[i % 1000],
                          partition=i % args.partitions)  # fmt: skip
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(120):
        raise SystemExit("records not delivered")
    return int(args.records)


def timed(spark: Any, config: IngestConfig, expected: int) -> float:
    from deltalake import DeltaTable

    t = time.perf_counter()
    summary = run_ingest(spark, config, log=lambda _msg: None)
    seconds = time.perf_counter() - t
    rows = DeltaTable(config.records_path).to_pyarrow_dataset().count_rows()
    if not (summary.committed and summary.records == expected and rows == expected):
        raise SystemExit(f"ingest landed {summary.records} records ({rows} rows), not {expected}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--config", default=str(ROOT / "conf" / "pipeline.toml"))
    args = parser.parse_args()
    from pipelines.session import get_spark

    with TemporaryDirectory() as tmp:
        b = BrokerProcess(Path(tmp) / "broker")
        b.start()
        try:
            total = produce(b.bootstrap, args)
            spark = get_spark(
                "bench-fetch-ingest",
                master="local[2]",
                conf={"spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC"},
            )
            spark.sparkContext.setLogLevel("ERROR")
            base = load_config(args.config, log_dirs=[str(b.log_dir)], lake=f"{tmp}/lake")
            base = dataclasses.replace(
                base, topics=(TOPIC,), progress_interval_s=0.0, bootstrap_servers=""
            )

            def files(n: str) -> IngestConfig:
                return dataclasses.replace(base, lake=f"{tmp}/files-{n}")

            def fetch(n: str) -> IngestConfig:
                return dataclasses.replace(
                    base, lake=f"{tmp}/fetch-{n}", log_dirs=(), bootstrap_servers=b.bootstrap
                )

            # the high watermark checkpoint must cover every record before the files run
            time.sleep(6)
            timed(spark, files("warm"), total)
            timed(spark, fetch("warm"), total)
            runs = []
            for i in range(args.runs):
                run = {"files_s": timed(spark, files(str(i)), total),
                       "fetch_s": timed(spark, fetch(str(i)), total)}  # fmt: skip
                runs.append(run)
                print(json.dumps(run), flush=True)
            spark.stop()
        finally:
            b.stop()
    files_s = min(r["files_s"] for r in runs)
    fetch_s = min(r["fetch_s"] for r in runs)
    print(
        json.dumps(
            {
                "records": total,
                "value_bytes": args.value_bytes,
                "files_s": round(files_s, 3),
                "fetch_s": round(fetch_s, 3),
                "fetch_records_per_s": round(total / fetch_s),
                "ratio": round(files_s / fetch_s, 3),
                "target": 0.5,
            }
        )
    )


if __name__ == "__main__":
    main()
