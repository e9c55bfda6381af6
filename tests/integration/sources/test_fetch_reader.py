"""The Fetch reader (:mod:`pipelines.sources.fetch`) against a real broker: the records read
through Fetch equal, row for row, the records read from the same partitions' segment files
(every codec, transactions with aborts, tombstones, headers), small responses included."""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa
import pytest

from logstore.errors import InvalidTopicError
from pipelines.sources.fetch import FetchError, FetchRange, plan_fetch_ranges, read_fetch_range
from pipelines.sources.plan import MAX_OFFSET, MIN_OFFSET, SourceOptions, plan_ranges
from pipelines.sources.read import RangeReport, read_records, read_txn_frames
from pipelines.sources.transactions import TxnEvents, resolve
from tests.integration.sources.traffic import CODECS, PARTITIONS, produce_all

pytestmark = pytest.mark.integration

FILE_COLUMNS = ("segment_base_offset", "batch_position")


@pytest.fixture(scope="module")
def produced(broker: Any) -> tuple[Any, str, int]:
    topic, n = produce_all(broker.bootstrap)
    return broker, topic, n


def _from_log_dir(log_dir: str, topic: str, until: dict[int, int]) -> pa.Table:
    opts = SourceOptions(log_dirs=(log_dir,), topics=frozenset([topic]), until={topic: until})
    ranges = plan_ranges(opts)
    events: dict[int, list[TxnEvents]] = {}
    for rng in ranges:
        events.setdefault(rng.partition, []).append(TxnEvents.of(*read_txn_frames(rng)))
    aborted = {p: resolve(TxnEvents.concat(evs)).aborted for p, evs in events.items()}
    batches = [
        b
        for rng in ranges
        for b in read_records(
            rng, min_timestamp=MIN_OFFSET, max_timestamp=MAX_OFFSET, aborted=aborted[rng.partition]
        )
    ]
    return pa.Table.from_batches(batches)


def _through_fetch(
    ranges: list[FetchRange], *, max_bytes: int
) -> tuple[pa.Table, list[RangeReport]]:
    batches, reports = [], []
    for rng in ranges:
        report = RangeReport(rng.topic, rng.partition)
        batches.extend(
            read_fetch_range(
                rng,
                min_timestamp=MIN_OFFSET,
                max_timestamp=MAX_OFFSET,
                max_bytes=max_bytes,
                report=report,
            )
        )
        reports.append(report)
    return pa.Table.from_batches(batches), reports


def _rows(table: pa.Table) -> pa.Table:
    return table.drop_columns(list(FILE_COLUMNS)).sort_by([("partition", "ascending"),
                                                           ("offset", "ascending")])  # fmt: skip


@pytest.mark.parametrize("max_bytes", [1 << 20, 3000])
def test_fetch_reads_what_the_segments_hold(produced: Any, max_bytes: int) -> None:
    broker, topic, want = produced
    ranges, bounds = plan_fetch_ranges(broker.bootstrap, topics=[topic], max_offsets=97)
    assert sorted(p for _t, p in bounds) == list(range(PARTITIONS))
    assert all(r.until - r.start_offset <= 97 for r in ranges)
    fetched, reports = _through_fetch(ranges, max_bytes=max_bytes)
    assert fetched.num_rows == want  # the aborted transactions left out, nothing else
    assert not [d for r in reports for d in r.damaged]
    assert set(fetched.column("segment_base_offset").to_pylist()) == {-1}
    local = _from_log_dir(
        str(broker.log_dir), topic, {p: lso for (_t, p), (_s, lso) in bounds.items()}
    )
    assert _rows(fetched).equals(_rows(local))
    assert sorted(set(local.column("codec").to_pylist())) == sorted(CODECS)
    values = fetched.column("value").to_pylist()
    assert None in values  # tombstones
    assert not any(v is not None and v.startswith(b"txn-1-") for v in values)  # aborted
    assert any(v is not None and v.startswith(b"txn-2-") for v in values)  # committed
    # each range ends where the next of its partition starts: the reports' offsets chain
    for rng, rep in zip(ranges, reports, strict=True):
        assert rep.next_offset is not None and rep.next_offset >= rng.until - 1


def test_fetch_from_an_offset_and_errors(produced: Any) -> None:
    broker, topic, _want = produced
    ranges, bounds = plan_fetch_ranges(broker.bootstrap, topics=[topic], starts={(topic, 1): 40})
    first = [r for r in ranges if r.partition == 1]
    assert first[0].start_offset == 40
    table, _ = _through_fetch(first, max_bytes=1 << 20)
    assert min(table.column("offset").to_pylist()) == 40
    assert max(table.column("offset").to_pylist()) < bounds[(topic, 1)][1]
    with pytest.raises(InvalidTopicError, match="does not exist"):
        plan_fetch_ranges(broker.bootstrap, topics=["no-such-topic-fetchsrc"])
    beyond = FetchRange(topic, 0, bounds[(topic, 0)][1] + 5, bounds[(topic, 0)][1] + 10,
                        broker.bootstrap)  # fmt: skip
    with pytest.raises(FetchError, match="OFFSET_OUT_OF_RANGE"):
        list(read_fetch_range(beyond, min_timestamp=MIN_OFFSET, max_timestamp=MAX_OFFSET))


def test_read_uncommitted_sees_the_aborted_transactions(produced: Any) -> None:
    broker, topic, want = produced
    ranges, _ = plan_fetch_ranges(broker.bootstrap, topics=[topic], isolation=0)
    assert {r.isolation for r in ranges} == {0}
    table, _ = _through_fetch(ranges, max_bytes=1 << 20)
    assert table.num_rows == want + 60  # the two aborted transactions of 30 records
    values = table.column("value").to_pylist()
    assert sum(1 for v in values if v is not None and v.startswith(b"txn-1-")) == 26


def test_a_broker_restart_during_a_read_is_retried(broker_factory: Any) -> None:
    b = broker_factory()
    topic, want = produce_all(b.bootstrap)
    ranges, _ = plan_fetch_ranges(b.bootstrap, topics=[topic])
    b.stop()
    restarted = threading.Timer(0.5, b.start)
    restarted.start()
    try:
        table, _ = _through_fetch(ranges, max_bytes=1 << 20)  # connection refused at first
    finally:
        restarted.join()
    assert table.num_rows == want
