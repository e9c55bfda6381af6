"""A write's driver SIGKILLed (a real process: ``tests/fixtures/staging_writer.py``, which
committed part of its rows, then staged more) leaves files no commit names; the next real
write (``write_direct`` on the shared Spark session) removes them, keeps what the killed run
committed, and leaves exactly the files the Delta log names (read back with deltalake)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from pipelines.delta import staging
from pipelines.delta.direct import StagedWrite, stage_files, write_direct
from pipelines.delta.staging import STAGING_DIR, reap_crashed_writes
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


def _produce_then_wait(task: tuple[int, str]) -> Iterator[pa.RecordBatch]:
    """Three rows (files of two rows roll: one finished, one open), then wait for ``flag``."""
    lo, flag = task
    yield pa.record_batch([pa.array(["a"] * 3), pa.array(range(lo, lo + 3), pa.int64())], SCHEMA)
    while not Path(flag).exists():
        time.sleep(0.02)


def test_a_task_still_writing_after_its_driver_died_keeps_the_writes_files(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A real Spark task still writing when its driver counts as dead (its marker says so, and
    the driver's lock is gone): the reaper leaves the write alone until the task is done."""
    root = tmp_path / "t"
    flag = tmp_path / "go"
    done = subprocess.Popen(["true"])
    done.wait()
    result: list[StagedWrite] = []
    stager = threading.Thread(
        target=lambda: result.append(
            stage_files(
                spark, root, [(0, str(flag))], _produce_then_wait, schema=SCHEMA,
                partition_by=["part"], max_rows_per_file=2,
            )
        )
    )  # fmt: skip
    stager.start()
    try:
        deadline = time.monotonic() + 120
        while len(list(root.rglob("part-*.parquet"))) < 2:
            assert stager.is_alive() and time.monotonic() < deadline
            time.sleep(0.05)
        (marker,) = (root / STAGING_DIR).glob("*.json")
        # the driver "dies": its lock goes, its pid is an exited process's
        os.close(staging._HELD.pop(str(marker)))
        body = {**json.loads(marker.read_text()), "pid": done.pid, "pid_start": 1}
        with open(marker, "r+", encoding="utf-8") as fh:  # in place: the task's lock stays
            fh.write(json.dumps(body))
            fh.truncate()
        files = set(root.rglob("part-*.parquet"))
        assert reap_crashed_writes(root) == 0  # the task shares the lock
        assert set(root.rglob("part-*.parquet")) == files and marker.exists()
    finally:
        flag.touch()
        stager.join(timeout=120)
    (staged,) = result
    assert staged.commit().committed
    assert unreferenced_files(root) == []
    rows = DeltaTable(str(root)).to_pyarrow_table().to_pylist()
    assert sorted(r["n"] for r in rows) == [0, 1, 2]
