"""Benchmark: log recovery time per GiB vs a raw sequential read of the same files.

Writes ``--mib`` MiB of batches (16 KiB and 1 KiB batch sizes, separate logs), closes the log,
then times ``Log.open(..., clean_shutdown=False, recovery_point=0)`` — every batch read,
CRC-checked and indexed, indexes rebuilt — against reading the same ``.log`` files
sequentially with ``os.read`` in 1 MiB chunks. Both read from the page cache (the files were
just written; caches are not dropped on a shared machine), so the ratio measures recovery's
CPU cost over the cheapest possible pass. Best of ``--rounds``. Last line: one JSON object.

    .venv/bin/python tests/perf/bench_recovery.py [--mib 512] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from logstore.protocol.records import build_batch
from logstore.storage.log import Log, LogConfig

CFG = LogConfig(segment_bytes=256 * 1024 * 1024, max_message_bytes=2**30)


def write_log(d: Path, batch_bytes: int, total_bytes: int) -> int:
    per = 1024 if batch_bytes >= 4096 else 200
    n = max(1, batch_bytes // (per + 16))
    value = os.urandom(per - 8)
    template = bytes(
        build_batch([(b"k%06d" % i, value) for i in range(n)], base_timestamp=1_700_000_000_000)
    )
    per_append = max(1, (1 << 20) // len(template))
    chunk = template * per_append
    log = Log.open(d, CFG)
    written = 0
    while written < total_bytes:
        log.append(bytearray(chunk))
        written += len(chunk)
    log.close()
    return len(template)


def raw_read(d: Path) -> tuple[float, int]:
    total = 0
    t0 = time.perf_counter()
    for p in sorted(d.glob("*.log")):
        fd = os.open(p, os.O_RDONLY)
        try:
            while True:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                total += len(chunk)
        finally:
            os.close(fd)
    return time.perf_counter() - t0, total


def recover(d: Path) -> tuple[float, int]:
    t0 = time.perf_counter()
    log = Log.open(d, CFG, recovery_point=0, clean_shutdown=False)
    elapsed = time.perf_counter() - t0
    end = log.log_end_offset
    assert log.load_result.truncated_bytes == 0
    assert len(log.load_result.recovered_segments) == len(log.segments)
    log.close()
    return elapsed, end


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, object] = {"benchmark": "recovery", "mib": args.mib}
    with tempfile.TemporaryDirectory(
        prefix="bench-recovery-", dir=os.environ.get("BENCH_DIR")
    ) as tmp:
        for label, size in (("16KiB", 16 * 1024), ("1KiB", 1024)):
            d = Path(tmp) / f"recover{size}-0"
            batch_len = write_log(d, size, args.mib * 1024 * 1024)
            raw_best, rec_best, nbytes, end = float("inf"), float("inf"), 0, 0
            for _ in range(args.rounds):
                raw_s, nbytes = raw_read(d)
                raw_best = min(raw_best, raw_s)
                rec_s, end = recover(d)
                rec_best = min(rec_best, rec_s)
            gib = nbytes / 2**30
            entry = {
                "batch_bytes": batch_len,
                "bytes": nbytes,
                "offsets": end,
                "recovery_s_per_gib": round(rec_best / gib, 3),
                "raw_read_s_per_gib": round(raw_best / gib, 3),
                "ratio_raw_over_recovery": round(raw_best / rec_best, 3),
                "recovery_batches_s": round(nbytes / batch_len / rec_best),
            }
            results[label] = entry
            print(
                f"{label:>6} batches ({batch_len} B), {nbytes / 2**20:.0f} MiB: recovery "
                f"{entry['recovery_s_per_gib']} s/GiB, raw read {entry['raw_read_s_per_gib']} "
                f"s/GiB, ratio {entry['ratio_raw_over_recovery']}, "
                f"{entry['recovery_batches_s']:,} batches/s"
            )
            for p in d.iterdir():
                p.unlink()
            d.rmdir()
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
