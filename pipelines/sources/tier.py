"""Reading tiered segments straight from the object store (KIP-405, the Aiven plugin's layout).

A Kafka cluster with tiered storage keeps its closed segments in a bucket; its brokers hold only
a local tail. The ingest job reads that history from the bucket on the executors — no load on
the brokers — and the rest through Fetch (:mod:`pipelines.sources.fetch`).

Driver side:

1. The live remote segments come from ``__remote_log_metadata``, *read through the Kafka
   protocol* (Fetch of each of its partitions, as any consumer reads it), never from a bucket
   listing: :func:`remote_segments` replays Kafka's RLMM state machine over the records
   (:mod:`logstore.tier.metadata`): a segment announced by COPY_SEGMENT_STARTED is live once a
   COPY_SEGMENT_FINISHED update follows, and no longer once DELETE_SEGMENT_STARTED (or
   _FINISHED) does; a partition-delete record (api key 2, any state: the topic is going)
   removes every segment of the partition. Only COPY_SEGMENT_FINISHED, not deleted, is read.
2. :func:`plan_tier` cuts each partition's offsets to read, ``[start, end)``, into one
   :class:`TierRange` per remote segment they overlap (the tier is contiguous from the start;
   a hole in it ends the tier's part) and says where the rest begins: the offsets from there
   go through Fetch. Any offset the tier holds is read from the tier, below the broker's local
   log start or not.
3. Aborted transactions (``read_committed``): the segments' transaction indexes (the
   ``transaction`` part of ``.indexes``; read only for segments whose metadata does not say
   ``txn_index_empty``) give ``(producer, first offset, ABORT marker offset)``; a transaction
   whose batches are in the tier and whose marker is not (still local) is what one
   read_committed Fetch at the tier's end lists with a first offset below it (Kafka's
   ``collectAbortedTransactions`` searches on until its answer is complete): its batches in
   the tier are aborted up to the end of the tier. Each task carries the ranges overlapping it.

Executor side, :func:`read_tier_range`: the segment's ``.rsm-manifest`` (chunk index, where
each index is), the offset index (ranged read of ``.indexes``) when the range starts inside the
segment, then the ``.log`` object in windows of whole chunks of about ``window_bytes``, each one
ranged GET, :data:`READ_AHEAD` of them in flight ahead of the window decoded (reader threads, a
connection each: the next windows arrive while this one is decoded; after a range's last
window is asked for, the manifests, start positions and first windows of the ranges its task
reads next, so that a task's segments follow each other without waiting for the store),
each window's bytes into :func:`pipelines.sources.read.read_records` (``data=``):
the same scan, checks and vectorised decode as a log-dir or Fetch read. A window's range ends
after its last whole batch; the bytes after it are carried into the next window (no byte is
fetched twice, no batch cut by a window's end counts as damage). ``segment_base_offset`` and
``batch_position`` are the segment's start offset and the batch's position in it — the object is
the broker's segment file, byte for byte, so the rows equal a read of the log dirs. The window
loop is :func:`read_tier_windows`, shared with the lookups' batch-header read
(:mod:`pipelines.lookups_fetch`).

Each GET's body goes from the socket straight into a window buffer
(:meth:`~logstore.objectstore.ObjectStore.read_range_into`), after a headroom where the
carried tail of the window before is put, so that the two are contiguous without copying the
window; the buffers are reused from window to window and range to range (a process's pool).
Why (one process, 0.92M records of the tier bench's data, 2026-11-28, load 1-1.6): pyarrow's
ranged reads (a HEAD and a GET a window, the body copied from curl into an Arrow buffer and
into ``bytes``) plus joining each window to its carry cost 214 ns of CPU a record to read and
decode, against 80 for the same segments from log dirs; this way 131, and the S3 server's CPU
fell from 162 to 97 ns a record (no HEADs to answer). What is left beyond the log-dir read is
mostly the kernel's copy out of the socket (the GETs alone: 86 -> 43 ns a record).

Used by ingest with no log dirs (the tier, then Fetch: :mod:`pipelines.sources.fetch_ingest`)
and with log dirs (the tier below their log start, instead of a gap: :mod:`pipelines.ingest`).

Errors: an object missing (:class:`~logstore.errors.ObjectNotFoundError`), the store unreachable
or throttling after its retries (:class:`~logstore.errors.ObjectStoreUnavailableError`), a
manifest this reader does not support (encrypted chunks:
:class:`~logstore.errors.CorruptIndexError`) fail the task and so the run (exit 1, retried),
nothing committed; a re-run reads the metadata again.

Compressed chunks (the plugin's ``rsm.config.compression.enabled``: one zstd frame per chunk)
are read frame by frame, a window's frames in one ranged GET. Not supported: manifests of the
plugin's encryption option (refused, above);
a key prefix that does not end at a ``/`` (``--remote-log-storage`` names a "directory").
Thread-safe: no shared state.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from logstore.errors import (
    CorruptIndexError,
    CorruptRecordError,
    InvalidConfigError,
    InvalidTopicError,
    LoglakeError,
)
from logstore.objectstore import LakeLocation, ObjectStore, StorageSettings
from logstore.protocol.varint import decode_unsigned_varint
from logstore.tier import layout
from logstore.tier.metadata import (
    METADATA_TOPIC,
    RemoteSegment,
    SegmentState,
    SegmentUpdate,
    decode_record,
)
from logstore.tools.client_config import ClientConfig
from pipelines.sources.aborted import AbortedRanges
from pipelines.sources.fetch import (
    MAX_OFFSET,
    FetchRange,
    aborted_transactions_at,
    merge_report,
    plan_fetch_ranges,
    read_fetch_range,
)
from pipelines.sources.plan import SegmentRange, guided_cuts

__all__ = [
    "DEFAULT_TASK_BYTES",
    "DEFAULT_WINDOW_BYTES",
    "READ_AHEAD",
    "RlmmState",
    "TierPlan",
    "TierRange",
    "WindowRead",
    "next_tier_ranges",
    "partition_delete",
    "plan_summary",
    "plan_tier",
    "read_tier_range",
    "read_tier_windows",
    "remote_segments",
    "tier_part",
    "tier_store",
    "tier_tasks",
]

DEFAULT_WINDOW_BYTES = 8 << 20
# Windows requested ahead of the one decoded, each a GET on its own connection. Why more than
# one: a remote store serves a connection at ~100 MB/s after ~20-50 ms to the first byte (S3),
# so a window of 8 MiB takes ~100 ms to arrive and ~40 ms to decode; one GET in flight left a
# task waiting for the store most of the time. Measured (2026-11-29, 3M records in 64 MB
# segments, the tests' S3 server paced to 100 MB/s an answer: ``tests/perf/
# bench_tier_ingest.py --segment-mb 64 --answer-mbps 100``): one reader 4.09 -> 2.28 s, the
# ingest on local[2] 2.54 -> 2.01 s, from 1 to 4. In 8 MB segments (a window each) the same
# across segments (:func:`next_tier_ranges` opened ahead): 2.43 -> 1.93 s, one reader 3.71 ->
# 1.19 s. Unpaced, where the cores are the limit: no difference (1.04 / 0.99 s; 1.45 / 1.40).
READ_AHEAD = 4
DEFAULT_TASK_BYTES = 128 << 20  # [ingest] max_partition_bytes' default: a task's most bytes
PARTITION_DELETE_API_KEY = 2
_PARTITION_FIXED = struct.Struct(">i")
TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class TierRange:
    """One task: offsets ``[start_offset, until)`` of ``segment`` read from the store at
    ``root`` (``settings``: how to reach it, resolved on the driver). ``aborted``: the aborted
    transactions reaching those offsets (None: read_uncommitted, or none). Picklable."""

    segment: RemoteSegment
    start_offset: int
    until: int
    root: str
    settings: StorageSettings
    aborted: AbortedRanges | None = None

    @property
    def topic(self) -> str:
        return self.segment.topic

    @property
    def partition(self) -> int:
        return self.segment.partition


def tier_store(root: str, settings: StorageSettings | None = None) -> ObjectStore:
    """The store of ``--remote-log-storage`` (``s3://bucket/prefix``: the plugin's
    ``rsm.config.key.prefix`` is ``prefix/``)."""
    return ObjectStore(LakeLocation.parse(root), settings=settings)


# -- 1. the live segments, from __remote_log_metadata -----------------------------------------


class RlmmState:
    """Kafka's topic-based RLMM state replayed over ``__remote_log_metadata`` records: which
    remote segments are live (COPY_SEGMENT_FINISHED, not deleted). Feed records in each
    metadata partition's offset order (one user partition's records are all in one)."""

    def __init__(self) -> None:
        self._segments: dict[uuid.UUID, RemoteSegment] = {}
        self._deleted_partitions: set[tuple[uuid.UUID, int]] = set()

    def apply(self, record: RemoteSegment | SegmentUpdate) -> None:
        """One decoded record (:func:`logstore.tier.metadata.decode_record`)."""
        if isinstance(record, RemoteSegment):
            if record.state == SegmentState.COPY_SEGMENT_STARTED:
                self._segments[record.segment_id] = record
            return
        seg = self._segments.get(record.segment_id)
        if seg is None:
            return  # an update of a segment this log no longer announces (Kafka ignores it)
        if record.state in (
            SegmentState.DELETE_SEGMENT_STARTED,
            SegmentState.DELETE_SEGMENT_FINISHED,
        ):
            del self._segments[record.segment_id]
        elif record.state == SegmentState.COPY_SEGMENT_FINISHED:
            self._segments[record.segment_id] = dataclasses.replace(seg, state=record.state)

    def delete_partition(self, topic_id: uuid.UUID, partition: int) -> None:
        """A partition-delete record: its segments are not to be read any more."""
        self._deleted_partitions.add((topic_id, partition))

    def live(self) -> dict[TopicPartition, list[RemoteSegment]]:
        """``(topic, partition) -> live segments`` by start offset."""
        out: dict[TopicPartition, list[RemoteSegment]] = {}
        for seg in self._segments.values():
            if seg.state != SegmentState.COPY_SEGMENT_FINISHED:
                continue
            if (seg.topic_id, seg.partition) in self._deleted_partitions:
                continue
            out.setdefault((seg.topic, seg.partition), []).append(seg)
        for segs in out.values():
            segs.sort(key=lambda s: s.start_offset)
        return out


def partition_delete(value: bytes) -> tuple[uuid.UUID, int] | None:
    """``(topic id, partition)`` of a ``RemotePartitionDeleteMetadataRecord`` value (api key
    2: frame version, api key, version, then topic_id_partition {name, id, partition, tags},
    ...); None for any other api key. Only the partition is needed: any state of the delete
    (marked, started, finished) means the partition's segments are going."""
    try:
        pos = 0
        _frame, pos = decode_unsigned_varint(value, pos)
        api_key, pos = decode_unsigned_varint(value, pos)
        if api_key != PARTITION_DELETE_API_KEY:
            return None
        _version, pos = decode_unsigned_varint(value, pos)
        n, pos = decode_unsigned_varint(value, pos)
        pos += max(n - 1, 0)
        topic_id = uuid.UUID(bytes=bytes(value[pos : pos + 16]))
        (partition,) = _PARTITION_FIXED.unpack_from(value, pos + 16)
    except (ValueError, struct.error, IndexError) as exc:
        raise CorruptRecordError(f"partition-delete record does not parse: {exc}") from None
    return topic_id, int(partition)


def remote_segments(
    bootstrap: str, *, config: ClientConfig | None = None
) -> dict[TopicPartition, list[RemoteSegment]]:
    """The live remote segments of every tiered partition of the cluster at ``bootstrap``,
    from ``__remote_log_metadata`` read through Fetch (module docstring, step 1). A cluster
    without that topic (nothing ever tiered) has none."""
    try:
        ranges, _bounds = plan_fetch_ranges(
            bootstrap, topics=[METADATA_TOPIC], config=config, isolation=0
        )
    except InvalidTopicError:
        return {}
    state = RlmmState()
    for rng in ranges:
        for batch in read_fetch_range(rng, min_timestamp=-(2**63), max_timestamp=2**63 - 1):
            for value in batch.column("value").to_pylist():
                if value is None:
                    continue
                record = decode_record(value)
                if record is not None:
                    state.apply(record)
                    continue
                deleted = partition_delete(value)
                if deleted is not None:
                    state.delete_partition(*deleted)
    return state.live()


# -- 2. the plan ----------------------------------------------------------------------------


@dataclass
class TierPlan:
    """What :func:`plan_tier` decided: the tier's tasks, and per partition where the offsets
    left for Fetch begin (the partition's start when the tier has nothing for it)."""

    ranges: list[TierRange]
    fetch_from: dict[TopicPartition, int]
    aborted: int = 0  # aborted transactions found in the tier's part

    @property
    def offsets(self) -> int:
        return sum(r.until - r.start_offset for r in self.ranges)


def tier_part(
    segments: list[RemoteSegment], start: int, end: int
) -> tuple[list[RemoteSegment], int]:
    """The segments holding ``[start, end)`` contiguously from ``start``, and where that run
    ends (``start`` itself when the tier does not hold ``start``)."""
    taken: list[RemoteSegment] = []
    at = start
    for seg in segments:
        if seg.end_offset < at:
            continue
        if seg.start_offset > at or at >= end:
            break
        taken.append(seg)
        at = seg.end_offset + 1
    return taken, min(at, end) if taken else start


def plan_tier(
    bootstrap: str,
    root: str,
    starts: Mapping[TopicPartition, int],
    ends: Mapping[TopicPartition, int],
    *,
    config: ClientConfig | None = None,
    settings: StorageSettings | None = None,
    read_committed: bool = True,
    segments: Mapping[TopicPartition, list[RemoteSegment]] | None = None,
) -> TierPlan:
    """The tier's part of reading ``[starts[tp], ends[tp])`` of each partition (module
    docstring, steps 2 and 3). ``segments``: the live segments when already known (else read
    from ``__remote_log_metadata``)."""
    live = remote_segments(bootstrap, config=config) if segments is None else segments
    resolved = settings if settings is not None else StorageSettings.default()
    plan = TierPlan([], {})
    store: ObjectStore | None = None
    for tp, start in sorted(starts.items()):
        end = ends.get(tp, start)
        taken, tier_end = tier_part(live.get(tp, []), start, end)
        plan.fetch_from[tp] = tier_end
        if not taken:
            continue
        aborted: AbortedRanges | None = None
        if read_committed:
            if store is None:
                store = tier_store(root, resolved)
            aborted = _aborted(store, bootstrap, config, tp, taken, tier_end)
            plan.aborted += len(aborted)
        for seg in taken:
            low, high = max(start, seg.start_offset), min(end, seg.end_offset + 1)
            part = None if aborted is None else aborted.overlapping(low, high)
            plan.ranges.append(
                TierRange(
                    seg, low, high, root, resolved, part if part is not None and len(part) else None
                )
            )
    return plan


def _txn_index(store: ObjectStore, seg: RemoteSegment) -> bytes:
    keys = layout.segment_keys("", seg)
    manifest = layout.parse_manifest(
        store.read(keys[layout.MANIFEST]), path=store.uri(keys[layout.MANIFEST])
    )
    where = manifest.indexes.get("transaction")
    if where is None or where[1] == 0:
        return b""
    return store.read_range(keys[layout.INDEXES], offset=where[0], length=where[1])


def _aborted(  # noqa: PLR0917
    store: ObjectStore,
    bootstrap: str,
    config: ClientConfig | None,
    tp: TopicPartition,
    taken: list[RemoteSegment],
    tier_end: int,
) -> AbortedRanges:
    """The aborted transactions reaching the tier's part ``taken`` of ``tp`` (step 3)."""
    from logstore.storage.txn_index import decode_entries  # noqa: PLC0415

    pids: list[int] = []
    firsts: list[int] = []
    lasts: list[int] = []
    low = taken[0].start_offset
    for seg in taken:
        if seg.txn_index_empty:
            continue
        for e in decode_entries(_txn_index(store, seg), path=f"{tp[0]}-{tp[1]}/{seg.segment_id}"):
            if e.last_offset >= low:
                pids.append(e.producer_id)
                firsts.append(e.first_offset)
                lasts.append(e.last_offset)
    # transactions whose ABORT marker is past the tier: listed by a Fetch at the tier's end
    rng = FetchRange(tp[0], tp[1], tier_end, tier_end + 1, bootstrap, config, 1)
    for pid, first in aborted_transactions_at(rng):
        if first < tier_end:
            pids.append(pid)
            firsts.append(first)
            lasts.append(MAX_OFFSET)
    return AbortedRanges.of(pids, firsts, lasts)


# -- executor side --------------------------------------------------------------------------


def _start_position(store: ObjectStore, seg: RemoteSegment, manifest: layout.Manifest,
                    offset: int) -> int:  # fmt: skip
    where = manifest.indexes.get("offset")
    if offset <= seg.start_offset or where is None or where[1] == 0:
        return 0
    key = layout.segment_keys("", seg)[layout.INDEXES]
    index = bytearray(where[1])  # one GET, no HEAD (:func:`_read_manifest`)
    got = store.read_range_into(key, offset=where[0], into=memoryview(index))
    return layout.floor_position(bytes(index[:got]), offset - seg.start_offset)


def _read_manifest(store: ObjectStore, key: str) -> bytes:
    """The ``.rsm-manifest`` object: one GET into a window buffer, read whole by the store
    only when it fills it (a manifest is kilobytes). Why not ``store.read`` (pyarrow's: a HEAD,
    then the GET): measured on the tests' S3 server (2026-11-28), 3.25 ms of the server's CPU
    and 0.69 ms of ours a manifest that way, 1.40 and 0.25 ms this way; a segment of the tier
    bench holds ~80k records, so that is ~25 ns a record of the S3 server's CPU."""
    buf = _take_buffer(_HEADROOM)
    try:
        got = store.read_range_into(key, offset=0, into=buf.data[:_HEADROOM])
        if got < _HEADROOM:
            return buf[:got].tobytes()
    finally:
        _give_back(buf)
    return store.read(key)


def _with_positions(batch: pa.RecordBatch, shift: int, column: str) -> pa.RecordBatch:
    """``column`` (a position) from the window's to the segment's (``shift``: the window's
    start)."""
    if not shift:
        return batch
    at = batch.schema.get_field_index(column)
    moved = pc.add(batch.column(at), pa.scalar(shift, pa.int64()))
    return batch.set_column(at, batch.schema.field(at), moved)


def next_tier_ranges(task: Sequence[object], i: int) -> tuple[TierRange, ...]:
    """The ranges a task reads after its ``i``-th, up to :data:`READ_AHEAD` of them and as long
    as they are :class:`TierRange` s too (the ``after`` of :func:`read_tier_range`: their
    openings are started ahead)."""
    out: list[TierRange] = []
    for nxt in task[i + 1 : i + 1 + READ_AHEAD]:
        if not isinstance(nxt, TierRange):
            break
        out.append(nxt)
    return tuple(out)


def read_tier_range(
    rng: TierRange,
    *,
    min_timestamp: int,
    max_timestamp: int,
    window_bytes: int = DEFAULT_WINDOW_BYTES,
    on_decode_error: str = "skip",
    report: Any = None,
    after: Sequence[TierRange] = (),
) -> Iterator[pa.RecordBatch]:
    """The records of ``rng`` as :data:`RECORDS_ARROW_SCHEMA` batches (module docstring,
    executor side); ``report``: a :class:`~pipelines.sources.read.RangeReport` filled as the
    windows are read; ``after``: the ranges read next (:func:`read_tier_windows`)."""
    # Imported here: the driver plans without loading the decoder (numba).
    from pipelines.sources.read import read_records  # noqa: PLC0415

    def read(window: SegmentRange, data: memoryview, part: Any) -> Iterator[pa.RecordBatch]:
        return read_records(
            window, min_timestamp=min_timestamp, max_timestamp=max_timestamp,
            on_decode_error=on_decode_error, report=part, aborted=rng.aborted, data=data,
        )  # fmt: skip

    yield from read_tier_windows(
        rng, read, position="batch_position", window_bytes=window_bytes, report=report,
        after=after,
    )  # fmt: skip


WindowRead = Callable[[SegmentRange, memoryview, Any], Iterator[pa.RecordBatch]]


def read_tier_windows(
    rng: TierRange,
    read: WindowRead,
    *,
    position: str,
    window_bytes: int = DEFAULT_WINDOW_BYTES,
    report: Any = None,
    after: Sequence[TierRange] = (),
) -> Iterator[pa.RecordBatch]:
    """``rng`` read window by window (module docstring, executor side): ``read(window, data,
    part)`` reads one window (a :class:`SegmentRange` over ``data``, the bytes fetched: as
    :func:`~pipelines.sources.read.read_records` or ``read_batches`` with ``data=``), filling
    ``part`` (a :class:`~pipelines.sources.read.RangeReport`: at least ``last_end``, one past
    the last sound batch read); its batches' ``position`` column, an offset in ``data``, is
    made the segment's. ``report``: every window's ``part`` merged into it. ``after``: the
    ranges the caller reads next, in order (its task's next remote segments,
    :func:`next_tier_ranges`): once this range's last window is asked for, as many of them as
    leave :data:`READ_AHEAD` GETs in flight (one at least) are opened (manifest, start
    position, first window) on threads while this range's windows are decoded."""
    from pipelines.sources.read import RangeReport  # noqa: PLC0415

    if window_bytes < 1:
        raise InvalidConfigError(f"window_bytes must be positive, got {window_bytes}")
    seg = rng.segment
    ahead_of = _take_opened(rng, window_bytes, after)
    opened = ahead_of.result() if ahead_of is not None else _open(rng, window_bytes)
    chunks = opened.manifest.chunks
    pos = opened.pos
    offset = rng.start_offset
    uri = opened.store.uri(opened.keys[layout.LOG])
    read_at = opened.read_at

    # READ_AHEAD GETs ahead: the next windows' bytes arrive while this one's are decoded;
    # once the last is asked for, the openings of the ranges read next (``after``).
    ahead = ThreadPoolExecutor(READ_AHEAD, thread_name_prefix="tier-read-ahead")
    try:
        pending: deque[Future[_Window]] = deque()
        next_at = read_at  # where the next window requested starts
        if opened.first is not None:
            pending.append(Future())
            pending[0].set_result(opened.first)
            next_at += opened.first.size
        carry, base = b"", pos  # bytes read but not decoded yet, from position ``base`` on
        while pending and offset < rng.until:
            fresh = pending.popleft().result()
            read_at += fresh.size
            at_end = read_at >= chunks.file_size
            while len(pending) < READ_AHEAD and next_at < chunks.file_size:
                pending.append(ahead.submit(opened.get, next_at))
                next_at += opened.step
            if after and next_at >= chunks.file_size:
                _open_ahead(after[: max(1, READ_AHEAD - len(pending))], window_bytes)
                after = ()
            if not carry:
                base = read_at - fresh.size
            data = fresh.with_carry(carry)
            skip = pos - base
            end, cut = _whole_frames(data, skip, at_end)
            if end == skip and cut:  # a batch larger than what is read so far: read on
                carry, base = bytes(data[skip:]), pos
                _give_back(fresh.buf)
                continue
            window = SegmentRange(
                topic=seg.topic,
                partition=seg.partition,
                path=uri,
                segment_base_offset=seg.start_offset,
                start=skip,
                end=end,
                start_offset=offset,
                until=rng.until,
                next_base_offset=seg.end_offset + 1,
                is_tail=cut,  # only after damage: the batch cut by the window's end is read on
            )
            part = RangeReport(seg.topic, seg.partition)
            for batch in read(window, data, part):
                yield _with_positions(batch, base, position)
            if report is not None:
                merge_report(report, part)
            if part.last_end is not None:
                offset = max(offset, part.last_end)
            done = end if not cut else _end_position(part, data, skip, end)
            pos = base + done
            carry, base = bytes(data[done:]), pos
            # Read whole (the decoded batches are copies): the next GET may fill it. A window
            # left half-read (the caller stopped, an error) is never given back.
            _give_back(fresh.buf)
    finally:
        ahead.shutdown(wait=False, cancel_futures=True)


# Room before a window's bytes in its buffer for the tail of the window before (the batch
# its end cut, up to a megabyte: Kafka's default message.max.bytes), so that the two are
# contiguous without a copy of the window; a longer tail is joined by a copy.
_HEADROOM = 1 << 20
# Window buffers free for reuse (a process reads a range at a time: the window decoded and the
# READ_AHEAD arriving are in use; an opening started ahead takes one more at most).
# Why reused: a fresh buffer of 9 MiB costs its page faults on first touch, per window.
_POOL: list[np.ndarray] = []
_POOL_MAX = READ_AHEAD + 2
_POOL_LOCK = threading.Lock()


def _take_buffer(size: int) -> np.ndarray:
    with _POOL_LOCK:
        for i, buf in enumerate(_POOL):
            if buf.shape[0] >= size:
                return _POOL.pop(i)
    return np.empty(size, np.uint8)


def _give_back(buf: np.ndarray) -> None:
    """``buf`` free for the next window: nothing reads or writes it any more."""
    with _POOL_LOCK:
        if len(_POOL) < _POOL_MAX:
            _POOL.append(buf)


@dataclass
class _Window:
    """A window's bytes: ``buf[_HEADROOM : _HEADROOM + size]``."""

    buf: np.ndarray
    size: int

    def with_carry(self, carry: bytes) -> memoryview:
        """``carry`` then the window's bytes, contiguous: the carry copied into the headroom
        before them (a carry longer than the headroom: both joined in a new buffer)."""
        view = self.buf.data
        if len(carry) > _HEADROOM:
            return memoryview(carry + view[_HEADROOM : _HEADROOM + self.size].tobytes())
        at = _HEADROOM - len(carry)
        view[at:_HEADROOM] = carry
        return view[at : _HEADROOM + self.size]


@dataclass
class _Opened:
    """A range opened for reading: its store and keys, manifest, start position, where its
    first window starts (``read_at``, a chunk's start) and, once fetched, that window."""

    store: ObjectStore
    keys: dict[str, str]
    manifest: layout.Manifest
    pos: int
    read_at: int
    step: int  # bytes a window: whole chunks
    first: _Window | None = None

    def get(self, at: int) -> _Window:
        """The file's bytes ``[at, at + step)`` (``at`` a chunk's start): one ranged GET of
        the chunks into a window buffer (:meth:`ObjectStore.read_range_into`, no copy);
        compressed ones (``rsm.config.compression.enabled``, the manifest's variable index
        giving each zstd frame's size) decompressed frame by frame, then copied in."""
        chunks, key = self.manifest.chunks, self.keys[layout.LOG]
        want = min(self.step, chunks.file_size - at)
        buf = _take_buffer(_HEADROOM + self.step)
        try:
            got = self._get_into(at, want, buf.data[_HEADROOM:])
        except BaseException:
            _give_back(buf)
            raise
        if got < want:
            _give_back(buf)
            raise LoglakeError(
                f"{self.store.uri(key)}: {got} bytes at {at}, the manifest says "
                f"{chunks.file_size} bytes in all (the object is shorter than its manifest)"
            )
        return _Window(buf, got)

    def _get_into(self, at: int, want: int, into: memoryview) -> int:
        chunks, key = self.manifest.chunks, self.keys[layout.LOG]
        if self.manifest.compression:
            wanted = chunks.chunks_for(at, want)
            first, _ = chunks.chunk_range(wanted[0])
            last_at, last_len = chunks.chunk_range(wanted[-1])
            raw = self.store.read_range(key, offset=first, length=last_at + last_len - first)
            frames = []
            for i in wanted:
                frame_at, frame_len = chunks.chunk_range(i)
                frame = raw[frame_at - first : frame_at - first + frame_len]
                frames.append(layout.decompress_chunk(frame, max_size=chunks.chunk_size))
            got = b"".join(frames)
            if len(got) > len(into):
                raise CorruptIndexError(
                    f"{self.store.uri(key)}: chunks from {at} decompress to {len(got)} bytes, "
                    f"more than the {want} of the file they hold"
                )
            into[: len(got)] = got
            return len(got)
        return self.store.read_range_into(key, offset=at, into=into[:want])


def _open(rng: TierRange, window_bytes: int, *, first: bool = True) -> _Opened:
    """``rng`` opened: its manifest, its start position (from the offset index when it starts
    inside the segment) and, with ``first``, its first window fetched."""
    seg = rng.segment
    store = tier_store(rng.root, rng.settings)
    keys = layout.segment_keys("", seg)
    manifest = layout.parse_manifest(
        _read_manifest(store, keys[layout.MANIFEST]),
        path=store.uri(keys[layout.MANIFEST]),
        allow_compression=True,
    )
    chunks = manifest.chunks
    pos = _start_position(store, seg, manifest, rng.start_offset)
    step = max(1, window_bytes // chunks.chunk_size) * chunks.chunk_size  # whole chunks a GET
    opened = _Opened(store, keys, manifest, pos, pos // chunks.chunk_size * chunks.chunk_size, step)
    if first and opened.read_at < chunks.file_size:
        opened.first = opened.get(opened.read_at)
    return opened


# The openings of the ranges a task reads next, started once this one's last window is asked
# for (a task reads several remote segments one after the other; each began with its manifest
# and first window's GETs waited for, the cores idle; segments of one window each had one GET
# in flight). One pool per process: a Spark Python worker runs one task at a time; a range
# found here is only a head start, never needed for correctness.
_OPENER: ThreadPoolExecutor | None = None
_OPENED: dict[tuple[Any, ...], Future[_Opened]] = {}
_OPENED_LOCK = threading.Lock()


def _forget_opener() -> None:
    """In a forked child (Spark's worker daemon forks its workers): the parent's opener
    thread does not exist there, nor do its head starts."""
    global _OPENER, _OPENED_LOCK, _POOL_LOCK  # noqa: PLW0603
    _OPENER = None
    _OPENED.clear()
    _OPENED_LOCK = threading.Lock()
    _POOL.clear()
    _POOL_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_opener)


def _range_key(rng: TierRange, window_bytes: int) -> tuple[Any, ...]:
    return (rng.root, rng.segment.segment_id, rng.start_offset, rng.until, window_bytes)


def _open_ahead(ranges: Sequence[TierRange], window_bytes: int) -> None:
    """Head starts for ``ranges`` (those not started yet). Head starts of other ranges are
    kept: those past ``ranges`` (the range before opened further ahead) are this task's; a
    stale one is dropped by :func:`_take_opened`, which every range's read calls first."""
    global _OPENER  # noqa: PLW0603  (one opener pool per process, made on first use)
    with _OPENED_LOCK:
        if _OPENER is None:
            _OPENER = ThreadPoolExecutor(READ_AHEAD, thread_name_prefix="tier-open-ahead")
        for rng in ranges:
            key = _range_key(rng, window_bytes)
            if key not in _OPENED:
                _OPENED[key] = _OPENER.submit(_open, rng, window_bytes)


def _take_opened(
    rng: TierRange, window_bytes: int, after: Sequence[TierRange]
) -> Future[_Opened] | None:
    """``rng``'s head start, if one was made; any other head start but those of ``after``
    (the ranges read next, opened ahead by the range before) is dropped: an earlier task's,
    never used, is not kept to be taken later with bytes fetched long before."""
    with _OPENED_LOCK:
        found = _OPENED.pop(_range_key(rng, window_bytes), None)
        keep = {_range_key(r, window_bytes) for r in after}
        for key in [k for k in _OPENED if k not in keep]:
            del _OPENED[key]
        return found


def _whole_frames(data: memoryview, skip: int, at_end: bool) -> tuple[int, bool]:
    """``(end, cut)``: the window's range ends at ``end``, after its last whole batch, so
    that the batch cut by the window's end is read whole by the next window and is no gap
    (``cut`` False). Where the frames cannot be walked to there (damage, resynchronised by
    the reader), the range is the whole window and its cut tail is a soft gap (``cut``)."""
    if at_end:
        return len(data), False
    # Imported here: the driver never loads the decoder (numba).
    from pipelines.decode.batches import scan_batches  # noqa: PLC0415

    scan = scan_batches(np.frombuffer(data, np.uint8), start=skip)
    if scan.stop == "torn":
        if scan.end == skip:
            return skip, True  # the first frame is cut: a window too small for it
        return scan.end, False
    return len(data), scan.stop != "end" or scan.end < len(data)


def _end_position(part: Any, data: memoryview, skip: int, end: int) -> int:
    """Where in ``data`` the last whole batch ``part`` read ends (after damage)."""
    from pipelines.decode.batches import scan_batches  # noqa: PLC0415

    if part.last_end is None:
        return end
    scan = scan_batches(np.frombuffer(data, np.uint8), start=skip)
    found = np.flatnonzero(scan.last_offset < part.last_end)
    if not found.shape[0]:
        return end
    k = int(found[-1])
    return int(scan.position[k]) + int(scan.size[k])


def tier_tasks(
    ranges: list[TierRange],
    cores: int,
    *,
    max_bytes: int = DEFAULT_TASK_BYTES,
    min_bytes: int | None = None,
) -> list[list[TierRange]]:
    """``ranges`` (in plan order) cut into tasks of consecutive segments that run out small,
    the log-dir path's guided self-scheduling (:func:`pipelines.ingest.schedule_tasks`, by
    the segments' bytes): a task takes ``max_bytes`` while more than ``cores`` such tasks are
    left, then a core's share of the rest, and so on down to ``min_bytes`` (default a
    ``PIECES_PER_TASK``-th, 8, of ``max_bytes``) or one segment; a rest under half of that
    joins the last task.

    Why not one task per core (as before): tasks of equal bytes do not finish together on a
    shared machine (measured for the log-dir path, :func:`~pipelines.ingest.schedule_tasks`),
    and with one task a core, a core that finished first idled while the other one still
    read; the tasks after them (the active segments through Fetch) waited as long. Why not a
    task per segment: each task costs a worker round trip and a Parquet file (that was slower
    than Fetch in two tasks, seen in ``tests/perf/bench_tier_ingest.py``). Measured against
    one task a core, 6 paired runs of 1M records at load 3: medians 0.363 and 0.370 s, no
    difference there; at 10M and load 12-13 the machine's noise (7.6-14.2 s) hid any."""
    sizes = [_range_bytes(r) for r in ranges]
    smallest = max_bytes // 8 if min_bytes is None else min_bytes
    return [list(ranges[lo:hi]) for lo, hi in guided_cuts(sizes, cores, max_bytes, smallest)]


def _range_bytes(rng: TierRange) -> int:
    """About how many of its segment's bytes ``rng`` reads (its share of the offsets)."""
    seg = rng.segment
    span = max(1, seg.end_offset + 1 - seg.start_offset)
    return max(1, seg.segment_size * (rng.until - rng.start_offset) // span)


def plan_summary(plan: TierPlan, parts: Iterable[TopicPartition]) -> str:
    """One line for the run's log: what the tier holds of the partitions read."""
    by_tp: dict[TopicPartition, int] = {}
    for r in plan.ranges:
        by_tp[(r.topic, r.partition)] = (
            by_tp.get((r.topic, r.partition), 0) + r.until - r.start_offset
        )
    n = len(list(parts))
    return (
        f"tier: {plan.offsets} offsets of {len(by_tp)}/{n} partitions in {len(plan.ranges)} "
        f"remote segments ({plan.aborted} aborted transactions reach them)"
    )
