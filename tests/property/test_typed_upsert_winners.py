"""The upsert path's winners picked in two rounds (each Spark task its own, then the driver
among the tasks' winners, :func:`pipelines.typed.upsert.collect_tasks`) are the winners picked
in one round over all rows, with the same versions: for every strategy of compacted topics and
for CDC (versions decoded, possibly null), keyed by (partition, key) or by the key alone."""

from __future__ import annotations

import itertools
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.compaction.model import parse_strategy
from pipelines.typed.job import KAFKA_TYPE
from pipelines.typed.upsert import DELETED, VERSION, pick_winners

ROW = st.tuples(
    st.integers(0, 2),  # partition
    st.sampled_from([b"a", b"b", b"c", b"d"]),  # key
    st.integers(0, 50),  # timestamp (ms)
    st.one_of(st.none(), st.integers(0, 5)),  # header "v" / CDC version
    st.booleans(),  # deleted
)


def _table(rows: list[tuple[int, bytes, int, int | None, bool]]) -> pa.Table:
    kafka = [
        {
            "partition": p,
            "offset": i,  # unique: ties between partitions stay out of the question
            "timestamp": ts * 1000,
            "timestamp_type": 0,
            "key": k,
            "headers": [] if v is None else [{"key": "v", "value": v.to_bytes(8, "big")}],
            "key_schema_id": None,
            "value_schema_id": 1,
        }
        for i, (p, k, ts, v, _d) in enumerate(rows)
    ]
    return pa.table(
        {
            "n": pa.array(range(len(rows)), pa.int64()),
            "_kafka": pa.array(kafka, KAFKA_TYPE),
            VERSION: pa.array([v for _p, _k, _ts, v, _d in rows], pa.int64()),
            DELETED: pa.array([d for *_r, d in rows], pa.bool_()),
        }
    )


def _picked(table: pa.Table) -> list[tuple[Any, ...]]:
    return sorted(zip(table["n"].to_pylist(), table[VERSION].to_pylist(), strict=True))


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(ROW, min_size=1, max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=3),
    rule=st.sampled_from(["offset", "timestamp", "header:v", "cdc"]),
    by_key_only=st.booleans(),
)
def test_winners_of_the_tasks_winners_are_the_runs_winners(
    rows: list[tuple[int, bytes, int, int | None, bool]],
    cuts: list[int],
    rule: str,
    by_key_only: bool,
) -> None:
    strategy = None if rule == "cdc" else parse_strategy(rule)
    table = _table(rows)
    once = pick_winners(table, strategy=strategy, by_key_only=by_key_only)
    bounds = [0, *sorted(min(c, len(rows)) for c in cuts), len(rows)]
    tasks = [
        pick_winners(table.slice(lo, hi - lo), strategy=strategy, by_key_only=by_key_only)
        for lo, hi in itertools.pairwise(bounds)
        if hi > lo
    ]
    twice = pick_winners(pa.concat_tables(tasks), strategy=strategy, by_key_only=by_key_only)
    assert _picked(twice) == _picked(once)
    keys = {(None if by_key_only else p, k) for p, k, *_ in rows}
    assert once.num_rows == len(keys)  # one winner per key, deletes included
