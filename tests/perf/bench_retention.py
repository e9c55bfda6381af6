"""Benchmark: retention planning on Spark (local[2]) vs a single-process scan of the same dirs.

Generates a log dir of ``--partitions`` partitions x ``--segments`` segments with only what
planning reads (``tests.fixtures.retention_logdirs``: sparse ``.log`` files of the given
sizes and mtimes, two-entry ``.timeindex`` files, topic configs over 10 topics, the two
checkpoints). Timestamps and sizes vary so that every rule fires somewhere. Then, from the
same ``build_tasks`` output, times:

- ``single``: ``plan_local`` (scan + plan of every partition in this process);
- ``spark``: ``plan_spark`` on ``local[2]`` (a few slices per core, executors scan and plan,
  plans collected), after one untimed warm-up job (Python workers started); the cold first
  job is reported too.

Both must give the same plans. Each figure is the best of ``--runs``; the driver-side
``build_tasks`` (listing the log dir, reading checkpoints and configs) is timed separately
and is the same for both; ``single_cpu_s`` is the single scan's CPU time (its wall time minus
that is waiting for file metadata: planning is I/O-bound once the inodes are not cached).
Smaller prefixes of the partitions (``--steps``) show where Spark
overtakes the single process. Target (issue 13): planning < 30 s at 10,000 x 20 and Spark
not slower than the single process there. Last line: one JSON object.

    .venv/bin/python tests/perf/bench_retention.py [--partitions 10000] [--segments 20]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from logstore.storage.checkpoints import write_offset_checkpoint  # noqa: E402
from logstore.storage.config import LogConfig  # noqa: E402
from logstore.storage.files import (  # noqa: E402
    LOG_START_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
)
from pipelines.retention.job import build_tasks, plan_local, plan_spark  # noqa: E402
from pipelines.retention.model import ModelPartition, ModelSegment  # noqa: E402
from pipelines.session import get_spark  # noqa: E402
from tests.fixtures.retention_logdirs import write_log_dir, write_partition  # noqa: E402

NOW = int(time.time() * 1000)


def _partition(i: int, segments: int) -> tuple[tuple[str, int], ModelPartition]:
    rnd = random.Random(i)
    base, segs = 0, []
    for j in range(segments):
        age = (segments - j) * 3_600_000 + rnd.randint(0, 1_800_000)
        ts = None if rnd.random() < 0.02 else NOW - age
        segs.append(ModelSegment(base, rnd.randint(1 << 20, 1 << 24), ts, NOW - age))
        base += rnd.randint(1000, 50_000)
    return (f"topic{i % 10}", i // 10), ModelPartition(segs, 0, 0, "delete", 0, base, base)


def _write_some(log_dir: Path, partitions: int, segments: int, worker: int, workers: int) -> None:
    for i in range(worker, partitions, workers):
        (topic, p), part = _partition(i, segments)
        write_partition(log_dir / f"{topic}-{p}", part.segments)


def generate(log_dir: Path, partitions: int, segments: int) -> dict[tuple[str, int], int]:
    """Write the log dir (two processes); returns each partition's end (= ingest progress)."""
    log_dir.mkdir(parents=True)
    workers = 2
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        pool.starmap(
            _write_some, [(log_dir, partitions, segments, w, workers) for w in range(workers)]
        )
    ends = {
        tp: part.high_watermark
        for tp, part in map(_partition, range(partitions), [segments] * partitions)
    }
    configs = {
        f"topic{t}": {
            "retention.ms": str(3_600_000 * (4 + 2 * t)),
            "retention.bytes": str(-1 if t % 3 else 150 << 20),
            "cleanup.policy": "compact" if t == 9 else ("compact,delete" if t == 8 else "delete"),
        }
        for t in range(10)
    }
    write_log_dir(log_dir, {}, configs)
    write_offset_checkpoint(log_dir / LOG_START_OFFSET_CHECKPOINT, dict.fromkeys(ends, 0))
    write_offset_checkpoint(log_dir / REPLICATION_OFFSET_CHECKPOINT, ends)  # type: ignore[arg-type]
    return ends  # type: ignore[return-value]


def _best(fn: Any, runs: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _key(plans: list[Any]) -> list[Any]:
    return sorted((p.topic, p.partition, p.new_log_start, len(p.decisions)) for p in plans)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitions", type=int, default=10_000)
    ap.add_argument("--segments", type=int, default=20)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--steps", default="100,1000,3000")
    ap.add_argument("--keep", help="reuse/keep the generated log dir here")
    args = ap.parse_args()
    tmp = Path(args.keep or tempfile.mkdtemp(prefix="bench-retention-"))
    log_dir = tmp / "logs"
    result: dict[str, Any] = {"partitions": args.partitions, "segments": args.segments}
    try:
        if not log_dir.is_dir():
            t0 = time.perf_counter()
            generate(log_dir, args.partitions, args.segments)
            result["generate_s"] = round(time.perf_counter() - t0, 2)
        # every partition fully ingested: the lake bound holds nothing back
        progress = {
            tp: part.high_watermark
            for tp, part in (_partition(i, args.segments) for i in range(args.partitions))
        }
        t0 = time.perf_counter()
        tasks = build_tasks([str(log_dir)], LogConfig(), progress, None)  # type: ignore[arg-type]
        result["build_tasks_s"] = round(time.perf_counter() - t0, 3)
        spark = get_spark("bench-retention", master="local[2]")
        t0 = time.perf_counter()
        plan_spark(spark, tasks[:200], now_ms=NOW, force=False)
        result["spark_cold_first_job_s"] = round(time.perf_counter() - t0, 3)
        curve = []
        for n in [*(int(s) for s in args.steps.split(",") if s), len(tasks)]:
            sub = tasks[:n]
            cpu0 = time.process_time()
            single_s, single = _best(
                lambda s=sub: plan_local(s, now_ms=NOW, force=False), args.runs
            )
            single_cpu_s = (time.process_time() - cpu0) / args.runs
            spark_s, dist = _best(
                lambda s=sub: plan_spark(spark, s, now_ms=NOW, force=False), args.runs
            )
            assert _key(single) == _key(dist), "Spark and single-process plans differ"
            curve.append(
                {
                    "partitions": n,
                    "single_s": round(single_s, 3),
                    # CPU seconds of the single-process scan: the rest of its time is I/O wait
                    "single_cpu_s": round(single_cpu_s, 3),
                    "spark_s": round(spark_s, 3),
                    "spark_speedup": round(single_s / spark_s, 2),
                    "deleting_partitions": sum(1 for p in single if p.new_log_start is not None),
                    "segments_to_delete": sum(len(p.decisions) for p in single),
                }
            )
            print(json.dumps(curve[-1]), file=sys.stderr, flush=True)
        full = curve[-1]
        result["curve"] = curve
        result["single_s"] = full["single_s"]
        result["spark_s"] = full["spark_s"]
        result["spark_speedup"] = full["spark_speedup"]
        faster = [c["partitions"] for c in curve if c["spark_speedup"] >= 1.0]
        result["crossover_partitions"] = faster[0] if faster else None
        result["target_under_30s"] = full["spark_s"] + result["build_tasks_s"] < 30
        spark.stop()
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
