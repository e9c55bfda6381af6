"""Executor-side file writing of the Delta sink: layout, partition values, stats, cleanup."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.delta.files import (
    HIVE_NULL,
    PartitionedFileWriter,
    cleanup_write_files,
    escape_path_name,
    partition_value_string,
)


def test_partition_value_strings_follow_delta_serialization() -> None:
    assert partition_value_string(None) is None
    assert partition_value_string("a b") == "a b"
    assert partition_value_string(7) == "7"
    assert partition_value_string(True) == "true"
    assert partition_value_string(dt.date(2024, 2, 29)) == "2024-02-29"
    ts = dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC)
    assert partition_value_string(ts) == "2024-01-02 03:04:05.000006"


def test_escape_path_name_escapes_hive_unsafe_characters() -> None:
    assert escape_path_name("a-b_c.d") == "a-b_c.d"
    assert escape_path_name("a/b=c:d%") == "a%2Fb%3Dc%3Ad%25"


def _table() -> pa.Table:
    return pa.table(
        {
            "offset": pa.array([0, 1, 2, 3, 4], pa.int64()),
            "topic": ["a", "b", "a", None, "a"],
            "ts": pa.array(
                [1_000_001, 2_000, 3_000, 4_000, 5_000_500], pa.timestamp("us", tz="UTC")
            ),
            "key": pa.array([b"k", None, b"x", b"y", b"z"], pa.binary()),
            "s": ["short", "x" * 40, None, "m", "n"],
        }
    )


def test_writer_splits_by_partition_and_reports_stats(tmp_path: Path) -> None:
    w = PartitionedFileWriter(tmp_path, write_id="w1", task_id=3, attempt=0, partition_by=["topic"])
    w.write(_table())
    files = sorted(w.close(), key=lambda f: str(f.partition_values))
    by_topic = {f.partition_values["topic"]: f for f in files}
    assert set(by_topic) == {"a", "b", None}
    a = by_topic["a"]
    assert a.path.startswith("topic=a/part-00003-w1-0-c")
    assert a.num_rows == 3
    on_disk = pq.read_table(tmp_path / a.path)
    assert on_disk.column_names == ["offset", "ts", "key", "s"]  # partition column not stored
    assert on_disk.column("offset").to_pylist() == [0, 2, 4]
    assert a.size == (tmp_path / a.path).stat().st_size
    stats = json.loads(a.stats)
    assert stats["numRecords"] == 3
    assert stats["minValues"]["offset"] == 0 and stats["maxValues"]["offset"] == 4
    # min floored, max ceiled to milliseconds: bounds never tighter than the data
    assert stats["minValues"]["ts"] == "1970-01-01T00:00:00.003Z"
    assert stats["maxValues"]["ts"] == "1970-01-01T00:00:05.001Z"
    assert stats["nullCount"]["key"] == 0 and stats["nullCount"]["s"] == 1
    assert "key" not in stats["minValues"]  # no bounds for binary
    assert by_topic[None].path.startswith(f"topic={HIVE_NULL}/")
    b = json.loads(by_topic["b"].stats)
    assert b["minValues"]["s"] == "x" * 32 and "s" not in b["maxValues"]


def test_writer_rolls_files_and_abort_removes_them(tmp_path: Path) -> None:
    w = PartitionedFileWriter(
        tmp_path, write_id="w2", task_id=0, attempt=1, partition_by=[], max_rows_per_file=2
    )
    for _ in range(3):
        w.write(_table().slice(0, 2))
    files = w.close()
    assert [f.num_rows for f in files] == [2, 2, 2]
    assert len({f.path for f in files}) == 3
    w2 = PartitionedFileWriter(tmp_path, write_id="w3", task_id=0, attempt=0, partition_by=[])
    w2.write(_table())
    w2.abort()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f.path for f in files)


def test_cleanup_removes_only_this_write_and_keeps_listed(tmp_path: Path) -> None:
    (tmp_path / "_delta_log").mkdir()
    (tmp_path / "_delta_log" / "part-x-w9-0.json").write_text("{}")
    (tmp_path / "p=1").mkdir()
    for name in [
        "part-00000-w9-0-c000.parquet",
        "part-00001-w9-0-c000.parquet",
        "part-00000-other-0-c000.parquet",
    ]:
        (tmp_path / "p=1" / name).write_bytes(b"x")
    removed = cleanup_write_files(tmp_path, "w9", keep={"p=1/part-00001-w9-0-c000.parquet"})
    assert removed == 1
    assert sorted(p.name for p in (tmp_path / "p=1").iterdir()) == [
        "part-00000-other-0-c000.parquet",
        "part-00001-w9-0-c000.parquet",
    ]
    assert (tmp_path / "_delta_log" / "part-x-w9-0.json").exists()
    (tmp_path / "q=2").mkdir()
    assert cleanup_write_files(tmp_path, "w9", prune_dirs=True) == 1
    assert not (tmp_path / "q=2").exists()
    assert (tmp_path / "p=1").exists()
