"""A log that went backwards under the lake, with the real broker and real clients.

confluent-kafka produces with ``acks=all``; the lake ingests; the broker is SIGKILLed and the
tail of its active segment is lost the way a crash loses unsynced pages (the file is cut at a
batch start below the lake's progress, its indexes dropped); the restarted broker recovers
(truncates) and then acknowledges new records under offsets the lake already holds. Ingest
must fail by default (exit 4 from the job) naming the partition and offsets, and
``on_divergence="rewind"`` must leave ``records`` equal to what the log holds now (read back
with deltalake and polars), move the lake's old rows to ``diverged`` and make a re-run a no-op.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from jobs.ingest import main
from pipelines import ingest as ingest_mod
from pipelines.delta.staging import LEASE_TTL_ENV
from pipelines.divergence import DivergenceError, batch_at, rewind_id
from pipelines.ingest import IngestConfig, read_progress, run_ingest
from tests.fixtures.broker import ROOT
from tests.fixtures.jobs import spark_submit
from tests.integration.broker.clients import new_topic

pytestmark = pytest.mark.integration


def _quiet(_message: str) -> None:
    pass


def _produce(
    bootstrap: str, topic: str, prefix: str, n: int, partition: int = 0
) -> list[tuple[int, bytes, bytes]]:
    """``n`` records acknowledged with acks=all, in many small batches: (offset, key, value)."""
    acked: list[tuple[int, bytes, bytes]] = []
    errors: list[Any] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            acked.append((msg.offset(), msg.key(), msg.value()))

    producer = ck.Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 1})
    for i in range(n):
        producer.produce(
            topic,
            key=f"{prefix}-k{i}".encode(),
            value=f"{prefix}-value-{i}".encode() * (1 + i % 5),
            partition=partition,
            on_delivery=on_delivery,
        )
        if i % 10 == 9:
            producer.flush(30)  # several batches, so that the log can be cut between two
    assert producer.flush(60) == 0
    assert not errors, errors
    return sorted(acked)


def _crash_losing_tail(broker: Any, topic: str, keep_below: int) -> int:
    """SIGKILL the broker, lose the log from the batch holding ``keep_below``, restart.

    Returns the offset the log now ends at (the start of that batch).
    """
    broker.kill()
    part = broker.log_dir / f"{topic}-0"
    batch = batch_at(part, keep_below)
    assert batch is not None
    segment = part / f"{batch.segment_base_offset:020d}.log"
    os.truncate(segment, batch.position)
    for suffix in (".index", ".timeindex"):
        segment.with_suffix(suffix).unlink(missing_ok=True)  # rebuilt by recovery
    broker.start()
    return batch.base_offset


def _records(lake: Path) -> list[tuple[int, bytes, bytes]]:
    path = str(lake / "records")
    rs = DeltaTable(path).to_pyarrow_table(columns=["offset", "key", "value"]).to_pylist()
    via_rs = sorted((r["offset"], r["key"], r["value"]) for r in rs)
    via_pl = sorted(pl.read_delta(path).select("offset", "key", "value").iter_rows())
    assert via_rs == via_pl
    return via_rs


def _diverged(lake: Path) -> list[dict[str, Any]]:
    cols = ["topic", "partition", "offset", "key", "value", "reason", "rewind_id", "diverged_at"]
    rows = DeltaTable(str(lake / "diverged")).to_pyarrow_table(columns=cols).to_pylist()
    return sorted(rows, key=lambda r: r["offset"])


def _config(broker: Any, lake: Path, on_divergence: str = "fail") -> IngestConfig:
    return IngestConfig(
        log_dirs=(str(broker.log_dir),), lake=str(lake), on_divergence=on_divergence
    )


def test_truncated_and_refilled_log_fails_then_rewinds(
    spark: SparkSession, broker_factory: Any, tmp_path: Path
) -> None:
    b = broker_factory()
    topic = new_topic(b.bootstrap, partitions=1, prefix="diverge")
    old = _produce(b.bootstrap, topic, "old", 300)
    assert [o for o, _, _ in old] == list(range(300))
    b.stop()
    lake = tmp_path / "lake"
    assert run_ingest(spark, _config(b, lake), log=_quiet).records == 300
    b.start()
    cut = _crash_losing_tail(b, topic, 150)
    assert 100 < cut <= 150
    new = _produce(b.bootstrap, topic, "new", 250)  # reuses offsets cut .. 299 and goes on
    assert [o for o, _, _ in new] == list(range(cut, cut + 250))
    b.stop()
    version = DeltaTable(str(lake / "records")).version()

    # default: fail, saying where and what, ingest nothing
    with pytest.raises(DivergenceError) as info:
        run_ingest(spark, _config(b, lake), log=_quiet)
    text = str(info.value)
    assert f"{topic}/0: offset 299: the lake has batch [" in text
    assert "the log has batch [" in text and "crc 0x" in text
    assert "--on-divergence=rewind" in text
    assert DeltaTable(str(lake / "records")).version() == version
    assert _records(lake) == old

    # the job says so with exit code 4
    conf = tmp_path / "pipeline.toml"
    conf.write_text(
        f'[paths]\nlog_dirs = ["{b.log_dir}"]\nlake = "{lake}"\n[ingest]\nprogress_interval_s = 0\n'
    )
    assert main(["--config", str(conf)]) == 4
    assert DeltaTable(str(lake / "records")).version() == version

    # rewind: records = the log's content now, diverged = the lake's old rows past the cut
    summary = run_ingest(spark, _config(b, lake, "rewind"), log=_quiet)
    assert summary.committed and summary.diverged_rows == 300 - cut
    assert summary.rewinds == [f"{topic}/0 from offset {cut}"]
    assert _records(lake) == old[:cut] + new
    assert read_progress(lake / "records") == {(topic, 0): cut + 250}
    moved = _diverged(lake)
    assert [(r["offset"], r["key"], r["value"]) for r in moved] == old[cut:]
    assert {(r["topic"], r["partition"]) for r in moved} == {(topic, 0)}
    assert len({r["rewind_id"] for r in moved}) == 1 and "offset 299" in moved[0]["reason"]
    # one records commit did it all: removes, rewritten files, new files and progress
    history = DeltaTable(str(lake / "records")).history(1)[0]
    assert history["version"] == version + 1 and history["isBlindAppend"] is False

    # re-run: nothing diverges any more, nothing to do; the same with the default again
    again = run_ingest(spark, _config(b, lake, "rewind"), log=_quiet)
    assert (again.committed, again.records, again.diverged_rows) == (False, 0, 0)
    assert run_ingest(spark, _config(b, lake), log=_quiet).records == 0
    assert _records(lake) == old[:cut] + new
    assert len(_diverged(lake)) == 300 - cut


def test_only_shorter_log_rewinds_then_ingests_new_records(
    spark: SparkSession, broker_factory: Any, tmp_path: Path
) -> None:
    b = broker_factory()
    topic = new_topic(b.bootstrap, partitions=1, prefix="shorter")
    old = _produce(b.bootstrap, topic, "old", 120)
    b.stop()
    lake = tmp_path / "lake"
    assert run_ingest(spark, _config(b, lake), log=_quiet).records == 120
    b.start()
    cut = _crash_losing_tail(b, topic, 70)
    b.stop()

    with pytest.raises(DivergenceError, match=rf"{topic}/0: the log ends at offset {cut}, below"):
        run_ingest(spark, _config(b, lake), log=_quiet)
    assert _records(lake) == old

    fingerprint_before = read_progress(lake / "records")
    assert fingerprint_before == {(topic, 0): 120}
    summary = run_ingest(spark, _config(b, lake, "rewind"), log=_quiet)
    assert summary.committed and summary.records == 0 and summary.diverged_rows == 120 - cut
    assert _records(lake) == old[:cut]
    assert read_progress(lake / "records") == {(topic, 0): cut}
    moved = _diverged(lake)
    assert [(r["offset"], r["key"], r["value"]) for r in moved] == old[cut:]
    again = run_ingest(spark, _config(b, lake, "rewind"), log=_quiet)
    assert (again.committed, again.diverged_rows) == (False, 0)

    # the log grows again from the cut: an ordinary run ingests just that, no divergence
    b.start()
    new = _produce(b.bootstrap, topic, "new", 30)
    b.stop()
    assert [o for o, _, _ in new] == list(range(cut, cut + 30))
    assert run_ingest(spark, _config(b, lake), log=_quiet).records == 30
    assert _records(lake) == old[:cut] + new
    assert len(_diverged(lake)) == 120 - cut


def test_rewind_id_names_the_lake_state() -> None:
    assert rewind_id(("t", 0), 10, None) == rewind_id(("t", 0), 10, None)
    assert rewind_id(("t", 0), 10, None) != rewind_id(("t", 0), 11, None)
    assert rewind_id(("t", 0), 10, None) != rewind_id(("t", 1), 10, None)


def test_rewind_killed_before_the_records_commit_then_rerun_is_exact(
    spark: SparkSession, broker_factory: Any, tmp_path: Path
) -> None:
    """A real crash mid-rewind: ``spark-submit`` SIGKILLed (failpoint) after ``diverged`` was
    written and every records file was, before the records commit."""
    b = broker_factory()
    topic = new_topic(b.bootstrap, partitions=1, prefix="rewindcrash")
    old = _produce(b.bootstrap, topic, "old", 200)
    b.stop()
    lake = tmp_path / "lake"
    assert run_ingest(spark, _config(b, lake), log=_quiet).records == 200
    b.start()
    cut = _crash_losing_tail(b, topic, 80)
    new = _produce(b.bootstrap, topic, "new", 150)
    b.stop()
    version = DeltaTable(str(lake / "records")).version()

    args = ["--config", str(ROOT / "conf" / "pipeline.toml"), "--log-dirs", str(b.log_dir)]
    args += ["--lake", str(lake), "--on-divergence", "rewind"]
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        LEASE_TTL_ENV: "3",  # its lease expires 3 s (+ the reaper's margin) after the kill
    }
    killed = spark_submit("ingest.py", args, env=env, failpoint="delta.before_commit")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    # records exactly as before; diverged holds the rewind's rows, named by its rewind id
    assert DeltaTable(str(lake / "records")).version() == version
    assert _records(lake) == old
    first = _diverged(lake)
    assert [(r["offset"], r["value"]) for r in first] == [(o, v) for o, _, v in old[cut:]]
    records_dir = lake / "records"
    live = {Path(u).resolve() for u in DeltaTable(str(records_dir)).file_uris()}
    orphans = [p for p in records_dir.rglob("part-*.parquet") if p.resolve() not in live]
    assert orphans  # the killed run's re-ingested and rewritten files
    assert len(list((records_dir / "_loglake_staging").glob("*.json"))) == 1  # its lease

    time.sleep(3 + 2 + 1)  # the killed run's lease expires: the next run removes its files
    summary = run_ingest(spark, _config(b, lake, "rewind"), log=_quiet)
    assert summary.committed and summary.diverged_rows == 200 - cut
    assert _records(lake) == old[:cut] + new
    again = _diverged(lake)  # replaced, not added again
    assert [(r["offset"], r["value"]) for r in again] == [(o, v) for o, _, v in old[cut:]]
    assert {r["rewind_id"] for r in again} == {r["rewind_id"] for r in first}
    assert not any(p.exists() for p in orphans)
    assert run_ingest(spark, _config(b, lake, "rewind"), log=_quiet).committed is False


def test_rewind_keeps_the_other_partitions_rows_of_rewritten_files(
    spark: SparkSession, broker_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Data files hold rows of several partitions of a topic: a rewind of partition 0 writes
    partition 1's rows of those files back, and partition 1 stays as it was."""
    b = broker_factory()
    topic = new_topic(b.bootstrap, partitions=2, prefix="twoparts")
    old0 = _produce(b.bootstrap, topic, "old0", 100, partition=0)
    old1 = _produce(b.bootstrap, topic, "old1", 100, partition=1)
    b.stop()
    lake = tmp_path / "lake"
    # one task for both partitions (as on one core): its data files hold rows of both
    monkeypatch.setattr(ingest_mod, "schedule_tasks", lambda pieces, *_a: [list(pieces)])
    assert run_ingest(spark, _config(b, lake), log=_quiet).records == 200
    monkeypatch.undo()
    adds = pa.table(DeltaTable(str(lake / "records")).get_add_actions(flatten=True)).to_pylist()
    assert [(f["min.partition"], f["max.partition"]) for f in adds] == [(0, 1)]
    b.start()
    cut = _crash_losing_tail(b, topic, 60)
    new0 = _produce(b.bootstrap, topic, "new0", 70, partition=0)
    b.stop()

    summary = run_ingest(spark, _config(b, lake, "rewind"), log=_quiet)
    assert summary.committed and summary.rewinds == [f"{topic}/0 from offset {cut}"]
    cols = ["partition", "offset", "key", "value"]
    rows = DeltaTable(str(lake / "records")).to_pyarrow_table(columns=cols).to_pylist()
    got = sorted((r["partition"], r["offset"], r["key"], r["value"]) for r in rows)
    want = sorted([(0, *r) for r in old0[:cut] + new0] + [(1, *r) for r in old1])
    assert got == want
    assert read_progress(lake / "records") == {(topic, 0): cut + 70, (topic, 1): 100}
    assert [(r["partition"], r["offset"]) for r in _diverged(lake)] == [
        (0, o) for o, _, _ in old0[cut:]
    ]
