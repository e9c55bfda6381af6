"""Produce (key 0), v3-v9: append producers' record batches unchanged, offsets stamped in place.

Per partition: the ``records`` bytes (one or more v2 batches, any codec — never
decompressed) are copied once into a ``bytearray`` and given to ``Log.append``, which
validates every batch (size, magic, CRC-32C) before stamping base offsets and the leader
epoch in place (outside the CRC) and appending the bytes. Errors per partition, as Kafka:

- ``UNKNOWN_TOPIC_OR_PARTITION`` / ``INVALID_TOPIC_EXCEPTION`` (also for internal topics such
  as ``__consumer_offsets``, which only the group coordinator writes);
- ``CORRUPT_MESSAGE`` for bad CRC, torn or malformed batches; ``UNSUPPORTED_FOR_MESSAGE_FORMAT``
  for magic 0/1 message sets;
- ``MESSAGE_TOO_LARGE`` for a batch above the topic's ``max.message.bytes``
  (``message.max.bytes``);
- idempotent producers (producerId >= 0): a duplicate of one of the producer's last 5
  batches is acknowledged with its original base offset and not appended again;
  ``OUT_OF_ORDER_SEQUENCE_NUMBER`` / ``INVALID_PRODUCER_EPOCH`` otherwise
  (``logstore.storage.producer_state``);
- transactional batches: ``TRANSACTIONAL_ID_AUTHORIZATION_FAILED`` (transactions are not
  supported; InitProducerId refuses transactional ids the same way);
- ``KAFKA_STORAGE_ERROR`` when the disk fails: a full disk or an I/O error takes the
  partition offline for appends (``logstore.storage.log``; logged there, once), it stays
  readable, and it takes appends again once the disk has room. Clients retry this error.

acks: 0 (no response at all, as Kafka), 1 and -1 (all: on a single node the high watermark
moves to the log end at once, so both answer after the append); anything else
``INVALID_REQUIRED_ACKS``. After each append the partition's Fetch waiters are woken.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any, Final

from kio.schema.errors import ErrorCode

from logstore.errors import (
    CorruptRecordError,
    InvalidTopicError,
    LoglakeError,
    RecordTooLargeError,
    StorageError,
    UnsupportedMagicError,
)
from logstore.protocol.batch import iter_batches
from logstore.server.context import NO_RESPONSE, RequestContext
from logstore.server.handlers._util import ZERO_MS, build, response_module
from logstore.server.handlers.metadata import INTERNAL_TOPICS
from logstore.storage.files import validate_topic
from logstore.storage.producer_state import (
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
)

__all__ = ["API_KEY", "MAX_VERSION", "MIN_VERSION", "append_records", "handle"]

API_KEY: Final = 0
MIN_VERSION: Final = 3
MAX_VERSION: Final = 9

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
    """Validate and append one partition's batches; never raises for bad input."""
    broker = ctx.broker
    if topic in INTERNAL_TOPICS:
        # Kafka: "Cannot append to internal topic" (only the coordinator writes there).
        return _PartitionResult(
            ErrorCode.invalid_topic_exception, f"cannot produce to internal topic {topic}"
        )
    state = broker.partition(topic, partition)
    if state is None:
        try:
            validate_topic(topic)
        except InvalidTopicError as exc:
            return _PartitionResult(ErrorCode.invalid_topic_exception, exc.message)
        return _PartitionResult(ErrorCode.unknown_topic_or_partition)
    if not records:
        return _PartitionResult(ErrorCode.corrupt_message, "no record batches")
    buf = bytearray(records)
    lg = state.log
    max_bytes = lg.config.max_message_bytes
    try:
        headers = [h for _pos, h in iter_batches(buf)]
    except UnsupportedMagicError as exc:
        return _PartitionResult(ErrorCode.unsupported_for_message_format, exc.message)
    except CorruptRecordError as exc:
        return _PartitionResult(ErrorCode.corrupt_message, str(exc))
    for h in headers:
        if h.size > max_bytes:
            return _PartitionResult(
                ErrorCode.message_too_large,
                f"batch of {h.size} bytes exceeds max.message.bytes={max_bytes}",
            )
        if h.is_transactional or h.is_control:
            return _PartitionResult(
                ErrorCode.transactional_id_authorization_failed,
                "transactions are not supported by this broker",
            )
    result = _PartitionResult(ErrorCode.none)
    with state.lock:
        producers = state.producers
        try:
            dup = None
            for i, h in enumerate(headers):
                d = producers.check(
                    h.producer_id, h.producer_epoch, h.base_sequence, h.last_offset_delta
                )
                if i == 0:
                    dup = d
                elif (d is None) != (dup is None):
                    return _PartitionResult(
                        ErrorCode.out_of_order_sequence_number, "duplicate mixed with new batches"
                    )
        except OutOfOrderSequenceError as exc:
            return _PartitionResult(ErrorCode.out_of_order_sequence_number, exc.message)
        except InvalidProducerEpochError as exc:
            return _PartitionResult(ErrorCode.invalid_producer_epoch, exc.message)
        if dup is not None:
            result.base_offset = dup.first_offset
            result.log_start_offset = lg.log_start_offset
            return result
        try:
            info = lg.append(buf, leader_epoch=0, now_ms=ctx.wall_clock())
        except RecordTooLargeError as exc:
            return _PartitionResult(ErrorCode.message_too_large, exc.message)
        except UnsupportedMagicError as exc:
            return _PartitionResult(ErrorCode.unsupported_for_message_format, exc.message)
        except CorruptRecordError as exc:
            return _PartitionResult(ErrorCode.corrupt_message, str(exc))
        except StorageError as exc:
            return _PartitionResult(ErrorCode.kafka_storage_error, exc.message)
        except (OSError, LoglakeError) as exc:
            log.error("%s-%d: append failed: %s", topic, partition, exc)
            return _PartitionResult(ErrorCode.kafka_storage_error, str(exc))
        if headers[0].producer_id >= 0:
            for _pos, h in iter_batches(buf):
                producers.update(
                    h.producer_id,
                    h.producer_epoch,
                    h.base_sequence,
                    h.last_offset_delta,
                    first_offset=h.base_offset,
                    last_offset=h.last_offset,
                    max_timestamp=h.max_timestamp,
                )
        # Single replica: everything appended is committed.
        lg.high_watermark = lg.log_end_offset
        result.base_offset = info.first_offset
        result.log_append_time = (
            info.log_append_time_ms if info.log_append_time_ms is not None else -1
        )
        result.log_start_offset = lg.log_start_offset
    broker.purgatory.check_and_complete((topic, partition))
    return result


def handle(ctx: RequestContext, request: Any) -> Any:
    acks = int(request.acks)
    bad_acks = acks not in (0, 1, -1)
    mod = response_module(ctx)
    if request.transactional_id is not None:
        forced: ErrorCode | None = ErrorCode.transactional_id_authorization_failed
    elif bad_acks:
        forced = ErrorCode.invalid_required_acks
    else:
        forced = None
    topics = []
    for t in request.topic_data:
        parts = []
        for p in t.partition_data:
            if forced is not None:
                r = _PartitionResult(forced)
            else:
                r = append_records(ctx, t.name, int(p.index), p.records)
            # storage errors: the partition logged going offline, once
            if r.error not in (
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
                )
            )
        topics.append(
            build(mod.TopicProduceResponse, name=t.name, partition_responses=tuple(parts))
        )
    if acks == 0:
        return NO_RESPONSE
    return build(mod.ProduceResponse, responses=tuple(topics), throttle_time=ZERO_MS)
