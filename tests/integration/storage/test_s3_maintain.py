"""``jobs/maintain.py --lake s3://...`` on a real S3 server (moto): records retention (TTL),
optimize, vacuum (delta-rs's and the deletion vector / change-data orphans), checkpoint, and
``--dry-run``; the store stopped under the job. Tables are written and read back with
deltalake and listed with boto3, independently of the job."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from logstore.objectstore import delta_target
from tests.fixtures.broker import ROOT
from tests.fixtures.jobs import load_job
from tests.fixtures.s3 import S3Bucket

pytestmark = pytest.mark.integration


def _append(uri: str, start: int, *, n: int, day: int) -> None:
    date = datetime.datetime.now(datetime.UTC).date() - datetime.timedelta(days=day)
    table = pa.table(
        {
            "topic": ["orders"] * n,
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(start, start + n), pa.int64()),
            "date": pa.array([date] * n, pa.date32()),
        }
    )
    target, options = delta_target(uri)
    write_deltalake(
        target, table, mode="append", partition_by=["topic", "date"], storage_options=options
    )


def _table(uri: str) -> DeltaTable:
    target, options = delta_target(uri)
    return DeltaTable(target, storage_options=options)


def _maintain(
    conf: Path, lake: str, logs: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, dict[str, Any] | None, str]:
    code = load_job("maintain").main(
        ["--config", str(conf), "--lake", lake, "--log-dirs", str(logs), *extra]
    )
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    return code, json.loads(lines[-1]) if lines else None, err


def test_maintain_on_s3_retention_optimize_vacuum_checkpoint_and_dry_run(
    s3: S3Bucket, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lake = s3.uri("m")
    records, topic_table = f"{lake}/records", f"{lake}/topics/orders"
    offset = 0
    for day in (3, 0):  # day 3 is past "2d"; day 0 stays
        for _ in range(3):
            _append(records, offset, n=10, day=day)
            offset += 10
    _append(topic_table, 0, n=5, day=0)
    _append(topic_table, 5, n=5, day=0)
    orphans = sorted(
        [f"_change_data/topic=orders/cdc-{uuid.uuid4()}.c000.snappy.parquet",
         f"deletion_vector_{uuid.uuid4()}.bin"]
    )  # fmt: skip
    for key in orphans:
        s3.put(f"m/records/{key}", b"not named by any commit")
    time.sleep(1.5)  # S3 times are whole seconds: the orphans are older than the horizon
    conf = tmp_path / "pipeline.toml"
    conf.write_text('[retention]\nrecords = "2d"\nvacuum_hours = 0\n')
    logs = tmp_path / "logs"
    logs.mkdir()

    before = s3.keys("m/")
    code, plan, err = _maintain(conf, lake, logs, capsys, "--dry-run")
    assert code == 0, err
    assert plan is not None and plan["dry_run"] and plan["deleted_rows"] == 30
    by_name = {t["path"].rsplit("/", 1)[-1]: t for t in plan["tables"]}
    assert set(by_name) == {"records", "orders"}
    assert by_name["records"]["path"] == records
    assert by_name["records"]["vacuum_orphans"] == orphans
    assert len(by_name["records"]["optimize_files"]) == 6
    assert s3.keys("m/") == before  # nothing changed

    code, done, err = _maintain(conf, lake, logs, capsys)
    assert code == 0, err
    assert done is not None and done["errors"] == [] and done["deleted_rows"] == 30
    report = {t["path"].rsplit("/", 1)[-1]: t for t in done["tables"]}["records"]
    assert report["files_after"] == 1 and report["vacuumed_orphans"] == 2
    assert report["vacuumed_files"] == 6 and report["checkpoint"] is True

    dt = _table(records)  # read back independently
    assert sorted(dt.to_pyarrow_table().column("offset").to_pylist()) == list(range(30, 60))
    keys = s3.keys("m/records/")
    # (pyarrow leaves empty "directory/" marker objects where it deleted a directory's last file)
    data = {k.removeprefix("m/records/") for k in keys if "_delta_log/" not in k}
    data = {k for k in data if not k.endswith("/") and k}
    named = {u.removeprefix(records + "/") for u in dt.file_uris()}
    assert data == named  # every other file vacuumed, the orphans too
    assert any(k.endswith(".checkpoint.parquet") for k in keys)
    logged = _table(f"{lake}/retention_log").to_pyarrow_table().to_pylist()
    assert [(r["topic"], r["rows"], r["segment_base_offset"], r["end_offset"]) for r in logged] == [
        ("orders", 30, 0, 30)
    ]


def test_maintain_with_the_store_stopped_fails_cleanly_and_reruns(
    s3: S3Bucket, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lake = s3.uri("down")
    for i in range(3):
        _append(f"{lake}/records", i * 10, n=10, day=0)
    conf = tmp_path / "pipeline.toml"
    conf.write_text("[retention]\nvacuum_hours = 0\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    before = s3.keys("down/")

    s3.server.stop()
    code, _summary, err = _maintain(conf, lake, logs, capsys)
    s3.server.start()
    assert code == 1, err
    failed = [line for line in err.splitlines() if line.startswith("maintain failed:")]
    assert len(failed) == 1 and "connect" in failed[0].lower(), err
    assert "Traceback" not in err
    assert s3.keys("down/") == before  # nothing changed

    code, done, err = _maintain(conf, lake, logs, capsys)
    assert code == 0, err
    assert done is not None and done["tables"][0]["files_after"] == 1
    assert sorted(_table(f"{lake}/records").to_pyarrow_table().column("offset").to_pylist()) == (
        list(range(30))
    )


def test_the_store_stopped_mid_vacuum_a_clear_error_then_a_clean_rerun(
    s3: S3Bucket, tmp_path: Path
) -> None:
    """``python jobs/maintain.py`` removes 400 orphan deletion-vector files one DELETE each;
    the server is stopped once the first are gone: the run ends with exit 1 naming the step
    and the connection failure, the table still reads the same, and the re-run, the store
    back, removes the rest."""
    lake = s3.uri("mid")
    records = f"{lake}/records"
    _append(records, 0, n=10, day=0)
    orphans = [f"mid/records/deletion_vector_{uuid.uuid4()}.bin" for _ in range(400)]
    for key in orphans:
        s3.put(key, b"x")
    time.sleep(1.5)
    conf = tmp_path / "pipeline.toml"
    conf.write_text("[retention]\nvacuum_hours = 0\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    cmd = [sys.executable, str(ROOT / "jobs" / "maintain.py"), "--config", str(conf),
           "--lake", lake, "--log-dirs", str(logs), "--no-records-retention"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while len([k for k in s3.keys("mid/records/") if "deletion_vector_" in k]) == 400:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        s3.server.stop()
        out, err = proc.communicate(timeout=300)
    finally:
        s3.server.start()
    assert proc.returncode == 1, err
    assert out.strip(), err
    summary = json.loads(out.strip().splitlines()[-1])
    assert any(e.startswith("records: vacuum_orphans: ") for e in summary["errors"]), summary
    assert any("connect" in e.lower() for e in summary["errors"]), summary
    assert "Traceback" not in err
    left = [k for k in s3.keys("mid/records/") if "deletion_vector_" in k]
    assert 0 < len(left) < 400  # stopped mid-way
    assert sorted(_table(records).to_pyarrow_table().column("offset").to_pylist()) == list(
        range(10)
    )

    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert [k for k in s3.keys("mid/records/") if "deletion_vector_" in k] == []
    assert json.loads(rerun.stdout.strip().splitlines()[-1])["tables"][0][
        "vacuumed_orphans"
    ] == len(left)
