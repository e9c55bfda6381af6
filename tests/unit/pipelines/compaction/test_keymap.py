"""The offset strategy's lean key map (:func:`pipelines.compaction.log.winning_offsets`: keys,
offsets and null-value flags walked in place, :mod:`pipelines.compaction._keymap`) against the
full-decode path it replaced (``full_decode=True``: the vectorised decoder, then the same
compiled key map), on real segment files written by the real :class:`Log`: random keyed
records (null keys, null values, headers), every codec mixed batch by batch, transactional
batches with COMMIT/ABORT markers and the plan's aborted ranges, random extra ranges; and
damaged record sections (valid CRC) fail both paths with the same error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logstore.errors import LoglakeError
from logstore.protocol.batch import CRC_OFFSET, HEADER_SIZE, Codec, compute_crc
from logstore.protocol.control import ControlType, build_control_batch
from logstore.protocol.records import build_batch
from logstore.storage.cleaner import CleanerSettings, plan_cleaning, scan_segment
from logstore.storage.config import LogConfig
from logstore.storage.log import Log
from pipelines.compaction.log import winning_offsets
from pipelines.compaction.model import DEFAULT_STRATEGY

NOW = 1_700_000_000_000
CODECS = [Codec.NONE, Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD]
KEYS = [b"", b"a", b"b", b"k" * 16, b"k" * 17, b"long key past sixteen bytes"]

record_st = st.tuples(
    st.one_of(st.none(), st.sampled_from(KEYS)),  # None: a keyless record
    st.one_of(st.none(), st.binary(max_size=40)),  # None: a tombstone
    st.lists(
        st.tuples(st.sampled_from(["v", "é", ""]), st.one_of(st.none(), st.binary(max_size=3))),
        max_size=2,
    ),
)
# ("data", producer: 7/8 transactional, -1 plain, records, codec) | ("end", producer, commit?)
event_st = st.one_of(
    st.tuples(
        st.just("data"),
        st.sampled_from([7, 8, -1, -1]),
        st.lists(record_st, min_size=1, max_size=12),
        st.sampled_from(CODECS),
    ),
    st.tuples(st.just("end"), st.sampled_from([7, 8]), st.booleans()),
)


def _write(d: Path, events: list, segment_bytes: int) -> int:
    """The log end offset."""
    log = Log.open(d, LogConfig.from_properties({"segment.bytes": str(segment_bytes)}))
    seqs: dict[int, int] = {}
    for i, event in enumerate(events):
        ts = NOW - 10_000 + i
        if event[0] == "end":
            _, pid, commit = event
            kind = ControlType.COMMIT if commit else ControlType.ABORT
            log.append(build_control_batch(kind, producer_id=pid, producer_epoch=0, timestamp=ts))
            continue
        _, pid, records, codec = event
        seq = seqs.get(pid, 0)
        seqs[pid] = seq + len(records)
        log.append(
            build_batch(
                [(k, v, h, ts) for k, v, h in records],
                codec=codec,
                producer_id=pid,
                producer_epoch=0 if pid >= 0 else -1,
                base_sequence=seq if pid >= 0 else -1,
                is_transactional=pid >= 0,
            )
        )
    log.roll()
    end: int = log.log_end_offset
    log.close()
    return end


def _both(d: Path, refs: list, aborted: list[tuple[int, int]]) -> tuple:
    """The lean path's and the full decoder's results, or the errors they raised."""
    out = []
    for full in (False, True):
        try:
            keep, dead = winning_offsets(
                d, refs, DEFAULT_STRATEGY, aborted_batches=aborted, full_decode=full
            )
            out.append((keep.tolist(), dead.tolist()))
        except LoglakeError as exc:
            out.append(("error", str(exc)))
    return tuple(out)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    events=st.lists(event_st, min_size=1, max_size=14),
    segment_bytes=st.sampled_from([300, 1500, 1 << 20]),
    cuts=st.lists(st.integers(0, 120), max_size=6),
)
def test_lean_key_map_equals_the_full_decode(tmp_path_factory, events, segment_bytes, cuts):
    d = tmp_path_factory.mktemp("log") / "t-0"
    # transactions left open end last (an open one would bound the cleanable range)
    end = _write(d, [*events, ("end", 7, False), ("end", 8, True)], segment_bytes)
    plan = plan_cleaning(d, CleanerSettings(), now_ms=NOW, high_watermark=end)
    refs = list(plan.segments)
    assert sum(r.size for r in refs) == sum(p.stat().st_size for p in d.glob("*.log"))
    lean, full = _both(d, refs, list(plan.aborted_batches))
    assert lean[0] != "error", lean
    assert lean == full
    # every record is accounted for: the winners are offsets of keyed records
    assert set(lean[1]) <= set(lean[0])
    # any other sorted, disjoint aborted ranges are honoured the same way
    bounds = sorted(set(cuts))
    ranges = [(a, b - 1) for a, b in zip(bounds[::2], bounds[1::2], strict=False) if b > a]
    lean2, full2 = _both(d, refs, ranges)
    assert lean2 == full2
    for o in lean2[0]:
        assert not any(a <= o <= b for a, b in ranges)


def _refs(d: Path) -> list:
    return [scan_segment(p)[0] for p in sorted(d.glob("*.log"))]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batches=st.lists(st.lists(record_st, min_size=1, max_size=8), min_size=1, max_size=4),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=3),
    data=st.data(),
)
def test_damaged_records_fail_both_paths_alike(tmp_path_factory, batches, flips, data):
    """Bytes of a record section changed and the CRC made right again (so only the record
    walk can tell): the lean path raises what the full decoder raises, or both agree."""
    d = tmp_path_factory.mktemp("log") / "t-0"
    _write(d, [("data", -1, recs, Codec.NONE) for recs in batches], 1 << 20)
    path = sorted(d.glob("*.log"))[0]  # then the empty active segment
    buf = bytearray(path.read_bytes())
    refs = _refs(d)
    # the batch to damage, then its bytes
    pos, n = 0, data.draw(st.integers(0, len(batches) - 1))
    for _ in range(n):
        pos += 12 + int.from_bytes(buf[pos + 8 : pos + 12], "big")
    size = 12 + int.from_bytes(buf[pos + 8 : pos + 12], "big")
    for where, byte in flips:
        buf[pos + HEADER_SIZE + where % (size - HEADER_SIZE)] = byte
    crc = compute_crc(buf, pos, size)
    buf[pos + CRC_OFFSET : pos + CRC_OFFSET + 4] = crc.to_bytes(4, "big")
    path.write_bytes(buf)
    lean, full = _both(d, refs, [])
    assert lean == full


def test_a_crc_mismatch_or_a_bad_record_fails_the_pass(tmp_path) -> None:
    d = tmp_path / "t-0"
    _write(d, [("data", -1, [(b"a", b"x" * 20, [])] * 3, Codec.NONE)], 1 << 20)
    path = sorted(d.glob("*.log"))[0]  # then the empty active segment
    good = bytes(path.read_bytes())
    refs = _refs(d)
    assert winning_offsets(d, refs, DEFAULT_STRATEGY)[0].tolist() == [2]
    bad = bytearray(good)
    bad[-1] ^= 1  # a value byte: the CRC no longer matches
    path.write_bytes(bad)
    with pytest.raises(LoglakeError, match="damaged batch, not cleaning: CRC mismatch"):
        winning_offsets(d, refs, DEFAULT_STRATEGY)
    bad[-1] ^= 1
    bad[HEADER_SIZE] = 0x7F  # the first record's length (zigzag): -64
    bad[CRC_OFFSET : CRC_OFFSET + 4] = compute_crc(bad, 0, len(bad)).to_bytes(4, "big")
    path.write_bytes(bad)
    for full in (False, True):
        with pytest.raises(LoglakeError, match="damaged batch: negative record length"):
            winning_offsets(d, refs, DEFAULT_STRATEGY, full_decode=full)


def test_many_rows_grow_the_buffers(tmp_path) -> None:
    """More records than the first guess (offsets span less than the records need: a
    segment's records counted from its size) and keys of every length: still each key's last."""
    d = tmp_path / "t-0"
    rng = np.random.default_rng(3)
    keys = [
        bytes(rng.integers(0, 256, int(rng.integers(0, 40)), dtype=np.uint8)) for _ in range(300)
    ]
    picks = rng.integers(0, len(keys), 5000)
    events = [
        (
            "data",
            -1,
            [(keys[int(k)], None if k % 7 == 0 else b"", []) for k in picks[i : i + 500]],
            Codec.NONE,
        )
        for i in range(0, len(picks), 500)
    ]
    _write(d, events, 1 << 20)
    keep, dead = winning_offsets(d, _refs(d), DEFAULT_STRATEGY)
    last = {keys[int(k)]: i for i, k in enumerate(picks)}
    assert keep.tolist() == sorted(last.values())
    assert dead.tolist() == sorted(i for i in last.values() if picks[i] % 7 == 0)


def test_a_segment_that_shrank_since_the_plan_fails_the_pass(tmp_path) -> None:
    d = tmp_path / "t-0"
    _write(d, [("data", -1, [(b"a", b"x" * 20, [])] * 3, Codec.NONE)], 1 << 20)
    refs = _refs(d)
    path = sorted(d.glob("*.log"))[0]
    with open(path, "r+b") as f:
        f.truncate(refs[0].size - 1)
    for full in (False, True):
        with pytest.raises(LoglakeError, match="segment shrank to"):
            winning_offsets(d, refs, DEFAULT_STRATEGY, full_decode=full)
