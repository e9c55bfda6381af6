"""Leases: find and remove the data files of an earlier write whose driver died, on any store.

A write (:func:`pipelines.delta.direct.stage_files`) names every data file it produces with
its write id (``part-<task>-<write_id>-<attempt>-c<n>...``). Before any file is written, the
driver takes a *lease* (:meth:`Lease.take`): the object ``<table>/_loglake_staging/<write_id>.json``
(write id, host, pid, ``ttl_s``), written put-if-absent, then rewritten every ``ttl_s / 6`` by a
heartbeat thread of the driver until the write committed or aborted and its leftovers are
removed (:meth:`Lease.release` deletes it). No ``flock``, no process ids: the same objects on
local disk and on S3, seen the same way by every host.

**Expiry by the store's clock.** A lease has expired when the store's *current* time is past
the lease object's last-modified time plus ``ttl_s`` plus a margin (``ttl_s / 2``, between 2
and 30 s). The reaper learns the store's current time by writing a small probe object and
reading back its last-modified time: both times come from one clock (S3's, or the file
system's), so clock skew between the driver's and the reaper's hosts does not enter; the
margin covers S3's whole-second ``Last-Modified`` and the latency of a renewal in flight.
``ttl_s`` is :data:`LEASE_TTL_S` (60 s) unless the environment variable
``LOGLAKE_LEASE_TTL_S`` says otherwise (crash tests use a few seconds); each lease records its
own, so writers with different settings reap each other correctly.

**Taking over.** A reaper that finds a lease expired writes the *takeover* object
``<write_id>.takeover`` (put-if-absent: one of several reapers creates it; reaping is
idempotent, so the others may proceed too), checks that the lease was not renewed meanwhile,
then removes the write's files that no commit added and the lease. The takeover object stays
as a tombstone for ``TOMBSTONE_S`` (a day): a driver that was only paused (GC, a stopped VM)
and wakes up finds it and refuses to commit.

**The owner's side.** The driver commits only while its lease is safely live
(:meth:`Lease.check`, called right before the commit): no takeover object, and its last
successful renewal *started* less than ``ttl_s / 2`` ago by its own monotonic clock. The
lease's last-modified time is at or after that start, and a reaper acts only ``ttl_s +
margin_s`` after it, so a commit that starts in time lands before any reaper could act unless
it stays in flight for more than ``ttl_s / 2`` plus the margin (60 s by default) while every renewal
fails: the one window left, and why the commit is the only step after the check. Tasks check
the lease before writing and again before reporting their files (:func:`check_lease`): a task
of a dead driver writes nothing once the lease is gone (a cluster kills tasks with their
driver; maintain's orphan removal takes any file a task was still writing).

**Files without the write id, scratch space** (compaction's needs beyond a plain staged
write). A write may create files whose names cannot carry its write id (deletion vector
files: ``deletion_vector_<uuid>.bin``, as the Delta protocol names them): it lists them in its
lease first (:meth:`Lease.add_files`, a synchronous rewrite of the lease, before the files
exist), and the reaper removes those that no version names, as it does the write's own. And
a write's scratch files (compaction's stage-1 buckets) live under
``_loglake_staging/<write_id>/`` (:func:`scratch_prefix`): the reaper removes that prefix with
the lease; the owner removes it itself (:func:`remove_scratch`) before it releases the lease.

**What a commit names.** Committed files are never removed: the reaper keeps every file of the
write that any version still in the log names (``DeltaLog.referenced_files`` of
:mod:`pipelines.delta.log`: added, removed by a later commit, change data; time travel may
read any of them). Commits also
carry the write id in their ``commitInfo`` (``loglake.writeId``), for people reading the log.

Crash behaviour: the lease exists before any data file and is deleted last, so no file of a
write exists without its lease (or its tombstone). A driver killed at any point leaves its lease
to expire; a reaper killed midway leaves the takeover object and the lease, and the next reaper
finishes the job (deletions are idempotent).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from logstore.errors import InvalidConfigError, ObjectNotFoundError, ObjectStoreError
from logstore.objectstore import LakeLocation, ObjectStore, StorageSettings, check_relative
from pipelines.delta.errors import DeltaSinkError
from pipelines.delta.files import cleanup_write_files, table_location
from pipelines.delta.log import DeltaLog

__all__ = [
    "LEASE_TTL_ENV",
    "LEASE_TTL_S",
    "REAP_MARGIN_S",
    "STAGING_DIR",
    "WRITE_ID_KEY",
    "Lease",
    "LeaseLostError",
    "check_lease",
    "lease_ttl_s",
    "reap_crashed_writes",
    "remove_scratch",
    "scratch_prefix",
]

STAGING_DIR = "_loglake_staging"
# A lease's lifetime without renewal; renewed every LEASE_TTL_S / 6 (three tries before
# the owner stops trusting it at LEASE_TTL_S / 2).
LEASE_TTL_S = 60.0
# The environment variable that overrides LEASE_TTL_S (seconds, 0 < t <= 3600).
LEASE_TTL_ENV = "LOGLAKE_LEASE_TTL_S"
# Added to the expiry before a reaper acts (S3's whole-second Last-Modified, requests in
# flight): ttl_s / 2, within these bounds.
REAP_MARGIN_S = (2.0, 30.0)
# How long a takeover object stays, so that a driver that wakes up late finds it.
TOMBSTONE_S = 24 * 3600.0
# The commitInfo key naming the write id of a commit (StagedWrite.commit writes it).
WRITE_ID_KEY = "loglake.writeId"


class LeaseLostError(DeltaSinkError):
    """The write's lease expired or was taken over: nothing of this write may be committed."""


def lease_ttl_s() -> float:
    """The lease lifetime new leases get: ``LOGLAKE_LEASE_TTL_S`` or :data:`LEASE_TTL_S`."""
    text = os.environ.get(LEASE_TTL_ENV, "").strip()
    if not text:
        return LEASE_TTL_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 3600:
        raise InvalidConfigError(f"{LEASE_TTL_ENV} must be seconds in (0, 3600], got {text!r}")
    return value


def _margin(ttl_s: float) -> float:
    lo, hi = REAP_MARGIN_S
    return min(hi, max(lo, ttl_s / 2))


def _lease_key(write_id: str) -> str:
    return f"{STAGING_DIR}/{write_id}.json"


def _takeover_key(write_id: str) -> str:
    return f"{STAGING_DIR}/{write_id}.takeover"


def scratch_prefix(write_id: str) -> str:
    """The write's scratch space, relative to the table: removed with its lease."""
    return f"{STAGING_DIR}/{write_id}"


def remove_scratch(store: ObjectStore, write_id: str) -> int:
    """Delete every object under the write's scratch prefix; returns how many. Local disk: the
    directories too. Idempotent."""
    prefix = scratch_prefix(write_id)
    objects = store.list(prefix)
    for obj in objects:
        store.delete(obj.path, missing_ok=True)
    if store.root.is_local:
        shutil.rmtree(store.root.local_path / prefix, ignore_errors=True)
    else:  # the empty "directory" objects pyarrow's writers leave on an object store
        with contextlib.suppress(FileNotFoundError):
            store.filesystem.delete_dir(store.location(prefix).fs_path)
    return len(objects)


def _is_write_id(text: str) -> bool:
    return bool(text) and all(c in "0123456789abcdef" for c in text)


class Lease:
    """A driver's lease on one write id of one table (see the module docstring).

    Thread-safe: the heartbeat thread and the caller share only floats and an event.
    """

    def __init__(self, store: ObjectStore, write_id: str, *, ttl_s: float) -> None:
        if not 0 < ttl_s <= 3600:
            raise ValueError(f"lease ttl_s must be in (0, 3600], got {ttl_s}")
        self.store = store
        self.write_id = write_id
        self.ttl_s = ttl_s
        self._renewed_at = time.monotonic()
        self._files: list[str] = []  # add_files: files of this write without its id
        self._write_lock = threading.Lock()  # one rewrite of the lease at a time
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def take(
        cls,
        table: str | Path | LakeLocation,
        write_id: str,
        *,
        settings: StorageSettings | None = None,
        ttl_s: float | None = None,
    ) -> Lease:
        """Write the lease of ``write_id`` (a fresh id: put-if-absent refuses a reused one)
        and start renewing it; ``ttl_s``: :func:`lease_ttl_s` when not given."""
        store = ObjectStore(table_location(table), settings=settings)
        lease = cls(store, write_id, ttl_s=lease_ttl_s() if ttl_s is None else ttl_s)
        started = time.monotonic()
        if not lease.store.put_if_absent(_lease_key(write_id), lease._body()):
            raise DeltaSinkError(
                f"write id {write_id} already has a lease",
                path=lease.store.uri(_lease_key(write_id)),
            )
        lease._renewed_at = started
        lease._thread = threading.Thread(
            target=lease._heartbeat, name=f"loglake-lease-{write_id[:8]}", daemon=True
        )
        lease._thread.start()
        return lease

    def _body(self) -> bytes:
        return json.dumps(
            {
                "write_id": self.write_id,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "ttl_s": self.ttl_s,
                "files": self._files,
                "renewed_at": time.time(),  # for people reading it; expiry uses the store's clock
            }
        ).encode()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.ttl_s / 6):
            started = time.monotonic()
            try:
                if self.store.exists(_takeover_key(self.write_id)):
                    self._lost = "a reaper took the lease over"
                    return
                with self._write_lock:
                    self.store.write(_lease_key(self.write_id), self._body())
            except ObjectStoreError:
                continue  # the store is away: check() refuses once the lease is too old
            self._renewed_at = started

    @property
    def files(self) -> tuple[str, ...]:
        """The files recorded by :meth:`add_files`, relative to the table."""
        return tuple(self._files)

    def add_files(self, paths: Iterable[str]) -> None:
        """Record in the lease files (relative to the table) that this write is about to
        create and whose names do not carry its write id, so that a reaper finds them; the
        lease is rewritten before this returns (an error: the files must not be created)."""
        new = [p for p in paths if p not in self._files]
        if not new:
            return
        for p in new:
            check_relative(p, where="lease file")
        with self._write_lock:
            self._files.extend(new)
            self.store.write(_lease_key(self.write_id), self._body())

    def check(self) -> None:
        """Raise :class:`LeaseLostError` unless the write may still commit: no takeover, and
        the last renewal started less than ``ttl_s / 2`` ago."""
        age = time.monotonic() - self._renewed_at
        if self._lost is None and age >= self.ttl_s / 2:
            self._lost = f"its last renewal is {age:.1f} s old (ttl {self.ttl_s:g} s)"
        if self._lost is None and self.store.exists(_takeover_key(self.write_id)):
            self._lost = "a reaper took the lease over"
        if self._lost is not None:
            raise LeaseLostError(
                f"lease of write {self.write_id} lost: {self._lost}; nothing committed, re-run",
                path=self.store.uri(_lease_key(self.write_id)),
            )

    def release(self) -> None:
        """The write is over (committed or aborted, leftovers removed): stop renewing and
        delete the lease. A store that is away leaves the lease to expire."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.ttl_s)  # a renewal stuck on a store that is away
        # a store that is away: the lease expires, the next reaper finds no file to remove
        with contextlib.suppress(ObjectStoreError):
            self.store.delete(_lease_key(self.write_id), missing_ok=True)


def check_lease(
    table: str | Path | LakeLocation, write_id: str, *, settings: StorageSettings | None = None
) -> None:
    """In a task writing files of ``write_id``: raise :class:`LeaseLostError` when the write's
    lease is gone or taken over (its driver is over or dead; the task must write nothing)."""
    store = ObjectStore(table_location(table), settings=settings)
    if not store.exists(_lease_key(write_id)) or store.exists(_takeover_key(write_id)):
        raise LeaseLostError(
            f"the lease of write {write_id} is gone or taken over: its driver is over or died;"
            " this task writes none of its files",
            path=store.uri(_lease_key(write_id)),
        )


def _store_now(store: ObjectStore) -> float:
    """The store's current time: the last-modified time of a probe object written now."""
    key = f"{STAGING_DIR}/clock-{uuid.uuid4().hex}.probe"
    store.write(key, b"")
    try:
        return store.modified(key)
    finally:
        store.delete(key, missing_ok=True)


def _reap_one(
    store: ObjectStore,
    write_id: str,
    *,
    now: float,
    margin_s: float | None,
    settings: StorageSettings,
) -> int:
    """Reap write ``write_id`` if its lease expired by the store's clock; the files removed."""
    key = _lease_key(write_id)
    try:
        modified = store.modified(key)
        lease: Any = json.loads(store.read(key))
        ttl = float(lease["ttl_s"])
    except ObjectNotFoundError:
        return 0  # released meanwhile
    except (ValueError, KeyError, TypeError):
        return 0  # not a lease of ours: leave it alone
    if now < modified + ttl + (_margin(ttl) if margin_s is None else margin_s):
        return 0  # live (or too recently silent to tell)
    store.put_if_absent(
        _takeover_key(write_id), json.dumps({"reaper": socket.gethostname()}).encode()
    )
    try:
        if store.modified(key) != modified:
            return 0  # renewed after all: the owner finds the takeover and does not commit
    except ObjectNotFoundError:
        return 0  # released: the owner finished
    referenced = DeltaLog(store.root, settings=settings).referenced_files()
    keep = {p for p in referenced if f"-{write_id}-" in p}
    removed = cleanup_write_files(store.root, write_id, keep=keep, settings=settings)
    for extra in lease.get("files") or []:
        if isinstance(extra, str) and extra not in referenced and store.exists(extra):
            store.delete(extra, missing_ok=True)
            removed += 1
    removed += remove_scratch(store, write_id)
    if store.root.is_local:
        # a renewal killed mid-write on local disk leaves ObjectStore.write's temporary
        # sibling of the lease (``.tmp-<name>.<uuid>``), which listings do not show
        for tmp in (store.root.local_path / STAGING_DIR).glob(f".tmp-{write_id}.json.*"):
            tmp.unlink(missing_ok=True)
    store.delete(key, missing_ok=True)
    return removed


def reap_crashed_writes(
    table: str | Path | LakeLocation,
    *,
    settings: StorageSettings | None = None,
    margin_s: float | None = None,
) -> int:
    """Remove the uncommitted files of writes under ``table`` whose lease expired; returns how
    many files were removed (see the module docstring). Cheap when no lease is there: one
    listing. ``margin_s`` overrides each lease's margin (tests)."""
    resolved = settings if settings is not None else StorageSettings.default()
    store = ObjectStore(table_location(table), settings=resolved)
    objects = store.list(STAGING_DIR, recursive=False)
    if not objects:
        return 0
    now = _store_now(store)
    leases: set[str] = set()
    takeovers: dict[str, str] = {}
    for obj in objects:
        name = obj.path.rsplit("/", 1)[-1]
        stem, _, suffix = name.partition(".")
        if not _is_write_id(stem):
            continue
        if suffix == "json":
            leases.add(stem)
        elif suffix == "takeover":
            takeovers[stem] = obj.path
    removed = 0
    for write_id in sorted(leases):
        removed += _reap_one(store, write_id, now=now, margin_s=margin_s, settings=resolved)
    for write_id, path in takeovers.items():
        try:
            if write_id not in leases and now - store.modified(path) > TOMBSTONE_S:
                store.delete(path, missing_ok=True)
        except ObjectNotFoundError:
            continue
    return removed
