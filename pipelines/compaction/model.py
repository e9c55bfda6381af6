"""The reference model of key compaction: which record of a key wins, in plain Python.

This module is the specification. The Spark job (``pipelines.compaction.table``) and, later,
the log rewrite must agree with it; the tests compare them with it on random workloads. It is
written for clarity, not speed (one Python object per record).

Rules (Kafka's LogCleaner, DESIGN.md "Compaction", extended by KIP-280's strategies):

1. Records are grouped by ``(partition, key)``. A record without a key takes no part: a
   compacted topic refuses keyless records at produce time (``INVALID_RECORD``), and Kafka's
   cleaner drops any that got in before the topic was compacted.
2. Control records never reach the model (the decoder leaves control batches out of
   ``records``). Records of aborted transactions are dropped (``is_aborted``;
   :func:`aborted_offsets` says which they are: a producer's transactional records up to its
   next ABORT marker).
3. Per group, the record with the greatest **order key** wins (:func:`order_key`):
   - ``offset`` (default): the offset;
   - ``timestamp``: ``(timestamp, offset)``, the record's timestamp in ms (CreateTime or
     LogAppendTime, whichever the batch carries);
   - ``header:<name>``: ``(has version, version, offset)``, where the version is the *last*
     header called ``<name>`` whose value is a big-endian two's-complement integer of 1 to 8
     bytes (what Java's ``ByteBuffer.putLong/putInt/putShort`` and Kafka's ``LongSerializer``
     write, as KIP-280 proposes). A missing header, a null value, an empty value or one
     longer than 8 bytes means *no version*.
   Ties (equal versions) fall back to the offset. A record without a version loses to every
   record with one and, among records without one, the offset decides. (Comparing "by version
   when both have one, else by offset" is not an order: A(v5, o1) < B(-, o2) < C(v3, o3) <
   A. A total order makes the winner the maximum of a set, so it does not depend on how the
   records are split over runs, and re-applying records already seen changes nothing.)
4. A winning record with a null value (tombstone) deletes its key: the key has no live row.
   Under ``timestamp``/``header`` strategies the tombstone still competes: a later record with
   a smaller version does not bring the key back.

The table output applies the rules to everything ingested so far (no ``min.compaction.lag.ms``,
no ``delete.retention.ms``: the table is the latest state). The log output adds Kafka's lag,
dirty-ratio and tombstone-retention rules on top, but decides winners with this order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from logstore.errors import LoglakeError

__all__ = [
    "DEFAULT_STRATEGY",
    "LogBatch",
    "Rec",
    "Strategy",
    "aborted_offsets",
    "compact",
    "header_version",
    "latest",
    "live",
    "order_key",
    "parse_strategy",
    "version_of",
]

Header = tuple[str, bytes | None]
PartitionKey = tuple[int, bytes]


@dataclass(frozen=True, slots=True)
class Rec:
    """One record as compaction sees it (a row of ``records``; ``timestamp`` in ms)."""

    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()


@dataclass(frozen=True, slots=True)
class Strategy:
    """A topic's ``compaction.strategy``: ``offset``, ``timestamp`` or ``header:<name>``."""

    kind: Literal["offset", "timestamp", "header"] = "offset"
    header: str | None = None

    def __str__(self) -> str:
        return f"header:{self.header}" if self.kind == "header" else self.kind


DEFAULT_STRATEGY = Strategy()


def parse_strategy(text: str) -> Strategy:
    """``"offset"`` | ``"timestamp"`` | ``"header:<name>"`` (non-empty name); else an error."""
    if text == "offset":
        return Strategy("offset")
    if text == "timestamp":
        return Strategy("timestamp")
    if text.startswith("header:") and len(text) > len("header:"):
        return Strategy("header", text[len("header:") :])
    raise LoglakeError(f"compaction strategy {text!r}: expected offset, timestamp or header:<name>")


def header_version(value: bytes | None) -> int | None:
    """A header value as a version: big-endian signed integer of 1-8 bytes, else None."""
    if value is None or not 1 <= len(value) <= 8:
        return None
    return int.from_bytes(value, "big", signed=True)


def version_of(rec: Rec, strategy: Strategy) -> int | None:
    """The record's version under ``strategy`` (None: offset strategy, or no version)."""
    if strategy.kind == "offset":
        return None
    if strategy.kind == "timestamp":
        return rec.timestamp
    found: bytes | None = None
    present = False
    for name, value in rec.headers:
        if name == strategy.header:
            found, present = value, True
    return header_version(found) if present else None


def order_key(rec: Rec, strategy: Strategy) -> tuple[int, int, int]:
    """The record's rank within its key: the greatest wins (rule 3 of the module docstring)."""
    version = version_of(rec, strategy)
    if version is None:
        return (0, 0, rec.offset)
    return (1, version, rec.offset)


def latest(
    records: Iterable[Rec],
    strategy: Strategy = DEFAULT_STRATEGY,
    *,
    is_aborted: Callable[[Rec], bool] | None = None,
) -> dict[PartitionKey, Rec]:
    """The winning record of every ``(partition, key)``, tombstones included."""
    out: dict[PartitionKey, Rec] = {}
    ranks: dict[PartitionKey, tuple[int, int, int]] = {}
    for rec in records:
        if rec.key is None or (is_aborted is not None and is_aborted(rec)):
            continue
        pk = (rec.partition, rec.key)
        rank = order_key(rec, strategy)
        if pk not in ranks or rank > ranks[pk]:
            ranks[pk] = rank
            out[pk] = rec
    return out


@dataclass(frozen=True, slots=True)
class LogBatch:
    """A batch of the log as the transaction rule sees it."""

    producer_id: int
    transactional: bool
    control: int | None  # control batch: its type (0 ABORT, 1 COMMIT, ...); data: None
    offsets: tuple[int, ...]


def aborted_offsets(batches: Iterable[LogBatch]) -> set[int]:
    """The offsets of the records of aborted transactions, ``batches`` in log order: a
    producer's transactional records since its last marker belong to the transaction that its
    next COMMIT (1) or ABORT (0) marker ends; with no marker yet, they are neither."""
    pending: dict[int, list[int]] = {}
    aborted: set[int] = set()
    for batch in batches:
        if batch.control is None:
            if batch.transactional and batch.producer_id >= 0:
                pending.setdefault(batch.producer_id, []).extend(batch.offsets)
        elif batch.control in (0, 1):
            ended = pending.pop(batch.producer_id, [])
            if batch.control == 0:
                aborted.update(ended)
    return aborted


def live(state: Mapping[PartitionKey, Rec]) -> dict[PartitionKey, Rec]:
    """The keys whose winner is not a tombstone."""
    return {pk: rec for pk, rec in state.items() if rec.value is not None}


def compact(
    records: Sequence[Rec] | Iterable[Rec], strategy: Strategy = DEFAULT_STRATEGY
) -> dict[PartitionKey, Rec]:
    """One entry per live ``(partition, key)``: what ``topics/<topic>`` must hold."""
    return live(latest(records, strategy))
