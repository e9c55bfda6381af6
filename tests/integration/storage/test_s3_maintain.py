"""``jobs/maintain.py --lake s3://...`` on a real S3 server (moto): records retention (TTL),
optimize, vacuum (delta-rs's and the deletion vector / change-data orphans), checkpoint, and
``--dry-run``; the store stopped under the job. Tables are written and read back with
deltalake and listed with boto3, independently of the job."""

from __future__ import annotations

import datetime
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from logstore.objectstore import delta_target
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
