"""Rebuilding a partition's producer state from its log (Kafka's ``rebuildProducerState``).

Producer state (:mod:`logstore.storage.producer_state`) is a pure function of the batches in
offset order, so it is rebuilt by replaying batch headers: data batches need their header
only; a control batch (a transaction marker) also needs its one record, which says COMMIT or
ABORT (:func:`read_marker`: one small uncompressed record per marker, read with ``pread``).

Nothing here is thread-safe: it runs while the log is loaded, before it is shared.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from logstore.errors import CorruptRecordError
from logstore.protocol.batch import LOG_OVERHEAD, BatchHeader
from logstore.protocol.control import ControlRecord, decode_control_record
from logstore.protocol.records import decode_batch
from logstore.storage.producer_state import CompletedTxn, ProducerStateManager
from logstore.storage.segment import LogSegment

__all__ = ["read_marker", "replay_batches"]


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
