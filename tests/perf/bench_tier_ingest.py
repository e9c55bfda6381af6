"""Benchmark: ingest from the tier on the local S3 server vs the floor, ranged GETs of the same
bytes from the same server, in one run (issue 24's target: ratio >= 0.7).

A real broker (``tests.fixtures.broker.BrokerProcess``) tiers to moto's S3 server
(``tests.fixtures.s3.S3Server``, a child process) in the Aiven plugin's layout; confluent-kafka
produces ``--records`` records of ``--value-bytes`` (random, lz4, ``--partitions``
partitions) into a topic with ``remote.storage.enable=true``, ``segment.bytes``
``--segment-mb`` and ``local.retention.ms=0``; the run waits until only the active segments
are local. Then, with one Spark session (local[2]) and the shipped ``conf/pipeline.toml``:

- ``tier_s``: the ingest job with no log dirs and ``remote_log_storage`` set (the tier read by
  the executors, the active segments through Fetch), into a fresh lake; every run's table must
  hold exactly the records produced (read back with deltalake);
- ``decode_1core_s`` (a diagnostic figure): the same segments read and decoded in the bench's
  process, one at a time (:func:`pipelines.sources.tier.read_tier_range`, no Spark, nothing
  written);
- ``fetch_s`` (for comparison): the same ingest without ``remote_log_storage``: everything
  through Fetch, the broker reading its tier for the history;
- ``floor_s``: the same remote segments' ``.log`` bytes fetched with the same ranged GETs
  (:data:`pipelines.sources.tier.DEFAULT_WINDOW_BYTES` windows of whole chunks), two at a time
  (the two cores' tasks), nothing decoded or written: what reading the tier costs at least.

Each the best of ``--runs`` after one untimed warm-up of each. ``ratio = floor_s / tier_s``.
Last line: one JSON object.

    .venv/bin/python tests/perf/bench_tier_ingest.py [--records 1000000]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import confluent_kafka as ck  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from logstore.tier import layout  # noqa: E402
from pipelines.ingest import IngestConfig, load_config, run_ingest  # noqa: E402
from pipelines.sources.tier import DEFAULT_WINDOW_BYTES, remote_segments, tier_store  # noqa: E402
from tests.fixtures.broker import BrokerProcess, wait_for  # noqa: E402
from tests.fixtures.s3 import ACCESS_KEY, REGION, SECRET_KEY, S3Server  # noqa: E402

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
TOPIC = "bench"
PREFIX = "tiered"


def produce(bootstrap: str, args: Any) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    configs = {"remote.storage.enable": "true", "local.retention.ms": "0",
               "segment.bytes": str(args.segment_mb << 20)}  # fmt: skip
    admin.create_topics([NewTopic(TOPIC, args.partitions, 1, config=configs)])[TOPIC].result(30)
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


def timed(spark: Any, config: IngestConfig, expected: int, *, verbose: bool = False) -> float:
    from deltalake import DeltaTable

    t = time.perf_counter()

    def log(msg: str) -> None:
        if verbose:
            print(f"  {time.perf_counter() - t:7.3f}s {msg[:160]}", file=sys.stderr, flush=True)

    summary = run_ingest(spark, config, log=log)
    seconds = time.perf_counter() - t
    rows = DeltaTable(config.records_path).to_pyarrow_dataset().count_rows()
    if not (summary.committed and summary.records == expected and rows == expected):
        raise SystemExit(f"ingest landed {summary.records} records ({rows} rows), not {expected}")
    return seconds


def floor(root: str, bootstrap: str) -> tuple[float, int]:
    """Seconds to GET every live remote segment's bytes as the executors do, and the bytes."""
    segments = [s for segs in remote_segments(bootstrap).values() for s in segs]
    store = tier_store(root)

    def read(seg: Any) -> int:
        keys = layout.segment_keys("", seg)
        manifest = layout.parse_manifest(store.read(keys[layout.MANIFEST]), path="bench")
        chunks, got, pos = manifest.chunks, 0, 0
        while pos < chunks.file_size:
            wanted = chunks.chunks_for(pos, DEFAULT_WINDOW_BYTES)
            first, _ = chunks.chunk_range(wanted[0])
            last, n = chunks.chunk_range(wanted[-1])
            got += len(store.read_range(keys[layout.LOG], offset=first, length=last + n - first))
            pos = last + n
        return got

    t = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        total = sum(pool.map(read, segments))
    return time.perf_counter() - t, total


def decode_only(root: str, bootstrap: str) -> float:
    """Seconds to read and decode every live remote segment in this process, one at a time
    (no Spark, nothing written): where the ingest's time goes beyond the GETs."""
    from logstore.objectstore import StorageSettings
    from pipelines.sources.tier import TierRange, read_tier_range

    settings = StorageSettings.default()
    segments = [s for segs in remote_segments(bootstrap).values() for s in segs]
    t = time.perf_counter()
    for seg in segments:
        rng = TierRange(seg, seg.start_offset, seg.end_offset + 1, root, settings)
        for _batch in read_tier_range(rng, min_timestamp=-(2**63), max_timestamp=2**63 - 1):
            pass
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--segment-mb", type=int, default=8)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--verbose", action="store_true", help="the runs' log lines, timed")
    parser.add_argument("--config", default=str(ROOT / "conf" / "pipeline.toml"))
    args = parser.parse_args()
    from pipelines.session import get_spark

    s3 = S3Server()
    os.environ.update({"AWS_ENDPOINT_URL": s3.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                       "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION})  # fmt: skip
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    s3.client().create_bucket(Bucket=bucket)
    root = f"s3://{bucket}/{PREFIX}"
    with TemporaryDirectory() as tmp:
        b = BrokerProcess(
            Path(tmp) / "broker",
            remote_log_storage_system_enable="true",
            **{"remote.log.manager.task.interval.ms": "200",
               "rsm.config.storage.s3.bucket.name": bucket,
               "rsm.config.key.prefix": f"{PREFIX}/", "log.segment.delete.delay.ms": "0"},
        )  # fmt: skip
        b.start()
        try:
            total = produce(b.bootstrap, args)
            logs = [b.log_dir / f"{TOPIC}-{p}" for p in range(args.partitions)]
            wait_for(lambda: all(len(list(d.glob("*.log"))) == 1 for d in logs), 600)
            spark = get_spark(
                "bench-tier-ingest",
                master="local[2]",
                conf={"spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC"},
            )
            spark.sparkContext.setLogLevel("ERROR")
            base = dataclasses.replace(
                load_config(args.config, lake=f"{tmp}/lake"), topics=(TOPIC,),
                progress_interval_s=0.0, log_dirs=(), bootstrap_servers=b.bootstrap,
                remote_log_storage=root,
            )  # fmt: skip

            def tier(n: str) -> IngestConfig:
                return dataclasses.replace(base, lake=f"{tmp}/tier-{n}")

            def fetch(n: str) -> IngestConfig:
                return dataclasses.replace(base, lake=f"{tmp}/fetch-{n}", remote_log_storage="")

            timed(spark, tier("warm"), total)
            floor(root, b.bootstrap)
            decode_only(root, b.bootstrap)
            runs = []
            for i in range(args.runs):
                floor_s, tier_bytes = floor(root, b.bootstrap)
                tier_s = timed(spark, tier(str(i)), total, verbose=args.verbose)
                run = {"tier_s": tier_s, "floor_s": floor_s,
                       "fetch_s": timed(spark, fetch(str(i)), total),
                       "decode_1core_s": decode_only(root, b.bootstrap),
                       "tier_bytes": tier_bytes}  # fmt: skip
                runs.append(run)
                print(json.dumps(run), flush=True)
            spark.stop()
        finally:
            b.stop()
            s3.close()
    tier_s = min(r["tier_s"] for r in runs)
    floor_s = min(r["floor_s"] for r in runs)
    print(
        json.dumps(
            {
                "records": total,
                "value_bytes": args.value_bytes,
                "tier_bytes": runs[-1]["tier_bytes"],
                "tier_s": round(tier_s, 3),
                "floor_s": round(floor_s, 3),
                "decode_1core_s": round(min(r["decode_1core_s"] for r in runs), 3),
                "fetch_s": round(min(r["fetch_s"] for r in runs), 3),
                "tier_records_per_s": round(total / tier_s),
                "ratio": round(floor_s / tier_s, 3),
                "target": 0.7,
            }
        )
    )


if __name__ == "__main__":
    main()
