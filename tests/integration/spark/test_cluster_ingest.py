"""The ingest job on a real Spark standalone cluster: master + 2 workers on 127.0.0.1.

The cluster comes from pyspark's own launcher (``tests/fixtures/spark_cluster.py``); the job
is started with ``bin/spark-submit --master spark://...``, exactly as an operator would, so
the driver, the two executors and their Python workers are all separate processes and
nothing is shared through the test process. The first test proves that process layout from
inside the tasks; the second runs ``jobs/ingest.py`` over segment directories written with
the storage engine and reads the ``records`` table back with delta-rs.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from logstore.protocol.batch import Codec
from logstore.protocol.control import ControlType, build_control_batch
from logstore.protocol.records import build_batch
from logstore.storage.checkpoints import write_offset_checkpoint
from logstore.storage.config import LogConfig
from logstore.storage.log import Log
from tests.fixtures.spark_cluster import (
    EXECUTOR_BACKEND_CLASS,
    PYTHON,
    SparkCluster,
    SubmitResult,
    start_cluster,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
INGEST_JOB = ROOT / "jobs" / "ingest.py"
PIPELINE_CONF = ROOT / "conf" / "pipeline.toml"
# 23:00 UTC: the records straddle midnight, so the table gets two `date` partitions.
BASE_MS = int(dt.datetime(2024, 5, 1, 23, tzinfo=dt.UTC).timestamp() * 1000)

# topic, partition, offset, timestamp ms, key, value, headers, codec, is_transactional
Row = tuple[
    str, int, int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]], str, bool
]

PROBE = '''
"""Reports, from inside tasks, which processes run them (cluster fixture sanity check)."""
import json
import os
import sys

from pyspark import TaskContext
from pyspark.sql import SparkSession


def lineage(pid):
    """[(pid, command line)] from pid up to init, read from /proc."""
    out = []
    while pid > 1:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
        out.append([pid, cmd])
        pid = parent
    return out


def probe(_index):
    import pipelines

    return {
        "partition": TaskContext.get().partitionId(),
        "pid": os.getpid(),
        "python": sys.executable,
        "pipelines": pipelines.__file__,
        "cwd": os.getcwd(),
        "lineage": lineage(os.getpid()),
    }


spark = SparkSession.builder.appName("loglake-cluster-probe").getOrCreate()
sc = spark.sparkContext
tasks = sc.parallelize(range(6), 6).map(probe).collect()
print(json.dumps({
    "master": sc.master,
    "driver_pid": os.getpid(),
    "driver_lineage": lineage(os.getpid()),
    "tasks": tasks,
}))
spark.stop()
'''


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    with start_cluster(tmp_path_factory.mktemp("spark-cluster")) as c:
        yield c


def _check(result: SubmitResult, cluster: SparkCluster) -> dict[str, Any]:
    if result.returncode != 0:
        pytest.fail(
            f"spark-submit exited {result.returncode} after {result.seconds:.0f}s\n"
            f"stderr (tail):\n{result.stderr[-6000:]}\n{cluster.diagnostics()}"
        )
    return result.json_line()


def _executor_jvm(lineage: list[list[Any]]) -> tuple[int, int]:
    """(executor JVM pid, its parent's pid) from a task's process lineage."""
    for i, (pid, cmd) in enumerate(lineage):
        if EXECUTOR_BACKEND_CLASS in cmd:
            return pid, lineage[i + 1][0]
    raise AssertionError(f"no executor JVM above the task: {lineage}")


def test_tasks_run_in_the_workers_executors_not_in_the_driver(
    cluster: SparkCluster, tmp_path: Path
) -> None:
    script = tmp_path / "probe.py"
    script.write_text(PROBE, encoding="utf-8")
    report = _check(cluster.submit(script, cwd=tmp_path), cluster)

    assert report["master"] == cluster.master_url
    tasks = report["tasks"]
    assert sorted(t["partition"] for t in tasks) == list(range(6))
    driver_pid = report["driver_pid"]
    driver_side = {pid for pid, _cmd in report["driver_lineage"]}
    executors: dict[int, int] = {}
    for t in tasks:
        jvm, parent = _executor_jvm(t["lineage"])
        executors[jvm] = parent
        task_side = {pid for pid, _cmd in t["lineage"]}
        # The task's process tree and the driver's share nothing below init/the shell.
        assert driver_pid not in task_side and t["pid"] not in driver_side
        assert jvm not in driver_side and not (set(cluster.worker_pids) & driver_side)
        # Python workers use the project's interpreter and import the installed project.
        assert os.path.samefile(t["python"], PYTHON)
        assert Path(t["pipelines"]).resolve() == ROOT / "pipelines" / "__init__.py"
        # Executors run in their worker's work dir, not in the driver's cwd.
        assert any(Path(t["cwd"]).is_relative_to(d) for d in cluster.worker_dirs), t["cwd"]
    # Two executor JVMs, one launched by each worker daemon this fixture started.
    assert len(executors) == 2
    assert sorted(executors.values()) == sorted(cluster.worker_pids)


class LogDir:
    """A broker-like log dir written with the storage engine; remembers what was appended."""

    def __init__(self, root: Path) -> None:
        self.root = root
        # Small segments: each partition rolls, so the source plans several input splits.
        self.config = LogConfig(segment_bytes=400)
        self.logs: dict[tuple[str, int], Log] = {}
        self.rows: list[Row] = []

    def log(self, topic: str, partition: int) -> Log:
        if (topic, partition) not in self.logs:
            self.logs[(topic, partition)] = Log.open(
                self.root / f"{topic}-{partition}", self.config
            )
        return self.logs[(topic, partition)]

    def produce(
        self, topic: str, partition: int, n: int, *, codec: Codec, seed: int, tx: bool = False
    ) -> None:
        items = []
        for i in range(n):
            j = seed + i
            key = None if j % 5 == 0 else f"k{j % 7}".encode()
            # Tombstones (None), empty values and arbitrary (non-UTF-8) bytes.
            value = None if j % 6 == 3 else bytes((j * 31 + b) % 256 for b in range(j % 40))
            headers = tuple(
                (f"h{h}", None if (j + h) % 4 == 0 else bytes([h, j % 256, 0xFF]))
                for h in range(j % 3)
            )
            items.append((key, value, headers, BASE_MS + j * 97_000))
        extra: dict[str, Any] = {}
        if tx:
            extra = {
                "producer_id": 7,
                "producer_epoch": 0,
                "base_sequence": 0,
                "is_transactional": True,
            }
        info = self.log(topic, partition).append(build_batch(items, codec=codec, **extra))
        for offset, (key, value, headers, ts) in enumerate(items, start=info.first_offset):
            self.rows.append(
                (topic, partition, offset, ts, key, value, list(headers), codec.label, tx)
            )

    def commit_marker(self, topic: str, partition: int) -> None:
        self.log(topic, partition).append(
            build_control_batch(
                ControlType.COMMIT, producer_id=7, producer_epoch=0, timestamp=BASE_MS
            )
        )

    def close(self) -> None:
        """Flush, checkpoint high watermarks and log starts as a broker does, and close."""
        for log in self.logs.values():
            log.high_watermark = log.log_end_offset
            log.flush()
        write_offset_checkpoint(
            self.root / "replication-offset-checkpoint",
            {tp: log.high_watermark for tp, log in self.logs.items()},
        )
        write_offset_checkpoint(
            self.root / "log-start-offset-checkpoint",
            {tp: log.log_start_offset for tp, log in self.logs.items()},
        )
        for log in self.logs.values():
            log.close()


def _write_logs(root: Path) -> LogDir:
    logs = LogDir(root)
    try:
        for b in range(4):
            logs.produce("orders", 0, 9, codec=Codec.LZ4, seed=100 * b)
            logs.produce("orders", 1, 9, codec=Codec.NONE, seed=100 * b + 50)
        logs.produce("audit.log", 0, 7, codec=Codec.NONE, seed=1)
        logs.produce("audit.log", 0, 6, codec=Codec.LZ4, seed=2, tx=True)
        logs.commit_marker("audit.log", 0)
        logs.produce("audit.log", 0, 5, codec=Codec.LZ4, seed=3)
    finally:
        logs.close()
    return logs


def _records(table: Path) -> list[Row]:
    """The records table through delta-rs (no Spark), in the shape of ``LogDir.rows``."""
    t = DeltaTable(str(table)).to_pyarrow_table()
    ts = t.column("timestamp")
    millis = ts.cast(pa.timestamp("ms", tz=ts.type.tz)).cast(pa.int64()).to_pylist()
    cols = [
        "topic",
        "partition",
        "offset",
        "key",
        "value",
        "headers",
        "codec",
        "is_transactional",
        "timestamp_type",
    ]
    out = []
    for ms, r in zip(millis, t.select(cols).to_pylist(), strict=True):
        assert r["timestamp_type"] == 0  # CreateTime throughout
        out.append(
            (
                r["topic"],
                r["partition"],
                r["offset"],
                ms,
                r["key"],
                r["value"],
                [(h["key"], h["value"]) for h in r["headers"]],
                r["codec"],
                r["is_transactional"],
            )
        )
    return sorted(out, key=lambda r: (r[0], r[1], r[2]))


def _ran_on_the_cluster(
    cluster: SparkCluster, apps_before: Mapping[str, Any], *, tasks: bool = True
) -> None:
    """The last submit registered with the master and both workers' executors ran its tasks
    (``tasks=False``: it got executors on both workers but needed no task at all).

    Fails when the driver silently ran in local mode (e.g. a configuration file's
    ``spark.master`` overriding ``spark-submit --master``). Counted by worker, not by
    executor directory: under load the master may replace a lost executor on a worker (a
    second directory there; seen in CI), which Spark does by design.
    """
    app = cluster.wait_completed(apps_before, timeout_s=20)
    assert app["name"] == "loglake-ingest"
    ran_by_worker: dict[Path, bool] = {}
    for executor in cluster.executor_dirs(app["id"]):
        log = (executor / "stderr").read_text(encoding="utf-8", errors="replace")
        worker = executor.parent.parent
        ran_by_worker[worker] = ran_by_worker.get(worker, False) or "Running task" in log
    assert set(ran_by_worker) == set(cluster.worker_dirs), ran_by_worker
    assert all(ran is tasks for ran in ran_by_worker.values()), ran_by_worker


def test_ingest_job_on_the_cluster_is_exact_and_a_rerun_is_a_no_op(
    cluster: SparkCluster, tmp_path: Path
) -> None:
    logs = _write_logs(tmp_path / "logs")
    lake = tmp_path / "lake"
    segments = {d.name: len(list(d.glob("*.log"))) for d in logs.root.iterdir() if d.is_dir()}
    assert len(segments) == 3 and min(segments.values()) > 1, segments  # several input splits
    args = ["--config", str(PIPELINE_CONF), "--log-dirs", str(logs.root), "--lake", str(lake)]
    work = tmp_path / "cwd"  # not the repository: nothing may depend on the driver's cwd
    work.mkdir()

    apps = cluster.completed_apps()
    first = _check(cluster.submit(INGEST_JOB, *args, cwd=work), cluster)
    _ran_on_the_cluster(cluster, apps)
    expected = sorted(logs.rows, key=lambda r: (r[0], r[1], r[2]))
    assert first["committed"] is True
    assert first["records"] == len(expected) == 4 * 9 * 2 + 7 + 6 + 5
    assert (first["partitions"], first["control_batches"], first["gaps"]) == (3, 1, [])
    ends = {tp: log.log_end_offset for tp, log in logs.logs.items()}
    assert first["progress"] == {f"loglake-ingest/{t}/{p}": end for (t, p), end in ends.items()}
    assert _records(lake / "records") == expected
    table = DeltaTable(str(lake / "records"))
    version = table.version()
    assert table.metadata().partition_columns == ["topic", "date"]

    apps = cluster.completed_apps()
    second = _check(cluster.submit(INGEST_JOB, *args, cwd=work), cluster)
    # every partition is at its high watermark: the re-run plans nothing, runs no task
    _ran_on_the_cluster(cluster, apps, tasks=False)
    assert (second["records"], second["committed"]) == (0, False)
    assert DeltaTable(str(lake / "records")).version() == version
    assert _records(lake / "records") == expected
