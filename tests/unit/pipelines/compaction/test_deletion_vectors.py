"""Deletion vectors written by ``pipelines.delta.deletion_vectors`` read back by delta-rs (its
own Roaring reader) and polars: the rows each reader returns are exactly the file's rows minus
the deleted ones."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder, write_deltalake

from pipelines.delta.actions import FileRef, commit_actions
from pipelines.delta.deletion_vectors import serialize_deletion_vector, write_deletion_vectors
from pipelines.delta.log import DeltaLog

N = 200_000


def _table(root: Path, files: int) -> list[FileRef]:
    for i in range(files):
        rows = pa.table({"k": np.arange(i * N, (i + 1) * N), "b": np.zeros(N, np.int32)})
        write_deltalake(
            root,
            rows,
            partition_by=["b"],
            mode="append",
            configuration={"delta.enableDeletionVectors": "true"} if i == 0 else None,
        )
    adds = DeltaLog(root).live_adds(DeltaTable(root).version())
    return [
        FileRef(a["path"], a["size"], a["partitionValues"], a.get("stats"))
        for a in sorted(adds, key=lambda a: json.loads(a["stats"])["minValues"]["k"])
    ]


@pytest.mark.parametrize(
    "deleted",
    [
        [np.array([0]), np.array([N - 1])],
        # array containers (<= 4096 in a 65536-row chunk), bitmap containers, several chunks
        [np.arange(0, N, 3), np.r_[np.arange(70_000, 80_000), np.arange(150_000, 151_000, 7)]],
    ],
)
def test_deletion_vectors_are_read_by_delta_rs_and_polars(
    tmp_path: Path, deleted: list[np.ndarray]
) -> None:
    root = tmp_path / "t"
    files = _table(root, len(deleted))
    _dv_file, descriptors = write_deletion_vectors(root / "dv", deleted)
    version = commit_actions(
        root,
        read_version=DeltaTable(root).version(),
        removes=files,
        adds=[
            FileRef(f.path, f.size, f.partition_values, f.stats, int(time.time() * 1000), True, d)
            for f, d in zip(files, descriptors, strict=True)
        ],
        operation="DELETE",
    )
    assert version is not None
    keep = np.setdiff1d(np.arange(len(deleted) * N), np.concatenate(
        [d + i * N for i, d in enumerate(deleted)]))  # fmt: skip
    dt = DeltaTable(root)
    got = pa.table(QueryBuilder().register("t", dt).execute("SELECT k FROM t").read_all())
    assert np.array_equal(np.sort(got.column("k").to_numpy()), keep)
    assert np.array_equal(np.sort(pl.read_delta(str(root))["k"].to_numpy()), keep)
    # the log replay gives each file once, with its vector
    adds = DeltaLog(root).live_adds(version)
    assert sorted(a["deletionVector"]["cardinality"] for a in adds) == sorted(
        len(np.unique(d)) for d in deleted
    )


def test_serialized_vector_layout() -> None:
    """Magic, one 32-bit bitmap (key 0), no-run cookie, two containers (chunks 0 and 1)."""
    data = serialize_deletion_vector(np.array([5, 1, 5, 70_000]))
    assert struct.unpack("<iqiII", data[:24]) == (1681511377, 1, 0, 12346, 2)
