"""READ_COMMITTED through real clients: the broker's LSO, aborted transactions and ListOffsets.

The transactions are written straight through the partition layer (``Partition`` over a
``LogManager``, the broker's own storage), as the transaction coordinator would: transactional
batches, then COMMIT/ABORT markers; one transaction is left open. The broker then serves the
log to confluent-kafka (librdkafka), kafka-python and aiokafka consumers with both isolation levels.
Full client transactions (InitProducerId with a transactional id, EndTxn) belong to the
coordinator's tests.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest

from logstore.protocol.records import build_batch
from logstore.storage.config import LogConfig
from logstore.storage.log_manager import LogManager
from logstore.storage.partition import Partition

TOPIC = "txn-rc"


def _txn(values: list[bytes], *, pid: int, seq: int, ts: int) -> bytearray:
    return build_batch(
        [(b"k", v) for v in values],
        base_timestamp=ts,
        producer_id=pid,
        producer_epoch=0,
        base_sequence=seq,
        is_transactional=True,
    )


def _write_log(log_dir: Path) -> tuple[list[bytes], list[bytes], int, int]:
    """Interleaved committed, aborted and open transactions plus plain records, across two
    segments; returns (committed view, uncommitted view, LSO, HW)."""
    ts = int(time.time() * 1000)
    lm = LogManager([str(log_dir)], default_config=LogConfig())
    lg = lm.get_or_create_log(TOPIC, 0)
    p = Partition.load(TOPIC, 0, lg)

    def plain(v: bytes) -> None:
        p.append_as_leader(build_batch([(b"k", v)], base_timestamp=ts))

    def txn(values: list[bytes], pid: int, seq: int) -> None:
        p.append_as_leader(_txn(values, pid=pid, seq=seq, ts=ts))

    plain(b"p0")
    txn([b"a1", b"a2"], 1, 0)  # A: will commit
    txn([b"b1"], 2, 0)  # B: will abort
    plain(b"p1")
    txn([b"a3"], 1, 2)
    lg.roll()  # B's abort marker lands in the next segment, some of its records in this one
    txn([b"b2", b"b3"], 2, 1)
    p.write_txn_marker(1, 0, commit=True, coordinator_epoch=0, now_ms=ts)
    p.write_txn_marker(2, 0, commit=False, coordinator_epoch=0, now_ms=ts)
    plain(b"p2")
    txn([b"c1"], 3, 0)  # C: aborted
    p.write_txn_marker(3, 0, commit=False, coordinator_epoch=0, now_ms=ts)
    plain(b"p3")
    lso = p.log_end_offset
    txn([b"d1"], 4, 0)  # D: left open
    plain(b"p4")  # above the LSO: not visible to read_committed yet
    committed = [b"p0", b"a1", b"a2", b"p1", b"a3", b"p2", b"p3"]
    everything = [b"p0", b"a1", b"a2", b"b1", b"p1", b"a3", b"b2", b"b3", b"p2", b"c1", b"p3"]
    everything += [b"d1", b"p4"]
    hw = p.high_watermark
    assert p.last_stable_offset == lso
    assert lm.shutdown()
    return committed, everything, lso, hw


@pytest.fixture
def served(tmp_path: Path, broker_factory: Any) -> tuple[Any, list[bytes], list[bytes], int, int]:
    log_dir = tmp_path / "logs"
    committed, everything, lso, hw = _write_log(log_dir)
    b = broker_factory(log_dir=log_dir)
    return b, committed, everything, lso, hw


def _consume_ck(bootstrap: str, isolation: str, expected: int) -> tuple[list[bytes], int, int]:
    c = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"rc-{isolation}-{time.time_ns()}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        c.assign([ck.TopicPartition(TOPIC, 0, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        eof = False
        while time.monotonic() < deadline and not eof:
            m = c.poll(1.0)
            if m is None:
                continue
            if m.error():
                if m.error().code() == ck.KafkaError._PARTITION_EOF:
                    eof = len(got) >= expected
                    continue
                raise AssertionError(m.error())
            got.append(m.value())
        low, high = c.get_watermark_offsets(ck.TopicPartition(TOPIC, 0), cached=False)
        return got, low, high
    finally:
        c.close()


def test_confluent_kafka_read_committed_and_uncommitted(served: Any) -> None:
    b, committed, everything, lso, hw = served
    got, low, high = _consume_ck(b.bootstrap, "read_committed", len(committed))
    assert got == committed
    # ListOffsets latest with read_committed: the LSO (the open transaction's first offset)
    assert (low, high) == (0, lso)
    got, low, high = _consume_ck(b.bootstrap, "read_uncommitted", len(everything))
    assert got == everything
    assert (low, high) == (0, hw)


def test_kafka_python_read_committed(served: Any) -> None:
    kafka = pytest.importorskip("kafka")
    b, committed, everything, lso, hw = served
    for isolation, expected, end in (
        ("read_committed", committed, lso),
        ("read_uncommitted", everything, hw),
    ):
        c = kafka.KafkaConsumer(
            bootstrap_servers=b.bootstrap,
            isolation_level=isolation,
            enable_auto_commit=False,
            consumer_timeout_ms=6000,  # idle time that ends the iteration (a loaded machine)
        )
        try:
            tp = kafka.TopicPartition(TOPIC, 0)
            c.assign([tp])
            c.seek(tp, 0)
            got = [m.value for m in c]
            assert got == expected, isolation
            assert c.end_offsets([tp])[tp] == end
        finally:
            c.close()


def test_aiokafka_read_committed(served: Any) -> None:
    import asyncio

    from aiokafka import AIOKafkaConsumer, TopicPartition

    b, committed, everything, lso, hw = served

    async def consume(isolation: str, want: int) -> tuple[list[bytes], int]:
        c = AIOKafkaConsumer(
            bootstrap_servers=b.bootstrap, isolation_level=isolation, enable_auto_commit=False
        )
        await c.start()
        try:
            tp = TopicPartition(TOPIC, 0)
            c.assign([tp])
            c.seek(tp, 0)
            got: list[bytes] = []
            deadline = time.monotonic() + 20
            while len(got) < want and time.monotonic() < deadline:
                batch = await c.getmany(tp, timeout_ms=500)
                got += [m.value for m in batch.get(tp, [])]
            # nothing more arrives past the isolation's limit
            extra = await c.getmany(tp, timeout_ms=500)
            got += [m.value for m in extra.get(tp, [])]
            end = (await c.end_offsets([tp]))[tp]
            return got, end
        finally:
            await c.stop()

    assert asyncio.run(consume("read_committed", len(committed))) == (committed, lso)
    assert asyncio.run(consume("read_uncommitted", len(everything))) == (everything, hw)
