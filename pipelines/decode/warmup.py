"""Compile an ingest task's and a decode task's numba kernels into numba's on-disk cache:
``python -m pipelines.decode.warmup``.

The kernels (the decoder's ``_kernels.py``, the Parquet writer's ``_parquet_kernels.py`` for
the records table and, by :func:`warm_typed_writer`, for the typed tables' nested columns, and
the typed tables' Avro and Protobuf kernels ``pipelines/typed/avro_kernel.py`` and
``protobuf_kernel.py``, warmed by :func:`pipelines.typed.avro.warm` and
:func:`pipelines.typed.protobuf.warm`) are compiled on first use (``cache=True``) and the machine
code is kept next to them; without it, the first job after an install compiles them in every
Spark Python worker at once (~6 s each, measured). ``tools/bootstrap.sh`` runs this when a
cache is older than its kernels. It reads a tiny segment the way an ingest task does (one
uncompressed and one lz4 batch, with headers, a null key and a null header value) and writes
the records as the ingest job does, so every specialisation a task needs is compiled (the
kernels are typed by their arguments: nulls take other paths, and the uncompressed and lz4
chunks reach them through different buffers).
"""

from __future__ import annotations

import sys
import tempfile
import time
from decimal import Decimal

import pyarrow as pa

from logstore.protocol.batch import Codec
from logstore.protocol.records import RecordLike, build_batch
from pipelines.delta.files import RECORDS_PARQUET_OPTIONS
from pipelines.delta.parquet import FastParquetWriter
from pipelines.sources.plan import parse_options, plan_ranges
from pipelines.sources.read import RangeReport, read_records
from pipelines.sources.synthetic import write_batches
from pipelines.typed.avro import warm as warm_avro
from pipelines.typed.job import TYPED_PARQUET_WRITER, typed_parquet_options
from pipelines.typed.protobuf import warm as warm_protobuf


def warm() -> int:
    """Decode both batch kinds once and write them; returns the number of records read (4)."""
    records: list[RecordLike] = [
        (b"k0", b"", [("h", b"x")], 1_700_000_000_000),
        (None, b"v", [("h", None)], 1_700_000_000_001),
    ]
    rows = 0
    writer_options = {k: v for k, v in RECORDS_PARQUET_OPTIONS.items() if k != "parquet_writer"}
    with tempfile.TemporaryDirectory(prefix="loglake-warmup-") as tmp:
        # One partition per codec: a chunk of uncompressed batches is decoded in place, one
        # with a compressed batch from the arena.
        for partition, codec in enumerate((Codec.NONE, Codec.LZ4)):
            write_batches(tmp, "warmup", partition, [build_batch(records, codec=codec)])
        options = parse_options({"path": tmp, "until": "latest"})
        for rng in plan_ranges(options):
            report = RangeReport(rng.topic, rng.partition)
            for batch in read_records(
                rng, min_timestamp=options.min_timestamp, max_timestamp=options.max_timestamp,
                report=report,
            ):  # fmt: skip
                rows += batch.num_rows
                table = pa.Table.from_batches([batch]).drop_columns(["topic", "date"])
                sink = pa.BufferOutputStream()
                with FastParquetWriter(sink, table.schema, **writer_options) as out:
                    out.write_table(table)
    return rows


def warm_typed_writer() -> int:
    """Write a small typed table (the decode job's shape: a struct with nulls under it, a list
    of strings, a list inside a struct, floats, a decimal, a timestamp, dictionaries) with the
    decode job's Parquet writer and options, compiling the writer's nested-column kernels
    (levels, fixed-width dictionaries, ...) that the records table does not reach; returns the
    rows written (4)."""
    address = pa.struct([("street", pa.string()), ("zip", pa.string())])
    headers = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    table = pa.table(
        {
            "id": pa.array([1, 2, 2, None], pa.int64()),
            "n": pa.array([1, 1, 2, 3], pa.int32()),
            "price": pa.array([1.5, None, 2.5, 2.5], pa.float64()),
            "ratio": pa.array([0.5, 0.5, None, 1.0], pa.float32()),
            "amount": pa.array(
                [Decimal("1.25"), None, Decimal("-2"), Decimal("0.01")], pa.decimal128(12, 2)
            ),
            "created": pa.array([1, 2, 3, None], pa.timestamp("us", tz="UTC")),
            "name": pa.array(["a", "b", None, "a"]),
            "tags": pa.array([["x"], [], None, ["y", None]], pa.list_(pa.string())),
            "address": pa.array(
                [{"street": "s", "zip": None}, None, {"street": None, "zip": "z"}, {}], address
            ),
            "_kafka": pa.array(
                [
                    {"p": 0, "h": [{"key": "k", "value": b"v"}]},
                    {"p": 1, "h": []},
                    {"p": 0},
                    {"p": 1, "h": None},
                ],
                pa.struct([("p", pa.int32()), ("h", headers)]),
            ),
        }
    )
    options = {k: v for k, v in TYPED_PARQUET_WRITER.items() if k != "parquet_writer"}
    sink = pa.BufferOutputStream()
    with FastParquetWriter(
        sink, table.schema, compression="zstd", **typed_parquet_options(table.schema), **options
    ) as out:
        out.write_table(table)
    return int(table.num_rows)


def main() -> None:
    started = time.monotonic()
    rows = warm()
    if rows != 4:
        raise SystemExit(f"ingest kernels warm-up read {rows} records, expected 4")
    avro_rows = warm_avro()  # raises when the kernel decodes wrong
    protobuf_rows = warm_protobuf()  # likewise
    typed_rows = warm_typed_writer()
    print(
        f"ingest, Avro and Protobuf kernels compiled/cached in "
        f"{time.monotonic() - started:.1f} s ({rows} records read, {avro_rows} Avro values "
        f"decoded, {protobuf_rows} Protobuf values decoded, {typed_rows} typed rows written)",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
