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

The job part (``--job``, issue 22's targets), on ``local[2]`` over all ``--records`` values:
the values are appended as record batches (200 records, uncompressed, the distinct batches
repeated) to a ``bench`` topic's two partitions through the storage engine
(``pipelines.sources.synthetic.write_batches``), with high watermarks covering them; then

- ``job_raw_ingest`` (c): the real ingest job (``pipelines.ingest.run_ingest``, the shipped
  ``conf/pipeline.toml``) from those segments into the lake's ``records`` table: the raw
  bytes of the same records, written and committed;
- ``job_decode`` (a): ``jobs/decode.py``'s code path (``pipelines.typed.job.run_decode``, the
  same conf) from ``records`` into ``tables/bench``, the schema served by the project's
  registry in this process; every row must land, no dead letter;
- ``job_diy_map_in_pandas`` (b): the do-it-yourself job a user would write: the ``bench``
  files of ``records`` read by Spark, ``mapInPandas`` calling fastavro per record, written to
  Parquet by Spark's own writer (no Delta commit: the baseline is if anything flattered).

Each job measure also gives its CPU-microseconds per record (``*_cpu_us``: this process, the
JVM and Spark's Python workers, from ``/proc``), and the ratios are given by CPU too: on a
machine shared with other work the wall-clock ratios depend on what else ran during each
step; the CPU ratios do not (much).

Each is preceded by the same step over a small ``warmup`` topic (untimed: Python workers
started, kernels loaded). Targets: (a)/(b) >= 5, (a)/(c) >= 0.5.

Where the decode job's time goes (profiled 2026-11-28, pyinstrument in the executors' Python
workers and CPU-seconds per step in one process; load average 5-11 on 2 cores, so per-record
figures are +-20%): the job is CPU-bound in its tasks from 1M records on. The driver spends
~0.05 CPU-s a run (no row comes back), there is no shuffle; at 10M ``records`` holds 12 files
(ingest: 12 tasks) and decode runs 4 tasks (``2 * parallelism``) writing 4 files of 2.2-2.8M
rows. Per record, in a task: reading ``records`` (Parquet, 7 columns) 0.12-0.18 us; the Avro
kernel and building the nested Arrow arrays 0.38-0.41 us; the rest of the batch (``_kafka``,
conforming types) ~0.02 us; encoding the typed columns with pyarrow's Parquet writer (zstd,
dictionaries and statistics on) 0.31 us (snappy 0.28, no compression 0.28, no dictionary and
no statistics 0.23); Delta statistics 0.02 us. In the tasks of a profiled 10M run
(pyinstrument in every worker): decode 11.9 CPU-s, raw ingest 6.4 CPU-s (its numba Parquet
writer; the typed table's lists and nested structs take pyarrow's). By this bench's CPU
measures (``*_cpu_us``), raw ingest costs ~0.8 CPU-s a run plus ~0.42 us a record and
decode ~1.4 CPU-s plus ~1.1 us a record (1M: 1.17 vs 2.46 us a record, 10M: 0.46 vs 1.24):
decode / raw falls from ~0.5 at 1M towards ~0.38, the ratio of their per-record costs, as
the fixed costs are spread thin.

2026-11-28, second pass (load 8-15): the typed table's files now take
:func:`pipelines.typed.job.typed_parquet_options` (DELTA_BINARY_PACKED ``_kafka`` offset and
timestamp, statistics on the flat top-level columns and ``_kafka``'s partition, offset and
timestamp only): pyarrow's encode ~320-345 -> ~250-280 ns a row, files 16.1 -> 13.8 bytes a row
(1M rows, one core). At 10M, two runs: decode 1.09 and 1.01 CPU-us a record, raw ingest 0.43
and 0.38 (by CPU 0.39 and 0.38; wall 0.29 at load 14, 0.33 at load 10 -> 4). What is left, per
record in one process: the Avro kernel ~0.36-0.40 us (an interpreter over the schema's program,
~25 instructions a row; the snapshot of the counters and the UTF-8 checks are ~0.02 each),
pyarrow's encode ~0.25 (of which the nested columns: ``tags`` ~0.07, ``_kafka`` ~0.07,
``address`` ~0.05), reading ``records`` ~0.11 (the ``value`` column alone ~0.095: snappy and
the byte-array copy). Our :class:`~pipelines.delta.parquet.FastParquetWriter` writes the flat
columns of this table without dictionaries in ~65 ns a row against pyarrow's ~87-117, but
cannot write the table (floats, decimals, lists of scalars, structs, ``_kafka``'s list inside a
struct): teaching it those is the next step toward 0.5, with the kernel's dispatch.

2026-11-28, third pass: the job's decoders take a kernel generated for the schema pair
(:mod:`pipelines.typed.avro_codegen`, the interpreter partially evaluated: no instruction
fetch or dispatch, the opcodes, nodes and widths folded to constants). Before the job
measures the bench compiles it in this process (printed: ~4 s once per machine and schema pair,
~0.2 s to load from the cache afterwards), as a machine's first decode of the pair does; the
workers load it. Per row in one process (1M rows, CPU time, load ~3): interpreter 0.33-0.34
us, generated 0.25. Two things made the generated code slower than the interpreter at first,
and are calls now: the UTF-8 check and the multi-byte varints in line at every field (the
code outgrew what LLVM optimises well: 0.48 us), and ``null_entry``'s fifteen array arguments
per null (unrolled instead). At 10M, load 3.5 -> 2.3: decode 0.73 CPU-us a record (was
0.98-1.06), raw ingest 0.33; wall 0.46, by CPU 0.45.

Fourth pass (session 17): the generated kernel's per-value calls to the UTF-8 check, the
decimal conversion and the float reads were ~75, ~50 and ~20 ns of its ~250 a row; in line
(an ASCII byte loop before the check, int64 decimals against constant bounds, a scratch
buffer for floats) it takes ~140 (interpreter 0.33 us, load ~6), and the Confluent headers
are read in one compiled pass (~19 -> ~6 ns). At 10M, alternated with ``main`` under the
bench lock: decode 0.73 and 0.72 CPU-us a record (``main`` 0.82 and 0.90), raw ingest 0.35
(0.35-0.36); by CPU 0.48 and 0.49, wall 0.47 and 0.48. Then with two-byte varints in line
as well (kernel ~140 -> ~130 ns a row), two runs, load 2.3 -> 9.9 and 8.9 -> 8.4: decode 0.69
and 0.77, raw ingest 0.37 and 0.41, by CPU 0.53 and 0.53, wall 0.56 and 0.74 (the spread
between runs is +-0.05 CPU-us a record).

Fifth pass (session 20, 2026-11-29, load 0.2-2.6, a helper working beside): the typed files
are written by :class:`~pipelines.delta.parquet.FastParquetWriter` (floats, decimals as
integers, structs, one list level; ``TYPED_PARQUET_WRITER``), the Delta string bounds come
from its footer instead of a second ``min_max`` (~17 ns a row for each of ``customer`` and
``status``), a struct leaf with nothing null on its path skips the levels kernel, and the
batch's columns are no longer copied by ``combine_chunks`` (one chunk: ~46 ns a row of the
85-byte values). Per record in one process (2M, in-process, CPU): reading ``records`` ~0.22
us, the Avro kernel and build ~0.45, the Parquet encode ~0.45, Delta statistics ~0.02. At 10M,
before (pyarrow's writer): decode 1.37 CPU-us a record, raw 0.64, wall 0.43, by CPU 0.47;
after, four runs: decode 1.35 / 1.27 / 0.99 / 1.11, raw 0.74 / 0.64 / 0.64 / 0.67, wall
**0.53 / 0.45 / 0.60 / 0.59**, by CPU **0.55 / 0.51 / 0.65 / 0.61** (medians 0.56 and 0.58).
The spread is the machine's: the same run's raw ingest moved 0.64-0.74.

Last line: one JSON object with records/s per measure and the ratios.

    .venv/bin/python tests/perf/bench_decode.py [--records 1000000] [--spark] [--job]
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
from pathlib import Path
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
    run = df.mapInPandas(_diy_decode, DIY_DDL)
    run.write.format("noop").mode("overwrite").save()  # the worker's first job, untimed
    t0 = time.perf_counter()
    run.write.format("noop").mode("overwrite").save()
    seconds = time.perf_counter() - t0
    spark.stop()
    return len(values) / seconds


def _write_log(log_dir: str, topic: str, values: pa.BinaryArray) -> dict[int, int]:
    """``values`` as uncompressed 200-record batches over the topic's two partitions (the
    distinct batches built once and repeated; the log assigns the offsets)."""
    from logstore.protocol.batch import Codec
    from logstore.protocol.records import build_batch
    from pipelines.sources.synthetic import write_batches

    per_batch = 200
    distinct = values.slice(0, min(len(values), DISTINCT_BATCHES * per_batch)).to_pylist()
    built = [
        build_batch(
            [
                (None, v, [], 1_790_000_000_000 + i + j)
                for j, v in enumerate(distinct[i : i + per_batch])
            ],
            codec=Codec.NONE,
        )
        for i in range(0, len(distinct), per_batch)
    ]
    count = len(values) // per_batch
    ends = {}
    for partition in (0, 1):
        mine = range(partition, count, 2)
        batches = (built[i % len(built)] for i in mine)
        ends[partition] = write_batches(log_dir, topic, partition, batches)[1]
    return ends


def tree_cpu_s() -> float:
    """CPU-seconds (user + system) so far of this process and all its descendants: the
    JVM that spark-submit starts and Spark's Python workers (their reaped children
    included). Steadier than wall-clock on a shared machine; read before and after a step."""
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    used: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        # after the command: state, ppid, ..., utime (12), stime, cutime, cstime (15)
        parent[int(name)] = int(fields[1])
        used[int(name)] = sum(int(x) for x in fields[11:15])
    total, todo = 0, [os.getpid()]
    while todo:
        pid = todo.pop()
        total += used.get(pid, 0)
        todo.extend(c for c, pp in parent.items() if pp == pid)
    return total / tick


def measure_job(values: pa.BinaryArray, config_path: str) -> dict[str, float]:
    """(a) decode job, (b) do-it-yourself mapInPandas job, (c) raw ingest; records/s each,
    and each one's CPU-microseconds per record (``*_cpu_us``: :func:`tree_cpu_s`)."""
    import dataclasses
    import tempfile
    import urllib.request
    from pathlib import Path

    from deltalake import DeltaTable

    from logstore.registry.http import RegistryServer
    from logstore.registry.store import SchemaStore
    from pipelines.ingest import load_config, run_ingest
    from pipelines.session import get_spark
    from pipelines.sources.synthetic import write_high_watermarks
    from pipelines.typed.config import load_decode_config
    from pipelines.typed.job import run_decode

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = Path(tempfile.mkdtemp(prefix="bench-decode-"))
    log_dir, lake = work / "logs", work / "lake"
    ends = {
        t: _write_log(str(log_dir), t, v)
        for t, v in (("bench", values), ("warmup", values.slice(0, 20_000)))
    }
    write_high_watermarks(log_dir, {(t, p): e for t, pe in ends.items() for p, e in pe.items()})
    n, w = sum(ends["bench"].values()), sum(ends["warmup"].values())
    print(f"job: {n} records in {log_dir}", flush=True)
    # The job's decoders ("auto") take the generated kernel where this machine compiled it
    # before (pipelines.typed.avro_codegen): compiled here, as the first run on a machine
    # does once per schema pair; its cost is printed, not in the measures
    t0 = time.perf_counter()
    generated = compile_decoder(SCHEMA_TEXT, kernel="generated")
    print(
        f"generated Avro kernel ({generated.kernel}): compiled or loaded from this machine's "
        f"cache in {time.perf_counter() - t0:.2f} s",
        flush=True,
    )
    server = RegistryServer(SchemaStore(append=lambda records: None))
    host, port = server.start("127.0.0.1", 0)
    url = f"http://{host}:{port}"
    for subject in ("bench-value", "warmup-value"):
        req = urllib.request.Request(
            f"{url}/subjects/{subject}/versions",
            data=json.dumps({"schema": SCHEMA_TEXT}).encode(),
            headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
        )
        with urllib.request.urlopen(req) as resp:
            if json.load(resp)["id"] != 1:
                raise SystemExit("the registry gave the schema an id other than the values' 1")
    spark = get_spark(
        "bench-decode-job",
        master="local[2]",
        conf={"spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC"},
    )
    spark.sparkContext.setLogLevel("ERROR")
    out: dict[str, float] = {}
    try:
        base = load_config(config_path, log_dirs=[str(log_dir)], lake=str(lake))
        for topic, expected in (("warmup", w), ("bench", n)):
            config = dataclasses.replace(base, topics=(topic,), progress_interval_s=0.0)
            t0, c0 = time.perf_counter(), tree_cpu_s()
            summary = run_ingest(spark, config, log=lambda _m: None)
            seconds, cpu = time.perf_counter() - t0, tree_cpu_s() - c0
            if summary.records != expected:
                raise SystemExit(f"ingest {topic}: {summary.records} records, expected {expected}")
        out["job_raw_ingest"] = n / seconds
        out["job_raw_ingest_cpu_us"] = cpu / n * 1e6
        decode_config = load_decode_config(config_path, lake=str(lake), registry_url=url)
        for topic, expected in (("warmup", w), ("bench", n)):
            t0, c0 = time.perf_counter(), tree_cpu_s()
            result = run_decode(spark, decode_config, topics=[topic]).topics[0]
            seconds, cpu = time.perf_counter() - t0, tree_cpu_s() - c0
            if result.rows != expected or result.dead_letters or not result.committed:
                raise SystemExit(f"decode {topic}: {result}")
        rows = DeltaTable(decode_config.table_path("bench")).to_pyarrow_dataset().count_rows()
        if rows != n:
            raise SystemExit(f"tables/bench holds {rows} rows, expected {n}")
        out["job_decode"] = n / seconds
        out["job_decode_cpu_us"] = cpu / n * 1e6
        records = DeltaTable(str(lake / "records"))
        for topic, expected in (("warmup", w), ("bench", n)):
            files = [u for u in records.file_uris() if f"/topic={topic}/" in u]
            t0, c0 = time.perf_counter(), tree_cpu_s()
            df = spark.read.parquet(*files).select("value")
            # Spark's own Parquet writer: what a do-it-yourself job has without Delta's jars
            # (no Delta commit, so the baseline is if anything flattered)
            diy_path = str(lake / f"diy_{topic}")
            df.mapInPandas(_diy_decode, DIY_DDL).write.mode("overwrite").option(
                "compression", decode_config.compression
            ).parquet(diy_path)
            seconds, cpu = time.perf_counter() - t0, tree_cpu_s() - c0
            diy_rows = spark.read.parquet(diy_path).count()
            if diy_rows != expected:
                raise SystemExit(f"diy {topic}: {diy_rows} rows, expected {expected}")
        out["job_diy_map_in_pandas"] = n / seconds
        out["job_diy_map_in_pandas_cpu_us"] = cpu / n * 1e6
    finally:
        spark.stop()
        server.stop()
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return out


DISTINCT_BATCHES = 100
DIY_DDL = (
    "id long, customer string, quantity int, price double, paid boolean, created timestamp, "
    "amount decimal(12,2), tags array<string>, address struct<street: string, city: string,"
    " zip: string>, status string, note string, discount float"
)


def _diy_decode(frames: Any) -> Any:
    """The do-it-yourself decode: fastavro per record, the rows as a pandas frame."""
    import pandas as pd  # type: ignore[import-untyped]

    parsed = fastavro.parse_schema(SCHEMA)
    for frame in frames:
        rows = [fastavro.schemaless_reader(io.BytesIO(v[5:]), parsed, None) for v in frame.value]
        yield pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--distinct", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100_000, help="values per decode call")
    parser.add_argument("--baseline-records", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--spark", action="store_true", help="also mapInPandas on local[2]")
    parser.add_argument("--spark-records", type=int, default=300_000)
    parser.add_argument(
        "--job", action="store_true", help="also the decode job vs mapInPandas vs raw ingest"
    )
    parser.add_argument(
        "--config", default=str(Path(__file__).resolve().parents[2] / "conf" / "pipeline.toml")
    )
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
    if args.job:
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
        results.update(measure_job(values, args.config))
    for name, rate in results.items():
        if name.endswith("_cpu_us"):
            print(f"{name:>30}: {rate:>8.2f} CPU-us/record", flush=True)
        else:
            print(f"{name:>30}: {rate:>12,.0f} records/s", flush=True)
    ratios = {
        f"decoder/{n}": results["decoder"] / r
        for n, r in results.items()
        if n != "decoder" and not n.startswith("job_")
    }
    if args.job:
        ratios["job_decode/job_diy_map_in_pandas (target >= 5)"] = (
            results["job_decode"] / results["job_diy_map_in_pandas"]
        )
        ratios["job_decode/job_raw_ingest (target >= 0.5)"] = (
            results["job_decode"] / results["job_raw_ingest"]
        )
        # the same two ratios by CPU per record (of the driver, the JVM and the Python
        # workers): what the wall-clock ratios tend to on an idle machine
        ratios["by CPU: job_decode/job_diy_map_in_pandas"] = (
            results["job_diy_map_in_pandas_cpu_us"] / results["job_decode_cpu_us"]
        )
        ratios["by CPU: job_decode/job_raw_ingest"] = (
            results["job_raw_ingest_cpu_us"] / results["job_decode_cpu_us"]
        )
    for name, ratio in ratios.items():
        print(f"{name:>34}: {ratio:.1f}x")
    print(json.dumps({"records_per_s": results, "ratios": ratios}))


if __name__ == "__main__":
    main()
