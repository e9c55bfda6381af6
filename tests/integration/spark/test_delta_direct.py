"""Direct writes (``pipelines.delta.direct``): tasks write Parquet in the Python worker, the
driver sees their reports, then commits or aborts. Read back with deltalake and polars."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from pipelines.delta import DeltaSinkError, StaleTransactionError, read_app_transactions
from pipelines.delta.direct import stage_files, write_direct

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([pa.field("part", pa.string()), pa.field("n", pa.int64())])


def _produce(task: tuple[str, int, int]) -> Iterator[Any]:
    part, start, count = task
    if count < 0:
        yield pa.record_batch([pa.array([part]), pa.array([start])], schema=SCHEMA)
        raise RuntimeError(f"task {part} broke after writing a batch")
    for lo in range(start, start + count, 3):
        hi = min(lo + 3, start + count)
        yield pa.record_batch([pa.array([part] * (hi - lo)), pa.array(range(lo, hi))], SCHEMA)
    yield {"part": part, "rows": count}


def _parquet_files(root: Path) -> set[Path]:
    return {p.resolve() for p in root.rglob("*.parquet")}


def test_reports_come_back_before_the_commit_which_carries_app_transactions(
    spark: SparkSession, tmp_path: Path
) -> None:
    root = tmp_path / "t"
    tasks = [("a", 0, 7), ("b", 100, 5), ("a", 50, 0)]
    staged = stage_files(spark, root, tasks, _produce, schema=SCHEMA, partition_by=["part"])
    assert staged.reports == [{"part": "a", "rows": 7}, {"part": "b", "rows": 5},
                              {"part": "a", "rows": 0}]  # fmt: skip
    assert staged.num_rows == 12 and _parquet_files(root)
    assert not DeltaTable.is_deltatable(str(root))  # nothing committed yet
    result = staged.commit(app_transactions={"app": 3}, expected_versions={"app": None})
    assert result.committed and result.num_rows == 12
    got = pl.read_delta(str(root)).sort("n")
    assert got["n"].to_list() == [*range(7), *range(100, 105)]
    assert got["part"].to_list() == ["a"] * 7 + ["b"] * 5
    assert read_app_transactions(str(root)) == {"app": 3}
    live = {Path(u).resolve() for u in DeltaTable(str(root)).file_uris()}
    assert _parquet_files(root) == live
    # the same write again is a no-op (checked before any task runs)
    again = write_direct(
        spark, root, tasks, _produce, schema=SCHEMA, partition_by=["part"],
        app_transactions={"app": 3}, expected_versions={"app": None},
    )  # fmt: skip
    assert not again.committed and pl.read_delta(str(root)).height == 12
    # a stale expectation is refused and leaves no file behind
    stale = stage_files(spark, root, [("c", 0, 4)], _produce, schema=SCHEMA, partition_by=["part"])
    with pytest.raises(StaleTransactionError):
        stale.commit(app_transactions={"app": 4}, expected_versions={"app": 1})
    assert _parquet_files(root) == live


def test_abort_and_failed_tasks_leave_no_files(spark: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "t"
    staged = stage_files(spark, root, [("a", 0, 9)], _produce, schema=SCHEMA)
    assert len(_parquet_files(root)) == 1
    staged.abort()
    assert _parquet_files(root) == set()
    with pytest.raises(DeltaSinkError, match="broke after writing a batch"):
        stage_files(spark, root, [("a", 0, 9), ("b", 0, -1), ("c", 0, 4)], _produce, schema=SCHEMA)
    assert _parquet_files(root) == set() and not DeltaTable.is_deltatable(str(root))


def _frozen_objects(task: int) -> Iterator[Any]:
    yield {"task": task, "frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects())}


def test_tasks_freeze_what_is_alive_when_they_start(spark: SparkSession, tmp_path: Path) -> None:
    """pyspark's reused worker runs a full gc.collect() after every task; the objects alive
    when a task starts (modules, kernels) are frozen so that it does not walk them again."""
    staged = stage_files(spark, tmp_path / "t", [1, 2], _frozen_objects, schema=SCHEMA)
    assert [r["task"] for r in staged.reports] == [1, 2]
    for report in staged.reports:
        # the worker's modules (pyspark, pyarrow...) are frozen; what the collector still
        # tracks is what the task made since it started
        assert report["frozen"] > 10_000 and report["tracked"] < report["frozen"] // 10, report


def test_discarded_tasks_are_staged_again_into_the_same_write(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A caller drops some tasks' files and reports before the commit and stages other tasks
    into the same write (ingest's read_committed re-read): the commit holds exactly the kept
    tasks' rows and the new ones, the dropped files are gone from disk, task ids never clash."""
    root = tmp_path / "t"
    staged = stage_files(spark, root, [("a", 0, 7), ("b", 100, 5), ("a", 50, 4)], _produce,
                         schema=SCHEMA, partition_by=["part"])  # fmt: skip
    assert staged.report_tasks == [0, 1, 2] and staged.tasks == 3
    first = _parquet_files(root)
    assert staged.discard_tasks({1, 2}) >= 2  # b's file and a's second one
    assert staged.reports == [{"part": "a", "rows": 7}] and staged.report_tasks == [0]
    assert len(_parquet_files(root)) == 1 and _parquet_files(root) < first
    again = stage_files(spark, root, [("b", 200, 2), ("c", 300, 1)], _produce, schema=SCHEMA,
                        partition_by=["part"], into=staged)  # fmt: skip
    assert again is staged and staged.report_tasks == [0, 3, 4] and staged.tasks == 5
    assert staged.reports[1:] == [{"part": "b", "rows": 2}, {"part": "c", "rows": 1}]
    result = staged.commit(app_transactions={"app": 1}, expected_versions={"app": None})
    assert result.committed and result.num_rows == 10
    got = pl.read_delta(str(root)).sort("n")
    assert got["n"].to_list() == [*range(7), 200, 201, 300]
    assert got["part"].to_list() == ["a"] * 7 + ["b", "b", "c"]
    live = {Path(u).resolve() for u in DeltaTable(str(root)).file_uris()}
    assert _parquet_files(root) == live and len(live) == 3
