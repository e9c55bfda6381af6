"""Transactions in log compaction: what the cleaner removes of aborted transactions and markers.

Kafka's ``LogCleaner`` (``CleanedTransactionMetadata`` and ``checkBatchRetention``), whole
batches at a time:

- a transaction is the run of a producer's transactional data batches up to its next control
  batch of type COMMIT or ABORT (the marker; control batch: attributes bit 5 + bit 4, one
  record whose key is version i16 + type i16, 0 ABORT, 1 COMMIT);
- the **records of an aborted transaction** take no part in deciding a key's winner and their
  batches are removed whole (only a producer's last data batch keeps its empty header, as for
  any emptied batch, so the producer's sequence state survives);
- a **marker** may go once no batch of its transaction is left in the cleaned range (an ABORT
  whose batches were all removed, a COMMIT whose records all lost to later ones): the first
  pass that finds it so sets its delete horizon (KIP-534: ``now + delete.retention.ms`` in the
  base timestamp, attributes bit 6), and a pass after that horizon removes it. Until then
  consumers reading from before the marker still see the transaction end. A control batch
  left without records (cleaned by an earlier writer) is discardable at once;
- a transaction **still open** (no marker below the high watermark) bounds the cleanable range
  at its first offset (the last stable offset): nothing from there on is cleaned.

The aborted transactions come from the segments themselves (:func:`scan_transactions`: batch
headers, and the one record of each control batch), not from ``.txnindex`` files, so a log
whose indexes are missing or stale is cleaned the same.

Pure state, no I/O except :func:`control_types` (reads control batches of one segment).
Not thread-safe: one :class:`TransactionFilter` per cleaning pass, fed batches in offset order.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from logstore.protocol.batch import BatchHeader, iter_batches
from logstore.protocol.control import ControlType, decode_control_record
from logstore.protocol.records import decode_batch

__all__ = [
    "AbortedTxn",
    "TransactionFilter",
    "TransactionScan",
    "control_type",
    "control_types",
    "scan_transactions",
]


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """An aborted transaction: its producer, first offset and the ABORT marker's offset."""

    producer_id: int
    first_offset: int
    last_offset: int


@dataclass(frozen=True, slots=True)
class TransactionScan:
    """What :func:`scan_transactions` found below the high watermark."""

    aborted: tuple[AbortedTxn, ...]  # by first offset
    first_unstable_offset: int | None  # first offset of the earliest open transaction


def control_type(batch: bytes | bytearray | memoryview) -> int | None:
    """The control type of one control batch (None when it holds no record). A damaged batch
    raises :class:`~logstore.errors.CorruptRecordError` (CRC checked)."""
    _, records = decode_batch(batch)
    if not records:
        return None
    rec = records[0]
    return int(decode_control_record(rec.key, rec.value).type)


def control_types(path: Path, size: int, headers: Sequence[BatchHeader]) -> dict[int, int | None]:
    """``{base offset: control type}`` of the control batches of one ``.log`` (up to
    ``size``); read only when ``headers`` show one (control batches are rare and small)."""
    if not any(h.is_control for h in headers):
        return {}
    with open(path, "rb") as f:
        data = os.pread(f.fileno(), size, 0)
    out: dict[int, int | None] = {}
    for pos, h in iter_batches(data, 0, len(data), allow_torn_tail=True):
        if h.is_control:
            out[h.base_offset] = control_type(memoryview(data)[pos : pos + h.size])
    return out


def scan_transactions(
    headers: Iterable[BatchHeader], types: Mapping[int, int | None], high_watermark: int
) -> TransactionScan:
    """The aborted transactions completed below ``high_watermark`` and the first offset of the
    earliest transaction still open there, from every batch header of the log in order."""
    open_txns: dict[int, int] = {}  # producer id -> first offset
    aborted: list[AbortedTxn] = []
    for h in headers:
        if h.last_offset >= high_watermark:
            break
        pid = h.producer_id
        if not h.is_transactional or pid < 0:
            continue
        if not h.is_control:
            open_txns.setdefault(pid, h.base_offset)
            continue
        kind = types.get(h.base_offset)
        if kind not in (ControlType.ABORT, ControlType.COMMIT):
            continue
        first = open_txns.pop(pid, None)
        if first is not None and kind == ControlType.ABORT:
            aborted.append(AbortedTxn(pid, first, h.base_offset))
    aborted.sort(key=lambda a: a.first_offset)
    return TransactionScan(tuple(aborted), min(open_txns.values(), default=None))


class _Aborted:
    __slots__ = ("seen", "txn")

    def __init__(self, txn: AbortedTxn) -> None:
        self.txn = txn
        self.seen = False  # a batch of it was read in this pass


class TransactionFilter:
    """Kafka's ``CleanedTransactionMetadata`` for one pass: fed every batch of the cleaned
    range in offset order, it says which data batches belong to aborted transactions and
    which markers no batch of their transaction precedes any more."""

    def __init__(self, aborted: Sequence[AbortedTxn]) -> None:
        self._pending = sorted(aborted, key=lambda a: a.first_offset)
        self._next = 0
        self._ongoing_aborted: dict[int, _Aborted] = {}
        self._ongoing_committed: set[int] = set()

    def _consume_up_to(self, offset: int) -> None:
        while self._next < len(self._pending) and self._pending[self._next].first_offset <= offset:
            txn = self._pending[self._next]
            self._ongoing_aborted.setdefault(txn.producer_id, _Aborted(txn))
            self._next += 1

    def on_batch(self, header: BatchHeader) -> bool:
        """A data batch: True when it belongs to an aborted transaction (it goes whole)."""
        self._consume_up_to(header.last_offset)
        if not header.is_transactional or header.producer_id < 0:
            return False
        ongoing = self._ongoing_aborted.get(header.producer_id)
        if ongoing is not None:
            ongoing.seen = True
            return True
        self._ongoing_committed.add(header.producer_id)
        return False

    def on_control(self, header: BatchHeader, kind: int | None) -> bool:
        """A control batch of type ``kind`` (None: no record): True when it may be discarded
        (no batch of its transaction was read in this pass)."""
        self._consume_up_to(header.last_offset)
        if kind is None:
            return True
        pid = header.producer_id
        if kind == ControlType.ABORT:
            ongoing = self._ongoing_aborted.pop(pid, None)
            return ongoing is None or not ongoing.seen
        if kind == ControlType.COMMIT:
            if pid in self._ongoing_committed:
                self._ongoing_committed.discard(pid)
                return False
            return True
        return False
