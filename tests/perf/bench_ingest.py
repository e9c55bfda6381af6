"""Benchmark: segments -> Arrow through Spark (local[2]) vs baselines measured in this run.

Writes a log dir through the storage engine (``Log.append``): ``--records`` records of
``--value-bytes`` (12-byte keys, a header on every 10th record) per codec (``none``, ``lz4``),
then times, per codec, ``read_segments(...).write.format("noop")`` — every row decoded and
handed to the JVM as Arrow — against:

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
from pipelines.sources import RECORDS_SCHEMA, read_segments
from pipelines.sources.synthetic import write_batches

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
    args = parser.parse_args()

    from pipelines.session import get_spark

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    log_dir = work / "logs"
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
        write_topic(log_dir, "warmup", 10_000, Codec.LZ4, args)
        spark = get_spark(
            "bench-ingest",
            master="local[2]",
            conf={"spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC"},
        )
        spark.sparkContext.setLogLevel("ERROR")
        timed_noop(read_segments(spark, str(log_dir), topics="warmup"))
        for codec in (Codec.NONE, Codec.LZ4):
            topic = f"bench-{codec.label}"
            df = read_segments(spark, str(log_dir), topics=topic, until="latest")
            partitions = df.rdd.getNumPartitions()
            n = (
                df.count()
                if args.records <= 2_000_000
                else args.records // args.batch_records * args.batch_records
            )
            seconds = min(timed_noop(df) for _ in range(2))
            base = min(passthrough(spark, n, partitions, args) for _ in range(2))
            size = sum(p.stat().st_size for p in (log_dir / f"{topic}-0").glob("*.log"))
            kp = kafka_python_rate(log_dir / f"{topic}-0", args.baseline_records)
            r = {
                "rows": n,
                "input_partitions": partitions,
                "segment_bytes": size,
                "seconds": seconds,
                "records_per_s": n / seconds,
                "mb_per_s": size / seconds / 1e6,
                "passthrough_mapinarrow_records_per_s": n / base,
                "kafka_python_records_per_s": kp,
            }
            r["vs_passthrough"] = r["records_per_s"] / r["passthrough_mapinarrow_records_per_s"]
            r["vs_kafka_python"] = r["records_per_s"] / kp
            results[codec.label] = r
            print(
                f"{codec.label:5s} {r['records_per_s'] / 1e6:6.2f} M rec/s "
                f"({r['mb_per_s']:6.1f} MB/s) pass-through "
                f"{r['passthrough_mapinarrow_records_per_s'] / 1e6:6.2f} M rec/s "
                f"(x{r['vs_passthrough']:.2f}), kafka-python {kp / 1e3:6.1f} k rec/s "
                f"(x{r['vs_kafka_python']:.0f})",
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
