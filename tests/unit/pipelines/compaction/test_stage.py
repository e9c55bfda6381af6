"""Stage 1 of the table merge (``stage._stage_inputs``, in this process, no Spark) against the
reference model: several ``records`` files, offset ranges, null keys, tombstones, keys on both
sides of the hash table's 15 bytes, every strategy; and, for ``--full``, table files (with a
deletion vector) that go through unchanged.

What stage 1 must stage: of the records of ``ranges`` with a key, the model's winner of every
(partition, key) (``model.latest``; one task here, so one winner per key), with all its
columns; every live row of the table files; each row in the Arrow IPC file of its bucket
(Spark's ``pmod(xxhash64(key), N)``), the files' row counts as the task reports them.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import tempfile
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.compaction import stage
from pipelines.compaction.hashing import buckets_of
from pipelines.compaction.model import Rec, Strategy, latest, parse_strategy
from pipelines.compaction.stage import StageInput
from pipelines.compaction.table import BUCKET, SRC, TABLE_SCHEMA, VERSION
from pipelines.sources import RECORDS_ARROW_SCHEMA

_HEADERS = RECORDS_ARROW_SCHEMA.field("headers").type
_KEYS = st.one_of(
    st.none(),
    st.sampled_from([b"", b"a", b"b", b"k" * 15, b"k" * 16, b"k" * 15 + b"j", b"x" * 33]),
)
_RECORD = st.tuples(
    st.integers(0, 2),  # partition
    _KEYS,
    st.one_of(st.none(), st.binary(max_size=4)),  # value (None: a tombstone)
    st.integers(0, 5),  # timestamp (ms)
    st.one_of(st.none(), st.integers(-2, 2)),  # header "v" (None: no header)
)
_RANGE = st.one_of(st.none(), st.tuples(st.integers(0, 4), st.integers(0, 30)))


def _records_table(recs: list[Rec]) -> pa.Table:
    """``recs`` as ``records`` rows (the columns stage 1 reads, and one it must not need)."""
    return pa.table(
        {
            "topic": pa.array(["t"] * len(recs)),
            "partition": pa.array([r.partition for r in recs], pa.int32()),
            "offset": pa.array([r.offset for r in recs], pa.int64()),
            "timestamp": pa.array(
                [dt.datetime.fromtimestamp(r.timestamp / 1000, tz=dt.UTC) for r in recs],
                pa.timestamp("us", tz="UTC"),
            ),
            "timestamp_type": pa.array([0] * len(recs), pa.int32()),
            "key": pa.array([r.key for r in recs], pa.binary()),
            "value": pa.array([r.value for r in recs], pa.binary()),
            "headers": pa.array(
                [[{"key": k, "value": v} for k, v in r.headers] for r in recs], _HEADERS
            ),
        }
    )


def _as_row(rec: Rec) -> dict[str, Any]:
    return {
        "partition": rec.partition,
        "key": rec.key,
        "value": rec.value,
        "headers": [{"key": k, "value": v} for k, v in rec.headers],
        "offset": rec.offset,
        "timestamp": dt.datetime.fromtimestamp(rec.timestamp / 1000, tz=dt.UTC),
        "timestamp_type": 0,
        VERSION: None,
        SRC: 0,
    }


def _table_file(folder: str, name: str, n: int, seed: int) -> tuple[str, list[dict[str, Any]]]:
    """A table file of ``n`` rows (distinct keys, versions set) and its rows as dicts."""
    rng = np.random.default_rng(seed)
    rows = [
        {
            "partition": int(rng.integers(0, 3)),
            "key": f"{name}-{i}".encode() * int(rng.integers(1, 4)),
            "value": bytes(rng.integers(0, 256, 3, dtype=np.uint8)),
            "headers": [],
            "offset": 100 + i,
            "timestamp": dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
            "timestamp_type": 1,
            VERSION: int(rng.integers(-5, 5)),
            BUCKET: 99,  # a stale bucket: stage 1 computes it again (N may change)
        }
        for i in range(n)
    ]
    path = os.path.join(folder, f"{name}.parquet")
    pq.write_table(pa.Table.from_pylist(rows, schema=TABLE_SCHEMA), path)
    return path, rows


def _staged(folder: str, lines: list[str], buckets: int) -> list[dict[str, Any]]:
    """Every staged row, checked against the bucket of its file and the reported counts."""
    out: list[dict[str, Any]] = []
    for line in lines:
        item = json.loads(line)
        assert os.path.dirname(os.path.dirname(item["path"])) == folder
        with pa.memory_map(item["path"]) as source:
            rows = pa.ipc.open_file(source).read_all()
        assert rows.schema == stage._STAGED_SCHEMA
        assert rows.num_rows == item["rows"] > 0
        assert set(rows.column(BUCKET).to_pylist()) == {item["bucket"]}
        assert buckets_of(rows.column("key"), buckets).tolist() == [item["bucket"]] * len(rows)
        out += rows.drop_columns([BUCKET]).to_pylist()
    assert len({json.loads(line)["path"] for line in lines}) == len(lines)
    return out


def _sort_key(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row[SRC], row["partition"], row["key"], row["offset"])


@settings(max_examples=150, deadline=None)
@given(
    st.lists(_RECORD, max_size=40),
    st.lists(st.integers(0, 40), max_size=3),  # where the records are cut into files
    st.tuples(_RANGE, _RANGE, _RANGE),  # offsets [lo, hi) per partition (None: not read)
    st.sampled_from(["offset", "timestamp", "header:v"]),
    st.sampled_from([1, 3, 16]),  # buckets
    st.booleans(),  # small batches: payload read and staged a few rows at a time
    st.booleans(),  # --full: table files too
)
def test_stage_one_stages_the_models_winners(  # noqa: PLR0917
    raw: list[tuple[int, bytes | None, bytes | None, int, int | None]],
    cuts: list[int],
    ranges_raw: tuple[tuple[int, int] | None, ...],
    strategy_text: str,
    buckets: int,
    small_batches: bool,
    full: bool,
) -> None:
    strategy: Strategy = parse_strategy(strategy_text)
    next_offset = [0, 0, 0]
    recs = []
    for i, (part, key, payload, ts, hv) in enumerate(raw):
        headers = () if hv is None else (("v", hv.to_bytes(2, "big", signed=True)),)
        value = None if payload is None else payload + bytes([i])  # a row mixed up shows
        recs.append(Rec(part, next_offset[part], ts, key, value, headers))
        next_offset[part] += 1 + (ts % 2)  # gaps, as compaction leaves them
    ranges = {p: r for p, r in enumerate(ranges_raw) if r is not None}
    with tempfile.TemporaryDirectory() as folder:
        inputs = []
        bounds = sorted({0, len(recs), *(min(c, len(recs)) for c in cuts)})
        for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
            path = os.path.join(folder, f"records-{i}.parquet")
            pq.write_table(_records_table(recs[lo:hi]), path)
            inputs.append(StageInput(path, 0))
        read = [
            r
            for r in recs
            if ranges.get(r.partition, (0, 0))[0] <= r.offset < ranges.get(r.partition, (0, 0))[1]
        ]
        want = [_as_row(r) for r in latest(read, strategy).values()]
        if full:
            live, live_rows = _table_file(folder, "live", 7, len(recs))
            tomb, tomb_rows = _table_file(folder, "tomb", 3, len(recs) + 1)
            deleted = np.array([1, 4], np.int64)
            inputs += [StageInput(live, 1, deleted), StageInput(tomb, 2)]
            for src, rows in ((1, live_rows), (2, tomb_rows)):
                for i, row in enumerate(rows):
                    if not (src == 1 and i in deleted):
                        want.append({**{k: v for k, v in row.items() if k != BUCKET}, SRC: src})
        staging = os.path.join(folder, "staging")
        with pytest.MonkeyPatch.context() as mp:
            if small_batches:
                mp.setattr(stage, "_PAYLOAD_BATCH", 2)
                mp.setattr(stage, "_STAGED_BATCH", 3)
            lines = list(stage._stage_inputs(inputs, 3, 1, staging, ranges, buckets, strategy))
        got = _staged(staging, lines, buckets)
        assert all(os.path.basename(json.loads(line)["path"]) == "3-1.arrow" for line in lines)
    assert sorted(got, key=_sort_key) == sorted(want, key=_sort_key)


def test_stage_groups_one_task_per_core_balanced_by_size(tmp_path: Any) -> None:
    sizes = [900, 100, 880, 120, 890, 110, 870, 130]
    inputs = []
    for i, size in enumerate(sizes):
        path = tmp_path / f"f{i}"
        path.write_bytes(b"x" * size)
        inputs.append(StageInput(str(path), 0))
    groups = stage._stage_groups(inputs, 2)
    assert len(groups) == 2
    assert sorted(i.path for g in groups for i in g) == sorted(i.path for i in inputs)
    loads = [sum(os.path.getsize(i.path) for i in g) for g in groups]
    assert max(loads) - min(loads) <= 130
    assert len(stage._stage_groups(inputs[:1], 4)) == 1
    assert len(stage._stage_groups(inputs, 16)) == len(inputs)
