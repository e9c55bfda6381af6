"""Benchmark: the decode job's typed table written by pyarrow's Parquet writer and by
:class:`pipelines.delta.parquet.FastParquetWriter`, same options.

The table is ``bench_decode.py``'s values decoded (:func:`decoded_table`, ``--records`` rows;
or an Arrow IPC file, ``--table``): the typed table's columns, the 12-field Avro schema plus
``_kafka``. Options: the job's
(:func:`pipelines.typed.job.typed_parquet_options`) with zstd and
``store_decimal_as_integer=True`` (what the fast writer needs for ``amount``). Measures thread
CPU time (``time.thread_time``) of one ``write_table`` + ``close`` into memory, the two writers
alternated, ``--runs`` times each (after one untimed run each: kernels loaded), and prints the
median ns a row and the bytes a row; ``--columns`` also times each top-level column alone. The
file of each writer is read back by pyarrow and compared with the table (exact), and counted by
polars. Run under ``flock /tmp/bench.lock`` on a shared machine.

    .venv/bin/python tests/perf/bench_parquet_typed.py [--table PATH] [--runs 7] [--columns]
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.delta.parquet import FastParquetWriter
from pipelines.typed.job import typed_parquet_options


def write(table: pa.Table, engine: str, options: dict[str, Any]) -> tuple[float, pa.Buffer]:
    """(thread CPU seconds, file bytes) of writing ``table`` with ``engine``."""
    sink = pa.BufferOutputStream()
    start = time.thread_time()
    writer: Any = (
        FastParquetWriter(sink, table.schema, **options)
        if engine == "loglake"
        else pq.ParquetWriter(sink, table.schema, **options)
    )
    writer.write_table(table)
    writer.close()
    return time.thread_time() - start, sink.getvalue()


def measure(table: pa.Table, options: dict[str, Any], runs: int) -> dict[str, tuple[float, int]]:
    """Per engine: (median ns a row, bytes a row x 1000)."""
    times: dict[str, list[float]] = {"pyarrow": [], "loglake": []}
    sizes = {}
    for engine in times:
        write(table, engine, options)  # untimed: kernels compiled or loaded
    for _ in range(runs):
        for engine, taken in times.items():
            seconds, data = write(table, engine, options)
            taken.append(seconds)
            sizes[engine] = data.size
    n = max(table.num_rows, 1)
    return {e: (statistics.median(t) / n * 1e9, sizes[e]) for e, t in times.items()}


def decoded_table(n: int) -> pa.Table:
    """``bench_decode.py``'s ``n`` values decoded by the job's Avro decoder, in the Delta types
    the job writes (:func:`~pipelines.typed.columns.delta_type`), with a ``_kafka`` column of
    one partition's consecutive offsets (the job's :func:`~pipelines.typed.job._kafka_column`)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_decode

    from pipelines.typed.avro import compile_decoder
    from pipelines.typed.columns import conform, delta_type
    from pipelines.typed.job import KAFKA_TYPE, _kafka_column

    decoded = compile_decoder(bench_decode.SCHEMA_TEXT).decode(bench_decode.make_values(n, 20_000))
    if decoded.error_count:
        raise SystemExit(f"{decoded.error_count} of the bench's values did not decode")
    values = decoded.values
    rows = pa.table(
        {
            "partition": pa.array(np.zeros(n, np.int32)),
            "offset": pa.array(np.arange(n, dtype=np.int64)),
            "timestamp": pa.array(
                np.arange(n, dtype=np.int64) + 1_700_000_000_000_000, pa.timestamp("us", "UTC")
            ),
            "timestamp_type": pa.array(np.zeros(n, np.int32)),
            "key": pa.nulls(n, pa.binary()),
            "headers": pa.array([[]] * n, KAFKA_TYPE.field("headers").type),
        }
    )
    columns = {
        f.name: conform(values.field(i), delta_type(f.type)) for i, f in enumerate(values.type)
    }
    columns["_kafka"] = _kafka_column(rows, pa.nulls(n, pa.int32()), pa.array(np.ones(n, np.int32)))
    return pa.table(columns)


def check(table: pa.Table, options: dict[str, Any]) -> None:
    for engine in ("pyarrow", "loglake"):
        _, data = write(table, engine, options)
        back = pq.read_table(pa.BufferReader(data))
        if not back.equals(table):
            raise SystemExit(f"{engine}: the file does not read back as the table")
        if pl.read_parquet(io.BytesIO(data.to_pybytes())).height != table.num_rows:
            raise SystemExit(f"{engine}: polars reads a different number of rows")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--table", help="an Arrow IPC file of the table (default: made here)")
    parser.add_argument("--records", type=int, default=1_000_000, help="rows made, no --table")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--columns", action="store_true")
    args = parser.parse_args()
    if args.table:
        table = pa.ipc.open_file(pa.memory_map(args.table)).read_all()
    else:
        table = decoded_table(args.records)
    options = {
        **typed_parquet_options(table.schema),
        "compression": "zstd",
        "store_decimal_as_integer": True,
    }
    check(table, options)
    n = table.num_rows
    result = measure(table, options, args.runs)
    for engine, (ns, size) in result.items():
        print(f"table {engine:8s} {ns:7.1f} ns/row {size / n:6.2f} B/row")
    if not args.columns:
        return
    for name in table.column_names:
        one = table.select([name])
        prefix = f"{name}."
        own = {
            k: [p for p in v if p == name or p.startswith(prefix)]
            if isinstance(v, list)
            else {p: e for p, e in v.items() if p == name or p.startswith(prefix)}
            if isinstance(v, dict)
            else v
            for k, v in options.items()
        }
        result = measure(one, own, args.runs)
        figures = "  ".join(
            f"{e} {ns:6.1f} ns/row {size / n:6.2f} B/row" for e, (ns, size) in result.items()
        )
        print(f"{name:10s} {figures}")


if __name__ == "__main__":
    main()
