"""The tier source's executor read and RLMM replay, on a store in a local directory written in
the plugin's layout (:mod:`logstore.tier.layout`): windows smaller than the segment (a batch cut
by a window's end is read again), a start inside the segment (the offset index), an object
missing; deletes and partition deletes in ``__remote_log_metadata``. Compared with
:func:`pipelines.sources.read.read_records` of the same bytes as a segment file."""

from __future__ import annotations

import dataclasses
import struct
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from logstore.errors import ObjectNotFoundError
from logstore.objectstore import StorageSettings
from logstore.protocol.batch import Codec
from logstore.protocol.records import build_batch
from logstore.protocol.varint import encode_unsigned_varint as uv
from logstore.tier import layout
from logstore.tier.metadata import (
    RemoteSegment,
    SegmentState,
    SegmentUpdate,
    decode_record,
    encode_segment,
    encode_update,
)
from pipelines.sources import tier as tier_source
from pipelines.sources.damage import skipped_offsets
from pipelines.sources.plan import SegmentRange
from pipelines.sources.read import RangeReport, read_records
from pipelines.sources.tier import (
    RlmmState,
    TierRange,
    partition_delete,
    read_tier_range,
    tier_part,
    tier_store,
    tier_tasks,
)
from tests.fixtures.broker import wait_for
from tests.fixtures.s3 import S3Bucket, S3Proxy

TOPIC_ID = uuid.UUID(int=0x1234)
BASE = 1000
LOW, HIGH = -(2**63), 2**63 - 1


def _segment() -> tuple[bytes, bytes]:
    """40 batches of 1-9 records (every other one zstd), and an offset index entry per 4
    batches (as ``index.interval.bytes`` would put them): ``(log bytes, index bytes)``."""
    log, index = bytearray(), bytearray()
    offset = BASE
    for i in range(40):
        records = [(b"k%d" % j, b"v%d-%d" % (i, j) * 20, (), 1_700_000_000_000 + i)
                   for j in range(1 + i % 9)]  # fmt: skip
        batch = build_batch(records, base_offset=offset,
                            codec=Codec.ZSTD if i % 2 else Codec.NONE)  # fmt: skip
        if i % 4 == 3:
            index += struct.pack(">ii", offset + len(records) - 1 - BASE, len(log))
        log += batch
        offset += len(records)
    return bytes(log), bytes(index)


def _remote(
    tmp_path: Path,
    *,
    chunk_size: int = 700,
    root: str | None = None,
    settings: StorageSettings | None = None,
) -> tuple[TierRange, bytes, int]:
    log, index = _segment()
    last = BASE + sum(1 + i % 9 for i in range(40)) - 1
    seg = RemoteSegment(topic="t", topic_id=TOPIC_ID, partition=0, segment_id=uuid.uuid4(),
                        start_offset=BASE, end_offset=last, max_timestamp_ms=0, broker_id=0,
                        event_timestamp_ms=0, segment_size=len(log),
                        state=SegmentState.COPY_SEGMENT_FINISHED)  # fmt: skip
    blob, where = layout.build_indexes({"offset": index, "timestamp": b"", "producerSnapshot": b"",
                                        "leaderEpoch": b"", "transaction": None})  # fmt: skip
    root = root or str(tmp_path / "tier")
    keys = layout.segment_keys("", seg)
    store = tier_store(root)
    store.write(keys["log"], log)
    store.write(keys["indexes"], blob)
    store.write(keys["rsm-manifest"],
                layout.build_manifest(seg, chunk_size=chunk_size, indexes=where))  # fmt: skip
    settings = settings or StorageSettings.from_environment({})
    rng = TierRange(seg, BASE, last + 1, root, settings)
    (tmp_path / "seg.log").write_bytes(log)
    return rng, log, last


def _from_file(tmp_path: Path, log: bytes, start: int, until: int) -> pa.Table:
    rng = SegmentRange("t", 0, str(tmp_path / "seg.log"), BASE, 0, len(log), start, until,
                       None, False)  # fmt: skip
    return pa.Table.from_batches(list(read_records(rng, min_timestamp=LOW, max_timestamp=HIGH)))


@pytest.mark.parametrize("window", [1, 1500, 4000, 1 << 20])
def test_windows_and_mid_segment_start_read_what_the_segment_file_holds(
    tmp_path: Path, window: int
) -> None:
    rng, log, last = _remote(tmp_path)
    for start in (BASE, BASE + 37, BASE + 150, last):
        until = max(start + 1, last + 1 - start % 3)  # to the end, or inside the last batch
        part = TierRange(rng.segment, start, until, rng.root, rng.settings)
        report = RangeReport("t", 0)
        got = pa.Table.from_batches(
            list(
                read_tier_range(
                    part, window_bytes=window, report=report, min_timestamp=LOW, max_timestamp=HIGH
                )
            )
        )
        want = _from_file(tmp_path, log, part.start_offset, part.until)
        # the same rows, segment base offset and batch positions included
        assert got.drop_columns(["topic"]).equals(want.drop_columns(["topic"])), (window, start)
        assert got.num_rows == part.until - part.start_offset
        assert report.next_offset is not None and report.next_offset >= part.until
        assert report.damaged == []
        # a batch cut by a window's end is no damage to the ingest job: nothing skipped
        tp = {("t", 0): part.start_offset}
        assert skipped_offsets([report.to_json()], tp, {("t", 0): part.until}) == ([], [], {})


@pytest.mark.parametrize("window", [1500, 4000])
def test_a_carry_longer_than_the_headroom_is_joined_not_lost(
    tmp_path: Path, window: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tail a window's end cut is put before the next window's bytes in its buffer's
    headroom; a tail longer than the headroom (here 16 bytes, a batch is longer) is joined
    with a copy: the same rows either way, the window buffers reused across windows."""
    monkeypatch.setattr(tier_source, "_HEADROOM", 16)
    monkeypatch.setattr(tier_source, "_POOL", [])
    rng, log, _last = _remote(tmp_path)
    for _ in range(2):  # the second read takes the buffers the first gave back
        got = pa.Table.from_batches(
            list(read_tier_range(rng, window_bytes=window, min_timestamp=LOW, max_timestamp=HIGH))
        )
        assert got.equals(_from_file(tmp_path, log, rng.start_offset, rng.until))
    assert tier_source._POOL  # given back once read whole


def test_a_missing_log_object_is_an_error_naming_it(tmp_path: Path) -> None:
    rng, _log, _last = _remote(tmp_path)
    key = layout.segment_keys("", rng.segment)["log"]
    (Path(rng.root) / key).unlink()
    with pytest.raises(ObjectNotFoundError, match="no such object") as err:
        list(read_tier_range(rng, min_timestamp=LOW, max_timestamp=HIGH))
    assert key in str(err.value)


@pytest.mark.parametrize("ahead", [3, tier_source.READ_AHEAD])
def test_read_ahead_windows_are_in_flight_while_one_is_decoded(
    s3: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ahead: int
) -> None:
    """On S3 (the tests' server behind a proxy that counts requests): while the first
    window's rows are taken, the next READ_AHEAD windows' GETs have been sent, and no more;
    in all, one GET a window, no byte asked for twice. Before: one window ahead, always."""
    monkeypatch.setattr(tier_source, "READ_AHEAD", ahead)
    proxy = S3Proxy(s3.server.endpoint)
    try:
        settings = StorageSettings.from_environment({"endpoint_url": proxy.endpoint})
        rng, log, _last = _remote(tmp_path, root=s3.uri("tier"), settings=settings)
        window = 1400  # two 700-byte chunks
        assert len(log) > (ahead + 2) * window

        def log_gets() -> int:
            return sum(r.kind == "GetObject" and r.path.endswith(".log") for r in proxy.requests)

        batches = read_tier_range(rng, window_bytes=window, min_timestamp=LOW, max_timestamp=HIGH)
        first = next(batches)
        wait_for(lambda: log_gets() >= 1 + ahead, 10)
        assert log_gets() == 1 + ahead
        got = pa.Table.from_batches([first, *batches])
        assert got.equals(_from_file(tmp_path, log, rng.start_offset, rng.until))
        assert log_gets() == -(-len(log) // window)
    finally:
        proxy.close()


def test_the_next_range_is_opened_while_this_one_is_read(tmp_path: Path) -> None:
    a, log, _last = _remote(tmp_path)
    b, _, _ = _remote(tmp_path)
    c, _, _ = _remote(tmp_path)
    want = _from_file(tmp_path, log, a.start_offset, a.until)

    def read(rng: TierRange, *after: TierRange) -> pa.Table:
        batches = read_tier_range(rng, min_timestamp=LOW, max_timestamp=HIGH, after=after)
        return pa.Table.from_batches(list(batches))

    assert read(a, b).equals(want)
    # b's manifest and first window (all of it: one window) were fetched while a was read
    # (on a thread: waited for here): its objects gone, it reads the same
    wait_for(lambda: all(f.done() for f in tier_source._OPENED.values()), 10)
    for key in layout.segment_keys("", b.segment).values():
        (Path(b.root) / key).unlink()
    assert read(b, c).equals(want)
    # a head start is used once: read again, b is read from the store (gone: an error)
    with pytest.raises(ObjectNotFoundError):
        read(b)
    # c's head start fails (its .log went): reading c raises what a plain read raises
    wait_for(lambda: all(f.done() for f in tier_source._OPENED.values()), 10)
    (Path(c.root) / layout.segment_keys("", c.segment)["log"]).unlink()
    assert read(a, c).equals(want)
    with pytest.raises(ObjectNotFoundError, match="no such object"):
        read(c)


def test_segments_of_one_window_are_opened_read_ahead_deep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task of segments of one window each keeps READ_AHEAD of them opened ahead (manifest,
    first window), not one: while ``a`` is read, ``b`` and ``c`` (READ_AHEAD 2), not ``d``;
    ``b`` read next keeps ``c``'s head start and adds ``d``'s. Before: one segment ahead."""
    monkeypatch.setattr(tier_source, "READ_AHEAD", 2)
    a, log, _last = _remote(tmp_path)
    b, c, d = (_remote(tmp_path)[0] for _ in range(3))
    want = _from_file(tmp_path, log, a.start_offset, a.until)
    task = [a, b, c, d]
    assert tier_source.next_tier_ranges(task, 0) == (b, c)

    def read(i: int) -> pa.Table:
        after = tier_source.next_tier_ranges(task, i)
        batches = read_tier_range(task[i], min_timestamp=LOW, max_timestamp=HIGH, after=after)
        return pa.Table.from_batches(list(batches))

    def opened() -> set[uuid.UUID]:
        wait_for(lambda: all(f.done() for f in tier_source._OPENED.values()), 10)
        return {key[1] for key in tier_source._OPENED}

    assert read(0).equals(want)
    assert opened() == {b.segment.segment_id, c.segment.segment_id}
    for rng in (b, c):  # their objects gone: read from the head starts
        for key in layout.segment_keys("", rng.segment).values():
            (Path(rng.root) / key).unlink()
    assert read(1).equals(want)
    assert opened() == {c.segment.segment_id, d.segment.segment_id}
    assert read(2).equals(want)
    assert read(3).equals(want)
    assert not tier_source._OPENED


def _seg(start: int, end: int, partition: int = 0) -> RemoteSegment:
    return RemoteSegment(topic="t", topic_id=TOPIC_ID, partition=partition,
                         segment_id=uuid.uuid4(), start_offset=start, end_offset=end,
                         max_timestamp_ms=0, broker_id=0, event_timestamp_ms=0,
                         segment_size=1)  # fmt: skip


def _update(seg: RemoteSegment, state: SegmentState) -> bytes:
    return encode_update(SegmentUpdate("t", TOPIC_ID, seg.partition, seg.segment_id, state, 0, 0))


def _partition_delete(partition: int, state: int) -> bytes:
    """A RemotePartitionDeleteMetadataRecord value (api key 2, version 0)."""
    return (uv(1) + uv(2) + uv(0) + uv(2) + b"t" + TOPIC_ID.bytes + struct.pack(">i", partition)
            + b"\x00" + struct.pack(">iqb", 0, 0, state) + b"\x00")  # fmt: skip


def test_rlmm_replay_keeps_finished_segments_not_deleted_ones() -> None:
    a, b, c, d = _seg(0, 9), _seg(10, 19), _seg(20, 29), _seg(0, 5, partition=1)
    values = [
        encode_segment(a), _update(a, SegmentState.COPY_SEGMENT_FINISHED),
        encode_segment(b), _update(b, SegmentState.COPY_SEGMENT_FINISHED),
        encode_segment(c),  # a copy cut short: never FINISHED
        _update(a, SegmentState.DELETE_SEGMENT_STARTED),  # a is going
        encode_segment(d), _update(d, SegmentState.COPY_SEGMENT_FINISHED),
        _partition_delete(1, 0),  # partition 1: marked for deletion
    ]  # fmt: skip
    state = RlmmState()
    for value in values:
        record = decode_record(value)
        if record is not None:
            state.apply(record)
        elif (deleted := partition_delete(value)) is not None:
            state.delete_partition(*deleted)
    live = state.live()
    assert list(live) == [("t", 0)]
    assert [s.segment_id for s in live[("t", 0)]] == [b.segment_id]
    assert partition_delete(encode_segment(a)) is None


def test_thetier_part_is_contiguous_from_the_start() -> None:
    segs = [_seg(0, 9), _seg(10, 19), _seg(30, 39)]  # a hole at 20..29
    assert tier_part(segs, 0, 100) == (segs[:2], 20)
    assert tier_part(segs, 15, 100) == (segs[1:2], 20)
    assert tier_part(segs, 15, 17) == (segs[1:2], 17)
    assert tier_part(segs, 20, 100) == ([], 20)  # the hole: everything from 20 through Fetch
    assert tier_part(segs, 45, 100) == ([], 45)


def _sized(start: int, end: int, size: int) -> RemoteSegment:
    return dataclasses.replace(_seg(start, end), segment_size=size)


def test_tier_tasks_run_out_small_in_plan_order() -> None:
    """Guided self-scheduling by the segments' bytes (as the log-dir path's tasks): big tasks
    first, then a core's share of the rest, down to the smallest task; every segment once,
    in plan order; a range's bytes are its share of its segment's offsets."""
    settings = StorageSettings.from_environment({})
    mib = 1 << 20
    ranges = [
        TierRange(_sized(a, a + 9, 8 * mib), a, a + 10, "/x", settings) for a in range(0, 1200, 10)
    ]  # 120 segments of 8 MiB: 960 MiB
    tasks = tier_tasks(ranges, 2, max_bytes=128 * mib)
    # MiB a task: 128 while more than 2 such tasks are left, then half the rest each time,
    # down to 24 (a core's share of the last 48 MiB: above the smallest task, 128 / 8)
    assert [8 * len(t) for t in tasks] == [128] * 6 + [96, 48, 24, 24]
    assert [r for t in tasks for r in t] == ranges
    # a few segments: still at least one task a core, each a core's share
    few = tier_tasks(ranges[:4], 2, max_bytes=128 * mib)
    assert [len(t) for t in few] == [2, 2]
    # a range reading half its segment counts half its bytes
    half = TierRange(_sized(0, 9, 8 * mib), 5, 10, "/x", settings)
    assert [len(t) for t in tier_tasks([half, *ranges[1:3]], 1, max_bytes=12 * mib)] == [2, 1]
    whole = TierRange(_sized(0, 9, 8 * mib), 0, 10, "/x", settings)
    assert [len(t) for t in tier_tasks([whole, *ranges[1:3]], 1, max_bytes=12 * mib)] == [1, 1, 1]
    assert tier_tasks([], 2) == []
