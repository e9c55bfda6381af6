"""A write's driver SIGKILLed (a real process: ``tests/fixtures/staging_writer.py``, which
committed part of its rows, then staged more) leaves files no commit names; the next real
write (``write_direct`` on the shared Spark session) removes them, keeps what the killed run
committed, and leaves exactly the files the Delta log names (read back with deltalake)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from pipelines.delta.direct import write_direct
from pipelines.delta.staging import STAGING_DIR
from tests.conftest import ROOT
from tests.fixtures.jobs import unreferenced_files
from tests.fixtures.staging_writer import SCHEMA

pytestmark = pytest.mark.integration


def _produce(task: tuple[int, int]) -> Iterator[pa.RecordBatch]:
    lo, hi = task
    rows = range(lo, hi)
    yield pa.record_batch(
        [pa.array(["a" if n % 2 else "b" for n in rows]), pa.array(rows, pa.int64())], SCHEMA
    )


def test_a_killed_writers_uncommitted_files_go_with_the_next_write(
    spark: SparkSession, tmp_path: Path
) -> None:
    root = tmp_path / "t"
    killed = "9" * 32
    writer = subprocess.Popen(
        [sys.executable, "-m", "tests.fixtures.staging_writer", str(root), killed,
         "--commit-first"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert writer.stdout is not None and writer.stdout.readline().startswith("ready ")
    finally:
        writer.kill()
        writer.wait()
    assert DeltaTable(str(root)).version() == 0  # its first part committed
    leftovers = unreferenced_files(root)
    assert leftovers and all(f"-{killed}-" in p for p in leftovers if "part-" in p)
    assert f"{STAGING_DIR}/{killed}.json" in leftovers  # its marker

    result = write_direct(
        spark, root, [(1000, 1005), (2000, 2003)], _produce, schema=SCHEMA, partition_by=["part"]
    )
    assert result.committed
    assert unreferenced_files(root) == []  # the killed run's staged files and marker are gone
    assert not list((root / STAGING_DIR).iterdir())  # the new write released its own marker
    rows = DeltaTable(str(root)).to_pyarrow_table().to_pylist()
    want = [*range(10), *range(1000, 1005), *range(2000, 2003)]
    assert sorted(r["n"] for r in rows) == want
    assert all(r["part"] == ("a" if r["n"] % 2 else "b") for r in rows)
