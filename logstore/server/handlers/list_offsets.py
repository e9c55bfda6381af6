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
without remote storage. A timestamp at or above 0 on a tiered partition is looked up as Kafka
does: first in the remote segments below the local log start (their time and offset indexes
from ``.indexes``, then the batches from the ``.log`` chunks), then in the local log. When no
remote segment below the local start holds a record that recent (their max timestamps, from
the metadata) the local log answers alone, on the calling thread as before; otherwise the
whole request is answered from the tier's reader pool (a :class:`Deferred`: a network or
handler thread never waits for the store). A store failure is that partition's
``KAFKA_STORAGE_ERROR`` (logged by the tier). v10's ``timeout_ms`` is not used: the store's
own retries bound the wait.

-3 (max timestamp) on a tiered partition looks at the remote segments too (Apache Kafka up to
4.x answers from the local segments only, a wrong offset once the record with the largest
timestamp is remote only; KAFKA-17552 / apache/kafka#17248 makes it look at both, as here):
the live remote segment with the largest ``max_timestamp_ms`` in the metadata (the earliest
such), when it lies wholly below the local log start and its timestamp is at least the local
log's largest, is read on the reader pool (its time and offset indexes, then the batch
carrying that timestamp: :meth:`~logstore.tier.reader.SegmentReader.offset_of_max_timestamp`);
the larger timestamp wins, on a tie the earlier offset (the remote one), as the local log
picks the first segment and batch reaching its maximum. Else the local log answers on the
calling thread, with no store read. Counted only below the same limit as "latest", as Kafka.
"""

from __future__ import annotations

from typing import Any, Final

from kio.schema.errors import ErrorCode

from logstore.errors import LoglakeError
from logstore.server.context import Deferred, RequestContext
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


def _lookup(  # noqa: PLR0917  (the request's parts)
    ctx: RequestContext,
    topic: str,
    partition: int,
    ts: int,
    isolation: IsolationLevel,
    remote: bool,
) -> tuple[ErrorCode, int, int] | None:
    """``(error, offset, timestamp)``; None when the answer needs the tier's store and
    ``remote`` is False (the caller asks again on the tier's reader pool)."""
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
    if ts == MAX_TIMESTAMP and tier is not None:
        return _max_timestamp(part, tier, topic, partition, isolation, remote)
    if tier is not None and tier.needs_remote_lookup(topic, partition, ts, lg.log_start_offset):
        if not remote:
            return None
        try:
            found = tier.offset_for_timestamp(topic, partition, ts, local_start=lg.log_start_offset)
        except LoglakeError as exc:  # logged by the tier; the client retries
            return error_code_for(exc), -1, -1
        if found is not None:
            return _answer(part, isolation, found)
    found = _local(lg, ts)
    if isinstance(found, ErrorCode):
        return found, -1, -1
    return _answer(part, isolation, found)


def _local(lg: Any, ts: int) -> tuple[int, int] | ErrorCode | None:
    """The local log's ``(offset, timestamp)`` for ``ts`` (None: none), or the error code
    its failure answers with."""
    try:
        return lg.offset_for_timestamp(ts)  # type: ignore[no-any-return]
    except OSError:  # Kafka's KafkaStorageException: the client retries
        return ErrorCode.kafka_storage_error
    except LoglakeError as exc:
        return error_code_for(exc)


def _answer(
    part: Any, isolation: IsolationLevel, found: tuple[int, int] | None
) -> tuple[ErrorCode, int, int]:
    """``found`` as the answer, or none (-1, -1) when it is absent or not yet fetchable."""
    if found is None or found[0] >= part.fetch_limit(isolation):
        return ErrorCode.none, -1, -1
    return ErrorCode.none, found[0], found[1]


def _max_timestamp(  # noqa: PLR0917  (the request's parts)
    part: Any, tier: Any, topic: str, partition: int, isolation: IsolationLevel, remote: bool
) -> tuple[ErrorCode, int, int] | None:
    """-3 on a tiered partition (module docstring): the local log's answer, or the remote
    segment's where its largest timestamp is larger (or equal: the earlier offset wins);
    None when that needs the store and ``remote`` is False."""
    lg = part.log
    found = _local(lg, MAX_TIMESTAMP)
    if isinstance(found, ErrorCode):
        return found, -1, -1
    seg = tier.max_timestamp_segment(topic, partition, lg.log_start_offset)
    if seg is not None and (found is None or seg.max_timestamp_ms >= found[1]):
        if not remote:
            return None
        try:
            theirs = tier.offset_of_max_timestamp(seg)
        except LoglakeError as exc:  # logged by the tier; the client retries
            return error_code_for(exc), -1, -1
        if theirs is not None and (found is None or theirs[1] >= found[1]):
            found = theirs
    return _answer(part, isolation, found)


def handle(ctx: RequestContext, request: Any) -> Any:
    # v1 has no isolation_level: read_uncommitted; a value other than 0 or 1 gets the
    # stricter read_committed, as in Fetch.
    isolation = (
        IsolationLevel.READ_UNCOMMITTED
        if int(getattr(request, "isolation_level", 0)) == IsolationLevel.READ_UNCOMMITTED
        else IsolationLevel.READ_COMMITTED
    )
    answers: list[list[tuple[ErrorCode, int, int] | None]] = []
    for t in request.topics:
        # Kafka: DESCRIBE on the topic, else TOPIC_AUTHORIZATION_FAILED (existing or not)
        allowed = authorized(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, t.name)
        answers.append(
            [
                _lookup(ctx, t.name, int(p.partition_index), int(p.timestamp), isolation, False)
                if allowed
                else (ErrorCode.topic_authorization_failed, -1, -1)
                for p in t.partitions
            ]
        )
    if all(a is not None for parts in answers for a in parts):
        return _response(ctx, request, answers)
    result: Deferred[Any] = Deferred()

    def remote() -> None:
        try:
            for t, parts in zip(request.topics, answers, strict=True):
                for i, p in enumerate(t.partitions):
                    if parts[i] is None:
                        parts[i] = _lookup(
                            ctx, t.name, int(p.partition_index), int(p.timestamp), isolation, True
                        )
            result.complete(_response(ctx, request, answers))
        except Exception as exc:
            result.fail(exc)

    ctx.broker.tier.submit(remote)
    return result


def _response(
    ctx: RequestContext, request: Any, answers: list[list[tuple[ErrorCode, int, int] | None]]
) -> Any:
    mod = response_module(ctx)
    topics = []
    for t, found in zip(request.topics, answers, strict=True):
        parts = []
        for p, answer in zip(t.partitions, found, strict=True):
            error, offset, ts = (
                answer if answer is not None else (ErrorCode.unknown_server_error, -1, -1)
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
