"""Produce/consume helpers over the three real Kafka clients, in one shape for the tests.

A record is ``Rec(partition, key, value, headers, timestamp)`` on the way in and
``Got(partition, offset, key, value, headers, timestamp)`` on the way out, with headers as a
tuple of ``(str, bytes | None)`` so records compare byte for byte across clients.
Consumers use manual assignment (no group) from offset 0.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Sequence
from typing import NamedTuple

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, NewTopic

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


class Rec(NamedTuple):
    partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int


class Got(NamedTuple):
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int


def make_records(
    n: int, *, partitions: int, seed: int, value_size: int = 200, null_headers: bool = True
) -> list[Rec]:
    """Varied records: null and empty keys/values, binary data, 0-3 headers, timestamps.

    Never both key and value null (kafka-python refuses it); ``null_headers=False`` for
    kafka-python, whose producer only takes bytes header values.
    """
    rnd = random.Random(seed)
    base_ts = int(time.time() * 1000) - 60_000
    out = []
    for i in range(n):
        key: bytes | None = rnd.randbytes(rnd.randint(0, 16)) if i % 7 else None
        if i % 11 == 5:
            value: bytes | None = None
        elif i % 13 == 3:
            value = b""
        else:
            # compressible but not constant: repeated words plus random bytes
            value = (b"loglake-%d " % i) * (value_size // 16) + rnd.randbytes(rnd.randint(0, 32))
        if key is None and value is None:
            key = b""
        headers = tuple(
            (
                f"h{j}-{i}",
                None if null_headers and (i + j) % 5 == 0 else rnd.randbytes(rnd.randint(0, 8)),
            )
            for j in range(i % 4)
        )
        out.append(Rec(i % partitions, key, value, headers, base_ts + i))
    return out


def expected(records: Sequence[Rec]) -> dict[int, list[Got]]:
    """Per partition, the records with the offsets a broker must assign (0, 1, ...)."""
    out: dict[int, list[Got]] = {}
    for r in records:
        lst = out.setdefault(r.partition, [])
        lst.append(Got(r.partition, len(lst), r.key, r.value, r.headers, r.timestamp))
    return out


def new_topic(bootstrap: str, *, partitions: int = 2, prefix: str = "t", **configs: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=configs)],
        operation_timeout=10,
    )
    futures[name].result(timeout=30)
    return name


# -- confluent-kafka (librdkafka) ----------------------------------------------------------


def ck_produce(
    bootstrap: str,
    topic: str,
    records: Sequence[Rec],
    *,
    codec: str,
    acks: str,
    idempotent: bool,
    flush_every: int | None = None,
) -> None:
    """``flush_every``: flush after that many records (forces many small batches)."""
    conf = {
        "bootstrap.servers": bootstrap,
        "compression.type": codec,
        "acks": acks,
        "enable.idempotence": idempotent,
        "linger.ms": 5,
    }
    p = ck.Producer(conf)
    errors: list[object] = []

    def cb(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    for i, r in enumerate(records):
        if flush_every and i and i % flush_every == 0:
            p.flush(30)
        while True:
            try:
                p.produce(
                    topic,
                    key=r.key,
                    value=r.value,
                    headers=list(r.headers),
                    partition=r.partition,
                    timestamp=r.timestamp,
                    on_delivery=cb,
                )
                break
            except BufferError:
                p.poll(0.1)
    left = p.flush(30)
    assert left == 0, f"{left} messages not delivered"
    assert not errors, errors


def ck_consume(
    bootstrap: str, topic: str, counts: dict[int, int], *, timeout: float = 30
) -> list[Got]:
    c = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused-manual-assign",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    c.assign([ck.TopicPartition(topic, p, 0) for p in counts])
    got: list[Got] = []
    want = sum(counts.values())
    deadline = time.monotonic() + timeout
    try:
        while len(got) < want and time.monotonic() < deadline:
            for m in c.consume(num_messages=1000, timeout=0.5):
                if m.error():
                    raise AssertionError(f"consume error: {m.error()}")
                hdrs = tuple((k, v) for k, v in (m.headers() or []))
                got.append(
                    Got(m.partition(), m.offset(), m.key(), m.value(), hdrs, m.timestamp()[1])
                )
    finally:
        c.close()
    return got


# -- kafka-python ----------------------------------------------------------------------------


def kp_produce(
    bootstrap: str, topic: str, records: Sequence[Rec], *, codec: str, acks: str, idempotent: bool
) -> None:
    from kafka import KafkaProducer

    acks_v: int | str = "all" if acks == "all" else int(acks)
    p = KafkaProducer(
        bootstrap_servers=bootstrap,
        compression_type=None if codec == "none" else codec,
        acks=acks_v,
        enable_idempotence=idempotent,
        linger_ms=5,
    )
    try:
        futures = [
            p.send(
                topic,
                key=r.key,
                value=r.value,
                headers=list(r.headers),
                partition=r.partition,
                timestamp_ms=r.timestamp,
            )
            for r in records
        ]
        p.flush(30)
        for f in futures:
            f.get(timeout=30)
    finally:
        p.close(timeout=10)


def kp_consume(
    bootstrap: str, topic: str, counts: dict[int, int], *, timeout: float = 30
) -> list[Got]:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    c.assign([TopicPartition(topic, p) for p in counts])
    for p in counts:
        c.seek(TopicPartition(topic, p), 0)
    got: list[Got] = []
    want = sum(counts.values())
    deadline = time.monotonic() + timeout
    try:
        while len(got) < want and time.monotonic() < deadline:
            for _tp, msgs in c.poll(timeout_ms=500).items():
                for m in msgs:
                    hdrs = tuple((k, v) for k, v in (m.headers or []))
                    got.append(Got(m.partition, m.offset, m.key, m.value, hdrs, m.timestamp))
    finally:
        c.close()
    return got


# -- aiokafka --------------------------------------------------------------------------------


def ak_produce(
    bootstrap: str, topic: str, records: Sequence[Rec], *, codec: str, acks: str, idempotent: bool
) -> None:
    from aiokafka import AIOKafkaProducer

    async def run() -> None:
        acks_v: int | str = "all" if acks == "all" else int(acks)
        p = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            compression_type=None if codec == "none" else codec,
            acks=acks_v,
            enable_idempotence=idempotent,
            linger_ms=5,
        )
        await p.start()
        try:
            futs = [
                await p.send(
                    topic,
                    key=r.key,
                    value=r.value,
                    headers=list(r.headers),
                    partition=r.partition,
                    timestamp_ms=r.timestamp,
                )
                for r in records
            ]
            await p.flush()
            for f in futs:
                await f
        finally:
            await p.stop()

    asyncio.run(run())


def ak_consume(
    bootstrap: str, topic: str, counts: dict[int, int], *, timeout: float = 30
) -> list[Got]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def run() -> list[Got]:
        c = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await c.start()
        got: list[Got] = []
        try:
            c.assign([TopicPartition(topic, p) for p in counts])
            for p in counts:
                c.seek(TopicPartition(topic, p), 0)
            want = sum(counts.values())
            deadline = time.monotonic() + timeout
            while len(got) < want and time.monotonic() < deadline:
                batch = await c.getmany(timeout_ms=500)
                for _tp, msgs in batch.items():
                    for m in msgs:
                        hdrs = tuple((k, v) for k, v in (m.headers or ()))
                        got.append(Got(m.partition, m.offset, m.key, m.value, hdrs, m.timestamp))
        finally:
            await c.stop()
        return got

    return asyncio.run(run())


PRODUCERS = {"confluent": ck_produce, "kafka-python": kp_produce, "aiokafka": ak_produce}
CONSUMERS = {"confluent": ck_consume, "kafka-python": kp_consume, "aiokafka": ak_consume}


def by_partition(got: Sequence[Got]) -> dict[int, list[Got]]:
    out: dict[int, list[Got]] = {}
    for g in sorted(got, key=lambda g: (g.partition, g.offset)):
        out.setdefault(g.partition, []).append(g)
    return out


def read_log(log_dir: str | object, topic: str, partition: int) -> tuple[list[Got], list[str]]:
    """Independent reader: decode the partition's segment files (CRC checked) -> records.

    Also returns the codecs seen (one per batch), to prove the broker stored the producer's
    compressed batches as they came.
    """
    from pathlib import Path

    from logstore.protocol.batch import iter_batches
    from logstore.protocol.records import decode_batch

    d = Path(str(log_dir)) / f"{topic}-{partition}"
    got: list[Got] = []
    codecs: list[str] = []
    for seg in sorted(d.glob("*.log")):
        data = seg.read_bytes()
        for pos, _h in iter_batches(data):
            header, recs = decode_batch(data, pos)
            codecs.append(header.codec.label)
            for r in recs:
                got.append(Got(partition, r.offset, r.key, r.value, tuple(r.headers), r.timestamp))
    return got, codecs
