"""The typed tables' Parquet writer options (``typed_parquet_options``): which leaves get
DELTA_BINARY_PACKED and statistics, and that a file written with them reads back equal
(delta-rs, polars and Spark read such files in tests/integration/typed/test_decode_avro.py)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.delta.files import PartitionedFileWriter
from pipelines.typed.job import KAFKA_TYPE, typed_parquet_options

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("name", pa.string()),
        pa.field("tags", pa.list_(pa.string())),
        pa.field("ship", pa.struct([pa.field("city", pa.string())])),
        pa.field("_key", pa.string()),
        pa.field("_kafka", KAFKA_TYPE),
    ]
)


def _rows(n: int) -> pa.Table:
    at = dt.datetime(2026, 11, 28, tzinfo=dt.UTC)
    header = [{"key": "h", "value": b"v"}]
    kafka = [
        {"partition": i % 2, "offset": i, "timestamp": at + dt.timedelta(seconds=i),
         "timestamp_type": 0, "key": None, "headers": header if i % 3 else [],
         "key_schema_id": 2, "value_schema_id": 1}
        for i in range(n)
    ]  # fmt: skip
    return pa.table(
        {
            "id": list(range(n)),
            "name": [None if i % 4 == 0 else f"n{i}" for i in range(n)],
            "tags": [[f"t{j}" for j in range(i % 3)] for i in range(n)],
            "ship": [{"city": "Oslo"} if i % 5 else None for i in range(n)],
            "_key": [f"k{i}" for i in range(n)],
            "_kafka": kafka,
        },
        schema=SCHEMA,
    )


def test_the_options_name_leaves_of_the_file() -> None:
    options = typed_parquet_options(SCHEMA)
    assert options["column_encoding"] == {
        "_kafka.offset": "DELTA_BINARY_PACKED",
        "_kafka.timestamp": "DELTA_BINARY_PACKED",
    }
    assert options["write_statistics"] == [
        "id",
        "name",
        "_key",
        "_kafka.partition",
        "_kafka.offset",
        "_kafka.timestamp",
    ]
    dictionary = options["use_dictionary"]
    assert "_kafka.offset" not in dictionary and "_kafka.timestamp" not in dictionary
    assert {"id", "tags.list.element", "ship.city", "_kafka.headers.list.element.key"} <= set(
        dictionary
    )


def test_files_written_with_them_read_back_equal(tmp_path: Path) -> None:
    rows = _rows(1000)
    writer = PartitionedFileWriter(
        tmp_path, write_id="w", task_id=0, attempt=0, partition_by=[], compression="zstd",
        **typed_parquet_options(SCHEMA),
    )  # fmt: skip
    writer.write(rows)
    [written] = writer.close()
    path = tmp_path / written.path
    assert pq.read_table(path).equals(rows)
    meta = pq.ParquetFile(path).metadata.row_group(0)
    col = {meta.column(i).path_in_schema: meta.column(i) for i in range(meta.num_columns)}
    assert "DELTA_BINARY_PACKED" in col["_kafka.timestamp"].encodings
    assert col["_kafka.offset"].statistics.max == 999
    assert not col["ship.city"].is_stats_set
