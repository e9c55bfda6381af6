"""Benchmark: log recovery time per GiB vs a raw sequential read of the same files.

Writes ``--mib`` MiB of batches (16 KiB and 1 KiB batch sizes, separate logs), closes the log,
then times ``Log.open(..., clean_shutdown=False, recovery_point=0)`` — every batch read,
CRC-checked and indexed, indexes rebuilt — against reading the same ``.log`` files
sequentially with ``os.read`` in 1 MiB chunks. Both read from the page cache (the files were
just written; caches are not dropped on a shared machine), so the ratio measures recovery's
CPU cost over the cheapest possible pass. Best of ``--rounds``.

Producer-state loading (``--producer-mib``, 0 to skip): a log of 16 KiB idempotent and
transactional batches from 8 producers (every 4th transaction aborted) in 8 MiB segments,
written through the partition layer, is opened four ways: after a clean shutdown and after a
crash with the recovery point at the active segment, each with the ``.snapshot`` files the
log wrote (on roll and close) and with them deleted (a full replay of every batch header and
marker). Last line: one JSON object.

    .venv/bin/python tests/perf/bench_recovery.py [--mib 512] [--rounds 3] [--producer-mib 128]
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
from logstore.storage.partition import Partition

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


PS_CFG = LogConfig(segment_bytes=8 * 1024 * 1024, segment_ms=2**62)


def write_producer_log(d: Path, total_bytes: int) -> int:
    """Idempotent and transactional batches of 8 producers; returns the batches written
    (markers included)."""
    part = Partition.load("ps", 0, Log.open(d, PS_CFG))
    value = os.urandom(1000)
    seqs = [0] * 8
    i = n = written = 0
    while written < total_bytes:
        pid = i % 8
        transactional = pid % 2 == 1
        batch = build_batch(
            [(b"k%d" % k, value) for k in range(16)],
            base_timestamp=1_700_000_000_000,
            producer_id=pid,
            producer_epoch=0,
            base_sequence=seqs[pid],
            is_transactional=transactional,
        )
        seqs[pid] += 16
        part.append_as_leader(batch)
        n += 1
        if transactional:  # one batch per transaction, every 4th aborted
            commit = (i // 8) % 4 != 0
            part.write_txn_marker(
                pid, 0, commit=commit, coordinator_epoch=0, now_ms=1_700_000_000_000
            )
            n += 1
        written += len(batch)
        i += 1
    part.log.close()
    return n


def open_timed(d: Path, *, clean: bool, recovery_point: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    log = Log.open(d, PS_CFG, clean_shutdown=clean, recovery_point=recovery_point)
    elapsed = time.perf_counter() - t0
    replayed = log.producer_load.batches_replayed
    log.close()
    return elapsed, replayed


def bench_producer_state(tmp: Path, mib: int, rounds: int) -> dict[str, object]:
    src = tmp / "ps-0"
    batches = write_producer_log(src, mib * 1024 * 1024)
    segments = sorted(src.glob("*.log"))
    active_base = int(segments[-1].name.split(".")[0])
    out: dict[str, object] = {"batches": batches, "segments": len(segments)}
    for snapshots in (True, False):
        for clean in (True, False):
            best, replayed = float("inf"), 0
            for _ in range(rounds):
                d = tmp / "ps-copy" / "ps-0"
                shutil.copytree(src, d)
                if not snapshots:
                    for f in d.glob("*.snapshot"):
                        f.unlink()
                elapsed, replayed = open_timed(d, clean=clean, recovery_point=active_base)
                best = min(best, elapsed)
                shutil.rmtree(d.parent)
            key = f"{'clean' if clean else 'crash'}_{'with' if snapshots else 'without'}_snapshots"
            out[key] = {"open_s": round(best, 4), "batches_replayed": replayed}
            print(
                f"producer state, {key}: open {best * 1000:.1f} ms, {replayed:,} of {batches:,} "
                "batches replayed"
            )
    for kind in ("clean", "crash"):
        with_s = out[f"{kind}_with_snapshots"]["open_s"]  # type: ignore[index]
        without_s = out[f"{kind}_without_snapshots"]["open_s"]  # type: ignore[index]
        out[f"{kind}_speedup"] = round(without_s / with_s, 1)
    shutil.rmtree(src)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--producer-mib", type=int, default=128)
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
        if args.producer_mib > 0:
            results["producer_state"] = bench_producer_state(
                Path(tmp), args.producer_mib, args.rounds
            )
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
