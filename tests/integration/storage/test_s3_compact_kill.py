"""kill -9 of the table job (``spark-submit jobs/compact.py --lake s3://...``) on a lake in a
real S3 server (moto), at the essential steps, then a re-run.

The local-disk variant (``tests/integration/compaction/test_compact_table_kill.py``) kills at
every step; here the three that leave different things in the store: after stage 1 (scratch
buckets under the run's staging prefix), before the commit (data, change-data and deletion
vector files in the table, the vectors listed in the lease) and between the commits (the
tombstone table committed, the topic table not). Each time the topic table is as it was
(version and rows), the run's leases are in the bucket, and once they expired by the store's
clock (``LOGLAKE_LEASE_TTL_S`` 3 s) the next run reaps by lease alone (no ``flock``, no
process id: the reaper may be another host) and lands the tables on the reference model,
leaving exactly the files some version names plus the takeover tombstones.

The bucket is read with boto3 and mirrored to local disk, where the tables are read back by
delta-rs and polars and their leftovers found from the Delta log by the fixtures'
independent readers (``tests.fixtures.compaction``, ``tests.fixtures.jobs``).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from deltalake import DeltaTable

from pipelines.compaction.config import CompactConfig
from pipelines.compaction.model import Rec, Strategy, compact, latest
from pipelines.compaction.table import STAGING, run_compact, table_path, tombstones_path
from pipelines.delta.staging import LEASE_TTL_ENV
from tests.fixtures.compaction import append_records, read_table_rows, read_topic_table
from tests.fixtures.jobs import spark_submit, unreferenced_files
from tests.fixtures.s3 import S3Bucket

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

STRATEGY = Strategy("timestamp")  # keeps a tombstone table too: two tables to commit
TTL_S = 3
EXPIRED_S = TTL_S + 2 + 1.5  # ttl + the 2 s margin + S3's whole-second Last-Modified


def _quiet(_: str) -> None:
    pass


def _config(lake: str, logs: Path) -> CompactConfig:
    logs.mkdir(parents=True, exist_ok=True)
    return CompactConfig(
        log_dirs=(str(logs),), lake=lake, topics=("t",), strategies={"t": STRATEGY}, buckets=2
    )


def _mirror(s3: S3Bucket, table: str, into: Path) -> Path:
    """The table at ``table`` (an ``s3://`` URI in ``s3``'s bucket) copied to ``into``."""
    return s3.mirror(table.removeprefix(f"s3://{s3.name}/") + "/", into)


def _tombstones(recs: list[Rec]) -> dict[tuple[int, bytes], int]:
    return {pk: r.offset for pk, r in latest(recs, STRATEGY).items() if r.value is None}


@pytest.mark.parametrize(
    "failpoint", ["compact.after_stage1", "compact.before_commit", "compact.between_commits"]
)
def test_killed_table_job_on_s3_leaves_the_table_and_the_next_run_reaps_by_lease(
    spark: SparkSession, s3: S3Bucket, tmp_path: Path, failpoint: str
) -> None:
    lake = s3.uri("lake")
    config = _config(lake, tmp_path / "logs")
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
        Rec(1, 61, 5_000, b"k06", b"new", ()),  # few changes a bucket: deletion vectors
    ]
    append_records(lake, "t", second, {0: 64, 1: 62})
    recs = first + second
    path, tombs = table_path(lake, "t"), tombstones_path(lake, "t")
    before = _mirror(s3, path, tmp_path / "before")
    tomb_version = DeltaTable(str(_mirror(s3, tombs, tmp_path / "before-tombs"))).version()
    conf = tmp_path / "pipeline.toml"
    conf.write_text(
        f'[paths]\nlog_dirs = ["{tmp_path / "logs"}"]\nlake = "{tmp_path / "unused"}"\n'
        '[compact]\ntopics = ["t"]\nbuckets = 2\n[compact.strategy]\nt = "timestamp"\n',
        encoding="utf-8",
    )

    killed = spark_submit(
        "compact.py",
        ["--config", str(conf), "--lake", lake],
        failpoint=failpoint,
        env={**os.environ, LEASE_TTL_ENV: str(TTL_S)},  # the s3 fixture's AWS environment
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    after = _mirror(s3, path, tmp_path / "killed")
    tomb_after = _mirror(s3, tombs, tmp_path / "killed-tombs")
    # the topic table as it was: same version, same rows
    assert DeltaTable(str(after)).version() == DeltaTable(str(before)).version()
    assert read_topic_table(after) == read_topic_table(before)
    moved = DeltaTable(str(tomb_after)).version() != tomb_version
    assert moved == (failpoint == "compact.between_commits")
    # the run's lease, one per table, in the bucket: what the reaper goes by
    (lease_key,) = [k for k in s3.keys(path.removeprefix(f"s3://{s3.name}/") + f"/{STAGING}/")
                    if k.endswith(".json")]  # fmt: skip
    lease = json.loads(s3.get(lease_key))
    write_id = lease["write_id"]
    assert lease["ttl_s"] == TTL_S and lease_key.endswith(f"/{write_id}.json")
    left = unreferenced_files(after)
    assert f"{STAGING}/{write_id}.json" in left
    assert f"{STAGING}/{write_id}.json" in unreferenced_files(tomb_after)
    outside = [f for f in left if not f.startswith(f"{STAGING}/")]
    if failpoint == "compact.after_stage1":
        assert any(f.startswith(f"{STAGING}/{write_id}/") for f in left) and not outside, left
    else:
        assert any(write_id in f for f in outside), left  # data / change-data files
        dvs = sorted(f for f in outside if f.startswith("dv/deletion_vector_"))
        assert dvs and sorted(lease["files"]) == dvs, (left, lease)  # listed before moved in

    time.sleep(EXPIRED_S)  # nothing renews the killed run's leases: they expire
    result = run_compact(spark, config, log=_quiet).topics[0]
    assert result.committed and result.buckets_with_deletion_vectors >= 1
    done = _mirror(s3, path, tmp_path / "done")
    tomb_done = _mirror(s3, tombs, tmp_path / "done-tombs")
    want = {pk: (r.offset, r.value, list(r.headers)) for pk, r in compact(recs, STRATEGY).items()}
    assert read_topic_table(done) == want
    got = {(r["partition"], r["key"]): r["offset"] for r in read_table_rows(tomb_done)}
    assert got == _tombstones(recs)
    for table in (done, tomb_done):
        # exactly the files some version names, and the takeover tombstone
        assert unreferenced_files(table) == [f"{STAGING}/{write_id}.takeover"]
    assert not run_compact(spark, config, log=_quiet).topics[0].committed
