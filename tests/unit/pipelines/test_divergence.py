"""The log side of the divergence check, on segments written by the storage engine itself.

``batch_at`` and ``log_end`` walk batch headers (from the ``.index``) and are compared with
what ``Log.append`` reported; ``check_partition`` must call a truncated log, and a log
refilled under the same offsets (same epoch, other CRC), diverged, and leave a log that only
grew, or lost offsets to retention (a gap), alone.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pyarrow as pa
import pytest

from logstore.protocol.records import build_batch
from logstore.storage.config import LogConfig
from logstore.storage.log import Log
from pipelines.divergence import (
    COMPARED_COLUMNS,
    _first_difference,
    batch_at,
    check_partition,
    log_end,
)
from pipelines.sources.schema import RECORDS_ARROW_SCHEMA


def _append(log: Log, n: int, tag: str) -> tuple[int, int]:
    items = [(f"k{i}".encode(), f"{tag}-{i}".encode() * 20) for i in range(n)]
    info = log.append(build_batch(items))
    log.high_watermark = log.log_end_offset
    return info.first_offset, info.first_offset + n - 1


def _log(path: Path) -> Log:
    # small segments and a dense index: several segments, index-guided header walks
    return Log.open(path, LogConfig(segment_bytes=4096, index_interval_bytes=256))


def test_batch_at_and_log_end_agree_with_the_appends(tmp_path: Path) -> None:
    part = tmp_path / "t-0"
    log = _log(part)
    spans = [_append(log, 1 + i % 7, "a") for i in range(60)]
    log.flush()
    assert len(list(part.glob("*.log"))) > 3
    for first, last in spans:
        for offset in (first, last, (first + last) // 2):
            batch = batch_at(part, offset)
            assert batch is not None and (batch.base_offset, batch.last_offset) == (first, last)
    assert batch_at(part, spans[-1][1] + 1) is None
    assert log_end(part, None) == spans[-1][1] + 1
    assert log_end(part, 5) == 5  # capped at the high watermark
    log.close()


def test_check_partition_cases(tmp_path: Path) -> None:
    part = tmp_path / "t-0"
    log = _log(part)
    for _ in range(20):
        _append(log, 5, "old")
    log.flush()
    progress = log.log_end_offset  # 100: the lake ingested everything
    lake = batch_at(part, progress - 1)
    assert lake is not None

    def check(hw: int | None = None, start: int = 0):  # type: ignore[no-untyped-def]
        return check_partition(
            ("t", 0), part, progress=progress, log_start=start, high_watermark=hw,
            fingerprint=lake, known=True,
        )  # fmt: skip

    assert check() is None
    _append(log, 5, "more")  # the log only grew
    log.flush()
    assert check() is None
    assert check(start=progress + 5) is None  # retention past progress: a gap, not divergence

    log.truncate_to(60)  # truncated below progress, not refilled
    log.flush()
    short = check()
    assert short is not None and short.log_end == 60 and short.log_batch is None
    assert "t/0: the log ends at offset 60, below the lake's progress 100" in short.describe()

    for _ in range(10):  # refilled past progress with other records, same epoch
        _append(log, 5, "new")
    log.flush()
    refilled = check()
    assert refilled is not None and refilled.log_end == 110
    assert refilled.log_batch is not None and refilled.lake_batch == lake
    assert (refilled.log_batch.base_offset, refilled.log_batch.last_offset) == (95, 99)
    assert refilled.log_batch.crc != lake.crc
    assert "offset 99: the lake has batch [95, 99]" in refilled.describe()
    # no remembered batch: only the log end can tell
    unknown = check_partition(
        ("t", 0), part, progress=progress, log_start=0, high_watermark=None,
        fingerprint=None, known=False,
    )  # fmt: skip
    assert unknown is None
    # the same rewritten batch below the cleaner-offset-checkpoint: log compaction rewrote it
    # (same offsets, other CRC), which is not divergence; a log end below progress still is
    cleaned = check_partition(
        ("t", 0), part, progress=progress, log_start=0, high_watermark=None,
        fingerprint=lake, known=True, cleaned_to=progress,
    )  # fmt: skip
    assert cleaned is None
    log.truncate_to(60)
    log.flush()
    short_cleaned = check_partition(
        ("t", 0), part, progress=progress, log_start=0, high_watermark=None,
        fingerprint=lake, known=True, cleaned_to=progress,
    )  # fmt: skip
    assert short_cleaned is not None and short_cleaned.log_end == 60
    log.close()


def _rows(rows: list[dict[str, object]]) -> pa.Table:
    names = ("offset", *COMPARED_COLUMNS, "headers")
    cols = {}
    for f in RECORDS_ARROW_SCHEMA:
        if f.name in names:
            default: object = 0
            if pa.types.is_boolean(f.type):
                default = False
            elif pa.types.is_list(f.type):
                default = []
            elif f.name in ("key", "value"):
                default = None
            cols[f.name] = pa.array([r.get(f.name, default) for r in rows], f.type)
    return pa.table(cols)


def test_first_difference_of_lake_rows_and_log_records() -> None:
    ts = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    base = [
        {"offset": i, "key": b"k", "value": b"v%d" % i, "timestamp": ts,
         "headers": [{"key": "h", "value": b"x"}]}
        for i in range(5)
    ]  # fmt: skip
    assert _first_difference(_rows(base), _rows(base)) is None
    other = [dict(r) for r in base]
    other[3]["headers"] = [{"key": "h", "value": b"y"}]  # a header value, then a value
    other[4]["value"] = b"zz"
    assert _first_difference(_rows(base), _rows(other)) == 3
    other = [dict(r) for r in base]
    other[2]["headers"] = []  # a header count, after a null header value
    other[1]["headers"] = [{"key": "h", "value": None}]
    assert _first_difference(_rows(base), _rows(other)) == 1
    other = [dict(r) for r in base]
    other[4]["producer_id"] = 7
    assert _first_difference(_rows(base), _rows(other)) == 4
    assert _first_difference(_rows(base), _rows(base[:3])) == 3  # the log is shorter
    assert _first_difference(_rows(base[:2]), _rows(base)) == 2  # the lake is shorter


def test_log_end_reaches_past_a_damaged_tail_to_the_high_watermark(tmp_path: Path) -> None:
    """Ingest quarantines a damaged last batch below the high watermark and moves past it:
    the log end must not stop at that damage (else the next run would call it divergence),
    while a log that merely ends (truncated, zero fill after it) still ends there."""
    part = tmp_path / "t-0"
    log = Log.open(part, LogConfig(segment_bytes=1 << 20, index_interval_bytes=256))
    spans = [_append(log, 5, "a") for _ in range(6)]
    log.flush()
    hw = spans[-1][1] + 1
    segment = next(part.glob("*.log"))
    data = bytearray(segment.read_bytes())
    last = batch_at(part, spans[-1][0])
    assert last is not None
    assert log_end(part, hw) == hw
    # the last batch's length made impossible: the walk stops before it
    data[last.position + 8 : last.position + 12] = (0x7FFFFFF0).to_bytes(4, "big")
    segment.write_bytes(bytes(data))
    assert log_end(part, None) == spans[-2][1] + 1  # no high watermark: whole batches only
    assert log_end(part, hw) == hw  # damage below the HW: the log still reaches it
    # the same batch cut off with zero fill behind it: the log ends at the last whole batch
    data[last.position :] = bytes(len(data) - last.position)
    segment.write_bytes(bytes(data))
    assert log_end(part, hw) == spans[-2][1] + 1
    log.close()


def test_log_end_while_the_broker_rolls_the_segment_and_trims_its_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The active segment's ``.index`` is preallocated (zeros after its entries); the broker
    rolling it cuts the file to its entries. Cut between the walk's ``fstat`` of the index and
    its reads (what ingest met racing retention): reads past the new end are no entries, the
    end is still right."""
    part = tmp_path / "t-0"
    log = Log.open(part, LogConfig(segment_bytes=1 << 20, index_interval_bytes=256))
    spans = [_append(log, 1 + i % 7, "a") for i in range(40)]
    (index,) = part.glob("*.index")
    entries = len(log.active_segment.offset_index)
    assert 0 < entries * 8 < index.stat().st_size  # preallocated
    real_fstat = os.fstat

    def stat_then_roll(fd: int) -> os.stat_result:
        st = real_fstat(fd)
        os.truncate(index, entries * 8)  # the broker's trim, right after the walk measured
        return st

    monkeypatch.setattr(os, "fstat", stat_then_roll)
    assert log_end(part, None) == spans[-1][1] + 1
    monkeypatch.undo()
    log.close()
