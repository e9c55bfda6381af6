"""A registry evolution that widens column types (int -> long, float -> double: BACKWARD
compatible, so the registry takes it) against a typed table that exists: deltalake 1.6 cannot
write Delta's ``typeWidening`` feature, so the table keeps its types, the run decodes into the
newest version that fits, and records the newer writer schema wrote go to dead_letters with
their raw bytes (or stop the run under ``on_error = "fail"``, nothing committed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from deltalake import DeltaTable

from pipelines.exit_codes import EXIT_CORRUPT, EXIT_USAGE
from pipelines.jobrun import exit_code_for
from pipelines.typed.columns import SchemaChangeError
from pipelines.typed.job import DecodeFailedError, app_id, run_decode
from tests.fixtures.compaction import read_table_rows
from tests.fixtures.typed import decode_config, ingest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

V1: dict[str, Any] = {
    "type": "record",
    "name": "Reading",
    "namespace": "plant",
    "fields": [
        {"name": "sensor", "type": "string"},
        {"name": "count", "type": "int"},
        {"name": "ratio", "type": "float"},
    ],
}
# int -> long and float -> double: Avro promotions, so BACKWARD compatible; plus a new field
V2: dict[str, Any] = {
    **V1,
    "fields": [
        {"name": "sensor", "type": "string"},
        {"name": "count", "type": "long"},
        {"name": "ratio", "type": "double"},
        {"name": "unit", "type": ["null", "string"], "default": None},
    ],
}


def test_a_widened_type_keeps_the_tables_type_and_dead_letters_the_newer_records(
    spark: SparkSession, tmp_path: Path, registry_url: str
) -> None:
    sr = SchemaRegistryClient({"url": registry_url})
    ctx = SerializationContext("readings", MessageField.VALUE)
    v1 = AvroSerializer(sr, json.dumps(V1))
    ingest(
        tmp_path,
        "readings",
        [v1({"sensor": f"s{i}", "count": i, "ratio": 0.5}, ctx) for i in range(3)],
    )
    config = decode_config(tmp_path, registry_url)
    run_decode(spark, config)
    root = config.table_path("readings")
    before = DeltaTable(root).schema().to_arrow()
    assert pa.schema(before).field("count").type == pa.int32()

    v2 = AvroSerializer(sr, json.dumps(V2))  # registers version 2 (the registry says compatible)
    second = [
        v2({"sensor": "big", "count": 2**40, "ratio": 1e300, "unit": "Hz"}, ctx),
        v1({"sensor": "s3", "count": 3, "ratio": 0.25}, ctx),
        v2({"sensor": "small", "count": 7, "ratio": 0.5, "unit": None}, ctx),
    ]
    ingest(tmp_path, "readings", second, start=3)
    latest = sr.get_latest_version("readings-value")
    v2_id = latest.schema_id
    assert latest.version == 2

    # on_error = "fail": the run stops before any commit, with the non-retriable exit code 3
    strict = decode_config(tmp_path, registry_url, on_error="fail")
    with pytest.raises(DecodeFailedError, match="offset 3") as failed:
        run_decode(spark, strict)
    assert exit_code_for(failed.value) == EXIT_CORRUPT
    assert DeltaTable(root).transaction_version(app_id("readings", 0)) == 3
    assert DeltaTable(root).schema().to_arrow() == before

    res = run_decode(spark, config).topics[0]
    assert (res.rows, res.dead_letters, res.schema_version) == (1, 2, 1)
    assert "version 2 changes column types" in res.note
    table = DeltaTable(root)
    assert table.schema().to_arrow() == before  # no type changed, no column added
    assert table.transaction_version(app_id("readings", 0)) == 6
    rows = {r["_kafka"]["offset"]: r for r in read_table_rows(root)}
    assert sorted(rows) == [0, 1, 2, 4]
    assert (rows[4]["sensor"], rows[4]["count"], rows[4]["ratio"]) == ("s3", 3, 0.25)

    dead = sorted(read_table_rows(config.dead_letters_path), key=lambda r: r["offset"])
    assert [d["offset"] for d in dead] == [3, 5]
    assert [d["value"] for d in dead] == [second[0], second[2]]  # the raw bytes, unchanged
    assert {d["schema_id"] for d in dead} == {v2_id}
    assert all("long cannot be read as reader int" in d["error"] for d in dead), dead

    again = run_decode(spark, config).topics[0]
    assert again.note == "up to date" and len(read_table_rows(config.dead_letters_path)) == 2


def test_a_changed_type_is_not_retriable() -> None:
    # a re-run meets the same schema: exit 2, never retried by the DAG
    assert exit_code_for(SchemaChangeError("column count: int32 -> string")) == EXIT_USAGE
