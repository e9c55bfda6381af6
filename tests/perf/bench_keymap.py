"""Benchmark: the log compaction's key map (:func:`pipelines.compaction.log.winning_offsets`)
on one partition, in process: the offset strategy's lean path against the full decoder
(``full_decode=True``, the path it replaced and its reference), interleaved.

The partition is written by ``bench_compact.write_log_topic`` (uncompressed batches, 8 MiB
segments, 12-byte keys uniform over ``--keys``, random values). Each path is called once to
warm up (numba loads its kernels on the first call), then ``--reps`` times each, in turn,
with transparent huge pages off as in a compaction task; figures are the medians of this
thread's CPU seconds (``time.thread_time``; user and system from ``getrusage``) and minor
page faults per call. On a loaded machine compare CPU seconds, not wall-clock. The two paths'
results are checked equal. Last line: one JSON object.

    .venv/bin/python tests/perf/bench_keymap.py [--records 2500000 --keys 1000000]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "perf"))

from bench_compact import write_log_topic  # noqa: E402

from logstore.storage.cleaner import scan_segment  # noqa: E402
from pipelines.compaction.log import winning_offsets  # noqa: E402
from pipelines.compaction.model import DEFAULT_STRATEGY  # noqa: E402
from pipelines.worker import without_huge_pages  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=2_500_000)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--reps", type=int, default=4)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-keymap-") as tmp:
        log_dir = Path(tmp)
        write_log_topic(log_dir, "t", args.records, key_space=args.keys,
                        value_bytes=args.value_bytes, partitions=1, batch=args.batch,
                        rng=np.random.default_rng(7))  # fmt: skip
        d = log_dir / "t-0"
        refs = [scan_segment(p)[0] for p in sorted(d.glob("*.log"))]
        paths = {"lean": False, "full_decode": True}
        figures: dict[str, list[tuple[float, float, float, float]]] = {p: [] for p in paths}
        with without_huge_pages():
            results = {p: winning_offsets(d, refs, DEFAULT_STRATEGY, full_decode=full)
                       for p, full in paths.items()}  # fmt: skip
            lean, full = results["lean"], results["full_decode"]
            if not (np.array_equal(lean[0], full[0]) and np.array_equal(lean[1], full[1])):
                raise SystemExit("the lean key map and the full decoder disagree")
            for _ in range(args.reps):
                for p, full_decode in paths.items():
                    r0, c0 = resource.getrusage(resource.RUSAGE_THREAD), time.thread_time()
                    winning_offsets(d, refs, DEFAULT_STRATEGY, full_decode=full_decode)
                    c1, r1 = time.thread_time(), resource.getrusage(resource.RUSAGE_THREAD)
                    user, system = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
                    figures[p].append((c1 - c0, user, system, r1.ru_minflt - r0.ru_minflt))
    out: dict[str, object] = {
        "records": args.records,
        "keys": args.keys,
        "segments": len(refs),
        "bytes": sum(r.size for r in refs),
        "winners": len(lean[0]),
    }
    for p, rows in figures.items():
        med = np.median(np.array(rows), axis=0)
        out[p] = {"cpu_s": round(float(med[0]), 3), "user_s": round(float(med[1]), 3),
                  "sys_s": round(float(med[2]), 3), "minor_faults": int(med[3])}  # fmt: skip
        print(f"{p:12s} cpu {med[0]:.3f} s (user {med[1]:.3f}, sys {med[2]:.3f}), "
              f"minor faults {int(med[3])}")  # fmt: skip
    lean_cpu = out["lean"]["cpu_s"]  # type: ignore[index]
    full_cpu = out["full_decode"]["cpu_s"]  # type: ignore[index]
    out["full_over_lean"] = round(full_cpu / lean_cpu, 2) if lean_cpu else None
    print(json.dumps(out))


if __name__ == "__main__":
    main()
