"""The exceptions of logstore: one base, one branch per kind of failure.

Messages name the file (where there is one), the expected and the actual value.
"""

from __future__ import annotations

__all__ = [
    "CorruptIndexError",
    "CorruptRecordError",
    "InvalidConfigError",
    "InvalidProducerEpochError",
    "InvalidRecordError",
    "InvalidTimestampError",
    "InvalidTopicError",
    "InvalidTxnStateError",
    "LogClosedError",
    "LogDirLockedError",
    "LogOfflineError",
    "LoglakeError",
    "ObjectNotFoundError",
    "ObjectStoreError",
    "ObjectStoreUnavailableError",
    "OffsetOutOfRangeError",
    "OutOfOrderSequenceError",
    "RecordTooLargeError",
    "StorageError",
    "TransactionCoordinatorFencedError",
    "UnsupportedCodecError",
    "UnsupportedMagicError",
]


class LoglakeError(Exception):
    """Base of every error loglake raises on purpose.

    ``path`` and ``position`` say where, when the error is about bytes in a file or buffer
    (position is a byte offset into the file or buffer); both are also in the message.
    """

    def __init__(self, message: str, *, path: str | None = None, position: int | None = None):
        where = ""
        if path is not None:
            where = f" [{path}" + (f" @ {position}" if position is not None else "") + "]"
        elif position is not None:
            where = f" [@ {position}]"
        super().__init__(message + where)
        self.message = message
        self.path = path
        self.position = position


class CorruptRecordError(LoglakeError):
    """A record batch or record is malformed: bad size, magic, CRC, offsets or encoding."""


class UnsupportedMagicError(CorruptRecordError):
    """A message set of magic 0 or 1 (pre-KIP-98 format): detected, never misread."""


class UnsupportedCodecError(CorruptRecordError):
    """The attributes name a compression codec that does not exist."""


class CorruptIndexError(LoglakeError):
    """An offset or time index fails its sanity check."""


class OffsetOutOfRangeError(LoglakeError):
    """An offset below the log start offset or above the log end offset."""


class InvalidTopicError(LoglakeError):
    """A topic name that breaks Kafka's naming rules or would escape ``log.dirs``."""


class LogDirLockedError(LoglakeError):
    """Another process holds the log directory's ``.lock``."""


class RecordTooLargeError(CorruptRecordError):
    """A batch larger than ``max.message.bytes`` (Kafka's MESSAGE_TOO_LARGE)."""


class InvalidConfigError(LoglakeError):
    """A config value that is out of range or does not parse (Kafka's INVALID_CONFIG)."""


class StorageError(LoglakeError):
    """A log directory failed an I/O operation (a full disk, an I/O error): Kafka's
    ``KafkaStorageException`` / ``KAFKA_STORAGE_ERROR``. ``errno`` is the OS error number."""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        position: int | None = None,
        errno: int | None = None,
    ):
        super().__init__(message, path=path, position=position)
        self.errno = errno


class ObjectStoreError(StorageError):
    """An object-store operation (S3, GCS, Azure, or the lake's local disk through the same
    interface) failed; ``path`` is the object's URI."""


class ObjectStoreUnavailableError(ObjectStoreError):
    """The store did not answer, or kept throttling (503 SlowDown), after bounded retries: a
    transient failure, worth retrying the whole job later."""


class ObjectNotFoundError(ObjectStoreError):
    """An object that should be there is not, e.g. deleted between a listing and a read."""


class LogOfflineError(StorageError):
    """An append to a partition that is offline for appends after a storage error."""


class LogClosedError(LoglakeError):
    """An operation on a log that was closed meanwhile: its topic was deleted, or the broker
    is shutting down (Kafka's answer: NOT_LEADER_OR_FOLLOWER, so clients refresh metadata)."""


class InvalidRecordError(LoglakeError):
    """A well-formed batch that the topic refuses (Kafka's INVALID_RECORD), e.g. a record
    without a key for a compacted topic."""


class InvalidTimestampError(LoglakeError):
    """A CreateTime batch timestamped outside the topic's window
    (``message.timestamp.before.max.ms`` / ``message.timestamp.after.max.ms``): Kafka's
    INVALID_TIMESTAMP."""


class OutOfOrderSequenceError(LoglakeError):
    """An idempotent producer's batch whose first sequence does not follow its last one."""


class InvalidProducerEpochError(LoglakeError):
    """A batch from a producer epoch older than the producer's current one (fenced)."""


class InvalidTxnStateError(LoglakeError):
    """A batch that breaks its producer's transaction state (Kafka's INVALID_TXN_STATE), e.g.
    a non-transactional batch from a producer whose transaction is still open here."""


class TransactionCoordinatorFencedError(LoglakeError):
    """A transaction marker from a coordinator epoch older than one already seen for the
    producer (Kafka's TRANSACTION_COORDINATOR_FENCED): a stale coordinator's retry."""
