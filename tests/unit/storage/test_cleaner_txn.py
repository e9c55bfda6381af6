"""Log compaction with transactions, on real segment files holding transactional batches and
COMMIT/ABORT control batches (written by the real :class:`Log`, markers built as a
coordinator builds them): the records of aborted transactions go and never win a key,
markers stay while their transaction has a batch left, then get a delete horizon and go after
it, an open transaction bounds the cleaned range. Expected results come from the reference
model (:func:`pipelines.compaction.model.aborted_offsets` + ``latest``) and a plain restatement
of Kafka's marker rule over the batch list; the cleaned files are read back by kafka-python
too and opened by the broker's loader without recovery."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logstore.protocol.batch import BatchHeader, Codec
from logstore.protocol.control import ControlType, build_control_batch
from logstore.protocol.records import Record
from logstore.storage.cleaner import CleanerSettings, plan_cleaning
from logstore.storage.config import LogConfig
from logstore.storage.log import Log
from pipelines.compaction.log import clean_partition, hand_over
from pipelines.compaction.model import LogBatch, Rec, aborted_offsets, latest
from tests.unit.storage.test_cleaner import (
    NOW,
    RETENTION,
    _props,
    append_producer_batch,
    assert_opens_without_recovery,
    open_fresh_log,
    read_batches,
)

TXN_PIDS = (7, 8)  # transactional producers; 9 is idempotent, -1 plain

# ("data", producer, [(key, value)], codec) | ("end", producer, commit?)
data_st = st.tuples(
    st.just("data"),
    st.sampled_from([7, 8, 9, -1]),
    st.lists(
        st.tuples(st.integers(0, 4), st.one_of(st.none(), st.binary(min_size=1, max_size=6))),
        min_size=1,
        max_size=4,
    ),
    st.sampled_from([Codec.NONE, Codec.GZIP, Codec.LZ4]),
)
end_st = st.tuples(st.just("end"), st.sampled_from(TXN_PIDS), st.booleans())


def write_txn_log(log_dir: Path, events: list, *, segment_bytes: int = 400) -> Path:
    d, log = open_fresh_log(log_dir, segment_bytes)
    seqs: dict[int, int] = {}
    ts = NOW - 10_000
    for event in events:
        ts += 1
        if event[0] == "end":
            _, pid, commit = event
            kind = ControlType.COMMIT if commit else ControlType.ABORT
            log.append(build_control_batch(kind, producer_id=pid, producer_epoch=0, timestamp=ts))
            continue
        _, pid, records, codec = event
        items = [(b"k%d" % k, v, [], ts) for k, v in records]
        append_producer_batch(log, seqs, pid, items, codec, transactional=pid in TXN_PIDS)
    log.roll()
    log.close()
    return d


def _type(records: list[Record]) -> int | None:
    return None if not records else int.from_bytes(records[0].key[2:4], "big")  # type: ignore[index]


def _model_batches(batches: list[tuple[BatchHeader, list[Record]]]) -> list[LogBatch]:
    return [
        LogBatch(
            h.producer_id,
            h.is_transactional,
            _type(recs) if h.is_control else None,
            tuple(r.offset for r in recs),
        )
        for h, recs in batches
    ]


def expected_data(batches, end: int, now: int) -> list[tuple]:
    """The model: below ``end`` the winners among committed records (aborted ones win
    nothing and go), minus tombstones whose batch's horizon has passed (KIP-534); at or above
    ``end`` everything, aborted or not (not cleaned)."""
    aborted = aborted_offsets(_model_batches(batches))
    data = [(h, r) for h, recs in batches if not h.is_control for r in recs]
    below = [Rec(0, r.offset, r.timestamp, r.key, r.value) for _, r in data if r.offset < end]
    keep = {
        rec.offset for rec in latest(below, is_aborted=lambda rec: rec.offset in aborted).values()
    }
    expired = {
        r.offset
        for h, r in data
        if r.value is None and h.delete_horizon_ms is not None and h.delete_horizon_ms <= now
    }
    return [
        (r.offset, r.key, r.value)
        for _, r in data
        if r.offset >= end or (r.offset in keep and r.offset not in expired)
    ]


def expected_markers(batches, end: int, now: int) -> list[tuple[int, int | None]]:
    """Kafka's marker rule restated over the batch list before the pass: a marker below
    ``end`` whose transaction has no batch left before it (since the producer's previous
    marker) may go: it gets a horizon ``now + delete.retention.ms``, or goes when its horizon
    has passed. ``(offset, horizon)`` of the markers after the pass."""
    out = []
    since_marker: dict[int, int] = {}  # producer -> transactional data batches since marker
    for h, recs in batches:
        pid = h.producer_id
        if not h.is_control:
            if h.is_transactional and h.base_offset < end:
                since_marker[pid] = since_marker.get(pid, 0) + 1
            continue
        if h.base_offset >= end:
            out.append((h.base_offset, h.delete_horizon_ms))
            continue
        discardable = not recs or since_marker.pop(pid, 0) == 0
        horizon = h.delete_horizon_ms
        if not discardable:
            out.append((h.base_offset, horizon))
        elif horizon is None:
            out.append((h.base_offset, now + RETENTION))
        elif horizon > now:
            out.append((h.base_offset, horizon))
    return out


def _data(batches) -> list[tuple]:
    return [(r.offset, r.key, r.value) for h, recs in batches if not h.is_control for r in recs]


def _markers(batches) -> list[tuple[int, int | None]]:
    return [(h.base_offset, h.delete_horizon_ms) for h, _ in batches if h.is_control]


def _pass(d: Path, now: int, hw: int) -> int:
    res = clean_partition(d, now_ms=now, force=True, high_watermark=hw)
    if res.groups:
        assert hand_over(d) == (True, "swapped offline")
    return res.end_offset


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(events=st.lists(st.one_of(data_st, data_st, end_st), min_size=1, max_size=30))
def test_transactions_cleaned_as_kafka(tmp_path_factory, events):
    d = write_txn_log(tmp_path_factory.mktemp("logs"), events)
    before = read_batches(d)
    hw = before[-1][0].next_offset
    # the last stable offset: the first offset of a transaction with no marker yet
    open_first: dict[int, int] = {}
    for h, _ in before:
        if h.is_transactional and h.producer_id in TXN_PIDS:
            if h.is_control:
                open_first.pop(h.producer_id, None)
            else:
                open_first.setdefault(h.producer_id, h.base_offset)
    lso = min(open_first.values(), default=hw)

    horizons_at = [NOW, NOW + 1, NOW + RETENTION + 2, NOW + 2 * RETENTION + 3]
    batches = before
    for now in horizons_at:
        end = _pass(d, now, hw)
        after = read_batches(d)
        if end:
            assert end <= lso  # never past an open transaction
        assert _data(after) == expected_data(batches, end, now)
        assert _markers(after) == expected_markers(batches, end, now)
        # an aborted batch below the range's end survives only as its producer's empty header
        aborted = aborted_offsets(_model_batches(batches))
        for h, recs in after:
            if not h.is_control and h.base_offset < end:
                assert not {r.offset for r in recs} & aborted
        batches = after

    assert_opens_without_recovery(d, hw)


def test_aborted_records_never_win_and_markers_go_after_the_horizon(tmp_path: Path) -> None:
    """A worked case: k0 committed, then written again by an aborted transaction, which must
    not win (the committed value stays); the abort marker stays while the aborted batch is
    there, then gets a horizon once it is gone, then goes; the commit markers stay while
    their transaction's batch does."""
    events = [
        ("data", 7, [(0, b"committed")], Codec.NONE),  # 0
        ("end", 7, True),  # 1 COMMIT
        ("data", 8, [(0, b"aborted"), (1, b"aborted")], Codec.GZIP),  # 2, 3
        ("data", -1, [(2, b"plain")], Codec.NONE),  # 4
        ("end", 8, False),  # 5 ABORT
        ("data", 9, [(5, b"idem")], Codec.NONE),  # 6: idempotent, not transactional
        ("data", 8, [(3, b"after")], Codec.NONE),  # 7: pid 8's next transaction, committed
        ("end", 8, True),  # 8 COMMIT
    ]
    d = write_txn_log(tmp_path, events, segment_bytes=150)
    before = read_batches(d)
    hw = before[-1][0].next_offset
    assert _pass(d, NOW, hw) == hw
    first = read_batches(d)
    assert _data(first) == [
        (0, b"k0", b"committed"),
        (4, b"k2", b"plain"),
        (6, b"k5", b"idem"),
        (7, b"k3", b"after"),
    ]
    # the aborted batch 2-3 went whole (pid 8's last data batch is 7); every marker had a
    # batch of its transaction in this pass: all stay, no horizon
    assert [h.base_offset for h, _ in first if not h.is_control] == [0, 4, 6, 7]
    assert _markers(first) == [(1, None), (5, None), (8, None)]

    assert _pass(d, NOW + 10, hw) == hw
    second = read_batches(d)
    # the COMMITs still follow their batches; the ABORT at 5 has nothing left
    assert _markers(second) == [(1, None), (5, NOW + 10 + RETENTION), (8, None)]
    assert _data(second) == _data(first)

    later = NOW + 10 + RETENTION + 1
    assert _pass(d, later, hw) == hw
    third = read_batches(d)
    assert _markers(third) == [(1, None), (8, None)]
    assert _data(third) == _data(first)


def test_open_transaction_bounds_the_cleanable_range(tmp_path: Path) -> None:
    events = [("data", -1, [(i % 2, b"v%d" % i)], Codec.NONE) for i in range(6)]
    events.insert(3, ("data", 7, [(0, b"open")], Codec.NONE))  # offset 3, no marker yet
    d = write_txn_log(tmp_path, events, segment_bytes=80)  # one or two batches per segment
    batches = read_batches(d)
    hw = batches[-1][0].next_offset
    plan = plan_cleaning(d, CleanerSettings(), now_ms=NOW, high_watermark=hw)
    assert plan.first_unstable_offset == 3
    assert plan.end_offset <= 3
    end = _pass(d, NOW, hw)
    assert end <= 3
    # nothing from the open transaction on was touched
    assert [t for t in _data(read_batches(d)) if t[0] >= 3] == [
        t for t in _data(batches) if t[0] >= 3
    ]
    # once it commits (marker below the high watermark), the range goes on past it
    log = Log.open(d, LogConfig.from_properties(_props(80)))
    log.append(
        build_control_batch(ControlType.COMMIT, producer_id=7, producer_epoch=0, timestamp=NOW)
    )
    log.roll()
    log.close()
    hw2 = read_batches(d)[-1][0].next_offset
    plan2 = plan_cleaning(d, CleanerSettings(), now_ms=NOW, high_watermark=hw2)
    assert plan2.first_unstable_offset is None and plan2.end_offset == hw2
    # a marker above the high watermark does not end the transaction
    plan3 = plan_cleaning(d, CleanerSettings(), now_ms=NOW, high_watermark=hw2 - 1)
    assert plan3.first_unstable_offset == 3
