"""Typed tables of compacted topics and Debezium CDC topics on real Spark: one row per live key,
tombstones and ``op = "d"`` delete, the CDC order by ``source.lsn``, the change data feed; read
back with delta-rs and polars (and delta-rs's change data feed reader)."""

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

from pipelines.compaction.model import Strategy
from pipelines.typed.job import run_decode
from tests.fixtures.compaction import read_table_rows
from tests.fixtures.typed import decode_config, ingest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

USER = {"type": "record", "name": "User", "fields": [
    {"name": "name", "type": "string"}, {"name": "age", "type": "int"}]}  # fmt: skip
ROW = {"type": "record", "name": "Value", "namespace": "db.public.customers", "fields": [
    {"name": "id", "type": "int"}, {"name": "email", "type": "string"}]}  # fmt: skip
ENVELOPE = {
    "type": "record",
    "name": "Envelope",
    "namespace": "db.public.customers",
    "fields": [
        {"name": "before", "type": ["null", ROW], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "source", "type": {"type": "record", "name": "Source", "fields": [
            {"name": "lsn", "type": "long"}, {"name": "db", "type": "string"}]}},
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
    ],
}  # fmt: skip


def _live(path: Path) -> dict[bytes, dict[str, Any]]:
    rows = read_table_rows(path)
    out = {r["_kafka"]["key"]: r for r in rows}
    assert len(out) == len(rows), "two rows for one key"
    return out


def _changes(path: Path) -> list[tuple[str, Any]]:
    cdf = pa.table(DeltaTable(str(path)).load_cdf(starting_version=0))
    return sorted(zip(cdf["_change_type"].to_pylist(), cdf["name"].to_pylist(), strict=True))


def test_compacted_topic_upserts_by_key(
    spark: SparkSession, tmp_path: Path, registry_url: str
) -> None:
    sr = SchemaRegistryClient({"url": registry_url})
    ser = AvroSerializer(sr, json.dumps(USER))
    ctx = SerializationContext("users", MessageField.VALUE)
    config = decode_config(tmp_path, registry_url, compacted={"users": Strategy("offset")})
    ingest(
        tmp_path, "users",
        [ser({"name": "ann", "age": 1}, ctx), ser({"name": "bo", "age": 2}, ctx),
         ser({"name": "ann2", "age": 3}, ctx), None, b"junk"],
        keys=[b"a", b"b", b"a", b"b", b"c"],
    )  # fmt: skip
    res = run_decode(spark, config).topics[0]
    assert (res.tombstones, res.dead_letters, res.committed) == (1, 1, True)
    table = tmp_path / "tables" / "users"
    live = _live(table)
    assert {k: (r["name"], r["age"]) for k, r in live.items()} == {b"a": ("ann2", 3)}
    assert live[b"a"]["_kafka"]["offset"] == 2

    ingest(tmp_path, "users", [ser({"name": "bo2", "age": 4}, ctx), None],
           keys=[b"b", b"a"], start=5)  # fmt: skip
    run_decode(spark, config)
    assert {k: r["name"] for k, r in _live(table).items()} == {b"b": "bo2"}
    assert DeltaTable(str(table)).metadata().configuration["delta.enableChangeDataFeed"] == "true"
    assert _changes(table) == [("delete", "ann2"), ("insert", "ann2"), ("insert", "bo2")]
    assert run_decode(spark, config).topics[0].committed is False  # a re-run: no-op


def test_debezium_cdc_by_source_lsn(spark: SparkSession, tmp_path: Path, registry_url: str) -> None:
    sr = SchemaRegistryClient({"url": registry_url})
    ser = AvroSerializer(sr, json.dumps(ENVELOPE))
    ctx = SerializationContext("customers", MessageField.VALUE)

    def change(op: str, row_id: int, email: str | None, lsn: int) -> bytes:
        after = None if op == "d" else {"id": row_id, "email": email}
        before = {"id": row_id, "email": "old"} if op in ("u", "d") else None
        envelope = {"before": before, "after": after, "op": op, "ts_ms": lsn,
                    "source": {"lsn": lsn, "db": "db"}}  # fmt: skip
        return ser(envelope, ctx)

    config = decode_config(tmp_path, registry_url, cdc={"customers": "source.lsn"})
    ingest(
        tmp_path, "customers",
        [change("c", 1, "a@x", 10), change("c", 2, "b@x", 11), change("u", 1, "a2@x", 20),
         change("u", 1, "stale@x", 15),  # a later offset but an older lsn: loses
         change("c", 3, "c@x", 12), change("d", 2, None, 30), None],  # a delete, its tombstone
        keys=[b"1", b"2", b"1", b"1", b"3", b"2", b"2"],
    )  # fmt: skip
    res = run_decode(spark, config).topics[0]
    assert (res.dead_letters, res.tombstones) == (0, 1)
    table = tmp_path / "tables" / "customers"
    live = _live(table)
    assert {k: (r["id"], r["email"], r["_version"]) for k, r in live.items()} == {
        b"1": (1, "a2@x", 20), b"3": (3, "c@x", 12)}  # fmt: skip
    assert "before" not in live[b"1"] and "op" not in live[b"1"]  # the after image's columns

    # the next run: an update older than the row's lsn loses against the table's row too
    ingest(tmp_path, "customers", [change("u", 1, "older@x", 19), change("u", 3, "c2@x", 40)],
           keys=[b"1", b"3"], start=7)  # fmt: skip
    run_decode(spark, config)
    assert {k: r["email"] for k, r in _live(table).items()} == {b"1": "a2@x", b"3": "c2@x"}


def test_quality_suites_of_typed_tables(
    spark: SparkSession, tmp_path: Path, registry_url: str
) -> None:
    """jobs/quality.py's typed_<topic> suites: the dead-letter rate against
    [decode] max_dead_letter_rate, one row per key of an upsert table."""
    from pipelines.ingest import IngestConfig
    from pipelines.quality.config import QualityConfig
    from pipelines.quality.run import run_quality

    sr = SchemaRegistryClient({"url": registry_url})
    ser = AvroSerializer(sr, json.dumps(USER))
    for topic in ("clean", "dirty"):
        ctx = SerializationContext(topic, MessageField.VALUE)
        values = [ser({"name": f"n{i}", "age": i}, ctx) for i in range(9)]
        ingest(tmp_path, topic, [*values, b"junk" if topic == "dirty" else values[0]],
               keys=[bytes([i % 4]) for i in range(10)])  # fmt: skip
    config = decode_config(tmp_path, registry_url, compacted={"clean": Strategy("offset")})
    run_decode(spark, config)
    logs = tmp_path / "logs"
    logs.mkdir()
    report = run_quality(
        spark, IngestConfig(log_dirs=(str(logs),), lake=str(tmp_path)),
        QualityConfig(docs=False, max_dead_letter_rate=0.05), log=lambda _m: None,
    )  # fmt: skip
    assert report.suites["typed_clean"] is True  # no dead letter, one row per key
    assert report.suites["typed_dirty"] is False  # 1 in 10 > 0.05
    assert "typed_dirty.dead_letter_rate" in report.failed
    rules = {(r.suite, r.rule) for r in report.results}
    assert ("typed_clean", "key_unique") in rules and ("typed_dirty", "key_unique") not in rules


@pytest.mark.parametrize("strategy", ["offset", "timestamp", "header:v"])
def test_upsert_table_has_the_keys_and_winners_of_the_topic_table(
    spark: SparkSession, tmp_path: Path, registry_url: str, strategy: str
) -> None:
    """The typed table of a compacted topic and ``topics/<topic>`` (jobs/compact.py) built
    from the same records hold the same live (partition, key)s with the same winning offsets,
    under each strategy."""
    import random

    from pipelines.compaction.config import CompactConfig
    from pipelines.compaction.model import Rec, parse_strategy
    from pipelines.compaction.table import run_compact
    from tests.fixtures.compaction import append_records, read_topic_table

    sr = SchemaRegistryClient({"url": registry_url})
    ser = AvroSerializer(sr, json.dumps(USER))
    ctx = SerializationContext("t", MessageField.VALUE)
    rng = random.Random(22)
    recs = []
    for offset in range(60):
        partition = offset % 2
        value = None if rng.random() < 0.2 else ser({"name": f"n{offset}", "age": offset}, ctx)
        headers = () if rng.random() < 0.3 else (("v", rng.randrange(5).to_bytes(1, "big")),)
        recs.append(Rec(partition, offset // 2, 1000 + rng.randrange(20), bytes([rng.randrange(6)]),
                        value, headers))  # fmt: skip
    append_records(tmp_path, "t", recs, {0: 30, 1: 30})
    parsed = parse_strategy(strategy)
    run_decode(spark, decode_config(tmp_path, registry_url, compacted={"t": parsed}))
    logs = tmp_path / "logs"
    logs.mkdir()
    compact = CompactConfig(
        log_dirs=(str(logs),), lake=str(tmp_path), topics=("t",), strategies={"t": parsed},
        buckets=2,
    )  # fmt: skip
    run_compact(spark, compact, log=lambda _m: None)
    topic_table = read_topic_table(tmp_path / "topics" / "t")
    typed = read_table_rows(tmp_path / "tables" / "t")
    got = {(r["_kafka"]["partition"], r["_kafka"]["key"]): r["_kafka"]["offset"] for r in typed}
    assert len(got) == len(typed)
    assert got == {pk: offset for pk, (offset, _v, _h) in topic_table.items()}


def test_a_deleted_key_remembers_its_version_across_runs(
    spark: SparkSession, tmp_path: Path, registry_url: str
) -> None:
    """An out-of-order CDC stream: key 1 is deleted at lsn 30; a later run brings an update at
    lsn 20 (a later offset, an older change): it must not bring the key back; lsn 40 does."""
    sr = SchemaRegistryClient({"url": registry_url})
    ser = AvroSerializer(sr, json.dumps(ENVELOPE))
    ctx = SerializationContext("customers", MessageField.VALUE)

    def change(op: str, row_id: int, email: str | None, lsn: int) -> bytes:
        after = None if op == "d" else {"id": row_id, "email": email}
        envelope = {"before": None, "after": after, "op": op, "ts_ms": lsn,
                    "source": {"lsn": lsn, "db": "db"}}  # fmt: skip
        return ser(envelope, ctx)

    config = decode_config(tmp_path, registry_url, cdc={"customers": "source.lsn"})
    table = tmp_path / "tables" / "customers"
    tombstones = tmp_path / "table_tombstones" / "customers"
    ingest(tmp_path, "customers", [change("c", 1, "a@x", 10), change("c", 2, "b@x", 11)],
           keys=[b"1", b"2"])  # fmt: skip
    run_decode(spark, config)
    ingest(tmp_path, "customers", [change("d", 1, None, 30)], keys=[b"1"], start=2)
    run_decode(spark, config)
    assert set(_live(table)) == {b"2"}
    assert [(r["key"], r["_version"], r["offset"]) for r in read_table_rows(tombstones)] == [
        (b"1", 30, 2)
    ]

    # the stale update (lsn 20 < 30) and a stale delete of the live key 2 (lsn 5 < 11)
    ingest(tmp_path, "customers", [change("u", 1, "stale@x", 20), change("d", 2, None, 5)],
           keys=[b"1", b"2"], start=3)  # fmt: skip
    res = run_decode(spark, config).topics[0]
    assert res.committed and res.dead_letters == 0
    assert {k: r["email"] for k, r in _live(table).items()} == {b"2": "b@x"}
    assert [r["key"] for r in read_table_rows(tombstones)] == [b"1"]  # key 2's delete lost

    # a newer change brings key 1 back and its tombstone goes
    ingest(tmp_path, "customers", [change("u", 1, "new@x", 40)], keys=[b"1"], start=5)
    run_decode(spark, config)
    assert {k: (r["email"], r["_version"]) for k, r in _live(table).items()} == {
        b"1": ("new@x", 40), b"2": ("b@x", 11)}  # fmt: skip
    assert read_table_rows(tombstones) == []
    assert run_decode(spark, config).topics[0].note == "up to date"
