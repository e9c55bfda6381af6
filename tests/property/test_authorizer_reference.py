"""The authorizer's indexed, cached decisions against a trivially correct reference: a scan of
every ACL with Kafka's rules written out plainly (StandardAuthorizerData: resource match by
literal name, ``*`` or prefix; principal or ``User:*``; host or ``*``; ALL, the operation, or
for ALLOW an implying one; deny wins; no ACL on the resource -> allow.everyone). Random ACL
sets over a small alphabet so that prefixes, wildcards and collisions are frequent."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from logstore.server.security.acls import AclBinding, AclStore
from logstore.server.security.acls import AclOperation as Op
from logstore.server.security.acls import AclPermission as Perm
from logstore.server.security.acls import PatternType as Pat
from logstore.server.security.acls import ResourceType as Res
from logstore.server.security.authorizer import Authorizer

SETTINGS = settings(max_examples=300, deadline=None)

NAMES = st.text(alphabet="ab*", min_size=1, max_size=4)
PRINCIPALS = st.sampled_from(["User:alice", "User:bob", "User:*"])
HOSTS = st.sampled_from(["*", "10.0.0.1", "10.0.0.2"])
OPS = st.sampled_from([o for o in Op if o > Op.ANY])
BINDINGS = st.builds(
    AclBinding,
    st.sampled_from([Res.TOPIC, Res.GROUP]),
    NAMES,
    st.sampled_from([Pat.LITERAL, Pat.PREFIXED]),
    PRINCIPALS,
    HOSTS,
    OPS,
    st.sampled_from([Perm.ALLOW, Perm.DENY]),
)
IMPLIES = {
    Op.DESCRIBE: {Op.DESCRIBE, Op.READ, Op.WRITE, Op.DELETE, Op.ALTER},
    Op.DESCRIBE_CONFIGS: {Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS},
}


def reference(acls, *, principal, host, op, rtype, name, allow_everyone) -> bool:
    on_resource = [
        a
        for a in acls
        if a.resource_type == rtype
        and (
            (a.pattern_type == Pat.LITERAL and a.resource_name in (name, "*"))
            or (a.pattern_type == Pat.PREFIXED and name.startswith(a.resource_name))
        )
    ]
    if not on_resource:
        return allow_everyone
    applying = []
    for a in on_resource:
        if a.principal not in (principal, "User:*") or a.host not in (host, "*"):
            continue
        implied = a.permission == Perm.ALLOW and a.operation in IMPLIES.get(op, ())
        if a.operation in (Op.ALL, op) or implied:
            applying.append(a)
    if any(a.permission == Perm.DENY for a in applying):
        return False
    return any(a.permission == Perm.ALLOW for a in applying)


REQUESTS = st.fixed_dictionaries(
    {
        "principal": st.sampled_from(["User:alice", "User:bob"]),
        "host": st.sampled_from(["10.0.0.1", "10.0.0.2"]),
        "op": OPS,
        "rtype": st.sampled_from([Res.TOPIC, Res.GROUP]),
        "name": st.text(alphabet="ab*", min_size=1, max_size=5),
    }
)


@SETTINGS
@given(acls=st.lists(BINDINGS, max_size=25), request=REQUESTS, allow_everyone=st.booleans())
def test_decisions_match_the_reference(acls, request, allow_everyone):
    with tempfile.TemporaryDirectory() as tmp:
        store = AclStore(Path(tmp) / "__acls.json")
        store.create(acls)
        auth = Authorizer(store, super_users=frozenset(), allow_if_no_acl=allow_everyone)
        expected = reference(acls, **request, allow_everyone=allow_everyone)
        args = (request["principal"], request["host"], request["op"], request["rtype"])
        assert auth.authorize(*args, request["name"]) is expected
        assert auth.authorize(*args, request["name"]) is expected  # cached
