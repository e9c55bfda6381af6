"""Damage in the middle of a segment: the reader resynchronises and every sound batch is read.

Segments are written by the real storage engine (``logstore.storage`` through
``pipelines.sources.synthetic``); then bytes are overwritten in place — a batchLength made
impossible, too small, or plausible but wrong, a header forged inside the damage, a torn or
zero-filled tail — and the ranges are read as the ingest job reads them (every range of the
plan, a ``RangeReport`` each), the reports turned into skipped offsets by
``pipelines.sources.damage``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from logstore.protocol.batch import Codec, iter_batches
from logstore.protocol.records import build_batch
from pipelines.sources.damage import Skipped, skipped_offsets
from pipelines.sources.plan import parse_options, plan_ranges
from pipelines.sources.read import RangeReport, read_batches, read_records
from pipelines.sources.synthetic import write_batches, write_partition

MIN_TS, MAX_TS = -(2**63), 2**63 - 1
BASE_TS = 1_700_000_000_000
BIG = 0x7FFFFFF0


def make_records(n: int, seed: int = 0) -> list[Any]:
    return [
        (b"k-%d-%d" % (seed, i), bytes([(i * 7) % 251]) * (i % 90), [], BASE_TS + i)
        for i in range(n)
    ]


def frames(seg: Path) -> list[tuple[int, int, int, int]]:
    """``(position, size, base_offset, next_offset)`` of every batch of ``seg``."""
    return [(p, h.size, h.base_offset, h.next_offset) for p, h in iter_batches(seg.read_bytes())]


def set_length(seg: Path, position: int, length: int) -> None:
    with seg.open("r+b") as f:
        f.seek(position + 8)
        f.write((length & 0xFFFFFFFF).to_bytes(4, "big"))


def read_partition(
    log_dir: Path, *, chunk_bytes: int = 16 << 20, max_bytes: int = 1 << 30
) -> tuple[list[int], list[dict[str, Any]], list[dict[str, Any]]]:
    """``(offsets read, range reports, damaged rows of kind=batches)`` of every range."""
    opts = parse_options(
        {"path": str(log_dir), "until": "latest", "maxPartitionBytes": str(max_bytes)}
    )
    offsets: list[int] = []
    reports: list[dict[str, Any]] = []
    bad: list[dict[str, Any]] = []
    for rng in plan_ranges(opts):
        report = RangeReport(rng.topic, rng.partition)
        for b in read_records(
            rng, min_timestamp=MIN_TS, max_timestamp=MAX_TS, report=report,
            chunk_bytes=chunk_bytes,
        ):  # fmt: skip
            offsets.extend(b.column("offset").to_pylist())
        reports.append(json.loads(json.dumps(report.to_json())))  # as the driver gets it
        for b in read_batches(rng, min_timestamp=MIN_TS, chunk_bytes=chunk_bytes):
            bad.extend(r for r in b.to_pylist() if r["error"])
    return offsets, reports, bad


def runs(skipped: list[Skipped]) -> list[tuple[int, int, int, int | None]]:
    return [(s.position, s.bytes, s.from_offset, s.to_offset) for s in skipped]


@pytest.fixture
def partition(tmp_path: Path) -> tuple[Path, Path]:
    d = tmp_path / "logs"
    write_partition(
        d, "t", 0, make_records(2000), batch_records=20,
        codecs=[Codec.NONE, Codec.LZ4, Codec.ZSTD, Codec.GZIP, Codec.SNAPPY],
        index_interval_bytes=2048,
    )  # fmt: skip
    return d, next((d / "t-0").glob("*.log"))


@pytest.mark.parametrize(
    ("chunk_bytes", "max_bytes"), [(700, 1 << 30), (4096, 3000), (16 << 20, 5000)]
)
def test_corrupt_lengths_at_several_places_lose_no_sound_batch(
    partition: tuple[Path, Path], chunk_bytes: int, max_bytes: int
) -> None:
    d, seg = partition
    f = frames(seg)
    assert len(f) == 100
    # batch 10: impossible; 40 and 41 (adjacent): zero and too small for a header; 71: a
    # compressed batch (lz4) whose length is plausible but 300 too long (a sound batch starts
    # inside it); 92: a compressed batch (zstd) 20 bytes too short; 99: the last batch.
    lengths = {10: BIG, 40: 0, 41: 30, 71: f[71][1] - 12 + 300, 92: f[92][1] - 32, 99: BIG}
    for k, length in lengths.items():
        set_length(seg, f[k][0], length)
    offsets, reports, bad = read_partition(d, chunk_bytes=chunk_bytes, max_bytes=max_bytes)
    lost = {o for k in lengths for o in range(f[k][2], f[k][3])}
    assert offsets == [o for o in range(2000) if o not in lost]

    skipped, rows, ends = skipped_offsets(reports, {("t", 0): 0}, {("t", 0): 2000})
    whole = [(f[k][0], f[k][1], f[k][2], f[k][3]) for k in (10, 71, 92, 99)]
    merged = (f[40][0], f[40][1] + f[41][1], f[40][2], f[41][3])
    assert runs(skipped) == sorted([*whole, merged])
    assert ends == {("t", 0): 2000}  # the damaged last batch is skipped up to the watermark
    assert sum(s.offsets for s in skipped) == len(lost)
    # Every unreadable byte is in exactly one quarantine row (file, position, size).
    covered = sorted((r["position"], r["position"] + r["size"]) for r in rows)
    spans = sorted((p, p + s) for p, s, _, _ in [*whole, merged])
    assert all(r["file"] == str(seg) for r in rows)
    joined: list[tuple[int, int]] = []
    for a, b in covered:
        if joined and joined[-1][1] == a:
            joined[-1] = (joined[-1][0], b)
        else:
            joined.append((a, b))
    assert joined == spans
    # kind=batches says the same, but for the end of the active segment: a frame running past
    # it may be in flight, unless offsets below the high watermark (which it does not know)
    # are missing
    assert sorted((r["position"], r["size"]) for r in bad) == sorted(
        (r["position"], r["size"]) for r in rows if r["position"] != f[99][0]
    )
    assert any("batchLength 2147483632" in r["error"] for r in rows)
    assert any("impossible batchLength 0" in r["error"] for r in rows)


def test_a_forged_header_inside_the_damage_is_not_taken(tmp_path: Path) -> None:
    """Two decoys inside a damaged batch: a header with a sane length and offsets but a wrong
    CRC, and a whole valid batch (CRC matches) whose base offset is below the last sound one."""
    d = tmp_path / "logs"
    write_partition(d, "t", 0, make_records(300), batch_records=30, codecs=[Codec.NONE])
    seg = next((d / "t-0").glob("*.log"))
    f = frames(seg)
    p, size, base, end = f[5]
    decoy = bytearray(build_batch([(b"x", b"y", [], BASE_TS)]))
    decoy[0:8] = (3).to_bytes(8, "big")  # offset 3: long ingested; the CRC does not cover it
    fake = bytearray(decoy)
    fake[0:8] = (base + 1).to_bytes(8, "big")
    fake[17:21] = b"\x00\x00\x00\x01"  # wrong CRC
    data = bytearray(seg.read_bytes())
    data[p + 100 : p + 100 + len(fake)] = fake
    data[p + 300 : p + 300 + len(decoy)] = decoy
    assert p + 300 + len(decoy) < p + size
    seg.write_bytes(bytes(data))
    set_length(seg, p, BIG)
    offsets, reports, _ = read_partition(d)
    assert offsets == [o for o in range(300) if not base <= o < end]
    skipped, rows, _ = skipped_offsets(reports, {("t", 0): 0}, {("t", 0): 300})
    assert runs(skipped) == [(p, size, base, end)]
    # one unreadable range: the reader never stopped at a decoy
    assert [(r["position"], r["size"]) for r in rows] == [(p, size)]


def test_a_whole_valid_batch_inside_the_damage_must_agree_with_the_index(tmp_path: Path) -> None:
    """A valid batch (CRC matches) inside the damaged one, with offsets above the last sound
    batch's — a record value may hold one — is not taken when the ``.index`` says the
    damaged batch at that place holds those offsets: its record is not read as the log's."""
    d = tmp_path / "logs"
    write_partition(
        d, "t", 0, make_records(300), batch_records=30, codecs=[Codec.NONE],
        index_interval_bytes=1,  # every batch in the index
    )  # fmt: skip
    seg = next((d / "t-0").glob("*.log"))
    f = frames(seg)
    p, size, base, end = f[5]
    decoy = bytearray(build_batch([(b"x", b"y", [], BASE_TS)]))
    decoy[0:8] = (base + 1).to_bytes(8, "big")
    data = bytearray(seg.read_bytes())
    data[p + 200 : p + 200 + len(decoy)] = decoy
    seg.write_bytes(bytes(data))
    set_length(seg, p, BIG)
    offsets, reports, _ = read_partition(d)
    assert offsets == [o for o in range(300) if not base <= o < end]
    skipped, rows, _ = skipped_offsets(reports, {("t", 0): 0}, {("t", 0): 300})
    assert runs(skipped) == [(p, size, base, end)] and len(rows) == 1


def test_damage_at_and_across_range_boundaries(tmp_path: Path) -> None:
    """Ranges are cut at ``.index`` entries: a range may start on the damaged batch, and a
    run of damage may start in one range and go on in the next (or in the next segment)."""
    d = tmp_path / "logs"
    write_partition(
        d, "t", 0, make_records(3000), batch_records=20, codecs=[Codec.NONE, Codec.LZ4],
        segment_bytes=60_000, index_interval_bytes=1024,
    )  # fmt: skip
    segs = sorted((d / "t-0").glob("*.log"))
    assert len(segs) >= 3
    opts = parse_options({"path": str(d), "until": "latest", "maxPartitionBytes": "4000"})
    cuts = [r.start for r in plan_ranges(opts) if r.path == str(segs[0]) and r.start > 0]
    f = frames(segs[0])
    at = {p: i for i, (p, *_rest) in enumerate(f)}
    first, second = at[cuts[1]], at[cuts[4]]
    set_length(segs[0], f[first][0], BIG)  # a range starts on it
    set_length(segs[0], f[second - 1][0], BIG)  # the last batch of a range ...
    set_length(segs[0], f[second][0], BIG)  # ... and the first of the next
    g = frames(segs[1])
    set_length(segs[1], g[-1][0], BIG)  # the last batch of a rolled segment
    offsets, reports, _ = read_partition(d, max_bytes=4000)
    lost = [(f[first][2], f[first][3]), (f[second - 1][2], f[second][3]), (g[-1][2], g[-1][3])]
    assert offsets == [o for o in range(3000) if not any(a <= o < b for a, b in lost)]
    skipped, _, _ = skipped_offsets(reports, {("t", 0): 0}, {("t", 0): 3000})
    assert runs(skipped) == [
        (f[first][0], f[first][1], *lost[0]),
        (f[second - 1][0], f[second - 1][1] + f[second][1], *lost[1]),
        (g[-1][0], g[-1][1], *lost[2]),
    ]
    assert [s.batches for s in skipped] == [1, 2, 1]


def test_tail_of_the_active_segment(tmp_path: Path) -> None:
    """A frame cut by the end of the active segment is in flight unless its offsets are below
    the high watermark; zero fill after the last batch is nothing; an impossible length in
    the last batch is damage up to the high watermark."""
    d = tmp_path / "logs"
    write_partition(d, "t", 0, make_records(200), batch_records=20)
    seg = next((d / "t-0").glob("*.log"))
    f = frames(seg)
    p, size, base, _ = f[-1]
    with seg.open("r+b") as fh:
        fh.truncate(p + size - 40)  # the last batch torn
    offsets, reports, bad = read_partition(d)
    assert offsets == list(range(base))
    assert bad == []  # kind=batches: a torn tail of the active segment is not damage by itself
    # below the high watermark: skipped (and quarantined), progress goes to the watermark
    skipped, rows, ends = skipped_offsets(reports, {("t", 0): 0}, {("t", 0): 200})
    assert runs(skipped) == [(p, size - 40, base, 200)] and ends == {("t", 0): 200}
    assert "torn" in rows[0]["error"] and rows[0]["size"] == size - 40
    # at the watermark (a batch still being written): nothing to say
    assert skipped_offsets(reports, {("t", 0): 0}, {("t", 0): base}) == ([], [], {})
    assert skipped_offsets(reports, {("t", 0): 0}, None) == ([], [], {})

    with seg.open("r+b") as fh:
        fh.truncate(p)
        fh.seek(p)
        fh.write(bytes(4096))  # zero fill, as a preallocated segment
    offsets, reports, bad = read_partition(d)
    assert offsets == list(range(base)) and bad == []
    assert skipped_offsets(reports, {("t", 0): 0}, {("t", 0): base}) == ([], [], {})
    # ... unless it hides offsets below the high watermark
    skipped, _, _ = skipped_offsets(reports, {("t", 0): 0}, {("t", 0): 200})
    assert runs(skipped) == [(p, 4096, base, 200)]


def test_progress_decides_what_is_new(partition: tuple[Path, Path]) -> None:
    """A re-run reads a damaged segment again from its start: runs below progress are an
    earlier run's; a run straddling it is clipped; runs past the watermark wait."""
    d, seg = partition
    f = frames(seg)
    for k in (10, 50, 90):
        set_length(seg, f[k][0], BIG)
    _, reports, _ = read_partition(d)
    tp = ("t", 0)
    skipped, rows, _ = skipped_offsets(reports, {tp: f[11][2]}, {tp: 2000})
    assert [(s.from_offset, s.to_offset) for s in skipped] == [
        (f[50][2], f[50][3]), (f[90][2], f[90][3]),
    ]  # fmt: skip
    assert [r["position"] for r in rows] == [f[50][0], f[90][0]]
    skipped, _, ends = skipped_offsets(reports, {tp: f[50][2] + 5}, {tp: f[90][2]})
    assert [(s.from_offset, s.to_offset) for s in skipped] == [(f[50][2] + 5, f[50][3])]
    assert ends == {tp: f[50][3]}
    skipped, _, ends = skipped_offsets(reports, {tp: 0}, {tp: f[90][2] + 3})
    assert skipped[-1].to_offset == f[90][2] + 3 and ends == {tp: f[90][2] + 3}


def test_no_damage_no_runs(tmp_path: Path) -> None:
    d = tmp_path / "logs"
    write_batches(d, "t", 0, [build_batch(make_records(10, s)) for s in range(5)])
    offsets, reports, bad = read_partition(d, chunk_bytes=300)
    assert offsets == list(range(50)) and bad == []
    assert all(r["regions"] == [] for r in reports)
    assert skipped_offsets(reports, {("t", 0): 0}, {("t", 0): 50}) == ([], [], {})
