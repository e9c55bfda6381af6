"""Benchmark: ingest of a partition written in transactions vs the same partition without.

Two topics of ``--records`` records each (the data of ``bench_ingest.py``'s ``UniqueBatches``:
``--value-bytes`` values, lz4, ``--batch-records`` records a batch), written through the
storage engine:

- ``plain``: non-transactional batches;
- ``txn``: the same batches made transactional (attributes bit 4, one producer id per
  transaction, CRC recomputed), in transactions of ``--txn-batches`` batches, each ended by a
  COMMIT marker — every ``--abort-every``-th by an ABORT marker instead — and the last one
  left open (its records above the last stable offset).

Timed (best of ``--runs`` after one warm-up, each into a fresh lake): the real ingest job
(``run_ingest``, shipped ``[ingest]`` settings) on ``plain`` with ``read_uncommitted`` (the
baseline) and ``read_committed`` (one pass: it finds no transaction), and on ``txn`` with
``read_committed`` (the pass finds aborted and open transactions: the partition is read again
below its LSO with the aborted batches masked, :mod:`pipelines.ingest.committed`; the second
read's share of each run is reported), and last on ``txn`` again once its segments'
``.txnindex`` files list the aborted transactions as a broker's do (the records pass is masked
with them and only the tail at the open transaction is read again). Every run's
row count is checked against the records a READ_COMMITTED (resp. READ_UNCOMMITTED) consumer
would get. Figures on a shared machine drift: compare the ratios. Last line: one JSON object.

    .venv/bin/python tests/perf/bench_ingest_txn.py [--records 2000000]
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

from bench_ingest import UniqueBatches  # type: ignore[import-not-found]

from logstore.protocol.batch import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    PRODUCER_ID_OFFSET,
    Codec,
    compute_crc,
)
from logstore.protocol.control import ControlType, build_control_batch
from logstore.storage.config import LogConfig
from logstore.storage.log import Log
from logstore.storage.txn_index import decode_entries
from pipelines.ingest import IngestConfig, load_config, run_ingest
from pipelines.sources.synthetic import write_batches, write_high_watermarks

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
_I16 = struct.Struct(">h")
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")


def transactional(
    batches: Iterator[bytearray], args: Any, stats: dict[str, int]
) -> Iterator[bytes]:
    """``batches`` made transactional, in transactions with their markers (module doc); each
    aborted transaction's ``(producer, first offset, marker offset)`` goes to
    ``stats["aborts"]`` (the offsets the log will give them: one per record and per marker)."""
    txn = 0
    offset = first = 0
    for i, batch in enumerate(batches):
        pid = 1000 + txn
        if i % args.txn_batches == 0:
            first = offset
        offset += args.batch_records
        attrs = _I16.unpack_from(batch, ATTRIBUTES_OFFSET)[0] | 0x10
        _I16.pack_into(batch, ATTRIBUTES_OFFSET, attrs)
        _I64.pack_into(batch, PRODUCER_ID_OFFSET, pid)
        _U32.pack_into(batch, CRC_OFFSET, compute_crc(batch, 0, len(batch)))
        yield batch
        if (i + 1) % args.txn_batches == 0 and (i + 1) < stats["batches"]:
            aborted = (txn + 1) % args.abort_every == 0
            kind = ControlType.ABORT if aborted else ControlType.COMMIT
            stats["aborted_records" if aborted else "committed_records"] += (
                args.txn_batches * args.batch_records
            )
            yield build_control_batch(kind, producer_id=pid, producer_epoch=0, timestamp=0)
            if aborted:
                stats["aborts"].append((pid, first, offset))
            offset += 1
            txn += 1
    stats["open_records"] = stats["records"] - stats["aborted_records"] - stats["committed_records"]


def timed(spark: Any, config: IngestConfig, expected: int) -> tuple[float, dict[str, Any]]:
    from deltalake import DeltaTable

    shutil.rmtree(config.lake, ignore_errors=True)
    t = time.perf_counter()
    summary = run_ingest(spark, config, log=lambda _msg: None)
    seconds = time.perf_counter() - t
    rows = DeltaTable(config.records_path).to_pyarrow_dataset().count_rows()
    if rows != expected or summary.records != expected:
        raise SystemExit(f"landed {rows} rows, expected {expected}: {summary.describe()}")
    shutil.rmtree(config.lake, ignore_errors=True)
    return seconds, summary.to_json()


def index_aborts(partition_dir: Path, aborts: list[tuple[int, int, int]]) -> None:
    """The aborted transactions into the segments' ``.txnindex`` files, as a broker leaves
    them (``pipelines.ingest.committed`` reads them as a prediction): opening the log, whose
    recovery rebuilds the index from the markers as a broker's start does, checked against
    the transactions this bench aborted."""
    Log.open(partition_dir, LogConfig(segment_bytes=128 << 20)).close()
    listed = [
        (e.producer_id, e.first_offset, e.last_offset)
        for path in sorted(partition_dir.glob("*.txnindex"))
        for e in decode_entries(path.read_bytes(), path=str(path))
    ]
    if listed != aborts:
        raise SystemExit(
            f"the .txnindex lists {len(listed)} aborted transactions, not {len(aborts)}"
        )


def _case(base: IngestConfig, topic: str, isolation: str) -> IngestConfig:
    return dataclasses.replace(base, topics=(topic,), isolation=isolation)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--batch-records", type=int, default=200)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--txn-batches", type=int, default=5, help="batches per transaction")
    parser.add_argument("--abort-every", type=int, default=10, help="every n-th txn aborts")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--config", default=str(ROOT / "conf" / "pipeline.toml"))
    args = parser.parse_args()

    from pipelines.session import get_spark

    work = Path(tempfile.mkdtemp(prefix="bench-ingest-txn-"))
    log_dir, lake = work / "logs", work / "lake"
    count = args.records // args.batch_records
    n = count * args.batch_records
    stats: dict[str, Any] = {
        "batches": count,
        "records": n,
        "aborted_records": 0,
        "committed_records": 0,
        "aborts": [],
    }
    results: dict[str, Any] = {
        "bench": "ingest_txn",
        "records": n,
        "load_avg_1m_start": os.getloadavg()[0],
    }
    try:
        gen = UniqueBatches(args.batch_records, args.value_bytes, Codec.LZ4)
        _, plain_end = write_batches(
            log_dir, "plain", 0, gen.batches(0, count), segment_bytes=128 << 20
        )
        gen = UniqueBatches(args.batch_records, args.value_bytes, Codec.LZ4)
        _, txn_end = write_batches(
            log_dir,
            "txn",
            0,
            transactional(gen.batches(0, count), args, stats),
            segment_bytes=128 << 20,
        )
        write_high_watermarks(log_dir, {("plain", 0): plain_end, ("txn", 0): txn_end})
        aborts = stats.pop("aborts")
        results.update(stats)
        spark = get_spark(
            "bench-ingest-txn",
            master="local[2]",
            conf={"spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC"},
        )
        spark.sparkContext.setLogLevel("ERROR")
        base = dataclasses.replace(
            load_config(args.config, log_dirs=[str(log_dir)], lake=str(lake)),
            progress_interval_s=0.0,
        )
        committed, uncommitted = "read_committed", "read_uncommitted"
        cases = {
            "plain_read_uncommitted": (_case(base, "plain", uncommitted), n),
            "plain_read_committed": (_case(base, "plain", committed), n),
            "txn_read_committed": (_case(base, "txn", committed), stats["committed_records"]),
            "txn_read_uncommitted": (_case(base, "txn", uncommitted), n),
            "txn_read_committed_txnindex": (
                _case(base, "txn", committed),
                stats["committed_records"],
            ),
        }
        for name, (config, expected) in cases.items():
            if name == "txn_read_committed_txnindex":
                index_aborts(log_dir / "txn-0", aborts)
            timed(spark, config, expected)  # warm-up
            runs = [timed(spark, config, expected) for _ in range(args.runs)]
            best = min(r[0] for r in runs)
            results[name] = {
                "seconds": best,
                "records_per_s": n / best,
                "runs": [r[0] for r in runs],
                # inside each run: the second read's share of that very run (paired, so less
                # exposed to the machine's drift than a ratio of two cases)
                "reread_share_of_run": [r[1]["txn_reread_seconds"] / r[0] for r in runs],
                "reread_partitions": [r[1]["txn_reread_partitions"] for r in runs],
            }
            share = statistics.median(results[name]["reread_share_of_run"])
            print(
                f"{name:24s} {best:6.2f} s  {n / best / 1e6:5.2f} M rec/s (of the log's records)"
                f"  second read {share:.0%} of the run (median)",
                file=sys.stderr,
            )
        r = results
        r["ratio_txn_committed_vs_plain_uncommitted"] = (
            r["plain_read_uncommitted"]["seconds"] / r["txn_read_committed"]["seconds"]
        )
        r["ratio_txn_committed_txnindex_vs_plain_uncommitted"] = (
            r["plain_read_uncommitted"]["seconds"] / r["txn_read_committed_txnindex"]["seconds"]
        )
        r["ratio_plain_committed_vs_plain_uncommitted"] = (
            r["plain_read_uncommitted"]["seconds"] / r["plain_read_committed"]["seconds"]
        )
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["load_avg_1m_end"] = os.getloadavg()[0]
    print(json.dumps(results))


if __name__ == "__main__":
    main()
