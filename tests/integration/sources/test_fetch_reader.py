"""The Fetch reader (:mod:`pipelines.sources.fetch`) against a real broker: the records read
through Fetch equal, row for row, the records read from the same partitions' segment files
(every codec, transactions with aborts, tombstones, headers), small responses included."""

from __future__ import annotations

from typing import Any

import confluent_kafka as ck
import pyarrow as pa
import pytest

from pipelines.sources.fetch import FetchError, FetchRange, plan_fetch_ranges, read_fetch_range
from pipelines.sources.plan import MAX_OFFSET, MIN_OFFSET, SourceOptions, plan_ranges
from pipelines.sources.read import RangeReport, read_records, read_txn_frames
from pipelines.sources.transactions import TxnEvents, resolve
from tests.integration.broker.clients import ck_produce, make_records, new_topic

pytestmark = pytest.mark.integration

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
PARTITIONS = 3
FILE_COLUMNS = ("segment_base_offset", "batch_position")


def _txn_produce(bootstrap: str, topic: str) -> tuple[int, int]:
    """Committed and aborted transactions on every partition: (committed, aborted) counts."""
    p = ck.Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"fetch-{topic}",
            "compression.type": "lz4",
            "linger.ms": 5,
        }
    )
    p.init_transactions(30)
    committed = aborted = 0
    for round_ in range(4):
        p.begin_transaction()
        for i in range(30):
            p.produce(
                topic, key=b"t%d" % i, value=None if i % 9 == 0 else b"txn-%d-%d" % (round_, i),
                partition=i % PARTITIONS, headers=[("round", b"%d" % round_)],
            )  # fmt: skip
        p.flush(30)
        if round_ % 2:
            p.abort_transaction(30)
            aborted += 30
        else:
            p.commit_transaction(30)
            committed += 30
    return committed, aborted


@pytest.fixture(scope="module")
def produced(broker: Any) -> tuple[Any, str, int]:
    topic = new_topic(broker.bootstrap, partitions=PARTITIONS, prefix="fetchsrc")
    n = 0
    for seed, codec in enumerate(CODECS):
        records = make_records(150, partitions=PARTITIONS, seed=seed)
        ck_produce(broker.bootstrap, topic, records, codec=codec, acks="all", idempotent=True,
                   flush_every=25)  # fmt: skip
        n += len(records)
    committed, _aborted = _txn_produce(broker.bootstrap, topic)
    ck_produce(broker.bootstrap, topic, make_records(60, partitions=PARTITIONS, seed=99),
               codec="zstd", acks="all", idempotent=False)  # fmt: skip
    return broker, topic, n + committed + 60


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
    with pytest.raises(FetchError, match="does not exist"):
        plan_fetch_ranges(broker.bootstrap, topics=["no-such-topic-fetchsrc"])
    beyond = FetchRange(topic, 0, bounds[(topic, 0)][1] + 5, bounds[(topic, 0)][1] + 10,
                        broker.bootstrap)  # fmt: skip
    with pytest.raises(FetchError, match="OFFSET_OUT_OF_RANGE"):
        list(read_fetch_range(beyond, min_timestamp=MIN_OFFSET, max_timestamp=MAX_OFFSET))
