"""Metadata (key 3), v0-v13: this broker, and topics with their partitions (all led here).

Request ``topics``: v0 empty array = every topic; v1+ null = every topic, empty = none.
Unknown topics are auto-created when ``auto.create.topics.enable`` is on and (v4+) the
request allows it; an invalid name gets ``INVALID_TOPIC_EXCEPTION``, an unknown one
``UNKNOWN_TOPIC_OR_PARTITION``. Topic ids (v10+) are the ones the log dirs keep
(``partition.metadata``, :mod:`logstore.storage.partition_metadata`). A request naming topics
by id (v12+) gets them by name, and ``UNKNOWN_TOPIC_ID`` (null name) for an id of no topic,
without auto-creation, as from Kafka (``KafkaApis.handleTopicMetadataRequest``).
Every partition has this node as leader and only replica, leader epoch 0.

Authorization (with ``authorizer.class.name``), as Kafka's: a request for every topic lists
only the topics the principal may DESCRIBE; a named topic it may not DESCRIBE answers
``TOPIC_AUTHORIZATION_FAILED`` without partitions or id, whether it exists or not; an unknown
topic is auto-created only with CREATE on the cluster or on the topic, else
``TOPIC_AUTHORIZATION_FAILED``. ``include_*_authorized_operations`` (v8+) get Kafka's bit
sets of what the principal may do (every operation without an authorizer).
"""

from __future__ import annotations

import uuid
from typing import Any, Final

from kio.schema.errors import ErrorCode

from logstore.errors import InvalidTopicError
from logstore.server.context import RequestContext
from logstore.server.handlers._util import ZERO_MS, build, response_module
from logstore.server.security.acls import CLUSTER_NAME, AclOperation, ResourceType
from logstore.server.security.authorizer import (
    authorized,
    authorized_cluster,
    authorized_operations,
)
from logstore.storage.files import validate_topic

__all__ = ["API_KEY", "MAX_VERSION", "MIN_VERSION", "handle"]

API_KEY: Final = 3
MIN_VERSION: Final = 0
MAX_VERSION: Final = 13

_ZERO_ID: Final = uuid.UUID(int=0)
INTERNAL_TOPICS: Final = frozenset({"__consumer_offsets", "__transaction_state"})


def _may(ctx: RequestContext, op: AclOperation, topic: str) -> bool:
    return authorized(ctx, op, ResourceType.TOPIC, topic)


def _may_create(ctx: RequestContext, topic: str) -> bool:
    """Auto-creation needs CREATE on the cluster or on the topic (Kafka's rule)."""
    return authorized_cluster(ctx, AclOperation.CREATE) or _may(ctx, AclOperation.CREATE, topic)


def _denied(ctx: RequestContext, name: str, topic_id: uuid.UUID | None) -> Any:
    """``TOPIC_AUTHORIZATION_FAILED`` for a topic the principal may not see (or create): no
    partitions, no id (a topic asked for by id gets its name withheld)."""
    mod = response_module(ctx)
    return build(
        mod.MetadataResponseTopic,
        error_code=ErrorCode.topic_authorization_failed,
        name=None if topic_id is not None else name,
        topic_id=topic_id if topic_id is not None else _ZERO_ID,
        is_internal=name in INTERNAL_TOPICS,
        partitions=(),
        topic_authorized_operations=-2147483648,
    )


def handle(ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ctx)
    broker = ctx.broker
    node = broker.node_id
    requested: list[str] | None
    allow_auto = getattr(request, "allow_auto_topic_creation", True)
    results = []
    by_id: dict[str, uuid.UUID] = {}
    if request.topics is None or (ctx.api_version == 0 and not request.topics):
        requested = None
    else:
        requested = [t.name for t in request.topics if t.name is not None]
        ids = {
            t.topic_id
            for t in request.topics
            if t.name is None and getattr(t, "topic_id", None) not in (None, _ZERO_ID)
        }
        if ids:
            allow_auto = False
            for tid in ids:
                name = broker.log_manager.topic_name(tid)
                if name is not None:
                    requested.append(name)
                    by_id[name] = tid
                else:
                    results.append(
                        build(
                            mod.MetadataResponseTopic,
                            error_code=ErrorCode.unknown_topic_id,
                            name=None,
                            topic_id=tid,
                            is_internal=False,
                            partitions=(),
                            topic_authorized_operations=-2147483648,
                        )
                    )
    topics = broker.topics()
    if requested is None:  # every topic: only those the principal may DESCRIBE, silently
        names = [n for n in sorted(topics) if _may(ctx, AclOperation.DESCRIBE, n)]
    else:
        names = requested
    for name in names:
        error = ErrorCode.none
        count = topics.get(name)
        if requested is not None and not _may(ctx, AclOperation.DESCRIBE, name):
            results.append(_denied(ctx, name, by_id.get(name)))
            continue
        if count is None:
            try:
                validate_topic(name)
            except InvalidTopicError:
                error = ErrorCode.invalid_topic_exception
            else:
                auto = (
                    allow_auto
                    and name not in INTERNAL_TOPICS
                    and ctx.config.get_bool("auto.create.topics.enable")
                )
                if auto and not _may_create(ctx, name):
                    results.append(_denied(ctx, name, None))
                    continue
                if auto and broker.auto_create(name):
                    count = broker.partition_count(name)
                if count is None:
                    error = ErrorCode.unknown_topic_or_partition
        partitions = tuple(
            build(
                mod.MetadataResponsePartition,
                error_code=ErrorCode.none,
                partition_index=p,
                leader_id=node,
                leader_epoch=0,
                replica_nodes=(node,),
                isr_nodes=(node,),
                offline_replicas=(),
            )
            for p in range(count or 0)
        )
        results.append(
            build(
                mod.MetadataResponseTopic,
                error_code=error,
                name=name,
                topic_id=broker.log_manager.topic_id(name) if count else None,
                is_internal=name in INTERNAL_TOPICS,
                partitions=partitions,
                topic_authorized_operations=authorized_operations(ctx, ResourceType.TOPIC, name)
                if getattr(request, "include_topic_authorized_operations", False)
                else -2147483648,
            )
        )
    brokers = (
        build(
            mod.MetadataResponseBroker,
            node_id=node,
            host=ctx.advertised[0],
            port=ctx.advertised[1],
            rack=None,
        ),
    )
    return build(
        mod.MetadataResponse,
        throttle_time=ZERO_MS,
        brokers=brokers,
        cluster_id=broker.cluster_id,
        controller_id=node,
        topics=tuple(results),
        cluster_authorized_operations=authorized_operations(ctx, ResourceType.CLUSTER, CLUSTER_NAME)
        if getattr(request, "include_cluster_authorized_operations", False)
        else -2147483648,
        error_code=ErrorCode.none,  # v13+ (KIP-1102: only REBOOTSTRAP_REQUIRED, never here)
    )
