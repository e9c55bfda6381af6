"""Lookups and compaction (the tables) with no log dirs (``[paths] log_dirs = []`` and
``[ingest] bootstrap_servers``): each table equals, row for row, the one built from the
broker's log dirs (lookups: but for the file columns, -1 / ``kafka://...`` through Fetch).
A real broker, confluent-kafka producing every codec and transactions, the shared Spark
session, the tables read back with delta-rs (an independent reader)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from jobs.compact import main as compact_main
from logstore.storage.checkpoints import read_offset_checkpoint
from pipelines.compaction.config import CompactConfig, compacted_topics, load_compact_config
from pipelines.compaction.model import Strategy, compact
from pipelines.compaction.table import run_compact, table_path
from pipelines.delta.sql import read_delta
from pipelines.ingest import IngestConfig, run_ingest
from pipelines.lookups import LOOKUP_SCHEMAS, build_lookups
from pipelines.quality.checks import lookup_agreement
from pipelines.sources.fetch import plan_fetch_ranges
from tests.fixtures.broker import wait_for
from tests.fixtures.compaction import read_topic_table
from tests.integration.broker.clients import new_topic
from tests.integration.compaction.test_compact_broker import _produce as produce_versions
from tests.integration.sources.traffic import PARTITIONS, produce_all

pytestmark = pytest.mark.integration

FILE_COLUMNS = ["segment", "file", "position"]
CHECKPOINT_MS = {"replica.high.watermark.checkpoint.interval.ms": "100"}


def _quiet(_message: str) -> None:
    pass


def _checkpointed(b: Any, topics: list[str]) -> None:
    """Until the broker's high-watermark checkpoint (what the log-dir runs read up to) holds
    every partition's high watermark (what the Fetch runs read up to)."""
    _, bounds = plan_fetch_ranges(b.bootstrap, topics=topics, isolation=0)
    path = b.log_dir / "replication-offset-checkpoint"
    wait_for(
        lambda: (
            path.exists()
            and all(read_offset_checkpoint(path).get(tp) == end for tp, (_s, end) in bounds.items())
        )
    )


def _lookup(lake: Path, table: str) -> pa.Table:
    t = DeltaTable(str(lake / table)).to_pyarrow_table()
    return t.select(LOOKUP_SCHEMAS[table].names).sort_by(
        [("topic", "ascending"), ("partition", "ascending"), ("first_offset", "ascending")]
    )


def _same_but_files(files: pa.Table, fetched: pa.Table, bootstrap: str) -> None:
    assert fetched.num_rows == files.num_rows > 0
    for name in files.drop_columns(FILE_COLUMNS).column_names:  # column by column: says which
        assert fetched.column(name).to_pylist() == files.column(name).to_pylist(), name
    assert pc.all(pc.equal(fetched.column("segment"), -1)).as_py()
    assert pc.all(pc.equal(fetched.column("position"), -1)).as_py()
    assert set(fetched.column("file").to_pylist()) == {
        f"kafka://{bootstrap}/{t}-{p}"
        for t, p in zip(
            fetched.column("topic").to_pylist(),
            fetched.column("partition").to_pylist(),
            strict=True,
        )
    }
    # through the files, the real positions (a check that the comparison is not vacuous)
    assert pc.min(files.column("position")).as_py() == 0


def test_lookups_through_fetch_equal_log_dir_lookups(
    spark: SparkSession, tmp_path: Path, broker_factory: Any
) -> None:
    b = broker_factory(**CHECKPOINT_MS)
    topic, _n = produce_all(b.bootstrap)  # every codec, committed and aborted transactions
    _checkpointed(b, [topic])
    a, f = tmp_path / "a", tmp_path / "f"
    from_files = build_lookups(spark, log_dirs=[str(b.log_dir)], lake=str(a), log=_quiet)
    lines: list[str] = []
    fetched = build_lookups(spark, log_dirs=[], lake=str(f), bootstrap_servers=b.bootstrap,
                            log=lines.append)  # fmt: skip
    assert fetched.rows == from_files.rows and fetched.progress == from_files.progress
    assert len(fetched.progress["offset_lookup"]) == PARTITIONS
    # the index check reads the broker's index files: said, not silently skipped
    assert fetched.index_problems == [] and any("index check not done" in x for x in lines)
    for table in LOOKUP_SCHEMAS:
        _same_but_files(_lookup(a, table), _lookup(f, table), b.bootstrap)
    markers = _lookup(f, "offset_lookup").column("marker").to_pylist()
    assert {"commit", "abort"} <= set(markers)

    # new batches: both take exactly them; then nothing new
    p = ck.Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0})
    for i in range(60):
        p.produce(topic, value=b"more-%d" % i, partition=i % PARTITIONS)
        if i % 10 == 9:
            p.flush(30)
    assert p.flush(30) == 0
    _checkpointed(b, [topic])
    more_a = build_lookups(spark, log_dirs=[str(b.log_dir)], lake=str(a), check=False, log=_quiet)
    more_f = build_lookups(spark, log_dirs=[], lake=str(f), bootstrap_servers=b.bootstrap,
                           check=False, log=_quiet)  # fmt: skip
    assert more_f.rows == more_a.rows and more_f.rows["offset_lookup"] >= 6
    for table in LOOKUP_SCHEMAS:
        _same_but_files(_lookup(a, table), _lookup(f, table), b.bootstrap)
    again = build_lookups(spark, log_dirs=[], lake=str(f), bootstrap_servers=b.bootstrap,
                          check=False, log=_quiet)  # fmt: skip
    assert again.rows == {"offset_lookup": 0, "time_lookup": 0}

    # the quality suite's lookup agreement copes with records and lookups read through Fetch
    ingest = IngestConfig(log_dirs=(), lake=str(f), bootstrap_servers=b.bootstrap,
                          progress_interval_s=0)  # fmt: skip
    assert run_ingest(spark, ingest, log=_quiet).records > 0
    records, lookups = read_delta(spark, f / "records"), read_delta(spark, f / "offset_lookup")
    agreed = lookup_agreement(records, lookups).toPandas()
    assert len(agreed) > PARTITIONS  # one row per batch, not one per partition
    assert agreed["lookup_first_offset"].notna().all()
    assert (agreed["first_offset"] >= agreed["lookup_first_offset"]).all()
    assert (agreed["lookup_last_offset"] >= agreed["last_offset"]).all()


def test_compaction_through_fetch_equals_log_dir_compaction(
    spark: SparkSession, tmp_path: Path, broker_factory: Any
) -> None:
    b = broker_factory(**CHECKPOINT_MS)
    # compacted by its topic configs alone (the strategy too): read through DescribeConfigs
    configs = {"cleanup.policy": "compact", "compaction.strategy": "header:version"}
    topic = new_topic(b.bootstrap, partitions=2, prefix="orders", **configs)
    plain = new_topic(b.bootstrap, partitions=1, prefix="plain")
    acked = produce_versions(b.bootstrap, topic, 0, 60, "lz4")
    _checkpointed(b, [topic, plain])
    a, f = tmp_path / "a", tmp_path / "f"
    files = CompactConfig(log_dirs=(str(b.log_dir),), lake=str(a), buckets=4)
    conf = tmp_path / "pipeline.toml"
    conf.write_text(
        f'[paths]\nlog_dirs = []\nlake = "{f}"\n'
        f'[ingest]\nbootstrap_servers = "{b.bootstrap}"\nprogress_interval_s = 0\n'
        "[compact]\nbuckets = 4\n"
    )
    fetched = load_compact_config(conf)
    assert fetched.log_dirs == () and fetched.bootstrap_servers == b.bootstrap
    strategy = Strategy("header", "version")
    assert compacted_topics(fetched) == compacted_topics(files) == {topic: strategy}

    ingest = IngestConfig(log_dirs=(str(b.log_dir),), lake=str(a), progress_interval_s=0)
    run_ingest(spark, ingest, log=_quiet)
    run_ingest(spark, dataclasses.replace(ingest, log_dirs=(), lake=str(f),
                                          bootstrap_servers=b.bootstrap), log=_quiet)  # fmt: skip
    for config in (files, fetched):
        summary = run_compact(spark, config, log=_quiet)
        # (from the log dir, also __consumer_offsets, which the Fetch ingest's lake-group
        # commit created: not in records, nothing committed; the cluster's list leaves it out)
        done = [(t.topic, t.committed) for t in summary.topics if not t.topic.startswith("__")]
        assert done == [(topic, True)]
    want = {pk: (r.offset, r.value, list(r.headers)) for pk, r in compact(acked, strategy).items()}
    assert read_topic_table(table_path(a, topic)) == want
    assert read_topic_table(table_path(f, topic)) == want

    # --log rewrites the broker's files: refused without log dirs (exit 2), nothing done;
    # a --topic the cluster does not have: exit 2 too (checked through Metadata)
    assert compact_main(["--config", str(conf), "--log"]) == 2
    assert compact_main(["--config", str(conf), "--topic", "no-such-topic"]) == 2
