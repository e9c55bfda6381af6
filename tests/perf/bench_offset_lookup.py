"""Benchmark: offset lookup latency near the tail and at random offsets.

Builds a real log of ``--batches`` small batches with ``index.interval.bytes=0`` (one index entry
per batch, so the ``.index`` holds that many entries), then measures

* ``OffsetIndex.lookup`` (Kafka's warm-section search) against a plain binary search over the
  whole index file (same mmap, same entry decoding), for targets within the last 1000 offsets
  ("tail", what consumers and followers ask for) and uniformly random targets;
* the distinct 4 KiB index pages each search touches (mean and max);
* ``Log.read(offset, 1)`` end to end (index lookup + header scan + slice).

p50/p99 in microseconds. Last line: one JSON object.

    .venv/bin/python tests/perf/bench_offset_lookup.py [--batches 1000000] [--lookups 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from logstore.protocol.records import build_batch
from logstore.storage.index import OffsetIndex
from logstore.storage.log import Log, LogConfig

_I32 = struct.Struct(">i")


def plain_lookup(idx: OffsetIndex, target: int, touched: set[int] | None = None) -> tuple[int, int]:
    """The baseline: one binary search over every entry, no warm section."""
    mm = idx._mm  # the benchmark reads the same map the index uses
    assert mm is not None
    rel = target - idx.base_offset
    lo, hi = 0, len(idx) - 1
    if _I32.unpack_from(mm, 0)[0] > rel:
        return (idx.base_offset, 0)
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        if touched is not None:
            touched.add(mid * 8 // 4096)
        key = _I32.unpack_from(mm, mid * 8)[0]
        if key > rel:
            hi = mid - 1
        else:
            lo = mid
    r, p = struct.unpack_from(">ii", mm, lo * 8)
    return (idx.base_offset + r, p)


def percentiles(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {
        "p50_us": round(s[len(s) // 2] * 1e6, 2),
        "p99_us": round(s[int(len(s) * 0.99)] * 1e6, 2),
        "mean_us": round(statistics.fmean(s) * 1e6, 2),
    }


def timed(fn: Callable[[int], object], targets: list[int]) -> list[float]:
    out = []
    clock = time.perf_counter
    for t in targets:
        t0 = clock()
        fn(t)
        out.append(clock() - t0)
    return out


def build_log(directory: Path, batches: int) -> Log:
    cfg = LogConfig(
        segment_bytes=2**31 - 1,
        index_interval_bytes=0,
        segment_index_bytes=max(8 * (batches + 16), 4096),
    )
    log = Log.open(directory / "lookup-0", cfg)
    template = bytes(build_batch([(b"k", b"v" * 20)], base_timestamp=1_700_000_000_000))
    per_append = 1000
    chunk = template * per_append
    done = 0
    while done < batches:
        n = min(per_append, batches - done)
        log.append(bytearray(chunk[: n * len(template)]))
        done += n
    return log


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=1_000_000)
    parser.add_argument("--lookups", type=int, default=20_000)
    args = parser.parse_args()
    rng = random.Random(42)
    with tempfile.TemporaryDirectory(
        prefix="bench-lookup-", dir=os.environ.get("BENCH_DIR")
    ) as tmp:
        t0 = time.perf_counter()
        log = build_log(Path(tmp), args.batches)
        build_s = time.perf_counter() - t0
        seg = log.active_segment
        idx = seg.offset_index
        end = log.log_end_offset
        print(f"log: {end} offsets, {len(idx)} index entries, built in {build_s:.1f} s")
        tail = [rng.randint(max(0, end - 1000), end - 1) for _ in range(args.lookups)]
        rand = [rng.randint(0, end - 1) for _ in range(args.lookups)]
        for t in tail[:200] + rand[:200]:  # agreement check before timing
            assert tuple(idx.lookup(t)) == plain_lookup(idx, t), t
        results: dict[str, object] = {
            "benchmark": "offset_lookup",
            "offsets": end,
            "index_entries": len(idx),
        }
        for label, targets in (("tail", tail), ("random", rand)):
            warm = timed(idx.lookup, targets)
            plain = timed(lambda t: plain_lookup(idx, t), targets)
            pages_warm = []
            pages_plain = []
            for t in targets[:2000]:
                a: set[int] = set()
                b: set[int] = set()
                idx.lookup(t, touched=a)
                plain_lookup(idx, t, b)
                pages_warm.append(len(a))
                pages_plain.append(len(b))
            union_warm: set[int] = set()
            union_plain: set[int] = set()
            for t in targets[:2000]:
                idx.lookup(t, touched=union_warm)
                plain_lookup(idx, t, union_plain)
            read = timed(lambda t: log.read(t, 1), targets)
            warm_p, plain_p, read_p = percentiles(warm), percentiles(plain), percentiles(read)
            mean_warm = round(statistics.fmean(pages_warm), 2)
            mean_plain = round(statistics.fmean(pages_plain), 2)
            results[label] = {
                "index_lookup": warm_p,
                "plain_binary_search": plain_p,
                "log_read": read_p,
                "pages_per_lookup_warm": mean_warm,
                "pages_per_lookup_plain": mean_plain,
                "distinct_pages_2000_lookups_warm": len(union_warm),
                "distinct_pages_2000_lookups_plain": len(union_plain),
                "p50_ratio_plain_over_warm": round(plain_p["p50_us"] / warm_p["p50_us"], 3),
            }
            print(
                f"{label:>6}: index lookup p50 {warm_p['p50_us']} us p99 {warm_p['p99_us']} us"
                f" | plain p50 {plain_p['p50_us']} us p99 {plain_p['p99_us']} us"
                f" | pages/lookup warm {mean_warm} plain {mean_plain}; distinct pages over 2000"
                f" lookups warm {len(union_warm)} plain {len(union_plain)}"
                f" | Log.read p50 {read_p['p50_us']} us p99 {read_p['p99_us']} us"
            )
        log.close()
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
