"""``on_divergence = "rewind"`` with the lake on S3 (a real moto server): the rewind reads the
data files holding rows past the cut from the store (not as local paths), writes the rows it
keeps and the moved ones back there, and ``records``/``diverged`` read back with delta-rs
equal the log now / the lake's old rows past the cut."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from deltalake import DeltaTable

from logstore.objectstore import delta_target
from pipelines.ingest import IngestConfig, run_ingest
from tests.integration.broker.clients import new_topic
from tests.integration.spark.test_ingest_divergence import _crash_losing_tail, _produce

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tests.fixtures.s3 import S3Bucket

pytestmark = pytest.mark.integration


def _rows(uri: str, columns: list[str]) -> list[dict[str, Any]]:
    target, options = delta_target(uri)
    return DeltaTable(target, storage_options=options).to_pyarrow_table(columns=columns).to_pylist()


def test_rewind_on_an_s3_lake(spark: SparkSession, broker_factory: Any, s3: S3Bucket) -> None:
    b = broker_factory()
    topic = new_topic(b.bootstrap, partitions=1, prefix="s3rewind")
    old = _produce(b.bootstrap, topic, "old", 120)
    b.stop()
    lake = s3.uri("lake")
    config = IngestConfig(log_dirs=(str(b.log_dir),), lake=lake, on_divergence="rewind")
    assert run_ingest(spark, config, log=lambda _m: None).records == 120
    b.start()
    cut = _crash_losing_tail(b, topic, 70)
    b.stop()

    summary = run_ingest(spark, config, log=lambda _m: None)
    assert summary.committed and summary.diverged_rows == 120 - cut
    kept = _rows(f"{lake}/records", ["offset", "key", "value"])
    assert sorted((r["offset"], r["key"], r["value"]) for r in kept) == old[:cut]
    moved = _rows(f"{lake}/diverged", ["offset", "key", "value"])
    assert sorted((r["offset"], r["key"], r["value"]) for r in moved) == old[cut:]
    again = run_ingest(spark, config, log=lambda _m: None)
    assert (again.committed, again.diverged_rows) == (False, 0)
