"""Decompression of a batch's records stream, one call per batch (never per record).

Kafka compresses all records of a batch as one stream (attributes bits 0-2):

- 1 gzip: RFC 1952 members;
- 2 snappy: either raw snappy (librdkafka) or xerial framing (Java client, kafka-python):
  ``0x82 "SNAPPY" 0x00`` + version i32 + compatible-version i32, then ``[length i32][raw
  snappy block]...`` — both are accepted;
- 3 lz4: the LZ4 frame format (KIP-57);
- 4 zstd: a zstd frame, possibly without the content size (the Java client streams), hence
  cramjam's streaming decoder rather than ``zstandard``'s one-shot one.

Functions are pure and thread-safe; they return buffer-protocol objects and raise
:class:`logstore.errors.CorruptRecordError` (``UnsupportedCodecError`` for ids 5-7).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import cramjam

from logstore.errors import CorruptRecordError, UnsupportedCodecError

__all__ = ["CODEC_LABELS", "decompress"]

CODEC_LABELS: tuple[str, ...] = ("none", "gzip", "snappy", "lz4", "zstd")

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = 16
_I32 = struct.Struct(">i")


def _snappy(data: memoryview) -> object:
    if bytes(data[:8]) != _XERIAL_MAGIC:
        return cramjam.snappy.decompress_raw(data)
    parts: list[object] = []
    pos = _XERIAL_HEADER
    end = len(data)
    while pos < end:
        if end - pos < 4:
            raise CorruptRecordError(f"xerial snappy: torn block length at {pos}")
        (length,) = _I32.unpack_from(data, pos)
        pos += 4
        if length < 0 or pos + length > end:
            raise CorruptRecordError(f"xerial snappy: block of {length} bytes at {pos} overruns")
        parts.append(cramjam.snappy.decompress_raw(data[pos : pos + length]))
        pos += length
    return b"".join(parts)  # type: ignore[arg-type]


_DECOMPRESSORS: dict[int, Callable[[memoryview], object]] = {
    1: cramjam.gzip.decompress,
    2: _snappy,
    3: cramjam.lz4.decompress,
    4: cramjam.zstd.decompress,
}


def decompress(codec_id: int, data: memoryview) -> memoryview:
    """The decompressed records stream of a batch whose codec id is ``codec_id`` (1-4)."""
    try:
        fn = _DECOMPRESSORS[codec_id]
    except KeyError:
        raise UnsupportedCodecError(f"unknown compression codec id {codec_id}") from None
    try:
        return memoryview(fn(data))  # type: ignore[arg-type]
    except CorruptRecordError:
        raise
    except Exception as exc:  # cramjam raises its own DecompressionError / ValueError
        raise CorruptRecordError(f"{CODEC_LABELS[codec_id]} decompression failed: {exc}") from None
