"""A segment deleted between a job's planning and its Spark tasks' read (what the broker's
retention does to a running job): ingest plans again inside the run; lookups skip a segment
deleted oldest-first and plan again for any other.

The deletion is made deterministic: the first call of the job's write step (the Delta sink's
``stage_files``, which runs the real Spark tasks) first removes the partition's oldest segment
the way retention does (files renamed ``.deleted``, then removed), so the tasks of the plan
made before meet a segment that is gone. Real Spark (shared session), real segment files, the
tables read back with delta-rs.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

import pipelines.delta.direct
import pipelines.ingest
from pipelines.exit_codes import EXIT_USAGE
from pipelines.ingest import IngestConfig, run_ingest
from pipelines.jobrun import exit_code_for
from pipelines.lookups import build_lookups
from pipelines.sources.plan import LogDirNotSharedError
from pipelines.sources.synthetic import write_high_watermarks, write_partition

pytestmark = pytest.mark.integration

N = 600


def _log_dir(tmp_path: Path) -> tuple[Path, list[int]]:
    d = tmp_path / "logs"
    records = [(b"k%d" % i, b"v%d" % i * 20, [], 1_700_000_000_000 + i) for i in range(N)]
    write_partition(d, "t", 0, records, batch_records=10, segment_bytes=16_000)
    write_high_watermarks(d, {("t", 0): N})
    bases = sorted(int(p.stem) for p in (d / "t-0").glob("*.log"))
    assert len(bases) > 3
    return d, bases


def _delete_first_segment_once(monkeypatch: pytest.MonkeyPatch, module: Any, part: Path) -> None:
    real = pipelines.delta.direct.stage_files
    done: list[bool] = []

    def stage_files(*args: Any, **kwargs: Any) -> Any:
        if not done:
            done.append(True)
            first = min(part.glob("*.log"))
            for f in part.glob(first.stem + ".*"):
                f.rename(f.with_name(f.name + ".deleted"))
            for f in part.glob("*.deleted"):
                f.unlink()
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "stage_files", stage_files)


def test_ingest_plans_again_reports_the_gap_and_commits_the_rest_once(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log_dir, bases = _log_dir(tmp_path)
    _delete_first_segment_once(monkeypatch, pipelines.ingest, log_dir / "t-0")
    lines: list[str] = []
    config = IngestConfig(log_dirs=(str(log_dir),), lake=str(tmp_path / "lake"))
    summary = run_ingest(spark, config, log=lines.append)
    replans = [line for line in lines if "planning again" in line]
    assert len(replans) == 1 and "attempt 2 of 5" in replans[0], lines
    assert "segment file vanished between planning and reading" in replans[0]
    assert [(g.topic, g.partition, g.from_offset, g.to_offset) for g in summary.gaps] == [
        ("t", 0, 0, bases[1])
    ]
    assert summary.committed and summary.records == N - bases[1]
    offsets = DeltaTable(str(tmp_path / "lake" / "records")).to_pyarrow_table(columns=["offset"])
    got = Counter(offsets.column("offset").to_pylist())
    assert got == Counter(range(bases[1], N))
    again = run_ingest(spark, config, log=lines.append)
    assert not again.committed and not again.gaps and again.records == 0


def test_lookups_skip_a_segment_retention_deleted_under_them(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log_dir, bases = _log_dir(tmp_path)
    _delete_first_segment_once(monkeypatch, pipelines.delta.direct, log_dir / "t-0")
    lines: list[str] = []
    lake = tmp_path / "lake"
    summary = build_lookups(spark, log_dirs=[str(log_dir)], lake=str(lake), log=lines.append)
    # the oldest segment went (as retention deletes): skipped in the task, no second attempt
    assert not [line for line in lines if "planning again" in line], lines
    assert "build_lookups offset_lookup: 1 segments were deleted by retention" in lines[0]
    assert summary.index_problems == []
    assert summary.progress["offset_lookup"] == {"offset_lookup:t-0": N}
    for table in ("offset_lookup", "time_lookup"):
        rows = DeltaTable(str(lake / table)).to_pyarrow_table(columns=["first_offset"])
        firsts = rows.column("first_offset").to_pylist()
        assert sorted(firsts) == list(range(bases[1], N, 10))


def test_lookups_plan_again_when_a_segment_goes_from_the_middle(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log_dir, bases = _log_dir(tmp_path)
    part = log_dir / "t-0"
    real = pipelines.delta.direct.stage_files
    calls: list[int] = []

    def stage_files(*args: Any, **kwargs: Any) -> Any:
        # the first attempt meets the second segment gone (as a cleaner's swap of it into
        # the first would leave it); it is back for the second, as the swapped log has it
        calls.append(1)
        second = part / f"{bases[1]:020d}.log"
        if len(calls) == 1:
            second.rename(part / "held-aside")
            try:
                return real(*args, **kwargs)
            finally:
                (part / "held-aside").rename(second)
        return real(*args, **kwargs)

    monkeypatch.setattr(pipelines.delta.direct, "stage_files", stage_files)
    lines: list[str] = []
    lake = tmp_path / "lake"
    build_lookups(spark, log_dirs=[str(log_dir)], lake=str(lake), log=lines.append, check=False)
    replans = [line for line in lines if "planning again" in line]
    assert len(replans) == 1 and "attempt 2 of 5" in replans[0], lines
    rows = DeltaTable(str(lake / "offset_lookup")).to_pyarrow_table(columns=["first_offset"])
    assert sorted(rows.column("first_offset").to_pylist()) == list(range(0, N, 10))


def test_ingest_whose_executors_cannot_see_the_log_dir_fails_at_once(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster without a shared disk, made deterministic: while the real Spark tasks run,
    the partition directory is away (the executors' view); once they failed it is back (the
    driver's view). Ingest stops at the first attempt with exit 2's error, no re-plan, no gap,
    nothing committed; the same run with the directory in place ingests everything."""
    log_dir, _ = _log_dir(tmp_path)
    part, away = log_dir / "t-0", tmp_path / "not-on-this-worker"
    real = pipelines.delta.direct.stage_files
    calls: list[int] = []

    def stage_files(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        part.rename(away)
        try:
            return real(*args, **kwargs)
        finally:
            away.rename(part)

    monkeypatch.setattr(pipelines.ingest, "stage_files", stage_files)
    lines: list[str] = []
    config = IngestConfig(log_dirs=(str(log_dir),), lake=str(tmp_path / "lake"))
    with pytest.raises(LogDirNotSharedError) as err:
        run_ingest(spark, config, log=lines.append)
    assert str(err.value).startswith(
        f"the executors cannot see log dir {log_dir} (no shared disk?): set log_dirs = []"
    )
    assert exit_code_for(err.value) == EXIT_USAGE
    assert len(calls) == 1 and not [x for x in lines if "planning again" in x or "GAP" in x]
    assert not list((tmp_path / "lake").rglob("_delta_log/*.json"))  # no table committed
    monkeypatch.undo()
    assert run_ingest(spark, config, log=lines.append).records == N
