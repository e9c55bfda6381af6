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
  with ranged GETs.
- ``.indexes``: the segment's indexes one after another, each at the ``position``/``size``
  the manifest gives: offset index, time index, producer snapshot, leader-epoch entries (the
  ``leader-epoch-checkpoint`` text format, the epochs of this segment only), transaction index
  (absent, ``null`` in the manifest, when the segment has none: the plugin's rule).
- ``.rsm-manifest``: JSON, the plugin's ``SegmentManifestV1``::

      {"version": "1",
       "chunkIndex": {"type": "fixed", "originalChunkSize": C, "originalFileSize": N,
                      "transformedChunkSize": C, "finalTransformedChunkSize": last},
       "segmentIndexes": {"offset": {"position": p, "size": s}, "timestamp": ...,
                          "producerSnapshot": ..., "leaderEpoch": ..., "transaction": ...|null},
       "compression": false,
       "remoteLogSegmentMetadata": {...}}

  ``remoteLogSegmentMetadata`` is informational (the plugin writes it and never reads it
  back). Manifests with ``"compression": true`` or encryption (written by the plugin with those
  options on) are refused by :func:`parse_manifest` with a clear error: not supported yet.

Pure functions, no I/O; thread-safe.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Final

from logstore.errors import CorruptIndexError
from logstore.tier.metadata import RemoteSegment, kafka_uuid

__all__ = [
    "INDEX_TYPES",
    "ChunkIndex",
    "Manifest",
    "build_indexes",
    "build_manifest",
    "leader_epoch_bytes",
    "object_key",
    "parse_manifest",
    "segment_keys",
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
    """The fixed-size chunk index of an untransformed ``.log`` object."""

    chunk_size: int
    file_size: int

    @property
    def count(self) -> int:
        return -(-self.file_size // self.chunk_size)

    def chunk_range(self, i: int) -> tuple[int, int]:
        """``(start, length)`` of chunk ``i`` in the object."""
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


def build_manifest(
    seg: RemoteSegment, *, chunk_size: int, indexes: dict[str, dict[str, int] | None]
) -> bytes:
    """The ``.rsm-manifest`` JSON of ``seg`` (see the module docstring)."""
    size = seg.segment_size
    count = max(-(-size // chunk_size), 1)
    final = size - (count - 1) * chunk_size
    doc: dict[str, Any] = {
        "version": "1",
        "chunkIndex": {
            "type": "fixed",
            "originalChunkSize": chunk_size,
            "originalFileSize": size,
            "transformedChunkSize": chunk_size,
            "finalTransformedChunkSize": final,
        },
        "segmentIndexes": indexes,
        "compression": False,
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


def parse_manifest(data: bytes, *, path: str) -> Manifest:
    """A ``.rsm-manifest`` read back; :class:`CorruptIndexError` naming ``path`` when it is
    not one this reader supports (a version other than 1, compression, encryption, a variable
    chunk index)."""
    try:
        doc = json.loads(data)
        if doc.get("version") != "1":
            raise CorruptIndexError(f"manifest version {doc.get('version')!r}, expected '1'")
        if doc.get("compression") or doc.get("encryption"):
            raise CorruptIndexError(
                "manifest of a compressed or encrypted segment: not supported by this reader"
            )
        ci = doc["chunkIndex"]
        if ci.get("type") != "fixed":
            raise CorruptIndexError(f"chunk index type {ci.get('type')!r}, expected 'fixed'")
        chunks = ChunkIndex(int(ci["originalChunkSize"]), int(ci["originalFileSize"]))
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
    return Manifest(chunks, idx)
