"""Kafka 4.x's stock KRaft ``config/server.properties`` starts the real loglake broker as it
is (only log.dirs and the listeners' ports overridden); confluent-kafka produces and consumes.

The file's copy, with its provenance, is ``tests/fixtures/kafka_4_server.properties``.
"""

from __future__ import annotations

import socket
from pathlib import Path

import confluent_kafka as ck
import pytest

from logstore.server.config import BrokerConfig, ConfigError
from tests.fixtures.broker import BrokerProcess, free_port
from tests.integration.broker.clients import ck_consume, new_topic

pytestmark = pytest.mark.integration

STOCK = Path(__file__).resolve().parents[2] / "fixtures" / "kafka_4_server.properties"


class StockBroker(BrokerProcess):
    """The broker started with ``--config`` the stock file; ports and log.dirs overridden."""

    def __init__(self, workdir: Path, **overrides: str) -> None:
        super().__init__(workdir)
        self.controller_port = free_port()
        self.extra = overrides

    def command(self) -> list[str]:
        h, p, c = self.host, self.port, self.controller_port
        props = {
            "log.dirs": str(self.log_dir),
            "listeners": f"PLAINTEXT://{h}:{p},CONTROLLER://{h}:{c}",
            "advertised.listeners": f"PLAINTEXT://{h}:{p},CONTROLLER://{h}:{c}",
            "controller.quorum.bootstrap.servers": f"{h}:{c}",
            **self.extra,
        }
        cmd = [*super().command()[:4], "--config", str(STOCK)]
        for k, v in props.items():
            cmd += ["--override", f"{k}={v}"]
        return cmd


def test_stock_kraft_server_properties_start_the_broker(tmp_path):
    b = StockBroker(tmp_path / "stock").start()
    try:
        topic = new_topic(b.bootstrap, partitions=2, prefix="stock")
        p = ck.Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True})
        for i in range(50):
            p.produce(topic, key=b"k%d" % i, value=b"v%d" % i, partition=i % 2)
        assert p.flush(30) == 0
        del p  # no reconnect attempts to the broker once it is stopped
        got = ck_consume(b.bootstrap, topic, {0: 25, 1: 25})
        assert sorted(g.value for g in got) == sorted(b"v%d" % i for i in range(50))
        # the controller listener is accepted and not opened
        with socket.socket() as s:
            s.settimeout(2)
            assert s.connect_ex((b.host, b.controller_port)) != 0
        log = b.log_text()
        assert log.count("ignoring Kafka broker keys loglake does not use") == 1
        for key in (
            "num.recovery.threads.per.data.dir",
            "offsets.topic.replication.factor",
            "share.coordinator.state.topic.replication.factor",
            "share.coordinator.state.topic.min.isr",
            "controller.quorum.bootstrap.servers",
        ):
            assert key in log
        assert f"controller listener CONTROLLER://{b.host}:{b.controller_port}" in log
    finally:
        assert b.stop() == 0


def test_stock_file_with_kraft_voters_of_kafka_3(tmp_path):
    # Kafka 3.x files name the quorum with controller.quorum.voters instead
    b = StockBroker(tmp_path / "voters", **{"controller.quorum.voters": "1@127.0.0.1:9093"})
    b.start()
    try:
        topic = new_topic(b.bootstrap, partitions=1, prefix="voters")
        p = ck.Producer({"bootstrap.servers": b.bootstrap})
        p.produce(topic, value=b"x")
        assert p.flush(30) == 0
        del p  # no reconnect attempts to the broker once it is stopped
        assert [g.value for g in ck_consume(b.bootstrap, topic, {0: 1})] == [b"x"]
    finally:
        assert b.stop() == 0


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        # neither Kafka's nor loglake's: refused, naming the nearest valid key
        ("log.retention.hour=5", "did you mean 'log.retention.hours'?"),
        ("process.roles=controller", "include broker"),
        ("inter.broker.listener.name=INTERNAL", "expected a client listener ['PLAINTEXT']"),
        ("listeners=PLAINTEXT://:1,EXTERNAL://:2", "uses security protocol 'EXTERNAL'"),
        ("listeners=PLAINTEXT://:1,SSL://:2,CONTROLLER://:3", "set ssl.keystore.location"),
        ("log.cleaner.min.cleanable.ratio=1.5", "log.cleaner.min.cleanable.ratio='1.5'"),
        ("compression.type=brotli", "compression.type='brotli'"),
    ],
)
def test_bad_broker_keys_are_refused(override, fragment):
    with pytest.raises(ConfigError) as exc:
        BrokerConfig.load(STOCK, overrides=[override])
    assert fragment in str(exc.value)
