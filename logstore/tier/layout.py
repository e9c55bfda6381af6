"""The object layout of the Aiven tiered-storage plugin for Apache Kafka, written and read.

A remote segment is three objects (``<prefix>`` is ``rsm.config.key.prefix``, Kafka's
``Uuid.toString`` for the ids, the start offset zero-padded to 20 digits)::

    <prefix><topic>-<topicId>/<partition>/<start offset>-<segmentId>.log
    <prefix><topic>-<topicId>/<partition>/<start offset>-<segmentId>.indexes
    <prefix><topic>-<topicId>/<partition>/<start offset>-<segmentId>.rsm-manifest

- ``.log``: the segment file's bytes, cut into chunks of ``rsm.config.chunk.size`` bytes for
  the chunk index. Without compression or encryption the chunks are stored untransformed, so
  the object is the segment file itself and chunk ``i`` is its bytes
  ``[i * chunk_size, min((i + 1) * chunk_size, size))``: a fetch reads the chunks it needs
  with ranged GETs. With the plugin's ``rsm.config.compression.enabled`` each chunk is one
  zstd frame (with its content size in the frame header, as the plugin's zstd-jni writes it)
  and the frames follow one another: the manifest's ``"variable"`` chunk index gives each
  frame's size, so a reader still GETs only the frames it needs and decompresses them
  (:func:`compress_chunk` / :func:`decompress_chunk`).
- ``.indexes``: the segment's indexes one after another, each at the ``position``/``size``
  the manifest gives: offset index, time index, producer snapshot, leader-epoch entries (the
  ``leader-epoch-checkpoint`` text format, the epochs of this segment only), transaction index
  (absent, ``null`` in the manifest, when the segment has none: the plugin's rule).
- ``.rsm-manifest``: JSON, the plugin's ``SegmentManifestV1``::

      {"version": "1",
       "chunkIndex": {"type": "fixed", "originalChunkSize": C, "originalFileSize": N,
                      "transformedChunkSize": C, "finalTransformedChunkSize": last},
       (compressed: {"type": "variable", "originalChunkSize": C, "originalFileSize": N,
                     "transformedChunks": base64(zstd(chunk sizes)), see below})
       "segmentIndexes": {"offset": {"position": p, "size": s}, "timestamp": ...,
                          "producerSnapshot": ..., "leaderEpoch": ..., "transaction": ...|null},
       "compression": false | true,
       "remoteLogSegmentMetadata": {...}}

  ``remoteLogSegmentMetadata`` is informational (the plugin writes it and never reads it
  back). ``transformedChunks`` is the plugin's ``ChunkSizesBinaryCodec`` (big-endian: count
  i32; for one value that value i32; else base i32 (the least of all but the last),
  bytes-per-value i8, each value but the last minus base in that many bytes, the last in
  full i32), zstd-compressed (content size in the frame) and base64-encoded. The indexes are
  never compressed (the plugin's rule). Manifests with encryption are refused by
  :func:`parse_manifest` with a clear error (not supported); compressed ones only when the
  caller says it decompresses chunks (``allow_compression=True``), so a reader written
  before compression cannot take zstd frames for segment bytes.

Pure functions, no I/O; thread-safe.
"""

from __future__ import annotations

import base64
import json
import struct
import uuid
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Final

import numpy as np
import zstandard

from logstore.errors import CorruptIndexError
from logstore.tier.metadata import RemoteSegment, kafka_uuid

__all__ = [
    "INDEX_TYPES",
    "ChunkIndex",
    "Manifest",
    "build_indexes",
    "build_manifest",
    "compress_chunk",
    "decode_chunk_sizes",
    "decompress_chunk",
    "encode_chunk_sizes",
    "floor_position",
    "leader_epoch_bytes",
    "object_key",
    "parse_manifest",
    "segment_keys",
    "time_floor",
]

LOG: Final = "log"
INDEXES: Final = "indexes"
MANIFEST: Final = "rsm-manifest"
INDEX_TYPES: Final = ("offset", "timestamp", "producerSnapshot", "leaderEpoch", "transaction")


def object_key(  # noqa: PLR0917  (the plugin's key parts, in its order)
    prefix: str,
    topic: str,
    topic_id: uuid.UUID,
    partition: int,
    start_offset: int,
    segment_id: uuid.UUID,
    suffix: str,
) -> str:
    """The plugin's ``ObjectKeyFactory.key``: ``<prefix><topic>-<topicId>/<partition>/
    <20-digit start offset>-<segmentId>.<suffix>``."""
    return (
        f"{prefix}{topic}-{kafka_uuid(topic_id)}/{partition}/"
        f"{start_offset:020d}-{kafka_uuid(segment_id)}.{suffix}"
    )


def segment_keys(prefix: str, seg: RemoteSegment) -> dict[str, str]:
    """``{"log": key, "indexes": key, "rsm-manifest": key}`` of a remote segment."""
    return {
        s: object_key(
            prefix, seg.topic, seg.topic_id, seg.partition, seg.start_offset, seg.segment_id, s
        )
        for s in (LOG, INDEXES, MANIFEST)
    }


def leader_epoch_bytes(entries: list[tuple[int, int]]) -> bytes:
    """Leader-epoch entries in the ``leader-epoch-checkpoint`` text format (version 0)."""
    lines = ["0", str(len(entries)), *(f"{e} {o}" for e, o in entries)]
    return ("\n".join(lines) + "\n").encode("ascii")


def build_indexes(parts: dict[str, bytes | None]) -> tuple[bytes, dict[str, dict[str, int] | None]]:
    """The ``.indexes`` object from each index's bytes (keys :data:`INDEX_TYPES`; a None or
    empty ``transaction`` is left out) and the manifest's ``segmentIndexes``."""
    blob = bytearray()
    where: dict[str, dict[str, int] | None] = {}
    for name in INDEX_TYPES:
        data = parts.get(name)
        if name == "transaction" and not data:
            where[name] = None
            continue
        data = data or b""
        where[name] = {"position": len(blob), "size": len(data)}
        blob += data
    return bytes(blob), where


@dataclass(frozen=True, slots=True)
class ChunkIndex:
    """The chunk index of a ``.log`` object: fixed (chunks stored as they are) or, with
    ``transformed`` (each chunk's size in the object, e.g. zstd frames), variable."""

    chunk_size: int
    file_size: int
    transformed: tuple[int, ...] | None = None
    _starts: tuple[int, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.transformed is not None:
            object.__setattr__(self, "_starts", tuple(accumulate(self.transformed, initial=0)))

    @property
    def count(self) -> int:
        return -(-self.file_size // self.chunk_size)

    def chunk_range(self, i: int) -> tuple[int, int]:
        """``(start, length)`` of chunk ``i`` in the object."""
        if self.transformed is not None:
            return self._starts[i], self.transformed[i]
        return self.original_range(i)

    def original_range(self, i: int) -> tuple[int, int]:
        """``(start, length)`` of chunk ``i`` in the segment file."""
        start = i * self.chunk_size
        return start, min(self.chunk_size, self.file_size - start)

    def chunks_for(self, position: int, length: int) -> range:
        """The chunks holding bytes ``[position, position + length)`` of the file."""
        end = min(position + max(length, 1), self.file_size)
        return range(position // self.chunk_size, -(-end // self.chunk_size))


@dataclass(frozen=True, slots=True)
class Manifest:
    """What a reader needs of a ``.rsm-manifest``."""

    chunks: ChunkIndex
    indexes: dict[str, tuple[int, int] | None]  # index type -> (position, size) in .indexes
    compression: bool = False  # each chunk a zstd frame (:func:`decompress_chunk`)


_COUNT = struct.Struct(">i")
_BASE = struct.Struct(">ib")
_MAX_SIZES_BYTES = 10 * 1024 * 1024  # the plugin's sanity bound on the encoded sizes


def compress_chunk(data: bytes) -> bytes:
    """One chunk as the plugin compresses it: a zstd frame with its content size."""
    return zstandard.ZstdCompressor(write_content_size=True).compress(data)


def decompress_chunk(data: bytes, *, max_size: int) -> bytes:
    """A compressed chunk back (at most ``max_size`` bytes, the chunk size);
    :class:`CorruptIndexError` when it is not one zstd frame of at most that size."""
    try:
        out = zstandard.ZstdDecompressor().decompress(data, max_output_size=max_size)
    except zstandard.ZstdError as exc:
        raise CorruptIndexError(f"compressed chunk does not decompress: {exc}") from None
    return out


def encode_chunk_sizes(values: list[int]) -> bytes:
    """The plugin's ``ChunkSizesBinaryCodec`` (see the module docstring)."""
    if any(v < 0 for v in values):
        raise ValueError("chunk sizes cannot be negative")
    if len(values) <= 1:
        return _COUNT.pack(len(values)) + b"".join(_COUNT.pack(v) for v in values)
    body = values[:-1]
    base = min(body)
    width = max(1, *(((v - base).bit_length() + 7) // 8 for v in body))
    packed = b"".join((v - base).to_bytes(4, "big")[4 - width :] for v in body)
    return _COUNT.pack(len(values)) + _BASE.pack(base, width) + packed + _COUNT.pack(values[-1])


def decode_chunk_sizes(data: bytes) -> list[int]:
    """:func:`encode_chunk_sizes` read back; ValueError when ``data`` is not one."""
    try:
        (count,) = _COUNT.unpack_from(data, 0)
        if count <= 1:
            return [_COUNT.unpack_from(data, 4)[0]] if count == 1 else []
        base, width = _BASE.unpack_from(data, 4)
        if not 1 <= width <= 4:
            raise ValueError(f"{width} bytes per chunk size")
        pos = 9
        out = [
            base + int.from_bytes(data[pos + i * width : pos + (i + 1) * width], "big")
            for i in range(count - 1)
        ]
        pos += (count - 1) * width
        out.append(_COUNT.unpack_from(data, pos)[0])
        if pos + 4 != len(data):
            raise ValueError(f"{len(data) - pos - 4} bytes after the last chunk size")
    except struct.error as exc:
        raise ValueError(f"chunk sizes end early: {exc}") from None
    return out


def _transformed_chunks(sizes: list[int]) -> str:
    return base64.b64encode(compress_chunk(encode_chunk_sizes(sizes))).decode("ascii")


def _parse_transformed_chunks(text: str) -> tuple[int, ...]:
    raw = base64.b64decode(text, validate=True)
    try:
        data = zstandard.ZstdDecompressor().decompress(raw, max_output_size=_MAX_SIZES_BYTES)
    except zstandard.ZstdError as exc:
        raise ValueError(f"transformedChunks does not decompress: {exc}") from None
    return tuple(decode_chunk_sizes(data))


def build_manifest(
    seg: RemoteSegment,
    *,
    chunk_size: int,
    indexes: dict[str, dict[str, int] | None],
    compressed_sizes: list[int] | None = None,
) -> bytes:
    """The ``.rsm-manifest`` JSON of ``seg`` (see the module docstring); ``compressed_sizes``
    (each chunk's zstd frame size) for a compressed ``.log``."""
    size = seg.segment_size
    count = max(-(-size // chunk_size), 1)
    final = size - (count - 1) * chunk_size
    chunk_index: dict[str, Any]
    if compressed_sizes is None:
        chunk_index = {
            "type": "fixed",
            "originalChunkSize": chunk_size,
            "originalFileSize": size,
            "transformedChunkSize": chunk_size,
            "finalTransformedChunkSize": final,
        }
    else:
        chunk_index = {
            "type": "variable",
            "originalChunkSize": chunk_size,
            "originalFileSize": size,
            "transformedChunks": _transformed_chunks(compressed_sizes),
        }
    doc: dict[str, Any] = {
        "version": "1",
        "chunkIndex": chunk_index,
        "segmentIndexes": indexes,
        "compression": compressed_sizes is not None,
        "remoteLogSegmentMetadata": {
            "remoteLogSegmentId": {
                "topicIdPartition": {
                    "topicId": kafka_uuid(seg.topic_id),
                    "topicPartition": {"topic": seg.topic, "partition": seg.partition},
                },
                "id": kafka_uuid(seg.segment_id),
            },
            "startOffset": seg.start_offset,
            "endOffset": seg.end_offset,
            "maxTimestampMs": seg.max_timestamp_ms,
            "brokerId": seg.broker_id,
            "eventTimestampMs": seg.event_timestamp_ms,
            "segmentLeaderEpochs": {str(e): o for e, o in seg.leader_epochs},
        },
    }
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


def parse_manifest(data: bytes, *, path: str, allow_compression: bool = False) -> Manifest:
    """A ``.rsm-manifest`` read back; :class:`CorruptIndexError` naming ``path`` when it is
    not one this reader supports (a version other than 1, encryption, compression unless
    ``allow_compression``, a chunk index that does not add up)."""
    try:
        doc = json.loads(data)
        if doc.get("version") != "1":
            raise CorruptIndexError(f"manifest version {doc.get('version')!r}, expected '1'")
        if doc.get("encryption"):
            raise CorruptIndexError(
                "manifest of an encrypted segment (rsm.config.encryption.enabled):"
                " not supported by this reader"
            )
        compression = bool(doc.get("compression"))
        if compression and not allow_compression:
            raise CorruptIndexError(
                "manifest of a compressed segment: this reader does not decompress chunks"
            )
        ci = doc["chunkIndex"]
        kind = ci.get("type")
        if kind == "fixed":
            chunks = ChunkIndex(int(ci["originalChunkSize"]), int(ci["originalFileSize"]))
            if compression:
                raise CorruptIndexError("a compressed segment with a fixed chunk index")
        elif kind == "variable":
            if not compression:
                raise CorruptIndexError(
                    "a variable chunk index without compression (encryption?): not supported"
                )
            sizes = _parse_transformed_chunks(ci["transformedChunks"])
            chunks = ChunkIndex(int(ci["originalChunkSize"]), int(ci["originalFileSize"]), sizes)
            if chunks.chunk_size > 0 and len(sizes) != max(chunks.count, 1):
                raise CorruptIndexError(
                    f"{len(sizes)} transformed chunks for {chunks.count} chunks of the file"
                )
        else:
            raise CorruptIndexError(f"chunk index type {kind!r}, expected fixed or variable")
        if chunks.chunk_size <= 0 or chunks.file_size < 0:
            raise CorruptIndexError(f"chunk index {ci} has impossible sizes")
        idx: dict[str, tuple[int, int] | None] = {}
        for name in INDEX_TYPES:
            entry = doc["segmentIndexes"].get(name)
            idx[name] = None if entry is None else (int(entry["position"]), int(entry["size"]))
    except CorruptIndexError as exc:
        raise CorruptIndexError(f"{path}: {exc}", path=path) from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptIndexError(f"{path}: not a segment manifest: {exc}", path=path) from None
    return Manifest(chunks, idx, compression)


# Kafka's index entries (big-endian): .index (relative offset i32, position i32); .timeindex
# (timestamp i64, relative offset i32). Sorted by their first field.
_OFFSET_ENTRY = np.dtype([("key", ">i4"), ("value", ">i4")])
_TIME_ENTRY = np.dtype([("key", ">i8"), ("value", ">i4")])


def _floor(index: bytes, dtype: np.dtype[Any], target: int) -> int:
    entries = np.frombuffer(index, dtype, len(index) // dtype.itemsize)
    k = int(np.searchsorted(entries["key"], target, side="right"))
    return int(entries["value"][k - 1]) if k else 0


def floor_position(index: bytes, relative: int) -> int:
    """The ``.log`` position of the greatest entry of an offset index (a remote segment's, as
    uploaded in ``.indexes``) at or below ``relative`` (an offset minus the segment's start);
    0, the segment's start, if none. One binary search over the whole buffer (numpy)."""
    return _floor(index, _OFFSET_ENTRY, relative)


def time_floor(index: bytes, timestamp: int) -> int:
    """The relative offset of the greatest entry of a time index at or below ``timestamp``; 0,
    the segment's start, if none."""
    return _floor(index, _TIME_ENTRY, timestamp)
