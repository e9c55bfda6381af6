"""Benchmark: Log.append throughput vs a raw os.write append of the same bytes.

For 16 KiB and 1 MiB batches, appends ``--mib`` MiB through ``Log.append`` (validation with CRC,
offset stamping, index maintenance, one pwrite) and through a bare ``os.write`` loop into a
file in the same directory, alternating rounds, best round of each. Both land in the page
cache (no fsync), which is what the broker does. Targets (issue 2): ratio >= 0.7 for 1 MiB,
>= 0.4 for 16 KiB. ``--segment-bytes`` (default 1 GiB: no roll) makes the log roll every that
many bytes, so that the cost of a roll (two index files preallocated with ``posix_fallocate``
to ``segment.index.bytes``, the rolled segment flushed) is in the figures. Last line: one JSON
object.

    .venv/bin/python tests/perf/bench_log_append.py [--mib 256] [--rounds 5] [--segment-bytes N]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from logstore.protocol.records import build_batch
from logstore.storage.log import Log, LogConfig


def make_batch(batch_bytes: int) -> bytearray:
    """One uncompressed batch of about ``batch_bytes`` bytes made of 1 KiB records."""
    per = 1024
    n = max(1, batch_bytes // (per + 16))
    value = os.urandom(per - 8)
    buf = build_batch([(b"key%05d" % i, value) for i in range(n)], base_timestamp=1_700_000_000_000)
    return buf


def bench_raw(directory: Path, batches: list[bytearray], count: int) -> float:
    path = directory / "raw.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        n = len(batches)
        t0 = time.perf_counter()
        for i in range(count):
            os.write(fd, batches[i % n])
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink()
    return elapsed


def bench_log(
    directory: Path, batches: list[bytearray], count: int, segment_bytes: int = 2**30
) -> float:
    d = directory / "bench-0"
    log = Log.open(d, LogConfig(segment_bytes=segment_bytes, max_message_bytes=2**30))
    try:
        n = len(batches)
        append = log.append
        t0 = time.perf_counter()
        for i in range(count):
            append(batches[i % n])
        elapsed = time.perf_counter() - t0
    finally:
        log.close()
        shutil.rmtree(d)
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="MiB appended per round and size")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--segment-bytes", type=int, default=2**30, help="log.segment.bytes (default: no roll)"
    )
    args = parser.parse_args()
    results: dict[str, object] = {
        "benchmark": "log_append",
        "mib_per_round": args.mib,
        "segment_bytes": args.segment_bytes,
    }
    with tempfile.TemporaryDirectory(
        prefix="bench-append-", dir=os.environ.get("BENCH_DIR")
    ) as tmp:
        directory = Path(tmp)
        for label, size in (("16KiB", 16 * 1024), ("1MiB", 1024 * 1024)):
            batches = [make_batch(size) for _ in range(4)]
            batch_len = len(batches[0])
            count = max(1, args.mib * 1024 * 1024 // batch_len)
            total = count * batch_len
            raw_best, log_best = float("inf"), float("inf")
            for _ in range(args.rounds):
                raw_best = min(raw_best, bench_raw(directory, batches, count))
                log_best = min(log_best, bench_log(directory, batches, count, args.segment_bytes))
            raw_mibs = total / raw_best / 2**20
            log_mibs = total / log_best / 2**20
            ratio = raw_best / log_best
            print(
                f"{label:>6}: {count} batches of {batch_len} B; "
                f"raw os.write {raw_mibs:8.1f} MiB/s, "
                f"Log.append {log_mibs:8.1f} MiB/s ({count / log_best:,.0f} batches/s), "
                f"ratio {ratio:.2f}"
            )
            results[label] = {
                "batch_bytes": batch_len,
                "batches": count,
                "raw_mib_s": round(raw_mibs, 1),
                "log_mib_s": round(log_mibs, 1),
                "log_batches_s": round(count / log_best),
                "ratio": round(ratio, 3),
            }
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
