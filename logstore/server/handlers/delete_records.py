"""DeleteRecords (key 21), v0-v2: advance partitions' log start offsets.

``offset`` -1 means the high watermark. Below the current log start offset nothing changes
(the answer is the current low watermark); above the high watermark ``OFFSET_OUT_OF_RANGE``.
The partition (``Partition.delete_records_before``) deletes whole segments below the new
start offset and makes the producer state forget batches below it; its typed errors become
codes through ``logstore.server.error_codes``.

Authorization (with ``authorizer.class.name``): DELETE on the topic, else
``TOPIC_AUTHORIZATION_FAILED`` for its partitions, as Kafka.
"""

from __future__ import annotations

from typing import Any, Final

from kio.schema.errors import ErrorCode

from logstore.errors import LoglakeError
from logstore.server.context import RequestContext
from logstore.server.error_codes import error_code_for
from logstore.server.handlers._util import ZERO_MS, build, response_module
from logstore.server.security.acls import AclOperation, ResourceType
from logstore.server.security.authorizer import authorized

__all__ = ["API_KEY", "MAX_VERSION", "MIN_VERSION", "handle"]

API_KEY: Final = 21
MIN_VERSION: Final = 0
MAX_VERSION: Final = 2


def _delete(ctx: RequestContext, topic: str, partition: int, offset: int) -> tuple[ErrorCode, int]:
    part = ctx.broker.partition(topic, partition)
    if part is None:
        return ErrorCode.unknown_topic_or_partition, -1
    try:
        low = part.delete_records_before(offset)
    except LoglakeError as exc:
        return error_code_for(exc), -1
    ctx.broker.purgatory.check_and_complete((topic, partition))
    return ErrorCode.none, low


def handle(ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ctx)
    topics = []
    for t in request.topics:
        parts = []
        allowed = authorized(ctx, AclOperation.DELETE, ResourceType.TOPIC, t.name)
        for p in t.partitions:
            if not allowed:  # Kafka: DELETE on the topic
                error, low = ErrorCode.topic_authorization_failed, -1
            else:
                error, low = _delete(ctx, t.name, int(p.partition_index), int(p.offset))
            parts.append(
                build(
                    mod.DeleteRecordsPartitionResult,
                    partition_index=p.partition_index,
                    low_watermark=low,
                    error_code=error,
                )
            )
        topics.append(build(mod.DeleteRecordsTopicResult, name=t.name, partitions=tuple(parts)))
    return build(mod.DeleteRecordsResponse, throttle_time=ZERO_MS, topics=tuple(topics))
