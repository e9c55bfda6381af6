"""Compile an ingest task's and a decode task's numba kernels into numba's on-disk cache:
``python -m pipelines.decode.warmup``.

The kernels (the decoder's ``_kernels.py``, the Parquet writer's ``_parquet_kernels.py``, and
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

import pyarrow as pa

from logstore.protocol.batch import Codec
from logstore.protocol.records import RecordLike, build_batch
from pipelines.delta.files import RECORDS_PARQUET_OPTIONS
from pipelines.delta.parquet import FastParquetWriter
from pipelines.sources.plan import parse_options, plan_ranges
from pipelines.sources.read import RangeReport, read_records
from pipelines.sources.synthetic import write_batches
from pipelines.typed.avro import warm as warm_avro
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


def main() -> None:
    started = time.monotonic()
    rows = warm()
    if rows != 4:
        raise SystemExit(f"ingest kernels warm-up read {rows} records, expected 4")
    avro_rows = warm_avro()  # raises when the kernel decodes wrong
    protobuf_rows = warm_protobuf()  # likewise
    print(
        f"ingest, Avro and Protobuf kernels compiled/cached in "
        f"{time.monotonic() - started:.1f} s ({rows} records read, {avro_rows} Avro values "
        f"decoded, {protobuf_rows} Protobuf values decoded)",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
