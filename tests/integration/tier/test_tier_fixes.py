"""Three tier defects, each fixed: ``__remote_log_metadata`` has all its partitions once tiering
is on (ListOffsets knows every partition Metadata lists); a read_committed Fetch served from the
tier lists a transaction whose ABORT marker is in a later segment; the jobs' tier reader reads
buckets of compressed chunks (the plugin's ``rsm.config.compression.enabled``).

A real broker tiering to a real S3 server (moto), real clients (confluent-kafka, the raw
protocol client), the shared Spark session, tables read back with delta-rs."""

from __future__ import annotations

import dataclasses
import datetime
import json
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pyarrow.compute as pc
import pytest
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable
from kio.schema.list_offsets.v11.request import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from kio.static.primitive import i8, i32, i64
from pyspark.sql import SparkSession

from logstore.tier.metadata import METADATA_TOPIC
from pipelines.ingest import IngestConfig, run_ingest
from pipelines.sources.fetch import plan_fetch_ranges
from pipelines.sources.tier import remote_segments
from tests.fixtures.broker import wait_for
from tests.integration.broker.clients import ck_produce, expected, make_records, new_topic
from tests.integration.broker.rawclient import RawClient
from tests.integration.broker.test_tier import PREFIX, _local_bases, _tier_broker, _values

pytestmark = pytest.mark.integration

EARLIEST = -2
PARTITIONS = 50  # rlmm.config.remote.log.metadata.topic.num.partitions, Kafka's default
TIERED = {"remote.storage.enable": "true", "segment.bytes": "4096", "local.retention.ms": "0"}


def test_every_metadata_topic_partition_exists_and_answers_list_offsets(broker_factory, s3):
    b = _tier_broker(broker_factory, s3)
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    listed = admin.list_topics(METADATA_TOPIC, timeout=30).topics[METADATA_TOPIC]
    assert listed.error is None
    assert sorted(listed.partitions) == list(range(PARTITIONS))
    req = ListOffsetsRequest(
        replica_id=i32(-1),
        isolation_level=i8(0),
        topics=(
            ListOffsetsTopic(
                name=METADATA_TOPIC,
                partitions=tuple(
                    ListOffsetsPartition(partition_index=i32(p), timestamp=i64(EARLIEST))
                    for p in range(PARTITIONS)
                ),
            ),
        ),
        timeout=datetime.timedelta(seconds=10),
    )
    with RawClient(b.bootstrap) as c:
        answers = c.call(req).topics[0].partitions
    assert [(int(p.partition_index), int(p.error_code), int(p.offset)) for p in answers] == [
        (p, 0, 0) for p in range(PARTITIONS)
    ]
    # the jobs' plan of the topic needs no "missing partitions are fine" any more
    _ranges, bounds = plan_fetch_ranges(b.bootstrap, topics=[METADATA_TOPIC], isolation=0)
    assert sorted(bounds) == [(METADATA_TOPIC, p) for p in range(PARTITIONS)]
    # a restart keeps them (and the records: a topic tiered since then is still remote)
    topic = new_topic(b.bootstrap, partitions=1, prefix="tiermeta", **TIERED)
    ck_produce(b.bootstrap, topic, make_records(60, partitions=1, seed=3), codec="none",
               acks="all", idempotent=True, flush_every=10)  # fmt: skip
    wait_for(lambda: len(_local_bases(b, topic)) == 1 and _local_bases(b, topic)[0] > 0, 90)
    before = remote_segments(b.bootstrap)[(topic, 0)]
    b.restart()
    assert remote_segments(b.bootstrap)[(topic, 0)] == before
    parts = sorted(p.name for p in b.log_dir.glob(f"{METADATA_TOPIC}-*"))
    assert len(parts) == PARTITIONS


def _aborted_across_a_roll(bootstrap: str, topic: str) -> list[bytes]:
    """A transaction of ~9 KiB (segments of 4 KiB: it spans rolls), aborted, so its ABORT
    marker is in a later segment than its first batches; then committed records past it,
    enough to roll the marker's segment too. The values a read_committed reader must see."""
    p = ck.Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}", "linger.ms": 0}
    )
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(30):
        p.produce(topic, value=b"aborted-%d-" % i + b"a" * 300, partition=0)
        if i % 3 == 2:
            p.flush(30)  # several batches, on the broker before the abort
    p.abort_transaction(30)
    kept = [b"kept-%d-" % i + b"k" * 300 for i in range(40)]
    p.begin_transaction()
    for i, v in enumerate(kept):
        p.produce(topic, value=v, partition=0)
        if i % 4 == 3:
            p.flush(30)
    p.commit_transaction(30)
    return kept


def test_read_committed_from_the_tier_drops_a_transaction_aborted_in_a_later_segment(
    broker_factory, s3
):
    b = _tier_broker(broker_factory, s3)
    tiered = new_topic(b.bootstrap, partitions=1, prefix="tierabort", **TIERED)
    local = new_topic(b.bootstrap, partitions=1, prefix="localabort", **{"segment.bytes": "4096"})
    want = _aborted_across_a_roll(b.bootstrap, tiered)
    assert _aborted_across_a_roll(b.bootstrap, local) == want
    wait_for(lambda: len(_local_bases(b, tiered)) == 1, 90)
    segs = remote_segments(b.bootstrap)[(tiered, 0)]
    # the aborted batches start in the first segment, whose transaction index is empty: the
    # entry is in the index of a later one (the marker's), which is remote too
    assert segs[0].start_offset == 0 and segs[0].txn_index_empty
    assert any(not s.txn_index_empty for s in segs[1:])
    assert _local_bases(b, tiered)[0] > 31  # the marker (offset 30) only in the tier
    from_local = _values(b.bootstrap, local, "read_committed", len(want))
    assert from_local == want
    assert _values(b.bootstrap, tiered, "read_committed", len(want)) == from_local
    every = _values(b.bootstrap, tiered, "read_uncommitted", 30 + len(want))
    assert len(every) == 30 + len(want) and every[30:] == want

    # the marker still local (its segment not tiered): the search goes on in the local log
    topic = new_topic(b.bootstrap, partitions=1, prefix="tieropen", **TIERED)
    p = ck.Producer({"bootstrap.servers": b.bootstrap, "transactional.id": f"tx-{topic}",
                     "linger.ms": 0})  # fmt: skip
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(30):
        p.produce(topic, value=b"open-%d-" % i + b"o" * 300, partition=0)
        if i % 3 == 2:
            p.flush(30)
    wait_for(lambda: _local_bases(b, topic)[0] > 0, 90)  # the transaction's start is remote
    p.abort_transaction(30)
    p.begin_transaction()
    p.produce(topic, value=b"after", partition=0)
    p.commit_transaction(30)
    assert _values(b.bootstrap, topic, "read_committed", 1) == [b"after"]


def _table(lake: Path) -> Any:
    order = [("partition", "ascending"), ("offset", "ascending")]
    return DeltaTable(str(lake / "records")).to_pyarrow_table().sort_by(order)


def test_ingest_from_a_compressed_tier_equals_the_log_dir_ingest(
    spark: SparkSession, tmp_path: Path, broker_factory: Any, s3: Any
) -> None:
    b = _tier_broker(broker_factory, s3, **{"rsm.config.compression.enabled": "true"})
    # segments kept locally too: the log-dir ingest reads the same segment files
    topic = new_topic(b.bootstrap, partitions=1, prefix="tierzstd",
                      **{"remote.storage.enable": "true", "segment.bytes": "4096"})  # fmt: skip
    records = make_records(300, partitions=1, seed=11)
    ck_produce(b.bootstrap, topic, records, codec="none", acks="all", idempotent=True,
               flush_every=10)  # fmt: skip

    def all_tiered() -> bool:
        live = remote_segments(b.bootstrap).get((topic, 0), [])
        return bool(live) and live[-1].end_offset + 1 == _local_bases(b, topic)[-1]

    wait_for(all_tiered, 90)
    manifests = [k for k in s3.keys(PREFIX) if k.endswith(".rsm-manifest") and topic in k]
    assert len(manifests) > 2
    assert all(json.loads(s3.get(k))["compression"] is True for k in manifests)

    files = IngestConfig(log_dirs=(str(b.log_dir),), lake=str(tmp_path / "files"),
                         progress_interval_s=0, topics=(topic,))  # fmt: skip
    tier = dataclasses.replace(files, log_dirs=(), lake=str(tmp_path / "tier"),
                               bootstrap_servers=b.bootstrap,
                               remote_log_storage=s3.uri(PREFIX.rstrip("/")))  # fmt: skip
    lines: list[str] = []
    from_tier = run_ingest(spark, tier, log=lines.append)
    from_files = run_ingest(spark, files, log=print)
    assert from_tier.records == from_files.records == len(expected(records)[0]), lines
    a, t = _table(tmp_path / "files"), _table(tmp_path / "tier")
    from_store = pc.not_equal(t.column("segment_base_offset"), -1)
    assert pc.sum(from_store.cast("int64")).as_py() > 0
    # the tier's rows name the same segment and byte position as the log-dir read
    assert t.filter(from_store).equals(a.filter(from_store))
    drop = ["segment_base_offset", "batch_position"]
    assert t.drop_columns(drop).equals(a.drop_columns(drop))
