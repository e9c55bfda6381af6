"""End to end with the real broker and its registry (``schema.registry.listeners``):
confluent-kafka's ``AvroSerializer`` (key and value) and ``JSONSerializer`` produce, ingest
writes ``records``, decode (configured from a pipeline TOML) writes the typed tables, read back
with delta-rs and polars and compared with the deserializers' output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import confluent_kafka as ck
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from pipelines.ingest import IngestConfig, run_ingest
from pipelines.typed.config import load_decode_config
from pipelines.typed.job import run_decode
from tests.fixtures.broker import free_port
from tests.fixtures.compaction import read_table_rows
from tests.integration.broker.clients import new_topic

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

USER = {
    "type": "record",
    "name": "User",
    "namespace": "app",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "email", "type": ["null", "string"], "default": None},
    ],
}
ITEM = {
    "type": "object",
    "properties": {
        "sku": {"type": "string"},
        "price": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["sku"],
}


def _produce(bootstrap: str, topic: str, pairs: list[tuple[bytes | None, bytes]]) -> None:
    p = ck.Producer({"bootstrap.servers": bootstrap})
    for key, value in pairs:
        p.produce(topic, key=key, value=value, partition=0)
    assert p.flush(30) == 0


def _rows(path: str) -> list[dict[str, Any]]:
    return sorted(read_table_rows(path), key=lambda r: r["_kafka"]["offset"])


@pytest.mark.timeout(600)
def test_serializers_broker_ingest_decode(
    spark: SparkSession, tmp_path: Path, broker_factory: Any
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    broker = broker_factory(**{"schema.registry.listeners": url})
    sr = SchemaRegistryClient({"url": url})

    users = new_topic(broker.bootstrap, partitions=1, prefix="users")
    vctx = SerializationContext(users, MessageField.VALUE)
    kctx = SerializationContext(users, MessageField.KEY)
    vser = AvroSerializer(sr, json.dumps(USER))
    kser = AvroSerializer(sr, '"string"')  # the key has a schema too: _key is typed
    people = [{"id": i, "name": f"n{i}", "email": None if i % 2 else f"{i}@x"} for i in range(30)]
    user_pairs = [(kser(f"u{p['id']}", kctx), vser(p, vctx)) for p in people]
    _produce(broker.bootstrap, users, user_pairs)

    items = new_topic(broker.bootstrap, partitions=1, prefix="items")
    jctx = SerializationContext(items, MessageField.VALUE)
    jser = JSONSerializer(json.dumps(ITEM), sr)
    goods = [{"sku": f"s{i}", "price": i / 4, "tags": ["a"] * (i % 3)} for i in range(12)]
    item_pairs = [(None, jser(g, jctx)) for g in goods]
    _produce(broker.bootstrap, items, item_pairs)
    # a topic without a subject is not decoded
    plain = new_topic(broker.bootstrap, partitions=1, prefix="plain")
    _produce(broker.bootstrap, plain, [(None, b"hello")])

    assert broker.stop() == 0
    lake = tmp_path / "lake"
    run_ingest(
        spark,
        IngestConfig(log_dirs=(str(broker.log_dir),), lake=str(lake), progress_interval_s=0),
        log=lambda _m: None,
    )
    broker.start()  # the registry is the broker's: it serves again, from _schemas

    conf = tmp_path / "pipeline.toml"
    conf.write_text(
        f'[paths]\nlake = "{lake}"\n[decode]\nschema_registry_url = "{url}"\n'
        'on_error = "dead_letter"\n',
        encoding="utf-8",
    )
    config = load_decode_config(conf)
    summary = run_decode(spark, config)
    done = {r.topic: r for r in summary.topics}
    assert set(done) == {users, items}, summary.describe()
    assert (done[users].rows, done[items].rows) == (30, 12)
    assert done[users].dead_letters == done[items].dead_letters == 0

    vde = AvroDeserializer(SchemaRegistryClient({"url": url}))
    kde = AvroDeserializer(SchemaRegistryClient({"url": url}))
    user_rows = _rows(config.table_path(users))
    assert [{k: r[k] for k in ("id", "name", "email")} for r in user_rows] == [
        vde(v, vctx) for _, v in user_pairs
    ]
    assert [r["_key"] for r in user_rows] == [kde(k, kctx) for k, _ in user_pairs]
    key_id = sr.get_latest_version(f"{users}-key").schema_id
    assert {r["_kafka"]["key_schema_id"] for r in user_rows} == {key_id}
    assert [r["_kafka"]["key"] for r in user_rows] == [k for k, _ in user_pairs]

    jde = JSONDeserializer(None, schema_registry_client=SchemaRegistryClient({"url": url}))
    item_rows = _rows(config.table_path(items))
    expected = [jde(v, jctx) for _, v in item_pairs]
    assert [{k: r[k] for k in ("sku", "price", "tags")} for r in item_rows] == expected

    # a second run has nothing to do
    again = run_decode(spark, config)
    assert all(not r.committed for r in again.topics)
