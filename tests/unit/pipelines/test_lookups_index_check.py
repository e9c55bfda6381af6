"""The index check of an active segment read while the broker appends (no Spark: the check
itself, over batches read with the executor code)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

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
