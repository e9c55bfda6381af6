"""The ``logsegments`` source through real Spark (local[2]) over real segment files.

Segments are written by logstore's storage engine (every codec, nulls, headers, several
segments with indexes) and taken from the real Kafka fixtures; every row must equal the
reference decoder's, byte for byte.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from logstore.protocol.batch import Codec
from logstore.protocol.control import ControlType, build_control_batch
from logstore.protocol.records import build_batch
from pipelines.decode.reference import reference_decode
from pipelines.sources import read_segments
from pipelines.sources.synthetic import write_batches, write_high_watermarks, write_partition

pytestmark = pytest.mark.integration

BASE_TS = 1_700_000_000_000


def make_records(n: int, seed: int) -> list[Any]:
    return [
        (
            None if i % 11 == 0 else b"k-%d-%d" % (seed, i),
            None if i % 9 == 0 else (b"" if i % 10 == 0 else bytes([(i * 7) % 256]) * (i % 120)),
            [("trace-id", b"%d" % i), ("nullable", None)] if i % 3 == 0 else [],
            BASE_TS + i * 500,
        )
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("segments") / "logs"
    write_partition(
        d, "events", 0, make_records(4000, 0), batch_records=50, codecs=list(Codec),
        segment_bytes=60_000, index_interval_bytes=4096,
    )  # fmt: skip
    write_partition(d, "events", 1, make_records(1500, 1), batch_records=100, codecs=[Codec.LZ4])
    # A transactional partition: data, a COMMIT marker, more data.
    txn = [
        build_batch(make_records(20, 2)[:10], producer_id=7, producer_epoch=1, base_sequence=0,
                    is_transactional=True),
        build_control_batch(ControlType.COMMIT, producer_id=7, producer_epoch=1, timestamp=BASE_TS),
        build_batch(make_records(20, 2)[10:], codec=Codec.ZSTD),
    ]  # fmt: skip
    write_batches(d, "txn", 0, txn)
    return d


def reference(part_dir: Path) -> list[tuple[Any, ...]]:
    rows = []
    for seg in sorted(part_dir.glob("*.log")):
        for r in reference_decode(seg.read_bytes())[0]:
            rows.append(
                (r["offset"], r["timestamp"], r["key"], r["value"],
                 [tuple(h) for h in r["headers"]], r["codec"], r["producer_id"],
                 r["is_transactional"], r["batch_position"], int(seg.stem))
            )  # fmt: skip
    return rows


def spark_rows(df: Any, topic: str, partition: int) -> list[tuple[Any, ...]]:
    got = (
        df.where(f"topic = '{topic}' AND partition = {partition}")
        .selectExpr("*", "unix_millis(timestamp) AS ts_ms")
        .orderBy("offset")
        .collect()
    )
    return [
        (r.offset, r.ts_ms, _b(r.key), _b(r.value), [(h.key, _b(h.value)) for h in r.headers],
         r.codec, r.producer_id, r.is_transactional, r.batch_position, r.segment_base_offset)
        for r in got
    ]  # fmt: skip


def _b(v: Any) -> bytes | None:
    return None if v is None else bytes(v)


def test_records_equal_reference_byte_for_byte(spark: Any, log_dir: Path) -> None:
    df = read_segments(spark, str(log_dir))
    assert df.rdd.getNumPartitions() >= 4  # one per segment at least
    for topic, partition in [("events", 0), ("events", 1), ("txn", 0)]:
        assert spark_rows(df, topic, partition) == reference(log_dir / f"{topic}-{partition}")
    txn = df.where("topic = 'txn'").orderBy("offset").collect()
    assert [r.offset for r in txn] == list(range(10)) + list(range(11, 21))  # marker not a row
    controls = read_segments(spark, str(log_dir), kind="batches").where("is_control").collect()
    assert [(r.topic, r.base_offset) for r in controls] == [("txn", 10)]


def test_split_partitions_give_the_same_rows(spark: Any, log_dir: Path) -> None:
    whole = read_segments(spark, str(log_dir), topics="events")
    split = read_segments(spark, str(log_dir), topics="events", maxPartitionBytes=8192)
    assert split.rdd.getNumPartitions() > whole.rdd.getNumPartitions()
    cols = [
        "topic",
        "partition",
        "offset",
        "timestamp",
        "key",
        "value",
        "headers",
        "batch_position",
    ]
    a = whole.select(*cols).orderBy("partition", "offset").collect()
    b = split.select(*cols).orderBy("partition", "offset").collect()
    assert len(a) == 5500 and a == b


def test_offsets_topics_until_and_time(spark: Any, log_dir: Path) -> None:
    df = read_segments(
        spark, str(log_dir), topics=["events"],
        startingOffsets={"events": {0: 3100}}, until={"events": {1: 200}},
    )  # fmt: skip
    got = {
        (r.partition, r.n, r.lo, r.hi)
        for r in df.groupBy("partition")
        .agg({"offset": "count"})
        .withColumnRenamed("count(offset)", "n")
        .join(
            df.groupBy("partition").agg({"offset": "min"}).withColumnRenamed("min(offset)", "lo"),
            "partition",
        )
        .join(
            df.groupBy("partition").agg({"offset": "max"}).withColumnRenamed("max(offset)", "hi"),
            "partition",
        )
        .collect()
    }
    assert got == {(0, 900, 3100, 3999), (1, 200, 0, 199)}
    lo, hi = BASE_TS + 1000 * 500, BASE_TS + 1999 * 500
    timed = read_segments(spark, str(log_dir), topics="events", minTimestamp=lo, maxTimestamp=hi)
    offsets = [r.offset for r in timed.where("partition = 0").orderBy("offset").collect()]
    assert offsets == list(range(1000, 2000))


def test_high_watermark_default(spark: Any, tmp_path: Path, log_dir: Path) -> None:
    copy = tmp_path / "logs"
    shutil.copytree(log_dir, copy)
    write_high_watermarks(copy, {("events", 0): 777, ("events", 1): 1500, ("txn", 0): 0})
    df = read_segments(spark, str(copy))
    counts = {
        (r.topic, r.partition): r["count"]
        for r in df.groupBy("topic", "partition").count().collect()
    }
    assert counts == {("events", 0): 777, ("events", 1): 1500}
    everything = read_segments(spark, str(copy), until="latest")
    assert everything.count() == 4000 + 1500 + 20


def test_corrupt_batch_skipped_in_records_and_reported_in_batches(
    spark: Any, tmp_path: Path, log_dir: Path
) -> None:
    copy = tmp_path / "logs"
    shutil.copytree(log_dir, copy)
    batches = read_segments(spark, str(copy), kind="batches", topics="events")
    victim = batches.where("partition = 1").orderBy("position").collect()[4]
    seg = Path(victim.file.replace(str(log_dir), str(copy)))
    data = bytearray(seg.read_bytes())
    data[victim.position + victim.size - 3] ^= 0x5A
    seg.write_bytes(bytes(data))
    records = read_segments(spark, str(copy), topics="events").where("partition = 1")
    offsets = [r.offset for r in records.orderBy("offset").collect()]
    assert offsets == [o for o in range(1500) if not victim.base_offset <= o <= victim.last_offset]
    errors = read_segments(spark, str(copy), kind="batches").where("error IS NOT NULL").collect()
    assert [(e.topic, e.partition, e.position, e.crc_valid) for e in errors] == [
        ("events", 1, victim.position, False)
    ]
    assert "CRC mismatch" in errors[0].error and errors[0].file == str(seg)


def test_kafka_real_fixtures(spark: Any, tmp_path: Path, kafka_real: Path) -> None:
    root = tmp_path / "kafka-real"
    shutil.copytree(kafka_real, root)
    cdc = root / "cdc-lakehouse-pipeline" / "kafka-data"
    df = read_segments(spark, str(cdc), until="latest")
    for topic, partition in [("__cluster_metadata", 0), ("__consumer_offsets", 49)]:
        assert spark_rows(df, topic, partition) == reference(cdc / f"{topic}-{partition}")
    single = root / "kafka-log-parser" / "tests"
    part = tmp_path / "single" / "topic-0"
    part.mkdir(parents=True)
    shutil.copy(single / "00000000000000000000.log", part)
    rows = read_segments(spark, str(part.parent)).orderBy("offset").collect()
    assert [(r.offset, bytes(r.key), bytes(r.value)) for r in rows] == [
        (r[0], r[2], r[3]) for r in reference(part)
    ]
    assert len(rows) == 4
    broker = root / "kaspar" / "kaspar" / "src" / "test" / "resources" / "fakeBroker"
    assert [r.offset for r in read_segments(spark, str(broker)).collect()] == [0]
    errors = read_segments(spark, str(broker), kind="batches").where("error IS NOT NULL").collect()
    assert [(e.segment_base_offset, e.base_offset) for e in errors] == [(100, 0)]


def test_undecodable_batch_with_valid_crc_skipped_or_failing_in_records(
    spark: Any, tmp_path: Path
) -> None:
    from logstore.protocol.batch import compute_crc, iter_batches
    from pipelines.sources import UNDECODABLE_BATCH

    root = tmp_path / "logs"
    recs = [(b"k%d" % i, b"v" * i) for i in range(30)]
    write_partition(root, "u", 0, recs, batch_records=10)
    seg = next((root / "u-0").glob("*.log"))
    data = bytearray(seg.read_bytes())
    position, header = list(iter_batches(data))[1]
    data[position + 61] = 0x01  # zigzag varint -1: a negative record length
    data[position + 17 : position + 21] = compute_crc(data, position, header.size).to_bytes(
        4, "big"
    )
    seg.write_bytes(bytes(data))
    offsets = [r.offset for r in read_segments(spark, str(root)).orderBy("offset").collect()]
    assert offsets == [*range(10), *range(20, 30)]
    with pytest.raises(Exception, match=r"undecodable batch \(CRC valid\)") as info:
        read_segments(spark, str(root), onDecodeError="fail").collect()
    assert UNDECODABLE_BATCH in str(info.value)
    rows = read_segments(spark, str(root), kind="batches", verify="crc").collect()
    assert [r.error for r in rows] == [None, None, None]
    full = read_segments(spark, str(root), kind="batches", verify="full").collect()
    assert [(r.position, r.crc_valid) for r in full if r.error] == [(position, True)]
