"""Ingest through Fetch (no log dirs): the ``records`` table equals, row for row, the one
ingested from the broker's log dirs; a re-run commits nothing; a SASL_SSL broker is read
through ``[kafka]``. A real broker, confluent-kafka producing, the shared Spark session, both
tables read back with delta-rs (an independent reader)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pyarrow as pa
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from logstore.storage.checkpoints import read_offset_checkpoint
from pipelines.ingest import IngestConfig, load_config, read_progress, run_ingest
from tests.fixtures.broker import wait_for
from tests.fixtures.tls import make_pki
from tests.integration.sources.traffic import PARTITIONS, produce_all

pytestmark = pytest.mark.integration

FILE_COLUMNS = ["segment_base_offset", "batch_position"]
JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_lake="lake-pw";'


def _rows(lake: Path) -> pa.Table:
    table = DeltaTable(str(lake / "records")).to_pyarrow_table()
    return table.drop_columns(FILE_COLUMNS).sort_by(
        [("partition", "ascending"), ("offset", "ascending")]
    )


def test_fetch_ingest_equals_log_dir_ingest(
    spark: SparkSession, tmp_path: Path, broker_factory: Any
) -> None:
    b = broker_factory(**{"replica.high.watermark.checkpoint.interval.ms": "100"})
    topic, want = produce_all(b.bootstrap)
    lso = {}
    c = ck.Consumer({"bootstrap.servers": b.bootstrap, "group.id": "x"})
    for p in range(PARTITIONS):
        lso[p] = c.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=30)[1]
    c.close()
    wait_for(
        lambda: (
            (b.log_dir / "replication-offset-checkpoint").exists()
            and all(
                read_offset_checkpoint(b.log_dir / "replication-offset-checkpoint").get((topic, p))
                == e
                for p, e in lso.items()
            )
        )
    )
    base = IngestConfig(log_dirs=(str(b.log_dir),), lake=str(tmp_path / "a"),
                        progress_interval_s=0, topics=(topic,))  # fmt: skip
    from_files = run_ingest(spark, base, log=print)
    fetch = dataclasses.replace(base, log_dirs=(), lake=str(tmp_path / "b"),
                                bootstrap_servers=b.bootstrap)  # fmt: skip
    lines: list[str] = []
    through_fetch = run_ingest(spark, fetch, log=lines.append)
    assert from_files.records == want and through_fetch.records == want, lines
    a, fetched = _rows(tmp_path / "a"), _rows(tmp_path / "b")
    assert fetched.num_rows == want
    assert fetched.equals(a)
    assert read_progress(str(tmp_path / "b" / "records")) == read_progress(
        str(tmp_path / "a" / "records")
    )
    # the lake group follows the Fetch run too (no log dirs to list the partitions)
    assert through_fetch.lake_group_partitions == PARTITIONS
    again = run_ingest(spark, fetch, log=lines.append)
    assert again.records == 0 and not again.committed
    assert _rows(tmp_path / "b").num_rows == want
    # new records: the next run takes exactly them, from the progress on
    p = ck.Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0})
    for i in range(90):
        p.produce(topic, value=b"more-%d" % i, partition=i % PARTITIONS)
    assert p.flush(30) == 0
    more = run_ingest(spark, fetch, log=lines.append)
    assert more.records == 90 and more.committed
    values = _rows(tmp_path / "b").column("value").to_pylist()
    assert len(values) == want + 90
    assert sorted(v for v in values if v is not None and v.startswith(b"more-")) == sorted(
        b"more-%d" % i for i in range(90)
    )


def test_fetch_ingest_logs_in_through_kafka_section(
    spark: SparkSession, tmp_path: Path, broker_factory: Any
) -> None:
    pki = make_pki(tmp_path / "pki")
    b = broker_factory(
        first_listener="SASL_SSL",
        **{
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(pki.server),
            "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_ssl.plain.sasl.jaas.config": JAAS,
        },
    )
    ck_conf = {"bootstrap.servers": b.bootstrap, "security.protocol": "SASL_SSL",
               "ssl.ca.location": str(pki.ca), "sasl.mechanism": "PLAIN",
               "sasl.username": "lake", "sasl.password": "lake-pw"}  # fmt: skip
    admin = AdminClient(ck_conf)
    admin.create_topics([NewTopic("events", 2, 1)])["events"].result(timeout=30)
    p = ck.Producer({**ck_conf, "linger.ms": 0, "acks": "all", "compression.type": "zstd"})
    for i in range(300):
        p.produce("events", key=b"k%d" % i, value=b"v%d" % i, partition=i % 2,
                  headers=[("n", b"%d" % i)])  # fmt: skip
    assert p.flush(30) == 0
    client = tmp_path / "lake.properties"
    client.write_text(
        "security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nssl.truststore.type=PEM\n"
        f"ssl.truststore.location={pki.ca}\nsasl.jaas.config=org.apache.kafka.common.security"
        '.plain.PlainLoginModule required username="lake" password="lake-pw";\n'
    )
    conf = tmp_path / "pipeline.toml"
    conf.write_text(
        f'[paths]\nlog_dirs = []\nlake = "{tmp_path / "lake"}"\n'
        f'[ingest]\nbootstrap_servers = "{b.bootstrap}"\nprogress_interval_s = 0\n'
        f'[kafka]\ncommand_config = "{client}"\n'
    )
    lines: list[str] = []
    summary = run_ingest(spark, load_config(conf), log=lines.append)
    assert summary.records == 300, lines
    assert read_progress(str(tmp_path / "lake" / "records")) == {("events", 0): 150,
                                                                  ("events", 1): 150}  # fmt: skip
    table = DeltaTable(str(tmp_path / "lake" / "records")).to_pyarrow_table()
    assert sorted(table.column("value").to_pylist()) == sorted(b"v%d" % i for i in range(300))
