"""ListOffsets (key 2), v1-v10: offsets by timestamp (Kafka's special values included).

Per partition, ``timestamp``: -2 earliest (log start offset), -1 latest (the high watermark
for read_uncommitted, the last stable offset for read_committed: ``Partition.fetch_limit``),
-3 the record with the largest timestamp (KIP-734, v7), otherwise the first offset whose
record timestamp is at or after it, found through the time index
(``Log.offset_for_timestamp``), counted only below the same limit as "latest" (Kafka's
``fetchOffsetForTimestamp``); none -> offset -1, timestamp -1, as Kafka answers. Unknown
partitions get ``UNKNOWN_TOPIC_OR_PARTITION``.

Tiered storage (KIP-405), as Kafka 4.x answers: -2 is the partition's log start offset, the
earliest remote segment's start on a tiered topic (``logstore.tier``); -4 earliest local
(v8+, KIP-1005): the local log start offset; -5 latest tiered (v9+): the highest tiered
offset, -1 when nothing is tiered; -6 earliest pending upload (v11, KIP-1023): the offset
after the highest tiered one (the local log start when nothing is tiered yet), -1 on a topic
without remote storage. v10 adds ``timeout_ms`` for remote lookups; timestamp lookups search
the local segments only.
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
from logstore.storage.partition import IsolationLevel

__all__ = ["API_KEY", "MAX_VERSION", "MIN_VERSION", "handle"]

API_KEY: Final = 2
MIN_VERSION: Final = 1
MAX_VERSION: Final = 11

EARLIEST: Final = -2
LATEST: Final = -1
MAX_TIMESTAMP: Final = -3
EARLIEST_LOCAL: Final = -4
LATEST_TIERED: Final = -5
EARLIEST_PENDING_UPLOAD: Final = -6


def _lookup(
    ctx: RequestContext, topic: str, partition: int, ts: int, isolation: IsolationLevel
) -> tuple[ErrorCode, int, int]:
    part = ctx.broker.partition(topic, partition)
    if part is None:
        return ErrorCode.unknown_topic_or_partition, -1, -1
    lg = part.log
    tier = (
        ctx.broker.tier if ctx.broker.tier is not None and ctx.broker.tier.is_tiered(lg) else None
    )
    if ts == EARLIEST_LOCAL or (ts == EARLIEST and tier is None):
        return ErrorCode.none, lg.log_start_offset, -1
    if ts == EARLIEST and tier is not None:
        return ErrorCode.none, tier.log_start_offset(topic, partition, lg.log_start_offset), -1
    if ts == LATEST_TIERED:
        return (
            ErrorCode.none,
            -1 if tier is None else tier.highest_tiered_offset(topic, partition),
            -1,
        )
    if ts == EARLIEST_PENDING_UPLOAD:
        if ctx.api_version < 11:  # a v11 value: Kafka refuses it in older versions
            return ErrorCode.invalid_request, -1, -1
        if tier is None:
            return ErrorCode.none, -1, -1
        tiered = tier.highest_tiered_offset(topic, partition)
        return ErrorCode.none, lg.log_start_offset if tiered < 0 else tiered + 1, -1
    if ts == LATEST:
        return ErrorCode.none, part.fetch_limit(isolation), -1
    if ts < EARLIEST_PENDING_UPLOAD:
        return ErrorCode.invalid_request, -1, -1
    try:
        found = lg.offset_for_timestamp(ts)
    except OSError:  # Kafka's KafkaStorageException: the client retries
        return ErrorCode.kafka_storage_error, -1, -1
    except LoglakeError as exc:
        return error_code_for(exc), -1, -1
    if found is None or found[0] >= part.fetch_limit(isolation):
        return ErrorCode.none, -1, -1
    return ErrorCode.none, found[0], found[1]


def handle(ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ctx)
    # v1 has no isolation_level: read_uncommitted; a value other than 0 or 1 gets the
    # stricter read_committed, as in Fetch.
    isolation = (
        IsolationLevel.READ_UNCOMMITTED
        if int(getattr(request, "isolation_level", 0)) == IsolationLevel.READ_UNCOMMITTED
        else IsolationLevel.READ_COMMITTED
    )
    topics = []
    for t in request.topics:
        parts = []
        # Kafka: DESCRIBE on the topic, else TOPIC_AUTHORIZATION_FAILED (existing or not)
        allowed = authorized(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, t.name)
        for p in t.partitions:
            if not allowed:
                error, offset, ts = ErrorCode.topic_authorization_failed, -1, -1
            else:
                error, offset, ts = _lookup(
                    ctx, t.name, int(p.partition_index), int(p.timestamp), isolation
                )
            parts.append(
                build(
                    mod.ListOffsetsPartitionResponse,
                    partition_index=p.partition_index,
                    error_code=error,
                    timestamp=ts,
                    offset=offset,
                    leader_epoch=0 if error == ErrorCode.none and offset >= 0 else -1,
                )
            )
        topics.append(build(mod.ListOffsetsTopicResponse, name=t.name, partitions=tuple(parts)))
    return build(mod.ListOffsetsResponse, throttle_time=ZERO_MS, topics=tuple(topics))
