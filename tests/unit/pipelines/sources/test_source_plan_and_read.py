"""Planning and reading segment ranges without Spark (the executor code, called directly)."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from logstore.errors import LoglakeError
from logstore.protocol.batch import Codec
from pipelines.decode.reference import reference_decode
from pipelines.sources.plan import SegmentRange, parse_options, plan_ranges
from pipelines.sources.read import read_range
from pipelines.sources.schema import BATCHES_ARROW_SCHEMA, RECORDS_ARROW_SCHEMA
from pipelines.sources.synthetic import write_high_watermarks, write_partition

BASE_TS = 1_700_000_000_000
MIN_TS, MAX_TS = -(2**63), 2**63 - 1


def make_records(n: int, seed: int = 0) -> list[Any]:
    return [
        (
            None if i % 13 == 0 else b"key-%d-%d" % (seed, i),
            None if i % 17 == 0 else bytes([i % 251]) * (i % 90),
            [("h", b"%d" % i), ("null", None)] if i % 4 == 0 else [],
            BASE_TS + i * 1000,
        )
        for i in range(n)
    ]


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    d = tmp_path / "logs"
    write_partition(
        d, "orders", 0, make_records(3000), batch_records=25, codecs=list(Codec),
        segment_bytes=40_000, index_interval_bytes=2048,
    )  # fmt: skip
    write_partition(d, "orders", 1, make_records(400, 1), batch_records=40)
    write_partition(d, "audit", 0, make_records(100, 2), batch_records=10)
    return d


def read_all(options: dict[str, str]) -> tuple[list[SegmentRange], pa.Table]:
    opts = parse_options(options)
    ranges = plan_ranges(opts)
    schema = BATCHES_ARROW_SCHEMA if opts.kind == "batches" else RECORDS_ARROW_SCHEMA
    batches = [
        b
        for r in ranges
        for b in read_range(
            r, kind=opts.kind, min_timestamp=opts.min_timestamp,
            max_timestamp=opts.max_timestamp, verify=opts.verify,
        )
    ]  # fmt: skip
    return ranges, pa.Table.from_batches(batches, schema=schema)


def reference_rows(part_dir: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for seg in sorted(part_dir.glob("*.log")):
        rows.extend(reference_decode(seg.read_bytes())[0])
    return rows


def key(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (
            r["offset"], r["key"], r["value"],
            [(h["key"], h["value"]) if isinstance(h, dict) else h for h in r["headers"]],
            r["codec"], r["batch_position"],
        )
        for r in rows
    ]  # fmt: skip


def test_records_equal_reference_per_partition(log_dir: Path) -> None:
    ranges, table = read_all({"path": str(log_dir)})
    assert {(r.topic, r.partition) for r in ranges} == {("orders", 0), ("orders", 1), ("audit", 0)}
    assert len([r for r in ranges if (r.topic, r.partition) == ("orders", 0)]) >= 3  # segments
    for topic, partition in [("orders", 0), ("orders", 1), ("audit", 0)]:
        got = [r for r in table.to_pylist() if r["topic"] == topic and r["partition"] == partition]
        assert key(got) == key(reference_rows(log_dir / f"{topic}-{partition}"))
    ts_us = table.column("timestamp").cast(pa.int64()).to_pylist()
    assert ts_us == [(BASE_TS + o * 1000) * 1000 for o in table.column("offset").to_pylist()]
    row = table.slice(0, 1).to_pylist()[0]
    assert row["timestamp"].timestamp() * 1000 == pytest.approx(BASE_TS + row["offset"] * 1000)
    assert str(row["date"]) == "2023-11-14"


def test_split_ranges_give_the_same_rows(log_dir: Path) -> None:
    whole_ranges, whole = read_all({"path": str(log_dir), "topics": "orders"})
    split_ranges, split = read_all(
        {"path": str(log_dir), "topics": "orders", "maxPartitionBytes": "6000"}
    )
    assert len(split_ranges) > 2 * len(whole_ranges)
    for a, b in itertools.pairwise(split_ranges):
        if a.path == b.path:
            assert a.end == b.start  # contiguous, no byte read twice or skipped
    assert split.to_pylist() == whole.to_pylist()


def test_read_chunks_cut_inside_a_frame_header_lose_nothing(tmp_path: Path) -> None:
    """A read chunk ending 1-11 bytes into a frame (inside its baseOffset, whose high bytes
    are zero) is a cut frame, not a zero-filled file end. Regression: such a cut once made
    the reader skip the rest of the range as "impossible batchLength"."""
    from pipelines.sources.read import read_records

    d = tmp_path / "logs"
    write_partition(d, "t", 0, make_records(60), batch_records=10, codecs=[Codec.NONE])
    (rng,) = plan_ranges(parse_options({"path": str(d), "until": "latest"}))
    frames = [int(p) for p in pa.Table.from_batches(
        list(read_range(rng, kind="batches", min_timestamp=MIN_TS, max_timestamp=MAX_TS))
    ).column("position").to_pylist()]  # fmt: skip
    second = frames[1]
    for cut in range(1, 13):
        chunk = second + cut
        rows = sum(
            b.num_rows
            for b in read_records(
                rng, min_timestamp=MIN_TS, max_timestamp=MAX_TS, chunk_bytes=chunk
            )
        )
        errors = [
            r["error"]
            for b in read_range(rng, kind="batches", min_timestamp=MIN_TS, max_timestamp=MAX_TS,
                                chunk_bytes=chunk)
            for r in b.to_pylist() if r["error"]
        ]  # fmt: skip
        assert (cut, rows, errors) == (cut, 60, [])


def test_topics_starting_offsets_until(log_dir: Path) -> None:
    _, table = read_all(
        {
            "path": str(log_dir),
            "topics": "orders",
            "startingOffsets": json.dumps({"orders": {"0": 1234, "1": 390}}),
            "until": json.dumps({"orders": {"0": 2001}}),
            "maxPartitionBytes": "8000",
        }
    )
    by_part: dict[int, list[int]] = {}
    for p, o in zip(
        table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True
    ):
        by_part.setdefault(p, []).append(o)
    assert by_part[0] == list(range(1234, 2001))
    assert by_part[1] == list(range(390, 400))
    assert set(table.column("topic").to_pylist()) == {"orders"}


def test_high_watermark_checkpoint_is_the_default_until(log_dir: Path) -> None:
    write_high_watermarks(log_dir, {("orders", 0): 1500, ("orders", 1): 0, ("audit", 0): 100})
    _, table = read_all({"path": str(log_dir)})
    counts = table.group_by(["topic", "partition"]).aggregate(
        [("offset", "max"), ("offset", "count")]
    )
    got = {
        (r["topic"], r["partition"]): (r["offset_count"], r["offset_max"])
        for r in counts.to_pylist()
    }
    assert got == {("orders", 0): (1500, 1499), ("audit", 0): (100, 99)}
    _, latest = read_all({"path": str(log_dir), "until": "latest"})
    assert latest.num_rows == 3000 + 400 + 100


def test_time_filters(log_dir: Path) -> None:
    lo, hi = BASE_TS + 2500 * 1000, BASE_TS + 2600 * 1000
    ranges, table = read_all(
        {"path": str(log_dir), "topics": "orders", "minTimestamp": str(lo), "maxTimestamp": str(hi)}
    )
    offsets = [
        o
        for o, p in zip(
            table.column("offset").to_pylist(), table.column("partition").to_pylist(), strict=True
        )
        if p == 0
    ]
    assert offsets == list(range(2500, 2601))
    all_ranges, _ = read_all({"path": str(log_dir), "topics": "orders"})
    assert len(ranges) < len(all_ranges)  # whole rolled segments skipped by their time index


def test_batches_kind_rows(log_dir: Path) -> None:
    _, table = read_all({"path": str(log_dir), "kind": "batches", "topics": "audit"})
    rows = table.to_pylist()
    assert [r["base_offset"] for r in rows] == list(range(0, 100, 10))
    assert all(r["crc_valid"] and r["error"] is None and r["record_count"] == 10 for r in rows)
    assert [r["position"] for r in rows] == sorted({r["position"] for r in rows})
    assert all(r["last_offset"] == r["base_offset"] + 9 for r in rows)


def test_corrupt_batch_skipped_in_records_reported_in_batches(log_dir: Path) -> None:
    seg = sorted((log_dir / "audit-0").glob("*.log"))[0]
    _, before = read_all({"path": str(log_dir), "kind": "batches", "topics": "audit"})
    victim = before.to_pylist()[3]
    data = bytearray(seg.read_bytes())
    data[victim["position"] + 70] ^= 0xFF
    seg.write_bytes(bytes(data))
    _, records = read_all({"path": str(log_dir), "topics": "audit"})
    assert records.column("offset").to_pylist() == [o for o in range(100) if not 30 <= o < 40]
    _, batches = read_all({"path": str(log_dir), "kind": "batches", "topics": "audit"})
    bad = [r for r in batches.to_pylist() if r["error"]]
    assert [(r["position"], r["crc_valid"]) for r in bad] == [(victim["position"], False)]
    assert "CRC mismatch" in bad[0]["error"]


def test_torn_tail_of_active_segment_is_silent_elsewhere_reported(log_dir: Path) -> None:
    segs = sorted((log_dir / "orders-0").glob("*.log"))
    with segs[-1].open("ab") as f:
        f.write(b"\x00\x00\x00\x00\x00\x00\x0b\xb8\x00\x00\x01\x00\x00")  # torn header
    _, batches = read_all({"path": str(log_dir), "kind": "batches", "topics": "orders"})
    assert [r for r in batches.to_pylist() if r["error"]] == []
    with segs[0].open("ab") as f:
        f.write(b"\x00" * 8 + b"\x00\x00\x01\x00" + b"\x07" * 20)
    _, batches = read_all({"path": str(log_dir), "kind": "batches", "topics": "orders"})
    errors = [r for r in batches.to_pylist() if r["error"]]
    assert len(errors) == 1 and errors[0]["file"] == str(segs[0]) and "torn" in errors[0]["error"]
    _, records = read_all({"path": str(log_dir), "topics": "orders", "until": "latest"})
    assert records.num_rows == 3400


def test_kafka_real_fixtures(tmp_path: Path, kafka_real: Path) -> None:
    root = tmp_path / "kafka-real"
    shutil.copytree(kafka_real, root)
    cdc = root / "cdc-lakehouse-pipeline" / "kafka-data"
    _, table = read_all({"path": str(cdc), "until": "latest"})
    got = table.to_pylist()
    for topic, part in [("__cluster_metadata", 0), ("__consumer_offsets", 49)]:
        mine = [r for r in got if (r["topic"], r["partition"]) == (topic, part)]
        assert key(mine) == key(reference_rows(cdc / f"{topic}-{part}"))
        assert mine
    # replication-offset-checkpoint says __consumer_offsets-49 is at 1: the default honours it.
    _, default = read_all({"path": str(cdc), "topics": "__consumer_offsets"})
    assert default.column("offset").to_pylist() == [0]

    broker = root / "kaspar" / "kaspar" / "src" / "test" / "resources" / "fakeBroker"
    _, records = read_all({"path": str(broker)})
    assert records.column("offset").to_pylist() == [0]  # the mismatched copy is not emitted
    assert records.column("segment_base_offset").to_pylist() == [0]
    _, batches = read_all({"path": str(broker), "kind": "batches"})
    errors = [(r["segment_base_offset"], r["error"]) for r in batches.to_pylist() if r["error"]]
    assert (
        len(errors) == 1
        and errors[0][0] == 100
        and "below the segment's base offset" in errors[0][1]
    )


def test_bad_options_raise_loglake_errors(tmp_path: Path) -> None:
    with pytest.raises(LoglakeError, match="log dir"):
        parse_options({})
    with pytest.raises(LoglakeError, match="startingOffsets"):
        parse_options({"path": "x", "startingOffsets": "{not json"})
    with pytest.raises(LoglakeError, match="kind"):
        parse_options({"path": "x", "kind": "rows"})
    with pytest.raises(LoglakeError, match="does not exist"):
        plan_ranges(parse_options({"path": str(tmp_path / "missing")}))
