"""Quality over a lake ingested ``read_committed`` from a log with transactions.

The log (written with the storage engine, as in ``test_ingest_transactions``): several
producers' transactions interleaved — committed, aborted (one whose ABORT marker lies above
the partition's last stable offset), and open ones that hold the partition at its LSO. Ingest,
the lookups job and the quality run are real; the expected gaps come from a plain model of the
log (which batches are aborted, where the markers are), not from the code under test. Then a
committed batch deleted from ``records`` (deltalake) must still fail as ``unexplained``, and
an ``offset_lookup`` of the earlier schema (no transaction columns) must take the new rows.
"""

from __future__ import annotations

import shutil
from collections import defaultdict
from pathlib import Path

import pyarrow.compute as pc
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from pyspark.sql import SparkSession

from pipelines.delta import read_app_transactions, read_delta
from pipelines.ingest import IngestConfig, read_progress, run_ingest
from pipelines.lookups import LOOKUP_SCHEMAS, build_lookups
from pipelines.quality.bounds import partition_bounds
from pipelines.quality.checks import bounds_frame, lookup_progress_frame, offset_gaps
from pipelines.quality.config import QualityConfig
from pipelines.quality.run import run_quality
from tests.integration.spark.test_ingest_transactions import TxnLogs, consumer_view

pytestmark = pytest.mark.integration

TopicPartition = tuple[str, int]
P0, P1 = ("pay", 0), ("pay", 1)


def _write_log(logs: TxnLogs) -> None:
    logs.data(P0, 10, 3)
    logs.data(P0, -1, 2, txn=False)
    logs.data(P0, 11, 4)
    logs.data(P0, 10, 5)
    logs.data(P0, 12, 2)
    logs.end(P0, 11, commit=False)  # 11 aborted
    logs.data(P0, -1, 1, txn=False)
    for _ in range(3):
        logs.data(P0, 10, 6)  # 10's transaction spans segments
    logs.end(P0, 10, commit=True)
    logs.data(P0, 14, 2)
    logs.end(P0, 14, commit=False)  # 14 aborted, right after its batch
    logs.data(P0, 12, 3)
    logs.data(P0, 13, 2)  # 13 stays open: the LSO of pay-0
    logs.end(P0, 12, commit=False)  # 12 aborted, its marker above the LSO
    logs.data(P0, -1, 2, txn=False)
    logs.data(P0, 11, 2)  # 11's next transaction, open
    logs.data(P1, 20, 4)
    logs.end(P1, 20, commit=True)
    logs.data(P1, 21, 3)
    logs.data(P1, -1, 2, txn=False)
    logs.data(P1, 21, 3)
    logs.end(P1, 21, commit=False)
    logs.data(P1, -1, 2, txn=False)
    logs.checkpoint()


Offset = tuple[str, int, int]  # topic, partition, offset


def _expected_gaps(logs: TxnLogs, stops: dict[TopicPartition, int]) -> dict[str, set[Offset]]:
    """``explanation -> offsets`` below each partition's stop, from the model: batches of
    aborted transactions (the producer's next marker is an ABORT) and the markers."""
    out: dict[str, set[Offset]] = defaultdict(set)
    for tp, entries in logs.entries.items():
        for i, e in enumerate(entries):
            if e.kind in ("commit", "abort"):
                offsets = {e.first}
                kind = "transaction_marker"
            elif e.kind == "txn":
                after = [x for x in entries[i + 1 :] if x.producer_id == e.producer_id]
                marker = next((x.kind for x in after if x.kind in ("commit", "abort")), None)
                if marker != "abort":
                    continue
                offsets = {r[2] for r in e.rows}
                kind = "aborted_transaction"
            else:
                continue
            out[kind] |= {(tp[0], tp[1], o) for o in offsets if o < stops[tp]}
    return dict(out)


def _gaps(spark: SparkSession, logs: TxnLogs, lake: Path) -> tuple[dict[str, int], set[Offset]]:
    """What :func:`offset_gaps` finds: offsets per explanation, and every missing offset."""
    progress = read_progress(lake / "records")
    bounds = bounds_frame(spark, partition_bounds([str(logs.root)], progress))
    rows = offset_gaps(
        read_delta(spark, lake / "records"), bounds, read_delta(spark, lake / "offset_lookup"),
        None, lookup_progress_frame(spark, read_app_transactions(lake / "offset_lookup")),
    ).collect()  # fmt: skip
    # one row per (gap, explanation) with a count: offsets of a gap are assigned by kind
    by_kind: dict[str, int] = defaultdict(int)
    ranges: set[Offset] = set()
    for r in rows:
        by_kind[r.explanation] += r.offsets
        ranges |= {(r.topic, r.partition, o) for o in range(r.gap_start, r.gap_end)}
    return dict(by_kind), ranges


@pytest.fixture
def logs(tmp_path: Path):  # type: ignore[no-untyped-def]
    d = TxnLogs(tmp_path / "logs")
    yield d
    d.close()


def _ingest(spark: SparkSession, logs: TxnLogs, lake: Path) -> IngestConfig:
    config = IngestConfig(log_dirs=(str(logs.root),), lake=str(lake), progress_interval_s=0,
                          max_partition_bytes=4096)  # fmt: skip
    run_ingest(spark, config, log=lambda _m: None)
    build_lookups(spark, log_dirs=config.log_dirs, lake=str(lake))
    return config


def test_aborted_transactions_are_explained_and_a_lost_batch_is_not(
    spark: SparkSession, tmp_path: Path, logs: TxnLogs
) -> None:
    _write_log(logs)
    lake = tmp_path / "lake"
    config = _ingest(spark, logs, lake)
    want_rows, stops = consumer_view(logs)
    assert read_progress(lake / "records") == stops
    t = DeltaTable(str(lake / "records")).to_pyarrow_table(columns=["topic", "partition", "offset"])
    assert sorted(zip(*(t[c].to_pylist() for c in ("topic", "partition", "offset")), strict=True)) \
        == [r[:3] for r in want_rows]  # fmt: skip
    assert stops[P0] < logs.hws[P0] and stops[P1] == logs.hws[P1]  # pay-0 held at its LSO

    expected = _expected_gaps(logs, stops)
    assert expected["aborted_transaction"] and expected["transaction_marker"]
    counts, missing = _gaps(spark, logs, lake)
    assert counts == {k: len(v) for k, v in expected.items()}
    assert missing == expected["aborted_transaction"] | expected["transaction_marker"]
    # the aborted transaction whose ABORT marker lies above the LSO is judged too
    twelve = {(P0[0], P0[1], r[2]) for e in logs.entries[P0] if e.producer_id == 12
              for r in e.rows}  # fmt: skip
    assert twelve and twelve <= expected["aborted_transaction"]

    report = run_quality(spark, config, QualityConfig(docs=False), run_id="txn-good",
                         log=lambda _m: None)  # fmt: skip
    assert report.success, report.failed
    assert report.suites["records_gaps"] is True
    results = DeltaTable(str(lake / "quality_results")).to_pyarrow_table()
    gaps_rule = results.filter(pc.equal(results["rule"], "gaps_explained")).to_pylist()
    assert [r["success"] for r in gaps_rule] == [True]

    # a committed batch of pay-1 deleted from records: a real gap, unexplained
    broken = tmp_path / "broken"
    shutil.copytree(lake, broken)
    committed = next(e for e in logs.entries[P1] if e.producer_id == 20 and e.kind == "txn")
    first, last = committed.rows[0][2], committed.rows[-1][2]
    DeltaTable(str(broken / "records")).delete(
        f'topic = \'pay\' AND "partition" = 1 AND "offset" BETWEEN {first} AND {last}'
    )
    counts, _ = _gaps(spark, logs, broken)
    assert counts["unexplained"] == last - first + 1
    bad = IngestConfig(log_dirs=config.log_dirs, lake=str(broken), progress_interval_s=0)
    report = run_quality(spark, bad, QualityConfig(docs=False), run_id="txn-broken",
                         log=lambda _m: None)  # fmt: skip
    assert not report.success
    assert report.failed == ["records_gaps.gaps_explained"]


def test_an_offset_lookup_of_the_earlier_schema_gets_the_transaction_columns(
    spark: SparkSession, tmp_path: Path, logs: TxnLogs
) -> None:
    _write_log(logs)
    full = tmp_path / "full"
    build_lookups(spark, log_dirs=(str(logs.root),), lake=str(full), check=False)
    every = DeltaTable(str(full / "offset_lookup")).to_pyarrow_table()
    markers = every.filter(every["is_control"])
    assert sorted(set(markers["marker"].to_pylist())) == ["abort", "commit"]
    assert pc.all(pc.is_null(every.filter(pc.invert(every["is_control"]))["marker"])).as_py()

    # the earlier release's table: no transaction columns, built up to offset 20 of pay-0
    old_names = [n for n in LOOKUP_SCHEMAS["offset_lookup"].names
                 if n not in ("is_transactional", "producer_id", "marker")]  # fmt: skip
    p0 = pc.and_(pc.equal(every["topic"], "pay"), pc.equal(every["partition"], 0))
    old = every.filter(pc.and_(p0, pc.less(every["last_offset"], 20))).select(old_names)
    end = pc.max(old["last_offset"]).as_py() + 1
    lake = tmp_path / "lake"
    write_deltalake(
        str(lake / "offset_lookup"), old, partition_by=["topic"],
        commit_properties=CommitProperties(
            app_transactions=[Transaction("offset_lookup:pay-0", end)]
        ),
    )  # fmt: skip
    build_lookups(spark, log_dirs=(str(logs.root),), lake=str(lake), check=False)
    dt = DeltaTable(str(lake / "offset_lookup"))
    assert dt.schema().to_arrow().names == LOOKUP_SCHEMAS["offset_lookup"].names
    got = dt.to_pyarrow_table()
    key = ["topic", "partition", "first_offset", "last_offset", "position"]
    assert sorted(zip(*(got[c].to_pylist() for c in key), strict=True)) == sorted(
        zip(*(every[c].to_pylist() for c in key), strict=True)
    )  # every batch once
    before = got.filter(pc.and_(pc.equal(got["topic"], "pay"), pc.less(got["first_offset"], end)))
    before = before.filter(pc.equal(before["partition"], 0))
    assert before.num_rows == old.num_rows
    assert pc.all(pc.is_null(before["producer_id"])).as_py()  # rows from before: null
    after = got.filter(pc.is_valid(got["producer_id"]))
    assert after.num_rows == got.num_rows - old.num_rows
    assert pc.sum(pc.equal(after["marker"], "abort")).as_py() > 0
