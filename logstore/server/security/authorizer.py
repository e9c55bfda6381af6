"""The authorizer: Kafka's StandardAuthorizer decisions over the ACL store.

On when ``authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer``
(Kafka's KRaft authorizer). The ZooKeeper-era ``kafka.security.authorizer.AclAuthorizer`` is
refused, as Kafka 4 (which removed it) refuses it: loglake stores ACLs itself and has no
ZooKeeper. ``super.users`` (``User:alice;User:bob``) may do everything;
``allow.everyone.if.no.acl.found`` (default false) allows an action on a resource that no ACL
names at all.

A decision (:meth:`Authorizer.authorize`), as ``StandardAuthorizerData.authorize``:

1. a super user is allowed;
2. the bindings covering the resource (:meth:`AclIndex.applying`: literal name, literal
   ``*``, prefixes) are taken; none at all -> ``allow.everyone.if.no.acl.found``;
3. a binding applies when its principal is the session's or ``User:*`` and its host is the
   client's address or ``*``, and its operation is the action's, or ``ALL``, or (ALLOW only)
   one that implies it: READ, WRITE, DELETE and ALTER imply DESCRIBE; ALTER_CONFIGS implies
   DESCRIBE_CONFIGS;
4. any applying DENY -> denied (deny wins); else any applying ALLOW -> allowed; else denied
   (the resource has ACLs, none for this principal).

Speed: decisions are cached per (principal, host, operation, resource type, name) in a dict
that is replaced (emptied) whenever the ACLs change and cleared when it outgrows
:data:`CACHE_ENTRIES`, so a produce with 10,000 ACLs costs one dict lookup per topic once
warm. A denied decision is logged (``logstore.server.authorizer``, Kafka's authorizer log
line) when it is made, so once per cache lifetime, not per request. The cache and the index
are swapped by reference: readers never lock, and a decision made while a change lands is
the old or the new one, as in Kafka.

:func:`authorized` is the one check handlers call (a no-op True when no authorizer is on).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final

from logstore.errors import InvalidConfigError
from logstore.server.security.acls import (
    CLUSTER_NAME,
    WILDCARD,
    WILDCARD_PRINCIPAL,
    AclBinding,
    AclOperation,
    AclPermission,
    AclStore,
    PatternType,
    ResourceType,
)

if TYPE_CHECKING:
    from pathlib import Path

    from logstore.server.context import RequestContext

__all__ = [
    "CACHE_ENTRIES",
    "STANDARD_AUTHORIZER",
    "Authorizer",
    "AuthorizerConfigError",
    "authorized",
    "authorized_any",
    "authorized_cluster",
    "authorized_operations",
    "parse_super_users",
]

log = logging.getLogger(__name__)
# Kafka's kafka.authorizer.logger: one line per denied decision
denied_log = logging.getLogger("logstore.server.authorizer")

STANDARD_AUTHORIZER: Final = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
CACHE_ENTRIES: Final = 100_000

_IMPLIES: Final = {
    AclOperation.DESCRIBE: frozenset(
        {
            AclOperation.DESCRIBE,
            AclOperation.READ,
            AclOperation.WRITE,
            AclOperation.DELETE,
            AclOperation.ALTER,
        }
    ),
    AclOperation.DESCRIBE_CONFIGS: frozenset(
        {AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS}
    ),
}


class AuthorizerConfigError(InvalidConfigError):
    """Bad ``super.users``: the broker refuses to start (exit 2, a configuration error)."""


def parse_super_users(text: str) -> frozenset[str]:
    """``User:alice;User:bob`` -> the principals; each must be ``Type:name``."""
    out = set()
    for raw in text.split(";"):
        item = raw.strip()
        if not item:
            continue
        kind, sep, name = item.partition(":")
        if not sep or not kind or not name:
            raise AuthorizerConfigError(
                f"super.users={text!r}: {item!r} is not a principal (expected User:<name>,"
                " separated by ';')"
            )
        out.add(item)
    return frozenset(out)


def _applies(b: AclBinding, principal: str, host: str, op: int) -> bool:
    """Step 3 of the module docstring (the resource already matches)."""
    if b.principal not in (principal, WILDCARD_PRINCIPAL):
        return False
    if b.host not in (WILDCARD, host):
        return False
    if b.operation in (AclOperation.ALL, op):
        return True
    if b.permission != AclPermission.ALLOW:
        return False
    implied = _IMPLIES.get(op)  # type: ignore[call-overload]
    return implied is not None and b.operation in implied


class Authorizer:
    """Kafka's StandardAuthorizer semantics over an :class:`AclStore` (module docstring)."""

    def __init__(
        self, store: AclStore, *, super_users: frozenset[str], allow_if_no_acl: bool
    ) -> None:
        self.store = store
        self.super_users = super_users
        self.allow_if_no_acl = allow_if_no_acl
        self._cache: dict[tuple[str, str, int, int, str | None], bool] = {}
        store.on_change(self._invalidate)

    @classmethod
    def from_config(cls, config: Any, *, path: Path) -> Authorizer | None:
        """The authorizer ``config`` turns on, or None (``authorizer.class.name`` empty)."""
        name = config.get_str("authorizer.class.name")
        if not name:
            return None
        store = AclStore(path)
        auth = cls(
            store,
            super_users=parse_super_users(config.get_str("super.users")),
            allow_if_no_acl=config.get_bool("allow.everyone.if.no.acl.found"),
        )
        log.info(
            "authorizer on: %d ACLs (%s), super.users=%s, allow.everyone.if.no.acl.found=%s",
            len(store.index),
            path,
            ";".join(sorted(auth.super_users)) or "(none)",
            auth.allow_if_no_acl,
        )
        return auth

    def _invalidate(self) -> None:
        self._cache = {}

    def authorize(self, principal: str, host: str, op: int, resource_type: int, name: str) -> bool:
        key = (principal, host, op, resource_type, name)
        cache = self._cache
        hit = cache.get(key)
        if hit is not None:
            return hit
        result = self._decide(principal, host, op, resource_type, name)
        if not result:
            # Kafka's authorizer log line; once per decision until the ACLs change (cached)
            denied_log.info(
                "Principal = %s is Denied operation = %s from host = %s on resource = %s:%s",
                principal,
                AclOperation(op).name,
                host,
                ResourceType(resource_type).name,
                name,
            )
        if len(cache) >= CACHE_ENTRIES:
            # emptied in place: replacing it here could undo an invalidation that raced us
            cache.clear()
        # into the dict read before deciding: if the ACLs changed meanwhile, that dict is
        # already dropped and the decision with it
        cache[key] = result
        return result

    def _decide(self, principal: str, host: str, op: int, resource_type: int, name: str) -> bool:
        if principal in self.super_users:
            return True
        bindings = self.store.index.applying(resource_type, name)
        if not bindings:
            return self.allow_if_no_acl
        allowed = False
        for b in bindings:
            if _applies(b, principal, host, op):
                if b.permission == AclPermission.DENY:
                    return False
                allowed = True
        return allowed

    def authorize_any(self, principal: str, host: str, op: int, resource_type: int) -> bool:
        """Kafka's ``authorizeByResourceType`` (its ``Authorizer`` default): may the principal
        do ``op`` on at least one resource of the type? Kafka 4 lets an idempotent producer
        without IDEMPOTENT_WRITE on the cluster in when it may WRITE some topic (KIP-679).

        As Kafka: allowed if :meth:`authorize` allows a made-up name (a super user, ``*``,
        or ``allow.everyone.if.no.acl.found`` where nothing covers it); else only ACLs of
        exactly ``op`` or ALL count (no implied operations): a DENY of ``*`` refuses, an
        ALLOW of ``*`` allows, and an ALLOW of a name or prefix allows unless a DENY of the
        same literal name or of a prefix of it covers it."""
        key = (principal, host, op, resource_type, None)
        cache = self._cache
        hit = cache.get(key)
        if hit is not None:
            return hit
        result = self.authorize(principal, host, op, resource_type, "hardcode") or self._decide_any(
            principal, host, op, resource_type
        )
        cache[key] = result
        return result

    def _decide_any(self, principal: str, host: str, op: int, resource_type: int) -> bool:
        mine = [
            b
            for b in self.store.index.of_type(resource_type)
            if b.principal in (principal, WILDCARD_PRINCIPAL)
            and b.host in (WILDCARD, host)
            and b.operation in (op, AclOperation.ALL)
        ]
        deny = [b for b in mine if b.permission == AclPermission.DENY]
        deny_literal = {b.resource_name for b in deny if b.pattern_type == PatternType.LITERAL}
        deny_prefix = [b.resource_name for b in deny if b.pattern_type == PatternType.PREFIXED]
        if WILDCARD in deny_literal:
            return False
        allow = [b for b in mine if b.permission == AclPermission.ALLOW]
        if any(
            b.pattern_type == PatternType.LITERAL and b.resource_name == WILDCARD for b in allow
        ):
            return True
        for b in allow:
            if b.pattern_type == PatternType.LITERAL and b.resource_name in deny_literal:
                continue
            if any(b.resource_name.startswith(p) for p in deny_prefix):
                continue
            return True
        return False


def authorized(
    ctx: RequestContext, op: AclOperation, resource_type: ResourceType, name: str
) -> bool:
    """May the request's principal, from its host, do ``op`` on the resource? Always True
    when no authorizer is configured (the one check every handler calls)."""
    auth: Authorizer | None = getattr(ctx.broker, "authorizer", None)
    if auth is None:
        return True
    return auth.authorize(ctx.principal, ctx.client_host, op, resource_type, name)


def authorized_any(ctx: RequestContext, op: AclOperation, resource_type: ResourceType) -> bool:
    """:meth:`Authorizer.authorize_any` for the request (True with no authorizer)."""
    auth: Authorizer | None = getattr(ctx.broker, "authorizer", None)
    if auth is None:
        return True
    return auth.authorize_any(ctx.principal, ctx.client_host, op, resource_type)


def authorized_cluster(ctx: RequestContext, op: AclOperation) -> bool:
    """:func:`authorized` on the CLUSTER resource (``kafka-cluster``)."""
    return authorized(ctx, op, ResourceType.CLUSTER, CLUSTER_NAME)


# Kafka's "authorized operations" bit sets (KIP-430): what a principal may do to a resource.
_OPERATIONS_OF: Final = {
    ResourceType.TOPIC: (
        AclOperation.READ,
        AclOperation.WRITE,
        AclOperation.CREATE,
        AclOperation.DELETE,
        AclOperation.ALTER,
        AclOperation.DESCRIBE,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
    ),
    ResourceType.GROUP: (AclOperation.READ, AclOperation.DELETE, AclOperation.DESCRIBE),
    ResourceType.CLUSTER: (
        AclOperation.CREATE,
        AclOperation.ALTER,
        AclOperation.DESCRIBE,
        AclOperation.CLUSTER_ACTION,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
        AclOperation.IDEMPOTENT_WRITE,
    ),
}


def authorized_operations(ctx: RequestContext, resource_type: ResourceType, name: str) -> int:
    """Kafka's bit set (``1 << operation``) of the operations the request's principal may do
    to the resource, as Metadata and DescribeGroups answer when asked (KIP-430)."""
    bits = 0
    for op in _OPERATIONS_OF[resource_type]:
        if authorized(ctx, op, resource_type, name):
            bits |= 1 << op
    return bits
