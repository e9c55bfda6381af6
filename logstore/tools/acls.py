"""``loglake acls``: add, remove and list ACLs, as ``kafka-acls.sh``.

::

    loglake acls --add    --allow-principal User:alice [--allow-host H] --operation Read
                          --operation Write --topic t [--resource-pattern-type prefixed]
    loglake acls --add    --deny-principal User:bob --operation All --group g
    loglake acls --add    --allow-principal User:alice --producer --topic t [--idempotent]
    loglake acls --add    --allow-principal User:alice --consumer --topic t --group g
    loglake acls --remove [--force] [the same options: what matches them is removed]
    loglake acls --list   [--topic t | --group g | --cluster | --transactional-id x]
                          [--principal User:alice] [--resource-pattern-type match]

Kafka's conventions: ``--operation`` repeats (Read, Write, Create, Delete, Alter, Describe,
ClusterAction, DescribeConfigs, AlterConfigs, IdempotentWrite, All; any case, default All);
``--allow-host``/``--deny-host`` default to ``*``; ``--resource-pattern-type`` is literal by
default, prefixed for patterns, and (``--list``/``--remove``) any or match to filter;
``--producer`` is WRITE, DESCRIBE and CREATE on the topics (IDEMPOTENT_WRITE on the cluster
with ``--idempotent``, WRITE and DESCRIBE on ``--transactional-id``); ``--consumer`` READ and
DESCRIBE on the topics and READ on the group. ``--remove`` asks for confirmation on stdin
unless ``--force``. Output is kafka-acls' (``Current ACLs for resource `ResourcePattern(...)`:``
then one ``(principal=..., host=..., operation=..., permissionType=...)`` line per ACL).

Only the Kafka protocol (CreateAcls, DescribeAcls, DeleteAcls v3 through the tools'
:class:`~logstore.tools.admin.Admin` connection, authenticated with ``--command-config`` as
every tool), so the tool manages Apache Kafka's ACLs too.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from typing import Any, Final

from kio.schema.create_acls.v3.request import AclCreation, CreateAclsRequest
from kio.schema.delete_acls.v3.request import DeleteAclsFilter, DeleteAclsRequest
from kio.schema.describe_acls.v3.request import DescribeAclsRequest
from kio.schema.errors import ErrorCode
from kio.static.primitive import i8

from logstore.errors import LoglakeError
from logstore.server.security.acls import (
    CLUSTER_NAME,
    AclOperation,
    AclPermission,
    PatternType,
    ResourceType,
)
from logstore.tools.admin import (
    Admin,
    ToolError,
    add_bootstrap_argument,
    bootstrap_of,
    client_config_of,
    error_name,
)

__all__ = ["EPILOG", "add_arguments", "run"]

EPILOG: Final = (
    "Exit codes: 0 success; 1 the broker failed for a reason that may pass; 2 bad arguments,"
    " or the broker refused (CLUSTER_AUTHORIZATION_FAILED, SECURITY_DISABLED: no authorizer,"
    " INVALID_REQUEST), or cannot be reached; 130 interrupted."
)

# what kafka-acls accepts for --operation, normalised (Kafka's AclOperation.fromString)
_OPERATIONS: Final = {op.name.replace("_", ""): op for op in AclOperation if op > AclOperation.ANY}
_PATTERNS: Final = {"literal", "prefixed", "match", "any"}
# errors that retrying will not change (exit 2)
_REFUSALS: Final = frozenset(
    {
        ErrorCode.cluster_authorization_failed,
        ErrorCode.security_disabled,
        ErrorCode.invalid_request,
    }
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    add_bootstrap_argument(parser)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--add", action="store_true", help="add the ACLs the options describe")
    action.add_argument("--remove", action="store_true", help="remove the ACLs they match")
    action.add_argument("--list", action="store_true", help="list ACLs (of the given resources)")
    parser.add_argument("--topic", action="append", default=[], metavar="T", help="a topic")
    parser.add_argument("--group", action="append", default=[], metavar="G", help="a group")
    parser.add_argument("--cluster", action="store_true", help="the cluster resource")
    parser.add_argument(
        "--transactional-id", action="append", default=[], metavar="ID", help="a transactional id"
    )
    parser.add_argument(
        "--resource-pattern-type",
        default="literal",
        metavar="TYPE",
        help="literal (default), prefixed; to filter (--list, --remove) also match or any",
    )
    for kind in ("allow", "deny"):
        parser.add_argument(
            f"--{kind}-principal",
            action="append",
            default=[],
            metavar="User:NAME",
            help=f"a principal the {kind.upper()} ACLs are for (repeatable; User:* = everyone)",
        )
        parser.add_argument(
            f"--{kind}-host",
            action="append",
            default=[],
            metavar="HOST",
            help=f"a client address the {kind.upper()} ACLs apply from (repeatable; default *)",
        )
    parser.add_argument(
        "--operation",
        action="append",
        default=[],
        metavar="OP",
        help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs,"
        " AlterConfigs, IdempotentWrite, All (repeatable; default All)",
    )
    parser.add_argument("--principal", metavar="User:NAME", help="with --list: only this one")
    parser.add_argument("--producer", action="store_true", help="the ACLs a producer needs")
    parser.add_argument("--consumer", action="store_true", help="the ACLs a consumer needs")
    parser.add_argument(
        "--idempotent", action="store_true", help="with --producer: IDEMPOTENT_WRITE on cluster"
    )
    parser.add_argument("--force", action="store_true", help="--remove without asking")


def _operation(text: str) -> AclOperation:
    op = _OPERATIONS.get(text.replace("_", "").replace("-", "").upper())
    if op is None:
        valid = ", ".join(sorted(o.name.title().replace("_", "") for o in _OPERATIONS.values()))
        raise ToolError(f"--operation {text!r}: expected one of {valid}")
    return op


def _pattern(args: argparse.Namespace) -> PatternType:
    text = args.resource_pattern_type.lower()
    if text not in _PATTERNS:
        raise ToolError(
            f"--resource-pattern-type {args.resource_pattern_type!r}: expected one of"
            f" {', '.join(sorted(_PATTERNS))}"
        )
    pattern = PatternType[text.upper()]
    if args.add and pattern not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise ToolError(f"--add takes a literal or prefixed pattern, not {text}")
    return pattern


def _resources(args: argparse.Namespace) -> list[tuple[ResourceType, str]]:
    out = [(ResourceType.TOPIC, t) for t in args.topic]
    out += [(ResourceType.GROUP, g) for g in args.group]
    out += [(ResourceType.TRANSACTIONAL_ID, x) for x in args.transactional_id]
    if args.cluster or (args.producer and args.idempotent):
        out.append((ResourceType.CLUSTER, CLUSTER_NAME))
    return out


def _ops_for(args: argparse.Namespace, rtype: ResourceType) -> list[AclOperation]:
    """The operations to add/remove on a resource of ``rtype`` (``--producer``/``--consumer``
    as kafka-acls expands them, else ``--operation``, default All)."""
    if args.producer or args.consumer:
        ops: list[AclOperation] = []
        if args.producer:
            ops += {
                ResourceType.TOPIC: [
                    AclOperation.WRITE,
                    AclOperation.DESCRIBE,
                    AclOperation.CREATE,
                ],
                ResourceType.TRANSACTIONAL_ID: [AclOperation.WRITE, AclOperation.DESCRIBE],
                ResourceType.CLUSTER: [AclOperation.IDEMPOTENT_WRITE],
            }.get(rtype, [])
        if args.consumer:
            ops += {
                ResourceType.TOPIC: [AclOperation.READ, AclOperation.DESCRIBE],
                ResourceType.GROUP: [AclOperation.READ],
            }.get(rtype, [])
        return list(dict.fromkeys(ops))
    return [_operation(o) for o in args.operation] or [AclOperation.ALL]


def _entries(args: argparse.Namespace) -> list[tuple[str, str, AclPermission]]:
    """(principal, host, permission) for every --allow/--deny principal and host."""
    out = []
    for principals, hosts, perm in (
        (args.allow_principal, args.allow_host, AclPermission.ALLOW),
        (args.deny_principal, args.deny_host, AclPermission.DENY),
    ):
        for p in principals:
            if ":" not in p:
                raise ToolError(f"principal {p!r}: expected Type:name, e.g. User:alice")
            for h in hosts or ["*"]:
                out.append((p, h, perm))
    return out


def _pattern_text(rtype: int, name: str, pattern: int) -> str:
    return (
        f"ResourcePattern(resourceType={ResourceType(rtype).name}, name={name},"
        f" patternType={PatternType(pattern).name})"
    )


def _acl_text(principal: str, host: str, op: int, perm: int) -> str:
    return (
        f"(principal={principal}, host={host}, operation={AclOperation(op).name},"
        f" permissionType={AclPermission(perm).name})"
    )


def _check(code: ErrorCode, what: str, message: str | None) -> None:
    if code == ErrorCode.none:
        return
    detail = f": {message}" if message else ""
    raise ToolError(f"{what}: {error_name(code)}{detail}", retriable=code not in _REFUSALS)


def _describe(
    admin: Admin, rtype: int, name: str | None, pattern: int, principal: str | None
) -> Any:
    resp = admin.call(
        DescribeAclsRequest(
            resource_type_filter=i8(rtype),
            resource_name_filter=name,
            pattern_type_filter=i8(pattern),
            principal_filter=principal,
            host_filter=None,
            operation=i8(AclOperation.ANY),
            permission_type=i8(AclPermission.ANY),
        )
    )
    _check(resp.error_code, "DescribeAcls", resp.error_message)
    return resp.resources


def _print_resources(resources: Iterable[Any]) -> None:
    for r in resources:
        pattern = _pattern_text(r.resource_type, r.resource_name, r.pattern_type)
        print(f"Current ACLs for resource `{pattern}`: ")
        for a in r.acls:
            print(f" \t{_acl_text(a.principal, a.host, a.operation, a.permission_type)} ")
        print()


def _add(
    admin: Admin, args: argparse.Namespace, resources: Sequence[tuple[ResourceType, str]]
) -> None:
    entries = _entries(args)
    given = _pattern(args)
    for rtype, name in resources:
        # the cluster is always literal (kafka-cluster), as kafka-acls makes it
        pattern = PatternType.LITERAL if rtype == ResourceType.CLUSTER else given
        ops = _ops_for(args, rtype)
        creations = [
            AclCreation(
                resource_type=i8(rtype),
                resource_name=name,
                resource_pattern_type=i8(pattern),
                principal=p,
                host=h,
                operation=i8(op),
                permission_type=i8(perm),
            )
            for p, h, perm in entries
            for op in ops
        ]
        if not creations:
            continue
        print(f"Adding ACLs for resource `{_pattern_text(rtype, name, pattern)}`: ")
        for c in creations:
            print(f" \t{_acl_text(c.principal, c.host, c.operation, c.permission_type)} ")
        print()
        resp = admin.call(CreateAclsRequest(creations=tuple(creations)))
        for c, result in zip(creations, resp.results, strict=True):
            _check(
                result.error_code,
                f"CreateAcls {_acl_text(c.principal, c.host, c.operation, c.permission_type)}",
                result.error_message,
            )
        _print_resources(_describe(admin, rtype, name, pattern, None))


def _remove(
    admin: Admin, args: argparse.Namespace, resources: Sequence[tuple[ResourceType, str]]
) -> None:
    pattern = _pattern(args)
    entries = _entries(args)
    filters = []
    for rtype, name in resources:
        explicit = bool(args.operation or args.producer or args.consumer)
        ops: list[AclOperation | None] = list(_ops_for(args, rtype)) if explicit else [None]
        for op in ops:
            for principal, host, perm in entries or [(None, None, None)]:  # type: ignore[list-item]
                filters.append(
                    DeleteAclsFilter(
                        resource_type_filter=i8(rtype),
                        resource_name_filter=name,
                        pattern_type_filter=i8(pattern),
                        principal_filter=principal,
                        host_filter=host,
                        operation=i8(AclOperation.ANY if op is None else op),
                        permission_type=i8(AclPermission.ANY if perm is None else perm),
                    )
                )
    if not args.force:
        what = ", ".join(_pattern_text(r, n, pattern) for r, n in resources)
        print(f"Are you sure you want to remove ACLs from {what}? (y/n)", flush=True)
        if sys.stdin.readline().strip().lower() not in ("y", "yes"):
            raise ToolError("not removed: not confirmed (use --force to skip the question)")
    resp = admin.call(DeleteAclsRequest(filters=tuple(filters)))
    removed = 0
    for result in resp.filter_results:
        _check(result.error_code, "DeleteAcls", result.error_message)
        for m in result.matching_acls:
            removed += 1
            print(
                f"Removed {_acl_text(m.principal, m.host, m.operation, m.permission_type)} from"
                f" `{_pattern_text(m.resource_type, m.resource_name, m.pattern_type)}`"
            )
    print(f"{removed} ACL(s) removed.")


def run(args: argparse.Namespace) -> int:
    try:
        resources = _resources(args)
        if (args.add or args.remove) and not resources:
            raise ToolError("name a resource: --topic, --group, --cluster or --transactional-id")
        if args.idempotent and not args.producer:
            raise ToolError("--idempotent goes with --producer")
        if args.consumer and args.add and not args.group:
            raise ToolError("--consumer needs --group (the group the consumer reads in)")
        if args.principal is not None and not args.list:
            raise ToolError("--principal goes with --list (use --allow-principal to add)")
        # every argument rule before the first request
        _pattern(args)
        entries = _entries(args)
        if args.add and not entries:
            raise ToolError("--add needs --allow-principal or --deny-principal")
        for rtype, _name in resources:
            _ops_for(args, rtype)
        config = client_config_of(args)
        with Admin(bootstrap_of(args), client_id="loglake-acls", config=config) as admin:
            if args.add:
                _add(admin, args, resources)
            elif args.remove:
                _remove(admin, args, resources)
            else:
                pattern = _pattern(args)
                if not resources:
                    found = _describe(
                        admin, ResourceType.ANY, None, PatternType.ANY, args.principal
                    )
                    _print_resources(found)
                for rtype, name in resources:
                    _print_resources(_describe(admin, rtype, name, pattern, args.principal))
        return 0
    except ToolError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1 if exc.retriable else 2
    except LoglakeError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
