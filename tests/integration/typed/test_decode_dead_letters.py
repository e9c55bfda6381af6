"""Dead letters are written by the Spark tasks that meet them (files of ``dead_letters`` under
the run's staged write, only their metadata through the driver), committed once by the driver;
a run that fails (``on_error = "fail"``) leaves none of those files behind."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from deltalake import DeltaTable

from pipelines.delta.staging import STAGING_DIR
from pipelines.typed.job import DecodeFailedError, app_id, run_decode
from tests.fixtures.compaction import read_table_rows
from tests.fixtures.jobs import unreferenced_files
from tests.fixtures.typed import decode_config, ingest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

SCHEMA = {"type": "record", "name": "R", "fields": [{"name": "n", "type": "long"}]}
# part-<task>-<write id>-<attempt>-c<n>...: pipelines.delta.files
PART = re.compile(r"part-(\d+)-([0-9a-f]+)-\d+-")


def test_dead_letters_are_written_by_the_tasks_and_committed_once(
    spark: SparkSession, tmp_path: Path, registry_url: str
) -> None:
    sr = SchemaRegistryClient({"url": registry_url})
    ser = AvroSerializer(sr, json.dumps(SCHEMA))
    ctx = SerializationContext("d", MessageField.VALUE)
    # two partitions, two records files: two tasks, each with good and bad records
    for p in (0, 1):
        ingest(tmp_path, "d", [ser({"n": 10 * p}, ctx), b"bad-%d" % p, None], partition=p)
        ingest(tmp_path, "d", [b"\x00\x00\x00\x03\xe7xx", ser({"n": 10 * p + 1}, ctx)],
               partition=p, start=3)  # fmt: skip
    config = decode_config(tmp_path, registry_url)

    [res] = run_decode(spark, config).topics
    assert (res.rows, res.dead_letters, res.tombstones, res.committed) == (4, 4, 2, True)
    dead = sorted(
        read_table_rows(config.dead_letters_path), key=lambda r: (r["partition"], r["offset"])
    )
    assert [(d["partition"], d["offset"], d["value"]) for d in dead] == [
        (0, 1, b"bad-0"), (0, 3, b"\x00\x00\x00\x03\xe7xx"),
        (1, 1, b"bad-1"), (1, 3, b"\x00\x00\x00\x03\xe7xx"),
    ]  # fmt: skip
    assert [d["schema_id"] for d in dead] == [None, 999, None, 999]
    assert all(d["headers"] == [{"key": "h", "value": b"x"}] for d in dead)
    # the files are the tasks' (several task ids), of one write: the commit's
    dl = DeltaTable(config.dead_letters_path)
    names = [PART.match(Path(u).name) for u in dl.file_uris()]
    assert all(names)
    assert len({m.group(1) for m in names if m}) > 1
    write_ids = {m.group(2) for m in names if m}
    assert write_ids == {dl.history(1)[0]["loglake.writeId"]}
    assert dl.transaction_version(app_id("d", 0)) == 5
    assert dl.transaction_version(app_id("d", 1)) == 5
    assert unreferenced_files(config.dead_letters_path) == []  # lease released, nothing left

    # on_error = "fail": the tasks wrote their dead letters, the failed run removes them
    ingest(tmp_path, "d", [b"junk-0"], partition=0, start=5)
    ingest(tmp_path, "d", [b"junk-1"], partition=1, start=5)
    before = dl.version()
    with pytest.raises(DecodeFailedError, match="2 records did not decode"):
        run_decode(spark, decode_config(tmp_path, registry_url, on_error="fail"))
    assert DeltaTable(config.dead_letters_path).version() == before
    assert unreferenced_files(config.dead_letters_path) == []
    assert not list((Path(config.dead_letters_path) / STAGING_DIR).glob("*.json"))

    # the same records under "dead_letter": each once, next to the first run's
    [res] = run_decode(spark, config).topics
    assert (res.rows, res.dead_letters) == (0, 2)
    assert len(read_table_rows(config.dead_letters_path)) == 6
    again = run_decode(spark, config).topics[0]
    assert again.note == "up to date"
    assert len(read_table_rows(config.dead_letters_path)) == 6
