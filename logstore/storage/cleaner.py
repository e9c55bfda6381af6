"""Log compaction, storage half: what to clean (the plan) and the cleaned segments (rewrite).

Kafka's ``LogCleaner`` split in two. This module is I/O on one partition directory and knows
nothing of Spark or of which record wins a key: the caller (``pipelines.compaction.log``, on a
Spark executor) decides the winning offsets with the reference model and hands them in. The
cleaned segments are then swapped into the log by :mod:`logstore.storage.swap`.

1. Plan (:func:`plan_cleaning`), read-only, from the segment files (never the active segment,
   never an open :class:`~logstore.storage.log.Log`):

   - the **cleanable range** is ``[log start, first uncleanable offset)``; the first
     uncleanable offset is the smallest of the active segment's base offset, the high
     watermark (the log dir's ``replication-offset-checkpoint``, which only lags the real one),
     the first offset of a transaction still open below the high watermark (the last stable
     offset, read from the segments' markers) and the base offset of the first segment holding
     a record newer than ``min.compaction.lag.ms``. Only whole segments below it are cleaned;
   - the **dirty section** starts at the ``cleaner-offset-checkpoint`` entry (Kafka's file and
     format, ``topic partition offset`` lines, in the log dir), reset to the log start when
     it is missing or outside the log;
   - the partition is **due** when ``dirty bytes / (clean + dirty bytes)`` >=
     ``min.cleanable.dirty.ratio`` (0.5) or the first dirty batch is older than
     ``max.compaction.lag.ms`` (Kafka's defaults; from the topic's
     :class:`~logstore.storage.config.LogConfig`);
   - segments are **grouped** as Kafka's ``groupSegmentsBySize`` does: neighbours while the
     group's ``.log`` bytes stay <= ``segment.bytes``, its index bytes <= ``segment.index.bytes``
     and its offsets within one segment's i32 relative range.

   Like Kafka's key map, the winners are decided over every record of the cleanable range
   (clean and dirty sections), so a record of the clean section goes when a dirty one beats it.

2. Rewrite (:func:`rewrite_group`), per group, into ``<first base>.log.cleaned`` plus fresh
   ``.index.cleaned``/``.timeindex.cleaned`` (written by
   :class:`~logstore.storage.segment.LogSegment`, fsynced, mtime of the group's last segment so
   that time retention is unchanged). Per batch, Kafka's ``MemoryRecords.filterTo``:

   - a record stays when its offset is a winner (``keep``), except a tombstone whose batch
     carries a delete horizon (KIP-534: attributes bit 6, horizon in ``baseTimestamp``) that
     has passed. Keyless records never win (the caller leaves them out of ``keep``);
   - **tombstones, KIP-534** (Kafka 3.x's rule, chosen over the older per-segment
     last-modified rule): a kept batch holding a tombstone and no horizon yet is rewritten with
     ``horizon = now + delete.retention.ms``; a later pass after the horizon drops them;
   - a batch keeping all its records and needing no horizon is copied byte for byte;
     otherwise it is rebuilt with its original base offset, last offset delta (so the
     producer's last sequence survives), producer id/epoch, base sequence, leader epoch,
     codec, timestamp type and record timestamps/headers, with a fresh CRC-32C: the kept
     records are copied as raw bytes (only the timestamp delta is re-encoded when a horizon
     becomes the base timestamp), compressed once;
   - a batch left empty goes, unless it is its producer's last batch in the log: then its
     header alone stays (no records, Kafka's ``writeEmptyHeader``), so an idempotent producer
     keeps its sequence state after a restart;
   - **transactions** (:mod:`logstore.storage.cleaner_txn`, Kafka's
     ``CleanedTransactionMetadata``): the batches of aborted transactions go whole (their
     records win no key either: the plan lists them, ``aborted_batches``); a COMMIT/ABORT
     marker stays while a batch of its transaction is left before it, then gets a delete
     horizon, and a pass after the horizon drops it; other control batches stay.

Cost: batches whose records all win, or none, are copied or dropped from their header alone
(the winners are counted in the batch's offset range); only partly kept batches are walked
record by record (a few varints each, no object per record), compiled when the caller hands in
a :data:`RecordSelect` (the Spark job does: ``pipelines.compaction._select``). Figures:
``tests/perf/bench_log_clean.py``, ``tests/perf/bench_compact.py --only log``.

Crash behaviour: the plan writes nothing. The rewrite only creates ``.cleaned`` files, which
any loader deletes (:mod:`logstore.storage.loader`, step 1) and the next rewrite replaces;
nothing of the live log is touched before :mod:`logstore.storage.swap`.

Thread-safety: none needed; every function works on files and values passed in.
"""

from __future__ import annotations

import bisect
import mmap
import os
import struct
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from logstore.errors import CorruptRecordError, LoglakeError
from logstore.protocol.batch import (
    CODEC_MASK,
    CRC_OFFSET,
    DELETE_HORIZON_FLAG,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAX_TIMESTAMP_OFFSET,
    NO_TIMESTAMP,
    TIMESTAMP_TYPE_FLAG,
    BatchHeader,
    compute_crc,
    iter_batches,
    validate_batch,
)
from logstore.protocol.codecs import compress, decompress
from logstore.protocol.records import Record, decode_batch
from logstore.protocol.varint import decode_varint, decode_varlong, encode_varint, encode_varlong
from logstore.storage.checkpoints import read_offset_checkpoint, write_offset_checkpoint
from logstore.storage.cleaner_txn import (
    AbortedTxn,
    TransactionFilter,
    control_type,
    control_types,
    scan_transactions,
)
from logstore.storage.config import LONG_MAX, LogConfig
from logstore.storage.files import (
    CLEANED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    REPLICATION_OFFSET_CHECKPOINT,
    TIME_INDEX_SUFFIX,
    offset_from_file_name,
    parse_partition_dir,
    segment_path,
)
from logstore.storage.index import OFFSET_ENTRY_SIZE, TIME_ENTRY_SIZE
from logstore.storage.segment import BatchInfo, LogSegment

__all__ = [
    "CLEANER_CHECKPOINT",
    "CleanPlan",
    "CleanedGroup",
    "CleanerSettings",
    "RecordSelect",
    "SegmentRef",
    "group_segments",
    "iter_segment_records",
    "plan_cleaning",
    "read_cleaner_checkpoint",
    "rewrite_group",
    "scan_segment",
    "update_cleaner_checkpoint",
]

CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"
# (decompressed records section, base offset, record count) -> (the bytes of the records whose
# offsets are kept, in order and unchanged; how many; the largest timestamp delta among them)
RecordSelect = Callable[[bytes | memoryview, int, int], tuple[bytes, int, int]]
_MAX_RELATIVE = 2**31 - 1
_WRITE_CHUNK = 4 * 1024 * 1024


_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")
_BLANK_HEADER = bytes(HEADER_SIZE)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class CleanerSettings:
    """A topic's cleaning settings (Kafka topic config names in the comments)."""

    min_cleanable_dirty_ratio: float = 0.5  # min.cleanable.dirty.ratio
    min_compaction_lag_ms: int = 0  # min.compaction.lag.ms
    max_compaction_lag_ms: int = LONG_MAX  # max.compaction.lag.ms
    delete_retention_ms: int = 24 * 3_600_000  # delete.retention.ms
    segment_bytes: int = 1024 * 1024 * 1024  # segment.bytes
    segment_index_bytes: int = 10 * 1024 * 1024  # segment.index.bytes
    index_interval_bytes: int = 4096  # index.interval.bytes

    @classmethod
    def from_topic(
        cls, config: LogConfig, props: Mapping[str, str] | None = None
    ) -> CleanerSettings:
        """From a topic's :class:`LogConfig` (``min.cleanable.dirty.ratio`` and
        ``max.compaction.lag.ms`` included, validated by the config's registry). ``props``,
        the raw overrides, are no longer needed and kept for callers that pass them."""
        del props
        return cls(
            min_cleanable_dirty_ratio=config.min_cleanable_dirty_ratio,
            min_compaction_lag_ms=config.min_compaction_lag_ms,
            max_compaction_lag_ms=config.max_compaction_lag_ms,
            delete_retention_ms=config.delete_retention_ms,
            segment_bytes=config.segment_bytes,
            segment_index_bytes=config.segment_index_bytes,
            index_interval_bytes=config.index_interval_bytes,
        )


@dataclass(frozen=True, slots=True)
class SegmentRef:
    """A segment as the planner read it: enough to find it again and to tell whether it
    changed since (size and the last batch's position and CRC)."""

    base_offset: int
    size: int
    next_offset: int  # after its last batch; base_offset when empty
    last_batch_position: int  # -1 when empty
    last_batch_crc: int  # 0 when empty
    first_timestamp: int  # max timestamp of the first batch (-1 when empty)
    largest_timestamp: int  # -1 when empty
    last_modified_ms: int

    def to_json(self) -> dict[str, int]:
        return {f: getattr(self, f) for f in self.__slots__}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> SegmentRef:
        try:
            return cls(**{f: int(data[f]) for f in cls.__slots__})  # type: ignore[call-overload]
        except (KeyError, TypeError, ValueError) as exc:
            raise LoglakeError(f"bad segment entry in a cleaner manifest: {exc}") from None


@dataclass(frozen=True, slots=True)
class CleanPlan:
    """What one cleaning pass of one partition covers; see the module docstring."""

    topic: str
    partition: int
    dir: Path
    log_start_offset: int
    first_dirty_offset: int
    first_uncleanable_offset: int
    segments: tuple[SegmentRef, ...]  # every cleanable segment, in order
    groups: tuple[tuple[SegmentRef, ...], ...]
    dirty_ratio: float
    due: bool
    reason: str
    # producer id -> last offset of its last data batch anywhere in the log (empty-batch rule)
    producer_last_offsets: Mapping[int, int]
    # aborted transactions completed below the high watermark (cleaner_txn)
    aborted_transactions: tuple[AbortedTxn, ...] = ()
    # (first, last offset) of the data batches of aborted transactions in the cleanable range
    aborted_batches: tuple[tuple[int, int], ...] = ()
    # the last stable offset when a transaction is open below the high watermark
    first_unstable_offset: int | None = None

    @property
    def end_offset(self) -> int:
        """The offset after the cleaned range (the next segment's base offset)."""
        return self.segments[-1].next_offset if self.segments else self.first_dirty_offset


def scan_segment(path: Path) -> tuple[SegmentRef, list[BatchHeader]]:
    """Read the headers of every whole batch of one ``.log`` (no CRC check) and its identity.

    A torn tail (a crash while the broker wrote it) ends the scan; such a segment is the
    active one or will be recovered, and is never cleaned past what was read.
    """
    parsed = offset_from_file_name(path.name)
    if parsed is None:
        raise LoglakeError("not a segment file name", path=str(path))
    base = parsed[0]
    st = path.stat()
    headers: list[BatchHeader] = []
    pos = last_pos = -1
    size = 0
    if st.st_size:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            for pos, header in iter_batches(buf, 0, st.st_size, allow_torn_tail=True):
                headers.append(header)
                last_pos = pos
                size = pos + header.size
    last = headers[-1] if headers else None
    ref = SegmentRef(
        base_offset=base,
        size=size,
        next_offset=last.next_offset if last else base,
        last_batch_position=last_pos,
        last_batch_crc=last.crc if last else 0,
        first_timestamp=headers[0].max_timestamp if headers else -1,
        largest_timestamp=max((h.max_timestamp for h in headers), default=-1),
        last_modified_ms=st.st_mtime_ns // 1_000_000,
    )
    return ref, headers


def _live_segment_paths(dir: Path) -> list[Path]:
    found = []
    for name in os.listdir(dir):
        parsed = offset_from_file_name(name)
        if parsed is not None and parsed[1] == LOG_SUFFIX:
            found.append((parsed[0], dir / name))
    return [p for _, p in sorted(found)]


def read_cleaner_checkpoint(log_dir: str | os.PathLike[str]) -> dict[tuple[str, int], int]:
    """``cleaner-offset-checkpoint`` of a log dir (``{}`` when missing)."""
    return read_offset_checkpoint(Path(log_dir) / CLEANER_CHECKPOINT)


def update_cleaner_checkpoint(
    log_dir: str | os.PathLike[str], topic: str, partition: int, offset: int
) -> None:
    """Set one partition's entry (write-temp, fsync, rename, as every checkpoint)."""
    path = Path(log_dir) / CLEANER_CHECKPOINT
    entries = read_offset_checkpoint(path)
    entries[(topic, partition)] = offset
    write_offset_checkpoint(path, entries)


def group_segments(
    segments: Sequence[SegmentRef], *, max_size: int, max_index_size: int
) -> list[tuple[SegmentRef, ...]]:
    """Kafka's ``groupSegmentsBySize``: neighbours while the sum of ``.log`` sizes stays <=
    ``max_size``, the worst-case offset index (one entry per batch) <= ``max_index_size`` and
    every offset within i32 of the group's base offset. A segment alone is always a group."""
    groups: list[tuple[SegmentRef, ...]] = []
    i = 0
    while i < len(segments):
        group = [segments[i]]
        size = segments[i].size
        index = _index_bound(segments[i])
        i += 1
        while i < len(segments):
            nxt = segments[i]
            if (
                size + nxt.size > max_size
                or index + _index_bound(nxt) > max_index_size
                or nxt.next_offset - 1 - group[0].base_offset > _MAX_RELATIVE
            ):
                break
            group.append(nxt)
            size += nxt.size
            index += _index_bound(nxt)
            i += 1
        groups.append(tuple(group))
    return groups


def _index_bound(seg: SegmentRef) -> int:
    # at most one offset index entry per 61-byte batch header
    return (seg.size // HEADER_SIZE) * OFFSET_ENTRY_SIZE


def plan_cleaning(
    dir: str | os.PathLike[str],
    settings: CleanerSettings,
    *,
    now_ms: int | None = None,
    high_watermark: int | None = None,
    checkpoint_offset: int | None = None,
) -> CleanPlan:
    """The cleaning plan of one partition directory (read-only); see the module docstring.

    ``high_watermark`` and ``checkpoint_offset`` default to the log dir's
    ``replication-offset-checkpoint`` (0 when absent: nothing is cleanable) and
    ``cleaner-offset-checkpoint`` entries.
    """
    root = Path(dir)
    parsed = parse_partition_dir(root.name)
    if parsed is None:
        raise LoglakeError("not a <topic>-<partition> directory", path=str(root))
    topic, partition = parsed
    now = _now_ms() if now_ms is None else now_ms
    if high_watermark is None:
        hws = read_offset_checkpoint(root.parent / REPLICATION_OFFSET_CHECKPOINT)
        high_watermark = hws.get((topic, partition), 0)
    if checkpoint_offset is None:
        checkpoint_offset = read_cleaner_checkpoint(root.parent).get((topic, partition))
    paths = _live_segment_paths(root)
    refs: list[SegmentRef] = []
    all_headers: list[list[BatchHeader]] = []
    types: dict[int, int | None] = {}
    producer_last: dict[int, int] = {}
    for p in paths:
        ref, headers = scan_segment(p)
        refs.append(ref)
        all_headers.append(headers)
        types.update(control_types(p, ref.size, headers))
        for h in headers:
            # Kafka's lastDataOffset: markers do not count as a producer's last batch
            if h.producer_id >= 0 and not h.is_control:
                producer_last[h.producer_id] = h.last_offset
    if not refs:
        return CleanPlan(topic, partition, root, 0, 0, 0, (), (), 0.0, False, "no segments", {})
    log_start = refs[0].base_offset
    txns = scan_transactions((h for headers in all_headers for h in headers), types, high_watermark)
    # 1. the first uncleanable offset: active segment, high watermark (and the last stable
    # offset: an open transaction is never cleaned), min.compaction.lag.ms
    uncleanable = min(refs[-1].base_offset, high_watermark)
    if txns.first_unstable_offset is not None:
        uncleanable = min(uncleanable, txns.first_unstable_offset)
    if settings.min_compaction_lag_ms > 0:
        for ref in refs[:-1]:
            if ref.largest_timestamp > now - settings.min_compaction_lag_ms:
                uncleanable = min(uncleanable, ref.base_offset)
                break
    cleanable = [r for r in refs[:-1] if r.next_offset <= uncleanable]
    # Only whole segments: the range ends where the next segment starts.
    end = cleanable[-1].next_offset if cleanable else log_start
    # 2. the dirty section, from the checkpoint (reset when outside the log)
    first_dirty = checkpoint_offset if checkpoint_offset is not None else log_start
    if not log_start <= first_dirty <= end:
        first_dirty = log_start
    clean_bytes = sum(r.size for r in cleanable if r.next_offset <= first_dirty)
    dirty = [r for r in cleanable if r.next_offset > first_dirty]
    dirty_bytes = sum(r.size for r in dirty)
    ratio = dirty_bytes / (clean_bytes + dirty_bytes) if dirty_bytes else 0.0
    # 3. due?
    if not dirty:
        due, reason = False, "nothing dirty below the first uncleanable offset"
    elif ratio >= settings.min_cleanable_dirty_ratio:
        due, reason = True, f"dirty ratio {ratio:.3f} >= {settings.min_cleanable_dirty_ratio}"
    elif (
        dirty[0].first_timestamp >= 0
        and now - dirty[0].first_timestamp > settings.max_compaction_lag_ms
    ):
        due, reason = True, "max.compaction.lag.ms exceeded"
    else:
        due, reason = False, f"dirty ratio {ratio:.3f} < {settings.min_cleanable_dirty_ratio}"
    groups = group_segments(
        cleanable, max_size=settings.segment_bytes, max_index_size=settings.segment_index_bytes
    )
    # the data batches of aborted transactions in the range: their records win no key
    txn_filter = TransactionFilter(txns.aborted)
    aborted_batches = []
    for headers in all_headers[: len(cleanable)]:
        for h in headers:
            if h.is_control:
                txn_filter.on_control(h, types.get(h.base_offset))
            elif txn_filter.on_batch(h):
                aborted_batches.append((h.base_offset, h.last_offset))
    return CleanPlan(
        topic=topic,
        partition=partition,
        dir=root,
        log_start_offset=log_start,
        first_dirty_offset=first_dirty,
        first_uncleanable_offset=end,
        segments=tuple(cleanable),
        groups=tuple(groups),
        dirty_ratio=ratio,
        due=due,
        reason=reason,
        producer_last_offsets=producer_last,
        aborted_transactions=txns.aborted,
        aborted_batches=tuple(aborted_batches),
        first_unstable_offset=txns.first_unstable_offset,
    )


def _segment_batches(dir: Path, ref: SegmentRef) -> Iterator[tuple[memoryview, BatchHeader]]:
    """Every batch of ``ref`` as read at plan time (up to ``ref.size``), CRC checked."""
    path = segment_path(dir, ref.base_offset, LOG_SUFFIX)
    if ref.size == 0:
        return
    with open(path, "rb") as f:
        data = os.pread(f.fileno(), ref.size, 0)
    if len(data) < ref.size:
        raise LoglakeError(
            f"segment shrank since the plan: {len(data)} bytes, {ref.size} expected",
            path=str(path),
        )
    view = memoryview(data)
    pos, limit = 0, ref.size
    while pos < limit:
        if limit - pos < HEADER_SIZE:
            for _ in iter_batches(view, pos, limit):  # raises (torn tail, bad magic)
                pass  # pragma: no cover - cannot yield: no whole header is left
        # one header parse and one CRC per batch: magic, sizes (torn batch), codec, counts
        header = validate_batch(view, pos)  # never rewrite a damaged batch
        end = pos + header.batch_length + LOG_OVERHEAD
        yield view[pos:end], header
        pos = end


def iter_segment_records(
    dir: str | os.PathLike[str], segments: Sequence[SegmentRef]
) -> Iterator[Record]:
    """Every data record of ``segments`` (control batches skipped), CRC checked."""
    for ref in segments:
        for batch, header in _segment_batches(Path(dir), ref):
            if header.is_control:
                continue
            yield from decode_batch(batch)[1]


@dataclass(frozen=True, slots=True)
class CleanedGroup:
    """One group's ``.cleaned`` segment and what the rewrite did."""

    base_offset: int
    replaced: tuple[SegmentRef, ...]
    size: int
    batches_in: int
    batches_out: int
    records_in: int
    records_out: int


def _empty_batch(header: BatchHeader) -> bytearray:
    """Kafka's ``writeEmptyHeader``: the header alone, offsets, producer fields, timestamps
    and flags kept, no records, codec none."""
    out = bytearray(HEADER_SIZE)
    HEADER.pack_into(
        out,
        0,
        header.base_offset,
        HEADER_SIZE - LOG_OVERHEAD,
        header.partition_leader_epoch,
        header.magic,
        0,
        header.attributes & ~CODEC_MASK,  # no records, nothing compressed (as Kafka)
        header.last_offset_delta,
        header.base_timestamp,
        header.max_timestamp,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        0,
    )
    out[CRC_OFFSET : CRC_OFFSET + 4] = compute_crc(out, 0, HEADER_SIZE).to_bytes(4, "big")
    return out


def _max_timestamp(batch: bytes | bytearray | memoryview) -> int:
    """The maxTimestamp field of a rebuilt batch."""
    value: int = _I64.unpack_from(batch, MAX_TIMESTAMP_OFFSET)[0]
    return value


def _holds(sorted_offsets: Sequence[int], offset: int) -> bool:
    i = bisect.bisect_left(sorted_offsets, offset)
    return i < len(sorted_offsets) and sorted_offsets[i] == offset


def _clean_batch(
    batch: memoryview,
    header: BatchHeader,
    *,
    keep: Sequence[int],
    tombstones: Sequence[int],
    now_ms: int,
    delete_retention_ms: int,
    producer_last: Mapping[int, int],
    transactions: TransactionFilter,
    select: RecordSelect | None = None,
    into: bytearray | None = None,
) -> tuple[bytes | bytearray | memoryview | None, int, int]:
    """The batch to write for ``batch`` (None: drop it), records in, records out (data
    records only). ``into``: a partly kept data batch is rebuilt at its end (no copy of its
    own), and ``into`` itself is returned for it."""
    if header.is_control:
        return _clean_control(batch, header, now_ms, delete_retention_ms, transactions), 0, 0
    n = header.records_count
    first, last = header.base_offset, header.last_offset
    if transactions.on_batch(header):  # an aborted transaction's batch goes whole
        pid = header.producer_id
        is_last = producer_last.get(pid) == header.last_offset
        return (_empty_batch(header) if is_last else None), n, 0
    # The winners are offsets of this batch's records: counting them in [first, last]
    # decides most batches without decoding them.
    kept_n = bisect.bisect_right(keep, last) - bisect.bisect_left(keep, first)
    dead_n = bisect.bisect_right(tombstones, last) - bisect.bisect_left(tombstones, first)
    horizon = header.delete_horizon_ms
    expired = horizon is not None and horizon <= now_ms
    if kept_n == n and (dead_n == 0 or (horizon is not None and not expired)):
        return batch, n, n  # all kept, no horizon to set: the original bytes
    if kept_n == 0 or (expired and kept_n == dead_n):
        pid = header.producer_id
        is_last = pid >= 0 and producer_last.get(pid) == header.last_offset
        return (_empty_batch(header) if is_last else None), n, 0
    if horizon is None and dead_n > 0:
        horizon = now_ms + delete_retention_ms
    rebuilt, kept = _filter_batch(
        batch,
        header,
        keep=keep,
        drop_tombstones=expired,
        horizon=horizon,
        select=select,
        into=into,
    )
    return rebuilt, n, kept


def _clean_control(
    batch: memoryview,
    header: BatchHeader,
    now_ms: int,
    delete_retention_ms: int,
    transactions: TransactionFilter,
) -> bytes | bytearray | memoryview | None:
    """A control batch: kept as it is while a batch of its transaction is left before it;
    then given a delete horizon (KIP-534), and dropped by a pass after the horizon
    (:mod:`logstore.storage.cleaner_txn`). Never kept as an empty header: a marker is not a
    producer's last data batch."""
    discardable = transactions.on_control(
        header, control_type(batch) if header.records_count else None
    )
    if not discardable:
        return batch
    horizon = header.delete_horizon_ms
    if horizon is not None:
        return None if horizon <= now_ms else batch
    if header.records_count == 0:
        return None
    everything = range(header.base_offset, header.last_offset + 1)
    rebuilt, _ = _filter_batch(
        batch,
        header,
        keep=everything,
        drop_tombstones=False,
        horizon=now_ms + delete_retention_ms,
    )
    return rebuilt


def _filter_batch(
    batch: memoryview,
    header: BatchHeader,
    *,
    keep: Sequence[int],
    drop_tombstones: bool,
    horizon: int | None,
    select: RecordSelect | None = None,
    into: bytearray | None = None,
) -> tuple[bytearray, int]:
    """The batch rebuilt with only the kept records, and how many (at least one); ``into``:
    the batch is written at its end and ``into`` returned.

    Kept records are copied as raw bytes: the base offset stays, so every offset delta stays;
    the base timestamp stays too unless a delete horizon is set (KIP-534 stores it there),
    then only each record's timestamp delta is re-encoded. Everything else of the header is
    the original's (producer fields, leader epoch, codec, flags, lastOffsetDelta: Kafka's
    ``buildRetainedRecordsInto`` + ``overrideLastOffset``). Kafka makes the first kept
    record's timestamp the base; consumers see the same timestamps either way.
    ``select``: a compiled equivalent of the loop below for the common case (no timestamp to
    re-encode, no tombstone to drop).
    """
    codec = header.attributes & CODEC_MASK
    section = batch[HEADER_SIZE : header.size]
    base_ts = header.base_timestamp if horizon is None else horizon
    shift = header.base_timestamp - base_ts
    compiled = select is not None and shift == 0 and not drop_tombstones
    # the compiled selector reads an uncompressed section in place (no copy)
    source = decompress(codec, section) if codec else section
    data = b"" if compiled else bytes(source)
    out: bytes | bytearray = bytearray()
    kept = 0
    max_ts = NO_TIMESTAMP
    p = 0
    end = len(source)
    if select is not None and compiled:
        out, kept, max_delta = select(source, header.base_offset, header.records_count)
        if kept:
            max_ts = max(max_ts, header.base_timestamp + max_delta)
        p = end
    for _ in range(0 if compiled else header.records_count):
        length, q = decode_varint(data, p)
        record_end = q + length
        if length < 6 or record_end > end:
            raise CorruptRecordError(f"record length {length} with {end - q} bytes left")
        ts_delta, r = decode_varlong(data, q + 1)
        offset_delta, after = decode_varint(data, r)
        if _holds(keep, header.base_offset + offset_delta):
            if drop_tombstones:
                key_len, k = decode_varint(data, after)
                value_len, _ = decode_varint(data, k + max(key_len, 0))
                if value_len < 0:
                    p = record_end
                    continue
            if shift == 0:
                out += data[p:record_end]
            else:
                body = data[q : q + 1] + encode_varlong(ts_delta + shift) + data[r:record_end]
                out += encode_varint(len(body))
                out += body
            kept += 1
            max_ts = max(max_ts, header.base_timestamp + ts_delta)
        p = record_end
    if p != end:
        raise CorruptRecordError(f"{end - p} bytes left after {header.records_count} records")
    if header.attributes & TIMESTAMP_TYPE_FLAG:
        max_ts = header.max_timestamp  # LogAppendTime: the batch's time for every record
    payload = compress(codec, out) if codec else out
    size = HEADER_SIZE + len(payload)
    rebuilt = bytearray() if into is None else into
    start = len(rebuilt)
    rebuilt += _BLANK_HEADER
    rebuilt += payload
    HEADER.pack_into(
        rebuilt,
        start,
        header.base_offset,
        size - LOG_OVERHEAD,
        header.partition_leader_epoch,
        header.magic,
        0,
        header.attributes | (DELETE_HORIZON_FLAG if horizon is not None else 0),
        header.last_offset_delta,
        base_ts,
        max_ts,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        kept,
    )
    _U32.pack_into(rebuilt, start + CRC_OFFSET, compute_crc(rebuilt, start, size))
    return rebuilt, kept


def rewrite_group(
    dir: str | os.PathLike[str],
    group: Sequence[SegmentRef],
    *,
    keep: Sequence[int],
    tombstones: Sequence[int] = (),
    settings: CleanerSettings,
    producer_last_offsets: Mapping[int, int],
    now_ms: int | None = None,
    transactions: TransactionFilter | None = None,
    select: RecordSelect | None = None,
) -> CleanedGroup:
    """Write ``<group[0].base_offset>.log.cleaned`` (+ indexes) holding the kept records of
    ``group`` (see the module docstring); fsynced, mtime of the group's last segment.

    ``keep``: the sorted offsets of the records that win their key over the whole cleanable
    range; ``tombstones``: the sorted subset of those whose value is null. Batches all of
    whose records are kept (and need no horizon) are copied, batches with none are dropped,
    both without decoding; only the others are decoded and rebuilt.
    ``transactions``: the pass's :class:`~logstore.storage.cleaner_txn.TransactionFilter`
    (built from the plan's aborted transactions, shared by the pass's groups in order); none:
    a log without aborted transactions. ``select``: a compiled record selection for partly
    kept batches (:data:`RecordSelect`; the caller's, e.g. numba); none: the Python loop.
    A stale ``.cleaned`` segment of the same base offset (an earlier run killed) is replaced.
    """
    root = Path(dir)
    now = _now_ms() if now_ms is None else now_ms
    if transactions is None:
        transactions = TransactionFilter(())
    base = group[0].base_offset
    for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
        segment_path(root, base, suffix + CLEANED_SUFFIX).unlink(missing_ok=True)
    # Indexes preallocated for what this group can hold (an entry per batch at most), not
    # segment.index.bytes: mapping and trimming a 10 MiB sparse file per group cost more
    # than writing the entries (measured: ~4 ms of CPU a group). Trimmed at close either way.
    bound = (sum(r.size for r in group) // HEADER_SIZE + 2) * TIME_ENTRY_SIZE
    out = LogSegment.open(
        root,
        base,
        index_interval_bytes=settings.index_interval_bytes,
        max_index_size=min(settings.segment_index_bytes, bound),
        file_suffix=CLEANED_SUFFIX,
    )
    batches_in = batches_out = records_in = records_out = 0
    try:
        buf = bytearray()
        infos: list[BatchInfo] = []
        for ref in group:
            for batch, header in _segment_batches(root, ref):
                batches_in += 1
                pos = len(buf)
                new, n_in, n_out = _clean_batch(
                    batch,
                    header,
                    keep=keep,
                    tombstones=tombstones,
                    now_ms=now,
                    delete_retention_ms=settings.delete_retention_ms,
                    producer_last=producer_last_offsets,
                    transactions=transactions,
                    select=select,
                    into=buf,
                )
                records_in += n_in
                records_out += n_out
                if new is None:
                    continue
                batches_out += 1
                # every rewrite keeps the base offset and lastOffsetDelta; only a rebuilt
                # batch can have another max timestamp (read from its bytes, no full parse)
                if new is buf:  # rebuilt in place at the end of buf
                    size = len(buf) - pos
                    max_ts = _I64.unpack_from(buf, pos + MAX_TIMESTAMP_OFFSET)[0]
                else:
                    size = len(new)
                    max_ts = header.max_timestamp if new is batch else _max_timestamp(new)
                    buf += new
                infos.append(BatchInfo(pos, size, header.last_offset, max_ts))
                if len(buf) >= _WRITE_CHUNK:
                    out.append(buf, infos)
                    buf, infos = bytearray(), []
        if infos:
            out.append(buf, infos)
        out.flush()
        size = out.size
    finally:
        out.close()
    mtime_ns = group[-1].last_modified_ms * 1_000_000
    os.utime(segment_path(root, base, LOG_SUFFIX + CLEANED_SUFFIX), ns=(mtime_ns, mtime_ns))
    return CleanedGroup(
        base_offset=base,
        replaced=tuple(group),
        size=size,
        batches_in=batches_in,
        batches_out=batches_out,
        records_in=records_in,
        records_out=records_out,
    )
