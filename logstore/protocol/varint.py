"""Zigzag varints (Kafka's ``ByteUtils.writeVarint``/``writeVarlong``), sans-IO.

Bytes: protobuf base-128, least significant group first, high bit = more bytes follow, over
the zigzag mapping ``(n << 1) ^ (n >> 63)`` (0, -1, 1, -2 ... -> 0, 1, 2, 3 ...). A varint
holds an i32 in at most 5 bytes, a varlong an i64 in at most 10. Decoders are strict: a longer
encoding, a value that overflows its width, or running past the end of the buffer raises
:class:`CorruptRecordError` with the position where the varint starts. Pure functions; safe
from any thread.

This is the reference (one call per varint); hot paths decode whole buffers elsewhere.
"""

from __future__ import annotations

from logstore.errors import CorruptRecordError
from logstore.protocol.batch import Buffer

__all__ = [
    "INT32_MAX",
    "INT32_MIN",
    "INT64_MAX",
    "INT64_MIN",
    "decode_unsigned_varint",
    "decode_varint",
    "decode_varlong",
    "encode_unsigned_varint",
    "encode_varint",
    "encode_varlong",
    "size_of_varint",
    "size_of_varlong",
    "zigzag_decode",
    "zigzag_encode",
]

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


def zigzag_encode(value: int) -> int:
    """Signed -> unsigned: 0, -1, 1, -2 ... -> 0, 1, 2, 3 ... (any width)."""
    return (value << 1) if value >= 0 else ((-value) << 1) - 1


def zigzag_decode(raw: int) -> int:
    """Unsigned -> signed, the inverse of :func:`zigzag_encode`."""
    return (raw >> 1) ^ -(raw & 1)


def encode_unsigned_varint(value: int) -> bytes:
    """Base-128 bytes of a non-negative ``value`` (no zigzag); ``ValueError`` if negative."""
    if value < 0:
        raise ValueError(f"unsigned varint of negative value {value}")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_varint(value: int) -> bytes:
    """Zigzag varint of an i32 (1-5 bytes); ``ValueError`` outside the i32 range."""
    if not INT32_MIN <= value <= INT32_MAX:
        raise ValueError(f"varint value {value} outside the int32 range")
    return encode_unsigned_varint(zigzag_encode(value))


def encode_varlong(value: int) -> bytes:
    """Zigzag varlong of an i64 (1-10 bytes); ``ValueError`` outside the i64 range."""
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"varlong value {value} outside the int64 range")
    return encode_unsigned_varint(zigzag_encode(value))


def _size_of_unsigned(raw: int) -> int:
    return max(1, (raw.bit_length() + 6) // 7)


def size_of_varint(value: int) -> int:
    """Bytes :func:`encode_varint` writes for ``value``."""
    return _size_of_unsigned(zigzag_encode(value))


def size_of_varlong(value: int) -> int:
    """Bytes :func:`encode_varlong` writes for ``value``."""
    return _size_of_unsigned(zigzag_encode(value))


def decode_unsigned_varint(
    buf: Buffer, pos: int = 0, *, max_bytes: int = 5, bits: int = 32
) -> tuple[int, int]:
    """``(value, next_pos)`` of the unsigned varint at ``pos``.

    At most ``max_bytes`` bytes and a value below ``2**bits``; :class:`CorruptRecordError`
    (``position=pos``) otherwise or when the buffer ends first.
    """
    end = len(buf)
    result = 0
    shift = 0
    i = pos
    while True:
        if i >= end or i < 0:
            raise CorruptRecordError("varint runs past the end of the buffer", position=pos)
        byte = buf[i]
        i += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
        if i - pos >= max_bytes:
            raise CorruptRecordError(f"varint longer than {max_bytes} bytes", position=pos)
    if result >> bits:
        raise CorruptRecordError(f"varint overflows {bits} bits", position=pos)
    return result, i


def decode_varint(buf: Buffer, pos: int = 0) -> tuple[int, int]:
    """``(value, next_pos)`` of the zigzag i32 varint at ``pos`` (at most 5 bytes)."""
    raw, nxt = decode_unsigned_varint(buf, pos, max_bytes=5, bits=32)
    return (raw >> 1) ^ -(raw & 1), nxt


def decode_varlong(buf: Buffer, pos: int = 0) -> tuple[int, int]:
    """``(value, next_pos)`` of the zigzag i64 varlong at ``pos`` (at most 10 bytes)."""
    raw, nxt = decode_unsigned_varint(buf, pos, max_bytes=10, bits=64)
    return (raw >> 1) ^ -(raw & 1), nxt
