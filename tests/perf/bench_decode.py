"""Benchmark: Avro values -> typed columns (issue 22), baselines measured in the same run.

The schema (12 fields: a nested record, an array, a union, a timestamp-millis and a decimal)
and the payloads are built in memory: ``--distinct`` different records written by fastavro,
Confluent-framed (magic 0 + schema id), repeated to ``--records`` values. Measures (one
function each; the job's own measures go beside them):

- ``decoder``: :class:`pipelines.typed.avro.AvroDecoder` over all the values, one call per
  ``--batch`` values, in-process on one core;
- ``fastavro``: ``decode_reference`` (fastavro's ``schemaless_reader`` per record, the
  values then turned into the same Arrow struct) over ``--baseline-records`` values;
- ``fastavro_read_only``: the ``schemaless_reader`` calls alone (no Arrow): the floor of any
  per-record Python decoder;
- ``spark_map_in_pandas`` (``--spark``): the do-it-yourself Spark job, ``mapInPandas`` calling
  fastavro per record on ``local[2]`` over ``--spark-records`` values, the values counted.

Last line: one JSON object with records/s per measure and the ratios to the decoder.

    .venv/bin/python tests/perf/bench_decode.py [--records 1000000] [--spark]
"""

from __future__ import annotations

import argparse
import datetime
import decimal
import io
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa

from pipelines.typed.avro import compile_decoder, decode_reference

SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "quantity", "type": "int"},
        {"name": "price", "type": "double"},
        {"name": "paid", "type": "boolean"},
        {"name": "created", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {
            "name": "amount",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2},
        },
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {
            "name": "address",
            "type": {
                "type": "record",
                "name": "Address",
                "fields": [
                    {"name": "street", "type": "string"},
                    {"name": "city", "type": "string"},
                    {"name": "zip", "type": ["null", "string"], "default": None},
                ],
            },
        },
        {
            "name": "status",
            "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SENT"]},
        },
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "discount", "type": ["null", "float"], "default": None},
    ],
}
SCHEMA_TEXT = json.dumps(SCHEMA)
HEADER = b"\x00\x00\x00\x00\x01"  # Confluent's magic byte and schema id 1


def make_record(i: int, rng: np.random.Generator) -> dict[str, Any]:
    return {
        "id": int(i),
        "customer": f"customer-{int(rng.integers(1_000_000)):07d}",
        "quantity": int(rng.integers(1, 100)),
        "price": float(rng.random() * 100),
        "paid": bool(i % 2),
        "created": datetime.datetime(2026, 11, 27, tzinfo=datetime.UTC)
        + datetime.timedelta(milliseconds=int(rng.integers(86_400_000))),
        "amount": decimal.Decimal(int(rng.integers(-(10**8), 10**8))).scaleb(-2),
        "tags": [f"t{j}" for j in range(int(rng.integers(0, 4)))],
        "address": {
            "street": f"{int(rng.integers(1, 999))} Main Street",
            "city": ["Paris", "Lyon", "Oslo", "Lima"][i % 4],
            "zip": None if i % 3 == 0 else f"{int(rng.integers(10000, 99999))}",
        },
        "status": ["NEW", "PAID", "SENT"][i % 3],
        "note": None if i % 5 else "gift wrap",
        "discount": None if i % 2 else 0.25,
    }


def make_values(records: int, distinct: int) -> pa.BinaryArray:
    """``records`` Confluent-framed values (``distinct`` different ones, repeated)."""
    rng = np.random.default_rng(22)
    parsed = fastavro.parse_schema(SCHEMA)
    payloads = []
    for i in range(min(distinct, records)):
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, make_record(i, rng))
        payloads.append(HEADER + out.getvalue())
    one = pa.array(payloads, pa.binary())
    idx = np.tile(np.arange(len(payloads), dtype=np.int32), -(-records // len(payloads)))
    return one.take(pa.array(idx[:records]))


def timed(fn: Callable[[], int], repeat: int) -> tuple[float, int]:
    """Best wall time of ``repeat`` runs and the rows the run handled."""
    best, rows = float("inf"), 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        rows = fn()
        best = min(best, time.perf_counter() - t0)
    return best, rows


def measure_decoder(values: pa.BinaryArray, batch: int, repeat: int) -> float:
    dec = compile_decoder(SCHEMA_TEXT)
    dec.decode(values.slice(0, 100))  # compile or load the kernel outside the timing

    def run() -> int:
        n = 0
        for start in range(0, len(values), batch):
            out = dec.decode(values.slice(start, batch))
            if out.error_count:
                raise SystemExit(f"decoder: {out.error_count} errors: {out.errors.drop_null()[0]}")
            n += len(out.values)
        return n

    seconds, rows = timed(run, repeat)
    return rows / seconds


def measure_fastavro(values: pa.BinaryArray, repeat: int) -> float:
    seconds, rows = timed(lambda: len(decode_reference(values, SCHEMA_TEXT).values), repeat)
    return rows / seconds


def measure_fastavro_read_only(values: pa.BinaryArray, repeat: int) -> float:
    parsed = fastavro.parse_schema(SCHEMA)
    raw = values.to_pylist()

    def run() -> int:
        for v in raw:
            fastavro.schemaless_reader(io.BytesIO(v[5:]), parsed, None)
        return len(raw)

    seconds, rows = timed(run, repeat)
    return rows / seconds


def measure_spark_map_in_pandas(values: pa.BinaryArray) -> float:
    """Spark's do-it-yourself path on local[2]: mapInPandas, fastavro per record, the typed
    columns as a pandas frame; counted (every row decoded)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pipelines.session import get_spark
    from tests.fixtures.spark import SPARK_TEST_CONF

    spark = get_spark("bench-decode", master="local[2]", conf=SPARK_TEST_CONF)
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.createDataFrame(pa.table({"value": values}).to_pandas()).repartition(2).cache()
    df.count()
    ddl = (
        "id long, customer string, quantity int, price double, paid boolean, created timestamp, "
        "amount decimal(12,2), tags array<string>, address struct<street: string, city: string,"
        " zip: string>, status string, note string, discount float"
    )

    def decode(frames: Any) -> Any:
        import pandas as pd  # type: ignore[import-untyped]

        parsed = fastavro.parse_schema(SCHEMA)
        for frame in frames:
            rows = [
                fastavro.schemaless_reader(io.BytesIO(v[5:]), parsed, None) for v in frame.value
            ]
            yield pd.DataFrame(rows)

    run = df.mapInPandas(decode, ddl)
    run.write.format("noop").mode("overwrite").save()  # the worker's first job, untimed
    t0 = time.perf_counter()
    run.write.format("noop").mode("overwrite").save()
    seconds = time.perf_counter() - t0
    spark.stop()
    return len(values) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--distinct", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100_000, help="values per decode call")
    parser.add_argument("--baseline-records", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--spark", action="store_true", help="also mapInPandas on local[2]")
    parser.add_argument("--spark-records", type=int, default=300_000)
    args = parser.parse_args()
    values = make_values(args.records, args.distinct)
    mb = values.buffers()[2].size / 1e6
    print(f"{len(values)} values, {mb:.1f} MB of payloads", flush=True)
    results: dict[str, float] = {}
    if hasattr(os, "sched_setaffinity"):  # in-process measures on one core
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    results["decoder"] = measure_decoder(values, args.batch, args.repeat)
    subset = values.slice(0, args.baseline_records)
    results["fastavro"] = measure_fastavro(subset, 1)
    results["fastavro_read_only"] = measure_fastavro_read_only(subset, 1)
    if args.spark:
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
        results["spark_map_in_pandas"] = measure_spark_map_in_pandas(
            values.slice(0, args.spark_records)
        )
    for name, rate in results.items():
        print(f"{name:>22}: {rate:>12,.0f} records/s", flush=True)
    ratios = {f"decoder/{n}": results["decoder"] / r for n, r in results.items() if n != "decoder"}
    for name, ratio in ratios.items():
        print(f"{name:>34}: {ratio:.1f}x")
    print(json.dumps({"records_per_s": results, "ratios": ratios}))


if __name__ == "__main__":
    main()
