"""CreatePartitions (key 37), v0-v3: raise a topic's partition count.

Per topic, as Kafka answers: ``count`` is the new total. Unknown topic:
``UNKNOWN_TOPIC_OR_PARTITION``; a count not above the current one: ``INVALID_PARTITIONS``
("Topic already has 3 partitions." / "... which is higher than the requested 2."); manual
assignments must name one new partition each, each on this node only:
``INVALID_REPLICA_ASSIGNMENT`` otherwise (the same rule as CreateTopics); a topic named twice
in one request: ``INVALID_REQUEST``. Internal topics (``__consumer_offsets``) keep their
count: the group coordinator maps a group to a partition by that count, so a change would
move every group's offsets (``INVALID_REQUEST``). ``validate_only`` checks without creating.
New partitions start empty with the topic's config (``Broker.create_partitions``).

Authorization (with ``authorizer.class.name``): ALTER on the topic, else
``TOPIC_AUTHORIZATION_FAILED``, as Kafka.
"""

from __future__ import annotations

from typing import Any, Final

from kio.schema.errors import ErrorCode

from logstore.errors import LoglakeError
from logstore.server.context import RequestContext
from logstore.server.error_codes import error_code_for
from logstore.server.handlers._util import ZERO_MS, build, response_module
from logstore.server.handlers.metadata import INTERNAL_TOPICS
from logstore.server.security.acls import AclOperation, ResourceType
from logstore.server.security.authorizer import authorized

__all__ = ["API_KEY", "MAX_VERSION", "MIN_VERSION", "handle"]

API_KEY: Final = 37
MIN_VERSION: Final = 0
MAX_VERSION: Final = 3


def _create(ctx: RequestContext, topic: Any, validate_only: bool) -> tuple[ErrorCode, str | None]:
    broker = ctx.broker
    name = topic.name
    current = broker.partition_count(name)
    if current is None:
        return ErrorCode.unknown_topic_or_partition, f"unknown topic {name!r}"
    if name in INTERNAL_TOPICS:
        return ErrorCode.invalid_request, f"the partition count of {name} cannot change"
    count = int(topic.count)
    if count < current:
        return (
            ErrorCode.invalid_partitions,
            f"Topic currently has {current} partitions, which is higher than the requested"
            f" {count}.",
        )
    if count == current:
        return ErrorCode.invalid_partitions, f"Topic already has {current} partitions."
    if topic.assignments is not None:
        if len(topic.assignments) != count - current:
            return (
                ErrorCode.invalid_replica_assignment,
                f"{len(topic.assignments)} assignments for {count - current} new partitions",
            )
        for a in topic.assignments:
            if list(a.broker_ids) != [broker.node_id]:
                return ErrorCode.invalid_replica_assignment, "only this node can hold replicas"
    if validate_only:
        return ErrorCode.none, None
    try:
        broker.create_partitions(name, count)
    except LoglakeError as exc:
        return error_code_for(exc), exc.message
    return ErrorCode.none, None


def handle(ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ctx)
    names = [t.name for t in request.topics]
    results = []
    for t in request.topics:
        error: ErrorCode
        message: str | None
        if names.count(t.name) > 1:
            error, message = ErrorCode.invalid_request, "Duplicate topic in request."
        elif not authorized(ctx, AclOperation.ALTER, ResourceType.TOPIC, t.name):
            error, message = ErrorCode.topic_authorization_failed, None  # Kafka: ALTER on it
        else:
            error, message = _create(ctx, t, bool(request.validate_only))
        results.append(
            build(
                mod.CreatePartitionsTopicResult,
                name=t.name,
                error_code=error,
                error_message=message,
            )
        )
    return build(mod.CreatePartitionsResponse, throttle_time=ZERO_MS, results=tuple(results))
