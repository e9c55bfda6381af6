"""Decompression of a batch's records stream, one call per batch (never per record).

A thin view over :func:`logstore.protocol.codecs.decompress` (gzip, snappy raw and
xerial-framed, lz4 frame, zstd): one implementation of Kafka's codecs for the broker, the
tools and the Spark decoder, with the same output bound on every path, so a decompression
bomb in a segment is refused before it is allocated on an executor.

Pure and thread-safe; raises :class:`logstore.errors.CorruptRecordError`
(``UnsupportedCodecError`` for ids 5-7).
"""

from __future__ import annotations

from logstore.protocol.batch import Codec
from logstore.protocol.codecs import MAX_DECOMPRESSED_SIZE
from logstore.protocol.codecs import decompress as _decompress

__all__ = ["CODEC_LABELS", "decompress"]

CODEC_LABELS: tuple[str, ...] = tuple(c.label for c in Codec)


def decompress(
    codec_id: int, data: memoryview, *, max_size: int = MAX_DECOMPRESSED_SIZE
) -> memoryview:
    """The decompressed records stream of a batch whose codec id is ``codec_id`` (1-4)."""
    return memoryview(_decompress(codec_id, data, max_size=max_size))
