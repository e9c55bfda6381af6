"""Tiered storage (KIP-405): a real broker tiers closed segments to a real S3 server (moto) in
the Aiven plugin's layout; real clients (confluent-kafka, kafka-python) read the whole history.

Each test starts its own broker with a short tier interval, produces enough to roll many small
segments, waits for them to be tiered and for the local ones to go (``local.retention.ms=0``),
then reads from offset 0."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import signal
import time

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.list_offsets.v11.request import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from kio.static.primitive import i8, i32, i64

from logstore.failpoints import FAILPOINT_ENV
from logstore.protocol.batch import iter_batches
from logstore.protocol.records import decode_batch
from logstore.tier.metadata import METADATA_TOPIC, SegmentState, decode_record, kafka_uuid
from tests.fixtures.broker import wait_for
from tests.fixtures.s3 import S3Proxy, Throttle
from tests.integration.broker.clients import (
    Got,
    by_partition,
    ck_consume,
    ck_produce,
    expected,
    kp_consume,
    make_records,
    new_topic,
)
from tests.integration.broker.rawclient import RawClient

N = 400
PREFIX = "tiered/"
UUID = r"[A-Za-z0-9_-]{22}"
KAFKA_STORAGE_ERROR = 56


def _tier_broker(broker_factory, s3, **more):
    return broker_factory(
        remote_log_storage_system_enable="true",
        **{
            "remote.log.manager.task.interval.ms": "200",
            "rsm.config.storage.s3.bucket.name": s3.name,
            "rsm.config.key.prefix": PREFIX,
            "rsm.config.chunk.size": "1000",
            "log.segment.delete.delay.ms": "0",
            **more,
        },
    )


def _produce(bootstrap: str):
    topic = new_topic(
        bootstrap,
        partitions=1,
        prefix="tier",
        **{
            "remote.storage.enable": "true",
            "segment.bytes": "4096",
            "local.retention.ms": "0",
        },
    )
    records = make_records(N, partitions=1, seed=24)
    ck_produce(bootstrap, topic, records, codec="none", acks="all", idempotent=True, flush_every=10)
    return topic, records


def _local_bases(b, topic: str) -> list[int]:
    return sorted(int(p.stem) for p in (b.log_dir / f"{topic}-0").glob("*.log"))


def _list_offset(bootstrap: str, topic: str, ts: int) -> int:
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
        resp = c.call(req)
    part = resp.topics[0].partitions[0]
    assert part.error_code == 0, part
    return int(part.offset)


def _fetch(bootstrap: str, topic: str, offset: int):
    req = FetchRequest(
        max_wait=datetime.timedelta(milliseconds=100),
        min_bytes=i32(1),
        max_bytes=i32(1 << 20),
        isolation_level=i8(0),
        topics=(
            FetchTopic(
                topic=topic,
                partitions=(
                    FetchPartition(
                        partition=i32(0), fetch_offset=i64(offset), partition_max_bytes=i32(1 << 16)
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
    )
    with RawClient(bootstrap) as c:
        return c.call(req).responses[0].partitions[0]


def _tiered(b, topic: str) -> None:
    """Wait until every closed segment is tiered and only the active one is local."""
    wait_for(lambda: len(_local_bases(b, topic)) == 1, 90)
    assert _local_bases(b, topic)[0] > 0


def _assert_reads_all(bootstrap: str, topic: str, records) -> None:
    want = expected(records)[0]
    for consume in (ck_consume, kp_consume):
        got = by_partition(consume(bootstrap, topic, {0: N}, timeout=60))[0]
        assert got == want, consume.__name__


def test_segments_tier_local_ones_go_and_clients_read_from_offset_zero(broker_factory, s3):
    b = _tier_broker(broker_factory, s3)
    topic, records = _produce(b.bootstrap)
    _tiered(b, topic)
    local_start = _local_bases(b, topic)[0]

    # object keys: the plugin's layout, three objects per segment
    keys = s3.keys(PREFIX)
    pattern = re.compile(
        rf"^{PREFIX}{re.escape(topic)}-({UUID})/0/(\d{{20}})-({UUID})\.(log|indexes|rsm-manifest)$"
    )
    parsed = [pattern.match(k) for k in keys]
    assert all(parsed), [k for k, m in zip(keys, parsed, strict=True) if not m]
    starts = sorted({int(m.group(2)) for m in parsed if m})
    assert starts[0] == 0 and len(keys) == 3 * len(starts)
    # each .log is whole batches from its start offset; its manifest gives its size and chunks
    next_start = 0
    for m in parsed:
        if m is None or m.group(4) != "log":
            continue
        data = s3.get(m.group(0))
        headers = [h for _pos, h in iter_batches(data)]
        assert headers[0].base_offset == int(m.group(2))
        manifest = json.loads(s3.get(m.group(0)[: -len("log")] + "rsm-manifest"))
        assert manifest["version"] == "1" and manifest["compression"] is False
        assert manifest["chunkIndex"]["type"] == "fixed"
        assert manifest["chunkIndex"]["originalFileSize"] == len(data)
        assert manifest["chunkIndex"]["originalChunkSize"] == 1000
        offsets = manifest["segmentIndexes"]["offset"]
        indexes = s3.get(m.group(0)[: -len("log")] + "indexes")
        assert offsets["position"] == 0 and offsets["size"] % 8 == 0
        assert len(indexes) >= offsets["size"]
        next_start = max(next_start, headers[-1].last_offset + 1)
    assert next_start == local_start

    # Kafka's metadata records: COPY_SEGMENT_STARTED then _FINISHED for every segment
    meta_dirs = list(b.log_dir.glob(f"{METADATA_TOPIC}-*"))
    assert meta_dirs
    states = {}
    for d in meta_dirs:
        for lf in d.glob("*.log"):
            data = lf.read_bytes()
            for pos, _h in iter_batches(data):
                for rec in decode_batch(data, pos)[1]:
                    found = decode_record(rec.value)
                    states.setdefault(found.segment_id, []).append(found.state)
    assert len(states) == len(starts)
    assert all(
        s == [SegmentState.COPY_SEGMENT_STARTED, SegmentState.COPY_SEGMENT_FINISHED]
        for s in states.values()
    )

    # ListOffsets as Kafka 4.x answers on a tiered topic
    assert _list_offset(b.bootstrap, topic, -2) == 0
    assert _list_offset(b.bootstrap, topic, -4) == local_start
    assert _list_offset(b.bootstrap, topic, -5) == local_start - 1
    assert _list_offset(b.bootstrap, topic, -6) == local_start
    assert _list_offset(b.bootstrap, topic, -1) == N

    _assert_reads_all(b.bootstrap, topic, records)

    # a restart keeps everything (the metadata is read back from __remote_log_metadata)
    b.restart()
    assert _list_offset(b.bootstrap, topic, -2) == 0
    _assert_reads_all(b.bootstrap, topic, records)


def test_a_missing_object_is_an_error_to_the_consumer_and_a_log_line(broker_factory, s3):
    b = _tier_broker(broker_factory, s3)
    topic, _records = _produce(b.bootstrap)
    _tiered(b, topic)
    first_log = next(k for k in s3.keys(PREFIX) if k.endswith(".log"))
    s3.client.delete_object(Bucket=s3.name, Key=first_log)
    part = _fetch(b.bootstrap, topic, 0)
    assert part.error_code == KAFKA_STORAGE_ERROR
    assert part.records is None or len(part.records) == 0
    assert "remote read of offset 0 failed" in b.log_text()
    # local reads are unaffected
    local = _fetch(b.bootstrap, topic, _local_bases(b, topic)[0])
    assert local.error_code == 0 and local.records


def test_store_stopped_keeps_produce_and_local_fetch_working_and_uploads_resume(broker_factory, s3):
    b = _tier_broker(broker_factory, s3)
    s3.server.stop()
    try:
        topic, records = _produce(b.bootstrap)
        # nothing can be tiered, so nothing local goes: every record is still served
        got = by_partition(ck_consume(b.bootstrap, topic, {0: N}, timeout=60))[0]
        assert got == expected(records)[0]
        assert _local_bases(b, topic)[0] == 0
    finally:
        s3.server.start()
    _tiered(b, topic)
    _assert_reads_all(b.bootstrap, topic, records)


COPY_STEPS = (
    "tier.metadata_appended",
    "tier.copy_started",
    "tier.log_uploaded",
    "tier.indexes_uploaded",
    "tier.manifest_uploaded",
    "tier.copy_finished",
)
DELETE_STEPS = ("tier.delete_started", "tier.objects_deleted", "tier.delete_finished")


def _metadata_states(b) -> dict[str, tuple[int, SegmentState]]:
    """segment id (Kafka's string form) -> (start offset, latest state), from the log files."""
    out: dict[str, tuple[int, SegmentState]] = {}
    for d in b.log_dir.glob(f"{METADATA_TOPIC}-*"):
        for lf in sorted(d.glob("*.log")):
            data = lf.read_bytes()
            for pos, _h in iter_batches(data, allow_torn_tail=True):
                for rec in decode_batch(data, pos)[1]:
                    found = decode_record(rec.value)
                    key = kafka_uuid(found.segment_id)
                    start = getattr(found, "start_offset", out.get(key, (-1,))[0])
                    out[key] = (start, found.state)
    return out


def _consistent(b, s3) -> bool:
    """Every object belongs to a live segment and every live segment has its 3 objects."""
    live = {
        k for k, (_s, st) in _metadata_states(b).items() if st == SegmentState.COPY_SEGMENT_FINISHED
    }
    ids = [m.group(1) for k in s3.keys(PREFIX) if (m := re.search(rf"\d{{20}}-({UUID})\.", k))]
    return set(ids) == live and len(ids) == 3 * len(live)


@pytest.mark.parametrize("step", COPY_STEPS + DELETE_STEPS)
def test_kill_at_every_tier_step_then_restart_completes_the_work(broker_factory, s3, step):
    # the records first, on the same log dir with the tier off (nothing runs the retention)
    b = broker_factory()
    deleting = step in DELETE_STEPS
    topic, records = _produce(b.bootstrap)
    if deleting:  # remote retention by size: the older remote segments go
        _alter(b.bootstrap, topic, {"retention.bytes": "40000", "local.retention.ms": "0"})
    b.stop()
    tier = {
        "remote.log.storage.system.enable": "true",
        "remote.log.manager.task.interval.ms": "200",
        "rsm.config.storage.s3.bucket.name": s3.name,
        "rsm.config.key.prefix": PREFIX,
        "rsm.config.chunk.size": "1000",
        "log.segment.delete.delay.ms": "0",
    }
    b.overrides.update(tier)
    os.environ[FAILPOINT_ENV] = step
    try:
        with contextlib.suppress(RuntimeError):  # it may die before it reports ready
            b.start()
        wait_for(lambda: b.proc is not None and b.proc.poll() is not None, 90)
    finally:
        del os.environ[FAILPOINT_ENV]
    assert b.proc.returncode == -signal.SIGKILL
    assert f"failpoint {step}: killing the process" in b.log_text()
    b.start()
    _tiered(b, topic)
    wait_for(lambda: _consistent(b, s3), 60)
    if deleting:  # remote retention has done all it will: the log start stays put
        seen: list[int] = []
        wait_for(
            lambda: seen.append(_list_offset(b.bootstrap, topic, -2)) or seen[-5:] == [seen[-1]] * 5
        )
        wait_for(lambda: _consistent(b, s3), 60)
    start = _list_offset(b.bootstrap, topic, -2)
    if not deleting:
        assert start == 0
        _assert_reads_all(b.bootstrap, topic, records)
        return
    assert start > 0
    got = by_partition(ck_consume_from(b.bootstrap, topic, start, N - start))[0]
    assert got == expected(records)[0][start:]


def _alter(bootstrap: str, topic: str, configs: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(ResourceType.TOPIC, topic)
    for k, v in configs.items():
        res.add_incremental_config(ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET))
    for fut in admin.incremental_alter_configs([res]).values():
        fut.result(30)


def ck_consume_from(bootstrap: str, topic: str, offset: int, count: int):
    c = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "tier-test",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
        }
    )
    c.assign([ck.TopicPartition(topic, 0, offset)])
    got: list[Got] = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < count and time.monotonic() < deadline:
            for m in c.consume(num_messages=1000, timeout=0.5):
                if m.error():
                    raise AssertionError(f"consume error: {m.error()}")
                hdrs = tuple((k, v) for k, v in (m.headers() or []))
                got.append(Got(0, m.offset(), m.key(), m.value(), hdrs, m.timestamp()[1]))
    finally:
        c.close()
    return got


def test_delete_records_below_the_local_start_deletes_remote_segments(broker_factory, s3):
    b = _tier_broker(broker_factory, s3)
    topic, records = _produce(b.bootstrap)
    _tiered(b, topic)
    before = len(s3.keys(PREFIX))
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    futures = admin.delete_records([ck.TopicPartition(topic, 0, 150)])
    low = next(iter(futures.values())).result(30)
    assert low.low_watermark == 150
    assert _list_offset(b.bootstrap, topic, -2) == 150
    # offsets below the new start are gone for consumers; from it on everything reads
    assert _fetch(b.bootstrap, topic, 100).error_code == 1  # OFFSET_OUT_OF_RANGE
    got = by_partition(ck_consume_from(b.bootstrap, topic, 150, N - 150))[0]
    assert got == expected(records)[0][150:]
    # the remote segments wholly below 150 go (their objects and their metadata)
    wait_for(lambda: len(s3.keys(PREFIX)) < before and _consistent(b, s3), 60)
    starts = sorted(int(m.group(1)) for k in s3.keys(PREFIX) if (m := re.search(r"/(\d{20})-", k)))
    assert starts[0] <= 150 < starts[0] + 40
    # the start survives a restart
    b.restart()
    assert _list_offset(b.bootstrap, topic, -2) == 150


def test_compacted_topics_cannot_enable_remote_storage(broker_factory, s3):
    b = _tier_broker(broker_factory, s3)
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    configs = {"remote.storage.enable": "true", "cleanup.policy": "compact"}
    fut = admin.create_topics([NewTopic("tier-compacted", 1, 1, config=configs)])["tier-compacted"]
    with pytest.raises(ck.KafkaException, match="compacted"):
        fut.result(30)


def test_a_throttling_store_slows_uploads_and_loses_nothing(broker_factory, s3):
    throttle = Throttle(methods=frozenset({"PUT"}), every=2)  # every other PUT
    proxy = S3Proxy(s3.server.endpoint, reply=throttle)
    try:
        b = _tier_broker(
            broker_factory, s3, **{"rsm.config.storage.s3.endpoint.url": proxy.endpoint}
        )
        topic, records = _produce(b.bootstrap)
        _tiered(b, topic)
        wait_for(lambda: _consistent(b, s3), 60)
        assert throttle.throttled > 0
        _assert_reads_all(b.bootstrap, topic, records)
    finally:
        proxy.close()


def test_read_committed_from_the_tier_drops_aborted_transactions(broker_factory, s3):
    b = _tier_broker(broker_factory, s3)
    topic = new_topic(
        b.bootstrap,
        partitions=1,
        prefix="tier-txn",
        **{"remote.storage.enable": "true", "segment.bytes": "4096", "local.retention.ms": "0"},
    )
    p = ck.Producer({"bootstrap.servers": b.bootstrap, "transactional.id": f"tx-{topic}"})
    p.init_transactions(30)
    committed: list[bytes] = []
    every: list[bytes] = []
    for t in range(20):
        p.begin_transaction()
        values = [f"txn{t}-rec{i}-".encode() + b"v" * 200 for i in range(10)]
        for v in values:
            p.produce(topic, value=v, partition=0)
        every += values
        p.flush(30)  # on the broker before the abort (librdkafka purges unsent records)
        if t % 4 == 1:
            p.abort_transaction(30)
        else:
            p.commit_transaction(30)
            committed += values
    p.flush(30)
    _tiered(b, topic)
    assert _values(b.bootstrap, topic, "read_committed", len(committed)) == committed
    assert _values(b.bootstrap, topic, "read_uncommitted", len(every)) == every


def _values(bootstrap: str, topic: str, isolation: str, count: int) -> list[bytes]:
    c = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "tier-txn",
            "enable.auto.commit": False,
            "auto.offset.reset": "error",
            "isolation.level": isolation,
        }
    )
    c.assign([ck.TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < count and time.monotonic() < deadline:
            for m in c.consume(num_messages=1000, timeout=0.5):
                assert not m.error(), m.error()
                got.append(m.value())
    finally:
        c.close()
    return got


def test_the_lake_bound_holds_tiered_segments_locally_until_ingested(broker_factory, s3):
    group = "loglake-ingest"
    b = _tier_broker(broker_factory, s3, **{"log.retention.lake.group": group})
    topic, _records = _produce(b.bootstrap)
    local = _local_bases(b, topic)
    # every closed segment is tiered, none leaves the disk: the lake has committed nothing
    wait_for(lambda: len(s3.keys(PREFIX)) == 3 * (len(local) - 1), 90)
    assert _list_offset(b.bootstrap, topic, -5) == local[-1] - 1
    time.sleep(1)  # several tier passes
    assert _local_bases(b, topic) == local
    c = ck.Consumer({"bootstrap.servers": b.bootstrap, "group.id": group})
    try:
        c.commit(offsets=[ck.TopicPartition(topic, 0, 200)], asynchronous=False)
    finally:
        c.close()
    # now the segments wholly below 200 go, the one holding 200 stays
    # retention deletes the segments over several passes: wait for where it must stop
    holding = max(x for x in local if x <= 200)
    wait_for(lambda: _local_bases(b, topic)[0] >= holding, 60)
    first = _local_bases(b, topic)[0]
    assert first <= 200 and holding == first
