"""The Aiven plugin's object layout: keys, the ``.indexes`` object and the manifest."""

from __future__ import annotations

import base64
import json
import uuid

import pytest

from logstore.errors import CorruptIndexError
from logstore.tier.layout import (
    ChunkIndex,
    build_indexes,
    build_manifest,
    leader_epoch_bytes,
    object_key,
    parse_manifest,
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
