"""Quality after the log's retention deleted segments the lake already holds.

The lake keeps rows forever (``[retention] records = "forever"``), so after retention the
``records`` table holds rows below the partition's log start. ``records``'
``offset_at_or_after_log_start`` accepts them where the log is known to have held them
(``retention_log``, or the lake's first offset in ``offset_lookup``) and fails a row below
everything the log is known to have held.

The log dir: a real broker, confluent-kafka producers, the retention job deleting through
DeleteRecords (and an AdminClient DeleteRecords before the lake first read a second topic);
ingest, lookups and quality run for real; results read back with deltalake.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from deltalake import DeltaTable, write_deltalake

from logstore.storage.checkpoints import read_offset_checkpoint
from pipelines.ingest import IngestConfig, run_ingest
from pipelines.lookups import build_lookups
from pipelines.retention.job import RetentionConfig, run_retention
from tests.fixtures.jobs import load_job

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]
OLD = int(time.time() * 1000) - 86_400_000  # a day ago: past the topics' retention.ms
TOPIC_CONFIG = {"segment.bytes": "4096", "retention.ms": "3600000"}
RULE = ("records", "offset_at_or_after_log_start")


def _produce(bootstrap: str, topic: str, n: int) -> None:
    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})
    for i in range(n):
        p.produce(topic, value=f"v{i}:".encode() * 20, timestamp=OLD + i)
        if i % 10 == 9:
            p.flush(30)
    assert p.flush(30) == 0


def _log_start(log_dir: Path, topic: str, at_least: int) -> int:
    """The broker's checkpointed log start of ``topic``-0, once it is at least ``at_least``."""
    deadline = time.monotonic() + 30
    path = log_dir / "log-start-offset-checkpoint"
    while time.monotonic() < deadline:
        if path.is_file() and (got := read_offset_checkpoint(path).get((topic, 0), 0)) >= at_least:
            return got
        time.sleep(0.1)
    raise AssertionError(f"no log start >= {at_least} checkpointed for {topic}")


def _config(path: Path, log_dir: Path, lake: Path) -> Path:
    path.write_text(f'[paths]\nlog_dirs = ["{log_dir}"]\nlake = "{lake}"\n')
    return path


def _run(lake: Path, log_dir: Path, work: Path, run_id: str) -> tuple[int, dict[Any, Any]]:
    config = _config(work / f"{run_id}.toml", log_dir, lake)
    code = load_job("quality").main(["--config", str(config), "--run-id", run_id])
    t = DeltaTable(str(lake / "quality_results")).to_pyarrow_table()
    rows = t.filter(pc.equal(t["run_id"], run_id)).to_pylist()
    return code, {(r["suite"], r["rule"]): r for r in rows}


@pytest.fixture(scope="module")
def retained(
    spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, dict[str, int]]:
    """(log dir, lake, {topic: log start}) after: produce ``kept`` and ``late``; DeleteRecords
    ``late`` to offset 100 (before the lake read it); ingest and lookups; the retention job
    deletes ``kept``'s ingested segments through DeleteRecords (``late`` has no retention.ms:
    the broker default of 168 h keeps its day-old records)."""
    from tests.fixtures.broker import BrokerProcess

    work = tmp_path_factory.mktemp("quality-retention")
    broker = BrokerProcess(
        work / "broker",
        **{
            "log.retention.check.interval.ms": "3600000",  # the job, not the broker, deletes
            "replica.high.watermark.checkpoint.interval.ms": "200",
            "log.flush.start.offset.checkpoint.interval.ms": "200",
            "log.segment.delete.delay.ms": "0",
        },
    )
    broker.start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for fut in admin.create_topics(
            [
                NewTopic("kept", 1, 1, config=TOPIC_CONFIG),
                NewTopic("late", 1, 1, config={"segment.bytes": "4096"}),
            ]  # no retention.ms
        ).values():
            fut.result(timeout=30)
        _produce(broker.bootstrap, "kept", 300)
        _produce(broker.bootstrap, "late", 300)
        for fut in admin.delete_records([ck.TopicPartition("late", 0, 100)]).values():
            fut.result(timeout=30)
        late_start = _log_start(broker.log_dir, "late", 100)
        time.sleep(0.6)  # high watermark checkpoint
        lake = work / "lake"
        ingest = IngestConfig(log_dirs=(str(broker.log_dir),), lake=str(lake),
                              progress_interval_s=0)  # fmt: skip
        assert run_ingest(spark, ingest, log=lambda _m: None).records == 300 + 200
        build_lookups(spark, log_dirs=ingest.log_dirs, lake=str(lake))
        props = work / "broker.properties"
        props.write_text("log.retention.hours=168\n", encoding="utf-8")
        retention = RetentionConfig(log_dirs=ingest.log_dirs, lake=str(lake),
                                    broker_config=str(props))  # fmt: skip
        summary = run_retention(spark, retention, bootstrap=broker.bootstrap)
        assert not summary.errors and summary.deleted_segments > 0
        kept_start = summary.log_starts["kept/0"]
        assert 0 < kept_start <= 300
        assert _log_start(broker.log_dir, "kept", kept_start) == kept_start
    finally:
        assert broker.stop() == 0
    return broker.log_dir, lake, {"kept": kept_start, "late": late_start}


def test_rows_that_retention_removed_from_the_log_pass(
    retained: tuple[Path, Path, dict[str, int]], tmp_path: Path
) -> None:
    log_dir, lake, starts = retained
    records = DeltaTable(str(lake / "records")).to_pyarrow_table(columns=["topic", "offset"])
    kept = records.filter(pc.equal(records["topic"], "kept"))["offset"].to_pylist()
    below = [o for o in kept if o < starts["kept"]]
    assert sorted(kept) == list(range(300)) and below  # the lake holds rows the log deleted
    log_rows = DeltaTable(str(lake / "retention_log")).to_pyarrow_table().to_pylist()
    assert {(r["source"], r["topic"]) for r in log_rows} == {("log", "kept")}
    assert max(r["end_offset"] for r in log_rows) == starts["kept"]

    code, results = _run(lake, log_dir, tmp_path, "after-retention")
    assert code == 0, {k: r for k, r in results.items() if not r["success"]}
    assert results[RULE]["success"] and results[("records_gaps", "gaps_explained")]["success"]

    # retention_log alone explains them (without offset_lookup: no lake lower bound) ...
    only_log = tmp_path / "only-retention-log"
    shutil.copytree(lake, only_log)
    shutil.rmtree(only_log / "offset_lookup")
    code, results = _run(only_log, log_dir, tmp_path, "retention-log-only")
    assert code == 0 and results[RULE]["success"]
    # (a copied lake writes its Data Docs in its own directory, not the original's)
    assert "retention-log-only" in (only_log / "_quality/data_docs/index.html").read_text()
    assert "retention-log-only" not in (lake / "_quality/data_docs/index.html").read_text()

    # ... and offset_lookup alone too (the log's own retention, an operator's DeleteRecords)
    only_lookup = tmp_path / "only-offset-lookup"
    shutil.copytree(lake, only_lookup)
    shutil.rmtree(only_lookup / "retention_log")
    code, results = _run(only_lookup, log_dir, tmp_path, "offset-lookup-only")
    assert code == 0 and results[RULE]["success"]

    # with neither, nothing explains them: the rule fails on exactly those rows
    neither = tmp_path / "neither"
    shutil.copytree(only_lookup, neither)
    shutil.rmtree(neither / "offset_lookup")
    code, results = _run(neither, log_dir, tmp_path, "unexplained")
    assert code == 5 and not results[RULE]["success"]
    assert results[RULE]["unexpected_count"] == len(below)


def test_a_row_below_all_the_log_is_known_to_have_held_fails(
    retained: tuple[Path, Path, dict[str, int]], tmp_path: Path
) -> None:
    log_dir, good, starts = retained
    lake = tmp_path / "lake"
    shutil.copytree(good, lake)
    records = DeltaTable(str(lake / "records"))
    t = records.to_pyarrow_table()
    late = t.filter(pc.equal(t["topic"], "late"))
    assert min(late["offset"].to_pylist()) == starts["late"]  # the lake began at the log start
    # a row at an offset the lake never saw in the log: below its log start, below the first
    # offset of offset_lookup, and in nothing retention_log says it removed
    fake = late.slice(0, 1)
    fake = fake.set_column(
        fake.schema.get_field_index("offset"), "offset", pa.array([starts["late"] - 50], pa.int64())
    )
    write_deltalake(str(lake / "records"), fake, mode="append", partition_by=["topic", "date"])
    code, results = _run(lake, log_dir, tmp_path, "fake-row")
    assert code == 5
    assert not results[RULE]["success"] and results[RULE]["unexpected_count"] == 1
    assert str(starts["late"] - 50) in results[RULE]["details"]
