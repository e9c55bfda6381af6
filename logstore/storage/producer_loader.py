"""Loading a partition's producer state and mending its ``.txnindex`` files (Kafka's
``LogLoader`` / ``rebuildProducerState``).

Producer state (:mod:`logstore.storage.producer_state`) is a pure function of the batches in
offset order, so it is rebuilt by replaying batch headers: data batches need their header
only; a control batch (a transaction marker) also needs its one record, which says COMMIT or
ABORT (:func:`read_marker`: one small uncompressed record per marker, read with ``pread``).

:func:`load_producer_state`, numbered as it runs:

1. stray files: ``*.snapshot.tmp`` (a snapshot write cut short), snapshots below the log
   start offset (their segments are gone) and above the log end offset (the log was truncated
   below them: they describe batches no longer there) are deleted;
2. ``.txnindex`` files: the segments recovered by the loader (unclean shutdown, missing or
   corrupt indexes, swapped-in cleaner output) and those whose ``.txnindex`` fails its sanity
   check get theirs rebuilt;
3. the latest snapshot at or above the log start offset and at or below the first segment to
   rebuild is loaded (a corrupt one is deleted and the next older one tried); without one
   the state starts empty at the log start offset;
4. every batch from there to the log end offset is replayed (bounded rescans: from the
   latest snapshot, i.e. normally the active segment only); each ABORT marker in a segment
   being rebuilt adds its entry there, and the rebuilt files are written.

Nothing here is thread-safe: it runs while the log is loaded, before it is shared. Crash-safe:
it only deletes files that describe nothing that exists and rewrites index files whole.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from logstore.errors import CorruptIndexError, CorruptRecordError, LoglakeError, StorageError
from logstore.protocol.batch import LOG_OVERHEAD, BatchHeader
from logstore.protocol.control import ControlRecord, decode_control_record
from logstore.protocol.records import decode_batch
from logstore.storage.files import SNAPSHOT_SUFFIX
from logstore.storage.producer_snapshot import (
    CorruptSnapshotError,
    delete_snapshot,
    list_snapshots,
    read_snapshot,
)
from logstore.storage.producer_state import CompletedTxn, ProducerStateManager
from logstore.storage.segment import LogSegment
from logstore.storage.txn_index import AbortedTxn

__all__ = ["ProducerStateLoad", "load_producer_state", "read_marker", "replay_batches"]

_log = logging.getLogger(__name__)

LocatedHeaders = Iterable[tuple[LogSegment, int, BatchHeader]]


class ProducerStateLoad(NamedTuple):
    """What :func:`load_producer_state` did: the snapshot it started from (None: the log
    start), the offset replay began at, how many batches it replayed, the segments whose
    ``.txnindex`` it rebuilt, and why it stopped early (None: it did not)."""

    snapshot_offset: int | None
    replayed_from: int
    batches_replayed: int
    rebuilt_txn_indexes: list[int]
    error: str | None = None
    txn_index_error: str | None = None


def read_marker(seg: LogSegment, position: int, header: BatchHeader) -> ControlRecord:
    """The control record of the control batch ``header`` at ``position`` in ``seg``.

    :class:`CorruptRecordError` (naming the file and position) when the batch does not hold
    one decodable control record."""
    size = header.batch_length + LOG_OVERHEAD
    data = os.pread(seg.fileno, size, position)
    try:
        _, records = decode_batch(data)
        if not records:
            raise CorruptRecordError("control batch without a record")
        return decode_control_record(records[0].key, records[0].value)
    except CorruptRecordError as exc:
        raise CorruptRecordError(exc.message, path=str(seg.path), position=position) from None


def replay_batches(
    producers: ProducerStateManager,
    batches: Iterable[tuple[LogSegment, int, BatchHeader]],
    on_completed: Callable[[LogSegment, CompletedTxn], None] | None = None,
) -> int:
    """Replay ``(segment, position, header)`` in offset order into ``producers``; every
    transaction a marker completes goes to ``on_completed`` with the marker's segment.
    Returns the offset after the last batch replayed (-1 when there was none)."""
    next_offset = -1
    for seg, pos, h in batches:
        control = read_marker(seg, pos, h) if h.is_control and h.producer_id >= 0 else None
        done = producers.replay(h, control)
        if done is not None and on_completed is not None:
            on_completed(seg, done)
        next_offset = h.base_offset + h.last_offset_delta + 1
    return next_offset


def load_producer_state(
    producers: ProducerStateManager,
    dir: Path,
    segments: Sequence[LogSegment],
    headers_from: Callable[[int], Iterator[tuple[LogSegment, int, BatchHeader]]],
    *,
    log_start_offset: int,
    log_end_offset: int,
    recovered_segments: Iterable[int] = (),
) -> ProducerStateLoad:
    """Fill ``producers`` from the latest usable snapshot plus a replay of the batches after
    it, rebuilding the ``.txnindex`` of ``recovered_segments`` (see the module docstring).

    ``headers_from(offset)`` yields ``(segment, position, header)`` from ``offset`` to the log
    end (:meth:`Log.iter_located_headers`). A batch header that cannot be read stops the
    replay where it is (logged, and in :attr:`ProducerStateLoad.error`)."""
    # 1. stray snapshot files
    for name in os.listdir(dir):
        if name.endswith(SNAPSHOT_SUFFIX + ".tmp"):
            (dir / name).unlink(missing_ok=True)
    snapshots = []
    for offset in list_snapshots(dir):
        if offset < log_start_offset:  # its segments are gone (offline retention)
            delete_snapshot(dir, offset)
        elif offset > log_end_offset:
            _log.info("%s: deleting snapshot %d above the log end %d", dir.name, offset,
                      log_end_offset)  # fmt: skip
            delete_snapshot(dir, offset)
        else:
            snapshots.append(offset)
    # 2. which .txnindex files to rebuild
    rebuild = set(recovered_segments)
    for i, segment in enumerate(segments):
        nxt = segments[i + 1].base_offset if i + 1 < len(segments) else None
        try:
            segment.txn_index.sanity_check(nxt)
        except CorruptIndexError as exc:
            _log.warning("rebuilding %s: %s", segment.txn_index.path, exc.message)
            rebuild.add(segment.base_offset)
    bound = min(rebuild) if rebuild else log_end_offset
    # 3. the latest usable snapshot
    producers.clear()
    start = log_start_offset
    used: int | None = None
    for offset in reversed(snapshots):
        if offset > bound:
            continue
        try:
            producers.load_snapshot_entries(read_snapshot(dir, offset))
        except CorruptSnapshotError as exc:
            _log.warning("deleting corrupt producer snapshot: %s", exc)
            delete_snapshot(dir, offset)
            continue
        except StorageError as exc:
            _log.warning("producer snapshot not read: %s", exc)
            continue
        used, start = offset, offset
        break
    # 4. replay, rebuilding the .txnindex of the segments in `rebuild`
    aborted: dict[int, list[AbortedTxn]] = {b: [] for b in rebuild}

    def on_completed(seg: LogSegment, done: CompletedTxn) -> None:
        entries = aborted.get(seg.base_offset)
        if entries is not None and done.is_aborted:
            entries.append(
                AbortedTxn(
                    done.producer_id, done.first_offset, done.last_offset, done.last_stable_offset
                )
            )

    counter = _Counter(headers_from(start))
    error: str | None = None
    try:
        replay_batches(producers, counter, on_completed)
    except LoglakeError as exc:
        error = f"producer state replay stopped: {exc}"
        _log.warning("%s: %s", dir.name, error)
    by_base = {s.base_offset: s for s in segments}
    txn_error: str | None = None
    for base in sorted(rebuild):
        seg = by_base.get(base)
        if seg is None:
            continue
        try:
            seg.txn_index.rewrite(aborted[base])
        except StorageError as exc:
            txn_error = f"transaction index not rebuilt: {exc}"
            _log.error("%s", txn_error)
    return ProducerStateLoad(used, start, counter.n, sorted(rebuild), error, txn_error)


class _Counter:
    """An iterator over located headers that counts them."""

    def __init__(self, it: Iterator[tuple[LogSegment, int, BatchHeader]]) -> None:
        self._it = it
        self.n = 0

    def __iter__(self) -> _Counter:
        return self

    def __next__(self) -> tuple[LogSegment, int, BatchHeader]:
        item = next(self._it)
        self.n += 1
        return item
