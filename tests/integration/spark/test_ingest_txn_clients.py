"""Ingest (read_committed) of a log written by real transactional clients on the real broker.

confluent-kafka transactional producers (committed, aborted and one transaction left open
across the first ingest run) and an idempotent plain producer write one partition; the
``records`` table (read back with deltalake) must hold exactly what a READ_COMMITTED
confluent-kafka consumer returns, after each run. Needs the broker's transaction coordinator
(issue 15).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from pipelines.ingest import IngestConfig, read_progress, run_ingest
from tests.integration.broker.clients import new_topic

pytestmark = pytest.mark.integration


def _producer(bootstrap: str, txn_id: str) -> ck.Producer:
    p = ck.Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": txn_id,
            "linger.ms": 5,
            "compression.type": "lz4",
        }
    )
    p.init_transactions(30)
    return p


def _txn(p: ck.Producer, topic: str, values: list[bytes], *, commit: bool | None) -> None:
    p.begin_transaction()
    for v in values:
        p.produce(topic, key=b"k", value=v, partition=0)
    p.flush(30)
    if commit is True:
        p.commit_transaction(30)
    elif commit is False:
        p.abort_transaction(30)


def _consume(bootstrap: str, topic: str, isolation: str) -> list[bytes]:
    c = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{time.time_ns()}",
            "auto.offset.reset": "earliest",
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )
    c.assign([ck.TopicPartition(topic, 0, 0)])
    out: list[bytes] = []
    idle = time.monotonic()
    while time.monotonic() - idle < 6:
        m = c.poll(0.5)
        if m is None or m.error():
            continue
        out.append(m.value())
        idle = time.monotonic()
    c.close()
    return out


def _quiet(_msg: str) -> None:
    pass


def _lake_values(lake: Path, topic: str) -> list[bytes]:
    t = DeltaTable(str(lake / "records")).to_pyarrow_table(columns=["topic", "offset", "value"])
    rows = sorted((r["offset"], r["value"]) for r in t.to_pylist() if r["topic"] == topic)
    return [v for _o, v in rows]


def test_ingest_equals_a_read_committed_consumer(
    spark: SparkSession, tmp_path: Path, broker_factory: Any
) -> None:
    b = broker_factory(replica_high_watermark_checkpoint_interval_ms=200)
    topic = new_topic(b.bootstrap, partitions=1)
    a = _producer(b.bootstrap, "txn-a")
    o = _producer(b.bootstrap, "txn-o")
    plain = ck.Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True})
    _txn(a, topic, [b"a%d" % i for i in range(50)], commit=True)
    _txn(a, topic, [b"b%d" % i for i in range(30)], commit=False)
    _txn(o, topic, [b"o%d" % i for i in range(20)], commit=None)  # stays open
    _txn(a, topic, [b"c%d" % i for i in range(40)], commit=True)
    for i in range(5):
        plain.produce(topic, value=b"p%d" % i, partition=0)
    plain.flush(30)
    time.sleep(1.5)  # the high watermark checkpoint
    lake = tmp_path / "lake"
    config = IngestConfig(
        log_dirs=(str(b.log_dir),), lake=str(lake), progress_interval_s=0, topics=(topic,)
    )
    s1 = run_ingest(spark, config, log=_quiet)
    view = _consume(b.bootstrap, topic, "read_committed")
    assert _lake_values(lake, topic) == view == [b"a%d" % i for i in range(50)]
    # held at the open transaction: 50 records, a marker, 30 aborted, a marker
    assert s1.held_at_lso == {f"{topic}/0": 82} and s1.aborted_transactions == 1
    for i in range(20, 25):  # more of the open transaction, then its commit
        o.produce(topic, key=b"k", value=b"o%d" % i, partition=0)
    o.commit_transaction(30)
    time.sleep(1.5)
    s2 = run_ingest(spark, config, log=_quiet)
    view = _consume(b.bootstrap, topic, "read_committed")
    assert _lake_values(lake, topic) == view  # every committed record once, in offset order
    assert len(view) == 50 + 40 + 5 + 20 + 5 and not any(v.startswith(b"b") for v in view)
    assert s2.records == 70 and s2.held_at_lso == {}
    assert read_progress(lake / "records") == {(topic, 0): 154}
