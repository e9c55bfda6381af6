"""kill -9 of the table job (``spark-submit jobs/compact.py``) at every step, then a re-run:
the topic table and its tombstone table equal the reference model, and each table directory
holds exactly the files some version of its Delta log names plus ``_delta_log`` and the
killed run's takeover tombstone — no lease, no scratch, no orphan data, change-data or
deletion vector file (pipelines.compaction.runs: one lease per run and table, in the store).
And the reaper never touches a live run's files (its lease is renewed).

The kills are the job's failpoints (``LOGLAKE_FAILPOINT``: SIGKILL of the whole spark-submit
session): after stage 1 (staging written), in stage 2 (the first task's files written),
before the commit (deletion vector files already moved into the table), and between the
tombstone table's commit and the topic table's. The tables are read back with delta-rs and
polars (``tests.fixtures.compaction``), the leftovers from the Delta log by
``tests.fixtures.jobs``, not by the job's code.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from deltalake import DeltaTable, QueryBuilder

from pipelines.compaction.config import CompactConfig
from pipelines.compaction.model import Rec, Strategy, latest
from pipelines.compaction.table import STAGING, run_compact, table_path, tombstones_path
from pipelines.delta.staging import LEASE_TTL_ENV
from tests.conftest import ROOT
from tests.fixtures.compaction import append_records, read_table_rows, read_topic_table
from tests.fixtures.jobs import referenced_files, spark_submit, table_files, unreferenced_files
from tests.integration.compaction.test_compact_table import _config, _expected, _quiet

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

STRATEGY = Strategy("timestamp")  # keeps a tombstone table too: two tables to commit
# The killed runs' leases: 3 s, so that they expire within seconds (ttl + the 2 s margin,
# and the file system's or S3's Last-Modified granularity).
TTL_S = 3
EXPIRED_S = TTL_S + 2 + 1.5


def _tombstones(recs: list[Rec]) -> dict[tuple[int, bytes], int]:
    return {pk: r.offset for pk, r in latest(recs, STRATEGY).items() if r.value is None}


def _read_tombstones(path: str) -> dict[tuple[int, bytes], int]:
    return {(r["partition"], r["key"]): r["offset"] for r in read_table_rows(path)}


def _workload(lake: Path, spark: SparkSession) -> tuple[list[Rec], Path]:
    """A first run (in-process) over 2 partitions x 40 keys, then a small change ingested:
    a few updates (deletion vectors: less than half of a bucket changes), an update that
    loses (older timestamp), tombstones and new keys. Returns all records and the job's
    config file."""
    config = _config(lake, STRATEGY, buckets=2)
    first = [
        Rec(p, o, 1_000 + o, b"k%02d" % (o % 40), b"v%d-%d" % (p, o), ())
        for p in (0, 1)
        for o in range(60)
    ]
    append_records(lake, "t", first, {0: 60, 1: 60})
    assert run_compact(spark, config, log=_quiet).topics[0].committed
    second = [
        Rec(0, 60, 5_000, b"k01", b"new", ()),
        Rec(0, 61, 5_000, b"k02", None, ()),  # tombstone
        Rec(0, 62, 10, b"k03", b"old", ()),  # older timestamp: loses
        Rec(0, 63, 5_000, b"k77", b"fresh", ()),
        Rec(1, 60, 5_000, b"k05", None, ()),  # tombstone
        Rec(1, 61, 5_000, b"k06", b"new", ()),
        Rec(1, 62, 5_000, b"k88", None, ()),  # tombstone of a key never seen
    ]
    append_records(lake, "t", second, {0: 64, 1: 63})
    conf = lake / "pipeline.toml"
    conf.write_text(
        f'[paths]\nlog_dirs = ["{lake / "logs"}"]\nlake = "{lake}"\n'
        '[compact]\ntopics = ["t"]\nbuckets = 2\n[compact.strategy]\nt = "timestamp"\n',
        encoding="utf-8",
    )
    return first + second, conf


def _run_files(root: str) -> list[str]:
    """Files in ``root`` that are the killed run's (in no version, or its staging)."""
    return unreferenced_files(root) if Path(root).is_dir() else []


STEPS = ["compact.after_stage1", "compact.mid_stage2", "compact.before_commit",
         "compact.between_commits", "compact.after_commit"]  # fmt: skip


def _every_version_reads(root: str) -> None:
    """Time travel still works: every version of the table reads (all its files are there)."""
    for version in range(DeltaTable(root).version() + 1):
        table = DeltaTable(root, version=version)
        QueryBuilder().register("t", table).execute("SELECT count(*) FROM t").read_all()


@pytest.mark.parametrize("failpoint", STEPS)
def test_killed_table_job_rerun_is_exact_with_no_leftover_files(
    spark: SparkSession, tmp_path: Path, failpoint: str
) -> None:
    recs, conf = _workload(tmp_path, spark)
    path, tombs = table_path(tmp_path, "t"), tombstones_path(tmp_path, "t")
    before = (DeltaTable(path).version(), read_topic_table(path))
    tomb_version = DeltaTable(tombs).version()
    committed = failpoint == "compact.after_commit"

    killed = spark_submit(
        "compact.py",
        ["--config", str(conf)],
        failpoint=failpoint,
        env={**os.environ, LEASE_TTL_ENV: str(TTL_S)},
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    # the topic table is as it was (or, killed after its commit, the model); the tombstone
    # table moved only if killed after its commit
    if committed:
        assert read_topic_table(path) == _expected(recs, STRATEGY)
    else:
        assert (DeltaTable(path).version(), read_topic_table(path)) == before
    moved = DeltaTable(tombs).version() != tomb_version
    assert moved == (failpoint in ("compact.between_commits", "compact.after_commit"))
    # evidence of where it died: the run's leases (one per table), and what it had written
    (marker,) = (Path(path) / STAGING).glob("*.json")
    write_id = marker.name.removesuffix(".json")
    lease = json.loads(marker.read_text())
    assert lease["host"] == socket.gethostname() and lease["write_id"] == write_id
    assert lease["ttl_s"] == TTL_S
    leases = [f"{STAGING}/{write_id}.json", f"tomb:{STAGING}/{write_id}.json"]
    left = _run_files(path) + [f"tomb:{f}" for f in _run_files(tombs)]
    assert all(f in left for f in leases), left
    staged = [f for f in left if f.startswith(f"{STAGING}/{write_id}/")]
    outside = [f for f in left if STAGING not in f]
    if failpoint == "compact.after_stage1":
        assert any(f.endswith(".arrow") for f in staged) and not outside, left
    elif committed:
        assert sorted(left) == sorted(leases)  # all it wrote is committed
    else:
        assert any(write_id in f for f in outside), left  # data / change-data files
    dvs = sorted(f for f in outside if f.startswith("dv/deletion_vector_"))
    if failpoint in ("compact.before_commit", "compact.between_commits"):
        assert dvs, left  # moved in ...
        assert sorted(lease["files"]) == dvs  # ... and listed in its lease first
    if failpoint == "compact.between_commits":
        assert not any(f.startswith("tomb:") and f not in leases for f in left)  # committed

    time.sleep(EXPIRED_S)  # the killed run's leases expire; nothing renews them
    result = run_compact(spark, config_of(tmp_path), log=_quiet).topics[0]
    assert result.committed != committed
    if not committed:
        assert result.buckets_with_deletion_vectors >= 1
    assert read_topic_table(path) == _expected(recs, STRATEGY)
    assert _read_tombstones(tombs) == _tombstones(recs)
    for root in (path, tombs):
        # exactly the files some version names, and the takeover tombstone that a woken-up
        # driver would find: nothing left over, nothing referenced lost
        assert unreferenced_files(root) == [f"{STAGING}/{write_id}.takeover"]
        assert table_files(root) - referenced_files(root) == set(unreferenced_files(root))
        _every_version_reads(root)
    assert not run_compact(spark, config_of(tmp_path), log=_quiet).topics[0].committed


def config_of(lake: Path) -> CompactConfig:  # the settings of _workload's pipeline.toml
    return _config(lake, STRATEGY, buckets=2)


_HOLDER = """
import json, sys, time
from pathlib import Path
from pipelines.compaction import runs
path = sys.argv[1]
run = runs.start_run(path, None)
data = Path(path, "bucket=0", f"part-00000-{run.write_id}-0-c000.snappy.parquet")
data.parent.mkdir(parents=True, exist_ok=True)
data.write_bytes(b"in flight")
dv = Path(path, "dv", "deletion_vector_00000000-0000-0000-0000-%012d.bin" % int(sys.argv[2]))
run.lease.add_files([f"dv/{dv.name}"])
dv.parent.mkdir(parents=True, exist_ok=True)
dv.write_bytes(b"in flight")
print(json.dumps([run.write_id, str(data), str(dv)]), flush=True)
time.sleep(600)
"""


def _hold(path: str, n: int) -> tuple[subprocess.Popen[str], str, Path, Path]:
    """Another run's driver, alive: its lease taken and renewed (3 s), a data file and a
    listed deletion vector file written, no commit."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, path, str(n)], cwd=ROOT, stdout=subprocess.PIPE,
        text=True, env={**os.environ, LEASE_TTL_ENV: str(TTL_S)},
    )  # fmt: skip
    assert proc.stdout is not None
    write_id, data, dv = json.loads(proc.stdout.readline())
    return proc, write_id, Path(data), Path(dv)


def test_a_live_runs_files_are_never_reaped_a_dead_ones_are(
    spark: SparkSession, tmp_path: Path
) -> None:
    recs, _conf = _workload(tmp_path, spark)
    path = table_path(tmp_path, "t")
    live, live_id, live_data, live_dv = _hold(path, 1)
    dead, dead_id, dead_data, dead_dv = _hold(path, 2)
    try:
        dead.kill()
        dead.wait()
        time.sleep(EXPIRED_S)  # longer than a lease's ttl + margin: only renewals keep one
        result = run_compact(spark, config_of(tmp_path), log=_quiet).topics[0]
        assert result.committed
        assert read_topic_table(path) == _expected(recs, STRATEGY)
        # the dead run's files and lease are gone (its takeover stays); the live one's stay
        assert not dead_data.exists() and not dead_dv.exists()
        # not the live run's renewal in flight (``.tmp-<lease>.<uuid>``, which listings skip)
        markers = sorted(
            p.name for p in Path(path, STAGING).iterdir() if not p.name.startswith(".tmp-")
        )
        assert markers == sorted([live_id + ".json", dead_id + ".takeover"])
        assert set(unreferenced_files(path)) == {
            str(p.relative_to(path))
            for p in (
                live_data,
                live_dv,
                Path(path, STAGING, live_id + ".json"),
                Path(path, STAGING, dead_id + ".takeover"),
            )
        }
    finally:
        live.kill()
        live.wait()
        dead.kill()
        dead.wait()
    # the live run died without ending: once its lease expired, the next run removes its files
    time.sleep(EXPIRED_S)
    append_records(tmp_path, "t", [Rec(0, 64, 9_000, b"k09", b"later", ())], {0: 65, 1: 63})
    assert run_compact(spark, config_of(tmp_path), log=_quiet).topics[0].committed
    assert not live_data.exists() and not live_dv.exists()
    assert sorted(unreferenced_files(path)) == sorted(
        f"{STAGING}/{w}.takeover" for w in (live_id, dead_id)
    )


def test_two_runs_at_once_the_later_commit_fails_cleanly(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs of the same topic at once (threads of one driver, real Spark jobs): both
    reach their commit having read the same snapshot (a barrier at the before_commit
    failpoint); one commits, the other fails with ConcurrentWriteError, removing its own
    files, not the winner's; the table equals the model and holds no leftover."""
    from pipelines.compaction import commit as commit_mod
    from pipelines.delta.errors import ConcurrentWriteError

    recs, _conf = _workload(tmp_path, spark)
    path, tombs = table_path(tmp_path, "t"), tombstones_path(tmp_path, "t")
    barrier = threading.Barrier(2, timeout=120)
    failpoint = commit_mod.failpoint

    def meet(name: str, **kwargs: Any) -> None:
        if name == "compact.before_commit":
            barrier.wait()  # both runs hold their marker and their files now
            assert len(list((Path(path) / STAGING).glob("*.json"))) == 2  # two leases
        failpoint(name, **kwargs)

    monkeypatch.setattr(commit_mod, "failpoint", meet)
    outcomes: list[object] = []

    def run() -> None:
        try:
            outcomes.append(run_compact(spark, config_of(tmp_path), log=_quiet).topics[0])
        except Exception as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    errors = [o for o in outcomes if isinstance(o, Exception)]
    done = [o for o in outcomes if not isinstance(o, Exception)]
    assert len(errors) == 1 and len(done) == 1, outcomes
    assert isinstance(errors[0], ConcurrentWriteError), errors[0]
    assert read_topic_table(path) == _expected(recs, STRATEGY)
    assert _read_tombstones(tombs) == _tombstones(recs)
    for root in (path, tombs):
        assert table_files(root) == referenced_files(root)  # no lease, scratch or leftover
