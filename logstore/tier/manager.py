"""The broker's remote log manager (KIP-405): copy closed segments to the tier, expire them, read.

One tier thread (never a network thread) runs :meth:`RemoteLogManager.run_once` every
``remote.log.manager.task.interval.ms``; remote reads run on a small worker pool
(:meth:`RemoteLogManager.submit`), so a Fetch below the local log start never blocks the
network threads on the store. The ``.log`` uploads (the bulk of a copy's time and CPU) run on
one more thread at nice 10, the tier thread waiting for each: background work yields to the
request threads on a loaded machine, while the tier thread, which takes user logs' locks
(local retention) and the GIL, keeps the request threads' priority (a starved nice thread
holding either would stall produce).

Copy, per partition of a topic with ``remote.storage.enable=true`` (never a compacted one), for
each rolled segment whose offsets are all below the high watermark and above the highest
tiered offset, oldest first (steps, each a failpoint ``tier.<step>``):

1. ``COPY_SEGMENT_STARTED`` appended to ``__remote_log_metadata`` (``copy_started``);
2. ``.log`` uploaded (``log_uploaded``; with ``rsm.config.compression.enabled`` one zstd frame
   per chunk, the plugin's format), 3. ``.indexes`` (``indexes_uploaded``),
4. ``.rsm-manifest`` (``manifest_uploaded``) — :mod:`logstore.tier.layout`;
5. ``COPY_SEGMENT_FINISHED`` appended and fsynced (``copy_finished``): only now is the segment
   remote, the highest tiered offset (Kafka's copy progress: the end offset of the newest
   COPY_SEGMENT_FINISHED segment, rebuilt from the metadata at start) moves to its end.

Local retention (Kafka's ``local.retention.*``, -2 meaning ``retention.*``): the broker's periodic
retention skips tiered logs (:meth:`LogManager.cleanup_logs`); here local segments go by the
local rules, and only those wholly at or below the highest tiered offset, i.e. only after their
FINISHED record is durable, and (with ``log.retention.lake.group``) only those the lake has
ingested, as for any log (the jobs read the log dirs). The local log start then moves; the
partition's log start offset (:meth:`log_start_offset`, what Fetch and ListOffsets report)
is the earliest live remote segment's start offset.

Remote retention by the total ``retention.ms``/``retention.bytes`` (size = live remote segments
+ local bytes not tiered yet): ``DELETE_SEGMENT_STARTED`` (``delete_started``), the three
objects deleted (``objects_deleted``), ``DELETE_SEGMENT_FINISHED`` (``delete_finished``).

Metadata writes fsync the metadata partition before the step after them (``metadata_appended``
is the failpoint between append and fsync).

DeleteRecords on a tiered partition (:meth:`delete_records`) moves the partition's log start
below or above the local part: kept durable in ``remote-log-start-offset`` (a checkpoint file
in the partition directory, since the log's own log start offset is the local part's); the
next pass deletes the remote segments wholly below it (Kafka's first retention rule).

Reads (:mod:`logstore.tier.reads`, a mixin: :meth:`read`, :meth:`offset_for_timestamp`, the max
timestamp; the bytes through :class:`~logstore.tier.reader.SegmentReader`): the remote segment
holding the offset (the live list is a snapshot sorted by start offset), its manifest and offset
index (the floor entry gives the position), then the ``.log`` chunks covering the bytes wanted,
all through a byte-bounded LRU (``rsm.config.fetch.chunk.cache.size``); whole batches only, at
least one (KIP-74), and for READ_COMMITTED the aborted transactions overlapping them: from the
fetched segment's transaction index and the following segments' (remote, then local), until one
past the last offset read (:meth:`_aborted`, as Kafka).
ListOffsets by timestamp looks in the remote segments below the local log start first, as
Kafka. Every failure is logged with the segment and becomes the partition's error code
(``KAFKA_STORAGE_ERROR`` for a store error or a missing object), never an empty answer.

Deleting a topic deletes its remote data, as Kafka (:meth:`mark_deleted`, after the broker
removed the logs): ``DELETE_PARTITION_MARKED`` per partition with remote segments
(``partition_delete_marked``); the tier thread then writes ``DELETE_PARTITION_STARTED``
(``partition_delete_started``), deletes each segment as retention does, and writes
``DELETE_PARTITION_FINISHED`` (``partition_delete_finished``). The state is kept by topic id:
a topic created again with the same name has a new id and never sees the old segments.

Crash behaviour: at start the metadata is read back from ``__remote_log_metadata``. A
partition whose last delete record is MARKED or STARTED is deleted on; remote segments of a
topic id the broker no longer has and no unfinished delete (a crash after the logs went and
before the mark) are marked then deleted. A segment
whose last record is COPY_SEGMENT_STARTED (a copy cut short) or DELETE_SEGMENT_STARTED (a
delete cut short) is cleaned: DELETE_SEGMENT_STARTED, its objects deleted (absent ones are
fine), DELETE_SEGMENT_FINISHED; an interrupted copy is then done again under a new segment id,
because the highest tiered offset did not move. Nothing local was deleted for it (step 5 came
first). Store failures (unreachable, throttling after the store's retries) stop the partition's
pass, logged; the next pass resumes. Produce and local fetch never wait for the tier.

Thread-safety: :attr:`_lock` guards the metadata state; the tier thread is the only writer of
the store; readers (the pool) read the state through snapshots.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from logstore.errors import (
    CorruptRecordError,
    InvalidConfigError,
    LoglakeError,
    ObjectStoreError,
    StorageError,
)
from logstore.failpoints import failpoint
from logstore.objectstore import LakeLocation, ObjectStore, StorageSettings
from logstore.protocol.records import build_batch
from logstore.storage.checkpoints import read_checkpoint_lines, write_checkpoint_lines
from logstore.storage.files import INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, segment_path
from logstore.storage.log import Log
from logstore.storage.log_manager import LogManager
from logstore.storage.producer_snapshot import snapshot_path
from logstore.storage.retention import retention_plan, size_breached, time_breached
from logstore.tier import layout
from logstore.tier.metadata import (
    METADATA_TOPIC,
    PartitionDelete,
    PartitionDeleteState,
    RemoteSegment,
    SegmentState,
    SegmentUpdate,
    decode_metadata,
    encode_partition_delete,
    encode_segment,
    encode_update,
    kafka_uuid,
    metadata_partition,
)
from logstore.tier.reader import ChunkCache, SegmentReader
from logstore.tier.reads import RemoteReads

__all__ = ["RemoteLogManager", "TierConfig"]

_log = logging.getLogger(__name__)
T = TypeVar("T")
FLOOR_FILE = "remote-log-start-offset"
_UNFINISHED = (SegmentState.COPY_SEGMENT_STARTED, SegmentState.DELETE_SEGMENT_STARTED)


@dataclass(frozen=True, slots=True, kw_only=True)
class TierConfig:
    """The broker's tier settings (``remote.log.*``, ``rsm.config.*``, ``rlmm.config.*``)."""

    bucket: str
    settings: StorageSettings
    key_prefix: str = ""
    chunk_size: int = 4 * 1024 * 1024
    interval_ms: int = 30_000
    metadata_partitions: int = 50
    cache_bytes: int = 64 * 1024 * 1024
    reader_threads: int = 2
    compression: bool = False  # rsm.config.compression.enabled: each chunk a zstd frame

    @classmethod
    def from_broker(cls, config: Any) -> TierConfig | None:
        """From a :class:`~logstore.server.config.BrokerConfig`; None when
        ``remote.log.storage.system.enable`` is false. :class:`InvalidConfigError` for a
        missing bucket or an option the plugin has and this tier does not."""
        if not config.get_bool("remote.log.storage.system.enable"):
            return None
        bucket = config.get_str("rsm.config.storage.s3.bucket.name")
        if not bucket:
            raise InvalidConfigError(
                "remote.log.storage.system.enable=true needs rsm.config.storage.s3.bucket.name"
            )
        if config.get_bool("rsm.config.encryption.enabled"):
            raise InvalidConfigError(
                "rsm.config.encryption.enabled=true is not supported by loglake's tier"
            )
        overrides: dict[str, Any] = {}
        for key, name in (
            ("rsm.config.storage.s3.endpoint.url", "endpoint_url"),
            ("rsm.config.storage.s3.region", "region"),
        ):
            if config.get_str(key):
                overrides[name] = config.get_str(key)
        for key, name in (
            ("rsm.config.storage.aws.access.key.id", "access_key_id"),
            ("rsm.config.storage.aws.secret.access.key", "secret_access_key"),
        ):
            value = config.values.get(key)
            if value:
                overrides[name] = str(value)
        return cls(
            bucket=bucket,
            settings=StorageSettings.from_environment(overrides),
            key_prefix=config.get_str("rsm.config.key.prefix"),
            chunk_size=config.get_int("rsm.config.chunk.size"),
            interval_ms=config.get_int("remote.log.manager.task.interval.ms"),
            metadata_partitions=config.get_int(
                "rlmm.config.remote.log.metadata.topic.num.partitions"
            ),
            cache_bytes=config.get_int("rsm.config.fetch.chunk.cache.size"),
            compression=config.get_bool("rsm.config.compression.enabled"),
        )


class RemoteLogManager(RemoteReads):
    """See the module docstring. ``partition_log(topic, partition)`` gives a user partition's
    log (None when gone); ``topic_id(topic)`` its id."""

    def __init__(
        self,
        log_manager: LogManager,
        config: TierConfig,
        *,
        broker_id: int,
        store: ObjectStore | None = None,
    ) -> None:
        self._logs = log_manager
        self.config = config
        self.broker_id = broker_id
        # a segment's .indexes, manifest and a .log under 10 MiB: one PUT each, loglake's own
        # (unsigned payload, CRC32C: no SHA-256 pass over every segment on the broker)
        self.store = store or ObjectStore(
            LakeLocation("s3", config.bucket, "", config.bucket),
            settings=config.settings,
            unsigned_put_small=True,
        )
        self._lock = threading.RLock()
        # (topic id, partition) -> {segment id: metadata with its latest state}; by topic id,
        # so that a topic deleted and created again never sees the old one's segments
        self._segments: dict[tuple[uuid.UUID, int], dict[uuid.UUID, RemoteSegment]] = {}
        self._live: dict[tuple[uuid.UUID, int], list[RemoteSegment]] = {}
        # (topic id, partition) -> the latest partition-delete record (deleted topics)
        self._deletes: dict[tuple[uuid.UUID, int], PartitionDelete] = {}
        self._mark_lock = threading.Lock()  # one marker of a partition: DeleteTopics or tier
        self.reader = SegmentReader(
            self.store, ChunkCache(config.cache_bytes), key_prefix=config.key_prefix
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(config.reader_threads, thread_name_prefix="tier-reader")
        # the .log uploads (reading the segment, compressing, sending): background work, at
        # nice 10 so that on a loaded machine the request threads go first. Only they: the
        # tier thread itself takes the user log's lock (local retention, with a checkpoint
        # fsync under it) and the GIL, and a starved nice thread holding either stalls
        # produce (priority inversion)
        self._uploader = ThreadPoolExecutor(
            1, thread_name_prefix="tier-upload", initializer=_lower_priority
        )
        self._warned: set[str] = set()
        self._floors: dict[tuple[str, int], int] = {}

    # -- state ----------------------------------------------------------------------------------

    def live_segments(self, topic: str, partition: int) -> list[RemoteSegment]:
        """The COPY_SEGMENT_FINISHED segments of a partition of the topic named ``topic`` now
        (by its topic id), by start offset (a snapshot, rebuilt on each metadata change:
        Fetch reads it on the network threads)."""
        topic_id = self._logs.topic_id(topic)
        if topic_id is None:
            return []
        return self._live.get((topic_id, partition), [])

    def highest_tiered_offset(self, topic: str, partition: int) -> int:
        """The last offset of the newest tiered segment, -1 when none (Kafka's copy progress)."""
        live = self.live_segments(topic, partition)
        return live[-1].end_offset if live else -1

    def log_start_offset(self, topic: str, partition: int, local_start: int) -> int:
        """The partition's log start offset: the earliest live remote segment's start (else
        the local one), at least the DeleteRecords floor (:meth:`delete_records`)."""
        live = self.live_segments(topic, partition)
        start = min(live[0].start_offset, local_start) if live else local_start
        return max(start, self._floor(topic, partition))

    def _floor(self, topic: str, partition: int) -> int:
        key = (topic, partition)
        found = self._floors.get(key)
        if found is None:
            lg = self._logs.get_log(topic, partition)
            lines = [] if lg is None else read_checkpoint_lines(lg.dir / FLOOR_FILE, fields=1)
            found = int(lines[0][0]) if lines else 0
            self._floors[key] = found
        return found

    def delete_records(self, log: Log, offset: int) -> int:
        """Kafka's DeleteRecords on a tiered partition: the log start offset becomes
        ``offset`` (kept durable in ``remote-log-start-offset`` in the partition directory, the
        local log start being only the local part's), reads below it are out of range, and
        the next tier pass deletes the remote segments wholly below it. The new start."""
        with self._lock:
            if offset > self._floor(log.topic, log.partition):
                write_checkpoint_lines(log.dir / FLOOR_FILE, [str(offset)])
                self._floors[(log.topic, log.partition)] = offset
        return self.log_start_offset(log.topic, log.partition, log.log_start_offset)

    def is_tiered(self, log: Log) -> bool:
        return log.config.tiered and not log.topic.startswith("__")

    # -- metadata log ---------------------------------------------------------------------------

    def _metadata_log(self, topic_id: uuid.UUID, partition: int) -> Log:
        p = metadata_partition(topic_id, partition, self.config.metadata_partitions)
        lg = self._logs.get_log(METADATA_TOPIC, p)
        if lg is None:
            # Kafka's remote.log.metadata.topic.retention.ms default: keep every record
            self._logs.set_topic_config(METADATA_TOPIC, {"retention.ms": "-1"})
            lg = self._logs.get_or_create_log(METADATA_TOPIC, p)
        return lg

    def _create_metadata_topic(self) -> None:
        """Every partition of ``__remote_log_metadata`` at once
        (``rlmm.config.remote.log.metadata.topic.num.partitions``), as Kafka's RLMM creates the
        topic when it starts: Metadata lists a topic's partitions 0..max, and one created only
        on first use would answer UNKNOWN_TOPIC_OR_PARTITION to ListOffsets and Fetch (a
        consumer of the topic, such as the jobs' tier reader, could not read it). 50 empty
        partition directories cost about 0.6 s once (fsyncs; measured on a loaded 2-core
        machine), paid at the first start with tiering on only: partitions that exist are
        kept (a restart creates none), so listing only existing ones was not worth a
        Metadata that differs from Kafka's."""
        started = time.perf_counter()
        missing = [
            p
            for p in range(self.config.metadata_partitions)
            if self._logs.get_log(METADATA_TOPIC, p) is None
        ]
        if not missing:
            return
        # Kafka's remote.log.metadata.topic.retention.ms default: keep every record
        self._logs.set_topic_config(METADATA_TOPIC, {"retention.ms": "-1"})
        for p in missing:
            self._logs.get_or_create_log(METADATA_TOPIC, p)
        _log.info(
            "%s: created %d partitions in %.1f ms",
            METADATA_TOPIC,
            len(missing),
            (time.perf_counter() - started) * 1000,
        )

    def _append(self, record: RemoteSegment | SegmentUpdate | PartitionDelete) -> None:
        if isinstance(record, RemoteSegment):
            value = encode_segment(record)
        elif isinstance(record, SegmentUpdate):
            value = encode_update(record)
        else:
            value = encode_partition_delete(record)
        lg = self._metadata_log(record.topic_id, record.partition)
        now = int(time.time() * 1000)
        with lg.lock:
            lg.append(build_batch([(None, value, (), now)], base_timestamp=now), now_ms=now)
            lg.high_watermark = lg.log_end_offset
        failpoint("tier.metadata_appended")
        lg.flush()
        self._apply(record)

    def _apply(self, record: RemoteSegment | SegmentUpdate | PartitionDelete) -> None:
        key = (record.topic_id, record.partition)
        with self._lock:
            if isinstance(record, PartitionDelete):
                self._deletes[key] = record
                return
            segs = self._segments.setdefault(key, {})
            if isinstance(record, RemoteSegment):
                segs[record.segment_id] = record
            elif (old := segs.get(record.segment_id)) is None:
                _log.warning("remote log metadata: update of unknown segment %s", record)
                return
            elif record.state == SegmentState.DELETE_SEGMENT_FINISHED:
                segs.pop(record.segment_id, None)
            else:
                segs[record.segment_id] = replace(old, state=record.state)
            live = [s for s in segs.values() if s.state == SegmentState.COPY_SEGMENT_FINISHED]
            # a new list each time: readers hold the one they got
            self._live[key] = sorted(live, key=lambda s: s.start_offset)

    def load(self) -> None:
        """Read ``__remote_log_metadata`` back (every partition, in offset order)."""
        from logstore.server.internal_log import iter_records  # noqa: PLC0415 (server leaf)

        for lg in self._logs.all_logs():
            if lg.topic != METADATA_TOPIC:
                continue
            for _header, rec in iter_records(lg):
                if rec.value is None:
                    continue
                try:
                    found = decode_metadata(bytes(rec.value))
                except CorruptRecordError as exc:
                    _log.error("%s-%d: skipped a bad record: %s", lg.topic, lg.partition, exc)
                    continue
                if found is not None:
                    self._apply(found)

    def _update(self, seg: RemoteSegment, state: SegmentState) -> None:
        self._append(
            SegmentUpdate(
                seg.topic,
                seg.topic_id,
                seg.partition,
                seg.segment_id,
                state,
                self.broker_id,
                int(time.time() * 1000),
            )
        )

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Create ``__remote_log_metadata``, load the metadata, start the tier thread (which
        cleans interrupted copies and deletes)."""
        self._create_metadata_topic()
        self.load()
        self._thread = threading.Thread(target=self._run, name="tier-copier", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._uploader.shutdown(wait=False, cancel_futures=True)

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` (a remote read) on the reader pool."""
        return self._pool.submit(fn)

    def _run(self) -> None:
        # the first pass after one interval, as Kafka's RLM tasks: the broker serves first
        while not self._stop.wait(self.config.interval_ms / 1000):
            try:
                self.run_once()
            except Exception:  # the thread must survive anything; the next pass retries
                _log.exception("tier pass failed")

    def run_once(self, now_ms: int | None = None) -> None:
        """One pass: clean interrupted work, copy, local retention, remote retention."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        self._delete_partitions()
        self._clean_dangling()
        for lg in self._logs.all_logs():
            if lg.closed or lg.topic == METADATA_TOPIC:
                continue
            if lg.config.remote_storage_enable and lg.config.compact:
                if lg.topic not in self._warned:
                    self._warned.add(lg.topic)
                    _log.warning("%s: compacted topics are not tiered (Kafka's rule)", lg.topic)
                continue
            if not self.is_tiered(lg):
                continue
            try:
                self._copy(lg)
                self._local_retention(lg, now)
                self._remote_retention(lg, now)
            except (ObjectStoreError, StorageError) as exc:
                _log.error("%s: tier pass stopped, retried next pass: %s", lg.dir.name, exc)

    # -- copy -----------------------------------------------------------------------------------

    def _clean_dangling(self) -> None:
        with self._lock:
            dangling = [
                s
                for segs in self._segments.values()
                for s in segs.values()
                if s.state
                in (SegmentState.COPY_SEGMENT_STARTED, SegmentState.DELETE_SEGMENT_STARTED)
            ]
        for seg in dangling:
            try:
                self._delete_remote(seg)
            except (ObjectStoreError, StorageError) as exc:
                _log.error("cleaning %s failed, retried next pass: %s", seg.segment_id, exc)

    def _copy(self, lg: Log) -> None:
        topic_id = self._logs.topic_id(lg.topic)
        if topic_id is None:
            return
        segments = lg.segments
        hw = lg.high_watermark
        tiered = self.highest_tiered_offset(lg.topic, lg.partition)
        for i, seg in enumerate(segments[:-1]):
            next_base = segments[i + 1].base_offset
            if next_base > hw:
                return  # holds offsets not committed yet (Kafka copies below the HW only)
            if next_base - 1 > tiered:
                self._copy_segment(lg, topic_id, seg, next_base)

    def _copy_segment(self, lg: Log, topic_id: uuid.UUID, seg: Any, next_base: int) -> None:
        started = time.perf_counter()
        base = seg.base_offset
        epochs = [(e, o) for e, o in lg.leader_epoch_cache.entries() if o < next_base]
        first = [e for e in epochs if e[1] <= base]
        epochs = ([(first[-1][0], base)] if first else []) + [e for e in epochs if e[1] > base]
        txn = _read_file(segment_path(lg.dir, base, TXN_INDEX_SUFFIX))
        size = os.path.getsize(seg.path)  # a segment that went fails the pass (retried)
        meta = RemoteSegment(
            topic=lg.topic,
            topic_id=topic_id,
            partition=lg.partition,
            segment_id=uuid.uuid4(),
            start_offset=base,
            end_offset=next_base - 1,
            max_timestamp_ms=seg.max_timestamp_so_far,
            broker_id=self.broker_id,
            event_timestamp_ms=int(time.time() * 1000),
            segment_size=size,
            leader_epochs=tuple(epochs),
            txn_index_empty=not txn,
        )
        keys = layout.segment_keys(self.config.key_prefix, meta)
        self._append(meta)
        failpoint("tier.copy_started")
        upload_started = time.perf_counter()
        upload = self._uploader.submit(self._upload_log, keys[layout.LOG], seg.path, size)
        compressed = upload.result()
        upload_s = time.perf_counter() - upload_started
        failpoint("tier.log_uploaded")
        blob, where = layout.build_indexes(
            {
                "offset": _read_file(segment_path(lg.dir, base, INDEX_SUFFIX)),
                "timestamp": _read_file(segment_path(lg.dir, base, TIME_INDEX_SUFFIX)),
                "producerSnapshot": _read_file(snapshot_path(lg.dir, next_base)),
                "leaderEpoch": layout.leader_epoch_bytes(epochs),
                "transaction": txn,
            }
        )
        self.store.write(keys[layout.INDEXES], blob)
        failpoint("tier.indexes_uploaded")
        manifest = layout.build_manifest(
            meta, chunk_size=self.config.chunk_size, indexes=where, compressed_sizes=compressed
        )
        self.store.write(keys[layout.MANIFEST], manifest)
        failpoint("tier.manifest_uploaded")
        self._update(meta, SegmentState.COPY_SEGMENT_FINISHED)
        failpoint("tier.copy_finished")
        # the times say where a copy's wall time goes (the produce benchmark reads them)
        _log.info(
            "%s: tiered segment %d-%d (%d bytes) as %s in %.0f ms (.log upload %.0f ms)",
            lg.dir.name,
            base,
            next_base - 1,
            size,
            keys[layout.LOG],
            (time.perf_counter() - started) * 1000,
            upload_s * 1000,
        )

    def _upload_log(self, key: str, path: Any, size: int) -> list[int] | None:
        """Upload the segment file as ``.log``: as it is (None), or with
        ``rsm.config.compression.enabled`` as one zstd frame per chunk, written to a temporary
        file first (the upload streams a file, a segment is never whole in memory, and the
        store's retries start again from the file); then each frame's size."""
        if not self.config.compression:
            self.store.write_file(key, path)
            return None
        sizes: list[int] = []
        read = 0
        with (
            open(path, "rb") as src,
            tempfile.NamedTemporaryFile(prefix="loglake-tier-", suffix=".zst") as tmp,
        ):
            while chunk := src.read(self.config.chunk_size):
                frame = layout.compress_chunk(chunk)
                tmp.write(frame)
                sizes.append(len(frame))
                read += len(chunk)
            if read != size:
                raise StorageError(f"{path}: read {read} bytes of a {size}-byte segment")
            tmp.flush()
            self.store.write_file(key, tmp.name)
        return sizes

    # -- topic deletion -------------------------------------------------------------------------

    def mark_deleted(self, topic: str, topic_id: uuid.UUID, partitions: int) -> None:
        """A topic was deleted (its logs are gone): ``DELETE_PARTITION_MARKED`` appended and
        fsynced for each of its partitions with remote segments; the tier thread deletes them
        (:meth:`_delete_partitions`). A failure here is logged only: the tier thread marks
        the partitions of a topic id that no longer exists on its next pass."""
        with self._lock:
            for p in range(partitions):
                self._floors.pop((topic, p), None)
            self._warned.discard(topic)
        with self._mark_lock:
            for p in range(partitions):
                key = (topic_id, p)
                if not self._segments.get(key) or self._deleting(key):
                    continue  # nothing remote, or the tier thread marked it already
                try:
                    self._mark(topic, topic_id, p)
                except LoglakeError as exc:
                    _log.error("%s-%d: marking its remote data deleted failed: %s", topic, p, exc)

    def _deleting(self, key: tuple[uuid.UUID, int]) -> bool:
        found = self._deletes.get(key)
        return found is not None and found.state != PartitionDeleteState.DELETE_PARTITION_FINISHED

    def _mark(self, topic: str, topic_id: uuid.UUID, partition: int) -> None:
        now = int(time.time() * 1000)
        self._append(
            PartitionDelete(
                topic,
                topic_id,
                partition,
                PartitionDeleteState.DELETE_PARTITION_MARKED,
                self.broker_id,
                now,
            )
        )
        failpoint("tier.partition_delete_marked")
        _log.info("%s-%d: remote data of deleted topic marked for deletion", topic, partition)

    def _delete_partitions(self) -> None:
        """Kafka's remote partition deletion, for each marked partition and for each one with
        remote segments whose topic id is no longer the broker's (a deletion cut short before
        its mark): ``DELETE_PARTITION_STARTED`` (``partition_delete_started``), each segment
        deleted as by retention (DELETE_SEGMENT_STARTED, objects, _FINISHED),
        ``DELETE_PARTITION_FINISHED`` (``partition_delete_finished``). Resumed after a crash
        from the records read back."""
        with self._mark_lock:
            with self._lock:
                orphans = [
                    (next(iter(segs.values())).topic, *key)
                    for key, segs in self._segments.items()
                    if segs and not self._deleting(key) and self._logs.topic_name(key[0]) is None
                ]
            for topic, topic_id, partition in orphans:
                try:
                    self._mark(topic, topic_id, partition)
                except LoglakeError as exc:
                    _log.error(
                        "%s-%d: marking remote data deleted failed: %s", topic, partition, exc
                    )
            with self._lock:
                pending = [d for key, d in self._deletes.items() if self._deleting(key)]
        for mark in pending:
            try:
                self._delete_partition(mark)
            except (ObjectStoreError, StorageError) as exc:
                _log.error(
                    "%s-%d: deleting remote data stopped, retried next pass: %s",
                    mark.topic,
                    mark.partition,
                    exc,
                )

    def _delete_partition(self, mark: PartitionDelete) -> None:
        if mark.state == PartitionDeleteState.DELETE_PARTITION_MARKED:
            self._append(
                replace(
                    mark,
                    state=PartitionDeleteState.DELETE_PARTITION_STARTED,
                    broker_id=self.broker_id,
                    event_timestamp_ms=int(time.time() * 1000),
                )
            )
            failpoint("tier.partition_delete_started")
        with self._lock:
            segs = sorted(
                self._segments.get((mark.topic_id, mark.partition), {}).values(),
                key=lambda s: s.start_offset,
            )
        for seg in segs:
            self._delete_remote(seg)
        self._remove_directories(mark)
        self._append(
            replace(
                mark,
                state=PartitionDeleteState.DELETE_PARTITION_FINISHED,
                broker_id=self.broker_id,
                event_timestamp_ms=int(time.time() * 1000),
            )
        )
        failpoint("tier.partition_delete_finished")
        _log.info(
            "%s-%d: remote data of the deleted topic deleted (%d segments)",
            mark.topic,
            mark.partition,
            len(segs),
        )

    def _remove_directories(self, mark: PartitionDelete) -> None:
        """pyarrow's S3 filesystem leaves an empty "directory" object (``<dir>/``) where the
        last object of a directory was deleted (the plugin writes none): the deleted
        partition's directory goes, then its topic's, each only when no object is left under
        it (objects no record names are left alone, and so is a directory of another
        partition still being deleted). pyarrow then leaves the key prefix's own marker."""
        top = f"{self.config.key_prefix}{mark.topic}-{kafka_uuid(mark.topic_id)}"
        for directory in (f"{top}/{mark.partition}", top):
            if self.store.list(directory):
                return
            loc = self.store.location(directory)
            try:
                self.store.filesystem.delete_dir(loc.fs_path)
            except FileNotFoundError:
                continue  # gone already (a pass cut short after it)
            except OSError as exc:
                raise ObjectStoreError(f"deleting {loc.uri}/ failed: {exc}", path=loc.uri) from exc

    # -- retention ------------------------------------------------------------------------------

    def _local_retention(self, lg: Log, now: int) -> None:
        tiered = self.highest_tiered_offset(lg.topic, lg.partition)
        if tiered < 0:
            return
        cfg = lg.config
        # log.retention.lake.group holds local segments the lake has not ingested, as for
        # untiered logs: the jobs read the log dirs
        lake_offset, lake_max_bytes = self._logs.lake_bound(lg, now)
        rules = retention_plan(
            lg.segments,
            retention_ms=cfg.effective_local_retention_ms,
            retention_bytes=cfg.effective_local_retention_bytes,
            delete_policy=True,
            log_start_offset=lg.log_start_offset,
            # only segments wholly tiered (their FINISHED record is durable) may go
            high_watermark=min(lg.high_watermark, tiered + 1),
            now_ms=now,
            lake_offset=lake_offset,
            lake_max_bytes=lake_max_bytes,
        )
        if rules:
            keep_from = lg.segments[len(rules)].base_offset
            lg.delete_records(keep_from)
            _log.info("%s: local log start moved to %d (tiered)", lg.dir.name, keep_from)

    def _remote_retention(self, lg: Log, now: int) -> None:
        cfg = lg.config
        live = self.live_segments(lg.topic, lg.partition)
        if not live:
            return
        tiered = live[-1].end_offset
        local_only = sum(s.size for s in lg.segments if s.base_offset > tiered)
        excess = sum(s.segment_size for s in live) + local_only - cfg.retention_bytes
        floor = self._floor(lg.topic, lg.partition)
        doomed: list[RemoteSegment] = []
        for seg in live:
            # Kafka's order of rules: the log start offset, retention.ms, retention.bytes
            below_start = seg.end_offset < floor
            by_time = time_breached(now, seg.max_timestamp_ms, cfg.retention_ms)
            by_size = cfg.retention_bytes >= 0 and size_breached(excess, seg.segment_size)
            if below_start or by_time or by_size:
                doomed.append(seg)
                excess -= seg.segment_size
            else:
                break
        for seg in doomed:
            self._update(seg, SegmentState.DELETE_SEGMENT_STARTED)
            failpoint("tier.delete_started")
            self._delete_remote(seg)
        if doomed:
            new_start = doomed[-1].end_offset + 1
            if lg.log_start_offset < new_start <= lg.high_watermark:
                lg.delete_records(new_start)

    def _delete_remote(self, seg: RemoteSegment) -> None:
        if seg.state != SegmentState.DELETE_SEGMENT_STARTED:
            self._update(seg, SegmentState.DELETE_SEGMENT_STARTED)
        for key in layout.segment_keys(self.config.key_prefix, seg).values():
            self.store.delete(key, missing_ok=True)
        failpoint("tier.objects_deleted")
        self._update(seg, SegmentState.DELETE_SEGMENT_FINISHED)
        failpoint("tier.delete_finished")
        _log.info(
            "%s-%d: remote segment %d-%d deleted",
            seg.topic,
            seg.partition,
            seg.start_offset,
            seg.end_offset,
        )


def _lower_priority() -> None:
    """nice 10 for the calling thread (Linux schedules threads as tasks, so a thread can have
    its own nice value); nothing where that is not possible."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)


def _read_file(path: Any) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return b""
