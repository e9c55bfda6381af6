"""Ingest from the log dirs with the tier (``remote_log_storage`` with log dirs): the offsets
the broker deleted locally once tiered (``local.retention.ms``), below the log dirs' start, are
read from the object store in the same run and commit — the ``records`` table holds every
produced record, no gap — and without the tier they are a gap, as before.

A real broker tiering to a real S3 server (moto), confluent-kafka producing, the shared Spark
session, the tables read back with delta-rs (an independent reader)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import SparkSession

from pipelines.ingest import Gap, IngestConfig, read_progress, run_ingest
from pipelines.sources.tier import remote_segments
from tests.fixtures.broker import wait_for
from tests.integration.broker.clients import ck_produce, expected, make_records, new_topic
from tests.integration.tier.tiered import (
    PREFIX,
    all_tiered,
    local_bases,
    records_table,
    tier_broker,
    wait_checkpointed,
)

pytestmark = pytest.mark.integration

PARTS = 2


def test_log_dirs_with_the_tier_read_below_the_local_start_from_the_store(
    spark: SparkSession, tmp_path: Path, broker_factory: Any, s3: Any
) -> None:
    b = tier_broker(broker_factory, s3)
    topic = new_topic(b.bootstrap, partitions=PARTS, prefix="tierlocal", **{
        "remote.storage.enable": "true", "segment.bytes": "4096", "local.retention.ms": "0",
    })  # fmt: skip
    records = make_records(1200, partitions=PARTS, seed=24)
    ck_produce(b.bootstrap, topic, records, codec="none", acks="all", idempotent=True,
               flush_every=10)  # fmt: skip
    # then on partition 0 a transaction over several segments, aborted once they are tiered
    # and gone locally: its ABORT marker is in the log dirs, most of its batches only in the tier
    txn = ck.Producer({"bootstrap.servers": b.bootstrap, "transactional.id": f"t-{topic}",
                       "linger.ms": 0})  # fmt: skip
    txn.init_transactions(30)
    txn.begin_transaction()
    for i in range(60):
        txn.produce(topic, value=b"aborted-%d-" % i + b"x" * 200, partition=0)
        if i % 5 == 4:
            txn.flush(30)
    # only the active segment stays local: what is below it is only in the tier
    wait_for(lambda: all(len(local_bases(b, topic, p)) == 1 for p in range(PARTS))
             and all_tiered(b, topic, PARTS), 90)  # fmt: skip
    txn.abort_transaction(30)
    kept = [b"kept-%d" % i for i in range(5)]
    plain = ck.Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0})
    for value in kept:
        plain.produce(topic, value=value, partition=0)
    assert plain.flush(30) == 0
    hw = wait_checkpointed(b, topic, PARTS)
    local_start = {p: local_bases(b, topic, p)[0] for p in range(PARTS)}
    assert all(s > 0 for s in local_start.values())
    remote = remote_segments(b.bootstrap)
    remote_bases = {p: {s.start_offset for s in remote[(topic, p)]} for p in range(PARTS)}

    files = IngestConfig(log_dirs=(str(b.log_dir),), lake=str(tmp_path / "files"),
                         progress_interval_s=0, topics=(topic,))  # fmt: skip
    both = dataclasses.replace(files, lake=str(tmp_path / "both"), bootstrap_servers=b.bootstrap,
                               remote_log_storage=s3.uri(PREFIX.rstrip("/")))  # fmt: skip
    lines: list[str] = []
    summary = run_ingest(spark, both, log=lines.append)
    assert summary.gaps == [] and summary.records == len(records) + len(kept), lines
    said = f"tier: {sum(local_start.values())} offsets of {PARTS}/{PARTS} partitions"
    # the aborted transaction reaches the tier's part: its batches there are left out too
    assert any(line.startswith(said) and "(1 aborted" in line for line in lines), lines
    t = records_table(tmp_path / "both")
    for p, want in expected(records).items():
        part = t.filter(pc.equal(t.column("partition"), p))
        assert part.column("value").to_pylist() == [g.value for g in want] + (
            kept if p == 0 else []
        )
        part = part.slice(0, len(want))
        assert part.column("offset").to_pylist() == [g.offset for g in want]
        assert part.column("key").to_pylist() == [g.key for g in want]
        # below the local start each row names its remote segment (the broker's segment
        # file, byte for byte), from it on the one local segment
        below = pc.less(part.column("offset"), local_start[p])
        bases = part.column("segment_base_offset")
        assert set(bases.filter(below).to_pylist()) <= remote_bases[p] - {local_start[p]}
        assert set(bases.filter(pc.invert(below)).to_pylist()) <= {local_start[p]}
        assert len(set(bases.to_pylist())) > 1  # rows from the tier and from the log dirs
    progress = {(topic, p): e for p, e in hw.items()}
    assert read_progress(both.records_path) == progress
    again = run_ingest(spark, both, log=lines.append)  # exactly once: nothing new
    assert again.records == 0 and not again.committed and again.gaps == []

    # without the tier the offsets below the local start are a gap, as before
    gapped = run_ingest(spark, files, log=print)
    assert sorted(gapped.gaps, key=lambda g: g.partition) == [
        Gap(topic, p, 0, local_start[p]) for p in range(PARTS)
    ]
    assert gapped.records == hw[1] - local_start[1] + len(kept)
    assert read_progress(files.records_path) == progress
    # the rows both runs read from the log dirs are the same, file columns included
    starts = pc.take(pa.array([local_start[p] for p in range(PARTS)]), t.column("partition"))
    from_files = t.filter(pc.greater_equal(t.column("offset"), starts))
    assert from_files.equals(records_table(tmp_path / "files"))
