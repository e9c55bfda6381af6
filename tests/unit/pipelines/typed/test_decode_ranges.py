"""Which rows of a ``records`` batch a decode task takes (``_in_ranges``): the rows whose
(partition, offset) lies in the task's ranges. A batch nearly always holds one partition's
consecutive offsets, all wanted: then no mask at all (None); otherwise the exact mask."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pipelines.typed.job import _in_ranges

RANGES = {0: (100, 200), 3: (0, 10)}


def _rows(parts: list[int | None], offsets: list[int | None]) -> tuple[pa.Array, pa.Array]:
    return pa.array(parts, pa.int32()), pa.array(offsets, pa.int64())


def _kept(mask: pa.Array | None, n: int) -> list[bool]:
    return [True] * n if mask is None else mask.to_pylist()


def test_a_batch_inside_one_partitions_range_needs_no_mask() -> None:
    part, off = _rows([0, 0, 0], [100, 150, 199])
    assert _in_ranges(part, off, RANGES) is None


@pytest.mark.parametrize(
    ("parts", "offsets", "kept"),
    [
        ([0, 0, 0], [99, 100, 101], [False, True, True]),  # straddles the start
        ([0, 0, 0], [198, 199, 200], [True, True, False]),  # straddles the end (exclusive)
        ([0, 0], [5, 6], [False, False]),  # below the range
        ([1, 1], [150, 151], [False, False]),  # a partition not in the ranges
        ([0, 3, 0, 3], [150, 9, 250, 10], [True, True, False, False]),  # two partitions
        ([7, 7], [0, 1], [False, False]),  # beyond the highest partition of the ranges
    ],
)
def test_the_mask_keeps_exactly_the_rows_in_the_ranges(
    parts: list[int], offsets: list[int], kept: list[bool]
) -> None:
    part, off = _rows(parts, offsets)
    assert _kept(_in_ranges(part, off, RANGES), len(parts)) == kept


def test_chunked_columns_of_a_table_are_checked_too() -> None:
    table = pa.table({"partition": pa.array([3, 3], pa.int32()), "offset": [8, 12]})
    table = pa.concat_tables([table, table])
    assert _kept(_in_ranges(table["partition"], table["offset"], RANGES), 4) == [
        True,
        False,
        True,
        False,
    ]
    inside = pa.concat_tables([table.slice(0, 1)] * 3)
    assert _in_ranges(inside["partition"], inside["offset"], RANGES) is None
