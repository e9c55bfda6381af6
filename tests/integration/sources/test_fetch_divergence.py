"""A log that went backwards under a lake ingested through Fetch (no log dirs): the topic is
deleted and made again with fewer records, then written past the lake's progress. Ingest
through Fetch must judge it as ingest from the log dirs does, side by side on the same
broker: exit 4 from the job under the same config file (but for ``log_dirs``), the same
error, and ``on_divergence="rewind"`` leaving the same ``records`` and ``diverged`` tables.
A real broker, confluent-kafka producing with acks=all, the shared Spark session, the tables
read back with delta-rs and polars."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession

from jobs.ingest import main
from pipelines.divergence import DivergenceError, read_fingerprints
from pipelines.ingest import IngestConfig, read_progress, run_ingest
from tests.fixtures.broker import wait_for
from tests.integration.broker.clients import new_topic
from tests.integration.sources.test_fetch_jobs import CHECKPOINT_MS, _checkpointed
from tests.integration.spark.test_ingest_divergence import _diverged, _produce, _records

pytestmark = pytest.mark.integration


def _quiet(_message: str) -> None:
    pass


def _made_again(bootstrap: str, topic: str) -> None:
    """Delete ``topic`` and create it again under the same name (once the deletion is done)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic], operation_timeout=10)[topic].result(timeout=30)

    def created() -> bool:
        try:
            admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
        except Exception:  # still being deleted: try again
            return False
        return True

    wait_for(created, 30)


def test_log_that_went_backwards_through_fetch_as_from_log_dirs(
    spark: SparkSession, tmp_path: Path, broker_factory: Any
) -> None:
    b = broker_factory(**CHECKPOINT_MS)
    topic = new_topic(b.bootstrap, partitions=1, prefix="backwards")
    old = _produce(b.bootstrap, topic, "old", 200)
    _checkpointed(b, [topic])
    fa, fb = tmp_path / "files", tmp_path / "fetch"
    files = IngestConfig(log_dirs=(str(b.log_dir),), lake=str(fa), progress_interval_s=0)
    fetch = dataclasses.replace(files, log_dirs=(), lake=str(fb), bootstrap_servers=b.bootstrap)
    assert run_ingest(spark, files, log=_quiet).records == 200
    assert run_ingest(spark, fetch, log=_quiet).records == 200
    # the commit remembers the batch holding offset 199, read by a Fetch: the file's header
    progress = read_progress(fb / "records")
    assert progress == {(topic, 0): 200}
    through_fetch = read_fingerprints(fb / "records", progress)[(topic, 0)]
    from_files = read_fingerprints(fa / "records", progress)[(topic, 0)]
    assert through_fetch is not None and from_files is not None
    assert through_fetch.same_batch(from_files) and through_fetch.last_offset == 199
    assert (through_fetch.segment_base_offset, through_fetch.position) == (-1, -1)
    lines: list[str] = []
    assert run_ingest(spark, fetch, log=lines.append).records == 0  # the same log: no error
    assert not any("DIVERGED" in x or "not done" in x for x in lines), lines

    # made again with fewer records: the log ends below the lake's progress
    _made_again(b.bootstrap, topic)
    new = _produce(b.bootstrap, topic, "new", 50)
    _checkpointed(b, [topic])
    for config in (fetch, files):
        with pytest.raises(DivergenceError, match=rf"{topic}/0: the log ends at offset 50, below"):
            run_ingest(spark, config, log=_quiet)
    # the job: exit 4 under the same config file, with log dirs or without
    conf = tmp_path / "pipeline.toml"
    for dirs, lake in (("[]", fb), (f'["{b.log_dir}"]', fa)):
        conf.write_text(
            f'[paths]\nlog_dirs = {dirs}\nlake = "{lake}"\n'
            f'[ingest]\nbootstrap_servers = "{b.bootstrap}"\nprogress_interval_s = 0\n'
        )
        assert main(["--config", str(conf)]) == 4
    assert _records(fb) == _records(fa) == old

    # written again past the lake's progress: another batch holds offset 199 now
    newer = _produce(b.bootstrap, topic, "newer", 200)
    assert [o for o, _, _ in newer] == list(range(50, 250))
    _checkpointed(b, [topic])
    for config in (fetch, files):
        with pytest.raises(DivergenceError, match=rf"{topic}/0: offset 199: the lake has batch"):
            run_ingest(spark, config, log=_quiet)

    # rewind: both lakes hold what the log holds now, the old rows moved to diverged
    for config in (fetch, files):
        summary = run_ingest(spark, dataclasses.replace(config, on_divergence="rewind"), log=_quiet)
        assert summary.committed and summary.diverged_rows == 200
        assert summary.rewinds == [f"{topic}/0 from offset 0"]
    assert _records(fb) == _records(fa) == new + newer
    moved = [[(r["offset"], r["key"], r["value"]) for r in _diverged(x)] for x in (fb, fa)]
    assert moved[0] == moved[1] == old
    assert read_progress(fb / "records") == {(topic, 0): 250}
    again = run_ingest(spark, fetch, log=_quiet)
    assert (again.committed, again.records, again.diverged_rows) == (False, 0, 0)
