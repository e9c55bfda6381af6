"""Benchmark: segments -> Arrow through Spark (local[2]) vs baselines measured in this run.

Writes a log dir through the storage engine (``Log.append``): ``--records`` records of
``--value-bytes`` (12-byte keys, a header on every 10th record) per codec (``none``, ``lz4``),
with a ``replication-offset-checkpoint`` whose high watermarks cover every record. Every
record's key, value and header value is distinct (a per-record counter inside each; values
half random bytes, half compressible) and timestamps increase by 1 ms per record, so the
Parquet files cost what real data costs (see ``UniqueBatches``). Per codec two figures:

- ``source_only``: ``read_segments(...).write.format("noop")`` — every row decoded and handed
  to the JVM as Arrow, nothing written;
- ``end_to_end``: the real ingest job, ``pipelines.ingest.run_ingest`` with
  ``conf/pipeline.toml``'s ``[ingest]`` settings (``--compression`` overrides the Parquet
  codec), from the same log dir into a fresh lake: every record decoded, written as Parquet
  and committed to the Delta ``records`` table with the progress in the same commit. The row
  count of the table (read back with ``deltalake``) must equal the records written.

Both are compared against:

- (a) Spark's pass-through ``mapInArrow`` (identity) of a JVM-generated DataFrame with the same
  row count and schema (keys and values of the same widths), also written to ``noop``;
- (b) kafka-python's pure-Python decoder over the same segment files in one process (a
  ``--baseline-records`` prefix, as records/s): one pass right before each timed end-to-end
  run, after a warm-up pass; the best pass is the baseline, and each run's ratio to its own
  pass gives a paired median (robust to the machine's drift).

Targets (issue 4): >= 1M records/s end to end, >= 0.5 of (a), >= 20x (b). A warm-up read
starts the Python workers and loads the compiled kernels first. The end-to-end figure is the
best of ``--ingest-runs`` timed runs (their median is reported too) after
``--ingest-warmup-runs`` untimed ones: over the first runs of a session the driver JVM's JIT
compiles Spark's per-job code (ClosureCleaner's ASM class reader, Java deserialization) on one
of the two cores, measured at 0.3-0.6 s of C2 compiler time per run for the first ~5 runs and
~0.06 s after; each timed run's compile time is reported (``driver_jit_ms``). A fresh
``spark-submit`` pays that once per job; a cold job is timed by hand (see the issue's notes),
this bench measures the pipeline's steady state. Each run's CPU-seconds (the process tree:
driver, JVM, Python workers; steadier than wall-clock on a shared machine) are reported too,
as ``cpu_ns_per_record`` (median). ``--isolation`` overrides the config's; with
``--paired-isolation`` every timed run is followed by one with that isolation, and the
per-round CPU and wall ratios are reported (what ``read_committed`` costs over
``read_uncommitted``). Last line: one JSON object.

    .venv/bin/python tests/perf/bench_ingest.py [--records 10000000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from logstore.protocol.batch import (
    BASE_TIMESTAMP_OFFSET,
    CRC_OFFSET,
    HEADER_SIZE,
    LENGTH_OFFSET,
    LOG_OVERHEAD,
    MAX_TIMESTAMP_OFFSET,
    Codec,
    compute_crc,
)
from logstore.protocol.codecs import compress
from logstore.protocol.records import build_batch
from pipelines.ingest import IngestConfig, load_config, run_ingest
from pipelines.sources import RECORDS_SCHEMA, read_segments
from pipelines.sources.synthetic import write_batches, write_high_watermarks

ROOT = Path(__file__).resolve().parents[2]

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")


class UniqueBatches:
    """Batches in which every record's key, value and header value is distinct.

    Record ``seq`` (0, 1, 2 ... over the whole topic) has key ``key-<seq:08d>``, a value of
    ``value_bytes // 2`` random bytes then ``<seq:08d>`` and one repeated byte (the
    compressible half), a ``trace`` header ``<seq:08d>`` on every 10th record, and timestamp
    ``_T0 + seq`` ms (all on one day). Nothing repeats, so Parquet's dictionary encoding gets
    no help that real data would not give it.

    Building 10M records one Python object at a time would take minutes, so one template batch
    is built by ``build_batch`` and then patched with numpy, ``per_chunk`` batches at a time:
    the records section keeps its layout (same lengths, same varints), only bytes change. Per
    batch, baseTimestamp/maxTimestamp are rewritten, an lz4 batch gets its section compressed
    by ``logstore.protocol.codecs.compress`` (build_batch's framing) and its batchLength set,
    and the CRC is recomputed.
    """

    _T0 = 1_699_920_000_000  # 2023-11-14T00:00:00Z: 10M records at 1 ms stay on one day

    def __init__(self, batch_records: int, value_bytes: int, codec: Codec) -> None:
        if value_bytes < 16:
            raise SystemExit("--value-bytes must be at least 16 (random half + 8-digit counter)")
        self.n = batch_records
        self.codec = codec
        self.half = value_bytes // 2
        self.fill = value_bytes - self.half - 8
        recs = [
            (
                b"key-%08d" % i,
                b"V%07d" % i + bytes(value_bytes - 8),
                [("trace", b"H%07d" % i)] if i % 10 == 0 else [],
                self._T0 + i,
            )
            for i in range(batch_records)
        ]
        plain = build_batch(recs)
        self.header = bytes(build_batch(recs, codec=codec)[:HEADER_SIZE])
        section = bytes(plain[HEADER_SIZE:])
        self.section = np.frombuffer(section, np.uint8)
        self.key_at = self._find(section, [b"key-%08d" % i for i in range(self.n)]) + 4
        self.value_at = self._find(section, [r[1][:8] for r in recs])
        self.header_at = self._find(section, [b"H%07d" % i for i in range(0, self.n, 10)])
        self.rng = np.random.default_rng(5)

    @staticmethod
    def _find(section: bytes, markers: list[bytes]) -> np.ndarray:
        at = [section.find(m) for m in markers]
        if any(p < 0 or section.find(m, p + 1) >= 0 for p, m in zip(at, markers, strict=True)):
            raise AssertionError("template markers are not unique")
        return np.array(at, np.int64)

    def batches(self, first_seq: int, count: int, per_chunk: int = 256) -> Iterator[bytearray]:
        """``count`` batches whose first record is ``first_seq``."""
        if first_seq + count * self.n > 10**8:
            raise SystemExit("at most 10^8 records (8-digit counters)")
        eight = np.arange(8)
        for start in range(0, count, per_chunk):
            nb = min(per_chunk, count - start)
            seq0 = first_seq + start * self.n
            seq = seq0 + np.arange(nb * self.n, dtype=np.int64).reshape(nb, self.n)
            digits = (seq[:, :, None] // 10 ** (7 - eight) % 10 + 48).astype(np.uint8)
            sec = np.tile(self.section, (nb, 1))
            sec[:, self.key_at[:, None] + eight] = digits
            v = self.value_at[:, None]
            sec[:, v + np.arange(self.half)] = self.rng.integers(
                0, 256, (nb, self.n, self.half), np.uint8
            )
            sec[:, v + self.half + eight] = digits
            fill = (97 + seq % 7).astype(np.uint8)[:, :, None]
            sec[:, v + self.half + 8 + np.arange(self.fill)] = fill
            sec[:, self.header_at[:, None] + eight] = digits[:, ::10]
            for b in range(nb):
                ts = self._T0 + seq0 + b * self.n
                payload = compress(self.codec, sec[b])
                out = bytearray(self.header)
                out += payload
                _I32.pack_into(out, LENGTH_OFFSET, len(out) - LOG_OVERHEAD)
                _I64.pack_into(out, BASE_TIMESTAMP_OFFSET, ts)
                _I64.pack_into(out, MAX_TIMESTAMP_OFFSET, ts + self.n - 1)
                _U32.pack_into(out, CRC_OFFSET, compute_crc(out, 0, len(out)))
                yield out


def write_topic(
    log_dir: Path, topic: str, records: int, codec: Codec, args: Any, *, partition: int = 0
) -> int:
    gen = UniqueBatches(args.batch_records, args.value_bytes, codec)
    count = records // args.batch_records
    written, _ = write_batches(
        log_dir, topic, partition, gen.batches(0, count), segment_bytes=args.segment_bytes
    )
    return written


def ingest_config(log_dir: Path, lake: Path, topic: str, args: Any) -> IngestConfig:
    """The shipped ``conf/pipeline.toml`` settings, pointed at ``log_dir``/``lake``/``topic``."""
    config = load_config(args.config, log_dirs=[str(log_dir)], lake=str(lake))
    changes: dict[str, Any] = {"topics": (topic,), "progress_interval_s": 0.0}
    if args.compression:
        changes["compression"] = args.compression
    if args.isolation:
        changes["isolation"] = args.isolation
    return dataclasses.replace(config, **changes)


_TICKS = os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds() -> float:
    """User + system CPU-seconds of this process and every live descendant (the driver JVM
    and its Python workers), their reaped children's included (a Python worker that exited
    is in its parent's ``cutime``/``cstime``), from ``/proc``: steadier than wall-clock on a
    shared machine."""
    children: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            raw = stat.read_text()
        except OSError:  # exited meanwhile
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        pid = int(stat.parent.name)
        children.setdefault(int(fields[1]), []).append(pid)
        cpu[pid] = sum(int(v) for v in fields[11:15]) / _TICKS
    total, todo = 0.0, [os.getpid()]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo.extend(children.get(pid, ()))
    return total


def timed_ingest(spark: Any, config: IngestConfig, expected: int) -> tuple[float, dict[str, Any]]:
    """One ``run_ingest`` into a fresh lake; checks every record landed, exactly once. The
    summary gets ``cpu_seconds``: the process tree's CPU during the run (driver, JVM,
    workers)."""
    from deltalake import DeltaTable

    shutil.rmtree(config.lake, ignore_errors=True)
    cpu = tree_cpu_seconds()
    t = time.perf_counter()
    summary = run_ingest(spark, config, log=lambda _msg: None)
    seconds = time.perf_counter() - t
    cpu = tree_cpu_seconds() - cpu
    rows = DeltaTable(config.records_path).to_pyarrow_dataset().count_rows()
    if not (summary.committed and summary.records == expected and rows == expected):
        raise SystemExit(
            f"ingest landed {summary.records} records ({rows} rows in the table), "
            f"expected {expected}: {summary.describe()}"
        )
    if summary.corrupt_batches or summary.gaps:
        raise SystemExit(f"unexpected damage or gaps: {summary.describe()}")
    shutil.rmtree(config.lake, ignore_errors=True)
    return seconds, {**summary.to_json(), "cpu_seconds": cpu}


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
        "timestamp_millis(1699920000000 + id) AS timestamp",
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


def kafka_python_once(part_dir: Path, limit: int) -> float:
    """Records/s of kafka-python's pure-Python decoder over the first ``limit`` records."""
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
    parser.add_argument(
        "--baseline-records", type=int, default=200_000, help="records per kafka-python pass"
    )
    parser.add_argument("--keep", help="reuse/keep the log dir here instead of a temp dir")
    parser.add_argument("--config", default=str(ROOT / "conf" / "pipeline.toml"))
    parser.add_argument(
        "--compression", help="override [ingest] compression of --config (Parquet codec)"
    )
    parser.add_argument(
        "--isolation",
        choices=("read_committed", "read_uncommitted"),
        help="override [ingest] isolation of --config",
    )
    parser.add_argument(
        "--paired-isolation",
        choices=("read_committed", "read_uncommitted"),
        help="after each timed run, one run with this isolation too (CPU and wall per round)",
    )
    parser.add_argument(
        "--codecs", default="none,lz4", help="comma-separated topics' codecs to measure"
    )
    parser.add_argument(
        "--ingest-runs", type=int, default=5, help="timed end-to-end runs per codec (best kept)"
    )
    parser.add_argument(
        "--ingest-warmup-runs", type=int, default=2, help="untimed end-to-end runs per codec first"
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
    codecs = [c for c in (Codec.NONE, Codec.LZ4) if c.label in args.codecs.split(",")]
    try:
        for codec in codecs:
            topic = f"bench-{codec.label}"
            if not (log_dir / f"{topic}-0").is_dir():
                t = time.perf_counter()
                write_topic(log_dir, topic, args.records, codec, args)
                print(f"wrote {topic} in {time.perf_counter() - t:.1f}s", file=sys.stderr)
        # Two warm-up partitions: two tasks at once, so both Python workers of local[2] have
        # started and loaded the kernels before anything is timed.
        for partition in (0, 1):
            if not (log_dir / f"warmup-{partition}").is_dir():
                write_topic(log_dir, "warmup", 10_000, Codec.LZ4, args, partition=partition)
        # The broker's high watermarks: every record written is committed, so the job's
        # default ``until`` covers all of them.
        ends = {(f"bench-{c.label}", 0): per_topic for c in codecs}
        write_high_watermarks(log_dir, {**ends, ("warmup", 0): 10_000, ("warmup", 1): 10_000})
        spark = get_spark(
            "bench-ingest",
            master="local[2]",
            conf={"spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC"},
        )
        spark.sparkContext.setLogLevel("ERROR")
        # The driver JVM's JIT compile time during each timed run (its compiler threads share
        # the two cores with the Python workers): how settled the JVM was.
        jit = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getCompilationMXBean()
        timed_noop(read_segments(spark, str(log_dir), topics="warmup"))
        timed_ingest(spark, ingest_config(log_dir, lake, "warmup", args), 20_000)
        settings = dataclasses.asdict(ingest_config(log_dir, lake, "warmup", args))
        for where in ("log_dirs", "lake", "topics"):
            settings.pop(where)
        results["ingest_config"] = settings
        for codec in codecs:
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
            part_dir = log_dir / f"{topic}-0"
            size = sum(p.stat().st_size for p in part_dir.glob("*.log"))
            config = ingest_config(log_dir, lake, topic, args)
            kafka_python_once(part_dir, min(args.baseline_records, 20_000))  # warm-up pass
            for _ in range(args.ingest_warmup_runs):
                timed_ingest(spark, config, n)
            # Each timed run right after a kafka-python pass: this machine's speed drifts by
            # 20-30% over minutes, and a pair sees the same machine.
            kp_runs: list[float] = []
            runs: list[tuple[float, dict[str, Any]]] = []
            jit_ms: list[int] = []
            other = None
            if args.paired_isolation:
                other = dataclasses.replace(config, isolation=args.paired_isolation)
                timed_ingest(spark, other, n)  # its warm-up
            others: list[tuple[float, dict[str, Any]]] = []
            for _ in range(max(1, args.ingest_runs)):
                kp_runs.append(kafka_python_once(part_dir, args.baseline_records))
                compiled = jit.getTotalCompilationTime()
                runs.append(timed_ingest(spark, config, n))
                jit_ms.append(jit.getTotalCompilationTime() - compiled)
                if other is not None:
                    others.append(timed_ingest(spark, other, n))
            kp = max(kp_runs)
            e2e_seconds, summary = min(runs, key=lambda run: run[0])
            median_seconds = statistics.median(run[0] for run in runs)
            paired = [n / run[0] / rate for run, rate in zip(runs, kp_runs, strict=True)]
            pass_rate = n / base

            r: dict[str, Any] = {
                "rows": n,
                "input_partitions": partitions,
                "segment_bytes": size,
                "passthrough_mapinarrow_records_per_s": pass_rate,
                "kafka_python_records_per_s": kp,
                "kafka_python_runs_records_per_s": kp_runs,
                "source_only": figures(n, size, seconds, pass_rate, kp),
                "end_to_end": {
                    **figures(n, size, e2e_seconds, pass_rate, kp),
                    "all_runs_seconds": [run[0] for run in runs],
                    "warmup_runs": args.ingest_warmup_runs,
                    "paired_vs_kafka_python": paired,
                    "paired_vs_kafka_python_median": statistics.median(paired),
                    "driver_jit_ms": jit_ms,
                    "median": figures(n, size, median_seconds, pass_rate, kp),
                    "ingest_summary_seconds": summary["seconds"],
                    "cpu_seconds": [run[1]["cpu_seconds"] for run in runs],
                    "cpu_ns_per_record": statistics.median(run[1]["cpu_seconds"] for run in runs)
                    / n
                    * 1e9,
                    "table_rows": n,
                    **(
                        {
                            "paired_isolation": args.paired_isolation,
                            "paired_isolation_seconds": [o[0] for o in others],
                            "paired_isolation_cpu_seconds": [o[1]["cpu_seconds"] for o in others],
                            # per round: this config's run / the other isolation's (CPU, wall)
                            "cpu_ratio_to_paired_isolation": [
                                r[1]["cpu_seconds"] / o[1]["cpu_seconds"]
                                for r, o in zip(runs, others, strict=True)
                            ],
                            "wall_ratio_to_paired_isolation": [
                                r[0] / o[0] for r, o in zip(runs, others, strict=True)
                            ],
                        }
                        if others
                        else {}
                    ),
                },
            }
            results[codec.label] = r
            for name in ("source_only", "end_to_end"):
                f = r[name]
                print(
                    f"{codec.label:5s} {name:11s} {f['records_per_s'] / 1e6:6.2f} M rec/s "
                    f"({f['mb_per_s']:6.1f} MB/s) pass-through "
                    f"{pass_rate / 1e6:6.2f} M rec/s (x{f['vs_passthrough']:.2f}), "
                    f"kafka-python {kp / 1e3:6.1f} k rec/s (x{f['vs_kafka_python']:.1f})"
                    + (
                        f"; median of the runs paired with a kafka-python pass "
                        f"x{f['paired_vs_kafka_python_median']:.1f}"
                        if "median" in f
                        else ""
                    )
                    + (f"; {f['cpu_ns_per_record']:.0f} CPU-ns/record" if "median" in f else ""),
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
