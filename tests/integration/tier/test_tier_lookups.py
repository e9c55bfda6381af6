"""The lookup tables with no log dirs and the tier (``remote_log_storage``): the batches the
cluster's tier holds are read from the object store, the rest through Fetch, and each table
equals, row for row, the one built from the broker's log dirs — the tier's rows with the same
``segment`` and ``position`` (the object is the segment file), ``file`` the ``.log`` object.

A real broker tiering to a real S3 server (moto), confluent-kafka producing every codec and
transactions (markers read from the store's bytes), the shared Spark session, the tables read
back with delta-rs (an independent reader)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from pipelines.lookups import LOOKUP_SCHEMAS, build_lookups
from tests.fixtures.broker import wait_for
from tests.integration.broker.clients import ck_produce, make_records
from tests.integration.sources.traffic import PARTITIONS, produce_all
from tests.integration.tier.tiered import (
    PREFIX,
    all_tiered,
    local_bases,
    tier_broker,
    wait_checkpointed,
)

pytestmark = pytest.mark.integration

FILE_COLUMNS = ["segment", "file", "position"]
OFFSET_LOOKUP, TIME_LOOKUP = "offset_lookup", "time_lookup"


def _lookup(lake: Path, table: str) -> pa.Table:
    t = DeltaTable(str(lake / table)).to_pyarrow_table()
    return t.select(LOOKUP_SCHEMAS[table].names).sort_by(
        [("partition", "ascending"), ("first_offset", "ascending")]
    )


def test_lookups_from_the_tier_equal_log_dir_lookups(
    spark: SparkSession, tmp_path: Path, broker_factory: Any, s3: Any
) -> None:
    b = tier_broker(broker_factory, s3)
    # every codec, transactions committed and aborted; segments of 8 KiB, kept locally too
    topic, _n = produce_all(b.bootstrap, **{"remote.storage.enable": "true",
                                            "segment.bytes": "8192"})  # fmt: skip
    # then enough to roll the transactions' segments (their markers too) to the tier
    ck_produce(b.bootstrap, topic, make_records(600, partitions=PARTITIONS, seed=51),
               codec="none", acks="all", idempotent=True, flush_every=20)  # fmt: skip
    wait_for(lambda: all_tiered(b, topic, PARTITIONS), 90)
    wait_checkpointed(b, topic, PARTITIONS)
    tier_end = {p: local_bases(b, topic, p)[-1] for p in range(PARTITIONS)}
    root = s3.uri(PREFIX.rstrip("/"))

    files, tiered = tmp_path / "files", tmp_path / "tiered"
    build_lookups(spark, log_dirs=[str(b.log_dir)], lake=str(files), topics=[topic], check=False,
                  log=print)  # fmt: skip
    lines: list[str] = []
    summary = build_lookups(spark, log_dirs=[], lake=str(tiered), topics=[topic],
                            bootstrap_servers=b.bootstrap, remote_log_storage=root,
                            log=lines.append)  # fmt: skip
    said = f"tier: {sum(tier_end.values())} offsets of {PARTITIONS}/{PARTITIONS} partitions"
    assert sum(line.startswith(said) for line in lines) == 2, lines  # one plan per table

    for table in (OFFSET_LOOKUP, TIME_LOOKUP):
        a, t = _lookup(files, table), _lookup(tiered, table)
        assert t.num_rows == a.num_rows > 0 and summary.rows[table] == t.num_rows
        for name in a.drop_columns(["file"]).column_names:  # column by column: says which
            if name in FILE_COLUMNS:
                continue
            assert t.column(name).to_pylist() == a.column(name).to_pylist(), (table, name)
        ends = pc.take(pa.array([tier_end[p] for p in range(PARTITIONS)]), t.column("partition"))
        in_tier = pc.less(t.column("last_offset"), ends)
        assert 0 < pc.sum(in_tier).as_py() < t.num_rows
        # the tier's rows: the log-dir run's segment and position, the .log object as file
        for name in ("segment", "position"):
            assert t.filter(in_tier).column(name).equals(a.filter(in_tier).column(name)), name
        objects = t.filter(in_tier).column("file").to_pylist()
        assert all(f.startswith(f"{root}/{topic}-") and f.endswith(".log") for f in objects)
        # the rest through Fetch: no file position (module pipelines.lookups)
        rest = t.filter(pc.invert(in_tier))
        assert pc.all(pc.equal(rest.column("position"), -1)).as_py()
        assert set(rest.column("file").to_pylist()) == {
            f"kafka://{b.bootstrap}/{topic}-{p}" for p in set(rest.column("partition").to_pylist())
        }
    # the markers of the aborted transactions were read from the store's bytes
    offsets = _lookup(tiered, OFFSET_LOOKUP)
    markers = offsets.filter(pc.greater_equal(offsets.column("segment"), 0))
    assert "abort" in markers.column("marker").to_pylist()

    again = build_lookups(spark, log_dirs=[], lake=str(tiered), topics=[topic],
                          bootstrap_servers=b.bootstrap, remote_log_storage=root,
                          check=False, log=lines.append)  # fmt: skip
    assert again.rows == {OFFSET_LOOKUP: 0, TIME_LOOKUP: 0}
