"""Broker configuration: Kafka key names, defaults, validation, properties parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from logstore.server.config import (
    BROKER_CONFIG_DEFS,
    BrokerConfig,
    ConfigError,
    parse_properties,
)
from logstore.storage.config import LogConfig

ROOT = Path(__file__).resolve().parents[3]


def test_defaults_are_kafkas():
    c = BrokerConfig({})
    assert (c.listener.host, c.listener.port) == ("127.0.0.1", 9092)
    assert c.get_int("num.network.threads") == 3
    assert c.get_int("num.io.threads") == 8
    assert c.get_int("queued.max.requests") == 500
    assert c.get_int("socket.request.max.bytes") == 104857600
    assert c.get_int("message.max.bytes") == 1048588
    assert c.retention_ms == 168 * 3600 * 1000
    assert c.get_bool("auto.create.topics.enable") is True


def test_overrides_and_units():
    c = BrokerConfig.load(
        None,
        overrides=[
            "listeners=PLAINTEXT://0.0.0.0:0",
            "log.dirs=/a,/b",
            "log.retention.minutes=5",
            "log.roll.ms=1000",
            "log.cleanup.policy=compact,delete",
        ],
    )
    assert c.listener.port == 0
    assert [str(p) for p in c.log_dirs] == ["/a", "/b"]
    assert c.retention_ms == 300_000
    d = c.topic_defaults()
    assert d["retention.ms"] == "300000"
    assert d["segment.ms"] == "1000"
    assert d["cleanup.policy"] == "compact,delete"
    cfg = LogConfig.from_properties(d)
    assert cfg.retention_ms == 300_000 and cfg.compact and cfg.delete


@pytest.mark.parametrize(
    ("item", "fragment"),
    [
        ("no.such.key=1", "unknown configuration key"),
        ("num.io.threads=zero", "expected an integer"),
        ("num.io.threads=0", "num.io.threads"),
        ("auto.create.topics.enable=yes", "true or false"),
        ("listeners=SSL://127.0.0.1:9093", "set ssl.keystore.location"),
        ("listeners=SASL_PLAINTEXT://127.0.0.1:9093", "set sasl.enabled.mechanisms"),
        ("listeners=EXTERNAL://127.0.0.1:9093", "security protocol 'EXTERNAL'"),
        ("listeners=PLAINTEXT://:1,PLAINTEXT://:2", "more than once"),
        ("listeners=127.0.0.1:9092", "PLAINTEXT://host:port"),
        ("listeners=PLAINTEXT://h:70000", "out of range"),
        ("log.cleanup.policy=shred", "shred"),
        ("log.message.timestamp.type=Whenever", "CreateTime"),
        ("default.replication.factor=3", "default.replication.factor"),
        ("novalue", "expected key=value"),
    ],
)
def test_invalid_settings_are_clear_errors(item, fragment):
    with pytest.raises(ConfigError) as exc:
        BrokerConfig.load(None, overrides=[item])
    assert fragment in str(exc.value)


def test_properties_parsing():
    text = "# comment\n! also\n a.b = 1 \nc: two\nd three\ne=long \\\n    value\nf=\n"
    assert parse_properties(text) == {
        "a.b": "1",
        "c": "two",
        "d": "three",
        "e": "long value",
        "f": "",
    }


def test_shipped_broker_properties_documents_every_key():
    path = ROOT / "conf" / "broker.properties"
    c = BrokerConfig.load(path)
    assert c.listener.port == 9092
    text = path.read_text()
    for key in BROKER_CONFIG_DEFS:
        assert f"# {key} (" in text, key


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError) as exc:
        BrokerConfig.load(tmp_path / "nope.properties")
    assert "nope.properties" in str(exc.value)


def test_a_renamed_key_is_read_under_its_old_name(caplog):
    # loglake's own keys follow Kafka's naming; the one renamed to do so still works.
    with caplog.at_level("WARNING", logger="logstore.server.config"):
        cfg = BrokerConfig({"loglake.request.read.timeout.ms": "1234"})
    assert cfg.get_int("socket.request.read.timeout.ms") == 1234
    assert "loglake.request.read.timeout.ms is now named socket.request.read.timeout.ms" in (
        caplog.text
    )
    assert BrokerConfig({}).get_int("socket.request.read.timeout.ms") == 30000
    with pytest.raises(ConfigError, match="both set"):
        BrokerConfig(
            {"loglake.request.read.timeout.ms": "1", "socket.request.read.timeout.ms": "2"}
        )


def test_the_key_table_keeps_its_public_home() -> None:
    """The key table lives in ``config_defs`` since the split; ``logstore.server.config`` still
    exports the same objects under the same names."""
    from logstore.server import config, config_defs

    for name in config_defs.__all__:
        if name in config.__all__:
            assert getattr(config, name) is getattr(config_defs, name), name
    assert {"BROKER_CONFIG_DEFS", "TOPIC_KEY_FOR_BROKER_KEY", "ConfigDef"} <= set(config.__all__)
    assert config.BROKER_CONFIG_DEFS["log.retention.hours"].type == "int"
