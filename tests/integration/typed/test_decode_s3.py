"""jobs/decode.py with the lake on S3 (a real moto server): the typed tables, the dead
letters and the upsert table's tombstones (a timestamp-ordered topic keeps them) are written
under ``s3://bucket/lake``, not beside it; the executors read ``records`` with the settings the
task carries (their environment has none); read back by delta-rs; a re-run is a no-op."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from logstore.objectstore import delta_target
from pipelines.compaction.model import Strategy
from pipelines.typed.job import run_decode
from tests.fixtures.typed import decode_config, ingest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tests.fixtures.s3 import S3Bucket

pytestmark = pytest.mark.integration

USER = {"type": "record", "name": "User", "fields": [
    {"name": "name", "type": "string"}, {"name": "age", "type": "int"}]}  # fmt: skip


def _rows(uri: str) -> list[dict[str, Any]]:
    from deltalake import DeltaTable

    target, options = delta_target(uri)
    return DeltaTable(target, storage_options=options).to_pyarrow_table().to_pylist()


def test_decode_on_an_s3_lake(spark: SparkSession, s3: S3Bucket, registry_url: str) -> None:
    lake = s3.uri("lake")
    sr = SchemaRegistryClient({"url": registry_url})
    ctx = SerializationContext("users", MessageField.VALUE)
    ser = AvroSerializer(sr, json.dumps(USER))
    values = [ser({"name": "ann", "age": 1}, ctx), ser({"name": "bo", "age": 2}, ctx),
              ser({"name": "ann2", "age": 3}, ctx), None, b"junk"]  # fmt: skip
    ingest(lake, "users", values, keys=[b"a", b"b", b"a", b"b", b"c"])
    config = decode_config(lake, registry_url, compacted={"users": Strategy("timestamp")})

    res = run_decode(spark, config).topics[0]
    assert (res.tombstones, res.dead_letters, res.committed) == (1, 1, True)
    live = {r["_kafka"]["key"]: r["name"] for r in _rows(config.table_path("users"))}
    assert live == {b"a": "ann2"}
    dead = _rows(config.dead_letters_path)
    assert [(d["offset"], d["value"]) for d in dead] == [(4, b"junk")]
    keys = s3.keys("lake/")
    for table in ("tables/users/", "dead_letters/", "table_tombstones/users/"):
        assert any(k.startswith(f"lake/{table}_delta_log/") for k in keys), (table, keys)

    again = run_decode(spark, config).topics[0]
    assert again.committed is False
