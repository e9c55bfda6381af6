"""Benchmark: the vectorised decoder alone, one core, against baselines measured in this run.

Segment bytes are built in memory (``build_batch``; ``--batch-records`` records of
``--value-bytes`` per batch, keys of 12 bytes, one header on every 10th record) for codecs
``none`` and ``lz4``. Measured per codec, the process pinned to one CPU:

- ``fast``: pipelines.decode (header scan, CRC-32C, decompression, records -> Arrow);
- ``decode``: ``decode_records`` alone (decompression, records -> Arrow) over a range already
  scanned and verified: the records decoder's own speed;
- ``decompress_only``: the same batches' records streams decompressed (lz4) or copied (none)
  and nothing else — the floor any decoder pays;
- ``kafka_python``: kafka-python's pure-Python ``DefaultRecordBatch`` over a subset;
- ``interpreted_kernel``: the same kernels run by CPython instead of numba (``py_func``) on a
  subset: why the kernel is compiled.

Last line: one JSON object with records/s and the ratios.

    .venv/bin/python tests/perf/bench_decoder.py [--records 2000000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import cramjam
import numpy as np

from logstore.protocol.batch import Codec
from logstore.protocol.records import build_batch
from pipelines.decode import BatchScan, _kernels, decode_records, scan_batches, verify_batches


def make_segment(records: int, batch_records: int, value_bytes: int, codec: Codec) -> bytes:
    rng = np.random.default_rng(1)
    distinct = []
    for b in range(8):
        recs = []
        for i in range(batch_records):
            # Half random, half repeated bytes: compressible like real payloads, not trivially.
            value = rng.bytes(value_bytes // 2) + bytes([b + i % 7]) * (
                value_bytes - value_bytes // 2
            )
            headers = [("trace", b"%08d" % i)] if i % 10 == 0 else []
            recs.append(
                (b"key-%08d" % (b * batch_records + i), value, headers, 1_700_000_000_000 + i)
            )
        distinct.append(build_batch(recs, codec=codec))
    out = bytearray()
    offset = 0
    n = 0
    while offset < records:
        batch = bytearray(distinct[n % len(distinct)])
        batch[0:8] = offset.to_bytes(8, "big")  # baseOffset is outside the CRC
        out += batch
        offset += batch_records
        n += 1
    return bytes(out)


def best_of(fn: Callable[[], int], repeat: int) -> tuple[float, int]:
    best = float("inf")
    count = 0
    for _ in range(repeat):
        t = time.perf_counter()
        count = fn()
        best = min(best, time.perf_counter() - t)
    return best, count


def checked(buf: bytes) -> tuple[BatchScan, np.ndarray]:
    """The scan of ``buf`` and the batches that passed the checks."""
    scan = scan_batches(buf)
    _, errors = verify_batches(buf, scan)
    return scan, np.fromiter((e is None for e in errors), np.bool_, len(errors))


def decode(buf: bytes, scan: BatchScan, select: np.ndarray) -> int:
    return sum(d.records.num_rows for d in decode_records(buf, scan, select=select))


def fast(buf: bytes) -> int:
    return decode(buf, *checked(buf))


def decompress_only(buf: bytes) -> int:
    scan = scan_batches(buf)
    view = memoryview(buf)
    total = 0
    codec = int(scan.codec[0]) if len(scan) else 0
    for p, size in zip(scan.position.tolist(), scan.size.tolist(), strict=True):
        section = view[p + 61 : p + size]
        out = cramjam.lz4.decompress(section) if codec == 3 else bytes(section)
        total += len(out)
    return int(scan.records_count.sum())


def kafka_python(buf: bytes) -> int:
    from kafka.record.default_records import DefaultRecordBatch

    n = 0
    pos = 0
    while pos < len(buf):
        size = int.from_bytes(buf[pos + 8 : pos + 12], "big") + 12
        for _ in DefaultRecordBatch(bytearray(buf[pos : pos + size])):
            n += 1
        pos += size
    return n


def interpreted(buf: bytes) -> int:
    """The compiled records kernel run by CPython (uncompressed data only)."""
    data = np.frombuffer(buf, np.uint8)
    scan = scan_batches(buf)
    starts = scan.position + 61
    ends = scan.position + scan.size
    counts = scan.records_count
    cap = int(counts.sum())
    space = int((ends - starts).sum())
    n, *_ = _kernels.records_to_columns.py_func(
        data, starts, ends, counts, scan.base_offset, scan.base_timestamp, scan.max_timestamp,
        np.zeros(len(scan), np.bool_), -(2**63), 2**63 - 1, -(2**63), 2**63 - 1,
        np.empty(cap, np.int64), np.empty(cap, np.int64),
        np.empty(cap + 1, np.int32), np.empty(space, np.uint8), np.empty(cap // 8 + 1, np.uint8),
        np.empty(cap + 1, np.int32), np.empty(space, np.uint8), np.empty(cap // 8 + 1, np.uint8),
        np.empty(cap + 1, np.int32), np.empty(space, np.uint8),
    )  # fmt: skip
    return int(n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--batch-records", type=int, default=100)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--baseline-records", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    results: dict[str, Any] = {
        "bench": "decoder",
        "records": args.records,
        "value_bytes": args.value_bytes,
        "batch_records": args.batch_records,
        "cpus": 1,
        "load_avg_1m": os.getloadavg()[0],
    }
    fast(make_segment(1000, 100, 10, Codec.LZ4))  # load the compiled kernels
    for codec in (Codec.NONE, Codec.LZ4):
        buf = make_segment(args.records, args.batch_records, args.value_bytes, codec)
        small = make_segment(args.baseline_records, args.batch_records, args.value_bytes, codec)
        t_fast, n_fast = best_of(lambda buf=buf: fast(buf), args.repeat)
        scan, select = checked(buf)
        t_dec, n_dec = best_of(lambda b=buf, s=scan, sel=select: decode(b, s, sel), args.repeat)
        t_raw, n_raw = best_of(lambda buf=buf: decompress_only(buf), args.repeat)
        t_kp, n_kp = best_of(lambda small=small: kafka_python(small), 1)
        assert (
            n_fast == n_raw == n_dec
            and n_kp
            == len(range(0, args.baseline_records, args.batch_records)) * args.batch_records
        )
        label = codec.label
        r = {
            "fast_records_per_s": n_fast / t_fast,
            "fast_mb_per_s": len(buf) / t_fast / 1e6,
            "decode_records_per_s": n_dec / t_dec,
            "decompress_only_records_per_s": n_raw / t_raw,
            "kafka_python_records_per_s": n_kp / t_kp,
            "segment_bytes": len(buf),
        }
        r["fast_vs_decompress_only"] = r["fast_records_per_s"] / r["decompress_only_records_per_s"]
        r["fast_vs_kafka_python"] = r["fast_records_per_s"] / r["kafka_python_records_per_s"]
        if codec == Codec.NONE:
            t_py, n_py = best_of(lambda small=small: interpreted(small), 1)
            r["interpreted_kernel_records_per_s"] = n_py / t_py
            r["fast_vs_interpreted_kernel"] = (
                r["fast_records_per_s"] / r["interpreted_kernel_records_per_s"]
            )
        results[label] = r
        print(
            f"{label:5s} fast {r['fast_records_per_s'] / 1e6:7.2f} M rec/s "
            f"({r['fast_mb_per_s']:7.1f} MB/s)  decode {r['decode_records_per_s'] / 1e6:7.2f} "
            f"M rec/s  decompress-only "
            f"{r['decompress_only_records_per_s'] / 1e6:7.2f} M rec/s  kafka-python "
            f"{r['kafka_python_records_per_s'] / 1e3:7.1f} k rec/s  "
            f"x{r['fast_vs_kafka_python']:.0f}",
            file=sys.stderr,
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
