"""loglake's own clients authenticate: ``--command-config client.properties`` on every tool
that talks to the broker (SCRAM-SHA-512 and PLAIN over TLS, mTLS), ``loglake users`` over
KIP-554 (its credentials then used by librdkafka), and what is refused: a wrong password,
a CA the broker's certificate does not chain to, a mechanism the listener does not offer, an
unknown property. The state each tool reports is made or checked by confluent-kafka."""

from __future__ import annotations

from pathlib import Path

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism
from confluent_kafka.admin import UserScramCredentialUpsertion as Upsert

from logstore.cli import main
from logstore.tools.client_config import librdkafka_config, load_client_config
from tests.fixtures.tls import make_pki, secure_listeners
from tests.integration.broker.clients import new_topic

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def secure_broker(broker_factory, pki):
    return broker_factory(
        extra_listeners=("SASL_SSL", "SSL"),
        **secure_listeners(pki, plain_users={"admin": "admin-secret", "carol": "carol-secret"}),
    )


def _props(path: Path, **props: str) -> str:
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return str(path)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out = capsys.readouterr()
    assert "Traceback" not in out.err, out.err
    return code, out.out, out.err


def _scram_jaas(user: str, password: str) -> str:
    return (
        "org.apache.kafka.common.security.scram.ScramLoginModule required"
        f' username="{user}" password="{password}";'
    )


def test_users_then_every_tool_over_scram_tls(secure_broker, pki, tmp_path, capsys):
    b = secure_broker
    sasl = f"127.0.0.1:{b.ports['SASL_SSL']}"
    # loglake users over PLAINTEXT (no ACLs here yet): alice gets a SCRAM-SHA-512 credential
    code, out, err = _run(
        capsys,
        "users",
        "--bootstrap-server",
        b.bootstrap,
        "--alter",
        "--entity-type",
        "users",
        "--entity-name",
        "alice",
        "--add-config",
        "SCRAM-SHA-512=[iterations=8192,password=alice-secret]",
    )
    assert (code, out) == (0, "Completed updating config for user alice.\n"), err
    scram = _props(
        tmp_path / "scram.properties",
        **{
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.jaas.config": _scram_jaas("alice", "alice-secret"),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(pki.ca),
            "client.id": "ops",
            "linger.ms": "5",  # another client's key: accepted, as Kafka does
        },
    )
    conn = ["--bootstrap-server", sasl, "--command-config", scram]

    # librdkafka logs in with the credential the tool made (salted client side)
    topic = new_topic(b.bootstrap, partitions=2, prefix="cli-auth")
    p = ck.Producer(
        {
            "bootstrap.servers": sasl,
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(pki.ca),
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "alice",
            "sasl.password": "alice-secret",
        }
    )
    for i in range(7):
        p.produce(topic, b"v%d" % i, partition=0)
    assert p.flush(30) == 0

    code, out, _ = _run(capsys, "users", "--describe", *conn)
    assert code == 0
    assert (
        out
        == "SCRAM credential configs for user-principal 'alice' are SCRAM-SHA-512=iterations=8192\n"
    )

    code, out, err = _run(capsys, "topics", "create", "made-over-tls", "--partitions", "3", *conn)
    assert code == 0, err
    md = AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(timeout=30)
    assert len(md.topics["made-over-tls"].partitions) == 3
    code, out, _ = _run(capsys, "topics", "list", *conn)
    assert code == 0 and {topic, "made-over-tls"} <= set(out.split())
    code, out, _ = _run(capsys, "get-offsets", "--topic", topic, *conn)
    assert (code, out) == (0, f"{topic}:0:7\n{topic}:1:0\n")
    offsets = tmp_path / "offsets.json"
    offsets.write_text(f'{{"partitions": [{{"topic": "{topic}", "partition": 0, "offset": 3}}]}}')
    code, out, err = _run(capsys, "delete-records", "--offset-json-file", str(offsets), *conn)
    assert code == 0 and f"partition: {topic}-0\tlow_watermark: 3" in out, err
    c = ck.Consumer({"bootstrap.servers": b.bootstrap, "group.id": "cli-auth"})
    assert c.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=30) == (3, 7)
    c.commit(offsets=[ck.TopicPartition(topic, 0, 5)], asynchronous=False)
    c.close()
    code, out, _ = _run(capsys, "groups", "--list", *conn)
    assert code == 0 and "cli-auth" in out.split()
    code, out, _ = _run(
        capsys, "configs", "--alter", "--topic", topic, "--add-config", "retention.ms=1000", *conn
    )
    assert code == 0
    code, out, _ = _run(capsys, "configs", "--describe", "--topic", topic, *conn)
    assert code == 0 and "retention.ms=1000" in out

    # --command-config before the subcommand, as --bootstrap-server may be
    code, out, _ = _run(
        capsys, "--command-config", scram, "--bootstrap-server", sasl, "topics", "list"
    )
    assert code == 0 and topic in out.split()

    # the tool deletes the credential; the login then fails, and the tool says so (exit 2)
    code, out, _ = _run(
        capsys, "users", "--alter", "--user", "alice", "--delete-config", "SCRAM-SHA-512", *conn
    )
    assert code == 0
    code, out, err = _run(capsys, "topics", "list", *conn)
    assert code == 2 and "SASL_AUTHENTICATION_FAILED" in err and "alice-secret" not in err
    code, out, err = _run(capsys, "users", "--describe", "--bootstrap-server", b.bootstrap)
    assert (code, out) == (0, "")


def test_plain_over_tls_and_mtls_and_refusals(secure_broker, pki, tmp_path, capsys):
    b = secure_broker
    sasl = f"127.0.0.1:{b.ports['SASL_SSL']}"
    mtls = f"127.0.0.1:{b.ports['SSL']}"
    topic = new_topic(b.bootstrap, partitions=1, prefix="cli-plain")
    trust = {"ssl.truststore.type": "PEM", "ssl.truststore.location": str(pki.ca)}
    plain = _props(
        tmp_path / "plain.properties",
        **{
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "carol",
            "sasl.password": "carol-secret",
            **trust,
        },
    )
    code, out, err = _run(
        capsys, "topics", "describe", topic, "--bootstrap-server", sasl, "--command-config", plain
    )
    assert code == 0 and f"Topic: {topic}" in out, err

    # mTLS: the client certificate from the keystore (key and certificate in one PEM file)
    keystore = tmp_path / "alice.pem"
    keystore.write_text(pki.client_key.read_text() + pki.client_cert.read_text())
    ssl_props = _props(
        tmp_path / "mtls.properties",
        **{
            "security.protocol": "SSL",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(keystore),
            **trust,
        },
    )
    code, out, err = _run(
        capsys,
        "get-offsets",
        "--topic",
        topic,
        "--bootstrap-server",
        mtls,
        "--command-config",
        ssl_props,
    )
    assert (code, out) == (0, f"{topic}:0:0\n"), err
    # the same without a client certificate: the broker refuses the handshake
    no_cert = _props(tmp_path / "nocert.properties", **{"security.protocol": "SSL", **trust})
    code, out, err = _run(
        capsys, "topics", "list", "--bootstrap-server", mtls, "--command-config", no_cert
    )
    assert code == 2 and err.strip(), err

    # a CA the broker's certificate does not chain to: the client refuses the broker
    rogue_ca = _props(
        tmp_path / "rogue.properties",
        **{"security.protocol": "SSL", "ssl.truststore.location": str(pki.rogue_cert)},
    )
    code, out, err = _run(
        capsys, "topics", "list", "--bootstrap-server", mtls, "--command-config", rogue_ca
    )
    assert code == 2 and "certificate verify failed" in err

    # a wrong password; a mechanism the listener does not offer; each exit 2, named
    bad = _props(
        tmp_path / "bad.properties",
        **{
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "carol",
            "sasl.password": "wrong",
            **trust,
        },
    )
    code, out, err = _run(
        capsys, "topics", "list", "--bootstrap-server", sasl, "--command-config", bad
    )
    assert code == 2 and "SASL_AUTHENTICATION_FAILED" in err and "wrong" not in err
    sha256 = _props(
        tmp_path / "sha256.properties",
        **{
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": "carol",
            "sasl.password": "carol-secret",
            **trust,
        },
    )
    code, out, err = _run(
        capsys, "groups", "--list", "--bootstrap-server", sasl, "--command-config", sha256
    )
    assert code == 2 and "does not take SASL mechanism SCRAM-SHA-256" in err and "PLAIN" in err

    # an unknown property: refused before connecting, naming the nearest one
    typo = _props(tmp_path / "typo.properties", **{"security.protocl": "SSL"})
    code, out, err = _run(
        capsys, "topics", "list", "--bootstrap-server", sasl, "--command-config", typo
    )
    assert code == 2 and "'security.protocl'" in err and "'security.protocol'" in err

    # the broker served everyone else meanwhile
    md = AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(timeout=30)
    assert topic in md.topics


def test_the_same_properties_drive_confluent_kafka(secure_broker, pki, tmp_path):
    """librdkafka_config: one client.properties for loglake's tools and its confluent-kafka
    clients (the demo's producers): SCRAM-SHA-512 over TLS and mTLS, produced and read back."""
    b = secure_broker
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
    for fut in admin.alter_user_scram_credentials([Upsert("dan", info, b"dan-secret")]).values():
        fut.result(30)
    keystore = tmp_path / "alice.pem"  # key and certificate in one file, as Kafka's PEM keystore
    keystore.write_text(pki.client_key.read_text() + pki.client_cert.read_text())
    trust = {"ssl.truststore.type": "PEM", "ssl.truststore.location": str(pki.ca)}
    cases = {
        "SASL_SSL": {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                     "sasl.jaas.config": _scram_jaas("dan", "dan-secret"), **trust},
        "SSL": {"security.protocol": "SSL", "ssl.keystore.type": "PEM",
                "ssl.keystore.location": str(keystore), **trust},
    }  # fmt: skip
    topic = new_topic(b.bootstrap, partitions=1, prefix="rdk")
    sent = []
    for listener, props in cases.items():
        conf = librdkafka_config(load_client_config(_props(tmp_path / f"{listener}.p", **props)))
        conf["bootstrap.servers"] = f"127.0.0.1:{b.ports[listener]}"
        p = ck.Producer({**conf, "acks": "all"})
        values = [f"{listener}-{i}".encode() for i in range(5)]
        for v in values:
            p.produce(topic, v, partition=0)
        assert p.flush(30) == 0
        sent += values
        c = ck.Consumer({**conf, "group.id": f"rdk-{listener}", "enable.auto.commit": False})
        c.assign([ck.TopicPartition(topic, 0, 0)])
        got = []
        while len(got) < len(sent):
            m = c.poll(30)
            assert m is not None and not m.error(), m and m.error()
            got.append(m.value())
        c.close()
        assert got == sent
