"""RecordBatch v2 (magic 2) headers: read, validate, stamp, rewrite — sans-IO.

Bytes on disk and on the wire (KIP-98), big-endian, 61 bytes of header::

    offset  size  field
         0     8  baseOffset             i64  first offset of the batch
         8     4  batchLength            i32  bytes after this field (= batch size - 12)
        12     4  partitionLeaderEpoch   i32
        16     1  magic                  i8   2 (0 and 1 are the pre-KIP-98 message sets)
        17     4  crc                    u32  CRC-32C of bytes 21 .. end of batch
        21     2  attributes             i16  codec bits 0-2, timestamp type bit 3,
                                              transactional bit 4, control bit 5,
                                              delete horizon bit 6
        23     4  lastOffsetDelta        i32
        27     8  baseTimestamp          i64  (the delete horizon when bit 6 is set)
        35     8  maxTimestamp           i64
        43     8  producerId             i64
        51     2  producerEpoch          i16
        53     4  baseSequence           i32
        57     4  recordsCount           i32
        61        records (one compressed stream when a codec is set)

baseOffset and partitionLeaderEpoch lie outside the CRC so a broker can stamp them in place
without recomputing it (:func:`stamp_batch`). Everything here works on any buffer that supports
the buffer protocol (``bytes``, ``bytearray``, ``memoryview``, ``mmap``) and never copies the
batch: headers are unpacked straight from the buffer and the CRC runs over a ``memoryview``
slice. Functions are pure apart from the two that write into a caller's buffer; they hold no
state and are safe to call from any thread (the caller owns the buffer's synchronisation).
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator
from enum import IntEnum
from typing import NamedTuple

from crc32c import crc32c

from logstore.errors import CorruptRecordError, UnsupportedCodecError, UnsupportedMagicError

__all__ = [
    "ATTRIBUTES_OFFSET",
    "BASE_OFFSET_OFFSET",
    "BASE_SEQUENCE_OFFSET",
    "BASE_TIMESTAMP_OFFSET",
    "CODEC_MASK",
    "CONTROL_FLAG",
    "CRC_OFFSET",
    "DELETE_HORIZON_FLAG",
    "HEADER",
    "HEADER_SIZE",
    "LAST_OFFSET_DELTA_OFFSET",
    "LENGTH_OFFSET",
    "LOG_OVERHEAD",
    "MAGIC",
    "MAGIC_OFFSET",
    "MAX_TIMESTAMP_OFFSET",
    "NO_PARTITION_LEADER_EPOCH",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "NO_SEQUENCE",
    "NO_TIMESTAMP",
    "PARTITION_LEADER_EPOCH_OFFSET",
    "PRODUCER_EPOCH_OFFSET",
    "PRODUCER_ID_OFFSET",
    "RECORDS_COUNT_OFFSET",
    "TIMESTAMP_TYPE_FLAG",
    "TRANSACTIONAL_FLAG",
    "BatchHeader",
    "Buffer",
    "Codec",
    "TimestampType",
    "WritableBuffer",
    "compute_crc",
    "iter_batches",
    "read_header",
    "set_log_append_time",
    "stamp_batch",
    "validate_batch",
]

# What the functions read from: indexable, sized, with the buffer protocol.
Buffer = bytes | bytearray | memoryview | mmap.mmap
# What the in-place writers need.
WritableBuffer = bytearray | memoryview | mmap.mmap

HEADER = struct.Struct(
    ">"
    "q"  # baseOffset
    "i"  # batchLength: bytes after this field
    "i"  # partitionLeaderEpoch
    "b"  # magic
    "I"  # crc (CRC-32C, unsigned)
    "h"  # attributes
    "i"  # lastOffsetDelta
    "q"  # baseTimestamp
    "q"  # maxTimestamp
    "q"  # producerId
    "h"  # producerEpoch
    "i"  # baseSequence
    "i"  # recordsCount
)
HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: the part of a batch batchLength does not count
MAGIC = 2

BASE_OFFSET_OFFSET = 0
LENGTH_OFFSET = 8
PARTITION_LEADER_EPOCH_OFFSET = 12
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
LAST_OFFSET_DELTA_OFFSET = 23
BASE_TIMESTAMP_OFFSET = 27
MAX_TIMESTAMP_OFFSET = 35
PRODUCER_ID_OFFSET = 43
PRODUCER_EPOCH_OFFSET = 51
BASE_SEQUENCE_OFFSET = 53
RECORDS_COUNT_OFFSET = 57

CODEC_MASK = 0x07
TIMESTAMP_TYPE_FLAG = 0x08
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20
DELETE_HORIZON_FLAG = 0x40

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1
NO_TIMESTAMP = -1

# The smallest possible record: length, attributes, timestampDelta, offsetDelta, keyLength,
# valueLength, headerCount — one byte each. Bounds recordsCount of an uncompressed batch.
_MIN_RECORD_SIZE = 7
# The smallest magic 0 message after its size field (crc, magic, attributes, key and value
# lengths): any smaller length field is no message set of any version.
_MIN_MESSAGE_SIZE = 14

_HEADER_UNPACK = HEADER.unpack_from
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I16 = struct.Struct(">h")

assert HEADER.size == HEADER_SIZE  # a module invariant, not an input check


class Codec(IntEnum):
    """Compression codec ids of attributes bits 0-2."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @property
    def label(self) -> str:
        """``"none" | "gzip" | "snappy" | "lz4" | "zstd"`` (Kafka's ``compression.type``)."""
        return self.name.lower()

    @classmethod
    def from_id(cls, codec_id: int, *, position: int | None = None) -> Codec:
        """The codec of ``codec_id``; :class:`UnsupportedCodecError` for 5-7 and the like."""
        try:
            return cls(codec_id)
        except ValueError:
            raise UnsupportedCodecError(
                f"unknown compression codec id {codec_id} (expected 0-4)", position=position
            ) from None

    @classmethod
    def from_label(cls, label: str) -> Codec:
        """The codec named ``label`` (``"zstd"``...); :class:`UnsupportedCodecError` otherwise."""
        try:
            return cls[label.upper()]
        except KeyError:
            raise UnsupportedCodecError(
                f"unknown compression codec {label!r} (expected none, gzip, snappy, lz4, zstd)"
            ) from None


class TimestampType(IntEnum):
    """Attributes bit 3: who set the timestamps."""

    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class BatchHeader(NamedTuple):
    """The 61-byte header of one v2 batch, as values (immutable, no per-instance dict).

    Unpacked in one call from the buffer; the records are not touched. Field order is the byte
    order on disk, so ``BatchHeader(*HEADER.unpack_from(buf, pos))`` is the whole parser.
    """

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Bytes of the whole batch, header included (``batch_length + LOG_OVERHEAD``)."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def codec_id(self) -> int:
        """The raw codec bits (0-7); 5-7 name no codec."""
        return self.attributes & CODEC_MASK

    @property
    def codec(self) -> Codec:
        """The codec; :class:`UnsupportedCodecError` when the bits name none."""
        return Codec.from_id(self.attributes & CODEC_MASK)

    @property
    def timestamp_type(self) -> TimestampType:
        if self.attributes & TIMESTAMP_TYPE_FLAG:
            return TimestampType.LOG_APPEND_TIME
        return TimestampType.CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG)

    @property
    def has_delete_horizon(self) -> bool:
        """KIP-534: the cleaner stored the tombstone delete horizon in ``base_timestamp``."""
        return bool(self.attributes & DELETE_HORIZON_FLAG)

    @property
    def delete_horizon_ms(self) -> int | None:
        return self.base_timestamp if self.attributes & DELETE_HORIZON_FLAG else None

    @property
    def last_sequence(self) -> int:
        """The sequence of the last record (wraps at 2**31 like Kafka); -1 without one."""
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) & 0x7FFFFFFF


def read_header(buf: Buffer, pos: int = 0) -> BatchHeader:
    """Unpack the header of the batch at ``pos``; no copy, no CRC check.

    Raises :class:`UnsupportedMagicError` for a magic 0/1 message set (its magic byte also sits
    at ``pos + 16``, so it is recognised before its different header is misread),
    :class:`CorruptRecordError` (``position=pos``) when fewer than 61 bytes remain, the magic is
    unknown, or batchLength is smaller than a header. The rest of the batch need not be there.
    """
    # Fast path (the broker calls this per produced batch): one unpack, two comparisons.
    if pos >= 0 and len(buf) - pos >= HEADER_SIZE:
        fields = _HEADER_UNPACK(buf, pos)
        if fields[3] == MAGIC and fields[1] >= HEADER_SIZE - LOG_OVERHEAD:
            return tuple.__new__(BatchHeader, fields)
    return _read_header_checked(buf, pos)


def _read_header_checked(buf: Buffer, pos: int) -> BatchHeader:
    """:func:`read_header` one check at a time, so each failure gets its own message."""
    remaining = len(buf) - pos
    if pos < 0 or remaining <= MAGIC_OFFSET:
        raise CorruptRecordError(
            f"truncated batch header: {max(remaining, 0)} bytes left, need {HEADER_SIZE}",
            position=pos,
        )
    (length,) = _I32.unpack_from(buf, pos + LENGTH_OFFSET)
    if length < _MIN_MESSAGE_SIZE:
        # Zero fill (a preallocated or crash-extended file) lands here, not in "magic 0".
        raise CorruptRecordError(f"impossible batchLength {length}", position=pos)
    magic = buf[pos + MAGIC_OFFSET]
    if magic != MAGIC:
        if magic in (0, 1):
            raise UnsupportedMagicError(
                f"message set of magic {magic} (pre-0.11 format); only magic 2 is supported",
                position=pos,
            )
        raise CorruptRecordError(f"bad magic {magic} (expected 2)", position=pos)
    if remaining < HEADER_SIZE:
        raise CorruptRecordError(
            f"truncated batch header: {remaining} bytes left, need {HEADER_SIZE}", position=pos
        )
    header = BatchHeader(*HEADER.unpack_from(buf, pos))
    if header.batch_length < HEADER_SIZE - LOG_OVERHEAD:
        raise CorruptRecordError(
            f"impossible batchLength {header.batch_length} (at least {HEADER_SIZE - LOG_OVERHEAD})",
            position=pos,
        )
    return header


def compute_crc(buf: Buffer, pos: int, size: int) -> int:
    """CRC-32C of the batch's bytes from attributes to its end (``pos + 21 .. pos + size``).

    ``size`` is the whole batch size (``header.size``); the bytes must be present.
    """
    with memoryview(buf) as view, view[pos + ATTRIBUTES_OFFSET : pos + size] as covered:
        return int(crc32c(covered))


def validate_batch(
    buf: Buffer,
    pos: int = 0,
    *,
    max_size: int | None = None,
    exact_count: bool = False,
    verify_crc: bool = True,
) -> BatchHeader:
    """Every check a batch can pass without decompressing it; returns its header.

    Checks, each raising a :class:`CorruptRecordError` (or subclass) with ``position=pos``:
    a readable header of magic 2 (:func:`read_header`), the whole batch present, its size at
    most ``max_size`` when given, a known codec, the CRC, ``last_offset_delta >= 0``,
    ``0 <= records_count <= last_offset_delta + 1`` (compaction leaves fewer records than
    offsets, never more), and for an uncompressed batch room for that many records.

    ``exact_count=True`` adds Kafka's rule for batches straight from a producer (LogValidator):
    at least one record and ``records_count == last_offset_delta + 1``. ``verify_crc=False``
    skips only the CRC comparison (inspection tools that still want to look inside).
    """
    header = read_header(buf, pos)
    size = header.batch_length + LOG_OVERHEAD
    remaining = len(buf) - pos
    if size > remaining:
        raise CorruptRecordError(
            f"torn batch: batchLength says {size} bytes, {remaining} present", position=pos
        )
    if max_size is not None and size > max_size:
        raise CorruptRecordError(
            f"batch of {size} bytes is larger than the maximum {max_size}", position=pos
        )
    codec_id = header.attributes & CODEC_MASK
    if codec_id > Codec.ZSTD:
        Codec.from_id(codec_id, position=pos)  # raises UnsupportedCodecError
    if verify_crc and (actual := compute_crc(buf, pos, size)) != header.crc:
        raise CorruptRecordError(
            f"CRC mismatch: stored {header.crc:#010x}, computed {actual:#010x}", position=pos
        )
    count = header.records_count
    delta = header.last_offset_delta
    if delta < 0:
        raise CorruptRecordError(f"negative lastOffsetDelta {delta}", position=pos)
    if count < 0 or count > delta + 1:
        raise CorruptRecordError(
            f"recordsCount {count} does not fit lastOffsetDelta {delta}", position=pos
        )
    if codec_id == Codec.NONE and count * _MIN_RECORD_SIZE > size - HEADER_SIZE:
        raise CorruptRecordError(
            f"recordsCount {count} cannot fit in {size - HEADER_SIZE} bytes of records",
            position=pos,
        )
    if exact_count and (count == 0 or count != delta + 1):
        raise CorruptRecordError(
            f"producer batch with recordsCount {count} and lastOffsetDelta {delta} "
            f"(expected count = delta + 1 > 0)",
            position=pos,
        )
    return header


def iter_batches(
    buf: Buffer, pos: int = 0, end: int | None = None, *, allow_torn_tail: bool = False
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield ``(position, header)`` for each whole batch in ``buf[pos:end]``; headers only.

    Stops cleanly when exactly ``end`` (default ``len(buf)``) is reached. An incomplete batch
    at the end (fewer than 61 bytes, or fewer than its batchLength says) raises
    :class:`CorruptRecordError` with its position, unless ``allow_torn_tail`` — then iteration
    simply stops before it. A header that is wrong rather than short (bad magic, impossible
    batchLength) always raises. No CRC is checked (use :func:`validate_batch`).
    """
    limit = len(buf) if end is None else min(end, len(buf))
    while pos < limit:
        remaining = limit - pos
        if remaining < HEADER_SIZE:
            if remaining > MAGIC_OFFSET and buf[pos + MAGIC_OFFSET] != MAGIC:
                read_header(buf, pos)  # a wrong magic is corruption, not a torn tail: raises
            if allow_torn_tail:
                return
            raise CorruptRecordError(
                f"torn batch: {remaining} bytes left, a header needs {HEADER_SIZE}", position=pos
            )
        header = read_header(buf, pos)
        size = header.batch_length + LOG_OVERHEAD
        if size > remaining:
            if allow_torn_tail:
                return
            raise CorruptRecordError(
                f"torn batch: batchLength says {size} bytes, {remaining} present", position=pos
            )
        yield pos, header
        pos += size


def stamp_batch(
    buf: WritableBuffer, pos: int, *, base_offset: int, partition_leader_epoch: int
) -> None:
    """Write baseOffset and partitionLeaderEpoch in place; the CRC stays valid (not covered).

    ``buf`` must be writable (``bytearray``, writable ``memoryview``/``mmap``).
    """
    _I64.pack_into(buf, pos + BASE_OFFSET_OFFSET, base_offset)
    _I32.pack_into(buf, pos + PARTITION_LEADER_EPOCH_OFFSET, partition_leader_epoch)


def set_log_append_time(buf: WritableBuffer, pos: int, timestamp_ms: int) -> None:
    """Turn the batch at ``pos`` into a LogAppendTime batch in place and fix its CRC.

    Sets attributes bit 3 and maxTimestamp to ``timestamp_ms`` (baseTimestamp and record deltas
    stay: with LogAppendTime every record's timestamp is the batch's maxTimestamp, as in
    Kafka). The batch must be whole; ``buf`` writable.
    """
    header = read_header(buf, pos)
    size = header.batch_length + LOG_OVERHEAD
    if size > len(buf) - pos:
        raise CorruptRecordError(
            f"torn batch: batchLength says {size} bytes, {len(buf) - pos} present", position=pos
        )
    _I16.pack_into(buf, pos + ATTRIBUTES_OFFSET, header.attributes | TIMESTAMP_TYPE_FLAG)
    _I64.pack_into(buf, pos + MAX_TIMESTAMP_OFFSET, timestamp_ms)
    _U32.pack_into(buf, pos + CRC_OFFSET, compute_crc(buf, pos, size))
