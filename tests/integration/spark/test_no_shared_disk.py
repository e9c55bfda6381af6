"""Issue 24's "no shared disk", proven: Spark that cannot see the broker's log dirs ingests
everything.

A real broker keeps its log dirs under a directory that a Spark standalone cluster's worker,
and the job's driver, cannot see: both run in mount namespaces of their own (``unshare``,
``tests/fixtures/mount_ns.py``) where that directory is an empty tmpfs. The broker tiers its
closed segments to a real S3 server (moto) and keeps only each partition's active segment
locally, so most of the history is remote and the rest local. ``jobs/ingest.py`` runs with
``log_dirs = []`` through ``spark-submit --master spark://...`` and must ingest every record
through Fetch (the broker serves the tiered part from the store). The test checks, from the
outside, that the namespace hides the log dirs (a probe process in it sees an empty
directory), that every process below the worker during the run (the executor JVM and its
Python workers) was in that namespace, that the application's tasks ran in that worker's
executor, and reads the table back with delta-rs: row for row what confluent-kafka produced.
On the same cluster, ``jobs/retention.py`` given a log dir that only its driver sees exits 2
at once, saying so.

Extending to the tier (``[paths] remote_log_storage``, executors reading tiered segments
straight from the store): the broker here already has its early segments remote (under
``tiered/``); add ``remote_log_storage = "s3://<bucket>/tiered"`` to the job's config and the
store's environment (the ``AWS_*`` the ``s3`` fixture sets) to the driver, e.g. as an
``env K=V ...`` part of ``submit``'s ``prefix``: the driver resolves the store's settings and
ships them with the tasks, so the executors need no environment of their own.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pipelines.retention.model import ModelPartition, ModelSegment
from tests.fixtures.broker import wait_for
from tests.fixtures.mount_ns import (
    hiding_prefix,
    in_namespace_of,
    mount_namespace,
    unavailable_reason,
)
from tests.fixtures.retention_logdirs import write_log_dir
from tests.fixtures.spark_cluster import EXECUTOR_BACKEND_CLASS, SparkCluster, start_cluster
from tests.integration.broker.clients import Got, ck_produce, expected, make_records, new_topic

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
INGEST_JOB = ROOT / "jobs" / "ingest.py"
RETENTION_JOB = ROOT / "jobs" / "retention.py"
PARTITIONS = 3
RECORDS = 3000


@pytest.fixture(scope="module")
def hidden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory the blind processes see as empty (the broker's log dirs go below it)."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"no mount namespaces: {reason}")
    return tmp_path_factory.mktemp("broker-disk")


@pytest.fixture(scope="module")
def blind_cluster(tmp_path_factory: pytest.TempPathFactory, hidden: Path) -> Iterator[SparkCluster]:
    """A master and one worker (2 cores) whose mount namespace hides ``hidden``."""
    with start_cluster(
        tmp_path_factory.mktemp("spark-cluster"),
        workers=1,
        cores=2,
        worker_prefix=hiding_prefix([hidden]),
    ) as cluster:
        yield cluster


class _NamespaceWatch(threading.Thread):
    """While a job runs: the mount namespace of every process that appears below worker 0."""

    def __init__(self, cluster: SparkCluster) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        # (pid, command line, namespace): every command line a pid showed, since a process
        # may be sampled before its exec (the executor JVM as Java's ``jspawnhelper``)
        self.seen: set[tuple[int, str, str]] = set()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for pid, cmd in self.cluster.worker_processes(0).items():
                try:
                    self.seen.add((pid, cmd, mount_namespace(pid)))
                except OSError:  # ended in between
                    continue
            self.done.wait(0.1)

    def __enter__(self) -> _NamespaceWatch:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.done.set()
        self.join(timeout=10)


def _local_starts(log_dir: Path, topic: str) -> dict[int, list[int]]:
    """Per partition, the base offsets of the segments still on the broker's disk."""
    return {
        p: sorted(int(f.stem) for f in (log_dir / f"{topic}-{p}").glob("*.log"))
        for p in range(PARTITIONS)
    }


def _aws_env() -> list[str]:
    """The store's settings (set by the ``s3`` fixture) as ``env`` arguments for the driver."""
    return [f"{k}={v}" for k, v in os.environ.items() if k.startswith("AWS_")]


def _table_rows(table: Path) -> dict[int, list[Got]]:
    """The records table through delta-rs, per partition in offset order, as ``Got`` rows."""
    t = DeltaTable(str(table)).to_pyarrow_table()
    ts = t.column("timestamp")
    millis = ts.cast(pa.timestamp("ms", tz=ts.type.tz)).cast(pa.int64()).to_pylist()
    out: dict[int, list[Got]] = {}
    cols = ["partition", "offset", "key", "value", "headers"]
    for ms, r in zip(millis, t.select(cols).to_pylist(), strict=True):
        headers = tuple((h["key"], h["value"]) for h in r["headers"])
        out.setdefault(r["partition"], []).append(
            Got(r["partition"], r["offset"], r["key"], r["value"], headers, ms)
        )
    return {p: sorted(rows, key=lambda g: g.offset) for p, rows in sorted(out.items())}


def test_a_blind_cluster_ingests_everything_through_the_broker(
    blind_cluster: SparkCluster,
    hidden: Path,
    broker_factory: Any,
    s3: Any,
    tmp_path: Path,
) -> None:
    log_dir = hidden / "logs"
    b = broker_factory(
        log_dir=log_dir,
        remote_log_storage_system_enable="true",
        **{
            "remote.log.manager.task.interval.ms": "200",
            "rsm.config.storage.s3.bucket.name": s3.name,
            "rsm.config.key.prefix": "tiered/",
            "log.segment.delete.delay.ms": "0",
        },
    )
    topic = new_topic(
        b.bootstrap,
        partitions=PARTITIONS,
        prefix="blind",
        **{"remote.storage.enable": "true", "segment.bytes": "32768", "local.retention.ms": "0"},
    )
    records = make_records(RECORDS, partitions=PARTITIONS, seed=24)
    half = RECORDS // 2
    ck_produce(b.bootstrap, topic, records[:half], codec="zstd", acks="all", idempotent=True,
               flush_every=50)  # fmt: skip
    ck_produce(b.bootstrap, topic, records[half:], codec="none", acks="all", idempotent=False,
               flush_every=50)  # fmt: skip
    # the closed segments went to the store: each partition keeps only its active one locally
    wait_for(lambda: all(len(s) == 1 for s in _local_starts(log_dir, topic).values()), 120)
    assert all(s[0] > 0 for s in _local_starts(log_dir, topic).values())
    assert s3.keys("tiered/")

    # the worker's namespace: the broker's disk is an empty directory there, full here
    worker = blind_cluster.workers[0].pid
    assert mount_namespace(worker) != mount_namespace()
    probe = in_namespace_of(worker, ["ls", "-A", str(hidden)])
    assert (probe.returncode, probe.stdout, probe.stderr) == (0, "", "")
    assert (log_dir / f"{topic}-0").is_dir()

    config = tmp_path / "pipeline.toml"
    config.write_text(
        f'[paths]\nlog_dirs = []\nlake = "{tmp_path / "lake"}"\n'
        f'remote_log_storage = "{s3.uri("tiered")}"\n'
        f'[ingest]\nbootstrap_servers = "{b.bootstrap}"\nprogress_interval_s = 0\n'
        f'topics = ["{topic}"]\n'
    )
    apps = blind_cluster.completed_apps()
    with _NamespaceWatch(blind_cluster) as watch:
        # the driver is blind too: nothing of the application sees the log dirs
        result = blind_cluster.submit(
            INGEST_JOB,
            "--config",
            str(config),
            cwd=tmp_path,
            prefix=["env", *_aws_env(), *hiding_prefix([hidden])],
        )
    if result.returncode != 0:
        pytest.fail(
            f"spark-submit exited {result.returncode} after {result.seconds:.0f}s\n"
            f"stderr (tail):\n{result.stderr[-6000:]}\n{blind_cluster.diagnostics()}"
        )
    summary = result.json_line()
    # the tiered segments were read from the store (the driver plans them; executors read them)
    tiered = sum(s[0] for s in _local_starts(log_dir, topic).values())
    assert (
        f"tier: {tiered} offsets of {PARTITIONS}/{PARTITIONS} partitions"
        in result.stdout + result.stderr
    )
    assert (summary["records"], summary["committed"], summary["gaps"]) == (RECORDS, True, [])

    # every process the worker ran during the job was in its namespace: the executor JVM and
    # the Python workers that read through Fetch and wrote the Parquet files
    assert {ns for _pid, _cmd, ns in watch.seen} == {mount_namespace(worker)}
    commands = [cmd for _pid, cmd, _ns in watch.seen]
    assert any(EXECUTOR_BACKEND_CLASS in cmd for cmd in commands), commands
    assert any("spark_daemon" in cmd or "pyspark" in cmd for cmd in commands), commands
    # the application's tasks ran there (its executor's log is in that worker's work dir)
    app = blind_cluster.wait_completed(apps, timeout_s=30)
    executor_logs = [d / "stderr" for d in blind_cluster.executor_dirs(app["id"])]
    assert executor_logs, app
    assert all(p.is_relative_to(blind_cluster.worker_dirs[0]) for p in executor_logs)
    assert any("Running task" in p.read_text(errors="replace") for p in executor_logs)

    assert _table_rows(tmp_path / "lake" / "records") == expected(records)


def test_retention_reading_log_dirs_the_executors_cannot_see_exits_2(
    blind_cluster: SparkCluster, hidden: Path, tmp_path: Path
) -> None:
    """The driver sees the log dir, the blind executors do not: exit 2 naming the log dir and
    ``log_dirs = []``, nothing planned (before: exit 0 with an empty plan, nothing said)."""
    log_dir = hidden / "retention-logs"
    old = 1_700_000_000_000
    segs = [ModelSegment(i * 10, 100, old, old) for i in range(4)]
    part = ModelPartition(segs, 1000, -1, "delete", 0, 40, None)
    write_log_dir(log_dir, {("t", 0): part, ("t", 1): part}, {"t": {}})
    (tmp_path / "broker.properties").write_text("log.retention.ms=1000\n")
    config = tmp_path / "pipeline.toml"
    config.write_text(
        f'[paths]\nlog_dirs = ["{log_dir}"]\nlake = "{tmp_path / "lake"}"\n'
        f'[retention]\nbroker_config = "{tmp_path / "broker.properties"}"\n'
    )
    result = blind_cluster.submit(
        RETENTION_JOB, "--config", str(config), "--dry-run", "--force", cwd=tmp_path
    )
    assert result.returncode == 2, result.stderr[-4000:]
    assert f"the executors cannot see log dir {log_dir} (no shared disk?)" in result.stdout
    assert not (tmp_path / "lake").exists()
