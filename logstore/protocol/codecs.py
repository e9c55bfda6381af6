"""Compression codecs of RecordBatch v2: the records section as one compressed stream.

=========  ====================================================================================
codec      bytes
=========  ====================================================================================
gzip       RFC 1952 gzip (one member from Java and librdkafka; several members are accepted)
snappy     two framings seen in the wild, both accepted on read: xerial (Java producer,
           kafka-python: ``82 'SNAPPY' 00``, i32 version, i32 compatible version, then blocks of
           [i32 length][raw snappy block]) and raw snappy (librdkafka). We write xerial.
lz4        LZ4 frame format (KIP-57: the v2 format carries a correct header checksum)
zstd       Zstandard frame(s)
=========  ====================================================================================

Decompression is bounded by ``max_size`` (default :data:`MAX_DECOMPRESSED_SIZE`) so that a
small malicious batch (a "zip bomb") cannot exhaust memory. Every failure of the underlying
library becomes :class:`CorruptRecordError`; an unknown codec id
:class:`UnsupportedCodecError`. Pure functions over bytes; safe from any thread.
"""

from __future__ import annotations

import struct
import zlib

import cramjam
import lz4.frame
import zstandard

from logstore.errors import CorruptRecordError, LoglakeError
from logstore.protocol.batch import Buffer, Codec

__all__ = [
    "MAX_DECOMPRESSED_SIZE",
    "XERIAL_HEADER",
    "compress",
    "decompress",
]

MAX_DECOMPRESSED_SIZE = 256 << 20

# xerial snappy-java SnappyOutputStream: magic, version 1, compatible version 1
XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024  # snappy-java's default block size
_I32 = struct.Struct(">i")
_CHUNK = 64 * 1024


def compress(codec: Codec | int, data: Buffer, *, level: int | None = None) -> bytes:
    """Compress ``data`` as the records section of a batch of ``codec``.

    ``Codec.NONE`` returns the bytes unchanged. ``level`` applies to gzip and zstd.
    """
    codec = Codec.from_id(int(codec))
    raw = bytes(data)
    if codec is Codec.NONE:
        return raw
    if codec is Codec.GZIP:
        co = zlib.compressobj(6 if level is None else level, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        return co.compress(raw) + co.flush()
    if codec is Codec.SNAPPY:
        out = bytearray(XERIAL_HEADER)
        for start in range(0, len(raw), _XERIAL_BLOCK):
            block = bytes(cramjam.snappy.compress_raw(raw[start : start + _XERIAL_BLOCK]))
            out += _I32.pack(len(block))
            out += block
        return bytes(out)
    if codec is Codec.LZ4:
        return bytes(lz4.frame.compress(raw))
    return bytes(zstandard.ZstdCompressor(level=3 if level is None else level).compress(raw))


def decompress(codec: Codec | int, data: Buffer, *, max_size: int = MAX_DECOMPRESSED_SIZE) -> bytes:
    """The uncompressed records section; at most ``max_size`` bytes.

    Raises :class:`UnsupportedCodecError` for an unknown codec id and
    :class:`CorruptRecordError` for anything the codec cannot decode, a truncated stream, or
    output larger than ``max_size``.
    """
    codec = Codec.from_id(int(codec))
    if codec is Codec.NONE:
        if len(data) > max_size:
            raise CorruptRecordError(f"records section larger than {max_size} bytes")
        return bytes(data)
    if len(data) == 0:
        raise CorruptRecordError(f"empty {codec.label} stream")
    try:
        if codec is Codec.GZIP:
            return _gunzip(data, max_size)
        if codec is Codec.SNAPPY:
            return _unsnappy(data, max_size)
        if codec is Codec.LZ4:
            return _unlz4(data, max_size)
        return _unzstd(data, max_size)
    except LoglakeError:
        raise
    except Exception as exc:  # each library has its own error types; none may escape
        raise CorruptRecordError(
            f"{codec.label} decompression failed: {type(exc).__name__}: {exc}"
        ) from exc


def _too_large(codec: str, max_size: int) -> CorruptRecordError:
    return CorruptRecordError(f"{codec} data decompresses to more than {max_size} bytes")


def _gunzip(data: Buffer, max_size: int) -> bytes:
    out = bytearray()
    rest = bytes(data)
    while rest:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        chunk = d.decompress(rest, max_size + 1 - len(out))
        out += chunk
        while not d.eof and d.unconsumed_tail:
            if len(out) > max_size:
                raise _too_large("gzip", max_size)
            out += d.decompress(d.unconsumed_tail, max_size + 1 - len(out))
        if len(out) > max_size:
            raise _too_large("gzip", max_size)
        if not d.eof:
            raise CorruptRecordError("truncated gzip stream")
        # Java's GZIPInputStream reads concatenated members too; trailing zero padding is not
        # another member.
        rest = d.unused_data
        if rest.strip(b"\x00") == b"":
            break
    return bytes(out)


def _unsnappy(data: Buffer, max_size: int) -> bytes:
    raw = memoryview(data).cast("B")
    if bytes(raw[:8]) == XERIAL_MAGIC:
        if len(raw) < 16:
            raise CorruptRecordError("truncated xerial snappy header")
        out = bytearray()
        pos = 16
        while pos < len(raw):
            if pos + 4 > len(raw):
                raise CorruptRecordError("truncated xerial snappy block length")
            (length,) = _I32.unpack_from(raw, pos)
            pos += 4
            if length < 0 or pos + length > len(raw):
                raise CorruptRecordError(f"xerial snappy block of {length} bytes is truncated")
            out += _unsnappy_raw(raw[pos : pos + length], max_size - len(out))
            pos += length
        return bytes(out)
    return _unsnappy_raw(raw, max_size)


def _unsnappy_raw(block: Buffer, max_size: int) -> bytes:
    # The raw format starts with the uncompressed length: check it before allocating.
    expected = int(cramjam.snappy.decompress_raw_len(block))
    if expected > max_size:
        raise _too_large("snappy", max_size)
    return bytes(cramjam.snappy.decompress_raw(block))


def _unlz4(data: Buffer, max_size: int) -> bytes:
    # Fast path: a frame that declares its content size (kafka-python and librdkafka do; the
    # Java client does not) is checked against the bound, then decompressed in one call, ~20x faster
    # than the streaming decompressor with an output limit.
    size = int(lz4.frame.get_frame_info(data)["content_size"])
    if size:
        if size > max_size:
            raise _too_large("lz4", max_size)
        out: bytes = lz4.frame.decompress(data)
        if len(out) != size:
            raise CorruptRecordError(f"lz4 frame declares {size} bytes, holds {len(out)}")
        return out
    d = lz4.frame.LZ4FrameDecompressor()
    chunks: list[bytes] = []
    total = 0
    pending: Buffer = data
    while not d.eof:
        chunk = d.decompress(pending, max_length=_CHUNK)
        pending = b""
        total += len(chunk)
        if total > max_size:
            raise _too_large("lz4", max_size)
        chunks.append(chunk)
        if not d.eof and d.needs_input:
            raise CorruptRecordError("truncated lz4 frame")
    return b"".join(chunks)


def _unzstd(data: Buffer, max_size: int) -> bytes:
    raw = bytes(data)
    out = bytearray()
    with zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True) as reader:
        while True:
            chunk = reader.read(min(_CHUNK, max_size + 1 - len(out)))
            if not chunk:
                break
            out += chunk
            if len(out) > max_size:
                raise _too_large("zstd", max_size)
    # The stream reader stops quietly inside a truncated frame; a second pass frame by frame
    # (it cannot produce more than the bounded first one) tells whole frames from torn ones.
    rest = raw
    while rest:
        frame = zstandard.ZstdDecompressor().decompressobj()
        frame.decompress(rest)
        if not frame.eof:
            raise CorruptRecordError("truncated zstd frame")
        rest = frame.unused_data
    return bytes(out)
