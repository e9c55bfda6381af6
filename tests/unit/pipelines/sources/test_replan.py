"""A segment deleted under a job (retention racing it): the reader's error, its recognition
through the wrapping of Spark and the Delta sink, and the bounded re-planning of a job step;
a partition directory the executors cannot see while the driver does (no shared disk): a
configuration error at once, no re-planning."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from logstore.errors import LoglakeError
from pipelines.delta.errors import DeltaSinkError
from pipelines.exit_codes import EXIT_USAGE
from pipelines.jobrun import exit_code_for
from pipelines.logdir import PARTITION_DIR_MISSING, PartitionDirMissingError
from pipelines.sources.plan import (
    SEGMENT_VANISHED,
    LogDirNotSharedError,
    SegmentVanishedError,
    missing_partition_dir,
    parse_options,
    plan_ranges,
    replanned,
    segment_vanished,
)
from pipelines.sources.read import read_range
from pipelines.sources.synthetic import write_partition

BASE_TS = 1_700_000_000_000
MIN_TS, MAX_TS = -(2**63), 2**63 - 1


def _log_dir(tmp_path: Path) -> Path:
    d = tmp_path / "logs"
    records = [(b"k%d" % i, b"v" * 100, [], BASE_TS + i) for i in range(400)]
    write_partition(d, "t", 0, records, batch_records=10, segment_bytes=8_000)
    return d


def test_a_segment_deleted_after_planning_raises_segment_vanished(tmp_path: Path) -> None:
    d = _log_dir(tmp_path)
    ranges = plan_ranges(parse_options({"path": str(d), "kind": "records"}))
    assert len({r.path for r in ranges}) > 2
    first = ranges[0]
    # renamed .deleted (retention's first step): still read, the bytes are the same
    Path(first.path).rename(first.path + ".deleted")
    rows = sum(
        b.num_rows
        for b in read_range(first, kind="records", min_timestamp=MIN_TS, max_timestamp=MAX_TS)
    )
    assert rows > 0
    Path(first.path + ".deleted").unlink()
    with pytest.raises(SegmentVanishedError, match=SEGMENT_VANISHED) as err:
        list(read_range(first, kind="records", min_timestamp=MIN_TS, max_timestamp=MAX_TS))
    assert segment_vanished(err.value)
    # planning again sees the partition as it is now: from the next segment on
    again = plan_ranges(parse_options({"path": str(d), "kind": "records"}))
    assert [r.path for r in again] == [r.path for r in ranges[1:]]


def test_segment_vanished_sees_through_wrapping() -> None:
    # the text an executor's error keeps inside Spark's and the sink's exceptions
    spark_error = RuntimeError(
        "Job aborted due to stage failure\n"
        f"pipelines.sources.plan.SegmentVanishedError: {SEGMENT_VANISHED}; plan again"
    )
    try:
        raise DeltaSinkError("write to /lake/records failed, nothing committed") from spark_error
    except DeltaSinkError as exc:
        assert segment_vanished(exc)
    assert segment_vanished(FileNotFoundError(2, "No such file", "/l/t-0/00000000000000000042.log"))
    assert not segment_vanished(FileNotFoundError(2, "No such file", "/lake/records/_delta_log"))
    assert not segment_vanished(LoglakeError("log dir does not exist"))


def test_replanned_retries_a_bounded_number_of_times_and_logs_each() -> None:
    lines: list[str] = []
    calls = 0

    def flaky() -> int:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise SegmentVanishedError(f"{SEGMENT_VANISHED}; plan again", path=f"/x/{calls}.log")
        return calls

    assert replanned(flaky, what="ingest", log=lines.append, attempts=5) == 3
    assert len(lines) == 2
    assert lines[0].startswith("ingest: a segment was deleted under the run")
    assert "attempt 2 of 5" in lines[0] and "attempt 3 of 5" in lines[1]

    calls = -100  # never succeeds: the last attempt's error is raised
    lines.clear()
    with pytest.raises(SegmentVanishedError):
        replanned(flaky, what="ingest", log=lines.append, attempts=4)
    assert calls == -96 and len(lines) == 3

    def broken() -> int:
        nonlocal calls
        calls += 1
        raise LoglakeError("something else")

    calls = 0
    with pytest.raises(LoglakeError, match="something else"):
        replanned(broken, what="ingest", log=lines.append)
    assert calls == 1


# ---------------------------------------------- executors that cannot see the log dir


def test_a_partition_dir_the_executors_cannot_see_fails_at_once_without_replanning(
    tmp_path: Path,
) -> None:
    """A cluster without a shared disk: the task (run here, in-process) finds its whole
    partition directory missing while the driver (this process, after the task) sees it. The
    job step stops at the first attempt with a configuration error (exit 2), no re-plan."""
    d = _log_dir(tmp_path)
    part = d / "t-0"
    away = tmp_path / "elsewhere"
    lines: list[str] = []
    calls = 0

    def step() -> int:
        nonlocal calls
        calls += 1
        ranges = plan_ranges(parse_options({"path": str(d), "kind": "records"}))
        part.rename(away)  # the executor's view: no such directory
        try:
            return sum(
                b.num_rows
                for b in read_range(
                    ranges[0], kind="records", min_timestamp=MIN_TS, max_timestamp=MAX_TS
                )
            )
        finally:
            away.rename(part)  # the driver's view

    with pytest.raises(LogDirNotSharedError) as err:
        replanned(step, what="ingest", log=lines.append)
    assert calls == 1 and lines == []
    assert str(err.value).startswith(
        f"the executors cannot see log dir {d} (no shared disk?): set log_dirs = [] "
    )
    assert exit_code_for(err.value) == EXIT_USAGE
    cause = err.value.__cause__
    assert isinstance(cause, PartitionDirMissingError) and not segment_vanished(cause)
    assert missing_partition_dir(cause) == str(part)


def test_the_executors_missing_dir_is_found_inside_sparks_wrapping(tmp_path: Path) -> None:
    part = tmp_path / "logs" / "t-3"
    part.mkdir(parents=True)
    spark_error = RuntimeError(
        "Job aborted due to stage failure: Task 0 in stage 2.0 failed\n"
        "pipelines.logdir.PartitionDirMissingError: "
        f"{PARTITION_DIR_MISSING} [{part}]\n\tat org.apache.spark..."
    )

    def step() -> int:
        raise DeltaSinkError("write to /lake/records failed, nothing committed") from spark_error

    with pytest.raises(LogDirNotSharedError, match=f"cannot see log dir {tmp_path / 'logs'} "):
        replanned(step, what="ingest", log=print)
    assert missing_partition_dir(spark_error) == str(part)
    assert missing_partition_dir(RuntimeError("no such text")) is None


def test_a_partition_dir_gone_for_the_driver_too_is_planned_again(tmp_path: Path) -> None:
    """The topic was deleted under the run (its directory gone everywhere): planned again, as
    for a segment retention took; the new plan no longer has the partition."""
    d = _log_dir(tmp_path)
    write_partition(d, "u", 0, [(b"k", b"v", [], BASE_TS)], batch_records=1, segment_bytes=8_000)
    lines: list[str] = []
    plans: list[set[str]] = []

    def step() -> int:
        ranges = plan_ranges(parse_options({"path": str(d), "kind": "records"}))
        plans.append({r.topic for r in ranges})
        if "u" in plans[-1]:
            shutil.rmtree(d / "u-0")  # deleted between planning and reading
        u = [r for r in ranges if r.topic == "u"] or ranges
        return sum(
            b.num_rows
            for b in read_range(u[0], kind="records", min_timestamp=MIN_TS, max_timestamp=MAX_TS)
        )

    assert replanned(step, what="ingest", log=lines.append) > 0
    assert plans == [{"t", "u"}, {"t"}]
    assert len(lines) == 1 and f"{PARTITION_DIR_MISSING} [{d / 'u-0'}]" in lines[0]
