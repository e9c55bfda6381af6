"""The retention journal settles exactly (``pipelines.retention.journal``), on real logs.

A run's journal names the segments it meant to delete; the next run appends the rows of those
that are gone (under the dead run's id), drops those still there, and appends nothing when the
dead run's rows already reached ``retention_log`` (killed after its append, before removing
the journal). The real ``retention_log`` table, read back with polars.
"""

from __future__ import annotations

import time
from pathlib import Path

import polars as pl
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from logstore.protocol.records import build_batch
from logstore.storage.config import LogConfig
from logstore.storage.log_manager import LogManager
from pipelines.retention.job import append_retention_log, logged_run_ids, run_retention
from pipelines.retention.journal import PENDING_DIR, settle_pending, write_pending

OLD = int(time.time() * 1000) - 86_400_000
CFG = LogConfig(segment_bytes=1200, retention_ms=3_600_000, file_delete_delay_ms=0)


def _logs(log_dir: Path, partitions: int) -> dict[tuple[str, int], str]:
    with LogManager(log_dir, default_config=CFG, background=False) as mgr:
        for p in range(partitions):
            lg = mgr.get_or_create_log("j", p)
            for i in range(20):
                lg.append(build_batch([(b"k", b"v" * 100)] * 2, base_timestamp=OLD + i))
            lg.high_watermark = lg.log_end_offset
    return {("j", p): str(log_dir / f"j-{p}") for p in range(partitions)}


def _bases(part: str) -> list[int]:
    return sorted(int(f.name.split(".")[0]) for f in Path(part).glob("*.log"))


def _row(p: int, base: int, end: int, run_id: str) -> dict:
    return {
        "source": "log", "topic": "j", "partition": p, "segment_base_offset": base,
        "end_offset": end, "bytes": 1, "rows": None, "largest_timestamp": OLD, "rule":
        "retention.ms", "forced": True, "removed_at": None, "run_id": run_id,
    }  # fmt: skip


def _settle(lake: Path, dirs: dict[tuple[str, int], str]) -> list[dict]:
    path = str(lake / "retention_log")
    return settle_pending(
        str(lake), dirs, lambda ids: logged_run_ids(path, ids),
        lambda rows: append_retention_log(path, rows),
    )  # fmt: skip


def test_settle_logs_only_what_went_and_only_once(tmp_path: Path) -> None:
    dirs = _logs(tmp_path / "logs", 2)
    lake = tmp_path / "lake"
    segs = {k: _bases(v) for k, v in dirs.items()}
    # a run removed partition 1's first segment and logged it, then died before removing its
    # journal; a later run meant to delete two segments of each partition (partition 1's next
    # two) and died once partition 0 was done
    s1 = segs[("j", 1)]
    with LogManager(tmp_path / "logs", default_config=CFG, background=False) as mgr:
        lg = mgr.get_log("j", 1)
        assert lg is not None
        lg.delete_records(s1[1])
    append_retention_log(str(lake / "retention_log"), [_row(1, s1[0], s1[1], "logged")])
    write_pending(str(lake), "logged", [_row(1, s1[0], s1[1], "logged")])
    s0 = segs[("j", 0)]
    pending = [_row(0, s0[i], s0[i + 1], "dead") for i in (0, 1)]
    pending += [_row(1, s1[i], s1[i + 1], "dead") for i in (1, 2)]
    write_pending(str(lake), "dead", pending)
    with LogManager(tmp_path / "logs", default_config=CFG, background=False) as mgr:
        lg = mgr.get_log("j", 0)
        assert lg is not None
        lg.delete_records(s0[2])

    settled = _settle(lake, dirs)
    assert [(r["partition"], r["segment_base_offset"], r["run_id"]) for r in settled] == [
        (0, segs[("j", 0)][0], "dead"),
        (0, segs[("j", 0)][1], "dead"),
    ]
    assert not (lake / PENDING_DIR).exists()  # journals settled, the directory removed
    rows = pl.read_delta(str(lake / "retention_log"))
    assert sorted(rows["run_id"].to_list()) == ["dead", "dead", "logged"]
    assert rows.filter(pl.col("run_id") == "dead")["removed_at"].null_count() == 0
    assert _settle(lake, dirs) == []  # nothing left to settle


def test_a_run_settles_before_it_plans(tmp_path: Path) -> None:
    """Offline: the dead run's removals are logged by the next run under the dead run's id,
    the rest by the next run itself: one row per removed segment."""
    from pipelines.retention.job import RetentionConfig

    dirs = _logs(tmp_path / "logs", 2)
    before = {k: _bases(v) for k, v in dirs.items()}
    lake = tmp_path / "lake"
    props = tmp_path / "broker.properties"
    props.write_text("log.retention.hours=1\nlog.segment.delete.delay.ms=0\n")
    gone = before[("j", 0)][:3]
    write_pending(
        str(lake), "dead", [_row(0, b, before[("j", 0)][i + 1], "dead") for i, b in enumerate(gone)]
    )
    with LogManager(tmp_path / "logs", default_config=CFG, background=False) as mgr:
        lg = mgr.get_log("j", 0)
        assert lg is not None
        lg.delete_records(before[("j", 0)][3])
    cfg = RetentionConfig(
        log_dirs=(str(tmp_path / "logs"),), lake=str(lake), broker_config=str(props)
    )
    summary = run_retention(None, cfg, force=True)
    assert summary.settled_segments == 3 and not summary.errors
    rows = pl.read_delta(str(lake / "retention_log"))
    keys = sorted(zip(rows["partition"], rows["segment_base_offset"], strict=True))
    removed = sorted(
        (p, b) for (_, p), bs in before.items() for b in bs if b not in _bases(dirs[("j", p)])
    )
    assert keys == removed and len(removed) == sum(len(b) - 1 for b in before.values())
    dead = rows.filter(pl.col("run_id") == "dead")
    assert sorted(dead["segment_base_offset"].to_list()) == gone


def test_retention_log_appends_once_per_run_even_when_a_commit_answer_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``retention_log`` goes through the Delta engine's append with one app transaction per
    run id: a commit that landed but whose answer was lost (an S3 timeout after the PUT) is
    retried by the engine and found done; the same append again is a no-op too."""
    path = str(tmp_path / "lake" / "retention_log")
    append_retention_log(path, [])  # the first run: the table, empty
    assert DeltaTable(path).version() == 0 and pl.read_delta(path).height == 0

    original = DeltaTable.create_write_transaction
    lost = {"n": 0}

    def answer_lost(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        original(self, *args, **kwargs)  # the commit lands ...
        lost["n"] += 1
        if lost["n"] == 1:
            raise CommitFailedError("timed out waiting for the store's answer")  # ... unseen

    monkeypatch.setattr(DeltaTable, "create_write_transaction", answer_lost)
    rows = [_row(0, 0, 10, "r1"), _row(0, 10, 20, "r1"), _row(1, 0, 5, "r0")]
    append_retention_log(path, rows)
    monkeypatch.undo()
    assert lost["n"] == 1
    dt = DeltaTable(path)
    assert dt.version() == 1
    assert dt.transaction_version("loglake-retention:r1") == 1
    assert dt.transaction_version("loglake-retention:r0") == 1
    append_retention_log(path, rows[:2])  # run r1's rows again: already there
    assert DeltaTable(path).version() == 1
    logged = pl.read_delta(path).sort("run_id", "segment_base_offset")
    assert logged.select("run_id", "segment_base_offset").rows() == [
        ("r0", 0), ("r1", 0), ("r1", 10)
    ]  # fmt: skip
    assert logged_run_ids(path, ["r0", "r1", "r2"]) == {"r0", "r1"}
