"""Produce (key 0), v3-v11: append producers' record batches unchanged, offsets stamped in place.

Per partition: the ``records`` bytes (one or more v2 batches, any codec — never
decompressed) are copied once into a ``bytearray`` and given to the partition's
``append_as_leader`` (:mod:`logstore.storage.partition`), which owns the log's rules: batch
validation, idempotent producer state, the append, the high watermark. Its typed errors
become error codes through the one table of :mod:`logstore.server.error_codes`:

- ``CORRUPT_MESSAGE`` for bad CRC, torn or malformed batches; ``UNSUPPORTED_FOR_MESSAGE_FORMAT``
  for magic 0/1 message sets; ``MESSAGE_TOO_LARGE`` above the topic's ``max.message.bytes``;
- ``INVALID_RECORD`` for a record without a key in a compacted topic (``cleanup.policy``
  containing ``compact``), as Kafka's LogValidator: every batch of such a topic is
  decompressed and its records' key lengths read (only for compacted topics: others never
  decompress);
- idempotent producers (producerId >= 0): a retry of one of the producer's last 5 batches is
  acknowledged with its original base offset and not appended again;
  ``OUT_OF_ORDER_SEQUENCE_NUMBER`` / ``INVALID_PRODUCER_EPOCH`` otherwise;
- transactional batches (the request names its transactional id): appended by the same
  call, which opens or extends the producer's transaction in the partition; the transaction
  coordinator (``logstore.server.txn``) ends it with a marker;
- ``KAFKA_STORAGE_ERROR`` when the disk fails: a full disk or an I/O error takes the
  partition offline for appends (``logstore.storage.log``; logged there, once), it stays
  readable, and it takes appends again once the disk has room. Clients retry this error.

Authorization (with ``authorizer.class.name``), before anything else, as Kafka: a
transactional request needs WRITE on its transactional id (else every partition answers
``TRANSACTIONAL_ID_AUTHORIZATION_FAILED``), each topic WRITE (else its partitions answer
``TOPIC_AUTHORIZATION_FAILED``, whether the topic exists or not: nothing leaks).

Decided here, before the partition: ``UNKNOWN_TOPIC_OR_PARTITION`` /
``INVALID_TOPIC_EXCEPTION`` (also for internal topics such as ``__consumer_offsets``, which
only the group coordinator writes).

acks: 0 (no response at all, as Kafka), 1 and -1 (all: on a single node the high watermark
moves to the log end at once, so both answer after the append); anything else
``INVALID_REQUIRED_ACKS``. After each append the partition's Fetch waiters are woken.

Versions, as Kafka 4.0 answers them (``KafkaApis.handleProduceRequest``):

- v10 (KIP-951): a ``NOT_LEADER_OR_FOLLOWER`` partition carries ``current_leader`` and the
  response the leader's ``node_endpoints`` (tagged fields), so a client skips a Metadata
  round trip. Here that error means the partition's log was closed under the append (the
  topic was being deleted): the leader is this node at epoch 0 while the partition exists,
  and -1/-1 without an endpoint once it is gone, as Kafka's ``getCurrentLeader``.
- v11 (KIP-890 part 1): the client understands ``TRANSACTION_ABORTABLE``; to an older one
  that error is sent as ``INVALID_TXN_STATE`` (Kafka's ``AddPartitionsToTxnManager``).
  loglake does not verify transactional appends with the coordinator, which is where Kafka
  raises it, so the mapping is there for the day it does.
- v12 is transaction protocol v2, used only when the broker advertises the
  ``transaction.version`` feature, which loglake does not: not served.

Both differ from v9 only on those error paths: the appends and the success answers are the
same objects, so the hot path costs the same for every version.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any, Final

from kio.schema.errors import ErrorCode
from kio.schema.types import BrokerId
from kio.static.primitive import i32

from logstore.errors import LoglakeError
from logstore.server.context import NO_RESPONSE, RequestContext
from logstore.server.error_codes import error_code_for
from logstore.server.handlers._util import ZERO_MS, build, response_module
from logstore.server.handlers.metadata import INTERNAL_TOPICS
from logstore.server.security.acls import AclOperation, ResourceType
from logstore.server.security.authorizer import authorized
from logstore.storage.files import validate_topic

__all__ = ["API_KEY", "MAX_VERSION", "MIN_VERSION", "append_records", "handle"]

API_KEY: Final = 0
MIN_VERSION: Final = 3
MAX_VERSION: Final = 11

log = logging.getLogger("logstore.server.produce")

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


class _PartitionResult:
    __slots__ = ("base_offset", "error", "log_append_time", "log_start_offset", "message")

    def __init__(self, error: ErrorCode, message: str | None = None) -> None:
        self.error = error
        self.message = message
        self.base_offset = -1
        self.log_append_time = -1
        self.log_start_offset = -1


def append_records(
    ctx: RequestContext, topic: str, partition: int, records: bytes | None
) -> _PartitionResult:
    """Append one partition's batches; never raises for bad input (errors become codes)."""
    broker = ctx.broker
    if topic in INTERNAL_TOPICS:
        # Kafka: "Cannot append to internal topic" (only the coordinator writes there).
        return _PartitionResult(
            ErrorCode.invalid_topic_exception, f"cannot produce to internal topic {topic}"
        )
    part = broker.partition(topic, partition)
    try:
        if part is None:
            validate_topic(topic)  # InvalidTopicError for a name no topic can have
            return _PartitionResult(ErrorCode.unknown_topic_or_partition)
        buf = bytearray(records or b"")  # the one copy; offsets are stamped into it
        appended = part.append_as_leader(buf, now_ms=ctx.wall_clock())
    except LoglakeError as exc:
        return _PartitionResult(error_code_for(exc), exc.message)
    result = _PartitionResult(ErrorCode.none)
    result.base_offset = appended.first_offset
    result.log_append_time = appended.log_append_time_ms
    result.log_start_offset = appended.log_start_offset
    if not appended.duplicate:
        broker.purgatory.check_and_complete((topic, partition))
        if broker.metrics is not None:
            n = appended.last_offset - appended.first_offset + 1
            broker.metrics.produced(topic, len(buf), n)
    return result


def _current_leader(
    ctx: RequestContext, topic: str, partition: int, endpoints: dict[int, Any]
) -> Any:
    """v10+ ``current_leader`` of a ``NOT_LEADER_OR_FOLLOWER`` partition (KIP-951), adding
    this node to ``endpoints`` when it leads the partition."""
    mod = response_module(ctx)
    broker = ctx.broker
    count = broker.partition_count(topic)
    if count is None or partition >= count:
        return mod.LeaderIdAndEpoch(leader_id=BrokerId(-1), leader_epoch=i32(-1))
    node = broker.node_id
    endpoints[node] = mod.NodeEndpoint(
        node_id=BrokerId(node),
        host=broker.advertised_host,
        port=i32(broker.advertised_port),
        rack=None,
    )
    return mod.LeaderIdAndEpoch(leader_id=BrokerId(node), leader_epoch=i32(0))


def handle(ctx: RequestContext, request: Any) -> Any:
    acks = int(request.acks)
    version = ctx.api_version
    endpoints: dict[int, Any] = {}
    bad_acks = acks not in (0, 1, -1)
    mod = response_module(ctx)
    forced: ErrorCode | None = ErrorCode.invalid_required_acks if bad_acks else None
    txn_id = getattr(request, "transactional_id", None)
    if txn_id is not None and not authorized(
        ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, txn_id
    ):
        forced = ErrorCode.transactional_id_authorization_failed
    topics = []
    for t in request.topic_data:
        parts = []
        topic_forced = forced
        if topic_forced is None and not authorized(
            ctx, AclOperation.WRITE, ResourceType.TOPIC, t.name
        ):
            topic_forced = ErrorCode.topic_authorization_failed
        for p in t.partition_data:
            if topic_forced is not None:
                r = _PartitionResult(topic_forced)
            else:
                r = append_records(ctx, t.name, int(p.index), p.records)
            leader = None
            if r.error != ErrorCode.none:
                if r.error == ErrorCode.transaction_abortable and version < 11:
                    r.error = ErrorCode.invalid_txn_state
                elif r.error == ErrorCode.not_leader_or_follower and version >= 10:
                    leader = _current_leader(ctx, t.name, int(p.index), endpoints)
            # storage errors: the partition logged going offline, once
            if r.error == ErrorCode.unknown_server_error:
                log.error("produce to %s-%d failed: %s", t.name, p.index, r.message)
            elif r.error not in (
                ErrorCode.none,
                ErrorCode.unknown_topic_or_partition,
                ErrorCode.kafka_storage_error,
            ):
                log.info(
                    "produce to %s-%d rejected: %s %s",
                    t.name,
                    p.index,
                    r.error.name,
                    r.message or "",
                )
            parts.append(
                build(
                    mod.PartitionProduceResponse,
                    index=p.index,
                    error_code=r.error,
                    base_offset=r.base_offset,
                    log_append_time=None
                    if r.log_append_time < 0
                    else _EPOCH + datetime.timedelta(milliseconds=r.log_append_time),
                    log_start_offset=r.log_start_offset,
                    record_errors=(),
                    error_message=r.message,
                    **({} if leader is None else {"current_leader": leader}),
                )
            )
        topics.append(
            build(mod.TopicProduceResponse, name=t.name, partition_responses=tuple(parts))
        )
    if acks == 0:
        return NO_RESPONSE
    return build(
        mod.ProduceResponse,
        responses=tuple(topics),
        throttle_time=ZERO_MS,
        **({"node_endpoints": tuple(endpoints.values())} if endpoints else {}),
    )
