"""Shared test set-up: paths and environment every test may rely on."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Segment files written by real Apache Kafka brokers, in the checkout (provenance: its README).
KAFKA_REAL = ROOT / "tests" / "fixtures" / "kafka-real"

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

# A pytest-xdist worker runs under execnet's bootstrap: its ``__main__`` has neither ``__file__``
# nor ``__spec__``, which ``pyspark.sql.connect`` (imported by Great Expectations) takes for a
# doctest run without Spark Connect's dependencies and answers with ``sys.exit(0)`` at import,
# killing the worker. ``sys.ps1`` is the other sign it accepts of a real ``__main__``; with it
# the import fails with ImportError as under plain pytest (GX then leaves Connect out). Nothing
# else in the test environment reads ``sys.ps1`` but Hypothesis (a REPL-only warning) and
# python-dotenv's REPL detection, which the tests do not use.
if os.environ.get("PYTEST_XDIST_WORKER") and not hasattr(sys.modules["__main__"], "__file__"):
    sys.ps1 = ">>> "


@pytest.fixture(scope="session")
def kafka_real() -> Path:
    """The directory of real broker-written fixtures (read-only)."""
    if not KAFKA_REAL.is_dir():
        pytest.fail(f"fixtures missing: {KAFKA_REAL} (part of the repository: git checkout it)")
    return KAFKA_REAL


# The test files that take longest (``--durations`` of a parallel run, 2 workers, Nov 2026: the
# demo 320 s, S3 quality 190 s, the typed kill tests 180 s + 3 x 60-90 s, the DAG fixture and
# tests 180 + 126 + 96 + 73 s), slowest first. Under pytest-xdist (``make test``) files go to
# workers whole and in collection order, so these go first: a long file started last leaves the
# other workers idle at the end. Only the order changes; a file missing here still runs.
SLOW_FIRST = (
    "integration/test_demo.py",
    "integration/airflow/test_dags.py",
    "integration/typed/test_decode_kill.py",
    "integration/storage/test_s3_ingest.py",
    "integration/storage/test_s3_quality.py",
    "integration/spark/test_quality.py",
    "integration/storage/test_s3_compact_kill.py",
    "integration/spark/test_ingest_orphans.py",
    "integration/compaction/test_compact_cluster.py",
    "integration/spark/test_lookups_job.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a pytest-xdist worker: the files of :data:`SLOW_FIRST` first (stable otherwise)."""
    if not hasattr(config, "workerinput"):
        return
    rank = {str(ROOT / "tests" / name): i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(str(item.path), len(rank)))


# Fixture modules, each owned by the package it starts (broker, Spark session).
pytest_plugins = [
    "tests.fixtures.broker",
    "tests.fixtures.hostile",
    "tests.fixtures.s3",
    "tests.fixtures.spark",
    "tests.fixtures.tmpfs",
]
