"""Benchmark: CPU of one ingest / lookups Spark task's function, in-process, with and without
the task settings of :mod:`pipelines.worker` (transparent huge pages off, Arrow single-threaded).

Writes a log dir with ``bench_ingest``'s generator (``--records`` unique records of 100 bytes,
200 a batch, ``--codec``), plans it as the ingest job does (``conf/pipeline.toml``'s
``max_partition_bytes``, two cores) and runs the first task's function directly, without
Spark: ``ingest`` (``pipelines.ingest.tasks._read_ranges`` inside ``pipelines.delta.direct``'s task
writer: decode and write Parquet), ``txn`` (the same under ``read_committed``: collecting the
transaction events too, :mod:`pipelines.ingest.committed`), ``lookup``
(``build_lookups``' offset_lookup task with its writer) and ``check`` (the index check task).

Per task and variant: CPU seconds of the calling thread (``time.thread_time``) and of the
process (``getrusage`` user and system: Arrow's threads included), minor page faults; the
variants run interleaved in a random order, ``--runs`` times after one warm-up run, and the
medians are printed (compare CPU, not wall-clock, on a shared machine). ``--fresh VARIANT``
instead times one run of each task in this fresh process, no warm-up: the first task of a new
Python worker, whose memory is all new pages.

    .venv/bin/python tests/perf/bench_task_cpu.py [--records 3000000] [--codec none|lz4]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ingest import write_topic

from logstore.objectstore import StorageSettings
from logstore.protocol.batch import Codec
from pipelines.delta.direct import _task_writer
from pipelines.delta.files import RECORDS_PARQUET_OPTIONS, table_location
from pipelines.delta.staging import Lease
from pipelines.ingest.tasks import _read_ranges, _with_aborted, schedule_tasks
from pipelines.lookups import LOOKUP_SCHEMAS, _check_task, _lookup_task
from pipelines.sources import RECORDS_ARROW_SCHEMA
from pipelines.sources.plan import SourceOptions, parse_options, plan_ranges
from pipelines.sources.synthetic import write_high_watermarks
from pipelines.worker import arrow_single_threaded, without_huge_pages

TOPIC = "t"
TASK_BYTES = 128 << 20  # conf/pipeline.toml [ingest] max_partition_bytes


@contextlib.contextmanager
def _both() -> Iterator[None]:
    with arrow_single_threaded(), without_huge_pages():
        yield


VARIANTS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "plain": contextlib.nullcontext,
    "thp_off": without_huge_pages,
    "thp_off+arrow1": _both,
}


def _options(log_dir: Path, kind: str, piece: int, **extra: str) -> SourceOptions:
    opts = {"path": str(log_dir), "kind": kind, "maxPartitionBytes": str(piece), "topics": TOPIC}
    return parse_options({**opts, **extra})


def task_functions(log_dir: Path, out: Path) -> dict[str, Callable[[], int]]:
    """Each task's function over the first planned task, as a call returning its output lines."""
    piece = TASK_BYTES // 8
    records = _options(log_dir, "records", piece)
    task = schedule_tasks(plan_ranges(records), 2, TASK_BYTES, piece)[0]
    batches = _options(log_dir, "batches", piece)
    btask = schedule_tasks(plan_ranges(batches), 2, TASK_BYTES, piece)[0]
    whole = _options(log_dir, "batches", 1 << 62, until="latest")
    segments = plan_ranges(whole)
    print(f"first task: {sum(r.end - r.start for r in task) / 1e6:.1f} MB", file=sys.stderr)

    def written(produce: Callable[[Any], Any], items: list[Any], **options: Any) -> int:
        root, write_id, settings = table_location(out), uuid.uuid4().hex, StorageSettings.default()
        lease = Lease.take(root, write_id, settings=settings)  # the driver's, as stage_files
        try:
            run = _task_writer(
                root, settings=settings, write_id=write_id, produce=produce, **options
            )
            lines = len(list(run(0, items)))
        finally:
            lease.release()
            shutil.rmtree(out, ignore_errors=True)
        return lines

    def ingest(*, collect_txn: bool = False) -> int:
        return written(
            functools.partial(_read_ranges, options=records, collect_txn=collect_txn),
            _with_aborted([task], {}),
            schema=RECORDS_ARROW_SCHEMA,
            partition_by=["topic", "date"],
            writer_options={"compression": "snappy", "max_rows_per_file": 10_000_000,
                            **RECORDS_PARQUET_OPTIONS},
        )  # fmt: skip

    def txn() -> int:  # the read_committed pass: ingest collecting transaction events
        return ingest(collect_txn=True)

    def lookup() -> int:
        produce = functools.partial(
            _lookup_task, table="offset_lookup", min_timestamp=batches.min_timestamp
        )
        return written(
            produce,
            [btask],
            schema=LOOKUP_SCHEMAS["offset_lookup"],
            partition_by=["topic"],
            writer_options={"compression": "zstd", "max_rows_per_file": 10_000_000},
        )

    def check() -> int:
        return len(list(_check_task(segments, options=whole)))

    return {"ingest": ingest, "txn": txn, "lookup": lookup, "check": check}


def measure(fn: Callable[[], int], variant: str) -> dict[str, float]:
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.thread_time()
    with VARIANTS[variant]():
        fn()
    t1, r1 = time.thread_time(), resource.getrusage(resource.RUSAGE_SELF)
    return {
        "thread": t1 - t0,
        "user": r1.ru_utime - r0.ru_utime,
        "sys": r1.ru_stime - r0.ru_stime,
        "minflt": r1.ru_minflt - r0.ru_minflt,
    }


def show(codec: str, name: str, variant: str, runs: list[dict[str, float]]) -> None:
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    each = ",".join(f"{r['user'] + r['sys']:.2f}" for r in runs)
    print(
        f"{codec:5} {name:7} {variant:15} thread={med['thread']:.3f} user={med['user']:.3f} "
        f"sys={med['sys']:.3f} minflt={med['minflt']:.0f}  user+sys per run: {each}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=3_000_000)
    parser.add_argument("--codec", choices=["none", "lz4"], default="none")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tasks", default="ingest,txn,lookup,check")
    parser.add_argument("--fresh", choices=list(VARIANTS), help="one run, no warm-up")
    parser.add_argument("--keep", help="reuse/keep the log dir here instead of a temp dir")
    args = parser.parse_args()
    base = Path(args.keep) / args.codec if args.keep else Path(tempfile.mkdtemp())
    log_dir = base / "logs"
    try:
        if not (log_dir / f"{TOPIC}-0").exists():
            log_dir.mkdir(parents=True, exist_ok=True)
            shape = SimpleNamespace(batch_records=200, value_bytes=100, segment_bytes=128 << 20)
            n = write_topic(log_dir, TOPIC, args.records, Codec[args.codec.upper()], shape)
            write_high_watermarks(log_dir, {(TOPIC, 0): n})
        functions = task_functions(log_dir, base / "out")
        for name in args.tasks.split(","):
            fn = functions[name]
            if args.fresh:
                show(args.codec, name, args.fresh, [measure(fn, args.fresh)])
                continue
            fn()  # warm-up: compiled kernels loaded, allocator pools filled
            results: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
            for _ in range(args.runs):
                for variant in random.sample(list(VARIANTS), len(VARIANTS)):
                    results[variant].append(measure(fn, variant))
            for variant, runs in results.items():
                show(args.codec, name, variant, runs)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
