"""Maintenance of a compacted topic table that carries deletion vectors.

The table is built by the real compaction job (``run_compact`` on the shared Spark session):
a first run, then incremental runs that mark replaced rows with deletion vectors
(``<table>/dv/``) and write change-data files. Read back with delta-rs's DataFusion engine and
polars (``tests.fixtures.compaction.read_topic_table``: both honour deletion vectors):

- optimize keeps the rows a deletion vector deleted deleted (the same rows as the model), with
  fewer files; a vacuum within the horizon keeps every deletion vector file, and the version
  before the optimize still reads the same rows (time travel);
- a checkpoint keeps the deletion vector descriptors (a fresh reader starting from it reads the
  same rows), and the orphan vacuum at horizon 0 removes the stale deletion vector files but
  never a live one (the rows still read the same);
- maintenance (z-order) with horizon 0: no deletion vector or change-data file left that no
  version needs, the same rows, the whole version history listed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder

from pipelines.compaction.config import CompactConfig
from pipelines.compaction.model import Rec, Strategy, compact
from pipelines.compaction.table import run_compact, table_path
from pipelines.delta.log import DeltaLog
from pipelines.maintenance.orphans import vacuum_orphans
from pipelines.maintenance.tables import maintain_table
from tests.fixtures.compaction import append_records, read_topic_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration


def _quiet(_: str) -> None:
    pass


def _expected(recs: list[Rec]) -> dict:
    return {pk: (r.offset, r.value, list(r.headers)) for pk, r in compact(recs, Strategy()).items()}


def _rows_at(path: str, version: int) -> set[tuple[int, bytes, int]]:
    table = DeltaTable(path, version=version)
    got = QueryBuilder().register("t", table).execute('SELECT "partition", key, "offset" FROM t')
    return {tuple(r.values()) for r in pa.table(got.read_all()).to_pylist()}


def _dv_files(path: str) -> set[str]:
    d = Path(path) / "dv"
    return {p.name for p in d.iterdir()} if d.is_dir() else set()


def _cdc_files(path: str) -> list[Path]:
    d = Path(path) / "_change_data"
    return [p for p in d.rglob("*") if p.is_file()] if d.is_dir() else []


def _dv_count(path: str) -> int:
    """How many files of the current state have a deletion vector (delta-rs's view)."""
    return pa.table(DeltaTable(path).deletion_vectors()).num_rows


def _live_descriptors(path: str) -> list[dict]:
    """The deletion vector descriptors of the current state, as the log holds them."""
    adds = DeltaLog(path).live_adds(DeltaTable(path).version())
    return [a["deletionVector"] for a in adds if a.get("deletionVector")]


def test_maintain_topic_table_with_deletion_vectors(spark: SparkSession, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    config = CompactConfig(
        log_dirs=(str(logs),),
        lake=str(tmp_path),
        topics=("t",),
        strategies={"t": Strategy()},
        buckets=2,
    )
    recs = [Rec(0, o, 1, b"k%03d" % o, b"v0-%d" % o) for o in range(200)]
    append_records(tmp_path, "t", recs, {0: 200})
    path = table_path(tmp_path, "t")
    assert run_compact(spark, config, log=_quiet).topics[0].committed
    off = 200

    def incremental(round_: int, keys: list[int]) -> None:
        nonlocal off
        more = [Rec(0, off + i, 1, b"k%03d" % k, b"v%d-%d" % (round_, k)) for i, k in
                enumerate(keys)]  # fmt: skip
        off += len(more)
        recs.extend(more)
        append_records(tmp_path, "t", more, {0: off})
        result = run_compact(spark, config, log=_quiet).topics[0]
        assert result.committed and result.buckets_with_deletion_vectors > 0

    for round_, keys in enumerate([range(0, 200, 10), range(5, 200, 10), [3, 4]], start=1):
        incremental(round_, list(keys))
    before = read_topic_table(path)
    assert before == _expected(recs)
    dt = DeltaTable(path)
    with_dvs = dt.version()
    rows_with_dvs = _rows_at(path, with_dvs)
    assert len(rows_with_dvs) == len(before) == 200
    assert _dv_count(path) > 0
    dv_before = _dv_files(path)
    assert len(dv_before) > len(_live_descriptors(path))  # stale vectors of earlier runs too
    assert _cdc_files(path)

    # optimize + vacuum within the horizon: same rows, fewer files, every DV file kept
    report = maintain_table(path, vacuum_hours=168)
    assert not report.errors, report.errors
    assert report.files_after < report.files_before
    assert report.vacuumed_orphans == 0
    assert read_topic_table(path) == before
    assert _dv_files(path) == dv_before
    assert _rows_at(path, with_dvs) == rows_with_dvs  # the version before optimize
    history = {h["version"] for h in DeltaTable(path).history()}
    assert history >= set(range(DeltaTable(path).version() + 1))

    # new deletion vectors on the optimized files; a checkpoint keeps their descriptors
    incremental(4, [1, 2, 11, 12])
    expected = _expected(recs)
    assert read_topic_table(path) == expected
    live = _live_descriptors(path)  # from the JSON commits (no checkpoint yet)
    assert len(live) == _dv_count(path) > 0
    DeltaTable(path).create_checkpoint()
    checkpoint = max((Path(path) / "_delta_log").glob("*.checkpoint.parquet"))
    adds = pq.read_table(checkpoint, columns=["add"]).column("add").to_pylist()
    in_checkpoint = [a["deletionVector"] for a in adds if a and a.get("deletionVector")]
    in_checkpoint = [d for d in in_checkpoint if d.get("storageType")]
    assert sorted(d["pathOrInlineDv"] for d in in_checkpoint) == sorted(
        d["pathOrInlineDv"] for d in live
    )
    assert read_topic_table(path) == expected  # a fresh reader, from the checkpoint

    # the orphan vacuum past the horizon: stale DV files go, the live ones stay
    removed = vacuum_orphans(path, vacuum_hours=0)
    live_files = {d["pathOrInlineDv"] for d in live}
    assert len(_dv_files(path)) == len(live_files) < len(dv_before)
    assert {Path(r).name for r in removed if r.startswith("dv/")} == dv_before  # all stale
    assert read_topic_table(path) == expected
    # at horizon 0 only the newest version is kept: the change data of its commit alone
    newest = Path(path) / "_delta_log" / f"{DeltaTable(path).version():020d}.json"
    cdc = [json.loads(line)["cdc"]["path"] for line in newest.read_text().splitlines()
           if "cdc" in json.loads(line)]  # fmt: skip
    assert cdc
    assert sorted(str(p.relative_to(path)) for p in _cdc_files(path)) == sorted(cdc)

    # maintenance with horizon 0 (z-order): optimize purges the vectors, vacuum their files
    report = maintain_table(path, vacuum_hours=0, zorder=True)
    assert not report.errors, report.errors
    assert report.vacuumed_orphans == len(live_files) + len(cdc)  # DV and change-data files
    assert read_topic_table(path) == expected
    assert _dv_count(path) == 0
    assert _dv_files(path) == set()
    assert not _cdc_files(path)  # the newest commits (vacuum, optimize) carry no change data
    history = {h["version"] for h in DeltaTable(path).history()}
    assert history >= set(range(DeltaTable(path).version() + 1))
