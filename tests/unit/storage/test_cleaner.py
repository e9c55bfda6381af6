"""Log cleaning on real segment files: plan, rewrite and swap against the reference model.

Logs are written by the real :class:`Log`; the cleaned result is read back three ways: our
reference decoder, kafka-python's record reader (an independent implementation of the
format, CRC included) and ``loglake dump-log --index-sanity-check``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import os
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch

from logstore.errors import CorruptRecordError
from logstore.protocol.batch import BatchHeader, Codec, iter_batches
from logstore.protocol.records import Record, build_batch, decode_batch
from logstore.storage.cleaner import (
    CleanerSettings,
    SegmentRef,
    group_segments,
    plan_cleaning,
    read_cleaner_checkpoint,
    rewrite_group,
)
from logstore.storage.config import LogConfig
from logstore.storage.files import LOG_SUFFIX, offset_from_file_name
from logstore.storage.log import Log
from logstore.storage.topic_config import write_topic_config
from logstore.tools import dump_log
from pipelines.compaction.log import clean_partition, hand_over
from pipelines.compaction.model import Rec, Strategy, latest

TOPIC = "t"
NOW = 1_700_000_000_000
RETENTION = 60_000
PINNED_DIGEST = "24c777e393c0a560af3de44a5c7f1ad8cf5c01052fe99995353e4d75fe3098cd"

# (key index or None, value or None (tombstone), version header or None)
record_st = st.tuples(
    st.one_of(st.none(), st.integers(0, 6)),
    st.one_of(st.none(), st.binary(max_size=12)),
    st.one_of(st.none(), st.integers(-3, 3)),
)
batch_st = st.tuples(
    st.lists(record_st, min_size=1, max_size=6),
    st.sampled_from([Codec.NONE, Codec.GZIP, Codec.ZSTD, Codec.LZ4, Codec.SNAPPY]),
    st.sampled_from([-1, 7, 8]),  # producer id (-1: not idempotent)
)


def _props(segment_bytes: int = 400) -> dict[str, str]:
    return {
        "cleanup.policy": "compact",
        "segment.bytes": str(segment_bytes),
        "delete.retention.ms": str(RETENTION),
        "file.delete.delay.ms": "0",
        "min.cleanable.dirty.ratio": "0.5",
    }


def open_fresh_log(log_dir: Path, segment_bytes: int) -> tuple[Path, Log]:
    """Topic ``t``'s compacted config (small segments) in ``log_dir``; partition 0's
    directory and its log, opened empty."""
    props = _props(segment_bytes)
    write_topic_config(log_dir, TOPIC, props)
    d = log_dir / f"{TOPIC}-0"
    return d, Log.open(d, LogConfig.from_properties(props))


def append_producer_batch(
    log: Log,
    seqs: dict[int, int],
    pid: int,
    items: list,
    codec: Codec,
    *,
    transactional: bool = False,
) -> None:
    """Append ``items`` as one batch of producer ``pid`` (-1: not idempotent), its next
    sequence numbers taken from and counted on in ``seqs``."""
    seq = seqs.get(pid, 0)
    seqs[pid] = seq + len(items)
    log.append(
        build_batch(
            items,
            codec=codec,
            producer_id=pid,
            producer_epoch=0 if pid >= 0 else -1,
            base_sequence=seq if pid >= 0 else -1,
            is_transactional=transactional,
        )
    )


def write_log(log_dir: Path, batches: list, *, segment_bytes: int = 400) -> Path:
    """Append the batches to a fresh log with small segments; the partition directory."""
    d, log = open_fresh_log(log_dir, segment_bytes)
    seqs: dict[int, int] = {}
    ts = NOW - 10_000
    for records, codec, pid in batches:
        items = []
        for key, value, version in records:
            ts += 1
            headers = [] if version is None else [("v", version.to_bytes(1, "big", signed=True))]
            items.append((None if key is None else b"k%d" % key, value, headers, ts))
        append_producer_batch(log, seqs, pid, items, codec)
    log.roll()  # the last batches' segment becomes cleanable; the new active one is empty
    log.close()
    return d


def read_batches(d: Path) -> list[tuple[BatchHeader, list[Record]]]:
    """Every batch of the live segments with its records, in offset order; kafka-python
    agrees on each (CRC, control flag, every record's offset, key, value and timestamp)."""
    out = []
    bases = sorted(
        p[0] for p in map(offset_from_file_name, os.listdir(d)) if p and p[1] == LOG_SUFFIX
    )
    for base in bases:
        data = (d / f"{base:020d}.log").read_bytes()
        for pos, header in iter_batches(data):
            raw = data[pos : pos + header.size]
            h, recs = decode_batch(raw)
            kb = DefaultRecordBatch(raw)
            assert kb.validate_crc()
            assert kb.is_control_batch == h.is_control
            theirs = [(r.offset, r.key, r.value, r.timestamp) for r in kb]
            assert theirs == [(r.offset, r.key, r.value, r.timestamp) for r in recs]
            out.append((h, recs))
    return out


def read_log(d: Path) -> tuple[list[Record], list[BatchHeader]]:
    """Every record and batch header of the live segments (``read_batches``)."""
    batches = read_batches(d)
    return [r for _, recs in batches for r in recs], [h for h, _ in batches]


def assert_opens_without_recovery(d: Path, log_end_offset: int) -> None:
    """The broker's loader opens the (cleaned) log as it is: nothing truncated, same end."""
    log = Log.open(d, LogConfig.from_properties(_props()), clean_shutdown=False)
    try:
        assert log.log_end_offset == log_end_offset
        assert log.load_result.truncated_bytes == 0
    finally:
        log.close()


def _recs(records: list[Record]) -> list[Rec]:
    return [Rec(0, r.offset, r.timestamp, r.key, r.value, r.headers) for r in records]


def expected_after(records: list[Record], end: int, strategy: Strategy, *, expired: set[int]):
    """The model: below ``end`` only the winners (minus expired tombstones); above, all."""
    below = [r for r in records if r.offset < end]
    keep = {rec.offset for rec in latest(_recs(below), strategy).values()}
    return [
        (r.offset, r.key, r.value, r.timestamp, r.headers)
        for r in records
        if r.offset >= end or (r.offset in keep and r.offset not in expired)
    ]


def dump_ok(d: Path) -> None:
    files = sorted(str(p) for p in d.iterdir() if p.suffix in (".log", ".index", ".timeindex"))
    parser = argparse.ArgumentParser()
    dump_log.add_arguments(parser)
    ns = parser.parse_args(["--files", *files, "--print-data-log", "--index-sanity-check"])
    with contextlib.redirect_stdout(io.StringIO()):
        assert dump_log.run(ns) == 0


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batches=st.lists(batch_st, min_size=1, max_size=25),
    strategy=st.sampled_from([Strategy("offset"), Strategy("timestamp"), Strategy("header", "v")]),
)
def test_clean_equals_model_then_tombstones_expire(tmp_path_factory, batches, strategy):
    log_dir = tmp_path_factory.mktemp("logs")
    d = write_log(log_dir, batches)
    before, before_headers = read_log(d)
    leo = before_headers[-1].next_offset

    res = clean_partition(d, strategy=strategy, now_ms=NOW, force=True, high_watermark=leo)
    assert res.groups >= 1
    assert hand_over(d) == (True, "swapped offline")
    after, headers = read_log(d)
    end = res.end_offset
    assert end == leo  # everything but the (empty) active segment
    assert [(r.offset, r.key, r.value, r.timestamp, r.headers) for r in after] == expected_after(
        before, end, strategy, expired=set()
    )
    assert read_cleaner_checkpoint(log_dir)[(TOPIC, 0)] == end
    # surviving tombstones carry the KIP-534 horizon; producer fields and offsets kept
    for h in headers:
        originals = [o for o in before_headers if o.base_offset == h.base_offset]
        assert len(originals) == 1
        o = originals[0]
        assert (h.last_offset, h.producer_id, h.producer_epoch, h.base_sequence, h.codec_id) == (
            o.last_offset,
            o.producer_id,
            o.producer_epoch,
            o.base_sequence,
            o.codec_id if h.records_count else 0,  # an empty header is uncompressed
        )
    tombstone_batches = {
        h.base_offset
        for h in headers
        for r in after
        if r.value is None and h.base_offset <= r.offset <= h.last_offset
    }
    for h in headers:
        if h.base_offset in tombstone_batches:
            assert h.delete_horizon_ms == NOW + RETENTION
    # a producer's last batch stays even when emptied
    last_of = {}
    for o in before_headers:
        if o.producer_id >= 0:
            last_of[o.producer_id] = o.base_offset
    assert set(last_of.values()) <= {h.base_offset for h in headers}
    dump_ok(d)

    # second pass after the horizon: the tombstones go, nothing else changes
    later = NOW + RETENTION + 1
    res2 = clean_partition(d, strategy=strategy, now_ms=later, force=True, high_watermark=leo)
    if res2.groups:
        assert hand_over(d)[0]
    final, _ = read_log(d)
    expired = {r.offset for r in after if r.value is None}
    assert [(r.offset, r.key, r.value, r.timestamp, r.headers) for r in final] == [
        t for t in expected_after(after, end, strategy, expired=set()) if t[0] not in expired
    ]
    assert_opens_without_recovery(d, leo)


def test_plan_respects_high_watermark_lag_and_ratio(tmp_path):
    batches = [([(i % 3, b"v%d" % i, None)], Codec.NONE, -1) for i in range(40)]
    d = write_log(tmp_path, batches, segment_bytes=300)
    s = CleanerSettings(segment_bytes=10_000)
    full = plan_cleaning(d, s, now_ms=NOW, high_watermark=40)
    assert full.due and full.first_dirty_offset == 0
    assert full.end_offset == 40
    # the high watermark cuts the range at the segment holding it
    part = plan_cleaning(d, s, now_ms=NOW, high_watermark=20)
    assert part.end_offset <= 20 < part.end_offset + 10
    # min.compaction.lag.ms: records written at NOW-10s are too young for a 1 min lag
    young = plan_cleaning(
        d, CleanerSettings(min_compaction_lag_ms=60_000), now_ms=NOW, high_watermark=40
    )
    assert young.segments == () and not young.due
    # a checkpoint at the end: nothing dirty, not due
    clean = plan_cleaning(d, s, now_ms=NOW, high_watermark=40, checkpoint_offset=40)
    assert not clean.due and clean.dirty_ratio == 0.0
    # max.compaction.lag.ms makes a barely dirty log due
    mostly_clean = plan_cleaning(
        d,
        CleanerSettings(min_cleanable_dirty_ratio=0.99, max_compaction_lag_ms=1_000),
        now_ms=NOW,
        high_watermark=40,
        checkpoint_offset=30,
    )
    assert mostly_clean.due and "max.compaction.lag.ms" in mostly_clean.reason
    # the same with the default max lag: not due
    assert not plan_cleaning(
        d,
        CleanerSettings(min_cleanable_dirty_ratio=0.99),
        now_ms=NOW,
        high_watermark=40,
        checkpoint_offset=30,
    ).due


def test_group_segments_by_size_and_offset_range():
    def ref(base: int, size: int, nxt: int) -> SegmentRef:
        return SegmentRef(base, size, nxt, 0, 0, 0, 0, 0)

    segs = [ref(0, 100, 10), ref(10, 100, 20), ref(20, 100, 30), ref(30, 250, 40)]
    groups = group_segments(segs, max_size=300, max_index_size=10**9)
    assert [[s.base_offset for s in g] for g in groups] == [[0, 10, 20], [30]]
    far = [ref(0, 10, 5), ref(2**31, 10, 2**31 + 5)]
    assert len(group_segments(far, max_size=10**9, max_index_size=10**9)) == 2


def _planned_one_segment(tmp_path: Path) -> tuple[Path, object, CleanerSettings]:
    """Six batches in one cleanable segment, planned; (directory, the group, settings)."""
    batches = [([(i % 3, b"v%d" % i, None) for i in range(4)], Codec.NONE, -1)] * 6
    d = write_log(tmp_path, batches, segment_bytes=100_000)
    s = CleanerSettings(segment_bytes=100_000)
    plan = plan_cleaning(d, s, now_ms=NOW, high_watermark=24)
    assert len(plan.groups) == 1 and plan.groups[0][0].size > 0
    return d, plan.groups[0], s


def test_rewrite_fails_on_a_damaged_batch_after_the_plan(tmp_path):
    """A batch damaged between plan and rewrite (its CRC no longer matches) fails the pass;
    so does a segment whose last batch lost its tail (torn) since the plan."""
    d, group, s = _planned_one_segment(tmp_path)
    path = d / f"{0:020d}{LOG_SUFFIX}"
    data = bytearray(path.read_bytes())
    positions = [pos for pos, _ in iter_batches(data)]
    data[positions[3] + 70] ^= 0xFF  # a record byte of the fourth batch
    path.write_bytes(data)
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        rewrite_group(d, group, keep=range(24), settings=s, producer_last_offsets={}, now_ms=NOW)
    data[positions[3] + 70] ^= 0xFF
    # a torn last batch: its batchLength says more bytes than the planned segment holds
    struct.pack_into(">i", data, positions[-1] + 8, len(data) - positions[-1])
    path.write_bytes(data)
    with pytest.raises(CorruptRecordError, match="torn batch"):
        rewrite_group(d, group, keep=range(24), settings=s, producer_last_offsets={}, now_ms=NOW)


def test_rewrite_output_bytes_are_pinned(tmp_path):
    """The cleaned segment of a fixed log (partly kept, wholly kept and dropped batches,
    tombstones given a horizon) is byte for byte what the rewrite produced before its
    per-batch loop was restructured (digest taken from that implementation)."""
    batches = [
        ([(i % 5, None if i % 7 == 3 else b"v%d" % i, None) for i in range(j, j + 4)], c, pid)
        for j, (c, pid) in enumerate(
            [(Codec.NONE, -1), (Codec.GZIP, 7), (Codec.NONE, 7), (Codec.ZSTD, -1)] * 3
        )
    ]
    batches.insert(0, ([(9, b"first", None)], Codec.NONE, -1))  # kept whole, indexes entries
    d = write_log(tmp_path, batches, segment_bytes=100_000)
    s = CleanerSettings(segment_bytes=100_000, index_interval_bytes=1)  # an entry per batch
    plan = plan_cleaning(d, s, now_ms=NOW, high_watermark=49)
    records, _ = read_log(d)
    last: dict[bytes | None, int] = {r.key: r.offset for r in records}
    keep = sorted(last.values())
    dead = sorted(o for o in keep if records[o].value is None)
    for group in plan.groups:
        rewrite_group(
            d,
            group,
            keep=keep,
            tombstones=dead,
            settings=s,
            producer_last_offsets=plan.producer_last_offsets,
            now_ms=NOW,
        )
    digest = hashlib.sha256()
    for p in sorted(d.glob("*.cleaned")):
        digest.update(p.name.encode() + b"\0" + p.read_bytes())
    assert digest.hexdigest() == PINNED_DIGEST
