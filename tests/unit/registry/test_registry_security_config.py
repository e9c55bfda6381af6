"""The registry's security keys: ``https://`` listeners with ``schema.registry.ssl.*`` over the
broker's ``ssl.*``, ``schema.registry.authentication.method``; each bad value refused at
start-up naming the key. The PEM files are made by the tests."""

from __future__ import annotations

import pytest

from logstore.server.config import BrokerConfig, ConfigError
from tests.fixtures.tls import make_pki


def test_https_listener_takes_its_own_keys_over_the_brokers(tmp_path) -> None:
    pki = make_pki(tmp_path)
    cfg = BrokerConfig(
        {
            "schema.registry.listeners": "https://127.0.0.1:0",
            "ssl.keystore.location": str(pki.server),  # broker-wide: the fallback
            "schema.registry.ssl.truststore.location": str(pki.ca),
            "schema.registry.ssl.client.auth": "required",
        }
    )
    assert cfg.registry_listener is not None and cfg.registry_listener.name == "https"
    assert cfg.registry_tls is not None
    assert cfg.registry_tls.client_auth == "required"
    assert cfg.registry_tls.trust_pem == pki.ca.read_text()
    assert cfg.get_str("schema.registry.authentication.method") == "NONE"
    assert not cfg.ignored  # the ssl.* keys are used (by the registry), not ignored
    plain = BrokerConfig({"schema.registry.listeners": "http://127.0.0.1:0"})
    assert plain.registry_tls is None


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"schema.registry.listeners": "https://127.0.0.1:0"},
         "schema.registry.listeners='https://127.0.0.1:0' (TLS from schema.registry.ssl.* or"
         " ssl.*): listener schema.registry uses TLS: set ssl.keystore.location"),
        ({"schema.registry.listeners": "ftp://127.0.0.1:0"},
         "expected http://host:port or https://host:port"),
        ({"schema.registry.listeners": "http://127.0.0.1:0",
          "schema.registry.ssl.keystore.location": "x.pem"},
         "schema.registry.ssl.* is set but schema.registry.listeners='http://127.0.0.1:0'"
         " is not https"),
        ({"schema.registry.ssl.keystore.locaton": "x.pem"},
         "unknown configuration key(s): 'schema.registry.ssl.keystore.locaton'"),
        ({"schema.registry.authentication.method": "DIGEST"},
         "schema.registry.authentication.method"),
    ],
)  # fmt: skip
def test_refused_naming_the_key(props: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        BrokerConfig(props)
    assert message in str(info.value)
