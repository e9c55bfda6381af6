"""``read_committed`` ingest from log dirs in one pass when no transaction needs a second.

A ``read_committed`` run must leave out the records of aborted transactions and stop each
partition at its last stable offset (LSO); which batches those are is decided by looking
*forward* from each transactional batch to its producer's next marker
(:mod:`pipelines.sources.transactions`), so it is not known before the range has been read.
Until 11-28 a pre-pass (a Spark job of its own over the same ranges, on by default since
11-24) found them first; it cost +11-16% of every run (CPU and wall), also of the usual runs
over logs without a single transactional batch. Here the run reads **optimistically**:

1. the records pass runs as under ``read_uncommitted`` (no aborted ranges, up to the high
   watermark), and each segment range's report also carries the transaction events its walk
   met (``collect_txn`` of :func:`pipelines.ingest.tasks._read_ranges`: the transactional
   data batches and ABORT/COMMIT markers among its sound frames, compacted per producer —
   exactly what the pre-pass's walk returned for that range, taken from the same chunks
   before any record is decoded: a few numpy operations over each chunk's headers);
2. the driver resolves each partition's events (:func:`~pipelines.sources.transactions.
   resolve`, as after the pre-pass). A partition with **no aborted transaction and none
   open** — no transactional batch at all, or only committed transactions — is done: the
   pre-pass would have found the same nothing, and the precise pass would have read the very
   ranges just read, with nothing masked and nothing cut. That is every partition of most
   runs: one Spark job, nothing extra but the event collection;
3. only when some partition holds an aborted or an open transaction, the tasks that read
   its batches in reach of an aborted transaction or at or above its LSO
   (:func:`_tasks_to_reread`; the others' output is already what the precise read gives) are
   **discarded** (their staged files removed before anything is
   committed, :meth:`~pipelines.delta.direct.StagedWrite.discard_tasks`, with their reports)
   and read again in a second job into the same staged write: those partitions' ranges cut
   at their LSO and with their aborted ranges masked (the events of step 1 are already the
   pre-pass's result: no pre-pass job), the other ranges of those tasks read again as they
   were. Such a run costs about one more read of the affected tasks (see below), which the
   run reports (``txn_reread_partitions``, ``txn_reread_seconds``).

**The transaction indexes as a prediction.** Kafka's brokers (and ours) write every aborted
transaction into the ``.txnindex`` of the segment holding its ABORT marker: ``(producer,
first offset, marker offset)``, exactly the aborted range :func:`~pipelines.sources.
transactions.resolve` finds. Step 1 reads those files first (:func:`indexed_aborts`, on the
driver, O(aborted transactions)) and masks the records pass with them; step 3 compares them
with what the walk found (:func:`_matches`): a partition whose prediction is exact needs no
second read for its aborted transactions (only its tasks at the LSO, if one is open). A
prediction that differs in any range (an index missing, damaged, stale, or a transaction that
began below the run's window) sends the tasks in reach of either side's ranges to the second
read, with the walk's ranges: the walk stays the judge, the index only saves the re-read.

Measured (11-28, local[2], load 0.5-3.4; ``tests/perf/bench_ingest.py --paired-isolation
read_uncommitted``, 10M x 100 B, each read_committed run paired with a read_uncommitted one):
read_committed / read_uncommitted CPU-seconds median 0.97-1.00, wall 0.97-1.01 (lz4 and
none); the pre-pass design in the same setting: CPU 1.14-1.15, wall 1.13-1.15.
``tests/perf/bench_ingest_txn.py`` (2M records in transactions of 5 batches, every tenth
aborted, the last one open; load 0.1-0.5): without the prediction 1.8-2.4x the plain log's
read_uncommitted time (every task read twice, the second read 46-51% of the run; the pre-pass
design: 1.31x); with the segments' ``.txnindex`` as a broker leaves them **1.06x** (0.38 s
against 0.66 s without; only the tail at the open transaction read again). Only the tasks
whose batches reach a mispredicted aborted transaction or the LSO are read again, so a
partition whose producers merely keep a transaction open at the end (a streaming exactly-once
producer between two commits) re-reads its last tasks, not the partition.

Exactness: the committed files are those of tasks whose ranges needed no cut and no mask, or
were masked with exactly the walk's aborted ranges (identical to what the two-pass design
wrote either way), plus the precise re-read; the reports
that set progress and quarantine damage are those of the same tasks. Crash behaviour is that
of any staged write: a run killed before, between or during the two jobs leaves only
unreferenced files of its write (reaped by a later run once its lease expired) and progress
unchanged (crash test: ``LOGLAKE_FAILPOINT=ingest.before_reread`` kills the session after
step 3 discarded the affected tasks' files, before their second read). The ranges from the
tier (``pipelines.sources.tier``, judged by the broker's own ``read_committed`` listing) and
the Fetch path (the broker filters) are not affected.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from logstore.errors import LoglakeError
from logstore.failpoints import failpoint, kill_session
from logstore.storage.files import TXN_INDEX_SUFFIX
from logstore.storage.txn_index import decode_entries
from pipelines.delta.direct import StagedWrite
from pipelines.ingest.config import IngestSummary, Log, TopicPartition
from pipelines.ingest.tasks import _with_aborted
from pipelines.sources.plan import SegmentRange
from pipelines.sources.transactions import AbortedRanges, PartitionTxns, TxnEvents, resolve

__all__ = ["Stage", "cut_at_lso", "indexed_aborts", "stage_committed"]

# stage(tasks, collect_txn=..., into=...): stage_records of the run with its reader
Stage = Callable[..., StagedWrite]


def cut_at_lso(
    ranges: Sequence[SegmentRange], txns: Mapping[TopicPartition, PartitionTxns]
) -> list[SegmentRange]:
    """``ranges`` cut at their partition's LSO (ranges wholly at or above it dropped)."""
    out = []
    for r in ranges:
        found = txns.get((r.topic, r.partition))
        lso = r.until if found is None else found.lso(r.until)
        if r.start_offset >= lso or r.segment_base_offset >= lso:
            continue
        out.append(dataclasses.replace(r, until=lso) if lso < r.until else r)
    return out


def indexed_aborts(tasks: Sequence[Sequence[SegmentRange]]) -> dict[TopicPartition, PartitionTxns]:
    """The aborted transactions that the ``.txnindex`` files of the segments of ``tasks`` list
    (written with every ABORT marker by our broker and by Kafka's) and that reach each
    partition's offset window: a **prediction** only, used to mask the records pass; the walk
    judges it (:func:`_matches`). A missing, unreadable or damaged index predicts nothing."""
    windows: dict[TopicPartition, tuple[int, int]] = {}
    paths: dict[TopicPartition, set[str]] = {}
    for task in tasks:
        for r in task:
            tp = (r.topic, r.partition)
            low, high = windows.get(tp, (r.start_offset, r.until))
            windows[tp] = (min(low, r.start_offset), max(high, r.until))
            paths.setdefault(tp, set()).add(r.path)
    out: dict[TopicPartition, PartitionTxns] = {}
    for tp, files in paths.items():
        low, high = windows[tp]
        pid: list[int] = []
        first: list[int] = []
        last: list[int] = []
        for name in sorted(files):
            index = Path(name).with_suffix(TXN_INDEX_SUFFIX)
            try:
                entries = decode_entries(index.read_bytes(), path=str(index))
            except (OSError, LoglakeError):
                continue
            for e in entries:  # O(aborted transactions), on the driver
                if e.last_offset >= low and e.first_offset < high:
                    pid.append(e.producer_id)
                    first.append(e.first_offset)
                    last.append(e.last_offset)
        if pid:
            out[tp] = PartitionTxns(AbortedRanges.of(pid, first, last), None, 0, 0)
    return out


def _matches(predicted: AbortedRanges, truth: AbortedRanges) -> bool:
    """Whether a mask of ``predicted`` drops exactly what a mask of ``truth`` drops: the same
    ranges (both are sorted by producer and first offset; one producer's never overlap)."""
    return (
        len(predicted) == len(truth)
        and np.array_equal(predicted.producer_id, truth.producer_id)
        and np.array_equal(predicted.first, truth.first)
        and np.array_equal(predicted.last, truth.last)
    )


def _resolve(staged: StagedWrite, first: int) -> dict[TopicPartition, PartitionTxns]:
    """Each partition's transactions, from the events in the reports of tasks ``>= first``
    (the segment ranges; the tier's tasks come first)."""
    events: dict[TopicPartition, list[TxnEvents]] = {}
    for report, task in zip(staged.reports, staged.report_tasks, strict=True):
        if task >= first and "txn" in report:
            tp = (report["topic"], report["partition"])
            events.setdefault(tp, []).append(TxnEvents.from_json(report["txn"]))
    return {tp: resolve(TxnEvents.concat(evs)) for tp, evs in events.items()}


def _tasks_to_reread(
    staged: StagedWrite,
    first: int,
    wrong: Mapping[TopicPartition, PartitionTxns],
    reach: Mapping[TopicPartition, AbortedRanges],
) -> set[int]:
    """The segment tasks (indexes from ``first``, the first segment task) whose output the
    precise read would change: a task is read again when one of its ranges, in a partition of
    ``wrong``, read a sound batch at or above the partition's open transaction (the LSO) or in
    reach of a range of ``reach[partition]`` (any producer's: offsets only, an
    over-approximation): the aborted ranges its mask missed, and the ones it was wrongly
    masked with. The offsets a range read are its report's ``[first_sound, last_end)``, the
    sound batches whatever the window: wider than what it emitted, so a range outside them
    emitted exactly what the masked, cut read emits. A range that read no sound batch emitted
    no record."""
    redo: set[int] = set()
    for report, task in zip(staged.reports, staged.report_tasks, strict=True):
        tp = (report["topic"], report["partition"])
        found = wrong.get(tp)
        low, high = report.get("first_sound"), report.get("last_end")
        if task < first or found is None or low is None or high is None:
            continue
        ranges = reach.get(tp)
        if (found.open_from is not None and high > found.open_from) or (
            ranges is not None and len(ranges.overlapping(low, high))
        ):
            redo.add(task - first)
    return redo


def _report(
    txns: Mapping[TopicPartition, PartitionTxns],
    until: Mapping[TopicPartition, int],
    summary: IngestSummary,
    log: Log,
) -> None:
    for tp, found in sorted(txns.items()):
        summary.aborted_transactions += len(found.aborted)
        summary.open_transactions += found.open
        if found.open_from is not None and found.open_from < until[tp]:
            summary.held_at_lso[f"{tp[0]}/{tp[1]}"] = found.open_from
    log(
        f"read_committed: {summary.aborted_transactions} aborted and {summary.open_transactions} "
        f"open transactions below the high watermarks; "
        + (
            "held at their last stable offset: "
            + ", ".join(f"{k} at {v}" for k, v in summary.held_at_lso.items())
            if summary.held_at_lso
            else "no partition held below its high watermark"
        )
    )


def stage_committed(
    tasks: list[list[SegmentRange]],
    *,
    head: Sequence[Any],
    stage: Stage,
    summary: IngestSummary,
    log: Log,
) -> tuple[StagedWrite, dict[TopicPartition, PartitionTxns]]:
    """Steps 1-3 of the module docstring over ``tasks`` (the segment ranges' tasks), staged
    after ``head`` (the tier's tasks, read in the same first job). Returns the staged write
    and each partition's transactions (partitions without any are left out)."""
    predicted = indexed_aborts(tasks)
    staged = stage([*head, *_with_aborted(tasks, predicted)], collect_txn=True)
    try:
        txns = _resolve(staged, len(head))
        until = {(r.topic, r.partition): r.until for task in tasks for r in task}
        _report(txns, until, summary, log)
        none = AbortedRanges.of([], [], [])
        reach: dict[TopicPartition, AbortedRanges] = {}
        for tp in {*txns, *predicted}:
            truth = txns[tp].aborted if tp in txns else none
            guess = predicted[tp].aborted if tp in predicted else none
            if not _matches(guess, truth):  # what the mask missed and what it wrongly dropped
                reach[tp] = AbortedRanges.of(
                    np.concatenate([truth.producer_id, guess.producer_id]),
                    np.concatenate([truth.first, guess.first]),
                    np.concatenate([truth.last, guess.last]),
                )
        wrong = {
            tp: txns.get(tp, PartitionTxns(none, None, 0, 0))
            for tp in {*reach, *(tp for tp, t in txns.items() if t.open_from is not None)}
        }
        if predicted:
            hits = sum(tp not in reach for tp in predicted)
            log(
                f"read_committed: the transaction indexes predicted the aborted transactions of "
                f"{len(predicted)} partitions, {hits} exactly"
            )
        if not wrong:
            return staged, txns
        began = time.monotonic()
        redo = sorted(_tasks_to_reread(staged, len(head), wrong, reach))
        if not redo:  # no task read a batch in their reach: what it wrote is already exact
            return staged, txns
        reread = {(r.topic, r.partition) for i in redo for r in tasks[i]} & wrong.keys()
        staged.discard_tasks({len(head) + i for i in redo})
        failpoint("ingest.before_reread", kill=kill_session)
        again = [cut for i in redo if (cut := cut_at_lso(tasks[i], txns))]
        staged = stage(_with_aborted(again, txns), into=staged)
        summary.txn_reread_seconds = time.monotonic() - began
        summary.txn_reread_partitions = len(reread)
        log(
            f"read_committed: {len(redo)} tasks of {len(reread)} partitions with aborted or open "
            f"transactions read again ({summary.txn_reread_seconds:.2f} s)"
        )
        return staged, txns
    except BaseException:
        staged.abort()
        raise
