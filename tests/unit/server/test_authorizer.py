"""The authorizer's decisions against Kafka's StandardAuthorizer rules, table-driven; the ACL
filters (DescribeAcls/DeleteAcls) and the durable store (a reopened file holds the ACLs)."""

from __future__ import annotations

import json

import pytest

from logstore.server.config import BrokerConfig, ConfigError
from logstore.server.security.acls import (
    AclBinding,
    AclFilter,
    AclStore,
    AclStoreError,
    InvalidAclError,
    validate_binding,
)
from logstore.server.security.acls import AclOperation as Op
from logstore.server.security.acls import AclPermission as Perm
from logstore.server.security.acls import PatternType as Pat
from logstore.server.security.acls import ResourceType as Res
from logstore.server.security.authorizer import (
    Authorizer,
    AuthorizerConfigError,
    parse_super_users,
)

ALICE = "User:alice"
BOB = "User:bob"
HOST = "10.0.0.1"


def acl(
    name: str,
    op: Op,
    *,
    principal: str = ALICE,
    perm: Perm = Perm.ALLOW,
    rtype: Res = Res.TOPIC,
    pattern: Pat = Pat.LITERAL,
    host: str = "*",
) -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, host, op, perm)


def make(tmp_path, acls, *, supers=frozenset(), allow_if_no_acl=False) -> Authorizer:
    store = AclStore(tmp_path / "__acls.json")
    store.create(acls)
    return Authorizer(store, super_users=frozenset(supers), allow_if_no_acl=allow_if_no_acl)


# (ACLs, principal, host, operation, topic, expected)
CASES = [
    # no ACL at all on the resource: allow.everyone.if.no.acl.found (off here) decides
    ([], ALICE, HOST, Op.READ, "t", False),
    # a literal ALLOW for the principal
    ([acl("t", Op.READ)], ALICE, HOST, Op.READ, "t", True),
    # another principal's ACL: the resource has ACLs, none for bob -> denied
    ([acl("t", Op.READ)], BOB, HOST, Op.READ, "t", False),
    # another operation
    ([acl("t", Op.READ)], ALICE, HOST, Op.WRITE, "t", False),
    # a literal name does not cover a longer one
    ([acl("t", Op.READ)], ALICE, HOST, Op.READ, "t2", False),
    # ALL covers every operation
    ([acl("t", Op.ALL)], ALICE, HOST, Op.DELETE, "t", True),
    # implied: READ, WRITE, DELETE, ALTER imply DESCRIBE
    ([acl("t", Op.READ)], ALICE, HOST, Op.DESCRIBE, "t", True),
    ([acl("t", Op.WRITE)], ALICE, HOST, Op.DESCRIBE, "t", True),
    ([acl("t", Op.DELETE)], ALICE, HOST, Op.DESCRIBE, "t", True),
    ([acl("t", Op.ALTER)], ALICE, HOST, Op.DESCRIBE, "t", True),
    ([acl("t", Op.CREATE)], ALICE, HOST, Op.DESCRIBE, "t", False),
    # ALTER_CONFIGS implies DESCRIBE_CONFIGS, not the other way round
    ([acl("t", Op.ALTER_CONFIGS)], ALICE, HOST, Op.DESCRIBE_CONFIGS, "t", True),
    ([acl("t", Op.DESCRIBE_CONFIGS)], ALICE, HOST, Op.ALTER_CONFIGS, "t", False),
    # DESCRIBE does not imply READ
    ([acl("t", Op.DESCRIBE)], ALICE, HOST, Op.READ, "t", False),
    # a DENY of READ does not deny DESCRIBE (implication is for ALLOW only)
    (
        [acl("t", Op.WRITE), acl("t", Op.READ, perm=Perm.DENY)],
        ALICE,
        HOST,
        Op.DESCRIBE,
        "t",
        True,
    ),
    # deny wins over allow, whatever the patterns
    ([acl("t", Op.READ), acl("t", Op.READ, perm=Perm.DENY)], ALICE, HOST, Op.READ, "t", False),
    ([acl("t", Op.ALL), acl("t", Op.ALL, perm=Perm.DENY)], ALICE, HOST, Op.READ, "t", False),
    (
        [acl("t", Op.READ), acl("*", Op.READ, perm=Perm.DENY)],
        ALICE,
        HOST,
        Op.READ,
        "t",
        False,
    ),
    (
        [acl("orders", Op.READ), acl("ord", Op.ALL, perm=Perm.DENY, pattern=Pat.PREFIXED)],
        ALICE,
        HOST,
        Op.READ,
        "orders",
        False,
    ),
    # a DENY for User:* denies alice too
    (
        [acl("t", Op.READ), acl("t", Op.READ, perm=Perm.DENY, principal="User:*")],
        ALICE,
        HOST,
        Op.READ,
        "t",
        False,
    ),
    # prefixed patterns cover names starting with them (and the prefix itself)
    ([acl("app-", Op.WRITE, pattern=Pat.PREFIXED)], ALICE, HOST, Op.WRITE, "app-logs", True),
    ([acl("app-", Op.WRITE, pattern=Pat.PREFIXED)], ALICE, HOST, Op.WRITE, "app-", True),
    ([acl("app-", Op.WRITE, pattern=Pat.PREFIXED)], ALICE, HOST, Op.WRITE, "app", False),
    ([acl("app-", Op.WRITE, pattern=Pat.PREFIXED)], ALICE, HOST, Op.WRITE, "xapp-1", False),
    # a literal "*" is the wildcard; a prefixed "*" is only the prefix "*"
    ([acl("*", Op.READ)], ALICE, HOST, Op.READ, "anything", True),
    ([acl("*", Op.READ, pattern=Pat.PREFIXED)], ALICE, HOST, Op.READ, "anything", False),
    # principal User:* matches every user
    ([acl("t", Op.READ, principal="User:*")], BOB, HOST, Op.READ, "t", True),
    # hosts: "*" or the exact address
    ([acl("t", Op.READ, host=HOST)], ALICE, HOST, Op.READ, "t", True),
    ([acl("t", Op.READ, host="10.0.0.2")], ALICE, HOST, Op.READ, "t", False),
    # resource types are separate: a group ACL says nothing about a topic of that name
    ([acl("t", Op.READ, rtype=Res.GROUP)], ALICE, HOST, Op.READ, "t", False),
]


@pytest.mark.parametrize("case", CASES)
def test_decision(tmp_path, case):
    acls, principal, host, op, topic, expected = case
    auth = make(tmp_path, acls)
    assert auth.authorize(principal, host, op, Res.TOPIC, topic) is expected


def test_allow_everyone_only_where_no_acl_names_the_resource(tmp_path):
    auth = make(tmp_path, [acl("t", Op.READ, principal=BOB)], allow_if_no_acl=True)
    assert auth.authorize(ALICE, HOST, Op.READ, Res.TOPIC, "other")
    # "t" has an ACL (for bob): alice is denied there even with allow.everyone
    assert not auth.authorize(ALICE, HOST, Op.READ, Res.TOPIC, "t")
    assert auth.authorize(BOB, HOST, Op.READ, Res.TOPIC, "t")


def test_super_users_may_do_everything_even_denied(tmp_path):
    auth = make(tmp_path, [acl("t", Op.ALL, perm=Perm.DENY, principal="User:*")], supers={ALICE})
    assert auth.authorize(ALICE, HOST, Op.DELETE, Res.TOPIC, "t")
    assert not auth.authorize(BOB, HOST, Op.DELETE, Res.TOPIC, "t")


def test_cached_decisions_follow_changes(tmp_path):
    auth = make(tmp_path, [])
    assert not auth.authorize(ALICE, HOST, Op.WRITE, Res.TOPIC, "t")
    auth.store.create([acl("t", Op.WRITE)])
    assert auth.authorize(ALICE, HOST, Op.WRITE, Res.TOPIC, "t")
    auth.store.delete([AclFilter(Res.ANY, None, Pat.ANY, None, None, Op.ANY, Perm.ANY)])
    assert not auth.authorize(ALICE, HOST, Op.WRITE, Res.TOPIC, "t")


def test_authorize_any_topic_for_idempotent_producers(tmp_path):
    auth = make(tmp_path, [acl("app-", Op.WRITE, pattern=Pat.PREFIXED)])
    assert auth.authorize_any(ALICE, HOST, Op.WRITE, Res.TOPIC)
    assert not auth.authorize_any(BOB, HOST, Op.WRITE, Res.TOPIC)
    (tmp_path / "d").mkdir()
    denied = make(
        tmp_path / "d",
        [acl("app-1", Op.WRITE), acl("app", Op.WRITE, perm=Perm.DENY, pattern=Pat.PREFIXED)],
    )
    assert not denied.authorize_any(ALICE, HOST, Op.WRITE, Res.TOPIC)
    # only the operation itself or ALL counts here (Kafka: no implied operations)
    assert not auth.authorize_any(ALICE, HOST, Op.DESCRIBE, Res.TOPIC)
    (tmp_path / "w").mkdir()
    wild = make(
        tmp_path / "w",
        [acl("*", Op.ALL), acl("secret", Op.WRITE, perm=Perm.DENY)],
    )
    assert wild.authorize_any(ALICE, HOST, Op.WRITE, Res.TOPIC)
    (tmp_path / "e").mkdir()
    everyone = make(tmp_path / "e", [acl("t", Op.READ, principal=BOB)], allow_if_no_acl=True)
    assert everyone.authorize_any(ALICE, HOST, Op.WRITE, Res.TOPIC)  # "hardcode": no ACL
    (tmp_path / "e2").mkdir()
    assert not make(tmp_path / "e2", []).authorize_any(ALICE, HOST, Op.WRITE, Res.TOPIC)


# (filter, names of the matching bindings)
STORED = [
    acl("orders", Op.READ),
    acl("ord", Op.WRITE, pattern=Pat.PREFIXED),
    acl("*", Op.DESCRIBE),
    acl("orders", Op.READ, rtype=Res.GROUP, principal=BOB),
]


def _f(*, rtype=Res.ANY, name=None, pattern=Pat.ANY, principal=None, host=None, op=Op.ANY):
    return AclFilter(rtype, name, pattern, principal, host, op, Perm.ANY)


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        (_f(), [0, 1, 2, 3]),
        (_f(rtype=Res.TOPIC), [0, 1, 2]),
        (_f(name="orders"), [0, 3]),  # ANY pattern type: the exact name
        (_f(rtype=Res.TOPIC, name="orders", pattern=Pat.MATCH), [0, 1, 2]),
        (_f(rtype=Res.TOPIC, name="orders", pattern=Pat.LITERAL), [0]),
        (_f(rtype=Res.TOPIC, name="ord", pattern=Pat.PREFIXED), [1]),
        (_f(pattern=Pat.PREFIXED), [1]),
        (_f(principal=BOB), [3]),
        (_f(op=Op.DESCRIBE), [2]),
    ],
)
def test_filters(tmp_path, flt, expected):
    store = AclStore(tmp_path / "__acls.json")
    store.create(STORED)
    assert store.describe(flt) == [STORED[i] for i in expected]


def test_store_survives_reopen_and_deletes_what_filters_match(tmp_path):
    path = tmp_path / "__acls.json"
    store = AclStore(path)
    store.create([*STORED, STORED[0]])  # a duplicate is kept once
    assert AclStore(path).index.bindings == tuple(STORED)
    matched = store.delete([_f(rtype=Res.TOPIC, name="orders", pattern=Pat.MATCH)])
    assert matched == [STORED[:3]]
    assert AclStore(path).index.bindings == (STORED[3],)
    assert not path.with_name(path.name + ".tmp").exists()


def test_corrupt_file_stops_the_store(tmp_path):
    path = tmp_path / "__acls.json"
    path.write_text(json.dumps({"version": 1, "acls": [[2, "t", 3, "alice", "*", 3, 3]]}))
    with pytest.raises(AclStoreError, match="principal"):
        AclStore(path)
    path.write_text("{")
    with pytest.raises(AclStoreError, match="corrupt"):
        AclStore(path)


@pytest.mark.parametrize(
    ("binding", "message"),
    [
        (AclBinding(Res.ANY, "t", Pat.LITERAL, ALICE, "*", Op.READ, Perm.ALLOW), "resourceType"),
        (AclBinding(Res.TOPIC, "t", Pat.MATCH, ALICE, "*", Op.READ, Perm.ALLOW), "patternType"),
        (AclBinding(Res.TOPIC, "t", Pat.LITERAL, ALICE, "*", Op.ANY, Perm.ALLOW), "operation"),
        (AclBinding(Res.TOPIC, "t", Pat.LITERAL, ALICE, "*", Op.READ, Perm.ANY), "permission"),
        (AclBinding(Res.TOPIC, "", Pat.LITERAL, ALICE, "*", Op.READ, Perm.ALLOW), "empty"),
        (AclBinding(Res.TOPIC, "t", Pat.LITERAL, "alice", "*", Op.READ, Perm.ALLOW), "principal"),
        (AclBinding(Res.CLUSTER, "c", Pat.LITERAL, ALICE, "*", Op.ALTER, Perm.ALLOW), "kafka-"),
        (AclBinding(Res.TOPIC, "t", Pat.LITERAL, ALICE, "*", 99, Perm.ALLOW), "unknown"),
    ],
)
def test_invalid_bindings(binding, message):
    with pytest.raises(InvalidAclError, match=message):
        validate_binding(binding)


def test_super_users_and_authorizer_keys():
    assert parse_super_users("User:alice; User:bob;") == {ALICE, BOB}
    with pytest.raises(AuthorizerConfigError, match="'alice'"):
        parse_super_users("alice")
    on = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    cfg = BrokerConfig({"authorizer.class.name": on, "allow.everyone.if.no.acl.found": "true"})
    assert cfg.get_str("authorizer.class.name") == on
    assert cfg.get_bool("allow.everyone.if.no.acl.found")
    with pytest.raises(ConfigError, match="StandardAuthorizer"):
        BrokerConfig({"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer"})
