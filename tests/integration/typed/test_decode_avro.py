"""jobs/decode.py on real Spark with Avro: values written by confluent-kafka's
``AvroSerializer`` against the project's registry, decoded into ``tables/<topic>``, read back
with delta-rs and polars and compared with ``AvroDeserializer``'s output; schema evolution,
dead letters, re-runs."""

from __future__ import annotations

import datetime as dt
import decimal
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import pyarrow.parquet as pq
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from deltalake import DeltaTable

from pipelines.typed.job import app_id, run_decode
from tests.fixtures.compaction import read_table_rows
from tests.fixtures.typed import decode_config, ingest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

ORDER_V1 = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {
            "name": "amount",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2},
        },
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "int"}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {
            "name": "ship",
            "type": {
                "type": "record",
                "name": "Ship",
                "fields": [
                    {"name": "city", "type": "string"},
                    {"name": "zip", "type": ["null", "int"]},
                ],
            },
        },
    ],
}
# BACKWARD-compatible: a new nullable field
ORDER_V2 = {
    **ORDER_V1,
    "fields": [
        *ORDER_V1["fields"],
        {"name": "coupon", "type": ["null", "string"], "default": None},
    ],
}


def _order(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "customer": f"c{i % 3}",
        "amount": decimal.Decimal(f"{i}.{i % 100:02d}"),
        "at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i),
        "day": dt.date(2026, 1, 1) + dt.timedelta(days=i % 5),
        "status": "PAID" if i % 2 else "NEW",
        "tags": [f"t{j}" for j in range(i % 3)],
        "attrs": {"n": i} if i % 2 else {},
        "note": None if i % 4 else f"note {i}",
        "ship": {"city": "Oslo", "zip": None if i % 5 == 0 else 1000 + i},
    }


def _normalise(row: dict[str, Any]) -> dict[str, Any]:
    """A typed-table row in the deserializer's terms (maps as dicts, dates as dates)."""
    out = {k: v for k, v in row.items() if not k.startswith("_")}
    if isinstance(out.get("attrs"), list):
        out["attrs"] = dict(out["attrs"])
    return out


def test_avro_values_decode_into_typed_columns(
    spark: SparkSession, tmp_path: Path, registry_url: str
) -> None:
    sr = SchemaRegistryClient({"url": registry_url})
    ctx = SerializationContext("orders", MessageField.VALUE)
    ser = AvroSerializer(sr, json.dumps(ORDER_V1))
    values = [ser(_order(i), ctx) for i in range(20)]
    recs = ingest(tmp_path, "orders", values, keys=[str(i).encode() for i in range(20)])
    config = decode_config(tmp_path, registry_url)

    summary = run_decode(spark, config)
    [res] = summary.topics
    assert (res.topic, res.rows, res.dead_letters, res.committed) == ("orders", 20, 0, True)

    rows = sorted(read_table_rows(config.table_path("orders")), key=lambda r: r["_kafka"]["offset"])
    de = AvroDeserializer(SchemaRegistryClient({"url": registry_url}))
    expected = [de(v, ctx) for v in values]
    assert [_normalise(r) for r in rows] == expected
    kafka = rows[3]["_kafka"]
    assert kafka["partition"] == 0 and kafka["offset"] == 3 and kafka["key"] == b"3"
    assert kafka["value_schema_id"] == sr.get_latest_version("orders-value").schema_id
    assert kafka["key_schema_id"] is None and "_key" not in rows[0]
    assert kafka["headers"] == [{"key": "h", "value": b"x"}]
    assert kafka["timestamp"] == dt.datetime.fromtimestamp(recs[3].timestamp / 1000, tz=dt.UTC)

    # the data files' layout (typed_parquet_options), and Spark's own reader on it
    [uri] = DeltaTable(config.table_path("orders")).file_uris()
    meta = pq.ParquetFile(uri.removeprefix("file://")).metadata
    # pyarrow's writer (FastParquetWriter has no maps: attrs), with TYPED_PARQUET_WRITER's
    # decimals as integers
    assert meta.created_by.startswith("parquet-cpp"), meta.created_by
    assert meta.schema.column(meta.schema.names.index("amount")).physical_type == "INT64"
    chunks = meta.row_group(0)
    col = {chunks.column(i).path_in_schema: chunks.column(i) for i in range(chunks.num_columns)}
    assert "DELTA_BINARY_PACKED" in col["_kafka.offset"].encodings
    assert "DELTA_BINARY_PACKED" in col["_kafka.timestamp"].encodings
    assert col["_kafka.offset"].statistics.max == 19 and col["id"].statistics.min == 0
    assert col["_kafka.partition"].is_stats_set and col["customer"].is_stats_set
    assert not col["tags.list.element"].is_stats_set and not col["ship.city"].is_stats_set
    assert not col["_kafka.key"].is_stats_set
    by_spark = spark.read.parquet(uri).selectExpr(
        "_kafka.offset AS o", "unix_micros(_kafka.timestamp) AS ts", "tags", "ship.zip", "amount"
    )
    assert sorted(tuple(r) for r in by_spark.collect()) == [
        (k["offset"], k["timestamp"].timestamp() * 10**6, r["tags"], r["ship"]["zip"], r["amount"])
        for r in rows
        for k in [r["_kafka"]]
    ]

    # a re-run is a no-op: no new version of the table
    table = DeltaTable(config.table_path("orders"))
    before = table.version()
    again = run_decode(spark, config)
    assert again.topics[0].committed is False and again.topics[0].note == "up to date"
    assert DeltaTable(config.table_path("orders")).version() == before
    assert table.transaction_version(app_id("orders", 0)) == 20


def test_typed_files_of_loglakes_writer_read_back_everywhere(
    spark: SparkSession, tmp_path: Path, registry_url: str
) -> None:
    """A schema FastParquetWriter supports (ORDER_V1 without its map) is written by it
    (TYPED_PARQUET_WRITER), decimals as INT64: Spark's reader, delta-rs and polars read the
    rows back, and the Delta statistics of the decimal are its values'."""
    schema = {**ORDER_V1, "fields": [f for f in ORDER_V1["fields"] if f["name"] != "attrs"]}
    sr = SchemaRegistryClient({"url": registry_url})
    ctx = SerializationContext("orders", MessageField.VALUE)
    ser = AvroSerializer(sr, json.dumps(schema))
    orders = [{k: v for k, v in _order(i).items() if k != "attrs"} for i in range(20)]
    ingest(tmp_path, "orders", [ser(o, ctx) for o in orders])
    config = decode_config(tmp_path, registry_url)
    [res] = run_decode(spark, config).topics
    assert (res.rows, res.dead_letters, res.committed) == (20, 0, True)

    table = DeltaTable(config.table_path("orders"))
    [uri] = table.file_uris()
    path = uri.removeprefix("file://")
    meta = pq.ParquetFile(path).metadata
    assert meta.created_by.startswith("loglake"), meta.created_by
    assert meta.schema.column(meta.schema.names.index("amount")).physical_type == "INT64"

    by_offset = sorted(read_table_rows(config.table_path("orders")),
                       key=lambda r: r["_kafka"]["offset"])  # fmt: skip
    assert [_normalise(r) for r in by_offset] == orders
    by_polars = pl.read_parquet(path).sort(pl.col("_kafka").struct.field("offset"))
    assert by_polars["amount"].to_list() == [o["amount"] for o in orders]
    assert by_polars["customer"].to_list() == [o["customer"] for o in orders]
    by_spark = spark.read.parquet(uri).selectExpr(
        "_kafka.offset AS o", "id", "customer", "amount", "day", "status", "tags", "note",
        "ship.city", "ship.zip",
    ).collect()  # fmt: skip
    assert sorted(tuple(r) for r in by_spark) == [
        (i, o["id"], o["customer"], o["amount"], o["day"], o["status"], o["tags"], o["note"],
         o["ship"]["city"], o["ship"]["zip"])
        for i, o in enumerate(orders)
    ]  # fmt: skip
    # Delta statistics come from the Arrow data, whatever the file's decimal encoding: no
    # bounds for decimals (PartitionedFileWriter keeps none), the rest as before
    [stats] = [json.loads(a["add"]["stats"])
               for f in sorted(Path(config.table_path("orders"), "_delta_log").glob("*.json"))
               for a in map(json.loads, f.read_text().splitlines()) if "add" in a]  # fmt: skip
    assert stats["numRecords"] == 20 and stats["nullCount"]["amount"] == 0
    assert "amount" not in stats["minValues"] and "amount" not in stats["maxValues"]
    assert (stats["minValues"]["id"], stats["maxValues"]["id"]) == (0, 19)
    assert (stats["minValues"]["customer"], stats["maxValues"]["customer"]) == ("c0", "c2")
    assert stats["nullCount"]["note"] == 15


def test_evolution_and_dead_letters(spark: SparkSession, tmp_path: Path, registry_url: str) -> None:
    sr = SchemaRegistryClient({"url": registry_url})
    ctx = SerializationContext("orders", MessageField.VALUE)
    v1 = AvroSerializer(sr, json.dumps(ORDER_V1))
    first = [v1(_order(i), ctx) for i in range(5)]
    ingest(tmp_path, "orders", first)
    config = decode_config(tmp_path, registry_url)
    run_decode(spark, config)
    assert "coupon" not in DeltaTable(config.table_path("orders")).schema().to_arrow().names

    # v2 adds a nullable column; v1 records keep arriving next to v2 ones, and bad records
    v2 = AvroSerializer(sr, json.dumps(ORDER_V2))
    v1_id = sr.get_version("orders-value", 1).schema_id
    good_v2 = v2({**_order(5), "coupon": "SAVE"}, ctx)
    second = [
        v1(_order(6), ctx),
        good_v2,
        b"plain text",  # no magic byte
        b"\x00\x00\x00\x03\xe7" + good_v2[5:],  # unknown schema id 999
        good_v2[:12],  # truncated payload
        b"\x00" + v1_id.to_bytes(4, "big") + b"\x02",  # a type mismatch: too short for v1
    ]
    ingest(tmp_path, "orders", second, start=5)
    res = run_decode(spark, config).topics[0]
    assert (res.rows, res.dead_letters, res.added_columns) == (2, 4, ["coupon"])

    table = DeltaTable(config.table_path("orders"))
    ops = [h["operation"] for h in table.history()]
    assert "ADD COLUMN" in ops or "ADD COLUMNS" in ops, ops
    rows = {r["_kafka"]["offset"]: r for r in read_table_rows(config.table_path("orders"))}
    assert sorted(rows) == [0, 1, 2, 3, 4, 5, 6]
    assert rows[0]["coupon"] is None and rows[5]["coupon"] is None  # v1 records: null
    assert rows[5]["id"] == 6 and rows[6]["coupon"] == "SAVE" and rows[6]["id"] == 5

    dead = sorted(read_table_rows(config.dead_letters_path), key=lambda r: r["offset"])
    assert [d["offset"] for d in dead] == [7, 8, 9, 10]
    assert [d["value"] for d in dead] == second[2:]
    assert dead[0]["schema_id"] is None and "magic" in dead[0]["error"]
    assert dead[1]["schema_id"] == 999 and "unknown schema id 999" in dead[1]["error"]
    assert dead[2]["error"] and dead[3]["error"] and dead[3]["schema_id"] == v1_id
    assert {d["topic"] for d in dead} == {"orders"} and {d["part"] for d in dead} == {"value"}

    # on_error = "fail": the same kind of record stops the run and nothing is committed
    ingest(tmp_path, "orders", [b"junk"], start=11)
    strict = decode_config(tmp_path, registry_url, on_error="fail")
    from pipelines.typed.job import DecodeFailedError

    with pytest.raises(DecodeFailedError, match="offset 11"):
        run_decode(spark, strict)
    assert DeltaTable(config.table_path("orders")).transaction_version(app_id("orders", 0)) == 11
    assert len(read_table_rows(config.dead_letters_path)) == 4


def test_a_subject_named_in_the_config(
    spark: SparkSession, tmp_path: Path, registry_url: str
) -> None:
    """A producer with RecordNameStrategy registers under ``shop.Order``: [decode.subject]
    names it; a topic with no subject is not decoded unless named (then: exit 2's error)."""
    from confluent_kafka.schema_registry import record_subject_name_strategy

    from logstore.errors import InvalidConfigError

    sr = SchemaRegistryClient({"url": registry_url})
    ser = AvroSerializer(
        sr, json.dumps(ORDER_V1), conf={"subject.name.strategy": record_subject_name_strategy}
    )
    ctx = SerializationContext("orders2", MessageField.VALUE)
    ingest(tmp_path, "orders2", [ser(_order(1), ctx)])
    assert sr.get_subjects() == ["shop.Order"]
    assert run_decode(spark, decode_config(tmp_path, registry_url)).topics == []
    with pytest.raises(InvalidConfigError, match="no subject 'orders2-value'"):
        run_decode(spark, decode_config(tmp_path, registry_url, topics=("orders2",)))
    named = decode_config(tmp_path, registry_url, subjects={"orders2": "shop.Order"})
    [res] = run_decode(spark, named).topics
    assert res.rows == 1 and res.schema_version == 1
