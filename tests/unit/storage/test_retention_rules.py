"""``logstore.storage.retention``: Kafka's rules at their exact boundaries."""

from __future__ import annotations

from typing import NamedTuple

from logstore.storage.retention import retention_plan


class Seg(NamedTuple):
    base_offset: int
    size: int
    largest_timestamp: int


def _plan(segs: list[Seg], **kw: int | bool) -> list[str]:
    args: dict[str, int | bool] = {
        "retention_ms": -1,
        "retention_bytes": -1,
        "delete_policy": True,
        "log_start_offset": 0,
        "high_watermark": 10**9,
        "now_ms": 10_000,
    }
    args.update(kw)
    return retention_plan(segs, **args)  # type: ignore[arg-type]


SEGS = [Seg(0, 100, 1_000), Seg(10, 100, 2_000), Seg(20, 100, 3_000), Seg(30, 100, 4_000)]


def test_time_rule_is_strictly_greater() -> None:
    # now - 1000 = 9000: a retention.ms of 9000 keeps the segment, 8999 deletes it
    assert _plan(SEGS, retention_ms=9_000) == []
    assert _plan(SEGS, retention_ms=8_999) == ["retention.ms"]
    assert _plan(SEGS, retention_ms=0) == ["retention.ms"] * 3  # never the active one
    assert _plan(SEGS, retention_ms=0, delete_policy=False) == []


def test_size_rule_deletes_while_the_log_stays_at_or_over_the_limit() -> None:
    assert _plan(SEGS, retention_bytes=400) == []
    assert _plan(SEGS, retention_bytes=300) == ["retention.bytes"]  # exactly the limit after
    assert _plan(SEGS, retention_bytes=299) == ["retention.bytes"]
    assert _plan(SEGS, retention_bytes=200) == ["retention.bytes"] * 2
    assert _plan(SEGS, retention_bytes=0) == ["retention.bytes"] * 3
    # the size pass counts what the time pass left
    assert _plan(SEGS, retention_ms=8_999, retention_bytes=200) == [
        "retention.ms",
        "retention.bytes",
    ]


def test_log_start_and_high_watermark_bounds() -> None:
    assert _plan(SEGS, log_start_offset=19) == ["log.start.offset"]
    assert _plan(SEGS, log_start_offset=20) == ["log.start.offset"] * 2
    assert _plan(SEGS, log_start_offset=99) == ["log.start.offset"] * 3
    assert _plan(SEGS, retention_ms=0, high_watermark=19) == ["retention.ms"]
    assert _plan(SEGS, retention_ms=0, high_watermark=20) == ["retention.ms"] * 2
    assert _plan(SEGS[:1], retention_ms=0, log_start_offset=99) == []


def test_lake_bound_keeps_segments_the_lake_has_not_ingested() -> None:
    # segment i holds [10 i, 10 i + 10); it may go by time/size only if 10 (i + 1) <= lake
    assert _plan(SEGS, retention_ms=0, lake_offset=0) == []
    assert _plan(SEGS, retention_ms=0, lake_offset=9) == []
    assert _plan(SEGS, retention_ms=0, lake_offset=10) == ["retention.ms"]
    assert _plan(SEGS, retention_ms=0, lake_offset=29) == ["retention.ms"] * 2
    assert _plan(SEGS, retention_bytes=0, lake_offset=20) == ["retention.bytes"] * 2
    assert _plan(SEGS, retention_ms=0, lake_offset=10**6) == ["retention.ms"] * 3
    # time then size, both stop at the bound
    assert _plan(SEGS, retention_ms=8_999, retention_bytes=0, lake_offset=20) == [
        "retention.ms",
        "retention.bytes",
    ]
    # the log start offset (DeleteRecords) is not bounded
    assert (
        _plan(SEGS, retention_ms=0, lake_offset=0, log_start_offset=25) == ["log.start.offset"] * 2
    )
    # None: Kafka's rules
    assert _plan(SEGS, retention_ms=0, lake_offset=None) == ["retention.ms"] * 3  # type: ignore[arg-type]


def test_lake_bound_safety_valve_by_size() -> None:
    # the log is 400 bytes: a valve below that deletes until the log is no larger than it
    assert _plan(SEGS, retention_ms=0, lake_offset=0, lake_max_bytes=400) == []
    assert _plan(SEGS, retention_ms=0, lake_offset=0, lake_max_bytes=399) == ["retention.ms"]
    assert _plan(SEGS, retention_ms=0, lake_offset=0, lake_max_bytes=200) == ["retention.ms"] * 2
    assert _plan(SEGS, retention_ms=0, lake_offset=0, lake_max_bytes=0) == ["retention.ms"] * 3
    # ingested segments go regardless; the valve then counts what is left
    assert _plan(SEGS, retention_ms=0, lake_offset=10, lake_max_bytes=250) == ["retention.ms"] * 2
    # the valve never deletes what retention itself would keep
    assert _plan(SEGS, retention_ms=9_000, lake_offset=0, lake_max_bytes=0) == []
    assert _plan(SEGS, retention_bytes=300, lake_offset=0, lake_max_bytes=0) == ["retention.bytes"]
    # -1: no valve
    assert _plan(SEGS, retention_bytes=0, lake_offset=0, lake_max_bytes=-1) == []
