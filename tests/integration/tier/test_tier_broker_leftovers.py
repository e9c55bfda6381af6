"""Tiered storage, the broker's side beyond copy and fetch: ListOffsets by timestamp below the
local log start and -3 (max timestamp) over the remote segments, a deleted topic's remote data
deleted (crash-safe), the plugin's zstd chunks.

A real broker tiers to a real S3 server (moto); real clients (confluent-kafka, kafka-python)
ask; the bucket and ``__remote_log_metadata`` are read back independently (boto3, the log
files). The broker helpers are the tier tests' own (``tests/integration/broker/test_tier.py``).
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import os
import random
import re
import signal
import struct

import confluent_kafka as ck
import pytest
import zstandard
from confluent_kafka.admin import AdminClient, OffsetSpec
from kio.schema.list_offsets.v11.request import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from kio.static.primitive import i8, i32, i64

from logstore.failpoints import FAILPOINT_ENV
from logstore.protocol.batch import iter_batches
from logstore.protocol.records import decode_batch
from logstore.tier import layout
from logstore.tier.metadata import (
    METADATA_TOPIC,
    PartitionDelete,
    PartitionDeleteState,
    RemoteSegment,
    SegmentState,
    decode_metadata,
    kafka_uuid,
)
from pipelines.sources.tier import remote_segments
from tests.fixtures.broker import wait_for
from tests.integration.broker.clients import (
    Rec,
    by_partition,
    ck_consume,
    ck_produce,
    expected,
    make_records,
    new_topic,
)
from tests.integration.broker.rawclient import RawClient
from tests.integration.broker.test_tier import (
    PREFIX,
    UUID,
    _assert_reads_all,
    _local_bases,
    _tier_broker,
    _tiered,
)

N = 400
KAFKA_STORAGE_ERROR = 56
TIERED = {"remote.storage.enable": "true", "segment.bytes": "4096", "local.retention.ms": "0"}


def _produce(bootstrap: str, records: list[Rec], *, prefix: str = "tier", name: str | None = None):
    topic = name or new_topic(bootstrap, partitions=1, prefix=prefix, **TIERED)
    ck_produce(bootstrap, topic, records, codec="none", acks="all", idempotent=True, flush_every=10)
    return topic


def _shuffled_times(records: list[Rec]) -> list[Rec]:
    """The records with timestamps out of order (each within a few seconds of a base), so
    "the first offset whose timestamp >= t" is not "the offset t points at"."""
    rnd = random.Random(7)
    base = records[0].timestamp
    return [
        r._replace(timestamp=base + i * 10 + rnd.randint(-400, 400)) for i, r in enumerate(records)
    ]


def _first_at_or_after(records: list[Rec], ts: int) -> tuple[int, int]:
    for offset, r in enumerate(records):
        if r.timestamp >= ts:
            return offset, r.timestamp
    return -1, -1


def _list_offsets_raw(bootstrap: str, topic: str, ts: int):
    req = ListOffsetsRequest(
        replica_id=i32(-1),
        isolation_level=i8(0),
        topics=(
            ListOffsetsTopic(
                name=topic,
                partitions=(ListOffsetsPartition(partition_index=i32(0), timestamp=i64(ts)),),
            ),
        ),
        timeout=datetime.timedelta(seconds=10),
    )
    with RawClient(bootstrap) as c:
        return c.call(req).topics[0].partitions[0]


def test_offsets_for_times_below_the_local_start_come_from_the_remote_time_indexes(
    broker_factory, s3
):
    # no cache: each lookup reads the store, so a missing object shows below
    b = _tier_broker(broker_factory, s3, **{"rsm.config.fetch.chunk.cache.size": "0"})
    records = _shuffled_times(make_records(N, partitions=1, seed=5))
    topic = _produce(b.bootstrap, records)
    _tiered(b, topic)
    local_start = _local_bases(b, topic)[0]
    times = sorted(r.timestamp for r in records)
    targets = [
        times[0] - 1000,  # before everything: offset 0, from the first remote segment
        times[5],
        times[N // 3],
        times[N // 2] + 3,
        records[local_start - 1].timestamp,  # the last tiered record's time
        max(r.timestamp for r in records[:local_start]) + 1,  # newer than all tiered: local
        times[-1],
        times[-1] + 1,  # after everything: none (-1)
    ]
    want = [_first_at_or_after(records, t) for t in targets]
    assert any(0 < o < local_start for o, _ in want)  # answered by a remote segment
    assert any(o >= local_start for o, _ in want)  # answered by the local log
    assert want[-1] == (-1, -1)

    c = ck.Consumer({"bootstrap.servers": b.bootstrap, "group.id": "tier-times"})
    try:  # one partition per request: a client keeps one answer per partition
        got = [
            c.offsets_for_times([ck.TopicPartition(topic, 0, t)], timeout=30)[0] for t in targets
        ]
    finally:
        c.close()
    assert [(tp.offset, tp.error) for tp in got] == [(o, None) for o, _ in want]

    from kafka import KafkaConsumer, TopicPartition

    kc = KafkaConsumer(bootstrap_servers=b.bootstrap)
    try:
        tp = TopicPartition(topic, 0)
        for t, (offset, ts) in zip(targets, want, strict=True):
            found = kc.offsets_for_times({tp: t})[tp]
            got = None if found is None else (found.offset, found.timestamp)
            assert got == (None if offset < 0 else (offset, ts)), t
    finally:
        kc.close()

    # a remote object missing: that partition's KAFKA_STORAGE_ERROR and a log line, never a
    # wrong offset (the first segment's .log goes; the target is in it)
    first_log = min(k for k in s3.keys(PREFIX) if k.endswith(".log"))
    s3.client.delete_object(Bucket=s3.name, Key=first_log)
    part = _list_offsets_raw(b.bootstrap, topic, times[0] - 1000)
    assert (part.error_code, part.offset) == (KAFKA_STORAGE_ERROR, -1)
    assert "remote lookup of timestamp" in b.log_text()


def test_max_timestamp_is_found_in_the_remote_segments_too(broker_factory, s3):
    # KAFKA-17552: -3 answered from the local segments only gave a record of the local tail
    # once the largest timestamp was tiered and gone locally
    b = _tier_broker(broker_factory, s3, **{"rsm.config.fetch.chunk.cache.size": "0"})
    records = make_records(N, partitions=1, seed=11)
    top = max(r.timestamp for r in records) + 60_000
    for i in (37, 120):  # the largest timestamp twice, both tiered: the earlier offset wins
        records[i] = records[i]._replace(timestamp=top)
    topic = _produce(b.bootstrap, records)
    _tiered(b, topic)
    assert _local_bases(b, topic)[0] > 120
    # (the tier's small objects go up as one PUT each, not a multipart upload of one part)
    manifest = next(k for k in s3.keys(PREFIX) if k.endswith(".rsm-manifest"))
    assert "-" not in s3.client.head_object(Bucket=s3.name, Key=manifest)["ETag"]
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    tp = ck.TopicPartition(topic, 0)

    def max_timestamp() -> tuple[int, int]:
        r = admin.list_offsets({tp: OffsetSpec.max_timestamp()})[tp].result(timeout=30)
        return r.offset, r.timestamp

    assert max_timestamp() == (37, top)
    raw = _list_offsets_raw(b.bootstrap, topic, -3)
    assert (raw.error_code, raw.offset, raw.timestamp) == (0, 37, top)

    # the remote segment holding it unreadable: KAFKA_STORAGE_ERROR and a log line
    seg = next(s for s in remote_segments(b.bootstrap)[(topic, 0)] if s.end_offset >= 37)
    s3.client.delete_object(Bucket=s3.name, Key=layout.segment_keys(PREFIX, seg)[layout.LOG])
    raw = _list_offsets_raw(b.bootstrap, topic, -3)
    assert (raw.error_code, raw.offset) == (KAFKA_STORAGE_ERROR, -1)
    assert "remote lookup of the max timestamp failed" in b.log_text()

    # a newer record in the local tail: the local log answers, without reading the store
    later = make_records(3, partitions=1, seed=12)
    later[1] = later[1]._replace(timestamp=top + 1)
    ck_produce(b.bootstrap, topic, later, codec="none", acks="all", idempotent=True)
    assert _local_bases(b, topic)[0] <= N + 1
    assert max_timestamp() == (N + 1, top + 1)


def _metadata(b) -> list[object]:
    """Every ``__remote_log_metadata`` record, decoded, from the log files, in file order."""
    out = []
    for d in sorted(b.log_dir.glob(f"{METADATA_TOPIC}-*")):
        for lf in sorted(d.glob("*.log")):
            data = lf.read_bytes()
            for pos, _h in iter_batches(data, allow_torn_tail=True):
                out.extend(decode_metadata(rec.value) for rec in decode_batch(data, pos)[1])
    return out


def _topic_ids(s3, topic: str) -> set[str]:
    return {
        m.group(1) for k in s3.keys(PREFIX) if (m := re.match(rf"{PREFIX}{topic}-({UUID})/", k))
    }


def _deleted_everywhere(b, s3, topic: str, topic_id: str) -> bool:
    """No object of ``topic_id`` left and its partition's delete records are Kafka's three."""
    if topic_id in _topic_ids(s3, topic):
        return False
    states = [
        r.state
        for r in _metadata(b)
        if isinstance(r, PartitionDelete) and kafka_uuid(r.topic_id) == topic_id
    ]
    return (
        bool(states)
        and states[0] == PartitionDeleteState.DELETE_PARTITION_MARKED
        and (states[-1] == PartitionDeleteState.DELETE_PARTITION_FINISHED)
    )


def _delete_topic(bootstrap: str, topic: str, *, timeout: float = 30) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    fut = admin.delete_topics([topic], operation_timeout=timeout, request_timeout=timeout)
    fut[topic].result(timeout + 5)


def _recreated_sees_only_its_own(b, s3, topic: str, old_id: str) -> None:
    fresh = make_records(30, partitions=1, seed=99)
    _produce(b.bootstrap, fresh, name=new_topic_named(b.bootstrap, topic))
    got = by_partition(ck_consume(b.bootstrap, topic, {0: 30}, timeout=60))[0]
    assert got == expected(fresh)[0]
    assert _list_offsets_raw(b.bootstrap, topic, -2).offset == 0
    assert _list_offsets_raw(b.bootstrap, topic, -1).offset == 30
    assert old_id not in _topic_ids(s3, topic)


def new_topic_named(bootstrap: str, name: str) -> str:
    from confluent_kafka.admin import NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    fut = admin.create_topics([NewTopic(name, 1, 1, config=TIERED)], operation_timeout=10)[name]
    fut.result(30)
    return name


def test_deleting_a_topic_deletes_its_remote_data_and_a_new_one_never_sees_it(broker_factory, s3):
    b = _tier_broker(broker_factory, s3)
    topic = _produce(b.bootstrap, make_records(N, partitions=1, seed=24))
    _tiered(b, topic)
    (old_id,) = _topic_ids(s3, topic)
    segments = {
        r.segment_id for r in _metadata(b) if isinstance(r, RemoteSegment) and r.topic == topic
    }
    _delete_topic(b.bootstrap, topic)
    wait_for(lambda: _deleted_everywhere(b, s3, topic, old_id), 60)
    # each segment went as retention deletes one: DELETE_SEGMENT_STARTED then _FINISHED
    last = {}
    for r in _metadata(b):
        if not isinstance(r, PartitionDelete) and r.segment_id in segments:
            last[r.segment_id] = r.state
    assert last == dict.fromkeys(segments, SegmentState.DELETE_SEGMENT_FINISHED)
    # created again with the same name: a new topic id, only its own records, from offset 0
    _recreated_sees_only_its_own(b, s3, topic, old_id)
    # and a restart replays the deletion without redoing anything
    b.restart()
    assert old_id not in _topic_ids(s3, topic)
    assert _list_offsets_raw(b.bootstrap, topic, -2).offset == 0


@pytest.mark.parametrize(
    "step",
    [
        "tier.partition_delete_marked",
        "tier.partition_delete_started",
        "tier.objects_deleted",
        "tier.partition_delete_finished",
    ],
)
def test_kill_at_every_step_of_a_topic_deletion_then_restart_finishes_it(broker_factory, s3, step):
    b = _tier_broker(broker_factory, s3)
    topic = _produce(b.bootstrap, make_records(N // 2, partitions=1, seed=3))
    _tiered(b, topic)
    (old_id,) = _topic_ids(s3, topic)
    b.stop()
    os.environ[FAILPOINT_ENV] = step
    try:
        b.start()
        with contextlib.suppress(ck.KafkaException):  # the broker may die before answering
            _delete_topic(b.bootstrap, topic, timeout=5)
        wait_for(lambda: b.proc is not None and b.proc.poll() is not None, 60)
    finally:
        del os.environ[FAILPOINT_ENV]
    assert b.proc.returncode == -signal.SIGKILL
    assert f"failpoint {step}: killing the process" in b.log_text()
    b.start()
    wait_for(lambda: _deleted_everywhere(b, s3, topic, old_id), 60)
    _recreated_sees_only_its_own(b, s3, topic, old_id)


def _frames(data: bytes, sizes: list[int]) -> list[bytes]:
    out, pos = [], 0
    for n in sizes:
        out.append(data[pos : pos + n])
        pos += n
    assert pos == len(data)
    return out


def _chunk_sizes(text: str) -> list[int]:
    """The plugin's transformedChunks, decoded here independently of the code under test."""
    raw = zstandard.ZstdDecompressor().decompress(base64.b64decode(text))
    (count,) = struct.unpack_from(">i", raw, 0)
    if count == 1:
        return [struct.unpack_from(">i", raw, 4)[0]]
    base, width = struct.unpack_from(">ib", raw, 4)
    body = raw[9 : 9 + (count - 1) * width]
    values = [
        base + int.from_bytes(body[i * width : (i + 1) * width], "big") for i in range(count - 1)
    ]
    return [*values, struct.unpack_from(">i", raw, 9 + (count - 1) * width)[0]]


def test_compressed_chunks_are_the_plugins_zstd_frames_and_read_with_compression_off(
    broker_factory, s3
):
    b = _tier_broker(broker_factory, s3, **{"rsm.config.compression.enabled": "true"})
    records = make_records(N, partitions=1, seed=11)
    topic = _produce(b.bootstrap, records)
    _tiered(b, topic)
    logs = [k for k in s3.keys(PREFIX) if k.endswith(".log")]
    assert logs
    for key in logs:
        manifest = json.loads(s3.get(key[: -len("log")] + "rsm-manifest"))
        assert manifest["compression"] is True
        ci = manifest["chunkIndex"]
        assert ci["type"] == "variable" and ci["originalChunkSize"] == 1000
        stored = s3.get(key)
        frames = _frames(stored, _chunk_sizes(ci["transformedChunks"]))
        plain = b""
        for f in frames:  # each chunk one zstd frame carrying its size, as zstd-jni writes
            assert zstandard.get_frame_parameters(f).content_size in (
                1000,
                ci["originalFileSize"] % 1000,
            )
            plain += zstandard.ZstdDecompressor().decompress(f)
        assert len(plain) == ci["originalFileSize"] > len(stored)
        first = next(iter_batches(plain))[1]
        assert first.base_offset == int(re.search(r"/(\d{20})-", key).group(1))
    _assert_reads_all(b.bootstrap, topic, records)
    # a broker with compression off reads the compressed segments (the manifest says)
    b.overrides["rsm.config.compression.enabled"] = "false"
    b.restart()
    got = by_partition(ck_consume(b.bootstrap, topic, {0: N}, timeout=60))[0]
    assert got == expected(records)[0]
