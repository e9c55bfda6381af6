"""Kafka API handlers of the group coordinator: kio requests in, kio responses out.

FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch,
ListGroups, DescribeGroups, DeleteGroups and OffsetDelete (the classic group protocol; the
KIP-848 ConsumerGroupHeartbeat is not offered, so clients stay on the classic one).

``API_HANDLERS`` maps api key -> (min version, max version, handler) and is merged into the
broker's registry (:mod:`logstore.server.registry`), so ApiVersions advertises exactly these
ranges. They cover what confluent-kafka (librdkafka), kafka-python and aiokafka send, and
stop short of versions that need what this broker does not have (OffsetCommit/OffsetFetch
v10, Kafka 4.1's, name topics by topic id). DescribeGroups v6 (KIP-1043) answers an unknown
group with ``GROUP_ID_NOT_FOUND`` and a message instead of v0-v5's state ``Dead``.

Responses are built field by field from the response class of the request's version (kio
has one dataclass per version): :func:`build` passes only the fields that version has and
turns lists of dicts into the version's nested types, so one handler serves every version.
A JoinGroup/SyncGroup that waits for the rest of the group returns a
:class:`~logstore.server.context.Deferred` completed by the coordinator.

Authorization (with ``authorizer.class.name``, :mod:`logstore.server.security.authorizer`),
as Kafka's ``KafkaApis``: FindCoordinator DESCRIBE on the group or transactional id;
JoinGroup, SyncGroup, Heartbeat, LeaveGroup READ on the group; OffsetCommit READ on the group
and each topic; OffsetFetch DESCRIBE on the group and each topic (an all-topics fetch leaves
out what the principal may not see); DescribeGroups DESCRIBE, DeleteGroups and OffsetDelete
DELETE on the group (OffsetDelete READ on each topic); ListGroups every group with DESCRIBE
on the cluster, else the groups the principal may DESCRIBE. Refusals are
``GROUP_AUTHORIZATION_FAILED`` / ``TOPIC_AUTHORIZATION_FAILED`` /
``TRANSACTIONAL_ID_AUTHORIZATION_FAILED``, decided before the coordinator is asked.

Thread-safety: handlers hold no state; the coordinator serialises.
"""

from __future__ import annotations

import dataclasses
import datetime
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from kio.index import load_response_from_request
from kio.schema.errors import ErrorCode

from logstore.server.context import Deferred, RequestContext
from logstore.server.group.coordinator import GroupCoordinator
from logstore.server.group.group import GroupState
from logstore.server.group.messages import (
    CommitRequest,
    JoinRequest,
    JoinResult,
    OffsetFetchResult,
    SyncRequest,
    SyncResult,
)
from logstore.server.security.acls import AclOperation, ResourceType
from logstore.server.security.authorizer import (
    authorized,
    authorized_cluster,
    authorized_operations,
)

__all__ = ["API_HANDLERS", "build"]

_ZERO = datetime.timedelta(0)
_MS = datetime.timedelta(milliseconds=1)
_DEAD = GroupState.DEAD.value

# Kafka's key types of FindCoordinator (KIP-890 adds "share" = 2, not served here).
_KEY_TYPE_GROUP = 0
_KEY_TYPE_TRANSACTION = 1

Handler = Callable[[RequestContext, Any], Any]


# --- response building -------------------------------------------------------------------

_FIELDS: dict[type[Any], dict[str, type[Any] | None]] = {}


def _nested_type(hint: Any) -> type[Any] | None:
    """The element type of ``tuple[X, ...]`` (or ``tuple[X, ...] | None``) when X is a
    dataclass; None for scalars."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(hint):
            nested = _nested_type(arg)
            if nested is not None:
                return nested
        return None
    if origin is tuple:
        args = typing.get_args(hint)
        if args and dataclasses.is_dataclass(args[0]) and isinstance(args[0], type):
            return args[0]
    return None


def _fields(cls: type[Any]) -> dict[str, type[Any] | None]:
    found = _FIELDS.get(cls)
    if found is None:
        hints = typing.get_type_hints(cls)
        found = {f.name: _nested_type(hints[f.name]) for f in dataclasses.fields(cls)}
        _FIELDS[cls] = found
    return found


def build(cls: type[Any], values: Mapping[str, Any]) -> Any:
    """An instance of kio class ``cls`` from ``values``: keys the class lacks are dropped
    (fields of other versions), lists of mappings become tuples of the nested class."""
    kwargs: dict[str, Any] = {}
    for name, nested in _fields(cls).items():
        if name not in values:
            continue
        value = values[name]
        if nested is not None and value is not None:
            value = tuple(build(nested, item) for item in value)
        kwargs[name] = value
    return cls(**kwargs)


def _response(request: Any, values: Mapping[str, Any]) -> Any:
    return build(load_response_from_request(request), {"throttle_time": _ZERO, **values})


def _ms(value: datetime.timedelta) -> int:
    return int(value // _MS)


def _coordinator(ctx: RequestContext) -> GroupCoordinator:
    coordinator: GroupCoordinator = ctx.group_coordinator
    return coordinator


def _client_host(ctx: RequestContext) -> str:
    # Kafka shows the peer as InetAddress.toString(): "/127.0.0.1".
    host = ctx.client_host or ""
    return host if host.startswith("/") else "/" + host


def _settle(deferred: Deferred[Any]) -> Any:
    """The response itself when the coordinator answered at once, else the Deferred."""
    return deferred.result() if deferred.done() else deferred


# --- FindCoordinator (10) ----------------------------------------------------------------


def handle_find_coordinator(ctx: RequestContext, request: Any) -> Any:
    broker = ctx.broker
    node_id = int(broker.node_id)
    host, port = ctx.advertised
    key_type = int(getattr(request, "key_type", _KEY_TYPE_GROUP))

    # Groups and transactions are both coordinated by this (only) broker; for a
    # transactional id, InitProducerId then gives the client its definite answer rather
    # than a retriable "no coordinator" it would retry until it times out.
    def answer(key: str) -> dict[str, Any]:
        if key_type not in (_KEY_TYPE_GROUP, _KEY_TYPE_TRANSACTION):
            return {
                "key": key,
                "node_id": -1,
                "host": "",
                "port": -1,
                "error_code": ErrorCode.invalid_request,
                "error_message": f"coordinator key type {key_type} is not supported",
            }
        # Kafka: DESCRIBE on the group / the transactional id
        if key_type == _KEY_TYPE_GROUP and not authorized(
            ctx, AclOperation.DESCRIBE, ResourceType.GROUP, key
        ):
            denied = ErrorCode.group_authorization_failed
        elif key_type == _KEY_TYPE_TRANSACTION and not authorized(
            ctx, AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, key
        ):
            denied = ErrorCode.transactional_id_authorization_failed
        else:
            denied = None
        if denied is not None:
            return {
                "key": key,
                "node_id": -1,
                "host": "",
                "port": -1,
                "error_code": denied,
                "error_message": None,
            }
        return {
            "key": key,
            "node_id": node_id,
            "host": host,
            "port": port,
            "error_code": ErrorCode.none,
            "error_message": None,
        }

    if ctx.api_version >= 4:
        return _response(request, {"coordinators": [answer(k) for k in request.coordinator_keys]})
    return _response(request, answer(request.key))


# --- JoinGroup (11) / SyncGroup (14) -----------------------------------------------------


def _join_response(request: Any, version: int, r: JoinResult) -> Any:
    return _response(
        request,
        {
            "error_code": r.error,
            "generation_id": r.generation_id,
            "protocol_type": r.protocol_type,
            # Non-nullable before v7: an error answer carries "".
            "protocol_name": r.protocol_name if version >= 7 else (r.protocol_name or ""),
            "leader": r.leader_id,
            "skip_assignment": False,
            "member_id": r.member_id,
            "members": [
                {"member_id": mid, "group_instance_id": iid, "metadata": meta}
                for mid, iid, meta in r.members
            ],
        },
    )


def handle_join_group(ctx: RequestContext, request: Any) -> Any:
    v = ctx.api_version
    if not authorized(ctx, AclOperation.READ, ResourceType.GROUP, str(request.group_id)):
        denied = JoinResult(ErrorCode.group_authorization_failed, member_id=request.member_id)
        return _join_response(request, v, denied)
    session_ms = _ms(request.session_timeout)
    join = JoinRequest(
        group_id=str(request.group_id),
        member_id=request.member_id,
        group_instance_id=getattr(request, "group_instance_id", None),
        client_id=ctx.client_id or "",
        client_host=_client_host(ctx),
        session_timeout_ms=session_ms,
        # v0 has no rebalance timeout: Kafka uses the session timeout.
        rebalance_timeout_ms=_ms(request.rebalance_timeout) if v >= 1 else session_ms,
        protocol_type=request.protocol_type,
        protocols=tuple((p.name, bytes(p.metadata)) for p in request.protocols),
        require_known_member_id=v >= 4,
    )
    deferred: Deferred[Any] = Deferred()
    _coordinator(ctx).join_group(join, lambda r: deferred.complete(_join_response(request, v, r)))
    return _settle(deferred)


def _sync_response(request: Any, r: SyncResult) -> Any:
    return _response(
        request,
        {
            "error_code": r.error,
            "protocol_type": r.protocol_type,
            "protocol_name": r.protocol_name,
            "assignment": r.assignment,
        },
    )


def handle_sync_group(ctx: RequestContext, request: Any) -> Any:
    if not authorized(ctx, AclOperation.READ, ResourceType.GROUP, str(request.group_id)):
        return _sync_response(request, SyncResult(ErrorCode.group_authorization_failed))
    sync = SyncRequest(
        group_id=str(request.group_id),
        generation_id=int(request.generation_id),
        member_id=request.member_id,
        group_instance_id=getattr(request, "group_instance_id", None),
        protocol_type=getattr(request, "protocol_type", None),
        protocol_name=getattr(request, "protocol_name", None),
        assignments={a.member_id: bytes(a.assignment) for a in request.assignments},
    )
    deferred: Deferred[Any] = Deferred()
    _coordinator(ctx).sync_group(sync, lambda r: deferred.complete(_sync_response(request, r)))
    return _settle(deferred)


# --- Heartbeat (12) / LeaveGroup (13) ----------------------------------------------------


def handle_heartbeat(ctx: RequestContext, request: Any) -> Any:
    if not authorized(ctx, AclOperation.READ, ResourceType.GROUP, str(request.group_id)):
        return _response(request, {"error_code": ErrorCode.group_authorization_failed})
    error = _coordinator(ctx).heartbeat(
        str(request.group_id),
        member_id=request.member_id,
        group_instance_id=getattr(request, "group_instance_id", None),
        generation_id=int(request.generation_id),
    )
    return _response(request, {"error_code": error})


def handle_leave_group(ctx: RequestContext, request: Any) -> Any:
    if not authorized(ctx, AclOperation.READ, ResourceType.GROUP, str(request.group_id)):
        return _response(
            request, {"error_code": ErrorCode.group_authorization_failed, "members": []}
        )
    if ctx.api_version >= 3:
        leaving = [(m.member_id, m.group_instance_id) for m in request.members]
    else:
        leaving = [(request.member_id, None)]
    error, results = _coordinator(ctx).leave_group(str(request.group_id), leaving)
    if ctx.api_version < 3 and error is ErrorCode.none and results:
        error = results[0][2]
    return _response(
        request,
        {
            "error_code": error,
            "members": [
                {"member_id": mid, "group_instance_id": iid, "error_code": err}
                for mid, iid, err in results
            ],
        },
    )


# --- OffsetCommit (8) / OffsetFetch (9) --------------------------------------------------


def _partition_exists(ctx: RequestContext, topic: str, partition: int) -> bool:
    get_log = getattr(ctx.log_manager, "get_log", None)
    if get_log is None:
        return True
    return get_log(topic, partition) is not None


def handle_offset_commit(ctx: RequestContext, request: Any) -> Any:
    commits: list[CommitRequest] = []
    slots: list[tuple[int, int, ErrorCode | None]] = []  # (topic index, partition, error)
    if not authorized(ctx, AclOperation.READ, ResourceType.GROUP, str(request.group_id)):
        denied = ErrorCode.group_authorization_failed
        return _response(
            request,
            {
                "topics": [
                    {
                        "name": t.name,
                        "partitions": [
                            {"partition_index": p.partition_index, "error_code": denied}
                            for p in t.partitions
                        ],
                    }
                    for t in request.topics
                ]
            },
        )
    for ti, topic in enumerate(request.topics):
        topic_ok = authorized(ctx, AclOperation.READ, ResourceType.TOPIC, str(topic.name))
        for p in topic.partitions:
            if not topic_ok:
                slots.append((ti, p.partition_index, ErrorCode.topic_authorization_failed))
                continue
            if not _partition_exists(ctx, topic.name, p.partition_index):
                slots.append((ti, p.partition_index, ErrorCode.unknown_topic_or_partition))
                continue
            commits.append(
                CommitRequest(
                    topic=str(topic.name),
                    partition=int(p.partition_index),
                    offset=int(p.committed_offset),
                    leader_epoch=int(getattr(p, "committed_leader_epoch", -1)),
                    metadata=p.committed_metadata,
                )
            )
            slots.append((ti, p.partition_index, None))
    retention = getattr(request, "retention_time", None)
    errors = iter(
        _coordinator(ctx).commit_offsets(
            str(request.group_id),
            generation_id=int(request.generation_id_or_member_epoch),
            member_id=request.member_id,
            group_instance_id=getattr(request, "group_instance_id", None),
            offsets=commits,
            retention_ms=_ms(retention) if retention is not None else -1,
        )
    )
    topics: list[dict[str, Any]] = [{"name": t.name, "partitions": []} for t in request.topics]
    for ti, partition, error in slots:
        topics[ti]["partitions"].append(
            {
                "partition_index": partition,
                "error_code": error if error is not None else next(errors),
            }
        )
    return _response(request, {"topics": topics})


def _fetch_group(
    ctx: RequestContext,
    group_id: str,
    topics: Any,
    *,
    per_partition_errors: bool,
    require_stable: bool = False,
) -> dict[str, Any]:
    wanted = None
    denied: list[tuple[str, int]] = []
    results: list[OffsetFetchResult] = []
    if topics is not None:
        wanted = [(str(t.name), int(p)) for t in topics for p in t.partition_indexes]
    if not authorized(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, group_id):
        error = ErrorCode.group_authorization_failed
        if not per_partition_errors:
            return {"group_id": group_id, "error_code": error, "topics": []}
    else:
        # Kafka: DESCRIBE on each topic; a named one the principal may not see answers
        # TOPIC_AUTHORIZATION_FAILED, and "all topics" leaves the unseen ones out.
        if wanted is not None:
            denied = [
                w
                for w in wanted
                if not authorized(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, w[0])
            ]
            wanted = [w for w in wanted if w not in denied]
        error, results = _coordinator(ctx).fetch_offsets(
            group_id, wanted, require_stable=require_stable
        )
        if topics is None:
            results = [
                r
                for r in results
                if authorized(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, r.topic)
            ]
    if error is not ErrorCode.none and per_partition_errors and wanted:
        # v1 has no group-level error: every partition carries it.
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for t, p in wanted:
            by_topic.setdefault(t, []).append(_no_offset(p, error))
        return {
            "group_id": group_id,
            "error_code": error,
            "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()],
        }
    grouped: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        grouped.setdefault(r.topic, []).append(
            {
                "partition_index": r.partition,
                "committed_offset": r.offset,
                "committed_leader_epoch": r.leader_epoch,
                "metadata": r.metadata,
                "error_code": r.error,
            }
        )
    for t, p in denied:
        grouped.setdefault(t, []).append(_no_offset(p, ErrorCode.topic_authorization_failed))
    return {
        "group_id": group_id,
        "error_code": error,
        "topics": [{"name": t, "partitions": ps} for t, ps in grouped.items()],
    }


def _no_offset(partition: int, error: ErrorCode) -> dict[str, Any]:
    """An OffsetFetch partition answered with ``error`` and no committed offset."""
    return {
        "partition_index": partition,
        "committed_offset": -1,
        "committed_leader_epoch": -1,
        "metadata": "",
        "error_code": error,
    }


def handle_offset_fetch(ctx: RequestContext, request: Any) -> Any:
    if ctx.api_version >= 8:
        return _response(
            request,
            {
                "groups": [
                    _fetch_group(
                        ctx,
                        str(g.group_id),
                        g.topics,
                        per_partition_errors=False,
                        require_stable=bool(request.require_stable),
                    )
                    for g in request.groups
                ]
            },
        )
    body = _fetch_group(
        ctx,
        str(request.group_id),
        request.topics,
        per_partition_errors=ctx.api_version < 2,
        require_stable=bool(getattr(request, "require_stable", False)),
    )
    return _response(request, body)


# --- ListGroups (16) / DescribeGroups (15) -----------------------------------------------


def handle_list_groups(ctx: RequestContext, request: Any) -> Any:
    types_filter = {t.lower() for t in getattr(request, "types_filter", ())}
    error, groups = _coordinator(ctx).list_groups(states=getattr(request, "states_filter", ()))
    # Kafka: every group with DESCRIBE on the cluster, else those the principal may DESCRIBE
    if not authorized_cluster(ctx, AclOperation.DESCRIBE):
        groups = [
            g
            for g in groups
            if authorized(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, g.group_id)
        ]
    if types_filter and "classic" not in types_filter:
        groups = []
    return _response(
        request,
        {
            "error_code": error,
            "groups": [
                {
                    "group_id": g.group_id,
                    "protocol_type": g.protocol_type,
                    "group_state": g.state,
                    "group_type": "classic",
                }
                for g in groups
            ],
        },
    )


def _describe_error(ctx: RequestContext, d: Any) -> tuple[ErrorCode, str | None]:
    """v6+ (KIP-1043): an unknown group is ``GROUP_ID_NOT_FOUND`` with Kafka's message (its
    GroupMetadataManager's), where older versions describe it as an empty ``Dead`` group.
    A group the principal may not DESCRIBE is ``GROUP_AUTHORIZATION_FAILED``, described as
    nothing (``d`` is then an empty Dead description)."""
    if not authorized(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, d.group_id):
        return ErrorCode.group_authorization_failed, None
    if ctx.api_version >= 6 and d.error == ErrorCode.none and d.state == _DEAD:
        return ErrorCode.group_id_not_found, f"Group {d.group_id} not found."
    return d.error, None


def handle_describe_groups(ctx: RequestContext, request: Any) -> Any:
    described = [
        d
        if authorized(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, d.group_id)
        else dataclasses.replace(d, state="", protocol_type="", protocol_data="", members=())
        for d in _coordinator(ctx).describe_groups(str(g) for g in request.groups)
    ]
    errors = [_describe_error(ctx, d) for d in described]
    return _response(
        request,
        {
            "groups": [
                {
                    "error_code": error,
                    "error_message": message,
                    "group_id": d.group_id,
                    "group_state": "" if message else d.state,
                    "protocol_type": d.protocol_type,
                    "protocol_data": d.protocol_data,
                    "members": [
                        {
                            "member_id": m.member_id,
                            "group_instance_id": m.group_instance_id,
                            "client_id": m.client_id,
                            "client_host": m.client_host,
                            "member_metadata": m.metadata,
                            "member_assignment": m.assignment,
                        }
                        for m in d.members
                    ],
                    "authorized_operations": authorized_operations(
                        ctx, ResourceType.GROUP, d.group_id
                    )
                    if getattr(request, "include_authorized_operations", False)
                    else -(2**31),
                }
                for d, (error, message) in zip(described, errors, strict=True)
            ]
        },
    )


# --- DeleteGroups (42) / OffsetDelete (47) ----------------------------------------------


def handle_delete_groups(ctx: RequestContext, request: Any) -> Any:
    names = [str(g) for g in request.groups_names]
    allowed = [g for g in names if authorized(ctx, AclOperation.DELETE, ResourceType.GROUP, g)]
    results = dict(_coordinator(ctx).delete_groups(allowed)) if allowed else {}
    return _response(
        request,
        {
            "results": [
                {"group_id": g, "error_code": results.get(g, ErrorCode.group_authorization_failed)}
                for g in names
            ]
        },
    )


def handle_offset_delete(ctx: RequestContext, request: Any) -> Any:
    if not authorized(ctx, AclOperation.DELETE, ResourceType.GROUP, str(request.group_id)):
        return _response(
            request, {"error_code": ErrorCode.group_authorization_failed, "topics": []}
        )
    wanted = [(str(t.name), int(p.partition_index)) for t in request.topics for p in t.partitions]
    denied = [w for w in wanted if not authorized(ctx, AclOperation.READ, ResourceType.TOPIC, w[0])]
    error, results = _coordinator(ctx).delete_offsets(
        str(request.group_id), [w for w in wanted if w not in denied]
    )
    results = [*results, *((t, p, ErrorCode.topic_authorization_failed) for t, p in denied)]
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for t, p, e in results:
        by_topic.setdefault(t, []).append({"partition_index": p, "error_code": e})
    return _response(
        request,
        {
            "error_code": error,
            "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()],
        },
    )


API_HANDLERS: dict[int, tuple[int, int, Handler]] = {
    8: (2, 9, handle_offset_commit),
    9: (1, 9, handle_offset_fetch),
    10: (0, 6, handle_find_coordinator),
    11: (0, 9, handle_join_group),
    12: (0, 4, handle_heartbeat),
    13: (0, 5, handle_leave_group),
    14: (0, 5, handle_sync_group),
    15: (0, 6, handle_describe_groups),
    16: (0, 5, handle_list_groups),
    42: (0, 2, handle_delete_groups),
    47: (0, 0, handle_offset_delete),
}
