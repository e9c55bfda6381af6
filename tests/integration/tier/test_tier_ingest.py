"""Ingest from a cluster's tier (KIP-405) and through Fetch, no log dirs: the ``records`` table
equals, row for row, the one ingested from the broker's log dirs (the tier's rows even name the
same segment and byte position); a missing object or a stopped store fails the run (exit 1)
with nothing committed, and the re-run after it is clean.

A real broker tiering to a real S3 server (moto), confluent-kafka producing, the shared Spark
session, the tables read back with delta-rs (an independent reader)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pyarrow.compute as pc
import pytest
from pyspark.sql import SparkSession

from logstore.errors import LoglakeError
from logstore.objectstore import StorageSettings, use_job_settings
from pipelines.exit_codes import EXIT_FAILED
from pipelines.ingest import IngestConfig, read_progress, run_ingest
from pipelines.jobrun import exit_code_for
from tests.fixtures.broker import wait_for
from tests.integration.broker.clients import ck_produce, expected, make_records, new_topic
from tests.integration.sources.traffic import PARTITIONS, produce_all
from tests.integration.tier.tiered import (
    PREFIX,
    all_tiered,
    local_bases,
    records_table,
    tier_broker,
    wait_checkpointed,
)

pytestmark = pytest.mark.integration

FILE_COLUMNS = ["segment_base_offset", "batch_position"]


def test_tier_then_fetch_equals_log_dir_ingest(
    spark: SparkSession, tmp_path: Path, broker_factory: Any, s3: Any
) -> None:
    b = tier_broker(broker_factory, s3)
    # every codec, transactions committed and aborted; segments of 8 KiB, kept locally too
    topic, want = produce_all(b.bootstrap, **{"remote.storage.enable": "true",
                                              "segment.bytes": "8192"})  # fmt: skip
    # then enough to roll the segments of the transactions (committed and aborted) to the tier
    ck_produce(b.bootstrap, topic, make_records(600, partitions=PARTITIONS, seed=50),
               codec="none", acks="all", idempotent=True, flush_every=20)  # fmt: skip
    want += 600
    wait_for(lambda: all_tiered(b, topic, PARTITIONS), 90)
    wait_checkpointed(b, topic, PARTITIONS)
    tier_end = {p: local_bases(b, topic, p)[-1] for p in range(PARTITIONS)}

    files = IngestConfig(log_dirs=(str(b.log_dir),), lake=str(tmp_path / "a"),
                         progress_interval_s=0, topics=(topic,))  # fmt: skip
    tiered = dataclasses.replace(files, log_dirs=(), lake=str(tmp_path / "b"),
                                 bootstrap_servers=b.bootstrap,
                                 remote_log_storage=s3.uri(PREFIX.rstrip("/")))  # fmt: skip
    lines: list[str] = []
    from_files = run_ingest(spark, files, log=print)
    from_tier = run_ingest(spark, tiered, log=lines.append)
    assert from_files.records == want and from_tier.records == want, lines
    in_tier = sum(tier_end.values())
    said = f"tier: {in_tier} offsets of {PARTITIONS}/{PARTITIONS} partitions"
    assert any(line.startswith(said) for line in lines), lines
    # the aborted transactions are in the tier: their records are left out from the store too
    assert any(f"({2 * PARTITIONS} aborted transactions reach them)" in line for line in lines)

    a, t = records_table(tmp_path / "a"), records_table(tmp_path / "b")
    assert t.drop_columns(FILE_COLUMNS).equals(a.drop_columns(FILE_COLUMNS))
    # the rows read from the tier name the same segment and position as the log-dir read
    # (the object is the segment file); those through Fetch name none (-1)
    from_store = pc.not_equal(t.column("segment_base_offset"), -1)
    tier_rows = t.filter(from_store)
    assert tier_rows.equals(a.filter(from_store))
    assert tier_rows.num_rows > 0
    for p, end in tier_end.items():
        part = t.filter(pc.equal(t.column("partition"), p))
        below = pc.less(part.column("offset"), end)
        # below the tier's end every row came from the store, none above it
        assert pc.all(pc.equal(below, pc.not_equal(part.column("segment_base_offset"), -1))).as_py()
    assert read_progress(str(tmp_path / "b" / "records")) == read_progress(
        str(tmp_path / "a" / "records")
    )
    again = run_ingest(spark, tiered, log=lines.append)
    assert again.records == 0 and not again.committed


def _values(lake: Path) -> list[tuple[int, bytes | None, bytes | None]]:
    t = records_table(lake)
    return list(zip(t.column("offset").to_pylist(), t.column("key").to_pylist(),
                    t.column("value").to_pylist(), strict=True))  # fmt: skip


def test_missing_object_or_stopped_store_fails_the_run_and_the_rerun_is_clean(
    spark: SparkSession, tmp_path: Path, broker_factory: Any, s3: Any
) -> None:
    b = tier_broker(broker_factory, s3)
    topic = new_topic(b.bootstrap, partitions=1, prefix="tierfault", **{
        "remote.storage.enable": "true", "segment.bytes": "4096", "local.retention.ms": "0",
    })  # fmt: skip
    records = make_records(300, partitions=1, seed=7)
    ck_produce(b.bootstrap, topic, records, codec="none", acks="all", idempotent=True,
               flush_every=10)  # fmt: skip
    # only the active segment stays local: what is below it can only come from the tier
    wait_for(lambda: len(local_bases(b, topic, 0)) == 1 and all_tiered(b, topic, 1), 90)
    want = [(g.offset, g.key, g.value) for g in expected(records)[0]]
    config = IngestConfig(log_dirs=(), lake=str(tmp_path / "lake"), progress_interval_s=0,
                          topics=(topic,), bootstrap_servers=b.bootstrap,
                          remote_log_storage=s3.uri(PREFIX.rstrip("/")))  # fmt: skip

    # 1. an object missing: the run fails, retriable, nothing committed
    first_log = next(k for k in s3.keys(PREFIX) if k.endswith(".log"))
    saved = s3.get(first_log)
    s3.client.delete_object(Bucket=s3.name, Key=first_log)
    with pytest.raises(LoglakeError, match="no such object") as missing:
        run_ingest(spark, config, log=print)
    assert exit_code_for(missing.value) == EXIT_FAILED
    assert read_progress(config.records_path) == {}
    s3.put(first_log, saved)

    # 2. the store stopped (two tries per operation, as [storage] max_attempts = 2 says)
    use_job_settings(StorageSettings.from_environment({"max_attempts": 2}))
    s3.server.stop()
    try:
        with pytest.raises(LoglakeError) as stopped:
            run_ingest(spark, config, log=print)
    finally:
        s3.server.start()
        use_job_settings(None)
    assert exit_code_for(stopped.value) == EXIT_FAILED
    assert read_progress(config.records_path) == {}

    # 3. back: the re-run ingests everything once
    lines: list[str] = []
    summary = run_ingest(spark, config, log=lines.append)
    assert summary.records == len(want) and summary.committed, lines
    assert _values(tmp_path / "lake") == want
    assert read_progress(config.records_path) == {(topic, 0): len(want)}


def test_aborted_transaction_whose_marker_is_not_tiered_yet_is_left_out(
    spark: SparkSession, tmp_path: Path, broker_factory: Any, s3: Any
) -> None:
    b = tier_broker(broker_factory, s3)
    topic = new_topic(b.bootstrap, partitions=1, prefix="tiertxn", **{
        "remote.storage.enable": "true", "segment.bytes": "4096",
    })  # fmt: skip
    p = ck.Producer({"bootstrap.servers": b.bootstrap, "transactional.id": f"t-{topic}",
                     "linger.ms": 0})  # fmt: skip
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(60):  # ~14 KiB of batches: closed segments, tiered
        p.produce(topic, value=b"aborted-%d-" % i + b"x" * 200, partition=0)
        if i % 5 == 4:
            p.flush(30)
    wait_for(lambda: all_tiered(b, topic, 1) and len(local_bases(b, topic, 0)) > 2, 90)
    p.abort_transaction(30)  # the marker: in the active segment, not tiered
    plain = ck.Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0})
    for i in range(5):
        plain.produce(topic, value=b"kept-%d" % i, partition=0)
    assert plain.flush(30) == 0
    config = IngestConfig(log_dirs=(), lake=str(tmp_path / "lake"), progress_interval_s=0,
                          topics=(topic,), bootstrap_servers=b.bootstrap,
                          remote_log_storage=s3.uri(PREFIX.rstrip("/")))  # fmt: skip
    lines: list[str] = []
    summary = run_ingest(spark, config, log=lines.append)
    assert any("(1 aborted transactions reach them)" in line for line in lines), lines
    assert summary.records == 5, lines
    assert [v for _o, _k, v in _values(tmp_path / "lake")] == [b"kept-%d" % i for i in range(5)]
