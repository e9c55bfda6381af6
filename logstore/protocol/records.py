"""Records inside a v2 batch: the reference decoder and the batch builder.

Bytes of one record (after decompression of the records section), KIP-98::

    length          varint   bytes of the rest of this record
    attributes      i8       unused (0)
    timestampDelta  varlong  timestamp - batch baseTimestamp
    offsetDelta     varint   offset - batch baseOffset
    keyLength       varint   -1 = null key
    key             bytes
    valueLength     varint   -1 = null value (a tombstone)
    value           bytes
    headerCount     varint
    headers         headerKeyLength varint (>= 0) + UTF-8 key, headerValueLength varint
                    (-1 = null) + value, headerCount times

This module favours clarity over speed: one Python object per record. The broker never calls
it on its hot path (it moves batches as bytes); the vectorised decoder lives in
``pipelines/decode``. Every malformed input raises :class:`CorruptRecordError` (or a subclass)
with the batch position. Pure functions; safe from any thread.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from logstore.errors import CorruptRecordError, LoglakeError
from logstore.protocol.batch import (
    CODEC_MASK,
    CONTROL_FLAG,
    DELETE_HORIZON_FLAG,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    NO_TIMESTAMP,
    TIMESTAMP_TYPE_FLAG,
    TRANSACTIONAL_FLAG,
    BatchHeader,
    Buffer,
    Codec,
    TimestampType,
    compute_crc,
    validate_batch,
)
from logstore.protocol.codecs import MAX_DECOMPRESSED_SIZE, compress, decompress
from logstore.protocol.varint import (
    decode_varint,
    decode_varlong,
    encode_varint,
    encode_varlong,
)

__all__ = [
    "Header",
    "Record",
    "RecordLike",
    "build_batch",
    "decode_batch",
    "decode_records",
    "encode_record",
    "first_keyless_record",
    "first_record_at_time",
]

Header = tuple[str, bytes | None]

_CRC_OFFSET = 17


@dataclass(frozen=True, slots=True)
class Record:
    """One decoded record (reference form). ``timestamp`` is absolute, ``offset`` too."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    attributes: int = 0


# What build_batch takes: a Record, (key, value) or (key, value, headers, timestamp).
RecordLike = (
    Record
    | tuple[bytes | None, bytes | None]
    | tuple[bytes | None, bytes | None, Sequence[Header], int | None]
)


def decode_batch(
    buf: Buffer,
    pos: int = 0,
    *,
    max_decompressed_size: int = MAX_DECOMPRESSED_SIZE,
    verify_crc: bool = True,
) -> tuple[BatchHeader, list[Record]]:
    """Validate the batch at ``pos`` (CRC included), decompress it and decode every record.

    ``verify_crc=False`` skips only the CRC comparison (for inspection tools that show the
    records of a batch whose CRC fails); every other check still applies.

    With LogAppendTime every record's timestamp is the batch's maxTimestamp (Kafka's rule);
    otherwise baseTimestamp + timestampDelta. Raises :class:`CorruptRecordError` (subclasses for
    magic and codec) with ``position=pos``.
    """
    header = validate_batch(buf, pos, verify_crc=verify_crc)
    data = _records_section(buf, pos, header, max_decompressed_size)
    return header, decode_records(data, header, position=pos)


def _records_section(buf: Buffer, pos: int, header: BatchHeader, max_size: int) -> bytes:
    """The records section of the (validated) batch at ``pos``, decompressed when it has a
    codec; codec errors re-raised with ``position=pos``."""
    with memoryview(buf) as view:
        section = view[pos + HEADER_SIZE : pos + header.size]
        try:
            codec = header.attributes & CODEC_MASK
            return decompress(codec, section, max_size=max_size) if codec else bytes(section)
        except LoglakeError as exc:
            raise type(exc)(exc.message, position=pos) from exc
        finally:
            section.release()


def decode_records(data: Buffer, header: BatchHeader, *, position: int = 0) -> list[Record]:
    """Decode ``header.records_count`` records from an uncompressed records section.

    The section must be consumed exactly; offset deltas must increase and stay within
    ``header.last_offset_delta``. ``position`` is only used in error messages.
    """
    records: list[Record] = []
    log_append = bool(header.attributes & TIMESTAMP_TYPE_FLAG)
    end = len(data)
    p = 0
    previous_delta = -1
    try:
        for index in range(header.records_count):
            length, p = decode_varint(data, p)
            if length < 6 or p + length > end:  # attrs + 5 one-byte varints at least
                raise CorruptRecordError(
                    f"record {index}: length {length} with {end - p} bytes left"
                )
            record_end = p + length
            attributes = data[p]
            ts_delta, q = decode_varlong(data, p + 1)
            offset_delta, q = decode_varint(data, q)
            if not previous_delta < offset_delta <= header.last_offset_delta:
                raise CorruptRecordError(
                    f"record {index}: offsetDelta {offset_delta} after {previous_delta}, "
                    f"lastOffsetDelta {header.last_offset_delta}"
                )
            previous_delta = offset_delta
            key, q = _read_bytes(data, q, record_end, index, "key")
            value, q = _read_bytes(data, q, record_end, index, "value")
            count, q = decode_varint(data, q)
            if count < 0 or count > record_end - q:
                raise CorruptRecordError(f"record {index}: header count {count}")
            headers: list[Header] = []
            for _ in range(count):
                raw_key, q = _read_bytes(data, q, record_end, index, "header key")
                if raw_key is None:
                    raise CorruptRecordError(f"record {index}: null header key")
                try:
                    header_key = raw_key.decode("utf-8")
                except UnicodeDecodeError:
                    raise CorruptRecordError(f"record {index}: header key is not UTF-8") from None
                header_value, q = _read_bytes(data, q, record_end, index, "header value")
                headers.append((header_key, header_value))
            if q != record_end:
                raise CorruptRecordError(
                    f"record {index}: {record_end - q} bytes left over inside its length"
                )
            p = record_end
            timestamp = header.max_timestamp if log_append else header.base_timestamp + ts_delta
            records.append(
                Record(
                    offset=header.base_offset + offset_delta,
                    timestamp=timestamp,
                    key=key,
                    value=value,
                    headers=tuple(headers),
                    attributes=attributes if attributes < 128 else attributes - 256,
                )
            )
        if p != end:
            raise CorruptRecordError(
                f"{end - p} bytes left after {header.records_count} records (recordsCount wrong)"
            )
    except CorruptRecordError as exc:
        where = "" if exc.position is None else f" (byte {exc.position} of the records)"
        raise CorruptRecordError(exc.message + where, position=position) from None
    return records


def first_keyless_record(
    buf: Buffer,
    pos: int = 0,
    *,
    max_decompressed_size: int = MAX_DECOMPRESSED_SIZE,
) -> int | None:
    """Index of the first record with a null key in the batch at ``pos``, or None.

    For compacted topics, which refuse keyless records at produce time (Kafka's LogValidator).
    Validates the batch (CRC included), decompresses it when it has a codec and walks each
    record only up to its key length: no record objects, no key or value copies. Raises
    :class:`CorruptRecordError` (``position=pos``) for a malformed batch or records section.
    """
    header = validate_batch(buf, pos)
    data = _records_section(buf, pos, header, max_decompressed_size)
    return _walk_keys(data, header.records_count, pos)


def first_record_at_time(
    buf: Buffer,
    pos: int = 0,
    *,
    timestamp: int,
    min_offset: int = -1,
    exact: bool = False,
) -> tuple[int, int] | None:
    """``(offset, timestamp)`` of the first record of the batch at ``pos`` whose timestamp is
    >= ``timestamp`` (== with ``exact``) and whose offset is >= ``min_offset``; None when no
    record qualifies.

    The one decode behind ListOffsets by timestamp (the local log and remote segments):
    ``exact`` finds the record carrying a batch's max timestamp (Kafka's
    ``RecordBatch.offsetOfMaxTimestamp``), where a batch whose header understates its
    records' timestamps must not answer with a larger one. Decodes the whole batch
    (:func:`decode_batch`: CRC checked, one object per record): callers pick the batch first
    from its header, so this runs once or twice per lookup, never on a fetch path. Raises
    :class:`CorruptRecordError` (``position=pos``) for a malformed batch.
    """
    _, records = decode_batch(buf, pos)
    for rec in records:
        ts = rec.timestamp
        if (ts == timestamp if exact else ts >= timestamp) and rec.offset >= min_offset:
            return rec.offset, ts
    return None


def _walk_keys(data: bytes, count: int, pos: int) -> int | None:
    """The key-length walk of :func:`first_keyless_record` (one tight loop: ~1 us a record)."""
    end = len(data)
    p = 0
    try:
        for index in range(count):
            raw = data[p]
            if raw < 0x80:  # the record's length: zigzag varint of one or two bytes, mostly
                q = p + 1
            elif data[p + 1] < 0x80:
                raw = (raw & 0x7F) | (data[p + 1] << 7)
                q = p + 2
            else:
                raw, q = -1, p
            if raw >= 0:
                length = (raw >> 1) ^ -(raw & 1)
            else:
                length, q = decode_varint(data, p)
            record_end = q + length
            if length < 6 or record_end > end:
                raise CorruptRecordError(f"record {index}: length {length} with {end - q} left")
            q += 1  # attributes
            while data[q] & 0x80:  # timestampDelta
                q += 1
            q += 1
            while data[q] & 0x80:  # offsetDelta
                q += 1
            q += 1
            if q >= record_end:
                raise CorruptRecordError(f"record {index}: no key length inside its length")
            first = data[q]
            if first == 1:  # zigzag varint of -1: a null key
                return index
            if first & 0x80 and decode_varint(data, q)[0] == -1:  # non-minimal encoding
                return index
            p = record_end
    except IndexError:
        raise CorruptRecordError("records section ends inside a record", position=pos) from None
    except CorruptRecordError as exc:
        raise CorruptRecordError(exc.message, position=pos) from None
    return None


def _read_bytes(
    data: Buffer, pos: int, record_end: int, index: int, what: str
) -> tuple[bytes | None, int]:
    length, pos = decode_varint(data, pos)
    if length == -1:
        return None, pos
    if length < -1 or pos + length > record_end:
        raise CorruptRecordError(
            f"record {index}: {what} length {length} with {record_end - pos} bytes left"
        )
    return bytes(data[pos : pos + length]), pos + length


def encode_record(
    *,
    offset_delta: int,
    timestamp_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: Iterable[Header] = (),
    attributes: int = 0,
) -> bytes:
    """The bytes of one record, length prefix included."""
    body = bytearray(struct.pack(">b", attributes))
    body += encode_varlong(timestamp_delta)
    body += encode_varint(offset_delta)
    _write_bytes(body, key)
    _write_bytes(body, value)
    header_list = list(headers)
    body += encode_varint(len(header_list))
    for header_key, header_value in header_list:
        _write_bytes(body, header_key.encode("utf-8"))
        _write_bytes(body, header_value)
    return encode_varint(len(body)) + bytes(body)


def _write_bytes(out: bytearray, data: bytes | None) -> None:
    if data is None:
        out += encode_varint(-1)
    else:
        out += encode_varint(len(data))
        out += data


def _normalise(
    item: object, index: int
) -> tuple[int | None, bytes | None, bytes | None, tuple[Header, ...], int | None, int]:
    """(offset, key, value, headers, timestamp, attributes) of a Record or a tuple."""
    if isinstance(item, Record):
        return item.offset, item.key, item.value, item.headers, item.timestamp, item.attributes
    if isinstance(item, tuple) and len(item) in (2, 4):
        key, value = item[0], item[1]
        headers: tuple[Header, ...] = ()
        timestamp: int | None = None
        if len(item) == 4:
            headers = tuple((str(k), None if v is None else bytes(v)) for k, v in item[2])
            timestamp = item[3]
        return (
            None,
            None if key is None else bytes(key),
            None if value is None else bytes(value),
            headers,
            timestamp,
            0,
        )
    raise TypeError(
        f"record {index}: expected Record, (key, value) or (key, value, headers, timestamp), "
        f"got {type(item).__name__}"
    )


def build_batch(
    records: Iterable[RecordLike],
    *,
    base_offset: int = 0,
    codec: Codec | int = Codec.NONE,
    base_timestamp: int | None = None,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    is_transactional: bool = False,
    is_control: bool = False,
    partition_leader_epoch: int = 0,
    keep_offsets: bool = False,
    last_offset_delta: int | None = None,
    delete_horizon_ms: int | None = None,
) -> bytearray:
    """One v2 batch holding ``records``, CRC set, ready to send or append.

    ``records`` are :class:`Record` objects or ``(key, value)`` / ``(key, value, headers,
    timestamp)`` tuples. Offset deltas follow their order (0, 1, 2 ...) unless
    ``keep_offsets`` — then each :class:`Record`'s ``offset - base_offset`` is its delta
    (increasing; gaps allowed, as the log cleaner leaves them). ``last_offset_delta`` defaults
    to the last record's delta (0 for an empty batch, which only the cleaner writes).

    Timestamps: a record without one (``None``) gets the batch's base timestamp; the base
    timestamp defaults to the first record's timestamp (Kafka's builder), or to
    ``delete_horizon_ms`` when that is given (KIP-534, which also sets attributes bit 6);
    maxTimestamp is the largest record timestamp (-1 for an empty batch).
    """
    items = [_normalise(item, i) for i, item in enumerate(records)]
    codec_id = Codec.from_id(int(codec))
    if delete_horizon_ms is not None:
        base_timestamp = delete_horizon_ms
    if base_timestamp is None:
        first = next((ts for _, _, _, _, ts, _ in items if ts is not None), None)
        base_timestamp = NO_TIMESTAMP if first is None else first

    section = bytearray()
    max_timestamp = NO_TIMESTAMP
    delta = -1
    for index, (offset, key, value, headers, timestamp, attributes) in enumerate(items):
        if keep_offsets:
            if offset is None:
                raise TypeError(f"record {index}: keep_offsets needs Record objects")
            new_delta = offset - base_offset
            if new_delta <= delta:
                raise ValueError(f"record {index}: offset {offset} does not increase")
            delta = new_delta
        else:
            delta = index
        ts = base_timestamp if timestamp is None else timestamp
        max_timestamp = ts if index == 0 else max(max_timestamp, ts)
        section += encode_record(
            offset_delta=delta,
            timestamp_delta=ts - base_timestamp,
            key=key,
            value=value,
            headers=headers,
            attributes=attributes,
        )
    if last_offset_delta is None:
        last_offset_delta = max(delta, 0)
    elif last_offset_delta < delta:
        raise ValueError(f"last_offset_delta {last_offset_delta} below the last record's {delta}")

    attributes = int(codec_id)
    if timestamp_type == TimestampType.LOG_APPEND_TIME:
        attributes |= TIMESTAMP_TYPE_FLAG
    if is_transactional:
        attributes |= TRANSACTIONAL_FLAG
    if is_control:
        attributes |= CONTROL_FLAG
    if delete_horizon_ms is not None:
        attributes |= DELETE_HORIZON_FLAG
    payload = compress(codec_id, section) if codec_id is not Codec.NONE else bytes(section)

    size = HEADER_SIZE + len(payload)
    out = bytearray(size)
    HEADER.pack_into(
        out,
        0,
        base_offset,
        size - LOG_OVERHEAD,
        partition_leader_epoch,
        MAGIC,
        0,  # crc, set below
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        len(items),
    )
    out[HEADER_SIZE:] = payload
    struct.pack_into(">I", out, _CRC_OFFSET, compute_crc(out, 0, size))
    return out
