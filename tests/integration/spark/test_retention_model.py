"""The retention job's plan against an independent model of Kafka's rules, on generated log dirs.

Hypothesis generates partitions (segment sizes, largest timestamps or none, mtimes, log start
offsets, high watermarks, ingest progress), topic configs (``retention.ms``,
``retention.bytes``, ``cleanup.policy`` including ``compact,delete`` and compact alone) and
broker defaults; the files are written (``tests.fixtures.retention_logdirs``) and planned by
the real job code, on Spark (``local[2]``) and in one process; both must equal
``pipelines.retention.model``. A second test checks the job's reading of the files against the
broker's own retention on a real log written through ``Log.append``.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logstore.protocol.records import build_batch
from logstore.storage.config import LogConfig
from logstore.storage.log import Log
from pipelines.retention.job import broker_defaults, build_tasks, plan_local, plan_spark
from pipelines.retention.model import ModelPartition, ModelSegment, expected_log_start
from pipelines.retention.plan import PartitionTask, plan_partition
from pipelines.retention.scan import scan_partition
from tests.fixtures.retention_logdirs import write_log_dir, write_partition

pytestmark = pytest.mark.integration

NOW = 1_700_000_000_000
TOPICS = ("t0", "t1", "t2", "__internal")


RETENTION_MS = [-1, 0, 5_000, 10_000, 30_000]
RETENTION_BYTES = [-1, 0, 1_000, 4_000, 10_000]


def _near(values: list[int]) -> st.SearchStrategy[int]:
    """A value at or next to one of ``values``: where the rules' comparisons flip."""
    return st.sampled_from(sorted({v + d for v in values for d in (-1, 0, 1) if v + d >= 0}))


@st.composite
def partitions(draw: st.DrawFn) -> ModelPartition:
    n = draw(st.integers(1, 7))
    base = draw(st.integers(0, 50))
    # largest timestamps right at a retention.ms boundary, or anywhere
    ages = [r + d for r in RETENTION_MS if r >= 0 for d in (-1, 0, 1)]
    timestamps = st.sampled_from([NOW - a for a in ages]) | st.integers(NOW - 40_000, NOW + 1_000)
    segments = []
    for _ in range(n):
        segments.append(
            ModelSegment(
                base_offset=base,
                # sizes that add up to the retention.bytes values exactly, or anything
                size=draw(st.sampled_from([500, 1_000, 2_000]) | st.integers(1, 3000)),
                max_timestamp=draw(st.none() | timestamps),
                mtime_ms=draw(timestamps),
            )
        )
        base += draw(st.integers(1, 40))
    bases = [s.base_offset for s in segments]
    return ModelPartition(
        segments=segments,
        retention_ms=0,  # resolved per topic below
        retention_bytes=0,
        cleanup_policy="delete",
        log_start_offset=draw(_near(bases) | st.integers(bases[0], bases[-1] + 5)),
        high_watermark=draw(st.none() | _near([*bases, base]) | st.integers(bases[0], base + 10)),
        progress=draw(_near([*bases, base]) | st.integers(0, base + 10)),
    )


retention_ms = st.sampled_from(RETENTION_MS)
retention_bytes = st.sampled_from(RETENTION_BYTES)
policies = st.sampled_from(["delete", "compact", "compact,delete", "delete,compact"])


@st.composite
def log_dirs(draw: st.DrawFn) -> tuple[dict[tuple[str, int], ModelPartition], dict, dict]:
    parts = draw(
        st.dictionaries(
            st.tuples(st.sampled_from(TOPICS), st.integers(0, 3)), partitions(), max_size=10
        )
    )
    overrides: dict[str, dict[str, str]] = {}
    for topic in TOPICS:
        props: dict[str, str] = {}
        if draw(st.booleans()):
            props["retention.ms"] = str(draw(retention_ms))
        if draw(st.booleans()):
            props["retention.bytes"] = str(draw(retention_bytes))
        if draw(st.booleans()):
            props["cleanup.policy"] = draw(policies)
        if props:
            overrides[topic] = props
    broker = {
        "log.retention.ms": str(draw(retention_ms)),
        "log.retention.bytes": str(draw(retention_bytes)),
    }
    return parts, overrides, broker


def _expected(parts, overrides, broker, *, force: bool):  # type: ignore[no-untyped-def]
    out = {}
    for (topic, partition), p in parts.items():
        props = overrides.get(topic, {})
        resolved = ModelPartition(
            segments=p.segments,
            retention_ms=int(props.get("retention.ms", broker["log.retention.ms"])),
            retention_bytes=int(props.get("retention.bytes", broker["log.retention.bytes"])),
            cleanup_policy=props.get("cleanup.policy", "delete"),
            log_start_offset=p.log_start_offset,
            high_watermark=p.high_watermark,
            progress=None if topic.startswith("__") else p.progress,
        )
        out[(topic, partition)] = expected_log_start(resolved, NOW, force=force)
    return out


def _plan(spark, parts, overrides, broker, *, force: bool, use_spark: bool):  # type: ignore[no-untyped-def]
    tmp = Path(tempfile.mkdtemp(prefix="retention-model-"))
    try:
        write_log_dir(tmp / "logs", parts, overrides)
        (tmp / "broker.properties").write_text(
            "".join(f"{k}={v}\n" for k, v in broker.items()), encoding="utf-8"
        )
        defaults = broker_defaults(str(tmp / "broker.properties"))
        progress = {tp: p.progress for tp, p in parts.items()}
        tasks = build_tasks([str(tmp / "logs")], defaults, progress, None)
        plan = plan_spark if use_spark else plan_local
        plans = (
            plan(spark, tasks, now_ms=NOW, force=force)
            if use_spark
            else plan(tasks, now_ms=NOW, force=force)
        )
    finally:
        shutil.rmtree(tmp)
    return {
        (p.topic, p.partition): (
            p.new_log_start,
            [d.rule for d in p.decisions if d.action != "held"],
            sum(1 for d in p.decisions if d.action == "held"),
        )
        for p in plans
    }


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=log_dirs(), force=st.booleans())
def test_spark_plan_equals_model(spark, case, force) -> None:  # type: ignore[no-untyped-def]
    parts, overrides, broker = case
    got = _plan(spark, parts, overrides, broker, force=force, use_spark=True)
    assert got == _expected(parts, overrides, broker, force=force)


@settings(max_examples=300, deadline=None)
@given(case=log_dirs(), force=st.booleans())
def test_single_process_plan_equals_model(case, force) -> None:  # type: ignore[no-untyped-def]
    parts, overrides, broker = case
    got = _plan(None, parts, overrides, broker, force=force, use_spark=False)
    assert got == _expected(parts, overrides, broker, force=force)


def test_untrimmed_time_index_is_never_expired(tmp_path: Path) -> None:
    segs = [ModelSegment(i * 10, 100, NOW - 10**9, NOW - 10**9) for i in range(4)]
    write_partition(tmp_path / "t-0", segs, untrimmed=1)
    scans = scan_partition(str(tmp_path / "t-0"))
    assert [s.timestamp_source for s in scans] == ["timeindex", "unknown", "timeindex", "active"]
    p = ModelPartition(segs, 1000, -1, "delete", 0, 40, None)
    # the model, given the real timestamps, would delete 3; the job stops at the unknown one
    assert expected_log_start(p, NOW, force=False)[0] == 30
    tasks = [t._replace(path=str(tmp_path / "t-0")) for t in _one_task(p)]
    (plan,) = plan_local(tasks, now_ms=NOW, force=False)
    assert plan.new_log_start == 10
    assert plan.unknown_timestamps == 1


def _one_task(p: ModelPartition):  # type: ignore[no-untyped-def]
    return [PartitionTask("", "t", 0, p.retention_ms, p.retention_bytes, True, 0, 40, None)]


def test_scan_agrees_with_the_broker_retention(tmp_path: Path) -> None:
    """A real log (Log.append, rolled by size): the job's plan from the files equals what the
    broker's own Log.delete_old_segments then deletes."""
    cfg = LogConfig(segment_bytes=600, retention_ms=5_000, file_delete_delay_ms=0)
    part = tmp_path / "logs" / "orders-0"
    lg = Log.open(part, cfg)
    for i in range(60):
        batch = bytearray(build_batch([(b"k", b"v" * 40)], base_timestamp=NOW - 60_000 + i * 1000))
        lg.append(batch, now_ms=NOW)
    lg.high_watermark = lg.log_end_offset
    lg.close()
    lg = Log.open(part, cfg, clean_shutdown=True)
    lg.high_watermark = lg.log_end_offset
    scans = scan_partition(str(part))
    assert [s.base_offset for s in scans] == [s.base_offset for s in lg.segments]
    assert [s.largest_timestamp for s in scans[:-1]] == [
        s.largest_timestamp for s in lg.segments[:-1]
    ]
    task = PartitionTask(str(part), "orders", 0, 5_000, -1, True, 0, lg.high_watermark, None)
    plan = plan_partition(task, scans, now_ms=NOW, force=False)
    before = len(lg.segments)
    deleted = lg.delete_old_segments(NOW)
    assert deleted == len(plan.decisions) > 0
    assert lg.log_start_offset == plan.new_log_start
    assert len(lg.segments) == before - deleted
    lg.close()
