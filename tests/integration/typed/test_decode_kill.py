"""``spark-submit jobs/decode.py`` killed (SIGKILL of its whole session, ``LOGLAKE_FAILPOINT``)
at each step of its commit: the typed table stays as it was, and the next run writes every row
and every dead letter exactly once.

Only the killed runs are ``spark-submit``s: the kill of a whole process session is what they
test. The runs before and after a kill are the same job (``jobs/decode.py``'s ``main``, the
same pipeline TOML) in-process on the shared Spark session, as other job tests run theirs:
they see the killed run's leftovers exactly as a new process would (its staged files, its
lease on disk), and each ``spark-submit`` saved is 10-20 s of a loaded 2-core machine.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from deltalake import DeltaTable

from pipelines.delta.staging import LEASE_TTL_ENV, STAGING_DIR
from pipelines.typed.job import app_id
from tests.fixtures.compaction import read_table_rows
from tests.fixtures.jobs import load_job, spark_submit, unreferenced_files
from tests.fixtures.typed import ingest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

# The killed runs hold 3 s leases: their staged files are reaped by the next run once the lease
# expired (ttl + the 2 s margin, whole seconds), never while it may still be alive.
KILLED_ENV = {**os.environ, LEASE_TTL_ENV: "3"}
EXPIRED_S = 3 + 2 + 1.5


def _leftovers(table: Path) -> list[str]:
    """Files no version of ``table`` names, but the killed run's takeover tombstone (kept a day
    by design, so that a woken-up killed run cannot commit)."""
    return [
        f
        for f in unreferenced_files(table)
        if not (f.startswith(f"{STAGING_DIR}/") and f.endswith(".takeover"))
    ]


def _decode(conf: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """``jobs/decode.py --config conf`` in-process (the shared session): its JSON summary, the
    last line of its stdout; fails the test on a non-zero exit code."""
    capsys.readouterr()
    code = load_job("decode").main(["--config", str(conf)])
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    summary: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return summary


SCHEMA = {"type": "record", "name": "R", "fields": [{"name": "n", "type": "long"}]}


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "step", ["decode.before_dead_letters", "delta.before_commit", "decode.before_commit"]
)
def test_kill_at_each_step_then_rerun(
    tmp_path: Path,
    registry_url: str,
    step: str,
    spark: SparkSession,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sr = SchemaRegistryClient({"url": registry_url})
    ser = AvroSerializer(sr, json.dumps(SCHEMA))
    ctx = SerializationContext("k", MessageField.VALUE)
    ingest(tmp_path, "k", [ser({"n": i}, ctx) for i in range(5)])
    conf = tmp_path / "pipeline.toml"
    conf.write_text(
        f'[paths]\nlake = "{tmp_path}"\n[decode]\nschema_registry_url = "{registry_url}"\n',
        encoding="utf-8",
    )
    _decode(conf, capsys)
    table = tmp_path / "tables" / "k"
    version = DeltaTable(str(table)).version()

    ingest(tmp_path, "k", [ser({"n": i}, ctx) for i in range(5, 9)] + [b"bad"], start=5)
    killed = spark_submit("decode.py", ["--config", str(conf)], failpoint=step, env=KILLED_ENV)
    assert killed.returncode != 0
    time.sleep(EXPIRED_S)
    assert DeltaTable(str(table)).version() == version  # the typed table is as it was
    assert sorted(r["n"] for r in read_table_rows(table)) == list(range(5))

    rerun = _decode(conf, capsys)
    assert rerun["topics"][0]["rows"] == 4
    assert sorted(r["n"] for r in read_table_rows(table)) == list(range(9))
    dead = read_table_rows(tmp_path / "dead_letters")
    assert [(d["offset"], d["value"]) for d in dead] == [(9, b"bad")]
    assert DeltaTable(str(table)).transaction_version(app_id("k", 0)) == 10
    assert _leftovers(table) == []
    # the killed run's dead-letter files (written by its tasks) reaped by the re-run
    assert _leftovers(tmp_path / "dead_letters") == []


ROW = {"type": "record", "name": "Value", "namespace": "db.t", "fields": [
    {"name": "id", "type": "int"}, {"name": "email", "type": "string"}]}  # fmt: skip
ENVELOPE = {"type": "record", "name": "Envelope", "namespace": "db.t", "fields": [
    {"name": "before", "type": ["null", ROW], "default": None},
    {"name": "after", "type": ["null", "Value"], "default": None},
    {"name": "source", "type": {"type": "record", "name": "Source",
                                "fields": [{"name": "lsn", "type": "long"}]}},
    {"name": "op", "type": "string"}]}  # fmt: skip


@pytest.mark.timeout(900)
def test_kill_between_the_tombstones_and_the_upsert_table(
    tmp_path: Path, registry_url: str, spark: SparkSession, capsys: pytest.CaptureFixture[str]
) -> None:
    """A CDC table ordered by ``source.lsn``: killed after the tombstones' commit, before the
    table's; the re-run still applies the run's delete (the tombstone it finds is its own)."""
    sr = SchemaRegistryClient({"url": registry_url})
    ser = AvroSerializer(sr, json.dumps(ENVELOPE))
    ctx = SerializationContext("c", MessageField.VALUE)

    def change(op: str, row_id: int, lsn: int) -> bytes:
        after = None if op == "d" else {"id": row_id, "email": f"{row_id}@{lsn}"}
        return ser({"before": None, "after": after, "op": op, "source": {"lsn": lsn}}, ctx)

    ingest(tmp_path, "c", [change("c", 1, 10), change("c", 2, 11)], keys=[b"1", b"2"])
    conf = tmp_path / "pipeline.toml"
    conf.write_text(
        f'[paths]\nlake = "{tmp_path}"\n[decode]\nschema_registry_url = "{registry_url}"\n'
        '[decode.cdc]\nc = "source.lsn"\n',
        encoding="utf-8",
    )
    _decode(conf, capsys)
    table, tombstones = tmp_path / "tables" / "c", tmp_path / "table_tombstones" / "c"
    version = DeltaTable(str(table)).version()

    ingest(tmp_path, "c", [change("d", 1, 30), change("u", 2, 12)], keys=[b"1", b"2"], start=2)
    killed = spark_submit(
        "decode.py",
        ["--config", str(conf)],
        failpoint="decode.before_table_merge",
        env=KILLED_ENV,
    )
    assert killed.returncode != 0
    time.sleep(EXPIRED_S)
    assert DeltaTable(str(table)).version() == version
    assert [r["key"] for r in read_table_rows(tombstones)] == [b"1"]  # committed before the kill

    _decode(conf, capsys)
    assert {r["_kafka"]["key"]: r["email"] for r in read_table_rows(table)} == {b"2": "2@12"}
    assert [(r["key"], r["_version"]) for r in read_table_rows(tombstones)] == [(b"1", 30)]
    assert DeltaTable(str(table)).transaction_version(app_id("c", 0)) == 4

    # and the remembered delete holds against an older change arriving later
    ingest(tmp_path, "c", [change("u", 1, 20)], keys=[b"1"], start=4)
    _decode(conf, capsys)
    assert {r["_kafka"]["key"] for r in read_table_rows(table)} == {b"2"}


@pytest.mark.timeout(900)
def test_kill_in_a_topics_first_run_leaves_an_empty_table_the_rerun_fills(
    tmp_path: Path, registry_url: str, spark: SparkSession, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first run creates the table (empty, no progress: every loglake table exists from its
    job's first run on) before decoding; killed then, the re-run decodes everything once."""
    sr = SchemaRegistryClient({"url": registry_url})
    ser = AvroSerializer(sr, json.dumps(SCHEMA))
    ctx = SerializationContext("f", MessageField.VALUE)
    ingest(tmp_path, "f", [ser({"n": i}, ctx) for i in range(4)])
    conf = tmp_path / "pipeline.toml"
    conf.write_text(
        f'[paths]\nlake = "{tmp_path}"\n[decode]\nschema_registry_url = "{registry_url}"\n',
        encoding="utf-8",
    )
    killed = spark_submit(
        "decode.py", ["--config", str(conf)], failpoint="decode.before_commit", env=KILLED_ENV
    )
    assert killed.returncode != 0
    time.sleep(EXPIRED_S)
    table = tmp_path / "tables" / "f"
    assert read_table_rows(table) == []
    assert DeltaTable(str(table)).transaction_version(app_id("f", 0)) is None

    _decode(conf, capsys)
    assert sorted(r["n"] for r in read_table_rows(table)) == [0, 1, 2, 3]
    assert DeltaTable(str(table)).transaction_version(app_id("f", 0)) == 4
    assert _leftovers(table) == []
