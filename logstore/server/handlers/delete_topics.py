"""DeleteTopics (key 20), v1-v6: delete topics (their logs and config overrides).

By name (v1-v5 ``topic_names``, v6 ``topics[].name``) or, v6, by topic id. Errors per topic:
``UNKNOWN_TOPIC_OR_PARTITION`` / ``UNKNOWN_TOPIC_ID``, ``TOPIC_DELETION_DISABLED`` when
``delete.topic.enable`` is false, ``INVALID_TOPIC_EXCEPTION`` for internal topics.

Authorization (with ``authorizer.class.name``): DELETE on the topic, else
``TOPIC_AUTHORIZATION_FAILED`` (a topic named by id keeps its name unsaid), as Kafka.
"""

from __future__ import annotations

from typing import Any, Final

from kio.schema.errors import ErrorCode

from logstore.errors import LoglakeError
from logstore.server.context import RequestContext
from logstore.server.handlers._util import ZERO_MS, build, response_module
from logstore.server.handlers.metadata import INTERNAL_TOPICS
from logstore.server.security.acls import AclOperation, ResourceType
from logstore.server.security.authorizer import authorized

__all__ = ["API_KEY", "MAX_VERSION", "MIN_VERSION", "handle"]

API_KEY: Final = 20
MIN_VERSION: Final = 1
MAX_VERSION: Final = 6


def handle(ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ctx)
    broker = ctx.broker
    # (name, id): the id taken now, before the deletion forgets it
    wanted: list[tuple[str | None, Any]] = []
    if hasattr(request, "topic_names"):
        wanted = [(n, broker.log_manager.topic_id(n)) for n in request.topic_names]
    else:
        for t in request.topics:
            if t.name is None and t.topic_id is not None:
                wanted.append((broker.log_manager.topic_name(t.topic_id), t.topic_id))
            else:
                wanted.append((t.name, broker.log_manager.topic_id(t.name)))
    results = []
    for wanted_name, tid in wanted:
        name = wanted_name
        error = ErrorCode.none
        message = None
        if name is None:
            error = ErrorCode.unknown_topic_id
        elif not authorized(ctx, AclOperation.DELETE, ResourceType.TOPIC, name):
            # Kafka: DELETE on the topic (by id: the name stays unsaid)
            error = ErrorCode.topic_authorization_failed
            if not hasattr(request, "topic_names") and any(
                t.name is None and t.topic_id == tid for t in request.topics
            ):
                name = None
        elif not ctx.config.get_bool("delete.topic.enable"):
            error = ErrorCode.topic_deletion_disabled
        elif name in INTERNAL_TOPICS:
            error, message = ErrorCode.invalid_topic_exception, "internal topics cannot be deleted"
        elif broker.partition_count(name) is None:
            error = ErrorCode.unknown_topic_or_partition
        else:
            try:
                broker.delete_topic(name)
            except LoglakeError as exc:
                error, message = ErrorCode.unknown_server_error, exc.message
        results.append(
            build(
                mod.DeletableTopicResult,
                name=name,
                topic_id=tid,
                error_code=error,
                error_message=message,
            )
        )
    return build(mod.DeleteTopicsResponse, throttle_time=ZERO_MS, responses=tuple(results))
