"""Log compaction against the real broker: confluent-kafka produces to a compacted topic, the
Spark job (real local[2] session) cleans the partition while producing goes on, the broker
swaps the segments in; confluent-kafka, kafka-python and aiokafka then read exactly the reference
model's records with their original offsets, and a consumer positioned in the middle before
the swap keeps going to the end without an error."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from kafka import KafkaConsumer, TopicPartition

from logstore.storage.cleaner import read_cleaner_checkpoint
from pipelines.compaction.log import run_log_compaction
from pipelines.compaction.model import Rec, latest
from tests.integration.broker.clients import Rec as CRec
from tests.integration.broker.clients import (
    ak_consume,
    ck_consume,
    ck_produce,
    kp_consume,
    new_topic,
)


def _records(n: int, start: int, keys: int) -> list[CRec]:
    out = []
    for i in range(start, start + n):
        value = None if i % 11 == 5 else b"value-%d" % i
        out.append(CRec(0, b"key-%d" % (i % keys), value, (("i", str(i).encode()),), 0))
    return out


def test_compaction_while_producing_real_clients(broker_factory, spark) -> None:
    b = broker_factory(replica_high_watermark_checkpoint_interval_ms=200)
    topic = new_topic(
        b.bootstrap,
        partitions=1,
        prefix="cmp",
        **{"cleanup.policy": "compact", "segment.bytes": "4096", "file.delete.delay.ms": "5000"},
    )
    now_ms = int(time.time() * 1000)
    first = [r._replace(timestamp=now_ms) for r in _records(600, 0, 40)]
    ck_produce(b.bootstrap, topic, first, codec="lz4", acks="all", idempotent=True, flush_every=7)
    before = ck_consume(b.bootstrap, topic, {0: len(first)})
    assert [g.offset for g in before] == list(range(len(first)))

    # a consumer in the middle, started before the swap
    mid = TopicPartition(topic, 0)
    middle = KafkaConsumer(
        bootstrap_servers=b.bootstrap, group_id=None, enable_auto_commit=False, max_poll_records=20
    )
    middle.assign([mid])
    middle.seek(mid, 300)
    seen_mid = [m for msgs in middle.poll(timeout_ms=5000).values() for m in msgs]
    assert seen_mid and seen_mid[0].offset == 300

    time.sleep(1.0)  # the high watermark checkpoint (every 200 ms) covers the first records
    second = [r._replace(timestamp=now_ms) for r in _records(200, 600, 40)]
    producer = threading.Thread(
        target=ck_produce,
        args=(b.bootstrap, topic, second),
        kwargs={"codec": "zstd", "acks": "all", "idempotent": True, "flush_every": 5},
    )
    producer.start()
    results = run_log_compaction(spark, [b.log_dir], force=True, hand_over_timeout_s=60)
    producer.join(timeout=120)
    assert not producer.is_alive()
    (res,) = [r for r in results if Path(r.dir).name == f"{topic}-0"]
    assert res.groups >= 1 and res.swapped, res
    end = res.end_offset
    total = len(first) + len(second)
    assert 0 < end <= total  # the cleaned range may reach into records produced meanwhile
    assert read_cleaner_checkpoint(b.log_dir)[(topic, 0)] == end
    assert res.records_out < res.records_in

    # the model: below `end` only each key's winner (tombstones stay on the first pass);
    # one idempotent producer at a time, so the second batch's offsets follow the first's
    every = [(g.offset, g.key, g.value, g.headers) for g in before] + [
        (len(first) + i, r.key, r.value, r.headers) for i, r in enumerate(second)
    ]
    below = [Rec(0, o, now_ms, k, v, h) for o, k, v, h in every if o < end]
    keep = {r.offset for r in latest(below).values()}
    want = [(o, k, v) for o, k, v, _ in every if o >= end or o in keep]

    got_ck = ck_consume(b.bootstrap, topic, {0: len(want)})
    assert [(g.offset, g.key, g.value) for g in got_ck] == want
    got_kp = kp_consume(b.bootstrap, topic, {0: len(want)})
    assert [(g.offset, g.key, g.value) for g in got_kp] == want
    got_ak = ak_consume(b.bootstrap, topic, {0: len(want)})
    assert [(g.offset, g.key, g.value) for g in got_ak] == want

    # the middle consumer goes on to the end, offsets increasing, no record it should see lost
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (not seen_mid or seen_mid[-1].offset < want[-1][0]):
        seen_mid += [m for msgs in middle.poll(timeout_ms=500).values() for m in msgs]
    middle.close()
    offsets = [m.offset for m in seen_mid]
    assert offsets == sorted(set(offsets)) and offsets[-1] == want[-1][0]
    assert {t for t in want if t[0] >= 300} <= {(m.offset, m.key, m.value) for m in seen_mid}
