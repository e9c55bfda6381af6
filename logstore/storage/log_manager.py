"""Every partition log of one broker across its log directories (Kafka's ``LogManager``).

Per log directory (``log.dirs`` entry) it owns:

* ``.lock`` — held (flock) from construction to :meth:`LogManager.shutdown`; a second manager
  on the same directory gets :class:`~logstore.errors.LogDirLockedError`;
* ``.kafka_cleanshutdown`` — written after every log was flushed and closed and every
  checkpoint written at shutdown; its presence at start-up skips recovery, and it is deleted
  once the logs are loaded so that a later crash is never mistaken for a clean stop. It is not
  written when anything in the directory could not be persisted (see below);
* ``recovery-point-offset-checkpoint``, ``log-start-offset-checkpoint``,
  ``replication-offset-checkpoint`` (high watermarks) — read at start-up, written
  periodically and at shutdown (see :mod:`logstore.storage.checkpoints`);
* ``topic-configs/<topic>.properties`` — per-topic overrides
  (:mod:`logstore.storage.topic_config`), applied over ``default_config``;
* ``<topic>-<partition>/`` — one :class:`~logstore.storage.log.Log` each. Directories named
  ``*-delete`` (a deletion that was interrupted) are removed at start-up.
* ``<topic>-<partition>/partition.metadata`` — the topic's id
  (:mod:`logstore.storage.partition_metadata`): random when the topic's first partition is
  created, shared by its later partitions, read at start-up (a directory without one gets
  the legacy name-derived id; partitions of one topic with different ids stop the start with
  :class:`~logstore.storage.partition_metadata.InconsistentTopicIdError`), forgotten when the
  topic's last partition is deleted, so a recreated topic gets a new id.

Background tasks (on a :class:`~logstore.storage.scheduler.Scheduler`): flush logs whose
``flush.ms`` elapsed, retention (``delete_old_segments``), checkpoint writing and, every second,
swapping in segments cleaned by a compaction job (:mod:`logstore.storage.swap`). They can also
be run by hand (:meth:`flush_dirty_logs`, :meth:`cleanup_logs`, :meth:`checkpoint`).

Thread-safety: the partition map is guarded by a lock; each log guards itself. Crash
behaviour: everything the checkpoints say is conservative (a recovery point is only written
after the flush it names), so recovery after a crash starts early enough.

A full disk (or an I/O error). A log takes itself offline for appends (see
:class:`~logstore.storage.log.Log`). A checkpoint that cannot be written keeps the previous
file and is logged once (again only when the error changes, and when it succeeds again).
:meth:`LogManager.shutdown` never raises for storage errors: it does what it can in Kafka's
order (flush every log, close every log — which trims the preallocated indexes and so frees
their space — write the checkpoints), logs each failure once, and writes a directory's
clean-shutdown marker only when everything there succeeded and no log of it may differ from
its files (:attr:`~logstore.storage.log.Log.needs_recovery`; a log merely offline for lack of
room is consistent on disk); it returns whether every directory was shut down cleanly.
Without the marker the next start recovers from the recovery points, as after a crash.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from logstore.errors import LoglakeError, StorageError
from logstore.storage.checkpoints import read_offset_checkpoint, write_offset_checkpoint
from logstore.storage.cleaner_manifest import MANIFEST_FILE
from logstore.storage.config import LogConfig
from logstore.storage.dirlock import DirLock
from logstore.storage.files import (
    CLEAN_SHUTDOWN_FILE,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    fsync_dir,
    parse_partition_dir,
    partition_dir,
    validate_topic,
)
from logstore.storage.log import Log
from logstore.storage.partition_metadata import (
    InconsistentTopicIdError,
    legacy_topic_id,
    new_topic_id,
    read_partition_metadata,
    write_partition_metadata,
)
from logstore.storage.scheduler import Scheduler
from logstore.storage.swap import apply_manifest
from logstore.storage.topic_config import read_topic_configs, write_topic_config

__all__ = ["LogManager"]

_log = logging.getLogger(__name__)
TopicPartition = tuple[str, int]
# Kafka's internal topics (__consumer_offsets, __transaction_state): the lake ingests them only
# when named (pipelines.ingest), so the lake bound never holds them.
_INTERNAL_TOPIC_PREFIX = "__"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class LogManager:
    """Loads, creates, flushes, retains, checkpoints and closes partition logs.

    ``log_dirs``: one path or several (Kafka's ``log.dirs``); created if missing.
    ``default_config``: the broker-level defaults each topic's overrides apply over.
    ``scheduler``: shared scheduler (not owned); without one the manager runs its own.
    ``background=False`` starts no periodic task (tests, tools); the ``*_interval_ms``
    settings are Kafka's ``log.flush.scheduler.interval.ms``, ``log.retention.check.interval.ms``
    and ``log.flush.offset.checkpoint.interval.ms``.
    """

    def __init__(
        self,
        log_dirs: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
        *,
        default_config: LogConfig,
        scheduler: Scheduler | None = None,
        background: bool = True,
        flush_check_interval_ms: int = 1_000,
        retention_check_interval_ms: int = 300_000,
        checkpoint_interval_ms: int = 60_000,
    ) -> None:
        # how often the scheduler looks for cleaned segments to swap in (one stat per log)
        self.cleaner_swap_check_ms = 1_000
        if isinstance(log_dirs, (str, os.PathLike)):
            dirs = [Path(log_dirs)]
        else:
            dirs = [Path(d) for d in log_dirs]
        if not dirs:
            raise LoglakeError("no log directory given")
        self.log_dirs: list[Path] = [d.resolve() for d in dirs]
        self.default_config = default_config
        self._own_scheduler = scheduler is None
        self.scheduler = scheduler if scheduler is not None else Scheduler(name="log-manager")
        self._lock = threading.RLock()
        self._logs: dict[TopicPartition, Log] = {}
        self._log_dir_of: dict[TopicPartition, Path] = {}
        self._topic_overrides: dict[str, dict[str, str]] = {}
        # topic ids both ways (KIP-516); plain dict reads, so any thread may look up
        self._topic_ids: dict[str, uuid.UUID] = {}
        self._topic_names: dict[uuid.UUID, str] = {}
        # where each topic's id was read from (the first partition dir), for error messages
        self._topic_id_source: dict[str, Path] = {}
        self._dir_locks: list[DirLock] = []
        self.had_clean_shutdown: dict[Path, bool] = {}
        self._shut_down = False
        # checkpoint file -> the error last logged for it (logged once per error)
        self._checkpoint_errors: dict[Path, str] = {}
        # set_lake_bound: (committed lookup, max bytes, max ms)
        # tiered storage (logstore.tier): logs whose retention the tier runs instead
        self.retention_owner: Callable[[Log], bool] | None = None
        self._lake_bound: tuple[Callable[[str, int], tuple[int, int] | None] | None, int, int] = (
            None,
            -1,
            -1,
        )
        # (topic, partition) -> when retention first found it without a lake offset (ms)
        self._lake_unheld_since: dict[TopicPartition, int] = {}
        try:
            for d in self.log_dirs:
                d.mkdir(parents=True, exist_ok=True)
                lock = DirLock(d)
                lock.acquire()
                self._dir_locks.append(lock)
            if self._own_scheduler:
                self.scheduler.start()
            missing: list[tuple[str, Path]] = []
            for d in self.log_dirs:
                self._load_dir(d, missing)
            for topic, path in missing:
                # older loglake dirs: the id loglake derived from the name, which clients
                # may hold; a topic other partitions of which have a file keeps that id
                tid = self._topic_ids.get(topic) or legacy_topic_id(topic)
                write_partition_metadata(path, tid)
                self._set_topic_id(topic, tid, path)
        except BaseException:
            self._abort()
            raise
        self._intervals = (
            flush_check_interval_ms,
            retention_check_interval_ms,
            checkpoint_interval_ms,
        )
        if background:
            self.start()

    # -- loading --------------------------------------------------------------------------------

    def _set_topic_id(self, topic: str, tid: uuid.UUID, path: Path) -> None:
        known = self._topic_ids.get(topic)
        if known is not None and known != tid:
            raise InconsistentTopicIdError(
                f"topic {topic!r} has id {tid} here but {known} in"
                f" {self._topic_id_source[topic]}: its partitions belong to different"
                " incarnations of the topic",
                path=str(path),
            )
        other = self._topic_names.get(tid)
        if other is not None and other != topic:
            raise InconsistentTopicIdError(
                f"topic id {tid} of {topic!r} is also the id of {other!r}", path=str(path)
            )
        self._topic_ids[topic] = tid
        self._topic_names[tid] = topic
        self._topic_id_source.setdefault(topic, path)

    def _load_dir(self, d: Path, missing: list[tuple[str, Path]]) -> None:
        marker = d / CLEAN_SHUTDOWN_FILE
        clean = marker.exists()
        self.had_clean_shutdown[d] = clean
        recovery_points = read_offset_checkpoint(d / RECOVERY_POINT_CHECKPOINT)
        start_offsets = read_offset_checkpoint(d / LOG_START_OFFSET_CHECKPOINT)
        high_watermarks = read_offset_checkpoint(d / REPLICATION_OFFSET_CHECKPOINT)
        for topic, props in read_topic_configs(d).items():
            self._topic_overrides.setdefault(topic, {}).update(props)
        for entry in sorted(d.iterdir()):
            if not entry.is_dir():
                continue
            if entry.name.endswith("-delete"):
                shutil.rmtree(entry, ignore_errors=True)
                continue
            parsed = parse_partition_dir(entry.name)
            if parsed is None:
                continue
            if parsed in self._logs:
                raise LoglakeError(
                    f"partition {parsed[0]}-{parsed[1]} is in two log directories: "
                    f"{self._log_dir_of[parsed]} and {d}",
                    path=str(entry),
                )
            tid = read_partition_metadata(entry)
            if tid is None:
                missing.append((parsed[0], entry))
            else:
                self._set_topic_id(parsed[0], tid, entry)
            log = Log.open(
                entry,
                self.config_for(parsed[0]),
                recovery_point=recovery_points.get(parsed, 0),
                log_start_offset=start_offsets.get(parsed, 0),
                clean_shutdown=clean,
                scheduler=self.scheduler,
            )
            log.high_watermark = high_watermarks.get(parsed, log.log_start_offset)
            self._logs[parsed] = log
            self._log_dir_of[parsed] = d
        if clean:
            marker.unlink()
            fsync_dir(d)

    def config_for(self, topic: str) -> LogConfig:
        """``default_config`` with ``topic``'s stored overrides applied."""
        return LogConfig.from_properties(
            self._topic_overrides.get(topic, {}), defaults=self.default_config
        )

    def set_topic_config(self, topic: str, props: Mapping[str, str]) -> LogConfig:
        """Store ``topic``'s overrides in every log directory and apply them to its logs."""
        validate_topic(topic)
        config = LogConfig.from_properties(props, defaults=self.default_config)
        with self._lock:
            for d in self.log_dirs:
                write_topic_config(d, topic, props)
            self._topic_overrides[topic] = dict(props)
            for (t, _), log in self._logs.items():
                if t == topic:
                    log.config = config
        return config

    # -- partitions -----------------------------------------------------------------------------

    def topic_id(self, topic: str) -> uuid.UUID | None:
        """``topic``'s id (KIP-516), None when it has no partition here."""
        return self._topic_ids.get(topic)

    def topic_name(self, topic_id: uuid.UUID) -> str | None:
        """The topic whose id is ``topic_id``, None when there is none (any more)."""
        return self._topic_names.get(topic_id)

    def get_log(self, topic: str, partition: int) -> Log | None:
        return self._logs.get((topic, partition))

    def get_or_create_log(self, topic: str, partition: int, config: LogConfig | None = None) -> Log:
        """The log of ``topic``-``partition``, created empty (in the least loaded directory)
        if it does not exist yet. ``config`` defaults to the topic's stored config."""
        key = (validate_topic(topic), partition)
        with self._lock:
            if self._shut_down:
                raise LoglakeError("log manager is shut down")
            log = self._logs.get(key)
            if log is not None:
                return log
            counts = {d: 0 for d in self.log_dirs}
            for d in self._log_dir_of.values():
                counts[d] += 1
            target = min(self.log_dirs, key=lambda d: counts[d])
            path = partition_dir(target, topic, partition)
            # the id before the first segment: a crash leaves a directory with its id or,
            # at worst, an empty one (given the legacy id at the next start)
            tid = self._topic_ids.get(topic) or new_topic_id()
            path.mkdir(parents=True, exist_ok=True)
            write_partition_metadata(path, tid)
            log = Log.open(
                path,
                config if config is not None else self.config_for(topic),
                clean_shutdown=True,
                scheduler=self.scheduler,
            )
            fsync_dir(target)
            self._logs[key] = log
            self._log_dir_of[key] = target
            self._set_topic_id(topic, tid, path)
            return log

    def delete_log(self, topic: str, partition: int) -> bool:
        """Close and remove a partition's directory (renamed ``*-delete`` first, so an
        interrupted deletion finishes at the next start). False if there was no such log."""
        with self._lock:
            log = self._logs.pop((topic, partition), None)
            d = self._log_dir_of.pop((topic, partition), None)
            if log is not None and not any(t == topic for t, _ in self._logs):
                # the topic is gone: its id must never reach a later topic of that name
                tid = self._topic_ids.pop(topic, None)
                self._topic_id_source.pop(topic, None)
                if tid is not None:
                    self._topic_names.pop(tid, None)
        if log is None or d is None:
            return False
        try:
            log.close()
        except StorageError as exc:  # its files are about to go anyway
            _log.warning("deleting %s: %s", log.dir.name, exc)
        doomed = d / f"{log.dir.name}.{uuid.uuid4().hex}-delete"
        os.replace(log.dir, doomed)
        fsync_dir(d)
        shutil.rmtree(doomed, ignore_errors=True)
        return True

    def all_logs(self) -> list[Log]:
        with self._lock:
            return list(self._logs.values())

    def log_dir_of(self, topic: str, partition: int) -> Path | None:
        return self._log_dir_of.get((topic, partition))

    # -- background work ------------------------------------------------------------------------

    def start(self) -> None:
        """Schedule the periodic flush, retention and checkpoint tasks."""
        flush_ms, retention_ms, checkpoint_ms = self._intervals
        if not self.scheduler.running:
            self.scheduler.start()
        self._tasks = [
            self.scheduler.schedule(
                "log-flusher", self.flush_dirty_logs, delay_ms=flush_ms, period_ms=flush_ms
            ),
            self.scheduler.schedule(
                "log-retention", self.cleanup_logs, delay_ms=retention_ms, period_ms=retention_ms
            ),
            self.scheduler.schedule(
                "checkpoints", self.checkpoint, delay_ms=checkpoint_ms, period_ms=checkpoint_ms
            ),
            self.scheduler.schedule(
                "cleaner-swaps",
                self.apply_cleaner_swaps,
                delay_ms=self.cleaner_swap_check_ms,
                period_ms=self.cleaner_swap_check_ms,
            ),
        ]

    def flush_dirty_logs(self, now_ms: int | None = None) -> int:
        """Flush every log whose ``flush.ms`` has elapsed since its last flush; how many."""
        now = _now_ms() if now_ms is None else now_ms
        flushed = 0
        for log in self.all_logs():
            if log.closed:
                continue
            if now - log.last_flush_ms >= log.config.flush_ms:
                try:
                    log.flush()
                except StorageError:
                    continue  # the log took itself offline and said so
                flushed += 1
        return flushed

    def apply_cleaner_swaps(self) -> int:
        """Swap in the cleaned segments that compaction jobs left for any log (a
        ``cleaner-manifest.json`` in its directory; see :mod:`logstore.storage.swap`); how
        many logs were swapped."""
        swapped = 0
        for log in self.all_logs():
            if log.closed or not (log.dir / MANIFEST_FILE).exists():
                continue
            try:
                swapped += apply_manifest(log) is True
            except (LoglakeError, OSError):
                _log.exception("swapping cleaned segments into %s failed", log.dir)
        return swapped

    def set_lake_bound(
        self,
        committed: Callable[[str, int], tuple[int, int] | None] | None,
        *,
        max_bytes: int = -1,
        max_ms: int = -1,
    ) -> None:
        """Bound time/size retention by what the lake ingested (``log.retention.lake.*``).

        ``committed(topic, partition)``: the lake's committed next offset and its commit time
        (ms), or None when the lake has committed nothing for the partition yet; a None
        ``committed`` removes the bound. Safety valves (``-1``: none): a log larger than
        ``max_bytes`` and a commit older than ``max_ms`` (a stopped ingest) are retained as in
        Kafka, with a WARN when that deletes offsets the lake has not ingested.

        A partition without a committed offset is held from its log start offset: nothing of
        it goes by time or size until the lake commits (the first ingest may run long after
        the first produce). Its "commit time" for ``max_ms`` is when this log manager first
        found it without one, so a topic the lake never ingests is retained as in Kafka once
        ``max_ms`` has passed (and at once above ``max_bytes``); a restart starts that clock
        again (it holds longer, never shorter). Kafka's internal topics (``__`` prefix) are
        never held: the lake does not ingest them unless named.
        """
        self._lake_bound = (committed, max_bytes, max_ms)
        self._lake_unheld_since.clear()

    def lake_bound(self, log: Log, now_ms: int) -> tuple[int | None, int]:
        """``(lake_offset, lake_max_bytes)`` of :func:`~logstore.storage.retention.retention_plan`
        for ``log`` (``(None, -1)``: no bound), for retention run elsewhere (the tier's local
        retention)."""
        args = self._lake_args(log, now_ms)
        return args.get("lake_offset"), int(args.get("lake_max_bytes", -1))

    def _lake_args(self, log: Log, now_ms: int) -> dict[str, Any]:
        committed, max_bytes, max_ms = self._lake_bound
        if committed is None:
            return {}
        if log.topic.startswith(_INTERNAL_TOPIC_PREFIX):
            return {}
        tp = (log.topic, log.partition)
        found = committed(log.topic, log.partition)
        if found is None:
            # no offset yet: held from the log start; max_ms counts from when first seen so
            since = self._lake_unheld_since.setdefault(tp, now_ms)
            offset, age = log.log_start_offset, now_ms - since
            what = f"has committed no offset for it in the {age} ms since this broker saw it"
        else:
            self._lake_unheld_since.pop(tp, None)
            offset, age = found[0], now_ms - found[1]
            what = f"last committed {age} ms ago"
        if 0 <= max_ms < age:
            why = f"the lake group {what} (log.retention.lake.max.ms={max_ms})"
            return {"lake_offset": offset, "lake_max_bytes": 0, "lake_valve": why}
        return {"lake_offset": offset, "lake_max_bytes": max_bytes}

    def cleanup_logs(self, now_ms: int | None = None) -> int:
        """Retention over every log (segments by time, size and log start offset), bounded by
        the lake's committed offsets when :meth:`set_lake_bound` set them."""
        total = 0
        now = _now_ms() if now_ms is None else now_ms
        for log in self.all_logs():
            if log.closed or (self.retention_owner is not None and self.retention_owner(log)):
                continue
            try:
                total += log.delete_old_segments(now, **self._lake_args(log, now))
            except LoglakeError:
                _log.exception("retention failed for %s", log.dir)
        return total

    def _per_dir(self, value: str) -> dict[Path, dict[TopicPartition, int]]:
        out: dict[Path, dict[TopicPartition, int]] = {d: {} for d in self.log_dirs}
        with self._lock:
            for key, log in self._logs.items():
                out[self._log_dir_of[key]][key] = int(getattr(log, value))
        return out

    def _write_checkpoints(self, value: str, name: str) -> set[Path]:
        """Write checkpoint ``name`` of every log directory from each log's ``value``;
        the directories where that failed (each failure logged once)."""
        failed: set[Path] = set()
        for d, entries in self._per_dir(value).items():
            path = d / name
            try:
                write_offset_checkpoint(path, entries)
            except StorageError as exc:
                failed.add(d)
                if self._checkpoint_errors.get(path) != exc.message:
                    self._checkpoint_errors[path] = exc.message
                    _log.error("%s (the previous checkpoint stays in place)", exc)
            else:
                if self._checkpoint_errors.pop(path, None) is not None:
                    _log.info("%s written again", path)
        return failed

    def checkpoint_recovery_points(self) -> set[Path]:
        return self._write_checkpoints("recovery_point", RECOVERY_POINT_CHECKPOINT)

    def checkpoint_log_start_offsets(self) -> set[Path]:
        return self._write_checkpoints("log_start_offset", LOG_START_OFFSET_CHECKPOINT)

    def checkpoint_high_watermarks(self) -> set[Path]:
        return self._write_checkpoints("high_watermark", REPLICATION_OFFSET_CHECKPOINT)

    def checkpoint(self) -> set[Path]:
        """Write all three offset checkpoints of every log directory; the directories where
        one could not be written (logged; the previous file stays)."""
        return (
            self.checkpoint_recovery_points()
            | self.checkpoint_log_start_offsets()
            | self.checkpoint_high_watermarks()
        )

    # -- shutdown -------------------------------------------------------------------------------

    def shutdown(self) -> bool:
        """Flush and close every log, write the checkpoints and the clean-shutdown markers,
        release the directory locks. Idempotent.

        Storage errors do not stop it (see the module docstring): each is logged once, and a
        directory where anything failed gets no clean-shutdown marker. Returns whether every
        directory got its marker (False also on a second call)."""
        with self._lock:
            if self._shut_down:
                return False
            self._shut_down = True
        for task in getattr(self, "_tasks", []):
            task.cancel()
        if self._own_scheduler:
            # pending delayed deletions run now, so their descriptors close
            self.scheduler.shutdown(run_pending=True)
        with self._lock:
            logs = [(self._log_dir_of[key], log) for key, log in self._logs.items()]
        unclean: dict[Path, list[str]] = {d: [] for d in self.log_dirs}
        # Kafka's order: flush, close (trims preallocated indexes, freeing their space on a
        # full disk), then the checkpoints, then the markers.
        for d, log in logs:
            try:
                log.flush()
            except (OSError, LoglakeError) as exc:
                unclean[d].append(f"{log.dir.name} not flushed")
                _log.error("shutdown: cannot flush %s: %s", log.dir.name, exc)
        for d, log in logs:
            try:
                log.close()
            except (OSError, LoglakeError) as exc:
                unclean[d].append(f"{log.dir.name} not closed cleanly")
                _log.error("shutdown: %s", exc)
            if log.needs_recovery:
                unclean[d].append(f"{log.dir.name} may differ on disk: {log.offline_reason}")
        for d in self.checkpoint():
            unclean[d].append("checkpoints not written")
        for d in self.log_dirs:
            if not unclean[d]:
                try:
                    (d / CLEAN_SHUTDOWN_FILE).touch()
                    fsync_dir(d)
                except OSError as exc:
                    (d / CLEAN_SHUTDOWN_FILE).unlink(missing_ok=True)
                    unclean[d].append(f"marker not written: {exc.strerror or exc}")
            if unclean[d]:
                _log.error(
                    "log dir %s was not shut down cleanly (%s): no clean-shutdown marker, the "
                    "next start recovers its logs from their recovery points",
                    d,
                    "; ".join(unclean[d]),
                )
        for lock in self._dir_locks:
            lock.release()
        return not any(unclean.values())

    def _abort(self) -> None:
        """Undo a failed construction: close what was opened, release locks."""
        for log in self._logs.values():
            for seg in log.segments:
                seg.close_handlers()
        if self._own_scheduler:
            self.scheduler.shutdown()
        for lock in self._dir_locks:
            lock.release()

    def __enter__(self) -> LogManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
