"""DescribeAcls (key 29), CreateAcls (key 30) and DeleteAcls (key 31), v1-v3 as Kafka 4 serves
them (v0 went with KIP-896).

As Kafka answers (``KafkaApis`` / ``AclApis``):

- no authorizer (``authorizer.class.name`` empty): ``SECURITY_DISABLED`` (Describe: the
  response's error; Create: every creation; Delete: every filter);
- CreateAcls and DeleteAcls need ALTER on the CLUSTER, DescribeAcls DESCRIBE on it
  (``CLUSTER_AUTHORIZATION_FAILED`` otherwise, in the same places);
- a creation Kafka refuses (unknown or ANY codes, MATCH/ANY pattern types, an empty name, a
  principal without ``Type:``, a CLUSTER name other than ``kafka-cluster``) gets
  ``INVALID_REQUEST`` with the reason and the valid ones of the request are created; a filter
  with an UNKNOWN element gets ``INVALID_REQUEST`` (Describe: the whole response);
- creating an ACL that exists is a success (it is kept once); a change is answered only once
  durable (:class:`~logstore.server.security.acls.AclStore`), a disk that refuses answers
  ``UNKNOWN_SERVER_ERROR`` and changes nothing.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from kio.schema.errors import ErrorCode

from logstore.server.context import RequestContext
from logstore.server.handlers._util import ZERO_MS, build, response_module
from logstore.server.security.acls import (
    AclBinding,
    AclFilter,
    AclOperation,
    InvalidAclError,
    validate_binding,
)
from logstore.server.security.authorizer import Authorizer, authorized_cluster

__all__ = ["API_HANDLERS"]

log = logging.getLogger(__name__)

DESCRIBE_KEY: Final = 29
CREATE_KEY: Final = 30
DELETE_KEY: Final = 31
_DISABLED: Final = "No Authorizer is configured (authorizer.class.name)."


def _authorizer(ctx: RequestContext) -> Authorizer | None:
    auth: Authorizer | None = getattr(ctx.broker, "authorizer", None)
    return auth


def _filter(f: Any) -> AclFilter:
    """The filter of a DescribeAcls request or of one DeleteAcls filter (same field names)."""
    return AclFilter(
        resource_type=int(f.resource_type_filter),
        resource_name=f.resource_name_filter,
        pattern_type=int(f.pattern_type_filter),
        principal=f.principal_filter,
        host=f.host_filter,
        operation=int(f.operation),
        permission=int(f.permission_type),
    )


def handle_describe(ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ctx)

    def answer(error: ErrorCode, message: str | None, resources: tuple[Any, ...] = ()) -> Any:
        return build(
            mod.DescribeAclsResponse,
            throttle_time=ZERO_MS,
            error_code=error,
            error_message=message,
            resources=resources,
        )

    auth = _authorizer(ctx)
    if auth is None:
        return answer(ErrorCode.security_disabled, _DISABLED)
    if not authorized_cluster(ctx, AclOperation.DESCRIBE):
        return answer(ErrorCode.cluster_authorization_failed, None)
    flt = _filter(request)
    try:
        flt.validate()
    except InvalidAclError as exc:
        return answer(ErrorCode.invalid_request, exc.message)
    grouped: dict[tuple[int, str, int], list[AclBinding]] = {}
    for b in auth.store.describe(flt):
        grouped.setdefault((b.resource_type, b.resource_name, b.pattern_type), []).append(b)
    resources = tuple(
        build(
            mod.DescribeAclsResource,
            resource_type=rt,
            resource_name=name,
            pattern_type=pt,
            acls=tuple(
                build(
                    mod.AclDescription,
                    principal=b.principal,
                    host=b.host,
                    operation=b.operation,
                    permission_type=b.permission,
                )
                for b in acls
            ),
        )
        for (rt, name, pt), acls in grouped.items()
    )
    return answer(ErrorCode.none, None, resources)


def handle_create(ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ctx)
    auth = _authorizer(ctx)
    n = len(request.creations)
    results: list[tuple[ErrorCode, str | None]] = [(ErrorCode.none, None)] * n
    if auth is None:
        results = [(ErrorCode.security_disabled, _DISABLED)] * n
    elif not authorized_cluster(ctx, AclOperation.ALTER):
        results = [(ErrorCode.cluster_authorization_failed, None)] * n
    else:
        valid: list[tuple[int, AclBinding]] = []
        for i, c in enumerate(request.creations):
            b = AclBinding(
                int(c.resource_type),
                str(c.resource_name),
                int(c.resource_pattern_type),
                str(c.principal),
                str(c.host),
                int(c.operation),
                int(c.permission_type),
            )
            try:
                validate_binding(b)
            except InvalidAclError as exc:
                results[i] = (ErrorCode.invalid_request, exc.message)
            else:
                valid.append((i, b))
        if valid:
            try:
                auth.store.create([b for _, b in valid])
            except OSError as exc:
                log.error("cannot write ACLs %s: %s", auth.store.path, exc)
                for i, _ in valid:
                    results[i] = (ErrorCode.unknown_server_error, "ACLs not written")
            else:
                log.info("%s created %d ACL(s)", ctx.principal, len(valid))
    return build(
        mod.CreateAclsResponse,
        throttle_time=ZERO_MS,
        results=tuple(
            build(mod.AclCreationResult, error_code=e, error_message=m) for e, m in results
        ),
    )


def handle_delete(ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ctx)
    auth = _authorizer(ctx)
    n = len(request.filters)
    outcome: list[tuple[ErrorCode, str | None, list[AclBinding]]] = [(ErrorCode.none, None, [])] * n
    if auth is None:
        outcome = [(ErrorCode.security_disabled, _DISABLED, [])] * n
    elif not authorized_cluster(ctx, AclOperation.ALTER):
        outcome = [(ErrorCode.cluster_authorization_failed, None, [])] * n
    else:
        filters: list[tuple[int, AclFilter]] = []
        for i, f in enumerate(request.filters):
            flt = _filter(f)
            try:
                flt.validate()
            except InvalidAclError as exc:
                outcome[i] = (ErrorCode.invalid_request, exc.message, [])
            else:
                filters.append((i, flt))
        if filters:
            try:
                matched = auth.store.delete([f for _, f in filters])
            except OSError as exc:
                log.error("cannot write ACLs %s: %s", auth.store.path, exc)
                for i, _ in filters:
                    outcome[i] = (ErrorCode.unknown_server_error, "ACLs not written", [])
            else:
                for (i, _), acls in zip(filters, matched, strict=True):
                    outcome[i] = (ErrorCode.none, None, acls)
                gone = len({b for m in matched for b in m})
                log.info("%s deleted %d ACL(s)", ctx.principal, gone)
    return build(
        mod.DeleteAclsResponse,
        throttle_time=ZERO_MS,
        filter_results=tuple(
            build(
                mod.DeleteAclsFilterResult,
                error_code=e,
                error_message=m,
                matching_acls=tuple(
                    build(
                        mod.DeleteAclsMatchingAcl,
                        error_code=ErrorCode.none,
                        error_message=None,
                        resource_type=b.resource_type,
                        resource_name=b.resource_name,
                        pattern_type=b.pattern_type,
                        principal=b.principal,
                        host=b.host,
                        operation=b.operation,
                        permission_type=b.permission,
                    )
                    for b in acls
                ),
            )
            for e, m, acls in outcome
        ),
    )


API_HANDLERS: Final = {
    DESCRIBE_KEY: (1, 3, handle_describe),
    CREATE_KEY: (1, 3, handle_create),
    DELETE_KEY: (1, 3, handle_delete),
}
