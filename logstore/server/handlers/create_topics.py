"""CreateTopics (key 19), v2-v7: create topics with partitions and topic-level configs.

Per topic: ``INVALID_TOPIC_EXCEPTION`` for a bad name (including anything that would escape
``log.dirs``), ``TOPIC_ALREADY_EXISTS``, ``INVALID_PARTITIONS`` (< 1, or -1 = broker
default ``num.partitions``), ``INVALID_REPLICATION_FACTOR`` (anything but 1 or -1 on a
single node), ``INVALID_CONFIG`` for an unknown or bad topic config, ``INVALID_REQUEST`` for
manual replica assignments other than this node. ``validate_only`` checks without creating.
Configs are persisted under ``<log_dir>/topic-configs/<topic>.properties``.

Authorization (with ``authorizer.class.name``): CREATE on the cluster or on the topic, else
``TOPIC_AUTHORIZATION_FAILED``, as Kafka; the created topic's configs (v5+) only with
DESCRIBE_CONFIGS on it, else ``topic_config_error_code`` TOPIC_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

from typing import Any, Final

from kio.schema.errors import ErrorCode

from logstore.errors import LoglakeError
from logstore.server.context import RequestContext
from logstore.server.error_codes import error_code_for
from logstore.server.handlers._util import ZERO_MS, build, response_module
from logstore.server.handlers.describe_configs import (
    topic_config_entries,
    validate_topic_configs,
)
from logstore.server.security.acls import AclOperation, ResourceType
from logstore.server.security.authorizer import authorized, authorized_cluster
from logstore.storage.files import validate_topic

__all__ = ["API_KEY", "MAX_VERSION", "MIN_VERSION", "handle"]

API_KEY: Final = 19
MIN_VERSION: Final = 2
MAX_VERSION: Final = 7


def _create_one(
    ctx: RequestContext, topic: Any, validate_only: bool
) -> tuple[ErrorCode, str | None, int]:
    broker = ctx.broker
    name = topic.name
    try:
        validate_topic(name)
    except LoglakeError as exc:
        return error_code_for(exc), exc.message, -1
    n = int(topic.num_partitions)
    if n == -1:
        n = ctx.config.get_int("num.partitions")
    if n < 1:
        return ErrorCode.invalid_partitions, f"number of partitions must be >= 1, got {n}", -1
    if topic.assignments:
        for a in topic.assignments:
            if list(a.broker_ids) != [broker.node_id]:
                return ErrorCode.invalid_replica_assignment, "only this node can hold replicas", -1
        n = len(topic.assignments)
    elif int(topic.replication_factor) not in (-1, 1):
        return (
            ErrorCode.invalid_replication_factor,
            f"replication factor {topic.replication_factor} > 1 available broker",
            -1,
        )
    configs: dict[str, str] = {}
    for c in topic.configs:
        if c.value is not None:
            configs[c.name] = c.value
    try:
        validate_topic_configs(configs)
    except LoglakeError as exc:
        return error_code_for(exc), exc.message, -1
    if broker.partition_count(name) is not None:
        return ErrorCode.topic_already_exists, f"topic {name!r} already exists", -1
    if validate_only:
        return ErrorCode.none, None, n
    try:
        broker.create_topic(name, n, configs)
    except LoglakeError as exc:  # exists, invalid topic or config, storage...
        return error_code_for(exc), exc.message, -1
    return ErrorCode.none, None, n


def handle(ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ctx)
    results = []
    seen: set[str] = set()
    for topic in request.topics:
        message: str | None
        if topic.name in seen:
            error, message, n = ErrorCode.invalid_request, "topic listed twice", -1
        else:
            seen.add(topic.name)
            if not (
                authorized_cluster(ctx, AclOperation.CREATE)
                or authorized(ctx, AclOperation.CREATE, ResourceType.TOPIC, topic.name)
            ):
                # Kafka: CREATE on the cluster or on the topic
                error, message, n = ErrorCode.topic_authorization_failed, None, -1
            else:
                error, message, n = _create_one(ctx, topic, request.validate_only)
        configs = None
        config_error = ErrorCode.none
        if (
            error == ErrorCode.none
            and ctx.api_version >= 5
            and not authorized(ctx, AclOperation.DESCRIBE_CONFIGS, ResourceType.TOPIC, topic.name)
        ):
            # Kafka: the created topic's configs only with DESCRIBE_CONFIGS on it
            config_error = ErrorCode.topic_authorization_failed
        elif error == ErrorCode.none and ctx.api_version >= 5:
            configs = tuple(
                build(
                    mod.CreatableTopicConfigs,
                    name=e.name,
                    value=e.value,
                    read_only=False,
                    config_source=e.source,
                    is_sensitive=False,
                )
                for e in topic_config_entries(ctx.broker, topic.name, pending=request.validate_only)
            )
        results.append(
            build(
                mod.CreatableTopicResult,
                name=topic.name,
                topic_id=(
                    ctx.broker.log_manager.topic_id(topic.name) if error == ErrorCode.none else None
                ),
                error_code=error,
                error_message=message,
                topic_config_error_code=config_error,
                num_partitions=n,
                replication_factor=1 if error == ErrorCode.none else -1,
                configs=configs,
            )
        )
    return build(mod.CreateTopicsResponse, throttle_time=ZERO_MS, topics=tuple(results))
