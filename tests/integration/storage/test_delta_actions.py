"""Commits written by ``pipelines.delta.actions`` (adds, removes, a file re-added with a
deletion vector, change-data files, app transactions in one commit), on local disk and on a
real S3 server (moto), read back by delta-rs and by Spark's ``format("delta")`` (the Python
data source, ``pipelines.delta.source``); and writers racing for one version: in-process with
the race pinned, and two real processes on S3: exactly one wins, the other gets
``ConcurrentWriteError``, and the winner's commit is whole."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder, write_deltalake
from pyspark.sql import SparkSession

from logstore.objectstore import StorageSettings
from pipelines.compaction.commit import with_deletion_vector
from pipelines.delta.actions import CdcFile, FileRef, commit_actions
from pipelines.delta.deletion_vectors import DV_PREFIX, write_deletion_vectors
from pipelines.delta.errors import ConcurrentWriteError
from pipelines.delta.log import DeltaLog
from pipelines.delta.source import STORAGE_OPTION_PREFIX
from tests.fixtures.s3 import S3Bucket

N = 1000
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(params=["local", "s3"])
def table_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "t")
    s3: S3Bucket = request.getfixturevalue("s3")
    return s3.uri("lake", "t")


def _create(uri: str) -> DeltaLog:
    """A table with deletion vectors enabled and one file of keys 0..N-1, written by delta-rs."""
    log = DeltaLog(uri)
    write_deltalake(
        uri,
        pa.table({"k": np.arange(N, dtype=np.int64)}),
        configuration={"delta.enableDeletionVectors": "true", "delta.enableChangeDataFeed": "true"},
        storage_options=log.storage_options or None,
    )
    return log


def _put_parquet(log: DeltaLog, key: str, table: pa.Table) -> int:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    data = buf.getvalue()
    log.store.write(key, data)
    return len(data)


def _commit(log: DeltaLog, tmp_path: Path) -> tuple[int | None, np.ndarray]:
    """Version 1: the file loses every 7th row (a deletion vector), keys N..N+99 are added, a
    change-data file records the deletes, app transaction ``app`` goes to 4. Returns the
    committed version and the keys that stay."""
    (add,) = log.live_adds(0)
    deleted = np.arange(0, N, 7)
    dv_path, (descriptor,) = write_deletion_vectors(tmp_path / "dv", [deleted])
    log.store.write(f"{DV_PREFIX}/{os.path.basename(dv_path)}", Path(dv_path).read_bytes())
    old = FileRef(add["path"], int(add["size"]), {}, add.get("stats"))
    new_name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    size = _put_parquet(log, new_name, pa.table({"k": np.arange(N, N + 100, dtype=np.int64)}))
    cdc_name = f"cdc-{uuid.uuid4()}.parquet"
    cdc_rows = pa.table({"k": deleted.astype(np.int64), "_change_type": ["delete"] * len(deleted)})
    cdc_size = _put_parquet(log, f"_change_data/{cdc_name}", cdc_rows)
    version = commit_actions(
        log,
        read_version=0,
        removes=[old],
        adds=[
            with_deletion_vector(old, descriptor),  # compaction's re-add (stats not tight)
            FileRef(new_name, size, {}),
        ],
        cdc=[CdcFile(f"_change_data/{cdc_name}", cdc_size, {})],
        app_transactions={"app": 4},
        operation="MERGE",
    )
    kept = np.concatenate([np.setdiff1d(np.arange(N), deleted), np.arange(N, N + 100)])
    return version, kept


def test_a_commit_reads_back_in_delta_rs_and_spark(
    table_uri: str, tmp_path: Path, spark: SparkSession
) -> None:
    log = _create(table_uri)
    version, kept = _commit(log, tmp_path)
    assert version == 1
    dt = DeltaTable(table_uri, storage_options=log.storage_options or None)
    assert dt.version() == 1
    assert dt.transaction_version("app") == 4
    got = QueryBuilder().register("t", dt).execute("SELECT k FROM t ORDER BY k").read_all()
    assert pa.table(got).column("k").to_pylist() == kept.tolist()
    # the same commit is a no-op when every app transaction is already there
    assert commit_actions(log, read_version=1, app_transactions={"app": 4}) is None
    assert log.listing().latest == 1
    reader = spark.read.format("delta")
    if not log.location.is_local:
        for key, value in StorageSettings.from_environment().to_overrides().items():
            reader = reader.option(STORAGE_OPTION_PREFIX + key, value)
    rows = reader.load(table_uri).toArrow()
    assert sorted(rows.column("k").to_pylist()) == kept.tolist()


def test_a_stale_writer_loses_the_race_and_changes_nothing(table_uri: str) -> None:
    """Two writers read version 0; the other one commits version 1 between this writer's check
    and its put: put-if-absent refuses this writer's commit, the other's stays whole."""
    log = _create(table_uri)
    stale = log.table()

    class Pinned(DeltaLog):  # the snapshot this writer read, before the other commit
        def table(self, version: int | None = None) -> DeltaTable | None:
            return stale if version is None else super().table(version)

    assert commit_actions(log, read_version=0, app_transactions={"other": 1}) == 1
    winner = log.store.read("_delta_log/00000000000000000001.json")
    with pytest.raises(ConcurrentWriteError, match="committed version 1 first"):
        commit_actions(Pinned(table_uri), read_version=0, app_transactions={"mine": 1})
    assert log.store.read("_delta_log/00000000000000000001.json") == winner
    assert log.listing().latest == 1
    assert log.app_transactions() == {"other": 1}


_RACER = """
import json, sys, time
from pathlib import Path
from pipelines.compaction.commit import with_deletion_vector
from pipelines.delta.actions import commit_actions
from pipelines.delta.errors import ConcurrentWriteError
from pipelines.delta.log import DeltaLog
uri, me, go = sys.argv[1], sys.argv[2], Path(sys.argv[3])
log = DeltaLog(uri)
log.table()  # warm up (imports, the store) before the start line
print("ready", flush=True)
while not go.exists():
    time.sleep(0.001)
try:
    v = commit_actions(log, read_version=0, app_transactions={me: 1})
    print(json.dumps({"won": v}))
except ConcurrentWriteError as exc:
    print(json.dumps({"lost": str(exc)}))
"""


def test_two_processes_racing_on_s3_exactly_one_wins(s3: S3Bucket, tmp_path: Path) -> None:
    uri = s3.uri("lake", "race")
    log = _create(uri)
    for round_ in range(3):
        go = tmp_path / f"go-{round_}"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        racers = [
            subprocess.Popen(
                [sys.executable, "-c", _RACER, uri, f"w{i}", str(go)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=ROOT,
            )
            for i in range(2)
        ]
        for p in racers:  # both warmed up and waiting for the start line
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        go.touch()
        outs = []
        for p in racers:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            outs.append(json.loads(out.strip().splitlines()[-1]))
        assert sorted(next(iter(o)) for o in outs) == ["lost", "won"], outs
        (won,) = [o["won"] for o in outs if "won" in o]
        assert won == 1
        winner = next(f"w{i}" for i, o in enumerate(outs) if "won" in o)
        data = log.store.read("_delta_log/00000000000000000001.json")
        commit = [json.loads(line) for line in data.splitlines()]
        assert [c["txn"]["appId"] for c in commit if "txn" in c] == [winner]
        assert log.app_transactions() == {winner: 1}
        # next round on a fresh table
        uri = s3.uri("lake", f"race{round_}")
        log = _create(uri)
