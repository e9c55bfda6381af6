"""Kafka client properties (``--command-config``, ``[kafka]``) parsed and validated as Kafka's
clients take them, and the client side of SCRAM checked against RFC 7677's example exchange
and against the broker's own server side."""

from __future__ import annotations

import base64
import ssl
from pathlib import Path

import pytest

from logstore.server.security.scram import (
    ScramAuthError,
    ScramClient,
    ScramCredentials,
    ScramExchange,
    credential_from_salted,
    salted_password,
    verify_password,
)
from logstore.tools.client_config import ClientConfigError, client_config, load_client_config
from tests.fixtures.tls import make_pki

SCRAM_JAAS = (
    "org.apache.kafka.common.security.scram.ScramLoginModule required\n"
    '    username="alice" password="pa\\"ss";'
)


def _cfg(**props: str):
    return client_config(props, source="client.properties")


def test_a_properties_file_with_kafka_syntax(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    f = tmp_path / "client.properties"
    f.write_text(
        "# Kafka's tools read this file\n"
        "security.protocol = SASL_SSL\n"
        "sasl.mechanism: SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
        '    username="alice" password="alice-secret";\n'
        "ssl.truststore.type=PEM\n"
        f"ssl.truststore.location={pki.ca}\n"
        "ssl.endpoint.identification.algorithm=\n"
        "request.timeout.ms=1500\n"
        "acks=all\n"  # a producer's key: accepted, no effect here
    )
    cfg = load_client_config(f)
    assert (cfg.security_protocol, cfg.sasl_mechanism) == ("SASL_SSL", "SCRAM-SHA-512")
    assert (cfg.username, cfg.password) == ("alice", "alice-secret")
    assert cfg.trust_pem == pki.ca.read_text()
    assert cfg.check_hostname is False and cfg.request_timeout_s == 1.5
    assert "alice-secret" not in repr(cfg)
    ctx = cfg.ssl_context()
    assert ctx.verify_mode == ssl.CERT_REQUIRED and not ctx.check_hostname
    assert len(ctx.get_ca_certs()) == 1


def test_logins_in_both_forms() -> None:
    cfg = _cfg(**{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
                  "sasl.jaas.config": SCRAM_JAAS})  # fmt: skip
    assert (cfg.username, cfg.password) == ("alice", 'pa"ss')
    cfg = _cfg(**{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                  "sasl.username": "bob", "sasl.password": "pw"})  # fmt: skip
    assert (cfg.sasl_mechanism, cfg.username, cfg.password) == ("PLAIN", "bob", "pw")
    assert _cfg().security_protocol == "PLAINTEXT" and not _cfg().uses_tls


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"security.protocl": "SSL"}, "unknown client property 'security.protocl'; did you mean"
         " 'security.protocol'?"),
        ({"bootstrap.server": "h:1"}, "did you mean 'bootstrap.servers'?"),
        ({"security.protocol": "TLS"}, "security.protocol='TLS': expected one of PLAINTEXT, SSL,"
         " SASL_PLAINTEXT, SASL_SSL"),
        ({"security.protocol": "SASL_SSL"}, "sasl.mechanism is unset (Kafka's default GSSAPI)"),
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"},
         "expected one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"),
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}, "needs a login"),
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
          "sasl.jaas.config": SCRAM_JAAS}, "sasl.mechanism=PLAIN needs"
         " org.apache.kafka.common.security.plain.PlainLoginModule"),
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
          "sasl.jaas.config": SCRAM_JAAS, "sasl.username": "x"}, "not both"),
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
          "sasl.jaas.config": "ScramLoginModule required username=alice;"}, "cannot parse"),
        ({"sasl.username": "x", "sasl.password": "y"}, "does not use SASL"),
        ({"security.protocol": "SSL", "ssl.truststore.type": "JKS"}, "only PEM is supported"),
        ({"security.protocol": "SSL", "ssl.truststore.location": "/nonexistent/ca.pem"},
         "cannot read the PEM file"),
        ({"security.protocol": "SSL", "ssl.truststore.certificates": "not pem"},
         "holds no PEM certificate"),
        ({"ssl.endpoint.identification.algorithm": "dns"}, "expected https or empty"),
        ({"ssl.enabled.protocols": "TLSv1.1"}, "expected a subset of TLSv1.2, TLSv1.3"),
        ({"request.timeout.ms": "-1"}, "request.timeout.ms='-1': expected an integer"),
        ({"ssl.keystore.key": "x"}, "go together"),
    ],
)  # fmt: skip
def test_refused_naming_the_key(props: dict[str, str], message: str) -> None:
    with pytest.raises(ClientConfigError) as info:
        _cfg(**props)
    assert message in str(info.value)
    assert "client.properties" in str(info.value)
    for secret in ("alice-secret", 'pa"ss'):
        assert secret not in str(info.value)


def test_a_keystore_for_mtls(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    key, chain = pki.client_key.read_text(), pki.client_cert.read_text()
    cfg = _cfg(**{"security.protocol": "SSL", "ssl.keystore.key": key,
                  "ssl.keystore.certificate.chain": chain,
                  "ssl.truststore.certificates": pki.ca.read_text()})  # fmt: skip
    assert (cfg.key_pem, cfg.chain_pem) == (key, chain)
    # a key that is not the certificate's: OpenSSL refuses it before any connection
    with pytest.raises(ClientConfigError, match="key and certificate chain do not load"):
        _cfg(**{"security.protocol": "SSL", "ssl.keystore.key": pki.rogue_key.read_text(),
                "ssl.keystore.certificate.chain": chain})  # fmt: skip


def test_scram_client_reproduces_rfc_7677() -> None:
    # RFC 7677 section 3: user "user", password "pencil", SCRAM-SHA-256
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert client.first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    server_first = (
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    assert client.final(server_first) == (
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    client.verify(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
    with pytest.raises(ScramAuthError, match="signature"):
        client.verify(b"v=" + base64.b64encode(b"\0" * 32))


def _store(tmp_path: Path, password: str, iterations: int = 4096) -> ScramCredentials:
    store = ScramCredentials(tmp_path / "creds.json")
    salt = b"salt-of-alice"
    cred = credential_from_salted(
        "SCRAM-SHA-512", salted_password("SCRAM-SHA-512", password, salt, iterations), salt,
        iterations,
    )  # fmt: skip
    store.alter(upserts=[("alice", "SCRAM-SHA-512", cred)], deletes=[])
    return store


@pytest.mark.parametrize("password", ["alice-secret", "wrong"])
def test_scram_client_against_the_broker_side(tmp_path: Path, password: str) -> None:
    store = _store(tmp_path, "alice-secret")
    server = ScramExchange("SCRAM-SHA-512", store)
    client = ScramClient("SCRAM-SHA-512", "alice", password)
    final = client.final(server.first(client.first()))
    if password == "wrong":
        with pytest.raises(ScramAuthError, match="bad proof"):
            server.final(final)
        return
    client.verify(server.final(final))
    cred = store.get("alice", "SCRAM-SHA-512")
    assert cred is not None
    assert verify_password("SCRAM-SHA-512", "alice-secret", cred)
    assert not verify_password("SCRAM-SHA-512", "alice-secreT", cred)


@pytest.mark.parametrize(
    ("server_first", "message"),
    [
        (b"r=othernonce,s=c2FsdA==,i=4096", "does not extend"),
        (b"r=abc,s=c2FsdA==,i=4096", "does not extend"),  # no server part
        (b"r=abcXYZ,s=c2FsdA==,i=1024", "at least 4096"),
        (b"r=abcXYZ,s=!!,i=4096", "not base64"),
        (b"\xff", "not UTF-8"),
    ],
)
def test_scram_client_refuses_a_bad_server_first(server_first: bytes, message: str) -> None:
    client = ScramClient("SCRAM-SHA-512", "alice", "pw", nonce="abc")
    with pytest.raises(ScramAuthError, match=message):
        client.final(server_first)
