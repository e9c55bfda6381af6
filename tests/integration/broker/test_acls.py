"""ACLs with Kafka's StandardAuthorizer semantics, end to end: a broker with a SASL_PLAINTEXT
listener (SCRAM users alice and bob) and the authorizer on; ACLs made, listed and deleted with
confluent-kafka's AdminClient; alice produces and consumes, bob is refused with Kafka's errors
by confluent-kafka, kafka-python and aiokafka; Metadata hides what bob may not describe; the
ACLs survive kill -9; the ACL APIs answer SECURITY_DISABLED without an authorizer and
INVALID_REQUEST for a bad filter.

The PLAINTEXT listener is the operator's: its principal (User:ANONYMOUS) is the super user
that bootstraps the users and ACLs, as a Kafka operator does from a local listener.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import subprocess
import sys

import confluent_kafka as ck
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import GroupAuthorizationFailedError as AkGroupAuthFailed
from aiokafka.errors import TopicAuthorizationFailedError as AkTopicAuthFailed
from confluent_kafka import TopicCollection
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpPartition
from kafka.admin import ACLFilter as KpAclFilter
from kafka.admin import ACLOperation as KpOp
from kafka.admin import ACLPermissionType as KpPerm
from kafka.admin import ACLResourcePatternType as KpPat
from kafka.admin import KafkaAdminClient
from kafka.admin import ResourcePatternFilter as KpPattern
from kafka.admin import ResourceType as KpRes
from kafka.errors import ClusterAuthorizationFailedError as KpClusterAuthFailed
from kafka.errors import GroupAuthorizationFailedError as KpGroupAuthFailed
from kafka.errors import KafkaError as KpKafkaError
from kafka.errors import TopicAuthorizationFailedError as KpTopicAuthFailed
from kio.schema.create_topics.v7.request import CreatableTopic, CreateTopicsRequest
from kio.schema.describe_acls.v3.request import DescribeAclsRequest
from kio.schema.errors import ErrorCode
from kio.static.primitive import i8, i16, i32

from tests.integration.broker.clients import new_topic
from tests.integration.broker.rawclient import RawClient
from tests.integration.broker.test_operator_tools import loglake

pytestmark = pytest.mark.integration

STANDARD = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
ANY_ACL = AclBindingFilter(
    ResourceType.ANY,
    None,
    ResourcePatternType.ANY,
    None,
    None,
    AclOperation.ANY,
    AclPermissionType.ANY,
)


@pytest.fixture
def acl_broker(broker_factory):
    return broker_factory(
        extra_listeners=("SASL_PLAINTEXT",),
        **{
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "authorizer.class.name": STANDARD,
            "super.users": "User:ANONYMOUS",
            "auto.create.topics.enable": "true",
        },
    )


def _sasl(b, user: str) -> dict:
    return {
        "bootstrap.servers": f"127.0.0.1:{b.ports['SASL_PLAINTEXT']}",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": f"{user}-pw",
    }


def _kp(b, user: str) -> dict:
    return {
        "bootstrap_servers": f"127.0.0.1:{b.ports['SASL_PLAINTEXT']}",
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": user,
        "sasl_plain_password": f"{user}-pw",
    }


def _allow(rtype, name, principal, op, pattern=ResourcePatternType.LITERAL) -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, "*", op, AclPermissionType.ALLOW)


def _setup(b) -> tuple[AdminClient, str, str]:
    """Users alice and bob, topic ``t`` (alice may write, read; bob may read) and ``hidden``
    (no ACL: nobody but the super user), group ``g-*`` for alice."""
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    futures = admin.alter_user_scram_credentials(
        [
            UserScramCredentialUpsertion(
                u, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), f"{u}-pw".encode()
            )
            for u in ("alice", "bob")
        ]
    )
    for f in futures.values():
        f.result(30)
    topic = new_topic(b.bootstrap, partitions=1, prefix="acl")
    hidden = new_topic(b.bootstrap, partitions=1, prefix="hidden")
    bindings = [
        _allow(ResourceType.TOPIC, topic, "User:alice", AclOperation.WRITE),
        _allow(ResourceType.TOPIC, topic, "User:alice", AclOperation.READ),
        _allow(ResourceType.TOPIC, topic, "User:bob", AclOperation.READ),
        _allow(
            ResourceType.GROUP, "g-", "User:alice", AclOperation.READ, ResourcePatternType.PREFIXED
        ),
    ]
    for f in admin.create_acls(bindings).values():
        assert f.result(30) is None
    return admin, topic, hidden


def _ck_produce_error(conf: dict, topic: str) -> ck.KafkaError | None:
    results: list[ck.KafkaError | None] = []
    p = ck.Producer({**conf, "acks": "all", "message.timeout.ms": 20_000})
    p.produce(topic, b"v", partition=0, on_delivery=lambda err, _m: results.append(err))
    p.flush(30)
    assert len(results) == 1
    return results[0]


def _ck_consume(conf: dict, topic: str, group: str, want: int) -> tuple[list[bytes], list]:
    c = ck.Consumer(
        {**conf, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False}
    )
    c.subscribe([topic])
    got: list[bytes] = []
    errors: list[ck.KafkaError] = []
    for _ in range(60):
        m = c.poll(0.5)
        if m is None:
            if errors:
                break
            continue
        if m.error():
            errors.append(m.error())
            break
        got.append(m.value())
        if len(got) == want:
            c.commit(asynchronous=False)
            break
    c.close()
    return got, errors


def test_acls_decide_who_produces_and_consumes(acl_broker):
    b = acl_broker
    admin, topic, hidden = _setup(b)

    listed = admin.describe_acls(ANY_ACL).result(30)
    assert len(listed) == 4
    matching = AclBindingFilter(
        ResourceType.TOPIC,
        topic,
        ResourcePatternType.MATCH,
        None,
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    assert {(a.principal, a.operation) for a in admin.describe_acls(matching).result(30)} == {
        ("User:alice", AclOperation.WRITE),
        ("User:alice", AclOperation.READ),
        ("User:bob", AclOperation.READ),
    }

    # alice: WRITE and READ on the topic, READ on the g- groups
    values = [f"a{i}".encode() for i in range(50)]
    p = ck.Producer({**_sasl(b, "alice"), "acks": "all"})
    for v in values:
        p.produce(topic, v, partition=0)
    assert p.flush(30) == 0
    got, errors = _ck_consume(_sasl(b, "alice"), topic, "g-alice", len(values))
    assert not errors and got == values

    # bob: may not write the topic; may read it but not use a group
    err = _ck_produce_error(_sasl(b, "bob"), topic)
    assert err is not None and err.code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
    denied = (
        "Principal = User:bob is Denied operation = WRITE from host = 127.0.0.1"
        f" on resource = TOPIC:{topic}"
    )
    assert b.log_text().count(denied) == 1  # logged once, not per retry (cached)
    _got, errors = _ck_consume(_sasl(b, "bob"), topic, "g-bob", 1)
    assert errors and errors[0].code() == ck.KafkaError.GROUP_AUTHORIZATION_FAILED

    # Metadata: every-topic listings hold only what the principal may DESCRIBE
    assert topic in AdminClient(_sasl(b, "alice")).list_topics(timeout=30).topics
    bob_admin = AdminClient(_sasl(b, "bob"))
    seen = bob_admin.list_topics(timeout=30).topics
    assert topic in seen and hidden not in seen
    named = bob_admin.list_topics(topic=hidden, timeout=30).topics[hidden]
    assert named.error is not None
    assert named.error.code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert not named.partitions
    # what bob may do to the topic, as Metadata's authorized operations (KIP-430)
    described = bob_admin.describe_topics(
        TopicCollection([topic]), include_authorized_operations=True
    )[topic].result(30)
    assert set(described.authorized_operations) == {AclOperation.READ, AclOperation.DESCRIBE}
    # no CREATE: auto-creation by Metadata is refused, nothing created
    ghost = f"ghost-{topic}"
    named = bob_admin.list_topics(topic=ghost, timeout=30).topics[ghost]
    assert named.error.code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert ghost not in admin.list_topics(timeout=30).topics

    # bob is no super user: the ACL APIs need the cluster. librdkafka drops DescribeAcls'
    # top-level error (an empty list either way), so kafka-python's admin reads it.
    assert bob_admin.describe_acls(ANY_ACL).result(30) == []
    kp_admin = KafkaAdminClient(**_kp(b, "bob"))
    with pytest.raises(KpClusterAuthFailed):
        kp_admin.describe_acls(
            KpAclFilter(None, None, KpOp.ANY, KpPerm.ANY, KpPattern(KpRes.ANY, None, KpPat.ANY))
        )
    kp_admin.close()
    grab = _allow(ResourceType.TOPIC, hidden, "User:bob", AclOperation.ALL)
    with pytest.raises(ck.KafkaException) as exc:
        bob_admin.create_acls([grab])[grab].result(30)
    assert exc.value.args[0].code() == ck.KafkaError.CLUSTER_AUTHORIZATION_FAILED

    # kafka-python and aiokafka get Kafka's errors too
    # (kafka-python 3 is idempotent by default: InitProducerId needs IDEMPOTENT_WRITE on
    # the cluster or WRITE on some topic, KIP-679; alice has one, bob neither)
    producer = KafkaProducer(acks="all", max_block_ms=20_000, **_kp(b, "alice"))
    producer.send(topic, b"from-kafka-python", partition=0).get(timeout=30)
    producer.close()
    producer = KafkaProducer(acks="all", max_block_ms=20_000, **_kp(b, "bob"))
    with pytest.raises(KpKafkaError, match="ClusterAuthorizationFailed"):
        producer.send(topic, b"x", partition=0).get(timeout=30)
    producer.close()
    producer = KafkaProducer(
        acks="all", max_block_ms=20_000, enable_idempotence=False, **_kp(b, "bob")
    )
    with pytest.raises(KpTopicAuthFailed):
        producer.send(topic, b"x", partition=0).get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(topic, group_id="g-bob", **_kp(b, "bob"))
    with pytest.raises(KpGroupAuthFailed):
        for _ in range(40):
            consumer.poll(500)
    consumer.close()

    async def aio() -> None:
        prod = AIOKafkaProducer(acks="all", **_kp(b, "bob"))
        await prod.start()
        try:
            with pytest.raises(AkTopicAuthFailed):
                await prod.send_and_wait(topic, b"x", partition=0)
        finally:
            await prod.stop()
        cons = AIOKafkaConsumer(
            topic, group_id="g-bob", auto_offset_reset="earliest", **_kp(b, "bob")
        )
        try:
            with pytest.raises(AkGroupAuthFailed):  # start() joins the group: refused
                await cons.start()
                await asyncio.wait_for(cons.getone(), 30)
        finally:
            await cons.stop()
        alice = AIOKafkaProducer(acks="all", **_kp(b, "alice"))
        await alice.start()
        try:
            await alice.send_and_wait(topic, b"from-aiokafka", partition=0)
        finally:
            await alice.stop()

    asyncio.run(aio())

    # DeleteAcls: alice loses WRITE, and her next producer is refused
    write = AclBindingFilter(
        ResourceType.TOPIC,
        topic,
        ResourcePatternType.LITERAL,
        "User:alice",
        None,
        AclOperation.WRITE,
        AclPermissionType.ANY,
    )
    deleted = admin.delete_acls([write])[write].result(30)
    assert [(a.name, a.operation) for a in deleted] == [(topic, AclOperation.WRITE)]
    err = _ck_produce_error(_sasl(b, "alice"), topic)
    assert err is not None and err.code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_acls_survive_kill_9(acl_broker):
    b = acl_broker
    admin, topic, _hidden = _setup(b)
    before = sorted(str(a) for a in admin.describe_acls(ANY_ACL).result(30))
    b.kill()
    b.start()
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    assert sorted(str(a) for a in admin.describe_acls(ANY_ACL).result(30)) == before
    assert _ck_produce_error(_sasl(b, "alice"), topic) is None
    err = _ck_produce_error(_sasl(b, "bob"), topic)
    assert err is not None and err.code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_bad_filters_and_no_authorizer(acl_broker, broker):
    with RawClient(acl_broker.bootstrap) as raw:
        bad = DescribeAclsRequest(
            resource_type_filter=i8(0),  # UNKNOWN
            resource_name_filter=None,
            pattern_type_filter=i8(1),
            principal_filter=None,
            host_filter=None,
            operation=i8(1),
            permission_type=i8(1),
        )
        resp = raw.call(bad)
        assert resp.error_code == ErrorCode.invalid_request
        assert "UNKNOWN" in (resp.error_message or "")
    # an ACL request before SASL authentication: the connection is closed, nothing answered
    with RawClient(f"127.0.0.1:{acl_broker.ports['SASL_PLAINTEXT']}") as raw:
        raw.send_frame(raw.request_bytes(dataclasses.replace(bad, resource_type_filter=i8(1))))
        assert raw.is_closed_by_peer()
    # the session broker has no authorizer: Kafka's SECURITY_DISABLED (read raw: librdkafka
    # drops DescribeAcls' error, and its CreateAcls carries it per creation)
    with RawClient(broker.bootstrap) as raw:
        resp = raw.call(dataclasses.replace(bad, resource_type_filter=i8(1)))
        assert resp.error_code == ErrorCode.security_disabled
    plain = AdminClient({"bootstrap.servers": broker.bootstrap})
    grab = _allow(ResourceType.TOPIC, "t", "User:bob", AclOperation.ALL)
    with pytest.raises(ck.KafkaException) as exc:
        plain.create_acls([grab])[grab].result(30)
    assert exc.value.args[0].code() == ck.KafkaError.SECURITY_DISABLED
    # the ACL broker serves on after the refused connection (anonymous is its super user)
    with RawClient(acl_broker.bootstrap) as raw:
        every = dataclasses.replace(bad, resource_type_filter=i8(1))
        assert raw.call(every).error_code == ErrorCode.none


def test_loglake_acls_tool(acl_broker, broker, tmp_path):
    b = acl_broker
    admin, topic, _hidden = _setup(b)
    boot = ["--bootstrap-server", b.bootstrap]

    out = loglake(
        "acls",
        "--add",
        "--allow-principal",
        "User:carol",
        "--producer",
        "--topic",
        "app-",
        "--resource-pattern-type",
        "prefixed",
        "--idempotent",
        *boot,
    )
    assert out.returncode == 0, out.stderr
    added = "`ResourcePattern(resourceType=TOPIC, name=app-, patternType=PREFIXED)`"
    assert f"Adding ACLs for resource {added}" in out.stdout
    out = loglake(
        "acls",
        "--add",
        "--deny-principal",
        "User:carol",
        "--deny-host",
        "10.9.9.9",
        "--operation",
        "Read",
        "--operation",
        "describe_configs",
        "--group",
        "g1",
        *boot,
    )
    assert out.returncode == 0, out.stderr
    made = {
        (
            a.restype,
            a.name,
            a.resource_pattern_type,
            a.principal,
            a.host,
            a.operation,
            a.permission_type,
        )
        for a in admin.describe_acls(ANY_ACL).result(30)
        if a.principal == "User:carol"
    }
    pre = ResourcePatternType.PREFIXED
    lit = ResourcePatternType.LITERAL
    allow, deny = AclPermissionType.ALLOW, AclPermissionType.DENY
    assert made == {
        (ResourceType.TOPIC, "app-", pre, "User:carol", "*", AclOperation.WRITE, allow),
        (ResourceType.TOPIC, "app-", pre, "User:carol", "*", AclOperation.DESCRIBE, allow),
        (ResourceType.TOPIC, "app-", pre, "User:carol", "*", AclOperation.CREATE, allow),
        (
            ResourceType.BROKER,
            "kafka-cluster",
            lit,
            "User:carol",
            "*",
            AclOperation.IDEMPOTENT_WRITE,
            allow,
        ),
        (ResourceType.GROUP, "g1", lit, "User:carol", "10.9.9.9", AclOperation.READ, deny),
        (
            ResourceType.GROUP,
            "g1",
            lit,
            "User:carol",
            "10.9.9.9",
            AclOperation.DESCRIBE_CONFIGS,
            deny,
        ),
    }

    # --list: one resource (literal by default), or everything, or one principal's
    out = loglake("acls", "--list", "--topic", topic, *boot)
    assert out.returncode == 0, out.stderr
    current = f"`ResourcePattern(resourceType=TOPIC, name={topic}, patternType=LITERAL)`"
    assert f"Current ACLs for resource {current}:" in out.stdout
    assert "(principal=User:bob, host=*, operation=READ, permissionType=ALLOW)" in out.stdout
    out = loglake("acls", "--list", "--principal", "User:carol", *boot)
    assert out.stdout.count("(principal=User:carol") == 6 and "User:alice" not in out.stdout

    # --remove asks first; "n" keeps them, --force removes what matches
    out = subprocess.run(
        [sys.executable, "-m", "logstore.cli", "acls", "--remove", "--group", "g1", *boot],
        input="n\n",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 2 and "not confirmed" in out.stderr
    out = loglake("acls", "--remove", "--force", "--group", "g1", *boot)
    assert out.returncode == 0, out.stderr
    assert "2 ACL(s) removed." in out.stdout
    remaining = [a for a in admin.describe_acls(ANY_ACL).result(30) if a.name == "g1"]
    assert remaining == []

    # refusals: bad operation (2, before any request), no authorizer (SECURITY_DISABLED, 2)
    out = loglake(
        "acls", "--add", "--allow-principal", "User:x", "--operation", "Fly", "--topic", "t", *boot
    )
    assert out.returncode == 2 and "--operation 'Fly'" in out.stderr
    out = loglake("acls", "--list", "--bootstrap-server", broker.bootstrap)
    assert out.returncode == 2 and "SECURITY_DISABLED" in out.stderr
    # over SASL with --command-config: bob is no super user, and the tool says so (exit 2)
    props = tmp_path / "bob.properties"
    props.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\n"
        "sasl.username=bob\nsasl.password=bob-pw\n"
    )
    sasl = f"127.0.0.1:{b.ports['SASL_PLAINTEXT']}"
    out = loglake("acls", "--list", "--bootstrap-server", sasl, "--command-config", str(props))
    assert out.returncode == 2 and "CLUSTER_AUTHORIZATION_FAILED" in out.stderr


def test_anonymous_clients_under_allow_everyone(broker_factory):
    """allow.everyone.if.no.acl.found, then ALLOW ALL and DENY READ on one topic: anonymous
    clients use every other topic, see that one and its offsets (a DENY of READ does not deny
    DESCRIBE) but cannot fetch it (deny wins), as Kafka decides; an ACL for another host does
    not apply; a topic created under a prefixed CREATE comes back without its configs."""
    b = broker_factory(
        authorizer_class_name=STANDARD,
        allow_everyone_if_no_acl_found="true",
    )
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    closed = new_topic(b.bootstrap, partitions=1, prefix="closed")
    p = ck.Producer({"bootstrap.servers": b.bootstrap})
    p.produce(closed, b"secret", partition=0)
    assert p.flush(30) == 0
    deny = AclBinding(
        ResourceType.TOPIC,
        closed,
        ResourcePatternType.LITERAL,
        "User:*",
        "*",
        AclOperation.READ,
        AclPermissionType.DENY,
    )
    assert admin.create_acls([deny])[deny].result(30) is None
    # the topic has an ACL now: allow.everyone no longer applies to it, and no ACL allows
    # DESCRIBE, so it leaves the listing (Kafka's rule: a resource with ACLs, none matching)
    assert closed not in admin.list_topics(timeout=30).topics
    everything = AclBinding(
        ResourceType.TOPIC,
        closed,
        ResourcePatternType.LITERAL,
        "User:*",
        "*",
        AclOperation.ALL,
        AclPermissionType.ALLOW,
    )
    assert admin.create_acls([everything])[everything].result(30) is None
    assert closed in admin.list_topics(timeout=30).topics  # ALL allows DESCRIBE, no DENY of it
    consumer = KafkaConsumer(bootstrap_servers=b.bootstrap)
    consumer.assign([KpPartition(closed, 0)])
    assert consumer.end_offsets([KpPartition(closed, 0)]) == {KpPartition(closed, 0): 1}
    consumer.seek(KpPartition(closed, 0), 0)
    with pytest.raises(KpTopicAuthFailed):
        for _ in range(40):
            consumer.poll(500)
    consumer.close()
    # the denied topic's data was never sent; other topics are served as before
    open_topic = new_topic(b.bootstrap, partitions=1, prefix="open")
    p.produce(open_topic, b"public", partition=0)
    assert p.flush(30) == 0
    got, errors = _ck_consume({"bootstrap.servers": b.bootstrap}, open_topic, "g-any", 1)
    assert not errors and got == [b"public"]
    # hosts: an ACL for another address does not apply to this client's (127.0.0.1)
    hosted = new_topic(b.bootstrap, partitions=1, prefix="hosted")
    for host, expected in (
        ("10.1.2.3", ck.KafkaError.TOPIC_AUTHORIZATION_FAILED),
        ("127.0.0.1", None),
    ):
        only = AclBinding(
            ResourceType.TOPIC,
            hosted,
            ResourcePatternType.LITERAL,
            "User:ANONYMOUS",
            host,
            AclOperation.WRITE,
            AclPermissionType.ALLOW,
        )
        assert admin.create_acls([only])[only].result(30) is None
        err = _ck_produce_error({"bootstrap.servers": b.bootstrap}, hosted)
        assert (None if err is None else err.code()) == expected, host
    # CreateTopics: CREATE on the prefix creates; the configs need DESCRIBE_CONFIGS, which
    # nothing grants on these topics now that they have ACLs (Kafka's topic_config_error_code)
    grant = _allow(
        ResourceType.TOPIC, "cfg-", "User:*", AclOperation.CREATE, ResourcePatternType.PREFIXED
    )
    assert admin.create_acls([grant])[grant].result(30) is None
    with RawClient(b.bootstrap) as raw:
        resp = raw.call(
            CreateTopicsRequest(
                topics=(
                    CreatableTopic(
                        name="cfg-1",
                        num_partitions=i32(1),
                        replication_factor=i16(1),
                        assignments=(),
                        configs=(),
                    ),
                ),
                timeout=datetime.timedelta(seconds=30),
                validate_only=False,
            )
        )
    (created,) = resp.topics
    assert created.error_code == ErrorCode.none and created.num_partitions == 1
    assert created.topic_config_error_code == ErrorCode.topic_authorization_failed
    assert created.configs is None


def test_transactions_need_write_on_the_transactional_id(acl_broker):
    b = acl_broker
    admin, topic, _hidden = _setup(b)
    conf = {**_sasl(b, "alice"), "transactional.id": "tx-alice-1"}
    p = ck.Producer(conf)
    with pytest.raises(ck.KafkaException) as exc:
        p.init_transactions(30)
    assert exc.value.args[0].code() == ck.KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    del p
    grant = _allow(
        ResourceType.TRANSACTIONAL_ID,
        "tx-alice-",
        "User:alice",
        AclOperation.WRITE,
        ResourcePatternType.PREFIXED,
    )
    assert admin.create_acls([grant])[grant].result(30) is None
    p = ck.Producer(conf)
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, b"in-txn", partition=0)
    p.commit_transaction(30)
    got, errors = _ck_consume(
        {**_sasl(b, "alice"), "isolation.level": "read_committed"}, topic, "g-txn", 1
    )
    assert not errors and got == [b"in-txn"]
