"""``schema.registry.listeners``: off by default, an http://host:port listener, refused
otherwise (with the key named), and documented in conf/broker.properties."""

from __future__ import annotations

from pathlib import Path

import pytest

from logstore.server.config import BrokerConfig, ConfigError

ROOT = Path(__file__).resolve().parents[3]


def test_registry_listener_parsed_and_validated() -> None:
    assert BrokerConfig({}).registry_listener is None
    listener = BrokerConfig({"schema.registry.listeners": "http://127.0.0.1:0"}).registry_listener
    assert listener is not None and (listener.host, listener.port) == ("127.0.0.1", 0)
    for bad in ("PLAINTEXT://127.0.0.1:8081", "http://127.0.0.1:70000", "8081"):
        with pytest.raises(ConfigError, match=r"schema\.registry\.listeners"):
            BrokerConfig({"schema.registry.listeners": bad})
    with pytest.raises(ConfigError, match=r"schema\.registry\.listeners"):
        BrokerConfig({"schema.registry.listener": "http://127.0.0.1:0"})  # nearest key named
    assert "schema.registry.listeners" in (ROOT / "conf" / "broker.properties").read_text()
