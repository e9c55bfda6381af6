"""``spark-submit jobs/decode.py`` killed (SIGKILL of its whole session, ``LOGLAKE_FAILPOINT``)
at each step of its commit: the typed table stays as it was, and the next run writes every row
and every dead letter exactly once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from deltalake import DeltaTable

from pipelines.typed.job import app_id
from tests.fixtures.compaction import read_table_rows
from tests.fixtures.jobs import spark_submit, unreferenced_files
from tests.fixtures.typed import ingest

pytestmark = pytest.mark.integration

SCHEMA = {"type": "record", "name": "R", "fields": [{"name": "n", "type": "long"}]}


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "step", ["decode.before_dead_letters", "delta.before_commit", "decode.before_commit"]
)
def test_kill_at_each_step_then_rerun(tmp_path: Path, registry_url: str, step: str) -> None:
    sr = SchemaRegistryClient({"url": registry_url})
    ser = AvroSerializer(sr, json.dumps(SCHEMA))
    ctx = SerializationContext("k", MessageField.VALUE)
    ingest(tmp_path, "k", [ser({"n": i}, ctx) for i in range(5)])
    conf = tmp_path / "pipeline.toml"
    conf.write_text(
        f'[paths]\nlake = "{tmp_path}"\n[decode]\nschema_registry_url = "{registry_url}"\n',
        encoding="utf-8",
    )
    first = spark_submit("decode.py", ["--config", str(conf)])
    assert first.returncode == 0, first.stderr[-3000:]
    table = tmp_path / "tables" / "k"
    version = DeltaTable(str(table)).version()

    ingest(tmp_path, "k", [ser({"n": i}, ctx) for i in range(5, 9)] + [b"bad"], start=5)
    killed = spark_submit("decode.py", ["--config", str(conf)], failpoint=step)
    assert killed.returncode != 0
    assert DeltaTable(str(table)).version() == version  # the typed table is as it was
    assert sorted(r["n"] for r in read_table_rows(table)) == list(range(5))

    rerun = spark_submit("decode.py", ["--config", str(conf)])
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert json.loads(rerun.stdout.splitlines()[-1])["topics"][0]["rows"] == 4
    assert sorted(r["n"] for r in read_table_rows(table)) == list(range(9))
    dead = read_table_rows(tmp_path / "dead_letters")
    assert [(d["offset"], d["value"]) for d in dead] == [(9, b"bad")]
    assert DeltaTable(str(table)).transaction_version(app_id("k", 0)) == 10
    assert unreferenced_files(table) == []
