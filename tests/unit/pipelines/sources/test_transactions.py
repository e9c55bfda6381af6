"""Aborted ranges and the last stable offset from transaction events, against a plain model.

The model walks one partition's batches in offset order, one Python step per batch, the way a
READ_COMMITTED consumer judges them: a producer's transactional batches wait for its next
marker, which commits or aborts them all; what is still waiting at the end is open. The code
under test (numpy, events compacted per range, ranges in any order) must agree with it on
random logs, and the executors' mask must drop exactly the aborted batches.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from logstore.errors import LoglakeError
from logstore.protocol.control import ControlType, build_control_batch
from logstore.protocol.records import build_batch
from pipelines.decode.batches import scan_batches
from pipelines.decode.transactions import (
    KIND_ABORT,
    KIND_COMMIT,
    KIND_DATA,
    KIND_OTHER,
    marker_types,
    txn_frames,
)
from pipelines.ingest import load_config
from pipelines.sources.transactions import AbortedRanges, TxnEvents, resolve

Batch = tuple[int, int, int, int]  # producer, kind, first, last


def _random_log(seed: int) -> list[Batch]:
    """Batches in offset order: transactional data of 4 producers, their markers, and
    non-transactional batches (producer -1, left out of events as the reader leaves them)."""
    rnd = random.Random(seed)
    out: list[Batch] = []
    offset = rnd.randrange(0, 50)
    for _ in range(rnd.randrange(0, 60)):
        pid = rnd.choice([1, 2, 3, 4])
        roll = rnd.random()
        if roll < 0.6:
            n = rnd.randrange(1, 4)
            out.append((pid, KIND_DATA, offset, offset + n - 1))
            offset += n
        elif roll < 0.9:
            out.append((pid, rnd.choice([KIND_COMMIT, KIND_ABORT]), offset, offset))
            offset += 1
        else:
            offset += rnd.randrange(1, 5)  # a non-transactional batch
    return out


def _model(log: list[Batch]) -> tuple[set[int], int | None]:
    """(base offsets of aborted data batches, first offset of the earliest open txn)."""
    waiting: dict[int, list[int]] = {}
    aborted: set[int] = set()
    for pid, kind, first, _last in log:
        if kind == KIND_DATA:
            waiting.setdefault(pid, []).append(first)
        else:
            done = waiting.pop(pid, [])
            if kind == KIND_ABORT:
                aborted.update(done)
    open_from = min((b[0] for b in waiting.values()), default=None)
    return aborted, open_from


def _events(batches: list[Batch]) -> TxnEvents:
    return TxnEvents.of(*(zip(*batches, strict=True) if batches else ([], [], [], [])))


@pytest.mark.parametrize("seed", range(200))
def test_resolve_and_mask_agree_with_the_model(seed: int) -> None:
    log = _random_log(seed)
    rnd = random.Random(seed)
    # cut into "ranges" at random, compact each, hand them over in a shuffled order
    cuts = sorted(rnd.sample(range(len(log) + 1), min(3, len(log) + 1)))
    pieces = [log[a:b] for a, b in zip([0, *cuts], [*cuts, len(log)], strict=True)]
    parts = [_events(p).compact() for p in pieces]
    rnd.shuffle(parts)
    found = resolve(TxnEvents.concat(parts))
    aborted, open_from = _model(log)
    assert found.open_from == open_from
    data = [b for b in log if b[1] == KIND_DATA]
    pid = np.array([b[0] for b in data], np.int64)
    base = np.array([b[2] for b in data], np.int64)
    mask = found.aborted.mask(pid, base, np.ones(len(data), np.bool_))
    assert {b[2] for b, m in zip(data, mask.tolist(), strict=True) if m} == aborted
    # non-transactional batches are never masked, whatever their producer or offset
    assert not found.aborted.mask(pid, base, np.zeros(len(data), np.bool_)).any()


def test_mask_against_brute_force_with_overlapping_producers() -> None:
    ranges = AbortedRanges.of([5, 5, 9, 2], [10, 40, 12, 0], [20, 45, 30, 100])
    rnd = np.random.default_rng(1)
    pid = rnd.choice([2, 5, 9, 11], 500).astype(np.int64)
    base = rnd.integers(0, 120, 500)
    txn = rnd.random(500) < 0.8
    want = np.array(
        [
            bool(t) and any(p == rp and lo <= b <= hi for rp, lo, hi in
                            zip(ranges.producer_id, ranges.first, ranges.last, strict=True))
            for p, b, t in zip(pid, base, txn, strict=True)
        ]
    )  # fmt: skip
    assert (ranges.mask(pid, base, txn) == want).all()
    # a task gets only the ranges reaching its segment: same answer for batches inside it
    inside = (base >= 15) & (base < 42)
    part = ranges.overlapping(15, 42)
    assert len(part) == 4
    assert (part.mask(pid, base, txn)[inside] == want[inside]).all()
    assert len(ranges.overlapping(46, 100)) == 1


def test_txn_frames_reads_markers_from_the_bytes() -> None:
    """Data and markers written as a coordinator writes them; a non-transactional batch and
    a control batch of another type are no transaction events."""
    batches = [
        build_batch([(b"k", b"v")] * 3, base_offset=0, producer_id=7, producer_epoch=0,
                    base_sequence=0, is_transactional=True),
        build_batch([(b"k", b"v")], base_offset=3),
        build_control_batch(ControlType.ABORT, producer_id=7, producer_epoch=0, timestamp=1,
                            base_offset=4),
        build_batch([(b"k", b"v")] * 2, base_offset=5, producer_id=8, producer_epoch=0,
                    base_sequence=0, is_transactional=True),
        build_control_batch(ControlType.COMMIT, producer_id=8, producer_epoch=3, timestamp=1,
                            base_offset=7),
    ]  # fmt: skip
    buf = np.frombuffer(b"".join(bytes(b) for b in batches), np.uint8)
    scan = scan_batches(buf)
    pid, kind, first, last = txn_frames(
        buf, scan, np.ones(len(scan), np.bool_), min_offset=0, until=100
    )
    assert pid.tolist() == [7, 7, 8, 8]
    assert kind.tolist() == [KIND_DATA, KIND_ABORT, KIND_DATA, KIND_COMMIT]
    assert first.tolist() == [0, 4, 5, 7] and last.tolist() == [2, 4, 6, 7]
    # the offset window: a marker at or above ``until`` is not stable yet
    pid, kind, *_ = txn_frames(buf, scan, np.ones(len(scan), np.bool_), min_offset=1, until=7)
    assert kind.tolist() == [KIND_DATA, KIND_ABORT, KIND_DATA]


def test_a_kraft_control_batch_is_no_transaction_marker(kafka_real: Path) -> None:
    """A real broker's __cluster_metadata log: one control batch (a KRaft type, not
    transactional) among 5,743 batches; it neither commits nor aborts anything."""
    path = kafka_real / "cdc-lakehouse-pipeline/kafka-data/__cluster_metadata-0"
    buf = np.fromfile(path / "00000000000000000000.log", np.uint8)
    scan = scan_batches(buf)
    assert int(scan.is_control.sum()) == 1
    assert marker_types(buf, scan, np.flatnonzero(scan.is_control)).tolist() == [KIND_OTHER]
    frames = txn_frames(buf, scan, np.ones(len(scan), np.bool_), min_offset=0, until=2**62)
    assert all(len(column) == 0 for column in frames)


def test_isolation_key_is_read_and_checked(tmp_path: Path) -> None:
    conf = tmp_path / "p.toml"
    conf.write_text('[paths]\nlog_dirs = ["/l"]\nlake = "/k"\n')
    assert load_config(conf).isolation == "read_committed"
    conf.write_text(
        '[paths]\nlog_dirs = ["/l"]\nlake = "/k"\n[ingest]\nisolation = "read_uncommitted"\n'
    )
    assert load_config(conf).isolation == "read_uncommitted"
    conf.write_text('[paths]\nlog_dirs = ["/l"]\nlake = "/k"\n[ingest]\nisolation = "committed"\n')
    with pytest.raises(
        LoglakeError, match='isolation = "committed": expected one of read_committed'
    ):
        load_config(conf)
