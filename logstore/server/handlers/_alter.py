"""What AlterConfigs and IncrementalAlterConfigs share: one result per resource.

Topic resources go to the API's own ``alter_topic`` (unknown topics answered here); broker
resources are static (``INVALID_REQUEST``); any other type is ``INVALID_REQUEST``. Errors
raised by ``alter_topic`` map to Kafka codes through the one table
(:func:`~logstore.server.error_codes.error_code_for`).

Authorization (with ``authorizer.class.name``): ALTER_CONFIGS on the topic
(``TOPIC_AUTHORIZATION_FAILED``) or, for a broker, on the cluster
(``CLUSTER_AUTHORIZATION_FAILED``), before anything else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kio.schema.errors import ErrorCode

from logstore.errors import LoglakeError
from logstore.server.context import RequestContext
from logstore.server.error_codes import error_code_for
from logstore.server.handlers._util import build
from logstore.server.handlers.describe_configs import RESOURCE_BROKER, RESOURCE_TOPIC
from logstore.server.security.acls import AclOperation, ResourceType
from logstore.server.security.authorizer import authorized, authorized_cluster

__all__ = ["resource_results"]

# (topic, the resource's configs) -> (error, message); raises LoglakeError for a bad config
AlterTopic = Callable[[str, Any], tuple[ErrorCode, str | None]]


def _one(ctx: RequestContext, res: Any, alter_topic: AlterTopic) -> tuple[ErrorCode, str | None]:
    # Kafka: ALTER_CONFIGS on the topic / the cluster (for a broker), before anything else
    if res.resource_type == RESOURCE_BROKER and not authorized_cluster(
        ctx, AclOperation.ALTER_CONFIGS
    ):
        return ErrorCode.cluster_authorization_failed, None
    if res.resource_type == RESOURCE_TOPIC and not authorized(
        ctx, AclOperation.ALTER_CONFIGS, ResourceType.TOPIC, res.resource_name
    ):
        return ErrorCode.topic_authorization_failed, None
    if res.resource_type == RESOURCE_BROKER:
        return ErrorCode.invalid_request, "broker configs are static"
    if res.resource_type != RESOURCE_TOPIC:
        return ErrorCode.invalid_request, f"unsupported resource type {res.resource_type}"
    topic = res.resource_name
    if ctx.broker.partition_count(topic) is None:
        return ErrorCode.unknown_topic_or_partition, f"unknown topic {topic!r}"
    try:
        return alter_topic(topic, res.configs)
    except LoglakeError as exc:
        return error_code_for(exc), exc.message


def resource_results(
    ctx: RequestContext, mod: Any, resources: Any, alter_topic: AlterTopic
) -> tuple[Any, ...]:
    """``AlterConfigsResourceResponse`` per resource of the request, in order."""
    out = []
    for res in resources:
        error, message = _one(ctx, res, alter_topic)
        out.append(
            build(
                mod.AlterConfigsResourceResponse,
                error_code=error,
                error_message=message,
                resource_type=res.resource_type,
                resource_name=res.resource_name,
            )
        )
    return tuple(out)
