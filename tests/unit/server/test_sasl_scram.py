"""SASL pieces without a broker: Kafka's JAAS syntax, PLAIN tokens, SCRAM against RFC 7677's
example, the credential file, and random input into the SCRAM parser."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from logstore.server.security.sasl import SaslConfigError, parse_plain_users, plain_authenticate
from logstore.server.security.scram import (
    ScramAuthError,
    ScramCredentials,
    ScramExchange,
    ScramStoreError,
    credential_from_salted,
    salted_password,
)

JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required\n"
    '  username="admin" password="admin-secret"\n'
    '  user_admin="admin-secret" user_alice="p\\"w;,=";'
)


def test_jaas_users():
    assert parse_plain_users(JAAS, key="k") == {"admin": "admin-secret", "alice": 'p"w;,='}


@pytest.mark.parametrize(
    "text",
    [
        'com.example.Other required user_a="b";',
        'org.apache.kafka.common.security.plain.PlainLoginModule required user_a="b"',
        "org.apache.kafka.common.security.plain.PlainLoginModule required user_a=b;",
    ],
)
def test_bad_jaas_refused(text):
    with pytest.raises(SaslConfigError):
        parse_plain_users(text, key="listener.name.x.plain.sasl.jaas.config")


@pytest.mark.parametrize(
    ("token", "user"),
    [
        (b"\x00alice\x00pw", "alice"),
        (b"alice\x00alice\x00pw", "alice"),
        (b"bob\x00alice\x00pw", None),
        (b"\x00alice\x00PW", None),
        (b"\x00nobody\x00pw", None),
        (b"\x00alice", None),
        (b"\x00\xff\x00pw", None),
    ],
)
def test_plain_tokens(token, user):
    assert plain_authenticate(token, {"alice": "pw"}) == user


def test_scram_sha256_rfc7677_example(tmp_path):
    """RFC 7677 section 3: user "user", password "pencil"."""
    store = ScramCredentials(tmp_path / "creds.json")
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    salted = salted_password("SCRAM-SHA-256", "pencil", salt, 4096)
    cred = credential_from_salted("SCRAM-SHA-256", salted, salt, 4096)
    store.alter(upserts=[("user", "SCRAM-SHA-256", cred)], deletes=[])
    ex = ScramExchange("SCRAM-SHA-256", store, server_nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    server_first = ex.first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert server_first == (
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    final = ex.final(
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    assert final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert ex.user == "user"
    # durable: a fresh store reads the same credential; the password is nowhere in the file
    assert ScramCredentials(tmp_path / "creds.json").get("user", "SCRAM-SHA-256") == cred
    assert b"pencil" not in (tmp_path / "creds.json").read_bytes()


def test_corrupt_credential_file_stops_start_up(tmp_path):
    (tmp_path / "creds.json").write_text('{"version": 1, "users": {"a": {"MD5": {}}}}')
    with pytest.raises(ScramStoreError, match="unknown mechanism"):
        ScramCredentials(tmp_path / "creds.json")


@given(first=st.binary(max_size=200), final=st.binary(max_size=200))
def test_random_scram_messages_raise_only_scram_errors(tmp_path_factory, first, final):
    store = ScramCredentials(tmp_path_factory.mktemp("s") / "c.json")
    salt = b"salt"
    cred = credential_from_salted("SCRAM-SHA-512", b"k" * 64, salt, 4096)
    store.alter(upserts=[("u", "SCRAM-SHA-512", cred)], deletes=[])
    ex = ScramExchange("SCRAM-SHA-512", store)
    try:
        ex.first(first)
    except ScramAuthError:
        ex.first(b"n,,n=u,r=abc")
    with pytest.raises(ScramAuthError):
        ex.final(final)
