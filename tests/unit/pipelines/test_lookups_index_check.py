"""The index check of an active segment read while the broker appends (no Spark: the check
itself, over batches read with the executor code)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest

from pipelines import lookups
from pipelines.lookups import _CHECK_COLUMNS, _check_segment_table
from pipelines.sources.plan import parse_options, plan_ranges
from pipelines.sources.read import read_range
from pipelines.sources.synthetic import write_partition

MIN_TS, MAX_TS = -(2**63), 2**63 - 1


def _segment_batches(log_dir: Path) -> pa.Table:
    opts = parse_options({"path": str(log_dir), "kind": "batches", "until": "latest"})
    (rng,) = plan_ranges(opts)
    parts = read_range(rng, kind="batches", min_timestamp=MIN_TS, max_timestamp=MAX_TS)
    return pa.Table.from_batches([b.select(_CHECK_COLUMNS) for b in parts])


def test_entries_past_what_was_read_of_the_active_segment_are_not_judged(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    records = [(b"k%d" % i, b"v" * 200, [], 1_700_000_000_000 + i) for i in range(400)]
    write_partition(log_dir, "t", 0, records, batch_records=5, index_interval_bytes=512)
    whole = _segment_batches(log_dir)
    assert whole.num_rows == 80
    assert _check_segment_table(whole) == []
    # what a read planned before the last 30 batches were appended sees: their index entries
    # exist, their batches were not read
    seen = whole.sort_by("position").slice(0, 50)
    # a rolled segment whose index points past its batches: reported
    late = _check_segment_table(seen)
    assert {p.problem for p in late} >= {"position is not a batch start"}
    assert all(p.offset > seen.column("last_offset")[-1].as_py() for p in late)
    # as the log's active segment: those entries are the broker's appends since, not damage
    assert _check_segment_table(seen, active=True) == []


def _torn_then_landed(
    log_dir: Path, monkeypatch: pytest.MonkeyPatch, *, lands: bool
) -> tuple[pa.Table, list[float]]:
    """The active segment's time index with its last entry as a reader can catch the broker
    writing it: struct writes a big-endian int64 from its last byte back, so the timestamp's
    low bytes are there, its high bytes and the relative offset are still zero. The pause
    before the second read is where the broker finishes the entry (``lands``) or not."""
    records = [(b"k%d" % i, b"v" * 200, [], 1_700_000_000_000 + i) for i in range(400)]
    write_partition(log_dir, "t", 0, records, batch_records=5, index_interval_bytes=512)
    whole = _segment_batches(log_dir)
    (timeindex,) = (log_dir / "t-0").glob("*.timeindex")
    data = bytearray(timeindex.read_bytes())
    entries = len(data) // 12
    last = bytes(data[(entries - 1) * 12 :])
    torn = bytes(4) + last[4:8] + bytes(4)
    timeindex.write_bytes(bytes(data[: (entries - 1) * 12]) + torn + bytes(12 * 50))
    pauses: list[float] = []

    def broker_writes_meanwhile(seconds: float) -> None:
        pauses.append(seconds)
        if lands:
            timeindex.write_bytes(bytes(data[: (entries - 1) * 12]) + last + bytes(12 * 50))

    monkeypatch.setattr(lookups, "time", SimpleNamespace(sleep=broker_writes_meanwhile))
    return whole, pauses


def test_an_entry_the_broker_is_writing_is_read_again_not_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole, pauses = _torn_then_landed(tmp_path / "logs", monkeypatch, lands=True)
    assert _check_segment_table(whole, active=True) == []
    assert pauses == [lookups._REREAD_S]  # the first read saw the torn entry


def test_damage_in_the_active_segment_is_still_reported_after_the_second_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole, pauses = _torn_then_landed(tmp_path / "logs", monkeypatch, lands=False)
    problems = _check_segment_table(whole, active=True)
    assert [p.problem for p in problems] == ["timestamps not increasing"]
    assert problems[0].kind == "timeindex" and pauses == [lookups._REREAD_S]
    # a rolled segment is final: read once
    pauses.clear()
    assert [p.problem for p in _check_segment_table(whole)] == ["timestamps not increasing"]
    assert pauses == []
