"""The jobs authenticate: ingest's lake-group commit and retention's DeleteRecords against a
broker whose only listener is SASL_SSL, the jobs logging in with SCRAM-SHA-512 from
``[kafka]`` of their pipeline TOML (``command_config``, Kafka's client.properties).

Real parts: the broker (no plaintext port at all), the SCRAM user made with ``loglake users``
(logged in with PLAIN from the broker's JAAS config), confluent-kafka producing and reading
the group's offsets and the watermarks back over SASL_SSL, the shared Spark session, the
``records`` table's progress read back from its Delta log.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession

from logstore.cli import main
from logstore.storage.checkpoints import read_offset_checkpoint
from logstore.tools.connection import AuthenticationError
from pipelines.ingest import load_config, read_progress, run_ingest
from pipelines.retention.job import load_retention_config, run_retention
from tests.fixtures.broker import wait_for
from tests.fixtures.tls import make_pki

pytestmark = pytest.mark.integration

JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_admin="admin-secret";'
OLD = int(time.time() * 1000) - 86_400_000  # a day ago: past the topic's retention.ms


def _write(path: Path, props: dict[str, str]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return path


def _pipeline(tmp_path: Path, name: str, log_dir: Path, bootstrap: str, client: Path) -> Path:
    broker_props = tmp_path / "broker.properties"
    broker_props.write_text("log.retention.hours=168\n")
    conf = tmp_path / name
    conf.write_text(
        f'[paths]\nlog_dirs = ["{log_dir}"]\nlake = "{tmp_path / "lake"}"\n'
        f'[ingest]\nbootstrap_servers = "{bootstrap}"\nprogress_interval_s = 0\n'
        f'[retention]\nbroker_config = "{broker_props}"\n'
        f'[kafka]\ncommand_config = "{client}"\n"client.id" = "lake-jobs"\n'
    )
    return conf


def _watermarks(ck_conf: dict[str, str]) -> tuple[int, int]:
    c = ck.Consumer({**ck_conf, "group.id": "wm"})
    try:
        low, high = c.get_watermark_offsets(ck.TopicPartition("events", 0), timeout=30)
        return int(low), int(high)
    finally:
        c.close()


def test_ingest_and_retention_log_in_with_scram_over_tls(
    spark: SparkSession, tmp_path: Path, broker_factory: Any, capsys: Any
) -> None:
    pki = make_pki(tmp_path / "pki")
    b = broker_factory(
        first_listener="SASL_SSL",
        **{
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(pki.server),
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
            "listener.name.sasl_ssl.plain.sasl.jaas.config": JAAS,
            "connection.failed.authentication.delay.ms": "20",
            "replica.high.watermark.checkpoint.interval.ms": "100",
            "log.flush.start.offset.checkpoint.interval.ms": "100",
            "log.retention.check.interval.ms": "3600000",  # the job, not the broker, deletes
            "log.segment.delete.delay.ms": "0",
        },
    )
    tls = {"ssl.truststore.type": "PEM", "ssl.truststore.location": str(pki.ca)}
    admin_props = _write(
        tmp_path / "admin.properties",
        {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
         "sasl.username": "admin", "sasl.password": "admin-secret", **tls},
    )  # fmt: skip
    assert main(["users", "--bootstrap-server", b.bootstrap, "--command-config",
                 str(admin_props), "--alter", "--entity-name", "lake", "--add-config",
                 "SCRAM-SHA-512=[iterations=4096,password=lake-secret]"]) == 0  # fmt: skip
    assert capsys.readouterr().out == "Completed updating config for user lake.\n"

    ck_conf = {
        "bootstrap.servers": b.bootstrap,
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(pki.ca),
        "sasl.mechanism": "PLAIN",
        "sasl.username": "admin",
        "sasl.password": "admin-secret",
    }
    admin = AdminClient(ck_conf)
    fs = admin.create_topics(
        [NewTopic("events", 1, 1, config={"segment.bytes": "4096", "retention.ms": "3600000"})]
    )
    fs["events"].result(timeout=30)
    p = ck.Producer({**ck_conf, "linger.ms": 0, "acks": "all"})
    for i in range(200):
        p.produce("events", value=f"v{i}:".encode() * 20, partition=0, timestamp=OLD + i)
        if i % 10 == 9:
            p.flush(30)
    assert p.flush(30) == 0
    wait_for(
        lambda: (
            (b.log_dir / "replication-offset-checkpoint").exists()
            and read_offset_checkpoint(b.log_dir / "replication-offset-checkpoint").get(
                ("events", 0)
            )
            == 200
        )
    )

    scram = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", **tls,
             "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule"
             ' required username="lake" password="lake-secret";'}  # fmt: skip
    conf = _pipeline(
        tmp_path,
        "pipeline.toml",
        b.log_dir,
        b.bootstrap,
        _write(tmp_path / "lake.properties", scram),
    )
    lines: list[str] = []
    summary = run_ingest(spark, load_config(conf), log=lines.append)
    assert summary.records == 200 and summary.lake_group_partitions == 1, lines
    assert read_progress(str(tmp_path / "lake" / "records")) == {("events", 0): 200}
    c = ck.Consumer({**ck_conf, "group.id": "loglake-ingest", "enable.auto.commit": False})
    try:
        assert c.committed([ck.TopicPartition("events", 0)], timeout=30)[0].offset == 200
    finally:
        c.close()

    # a wrong password: ingest still succeeds (the commit is a copy) and says why; retention
    # stops with the broker's refusal, a configuration error (exit 2 in the job), deleting
    # nothing
    bad = _pipeline(
        tmp_path,
        "bad.toml",
        b.log_dir,
        b.bootstrap,
        _write(
            tmp_path / "bad.properties",
            {**scram, "sasl.jaas.config": scram["sasl.jaas.config"].replace("lake-secret", "nope")},
        ),
    )
    lines.clear()
    again = run_ingest(spark, load_config(bad), log=lines.append)
    assert again.records == 0 and again.lake_group_partitions is None
    assert any("SASL_AUTHENTICATION_FAILED" in m and "nope" not in m for m in lines), lines
    with pytest.raises(AuthenticationError, match="SASL_AUTHENTICATION_FAILED"):
        run_retention(spark, load_retention_config(bad), bootstrap=b.bootstrap)
    assert _watermarks(ck_conf) == (0, 200)

    # the right password: everything is in the lake and past retention.ms; DeleteRecords
    # over SASL_SSL (the interrupted run above is settled first)
    deleted = run_retention(spark, load_retention_config(conf), bootstrap=b.bootstrap)
    assert deleted.mode == "online" and not deleted.errors
    start = deleted.log_starts["events/0"]
    assert 0 < start < 200 and deleted.deleted_segments > 0
    assert _watermarks(ck_conf) == (start, 200)
