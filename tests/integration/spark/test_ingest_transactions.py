"""Ingest of transactional logs (KIP-98): read_committed equals a READ_COMMITTED consumer.

Segments are written with the storage engine (``Log.append``) from ``build_batch`` data
batches and ``build_control_batch`` markers, as a transaction coordinator leaves them:
several producers' transactions interleaved, committed, aborted and still open, spanning
segments (small segments) and Spark tasks (small tasks). The expected ``records`` come from
:func:`consumer_view`, a plain model of what a READ_COMMITTED consumer returns (records of
committed transactions and non-transactional ones, below the last stable offset); the table
is read back with deltalake (no Spark), every row compared, duplicates included.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from logstore.protocol.batch import Codec, iter_batches
from logstore.protocol.control import ControlType, build_control_batch
from logstore.protocol.records import build_batch
from logstore.storage.checkpoints import write_offset_checkpoint
from logstore.storage.config import LogConfig
from logstore.storage.log import Log
from logstore.storage.txn_index import AbortedTxn
from pipelines.delta.staging import LEASE_TTL_ENV
from pipelines.ingest import IngestConfig, read_progress, run_ingest
from tests.conftest import ROOT
from tests.fixtures.jobs import spark_submit

pytestmark = pytest.mark.integration

BASE_MS = int(dt.datetime(2024, 5, 2, 10, tzinfo=dt.UTC).timestamp() * 1000)
TopicPartition = tuple[str, int]
Row = tuple[str, int, int, bytes, bytes]  # topic, partition, offset, key, value


@dataclass
class Entry:
    """One appended batch: ``kind`` "plain", "txn", "commit" or "abort"."""

    kind: str
    producer_id: int
    first: int
    rows: list[Row] = field(default_factory=list)


class TxnLogs:
    """A log dir written batch by batch; remembers every batch in offset order.

    ``index_aborts``: every ABORT marker's transaction also goes into the ``.txnindex`` of its
    segment, as a broker writes it (``Log.append`` alone writes no index entry)."""

    def __init__(self, root: Path, *, segment_bytes: int = 700, index_aborts: bool = False) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.config = LogConfig(segment_bytes=segment_bytes)
        self.logs: dict[TopicPartition, Log] = {}
        self.entries: dict[TopicPartition, list[Entry]] = {}
        self.seq = 0
        self.index_aborts = index_aborts
        self.txn_first: dict[tuple[TopicPartition, int], int] = {}

    def _log(self, tp: TopicPartition) -> Log:
        if tp not in self.logs:
            self.logs[tp] = Log.open(self.root / f"{tp[0]}-{tp[1]}", self.config)
            self.entries[tp] = []
        return self.logs[tp]

    def data(self, tp: TopicPartition, pid: int, n: int, *, txn: bool = True) -> None:
        """``n`` records of producer ``pid`` (transactional) or of no producer (plain)."""
        log = self._log(tp)
        self.seq += 1
        items = [
            (f"k{self.seq}-{i}".encode(), f"v{self.seq}-{i}-".encode() * 8, (), BASE_MS + i)
            for i in range(n)
        ]
        codec = Codec.LZ4 if self.seq % 3 == 0 else Codec.NONE
        if txn:
            batch = build_batch(items, codec=codec, producer_id=pid, producer_epoch=0,
                                base_sequence=0, is_transactional=True)  # fmt: skip
        else:
            batch = build_batch(items, codec=codec)
        info = log.append(batch)
        if txn:
            self.txn_first.setdefault((tp, pid), info.first_offset)
        rows = [
            (tp[0], tp[1], info.first_offset + i, k, v) for i, (k, v, _h, _t) in enumerate(items)
        ]
        self.entries[tp].append(Entry("txn" if txn else "plain", pid, info.first_offset, rows))

    def end(self, tp: TopicPartition, pid: int, *, commit: bool) -> None:
        """The COMMIT or ABORT marker of ``pid``'s transaction."""
        kind = ControlType.COMMIT if commit else ControlType.ABORT
        info = self._log(tp).append(
            build_control_batch(kind, producer_id=pid, producer_epoch=0, timestamp=BASE_MS)
        )
        self.entries[tp].append(Entry("commit" if commit else "abort", pid, info.first_offset))
        first = self.txn_first.pop((tp, pid), None)
        if self.index_aborts and not commit and first is not None:
            marker = info.first_offset
            self._log(tp).append_aborted_txn(AbortedTxn(pid, first, marker, marker + 1))

    def checkpoint(self, high_watermarks: dict[TopicPartition, int] | None = None) -> None:
        """Flush; the high watermarks are the log ends unless given."""
        hws = {tp: log.log_end_offset for tp, log in self.logs.items()}
        hws.update(high_watermarks or {})
        for log in self.logs.values():
            log.flush()
        write_offset_checkpoint(self.root / "replication-offset-checkpoint", hws)
        write_offset_checkpoint(
            self.root / "log-start-offset-checkpoint", dict.fromkeys(self.logs, 0)
        )
        self.hws = hws

    def close(self) -> None:
        for log in self.logs.values():
            log.close()


def consumer_view(
    logs: TxnLogs, *, committed: bool = True
) -> tuple[list[Row], dict[TopicPartition, int]]:
    """What a consumer of every partition from offset 0 up to the high watermark returns,
    and where it stops: READ_COMMITTED (a producer's records wait for its next marker, and
    reading stops at the first offset of a transaction still waiting: the LSO) or, with
    ``committed=False``, READ_UNCOMMITTED (every record, the high watermark)."""
    out: list[Row] = []
    stops: dict[TopicPartition, int] = {}
    for tp, entries in logs.entries.items():
        hw = logs.hws[tp]
        below = [e for e in entries if e.first < hw]
        if not committed:
            out += [r for e in below for r in e.rows]
            stops[tp] = hw
            continue
        visible: list[Row] = []
        waiting: dict[int, list[Row]] = {}
        for e in below:
            if e.kind == "plain":
                visible += e.rows
            elif e.kind == "txn":
                waiting.setdefault(e.producer_id, []).extend(e.rows)
            else:
                done = waiting.pop(e.producer_id, [])
                if e.kind == "commit":
                    visible += done
        lso = min((rows[0][2] for rows in waiting.values()), default=hw)
        out += [r for r in visible if r[2] < lso]
        stops[tp] = lso
    return sorted(out), stops


def lake_rows(lake: Path) -> list[Row]:
    """Every row of ``records`` (deltalake, no Spark), duplicates kept."""
    t = DeltaTable(str(lake / "records")).to_pyarrow_table(
        columns=["topic", "partition", "offset", "key", "value"]
    )
    return sorted(
        (r["topic"], r["partition"], r["offset"], r["key"], r["value"]) for r in t.to_pylist()
    )


def _config(logs: TxnLogs, lake: Path, **kw: object) -> IngestConfig:
    # tasks of a few pieces of a segment: transactions span segments, ranges and tasks
    return IngestConfig(log_dirs=(str(logs.root),), lake=str(lake), progress_interval_s=0,
                        max_partition_bytes=4096, **kw)  # fmt: skip


def _quiet(_msg: str) -> None:
    pass


@pytest.fixture
def logs(tmp_path: Path):  # type: ignore[no-untyped-def]
    d = TxnLogs(tmp_path / "logs")
    yield d
    d.close()


@pytest.fixture
def indexed(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Logs whose aborted transactions are in ``.txnindex`` files, as a broker leaves them
    (``pipelines.ingest.committed`` takes them as a prediction)."""
    d = TxnLogs(tmp_path / "indexed", index_aborts=True)
    yield d
    d.close()


P0, P1, PLAIN = ("pay", 0), ("pay", 1), ("plain", 0)


def _interleaved(logs: TxnLogs) -> None:
    """Committed, aborted and open transactions of several producers, interleaved."""
    logs.data(P0, 10, 3)
    logs.data(P0, -1, 2, txn=False)
    logs.data(P0, 11, 4)
    logs.data(P0, 10, 5)
    logs.data(P0, 12, 2)
    logs.end(P0, 11, commit=False)  # 11 aborted
    logs.data(P0, -1, 1, txn=False)
    for _ in range(4):
        logs.data(P0, 10, 6)  # 10's transaction spans segments
    logs.end(P0, 10, commit=True)  # 10 committed
    logs.data(P0, 12, 3)
    logs.data(P0, 13, 2)  # 13 stays open: the LSO of pay-0
    logs.end(P0, 12, commit=False)  # 12 aborted, above the LSO
    logs.data(P0, -1, 2, txn=False)
    logs.data(P0, 11, 2)  # 11's next transaction, open
    logs.data(P0, -1, 3, txn=False)
    logs.data(P1, 20, 4)
    logs.data(P1, 20, 4)
    logs.end(P1, 20, commit=True)
    logs.data(P1, 21, 3)
    logs.end(P1, 21, commit=False)
    logs.data(P1, -1, 2, txn=False)
    logs.data(PLAIN, -1, 5, txn=False)
    logs.data(PLAIN, -1, 5, txn=False)
    logs.checkpoint()


@pytest.mark.parametrize("index", [False, True], ids=["no-txnindex", "txnindex"])
def test_read_committed_is_the_consumer_view_exactly_once_across_runs(
    spark: SparkSession, tmp_path: Path, logs: TxnLogs, indexed: TxnLogs, index: bool
) -> None:
    """The same lake whether the aborted transactions' index predicts them or not."""
    logs = indexed if index else logs
    lake = tmp_path / "lake"
    _interleaved(logs)
    assert len(list((logs.root / "pay-0").glob("*.log"))) > 3  # several segments

    messages: list[str] = []
    s1 = run_ingest(spark, _config(logs, lake), log=messages.append)
    tasks = [m for m in messages if m.startswith("reading ")]
    assert tasks and int(tasks[0].split(" in ")[-1].split()[0]) > 2, messages  # many tasks
    want, stops = consumer_view(logs)
    assert lake_rows(lake) == want
    assert stops[P0] < logs.hws[P0] and stops[P1] == logs.hws[P1]  # pay-0 held at its LSO
    assert read_progress(lake / "records") == stops
    assert s1.held_at_lso == {"pay/0": stops[P0]}
    assert (s1.aborted_transactions, s1.open_transactions) == (3, 2)  # 11, 12, 21; 13, 11
    aborted = {r[3] for e in logs.entries[P0] if e.producer_id in (11, 12) for r in e.rows}
    assert not aborted & {r[3] for r in lake_rows(lake)}

    # the open transactions end (13 commits, 11 aborts), a new one opens, more plain records
    logs.end(P0, 13, commit=True)
    logs.data(P0, 10, 2)  # open again: the new LSO
    logs.end(P0, 11, commit=False)
    logs.data(P0, -1, 2, txn=False)
    logs.data(P1, 22, 2)
    logs.end(P1, 22, commit=True)
    logs.checkpoint()
    s2 = run_ingest(spark, _config(logs, lake), log=_quiet)
    want, stops = consumer_view(logs)
    assert lake_rows(lake) == want  # every committed record once: nothing lost, nothing twice
    assert read_progress(lake / "records") == stops
    assert s2.committed and s2.held_at_lso == {"pay/0": stops[P0]}

    logs.end(P0, 10, commit=True)
    logs.checkpoint()
    s3 = run_ingest(spark, _config(logs, lake), log=_quiet)
    want, stops = consumer_view(logs)
    assert stops == logs.hws and lake_rows(lake) == want
    assert read_progress(lake / "records") == logs.hws
    assert s3.held_at_lso == {} and s3.open_transactions == 0
    # everything committed was read: the uncommitted view minus the aborted transactions
    everything, _ = consumer_view(logs, committed=False)
    dropped = {r for e in logs.entries[P0] + logs.entries[P1]
               if e.kind == "txn" and e.producer_id in (11, 12, 21) for r in e.rows}  # fmt: skip
    assert want == sorted(set(everything) - dropped)

    s4 = run_ingest(spark, _config(logs, lake), log=_quiet)
    assert (s4.records, s4.committed) == (0, False)


def test_a_marker_above_the_high_watermark_ends_nothing_yet(
    spark: SparkSession, tmp_path: Path, logs: TxnLogs
) -> None:
    lake = tmp_path / "lake"
    logs.data(P0, -1, 2, txn=False)
    logs.data(P0, 5, 3)
    logs.data(P0, -1, 2, txn=False)
    logs.end(P0, 5, commit=True)
    marker = logs.entries[P0][-1].first
    logs.checkpoint({P0: marker})  # the marker is written but not yet below the watermark
    run_ingest(spark, _config(logs, lake), log=_quiet)
    want, stops = consumer_view(logs)
    assert stops[P0] == 2 and lake_rows(lake) == want and len(want) == 2
    assert read_progress(lake / "records") == {P0: 2}
    logs.checkpoint()
    run_ingest(spark, _config(logs, lake), log=_quiet)
    want, _ = consumer_view(logs)
    assert lake_rows(lake) == want and len(want) == 7


def test_read_uncommitted_takes_everything_below_the_high_watermark(
    spark: SparkSession, tmp_path: Path, logs: TxnLogs
) -> None:
    lake = tmp_path / "lake"
    _interleaved(logs)
    s = run_ingest(spark, _config(logs, lake, isolation="read_uncommitted"), log=_quiet)
    want, stops = consumer_view(logs, committed=False)
    assert lake_rows(lake) == want and stops == logs.hws
    assert read_progress(lake / "records") == logs.hws
    assert s.control_batches == 5 and s.held_at_lso == {} and s.aborted_transactions == 0


def _damage(logs: TxnLogs, tp: TopicPartition, base_offset: int) -> None:
    """Flip the last byte of the batch at ``base_offset``: its CRC no longer matches."""
    for path in sorted((logs.root / f"{tp[0]}-{tp[1]}").glob("*.log")):
        data = bytearray(path.read_bytes())
        for position, header in iter_batches(data):
            if header.base_offset == base_offset:
                data[position + header.size - 1] ^= 0xFF
                path.write_bytes(bytes(data))
                return
    raise AssertionError(f"no batch at offset {base_offset}")


def test_damage_above_the_lso_waits_with_the_open_transaction(
    spark: SparkSession, tmp_path: Path, logs: TxnLogs
) -> None:
    """Progress never passes the LSO, not even past an unreadable run behind it: the run
    that reads past the transaction reports (and quarantines) the damage."""
    lake = tmp_path / "lake"
    logs.data(P0, -1, 2, txn=False)
    logs.data(P0, 5, 3)
    logs.data(P0, -1, 2, txn=False)
    logs.data(P0, -1, 2, txn=False)
    damaged = logs.entries[P0][-1]
    logs.data(P0, -1, 2, txn=False)
    logs.end(P0, 5, commit=True)
    marker = logs.entries[P0][-1].first
    logs.checkpoint({P0: marker})  # the commit is not below the watermark yet: 5 is open
    _damage(logs, P0, damaged.first)
    s1 = run_ingest(spark, _config(logs, lake), log=_quiet)
    assert read_progress(lake / "records") == {P0: 2}
    assert (s1.skipped_offsets, s1.quarantined, s1.held_at_lso) == (0, 0, {"pay/0": 2})
    logs.checkpoint()
    s2 = run_ingest(spark, _config(logs, lake), log=_quiet)
    want, _ = consumer_view(logs)
    assert lake_rows(lake) == [r for r in want if r not in damaged.rows]
    assert (s2.skipped_offsets, s2.quarantined) == (2, 1)
    assert read_progress(lake / "records") == logs.hws


def _spark_jobs(spark: SparkSession) -> int:
    """Spark jobs the session has run so far (its status store, after the listener bus has
    delivered every event)."""
    sc = spark.sparkContext._jsc.sc()  # type: ignore[union-attr]
    sc.listenerBus().waitUntilEmpty(10_000)
    return int(sc.statusStore().jobsList(None).size())


def test_a_log_without_aborted_or_open_transactions_is_read_in_one_spark_job(
    spark: SparkSession, tmp_path: Path, logs: TxnLogs
) -> None:
    """No pre-pass: plain records and committed transactions need no mask and no cut, so the
    records pass alone is exact (pipelines.ingest.committed)."""
    lake = tmp_path / "lake"
    for _ in range(3):
        logs.data(PLAIN, -1, 5, txn=False)
    logs.data(P1, -1, 3, txn=False)
    logs.data(P1, 30, 4)
    logs.data(P1, -1, 2, txn=False)
    logs.data(P1, 30, 4)
    logs.end(P1, 30, commit=True)
    logs.data(P1, -1, 2, txn=False)
    logs.checkpoint()
    before = _spark_jobs(spark)
    s = run_ingest(spark, _config(logs, lake), log=_quiet)
    assert _spark_jobs(spark) - before == 1
    want, stops = consumer_view(logs)
    assert stops == logs.hws and lake_rows(lake) == want and len(want) == 30
    assert read_progress(lake / "records") == logs.hws
    assert (s.aborted_transactions, s.open_transactions, s.held_at_lso) == (0, 0, {})
    assert (s.txn_reread_partitions, s.txn_reread_seconds) == (0, 0.0)
    assert s.records == 30 and s.control_batches == 1


def test_a_transaction_late_in_a_range_is_read_again_exactly(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Only the end of a long range holds transactions (an aborted one, then one still open):
    the optimistic pass finds them and re-reads only that partition's tasks; the lake is the
    READ_COMMITTED view, each record once, the partition held at its LSO."""
    logs = TxnLogs(tmp_path / "big-segments", segment_bytes=1 << 20)  # one range a partition
    lake = tmp_path / "lake"
    try:
        for _ in range(40):
            logs.data(P0, -1, 20, txn=False)
            logs.data(PLAIN, -1, 20, txn=False)
        logs.data(P0, 40, 5)
        logs.data(P0, -1, 3, txn=False)
        logs.end(P0, 40, commit=False)  # aborted, after 800 plain records
        logs.data(P0, 41, 4)
        logs.data(P0, -1, 3, txn=False)  # above 41's first offset: waits with it
        logs.checkpoint()
        assert len(list((logs.root / "pay-0").glob("*.log"))) == 1
        config = dataclasses.replace(_config(logs, lake), max_partition_bytes=128 << 20)
        before = _spark_jobs(spark)
        messages: list[str] = []
        s = run_ingest(spark, config, log=messages.append)
        assert _spark_jobs(spark) - before == 2, messages  # the pass and one re-read
        reread = [m for m in messages if "read again" in m]
        assert len(reread) == 1 and "of 1 partitions" in reread[0], messages
        want, stops = consumer_view(logs)
        assert stops[P0] == logs.entries[P0][-2].first < logs.hws[P0]
        assert lake_rows(lake) == want and len(want) == 800 + 3 + 800
        assert read_progress(lake / "records") == stops
        assert (s.aborted_transactions, s.open_transactions) == (1, 1)
        assert s.held_at_lso == {"pay/0": stops[P0]} and s.txn_reread_partitions == 1
        assert s.records == len(want)
    finally:
        logs.close()


def test_an_open_transaction_at_the_end_rereads_only_the_tasks_that_reach_it(
    spark: SparkSession, tmp_path: Path, logs: TxnLogs
) -> None:
    """A streaming exactly-once producer between two commits: plain and committed records
    all along pay-0, one transaction open at its end. Only the tasks whose batches reach the
    open transaction are read again (pipelines.ingest.committed._tasks_to_reread), not the
    partition's; the lake is the READ_COMMITTED view and the partition waits at its LSO."""
    lake = tmp_path / "lake"
    for i in range(30):
        logs.data(P0, -1, 4, txn=False)
        if i % 5 == 0:
            logs.data(P0, 50 + i, 3)
            logs.end(P0, 50 + i, commit=True)
    logs.data(P0, 90, 3)  # open at the high watermark
    logs.data(P0, -1, 2, txn=False)
    logs.checkpoint()
    messages: list[str] = []
    before = _spark_jobs(spark)
    s = run_ingest(spark, _config(logs, lake), log=messages.append)
    # the pass, and a re-read unless the tasks to read again lie wholly at or above the LSO
    assert _spark_jobs(spark) - before in (1, 2), messages
    (planned,) = [m for m in messages if m.startswith("reading ")]
    total = int(planned.split(" in ")[1].split()[0])
    (reread,) = [m for m in messages if "read again" in m]
    again = int(reread.split("read_committed: ")[1].split()[0])
    assert 1 <= again < total // 2, messages  # the tail, not the partition's dozens of tasks
    assert "of 1 partitions" in reread
    want, stops = consumer_view(logs)
    assert stops[P0] == logs.entries[P0][-2].first < logs.hws[P0]
    assert lake_rows(lake) == want and len(want) == 30 * 4 + 6 * 3
    assert read_progress(lake / "records") == stops
    assert (s.aborted_transactions, s.open_transactions, s.txn_reread_partitions) == (0, 1, 1)
    assert s.records == len(want)


def test_a_run_killed_between_its_two_reads_leaves_the_lake_as_it_was(
    tmp_path: Path, logs: TxnLogs
) -> None:
    """The session SIGKILLed after the first pass found aborted and open transactions and
    discarded those tasks' files, before the second read: nothing committed, its files in no
    snapshot; the next run (the dead write's lease expired) removes them and is exact."""
    lake = tmp_path / "lake"
    _interleaved(logs)
    # small tasks (as _config's): plain-0's are not among those read again
    conf = tmp_path / "pipeline.toml"
    shipped = (ROOT / "conf" / "pipeline.toml").read_text()
    small = shipped.replace("max_partition_bytes = 134217728", "max_partition_bytes = 4096")
    assert small != shipped
    conf.write_text(small)
    args = ["--config", str(conf), "--log-dirs", str(logs.root), "--lake", str(lake)]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable, LEASE_TTL_ENV: "3"}  # fmt: skip
    killed = spark_submit("ingest.py", args, failpoint="ingest.before_reread", env=env)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    left = sorted((lake / "records").rglob("part-*.parquet"))
    assert left, "the first pass's files of the partitions without aborted transactions"
    assert not DeltaTable.is_deltatable(str(lake / "records"))

    time.sleep(3 + 2 + 1.5)  # the killed run's lease expires (ttl + margin, whole seconds)
    ok = spark_submit("ingest.py", args, env=env)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "data files of earlier runs that were killed before commit" in ok.stdout + ok.stderr
    assert not any(p.exists() for p in left)
    want, stops = consumer_view(logs)
    assert lake_rows(lake) == want and read_progress(lake / "records") == stops


def _aborts_all_through(logs: TxnLogs) -> None:
    """pay-0: transactions of three producers all along, every third aborted, plain records
    between; nothing open at the end."""
    for i in range(24):
        pid = 30 + i % 3
        logs.data(P0, pid, 3)
        logs.data(P0, -1, 2, txn=False)
        logs.data(P0, pid, 2)
        logs.end(P0, pid, commit=i % 3 != 0)
    logs.data(PLAIN, -1, 5, txn=False)
    logs.checkpoint()


def test_aborts_that_the_txnindex_predicts_need_no_second_read(
    spark: SparkSession, tmp_path: Path, indexed: TxnLogs
) -> None:
    """Aborted transactions all through a partition whose segments' ``.txnindex`` files list
    them: the records pass is masked with them, the walk confirms them, one Spark job."""
    _aborts_all_through(indexed)
    assert any(p.stat().st_size for p in (indexed.root / "pay-0").glob("*.txnindex"))
    lake = tmp_path / "lake"
    messages: list[str] = []
    before = _spark_jobs(spark)
    s = run_ingest(spark, _config(indexed, lake), log=messages.append)
    assert _spark_jobs(spark) - before == 1, messages
    assert any("predicted the aborted transactions of 1 partitions, 1 exactly" in m
               for m in messages), messages  # fmt: skip
    want, stops = consumer_view(indexed)
    assert stops == indexed.hws and lake_rows(lake) == want
    assert (s.aborted_transactions, s.txn_reread_partitions) == (8, 0)


def _ingest_reads_one_partition_again(
    spark: SparkSession, tmp_path: Path, indexed: TxnLogs
) -> None:
    """Ingest ``indexed`` after one partition's index went wrong: the log line says the
    prediction missed, that partition is read again, and the lake is the consumer view."""
    lake = tmp_path / "lake"
    messages: list[str] = []
    s = run_ingest(spark, _config(indexed, lake), log=messages.append)
    assert any("1 partitions, 0 exactly" in m for m in messages), messages
    want, stops = consumer_view(indexed)
    assert stops == indexed.hws and lake_rows(lake) == want
    assert s.aborted_transactions == 8 and s.txn_reread_partitions == 1


def test_a_wrong_txnindex_costs_a_second_read_never_a_record(
    spark: SparkSession, tmp_path: Path, indexed: TxnLogs
) -> None:
    """An index that lies (a committed transaction listed as aborted, an aborted one left
    out): the walk finds both differences, the tasks in reach are read again with the walk's
    ranges, and the lake is the consumer view: nothing dropped, nothing aborted kept."""
    _aborts_all_through(indexed)
    data, marker = indexed.entries[P0][4], indexed.entries[P0][7]  # the second transaction
    assert (data.kind, marker.kind, data.producer_id) == ("txn", "commit", marker.producer_id)
    indexed.logs[P0].append_aborted_txn(AbortedTxn(data.producer_id, data.first, marker.first, 0))
    listed = [p for p in sorted((indexed.root / "pay-0").glob("*.txnindex")) if p.stat().st_size]
    listed[-1].write_bytes(b"")  # the aborted transactions of the last such segment: left out
    indexed.checkpoint()
    _ingest_reads_one_partition_again(spark, tmp_path, indexed)


def test_a_damaged_txnindex_predicts_nothing_and_the_walk_decides(
    spark: SparkSession, tmp_path: Path, indexed: TxnLogs
) -> None:
    """A torn ``.txnindex`` (a partial entry at its end): that file predicts nothing, the
    walk finds its aborted transactions, the tasks in reach are read again; the lake is exact."""
    _aborts_all_through(indexed)
    listed = [p for p in sorted((indexed.root / "pay-0").glob("*.txnindex")) if p.stat().st_size]
    with listed[0].open("ab") as f:
        f.write(b"\x00" * 7)  # no longer a multiple of the 34-byte entry
    _ingest_reads_one_partition_again(spark, tmp_path, indexed)
