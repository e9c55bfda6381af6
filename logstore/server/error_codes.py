"""The one table from loglake's typed errors to Kafka error codes.

Handlers never raise an error code and never pick one per ``except`` clause: they catch
:class:`~logstore.errors.LoglakeError` and answer :func:`error_code_for` of it. An exception
maps to the code of its nearest class in the table (a subclass may have its own code:
``RecordTooLargeError`` is a ``CorruptRecordError``); an unmapped error is a broker bug and
maps to ``UNKNOWN_SERVER_ERROR``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from kio.schema.errors import ErrorCode

from logstore.errors import (
    CorruptRecordError,
    InvalidConfigError,
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidTimestampError,
    InvalidTopicError,
    InvalidTxnStateError,
    LogClosedError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    RecordTooLargeError,
    StorageError,
    TransactionCoordinatorFencedError,
    UnsupportedMagicError,
)
from logstore.server.topics import TopicExistsError

__all__ = ["ERROR_CODES", "error_code_for"]

ERROR_CODES: Final[Mapping[type[BaseException], ErrorCode]] = MappingProxyType(
    {
        CorruptRecordError: ErrorCode.corrupt_message,
        UnsupportedMagicError: ErrorCode.unsupported_for_message_format,
        RecordTooLargeError: ErrorCode.message_too_large,
        InvalidRecordError: ErrorCode.invalid_record,
        InvalidTimestampError: ErrorCode.invalid_timestamp,
        OutOfOrderSequenceError: ErrorCode.out_of_order_sequence_number,
        InvalidProducerEpochError: ErrorCode.invalid_producer_epoch,
        InvalidTxnStateError: ErrorCode.invalid_txn_state,
        TransactionCoordinatorFencedError: ErrorCode.transaction_coordinator_fenced,
        # LogOfflineError is a StorageError: clients retry it (the disk may get room again)
        StorageError: ErrorCode.kafka_storage_error,
        LogClosedError: ErrorCode.not_leader_or_follower,
        OffsetOutOfRangeError: ErrorCode.offset_out_of_range,
        InvalidTopicError: ErrorCode.invalid_topic_exception,
        TopicExistsError: ErrorCode.topic_already_exists,
        InvalidConfigError: ErrorCode.invalid_config,
    }
)


def error_code_for(exc: BaseException) -> ErrorCode:
    """The Kafka error code of ``exc``: its nearest class in :data:`ERROR_CODES`."""
    for cls in type(exc).__mro__:
        code = ERROR_CODES.get(cls)
        if code is not None:
            return code
    return ErrorCode.unknown_server_error
