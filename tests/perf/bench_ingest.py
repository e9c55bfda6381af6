"""Benchmark: segments -> Arrow through Spark (local[2]) vs baselines measured in this run.

Writes a log dir through the storage engine (``Log.append``): ``--records`` records of
``--value-bytes`` (12-byte keys, a header on every 10th record) per codec (``none``, ``lz4``),
with a ``replication-offset-checkpoint`` whose high watermarks cover every record. Per codec
two figures:

- ``source_only``: ``read_segments(...).write.format("noop")`` — every row decoded and handed
  to the JVM as Arrow, nothing written;
- ``end_to_end``: the real ingest job, ``pipelines.ingest.run_ingest`` with
  ``conf/pipeline.toml``'s ``[ingest]`` settings (``--verify`` overrides), from the same log
  dir into a fresh lake: the ``kind=batches`` scan (progress and quarantine), then the records
  appended to the Delta ``records`` table with the progress in the same commit. The row count
  of the table (read back with ``deltalake``) must equal the records written.

Both are compared against:

- (a) Spark's pass-through ``mapInArrow`` (identity) of a JVM-generated DataFrame with the same
  row count and schema (keys and values of the same widths), also written to ``noop``;
- (b) kafka-python's pure-Python decoder over the same segment files in one process (a
  ``--baseline-records`` prefix, as records/s).

Targets (issue 4): >= 1M records/s end to end, >= 0.5 of (a), >= 20x (b). A warm-up read
starts the Python workers and loads the compiled kernels first. Last line: one JSON object.

    .venv/bin/python tests/perf/bench_ingest.py [--records 10000000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from logstore.protocol.batch import Codec
from logstore.protocol.records import build_batch
from pipelines.ingest import IngestConfig, load_config, run_ingest
from pipelines.sources import RECORDS_SCHEMA, read_segments
from pipelines.sources.synthetic import write_batches, write_high_watermarks

ROOT = Path(__file__).resolve().parents[2]

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def distinct_batches(batch_records: int, value_bytes: int, codec: Codec) -> list[bytearray]:
    rng = np.random.default_rng(5)
    out = []
    for b in range(8):
        recs = []
        for i in range(batch_records):
            half = value_bytes // 2
            value = rng.bytes(half) + bytes([b + i % 7]) * (value_bytes - half)
            headers = [("trace", b"%08d" % i)] if i % 10 == 0 else []
            recs.append((b"key-%08d" % i, value, headers, 1_700_000_000_000 + i))
        out.append(build_batch(recs, codec=codec))
    return out


def write_topic(log_dir: Path, topic: str, records: int, codec: Codec, args: Any) -> int:
    batches = distinct_batches(args.batch_records, args.value_bytes, codec)
    count = records // args.batch_records
    gen = (batches[i % len(batches)] for i in range(count))
    written, _ = write_batches(log_dir, topic, 0, gen, segment_bytes=args.segment_bytes)
    return written


def ingest_config(log_dir: Path, lake: Path, topic: str, args: Any) -> IngestConfig:
    """The shipped ``conf/pipeline.toml`` settings, pointed at ``log_dir``/``lake``/``topic``."""
    config = load_config(args.config, log_dirs=[str(log_dir)], lake=str(lake))
    changes: dict[str, Any] = {"topics": (topic,), "progress_interval_s": 0.0}
    if args.verify:
        changes["verify"] = args.verify
    return dataclasses.replace(config, **changes)


def timed_ingest(spark: Any, config: IngestConfig, expected: int) -> tuple[float, dict[str, Any]]:
    """One ``run_ingest`` into a fresh lake; checks every record landed, exactly once."""
    from deltalake import DeltaTable

    shutil.rmtree(config.lake, ignore_errors=True)
    t = time.perf_counter()
    summary = run_ingest(spark, config, log=lambda _msg: None)
    seconds = time.perf_counter() - t
    rows = DeltaTable(config.records_path).to_pyarrow_dataset().count_rows()
    if not (summary.committed and summary.records == expected and rows == expected):
        raise SystemExit(
            f"ingest landed {summary.records} records ({rows} rows in the table), "
            f"expected {expected}: {summary.describe()}"
        )
    if summary.corrupt_batches or summary.gaps:
        raise SystemExit(f"unexpected damage or gaps: {summary.describe()}")
    shutil.rmtree(config.lake, ignore_errors=True)
    return seconds, summary.to_json()


def figures(n: int, size: int, secs: float, pass_rate: float, kp: float) -> dict[str, float]:
    rate = n / secs
    return {
        "seconds": secs,
        "records_per_s": rate,
        "mb_per_s": size / secs / 1e6,
        "vs_passthrough": rate / pass_rate,
        "vs_kafka_python": rate / kp,
    }


def timed_noop(df: Any) -> float:
    t = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - t


def passthrough(spark: Any, n: int, partitions: int, args: Any) -> float:
    key_hex = "6b65792d" + "30" * 8  # 12 bytes, like "key-00000001"
    df = spark.range(0, n, numPartitions=partitions).selectExpr(
        "'bench' AS topic",
        "0 AS partition",
        "id AS offset",
        "timestamp_millis(1700000000000 + id) AS timestamp",
        "0 AS timestamp_type",
        f"unhex('{key_hex}') AS key",
        f"unhex(repeat('ab', {args.value_bytes})) AS value",
        "CAST(array() AS array<struct<key:string,value:binary>>) AS headers",
        "-1L AS producer_id",
        "CAST(-1 AS smallint) AS producer_epoch",
        "-1 AS base_sequence",
        "false AS is_transactional",
        "0 AS leader_epoch",
        "0L AS segment_base_offset",
        "id AS batch_position",
        "'lz4' AS codec",
        "DATE'2023-11-14' AS date",
    )
    schema = df.schema
    assert [f.name for f in schema] == [f.name for f in RECORDS_SCHEMA]
    return timed_noop(df.mapInArrow(lambda it: it, schema))


def kafka_python_rate(part_dir: Path, limit: int) -> float:
    from kafka.record.default_records import DefaultRecordBatch

    n = 0
    t = time.perf_counter()
    for seg in sorted(part_dir.glob("*.log")):
        buf = seg.read_bytes()
        pos = 0
        while pos + 12 <= len(buf) and n < limit:
            size = int.from_bytes(buf[pos + 8 : pos + 12], "big") + 12
            for _ in DefaultRecordBatch(bytearray(buf[pos : pos + size])):
                n += 1
            pos += size
        if n >= limit:
            break
    return n / (time.perf_counter() - t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--batch-records", type=int, default=200)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--segment-bytes", type=int, default=128 << 20)
    parser.add_argument("--baseline-records", type=int, default=200_000)
    parser.add_argument("--keep", help="reuse/keep the log dir here instead of a temp dir")
    parser.add_argument("--config", default=str(ROOT / "conf" / "pipeline.toml"))
    parser.add_argument(
        "--verify", choices=("crc", "full"), help="override [ingest] verify of --config"
    )
    parser.add_argument(
        "--ingest-runs", type=int, default=1, help="end-to-end runs per codec (best is kept)"
    )
    args = parser.parse_args()

    from pipelines.session import get_spark

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    log_dir = work / "logs"
    lake = work / "lake"
    per_topic = args.records // args.batch_records * args.batch_records
    results: dict[str, Any] = {
        "bench": "ingest",
        "records": args.records,
        "value_bytes": args.value_bytes,
        "master": "local[2]",
        "load_avg_1m_start": os.getloadavg()[0],
    }
    try:
        for codec in (Codec.NONE, Codec.LZ4):
            topic = f"bench-{codec.label}"
            if not (log_dir / f"{topic}-0").is_dir():
                t = time.perf_counter()
                write_topic(log_dir, topic, args.records, codec, args)
                print(f"wrote {topic} in {time.perf_counter() - t:.1f}s", file=sys.stderr)
        if not (log_dir / "warmup-0").is_dir():
            write_topic(log_dir, "warmup", 10_000, Codec.LZ4, args)
        # The broker's high watermarks: every record written is committed, so the job's
        # default ``until`` covers all of them.
        ends = {(f"bench-{c.label}", 0): per_topic for c in (Codec.NONE, Codec.LZ4)}
        write_high_watermarks(log_dir, {**ends, ("warmup", 0): 10_000})
        spark = get_spark(
            "bench-ingest",
            master="local[2]",
            conf={"spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC"},
        )
        spark.sparkContext.setLogLevel("ERROR")
        timed_noop(read_segments(spark, str(log_dir), topics="warmup"))
        timed_ingest(spark, ingest_config(log_dir, lake, "warmup", args), 10_000)
        results["verify"] = ingest_config(log_dir, lake, "warmup", args).verify
        for codec in (Codec.NONE, Codec.LZ4):
            topic = f"bench-{codec.label}"
            df = read_segments(spark, str(log_dir), topics=topic, until="latest")
            partitions = df.rdd.getNumPartitions()
            n = (
                df.count()
                if args.records <= 2_000_000
                else args.records // args.batch_records * args.batch_records
            )
            if n != per_topic:
                raise SystemExit(f"{topic}: the source reads {n} records, {per_topic} written")
            seconds = min(timed_noop(df) for _ in range(2))
            base = min(passthrough(spark, n, partitions, args) for _ in range(2))
            size = sum(p.stat().st_size for p in (log_dir / f"{topic}-0").glob("*.log"))
            kp = kafka_python_rate(log_dir / f"{topic}-0", args.baseline_records)
            config = ingest_config(log_dir, lake, topic, args)
            runs = [timed_ingest(spark, config, n) for _ in range(max(1, args.ingest_runs))]
            e2e_seconds, summary = min(runs, key=lambda run: run[0])
            pass_rate = n / base

            r: dict[str, Any] = {
                "rows": n,
                "input_partitions": partitions,
                "segment_bytes": size,
                "passthrough_mapinarrow_records_per_s": pass_rate,
                "kafka_python_records_per_s": kp,
                "source_only": figures(n, size, seconds, pass_rate, kp),
                "end_to_end": {
                    **figures(n, size, e2e_seconds, pass_rate, kp),
                    "all_runs_seconds": [run[0] for run in runs],
                    "ingest_summary_seconds": summary["seconds"],
                    "table_rows": n,
                },
            }
            results[codec.label] = r
            for name in ("source_only", "end_to_end"):
                f = r[name]
                print(
                    f"{codec.label:5s} {name:11s} {f['records_per_s'] / 1e6:6.2f} M rec/s "
                    f"({f['mb_per_s']:6.1f} MB/s) pass-through "
                    f"{pass_rate / 1e6:6.2f} M rec/s (x{f['vs_passthrough']:.2f}), "
                    f"kafka-python {kp / 1e3:6.1f} k rec/s (x{f['vs_kafka_python']:.0f})",
                    file=sys.stderr,
                )
        spark.stop()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    results["load_avg_1m_end"] = os.getloadavg()[0]
    print(json.dumps(results))


if __name__ == "__main__":
    main()
