"""Retention's table side on an S3 lake (moto): the journal under ``<lake>/_retention_pending``
and ``retention_log`` live in the bucket. A dead run's journal (written through the store) is
settled by the next offline run before it plans, and every removed segment gets exactly one
``retention_log`` row, read back with deltalake; the journal is gone (listed with boto3)."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from logstore.objectstore import delta_target
from logstore.storage.log_manager import LogManager
from pipelines.retention.job import RetentionConfig, run_retention
from pipelines.retention.journal import PENDING_DIR, write_pending
from tests.fixtures.s3 import S3Bucket
from tests.unit.pipelines.retention.test_retention_journal import CFG, _bases, _logs, _row

pytestmark = pytest.mark.integration


def test_offline_retention_settles_a_dead_runs_journal_in_an_s3_lake(
    s3: S3Bucket, tmp_path: Path
) -> None:
    dirs = _logs(tmp_path / "logs", 2)
    before = {k: _bases(v) for k, v in dirs.items()}
    lake = s3.uri("ret")
    props = tmp_path / "broker.properties"
    props.write_text("log.retention.hours=1\nlog.segment.delete.delay.ms=0\n")
    gone = before[("j", 0)][:3]
    write_pending(
        lake, "dead", [_row(0, b, before[("j", 0)][i + 1], "dead") for i, b in enumerate(gone)]
    )
    assert s3.keys(f"ret/{PENDING_DIR}/") == [f"ret/{PENDING_DIR}/dead.json"]
    with LogManager(tmp_path / "logs", default_config=CFG, background=False) as mgr:
        lg = mgr.get_log("j", 0)
        assert lg is not None
        lg.delete_records(before[("j", 0)][3])  # the dead run got this far

    cfg = RetentionConfig(log_dirs=(str(tmp_path / "logs"),), lake=lake, broker_config=str(props))
    summary = run_retention(None, cfg, force=True)
    assert summary.settled_segments == 3 and not summary.errors

    uri, options = delta_target(f"{lake}/retention_log")
    rows = DeltaTable(uri, storage_options=options).to_pyarrow_table().to_pylist()
    keys = sorted((r["partition"], r["segment_base_offset"]) for r in rows)
    removed = sorted(
        (p, b) for (_, p), bs in before.items() for b in bs if b not in _bases(dirs[("j", p)])
    )
    assert keys == removed and len(removed) == sum(len(b) - 1 for b in before.values())
    assert sorted(r["segment_base_offset"] for r in rows if r["run_id"] == "dead") == gone
    assert [k for k in s3.keys(f"ret/{PENDING_DIR}/") if k.endswith(".json")] == []
