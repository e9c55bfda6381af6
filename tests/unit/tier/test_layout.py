"""The Aiven plugin's object layout: keys, the ``.indexes`` object and the manifest."""

from __future__ import annotations

import base64
import json
import struct
import uuid

import pytest

from logstore.errors import CorruptIndexError
from logstore.tier.layout import (
    ChunkIndex,
    build_indexes,
    build_manifest,
    compress_chunk,
    decode_chunk_sizes,
    decompress_chunk,
    encode_chunk_sizes,
    floor_position,
    leader_epoch_bytes,
    object_key,
    parse_manifest,
    time_floor,
)
from logstore.tier.metadata import RemoteSegment

# The plugin's documented example key: ObjectKeyFactory's javadoc
TOPIC_ID = uuid.UUID(bytes=base64.urlsafe_b64decode("MWJ6FHTfRYy67jzwZdeqSQ=="))
SEG_ID = uuid.UUID(bytes=base64.urlsafe_b64decode("tqimKeZwStOEOwRzT3L5oQ=="))


def test_object_key_is_the_plugins():
    key = object_key("someprefix/", "topic", TOPIC_ID, 7, 1234, SEG_ID, "log")
    want = "someprefix/topic-MWJ6FHTfRYy67jzwZdeqSQ/7/"
    want += "00000000000000001234-tqimKeZwStOEOwRzT3L5oQ.log"
    assert key == want


def test_indexes_are_concatenated_in_the_plugins_order_and_an_empty_txn_index_is_null():
    blob, where = build_indexes(
        {
            "offset": b"o" * 16,
            "timestamp": b"t" * 12,
            "producerSnapshot": b"p" * 5,
            "leaderEpoch": leader_epoch_bytes([(0, 5)]),
            "transaction": b"",
        }
    )
    assert where["offset"] == {"position": 0, "size": 16}
    assert where["timestamp"] == {"position": 16, "size": 12}
    assert where["producerSnapshot"] == {"position": 28, "size": 5}
    assert where["leaderEpoch"] == {"position": 33, "size": len(b"0\n1\n0 5\n")}
    assert where["transaction"] is None
    assert blob[33:] == b"0\n1\n0 5\n"


def _seg(size):
    return RemoteSegment(
        topic="t",
        topic_id=TOPIC_ID,
        partition=0,
        segment_id=SEG_ID,
        start_offset=0,
        end_offset=9,
        max_timestamp_ms=5,
        broker_id=0,
        event_timestamp_ms=6,
        segment_size=size,
        leader_epochs=((0, 0),),
    )


def test_manifest_is_the_plugins_v1_and_reads_back():
    _blob, where = build_indexes({"offset": b"x" * 8})
    raw = build_manifest(_seg(2500), chunk_size=1000, indexes=where)
    doc = json.loads(raw)
    assert doc["version"] == "1" and doc["compression"] is False
    assert doc["chunkIndex"] == {
        "type": "fixed",
        "originalChunkSize": 1000,
        "originalFileSize": 2500,
        "transformedChunkSize": 1000,
        "finalTransformedChunkSize": 500,
    }
    rlsm = doc["remoteLogSegmentMetadata"]
    assert rlsm["remoteLogSegmentId"]["id"] == "tqimKeZwStOEOwRzT3L5oQ"
    assert rlsm["segmentLeaderEpochs"] == {"0": 0}
    m = parse_manifest(raw, path="x")
    assert m.chunks == ChunkIndex(1000, 2500)
    assert m.indexes["offset"] == (0, 8) and m.indexes["transaction"] is None
    assert list(m.chunks.chunks_for(999, 2)) == [0, 1]
    assert m.chunks.chunk_range(2) == (2000, 500)


def test_a_manifest_written_by_the_plugin_reads():
    # SegmentManifestV1SerdeTest's JSON (the plugin's own test), without encryption
    text = (
        '{"version":"1","chunkIndex":{"type":"fixed","originalChunkSize":100,'
        '"originalFileSize":1000,"transformedChunkSize":110,"finalTransformedChunkSize":110},'
        '"segmentIndexes":{"offset":{"position":0,"size":1},"timestamp":{"position":1,"size":1},'
        '"producerSnapshot":{"position":2,"size":1},"leaderEpoch":{"position":3,"size":1},'
        '"transaction":null},"compression":false}'
    )
    m = parse_manifest(text.encode(), path="m")
    assert m.chunks.count == 10 and m.indexes["leaderEpoch"] == (3, 1)


@pytest.mark.parametrize(
    ("doc", "why"),
    [
        (b"not json", "not a segment manifest"),
        (b'{"version":"2"}', "version"),
        (b'{"version":"1","compression":true}', "compressed"),
        (b'{"version":"1","compression":false,"chunkIndex":{"type":"variable"}}', "variable"),
    ],
)
def test_manifests_this_reader_cannot_read_are_refused_clearly(doc, why):
    with pytest.raises(CorruptIndexError, match=why) as exc:
        parse_manifest(doc, path="s3://b/k.rsm-manifest")
    assert "s3://b/k.rsm-manifest" in str(exc.value)


def test_chunk_sizes_are_the_plugins_binary_codec():
    # ChunkSizesBinaryCodec: count, base (least but the last), bytes per value, the values
    # minus base in that many bytes, the last value in full; all big-endian
    sizes = [10, 11, 300, 7]
    want = (
        (4).to_bytes(4, "big")
        + (10).to_bytes(4, "big")
        + b"\x02"
        + b"\x00\x00"
        + b"\x00\x01"
        + (290).to_bytes(2, "big")
        + (7).to_bytes(4, "big")
    )
    assert encode_chunk_sizes(sizes) == want
    assert decode_chunk_sizes(want) == sizes
    for values in ([], [5], [3, 3], [0, 70000, 16_777_300, 1]):
        assert decode_chunk_sizes(encode_chunk_sizes(values)) == values
    with pytest.raises(ValueError, match="end early"):
        decode_chunk_sizes(want[:-2])


def _plugin_compressed_manifest(sizes: list[int], file_size: int, chunk: int) -> bytes:
    """A manifest as the plugin writes one with compression on, built here independently:
    transformedChunks is base64(zstd(ChunkSizesBinaryCodec)), the indexes uncompressed."""
    import struct

    import zstandard

    body = sizes[:-1]
    base = min(body)
    width = 4
    codec = struct.pack(">iib", len(sizes), base, width)
    codec += b"".join(struct.pack(">i", v - base) for v in body) + struct.pack(">i", sizes[-1])
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(codec)
    doc = {
        "version": "1",
        "chunkIndex": {
            "type": "variable",
            "originalChunkSize": chunk,
            "originalFileSize": file_size,
            "transformedChunks": base64.b64encode(frame).decode(),
        },
        "segmentIndexes": {
            "offset": {"position": 0, "size": 8},
            "timestamp": {"position": 8, "size": 12},
            "producerSnapshot": {"position": 20, "size": 0},
            "leaderEpoch": {"position": 20, "size": 8},
            "transaction": None,
        },
        "compression": True,
    }
    return json.dumps(doc).encode()


def test_a_compressed_manifest_reads_only_where_chunks_are_decompressed():
    raw = _plugin_compressed_manifest([400, 380, 90], 2500, 1000)
    with pytest.raises(CorruptIndexError, match="compressed"):
        parse_manifest(raw, path="m")  # a reader that does not decompress
    m = parse_manifest(raw, path="m", allow_compression=True)
    assert m.compression
    assert m.chunks.transformed == (400, 380, 90)
    # object positions are the frames'; file positions the original chunks'
    assert [m.chunks.chunk_range(i) for i in range(3)] == [(0, 400), (400, 380), (780, 90)]
    assert m.chunks.original_range(2) == (2000, 500)
    assert list(m.chunks.chunks_for(1500, 600)) == [1, 2]
    # too few frames for the file
    bad = _plugin_compressed_manifest([400, 380], 2500, 1000)
    with pytest.raises(CorruptIndexError, match="2 transformed chunks for 3"):
        parse_manifest(bad, path="m", allow_compression=True)


def test_a_compressed_manifest_is_written_as_the_plugin_writes_it():
    _blob, where = build_indexes({"offset": b"x" * 8})
    raw = build_manifest(_seg(2500), chunk_size=1000, indexes=where, compressed_sizes=[9, 8, 7])
    doc = json.loads(raw)
    assert doc["compression"] is True
    assert doc["chunkIndex"]["type"] == "variable"
    assert set(doc["chunkIndex"]) == {
        "type",
        "originalChunkSize",
        "originalFileSize",
        "transformedChunks",
    }
    import zstandard

    frame = base64.b64decode(doc["chunkIndex"]["transformedChunks"])
    assert decode_chunk_sizes(zstandard.ZstdDecompressor().decompress(frame)) == [9, 8, 7]
    m = parse_manifest(raw, path="m", allow_compression=True)
    assert m.chunks == ChunkIndex(1000, 2500, (9, 8, 7))


def test_chunks_are_zstd_frames_with_their_content_size():
    import zstandard

    data = bytes(range(256)) * 40
    frame = compress_chunk(data)
    params = zstandard.get_frame_parameters(frame)
    assert params.content_size == len(data)
    assert decompress_chunk(frame, max_size=len(data)) == data
    with pytest.raises(CorruptIndexError, match="does not decompress"):
        decompress_chunk(frame[:-3], max_size=len(data))


def test_index_floors_are_kafkas_largest_entry_at_or_below() -> None:
    """An offset index (relative offset, position) and a time index (timestamp, relative
    offset) as Kafka writes them, big-endian: the entry at or below the target, 0 below the
    first entry and for an empty index."""
    offsets = b"".join(
        struct.pack(">ii", rel, pos) for rel, pos in [(0, 0), (10, 4096), (25, 9000)]
    )
    assert [floor_position(offsets, r) for r in (-1, 0, 9, 10, 24, 25, 10**6)] == [
        0, 0, 0, 4096, 4096, 9000, 9000,
    ]  # fmt: skip
    assert floor_position(b"", 5) == 0
    stamps = [(1000, 0), (2000, 10), (3000, 25)]
    times = b"".join(struct.pack(">qi", ts, rel) for ts, rel in stamps)
    assert [time_floor(times, t) for t in (999, 1000, 1999, 2000, 5000)] == [0, 0, 0, 10, 25]
    assert time_floor(b"", 5) == 0
