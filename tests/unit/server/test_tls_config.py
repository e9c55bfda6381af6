"""TLS listener settings from Kafka's ``ssl.*`` keys: what loads, what is refused and why."""

from __future__ import annotations

import pytest

from logstore.server.config import BrokerConfig, ConfigError
from tests.fixtures.tls import make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def _load(*items: str) -> BrokerConfig:
    return BrokerConfig.load(None, overrides=list(items))


def test_two_listeners_with_per_listener_tls_and_advertised(pki):
    c = _load(
        "listeners=PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9093,MTLS://127.0.0.1:9094",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SSL:SSL,MTLS:SSL",
        "advertised.listeners=PLAINTEXT://a:1,MTLS://c:3",
        f"ssl.keystore.location={pki.server}",
        f"listener.name.mtls.ssl.truststore.location={pki.ca}",
        "listener.name.mtls.ssl.client.auth=required",
        "listener.name.mtls.ssl.enabled.protocols=TLSv1.3",
    )
    assert [lst.name for lst in c.listeners] == ["PLAINTEXT", "SSL", "MTLS"]
    assert c.security_protocols == {"PLAINTEXT": "PLAINTEXT", "SSL": "SSL", "MTLS": "SSL"}
    assert c.listener.name == "PLAINTEXT" and c.advertised is not None
    assert (c.advertised_listeners["MTLS"].host, c.advertised_listeners["MTLS"].port) == ("c", 3)
    assert "SSL" not in c.advertised_listeners
    assert set(c.tls) == {"SSL", "MTLS"}
    assert c.tls["SSL"].client_auth == "none" and c.tls["SSL"].trust_pem is None
    assert c.tls["MTLS"].client_auth == "required"
    assert c.tls["MTLS"].protocols == ("TLSv1.3",)


def test_key_and_chain_as_values(pki):
    text = pki.server.read_text()
    key_end = text.index("-----END PRIVATE KEY-----") + len("-----END PRIVATE KEY-----")
    c = BrokerConfig(
        {
            "listeners": "SSL://127.0.0.1:0",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.key": text[:key_end],
            "ssl.keystore.certificate.chain": text[key_end:],
            "ssl.truststore.certificates": pki.ca.read_text(),
            "ssl.client.auth": "requested",
        }
    )
    assert c.tls["SSL"].client_auth == "requested"


@pytest.mark.parametrize(
    ("items", "fragment"),
    [
        (["ssl.keystore.type=JKS"], "ssl.keystore.type='JKS': only PEM"),
        (["ssl.keystore.location=/nonexistent.pem"], "cannot read the PEM file"),
        (["ssl.keystore.location={ca}"], "expected a PEM private key and certificate chain"),
        (["ssl.keystore.location={server}", "ssl.client.auth=required"], "needs ssl.truststore"),
        (["ssl.keystore.location={server}", "ssl.client.auth=always"], "expected one of"),
        (["ssl.keystore.location={server}", "ssl.enabled.protocols=TLSv1.1"], "subset of"),
        (
            ["ssl.keystore.location={server}", "ssl.truststore.location={server}"],
            None,  # a key in the truststore file is ignored by OpenSSL: the CA still loads
        ),
        (
            ["ssl.keystore.location={server}", "ssl.keystore.key=x"],
            "not both",
        ),
    ],
)
def test_bad_tls_settings_are_refused_naming_the_key(pki, items, fragment):
    fmt = {"ca": pki.ca, "server": pki.server}
    overrides = ["listeners=SSL://127.0.0.1:0"] + [i.format(**fmt) for i in items]
    if fragment is None:
        assert _load(*overrides).tls["SSL"].trust_pem is not None
        return
    with pytest.raises(ConfigError) as exc:
        _load(*overrides)
    assert fragment in str(exc.value)


def test_mismatched_key_and_certificate_fail_at_start_up(pki, tmp_path):
    wrong = tmp_path / "wrong.pem"
    wrong.write_text(
        pki.client_key.read_text()
        + pki.server.read_text().split("-----END PRIVATE KEY-----\n", 1)[1]
    )
    with pytest.raises(ConfigError) as exc:
        _load("listeners=SSL://127.0.0.1:0", f"ssl.keystore.location={wrong}")
    assert "do not load" in str(exc.value)
