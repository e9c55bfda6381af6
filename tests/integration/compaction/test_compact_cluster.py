"""Compaction on a real Spark standalone cluster (master + 2 workers on 127.0.0.1,
``tests/fixtures/spark_cluster.py``), jobs started with ``bin/spark-submit --master spark://``
as an operator would: driver, executors and their Python workers are separate processes.

Over a compacted topic written with the storage engine (two partitions, several segments):
``jobs/ingest.py`` fills ``records``, ``jobs/compact.py`` builds the topic table (read back
with delta-rs: the reference model), and ``jobs/compact.py --log`` cleans the log itself (the
executors rewrite the segments, the driver swaps them in under the log dir's ``.lock``: no
broker runs); the log then holds exactly the model's records, and both apps ran their tasks
on both workers' executors.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from logstore.protocol.batch import Codec
from logstore.protocol.records import build_batch
from logstore.storage.checkpoints import write_offset_checkpoint
from logstore.storage.cleaner import read_cleaner_checkpoint
from logstore.storage.config import LogConfig
from logstore.storage.log import Log
from logstore.storage.topic_config import write_topic_config
from pipelines.compaction.model import Rec, compact, latest
from tests.fixtures.compaction import read_topic_table
from tests.fixtures.spark_cluster import SparkCluster, SubmitResult, start_cluster
from tests.unit.storage.test_cleaner import read_log

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
CONF = ROOT / "conf" / "pipeline.toml"
TOPIC = "orders"
NOW = 1_700_000_000_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    with start_cluster(tmp_path_factory.mktemp("spark-cluster")) as c:
        yield c


def _check(result: SubmitResult, cluster: SparkCluster) -> str:
    if result.returncode != 0:
        pytest.fail(
            f"spark-submit exited {result.returncode} after {result.seconds:.0f}s\n"
            f"stderr (tail):\n{result.stderr[-6000:]}\n{cluster.diagnostics()}"
        )
    return result.stdout.strip().splitlines()[-1]


def _ran_on_both_workers(cluster: SparkCluster, before: Mapping[str, Any], name: str) -> None:
    app = cluster.wait_completed(before, timeout_s=30)
    assert app["name"] == name
    logs = [d / "stderr" for d in cluster.executor_dirs(app["id"])]
    assert {p.parent.parent.parent for p in logs} == set(cluster.worker_dirs)
    ran = ["Running task" in p.read_text(encoding="utf-8", errors="replace") for p in logs]
    assert any(ran), logs


def _write_topic(log_dir: Path) -> list[Rec]:
    """Two partitions of a compacted topic (segments of ~400 B), high watermarks checkpointed
    as a broker does; every record written."""
    props = {"cleanup.policy": "compact", "segment.bytes": "400"}
    write_topic_config(log_dir, TOPIC, props)
    recs: list[Rec] = []
    ends = {}
    for p in (0, 1):
        log = Log.open(log_dir / f"{TOPIC}-{p}", LogConfig.from_properties(props))
        for b in range(24):
            items = []
            for i in range(3):
                j = 3 * b + i
                value = None if j % 7 == 5 else b"v%d-%d" % (p, j)
                items.append((b"key-%d" % (j % (5 + p)), value, [], NOW + j))
            codec = [Codec.NONE, Codec.LZ4, Codec.ZSTD][b % 3]
            info = log.append(
                build_batch(
                    items, codec=codec, producer_id=3, producer_epoch=0, base_sequence=3 * b
                )
            )
            for k, (key, value, _h, ts) in enumerate(items):
                recs.append(Rec(p, info.first_offset + k, ts, key, value))
        log.roll()
        ends[(TOPIC, p)] = log.log_end_offset
        log.close()
    write_offset_checkpoint(log_dir / "replication-offset-checkpoint", ends)
    write_offset_checkpoint(log_dir / "log-start-offset-checkpoint", dict.fromkeys(ends, 0))
    return recs


def test_table_and_log_compaction_on_the_cluster(cluster: SparkCluster, tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    recs = _write_topic(log_dir)
    for p in (0, 1):
        assert len(list((log_dir / f"{TOPIC}-{p}").glob("*.log"))) > 3  # several segments
    lake = tmp_path / "lake"
    args = ["--config", str(CONF), "--log-dirs", str(log_dir), "--lake", str(lake)]
    work = tmp_path / "cwd"  # not the repository: nothing may depend on the driver's cwd
    work.mkdir()

    apps = cluster.completed_apps()
    _check(cluster.submit(ROOT / "jobs" / "ingest.py", *args, cwd=work), cluster)
    _ran_on_both_workers(cluster, apps, "loglake-ingest")

    # the table output
    apps = cluster.completed_apps()
    summary = json.loads(
        _check(cluster.submit(ROOT / "jobs" / "compact.py", *args, cwd=work), cluster)
    )
    _ran_on_both_workers(cluster, apps, "loglake-compact")
    assert [t["topic"] for t in summary["topics"]] == [TOPIC]
    want = {pk: (r.offset, r.value, []) for pk, r in compact(recs).items()}
    assert read_topic_table(lake / "topics" / TOPIC) == want

    # the log output: executors rewrite, the driver swaps under .lock (no broker)
    before = {p: read_log(log_dir / f"{TOPIC}-{p}")[0] for p in (0, 1)}
    apps = cluster.completed_apps()
    results = json.loads(
        _check(
            cluster.submit(
                ROOT / "jobs" / "compact.py",
                *args,
                "--log",
                # conf/pipeline.toml's [retention] broker_config is relative to the cwd
                "--broker-config",
                str(ROOT / "conf" / "broker.properties"),
                cwd=work,
            ),
            cluster,
        )
    )
    _ran_on_both_workers(cluster, apps, "loglake-compact")
    assert sorted(Path(r["dir"]).name for r in results) == [f"{TOPIC}-0", f"{TOPIC}-1"]
    for r in results:
        assert r["swapped"] is True and r["note"] == "swapped offline", r
    checkpoint = read_cleaner_checkpoint(log_dir)
    for p in (0, 1):
        mine = [r for r in recs if r.partition == p]
        end = checkpoint[(TOPIC, p)]
        assert end == mine[-1].offset + 1  # everything below the (empty) active segment
        keep = {r.offset for r in latest(mine).values()}
        after, _ = read_log(log_dir / f"{TOPIC}-{p}")
        assert [(r.offset, r.key, r.value) for r in after] == [
            (r.offset, r.key, r.value) for r in mine if r.offset in keep
        ]
        assert len(after) < len(before[p])
