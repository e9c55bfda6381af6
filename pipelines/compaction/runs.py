"""Run ownership of compaction: one lease per table a run writes, its leftovers, the reaping.

A compaction run is a staged write of :mod:`pipelines.delta.staging` with the same rules
(read that module's docstring): before it writes anything it takes a lease under a fresh
write id in the topic table's ``_loglake_staging/`` and, under the ``timestamp`` and
``header:`` strategies, one under the same write id in the tombstone table's; the leases are
renewed by heartbeat threads of the driver and released last, once the run's leftovers are
removed (committed or not). What compaction needs beyond a plain staged write uses the two
hooks of the lease, not a second system:

- its deletion vector files (``dv/deletion_vector_<uuid>.bin``: the Delta protocol's names,
  without the write id) are listed in the lease (:meth:`Lease.add_files`) before the driver
  moves them into the table (:func:`journal_dv_files`);
- its stage-1 scratch files (Arrow IPC per bucket) and its stage-2 deletion vector files
  before the move live under ``_loglake_staging/<write id>/`` (:func:`scratch_prefix`),
  which goes with the lease.

Every run starts by reaping the runs whose lease expired (:func:`reap_dead_runs`: the write's
files that no version of the log names, its listed files likewise, its scratch, then the lease),
on local disk and on object stores alike: no ``flock``, no process ids. A live run's lease is
renewed, so its files are never touched. A run killed at any point is reaped ``ttl_s`` plus a
margin after its last renewal (``LOGLAKE_LEASE_TTL_S``, 60 s by default).
"""

from __future__ import annotations

import json
import posixpath
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import unquote

from logstore.objectstore import ObjectStore
from pipelines.compaction.layout import CHANGE_DATA, Log
from pipelines.delta.deletion_vectors import DV_PREFIX
from pipelines.delta.files import WrittenFile, cleanup_write_files, table_location
from pipelines.delta.log import DeltaLog
from pipelines.delta.staging import Lease, reap_crashed_writes, remove_scratch, scratch_prefix

__all__ = [
    "Run",
    "cleanup_run",
    "journal_dv_files",
    "reap_dead_runs",
    "scratch_prefix",
    "start_run",
]


@dataclass
class Run:
    """A run's write id and its leases: ``leases[0]`` on the topic table, ``leases[1]`` (if
    any) on the tombstone table. Lives in the driver only (the tasks get the write id)."""

    write_id: str
    root: str
    tomb_root: str | None
    leases: list[Lease] = field(default_factory=list)

    @property
    def lease(self) -> Lease:
        return self.leases[0]

    def check(self) -> None:
        """Raise ``LeaseLostError`` unless every lease of the run is safely live."""
        for lease in self.leases:
            lease.check()

    def dv_files(self) -> list[str]:
        """The deletion vector files (relative to the topic table) listed in the lease."""
        return [p for p in self.lease.files if p.startswith(f"{DV_PREFIX}/")]


def start_run(root: str, tomb_root: str | None) -> Run:
    """A new write id for a run on table ``root`` (and ``tomb_root``), its leases taken."""
    run = Run(uuid.uuid4().hex, root, tomb_root)
    try:
        for table in (root, tomb_root):
            if table is not None:
                run.leases.append(Lease.take(table, run.write_id))
    except BaseException:
        for lease in run.leases:
            lease.release()
        raise
    return run


def journal_dv_files(run: Run, merged: Sequence[str]) -> None:
    """List in the run's lease the deletion vector files that the stage-2 results ``merged``
    name, before the driver moves them into ``dv/`` (their names carry no write id)."""
    names = [
        d for row in merged for r in json.loads(row)["reports"] for _p, _d, d in r.get("dv", [])
    ]
    if names:
        run.lease.add_files(f"{DV_PREFIX}/{posixpath.basename(n)}" for n in names)


def reap_dead_runs(root: str, tomb_root: str | None, log: Log) -> None:
    """Remove what runs on table ``root`` (and its tombstone table) whose lease expired wrote:
    files no version references, listed deletion vector files, scratch, then the lease."""
    removed = reap_crashed_writes(root)
    if tomb_root is not None:
        removed += reap_crashed_writes(tomb_root)
    if removed:
        log(f"removed {removed} files of runs whose driver died before their end")


def _end(run: Run, dv_keep: set[str] | None) -> None:
    """Remove the listed deletion vector files not in ``dv_keep`` (None: all of them), the
    run's scratch, then release its leases: the run is over."""
    store = ObjectStore(table_location(run.root))
    for name in run.dv_files():
        if dv_keep is None or name not in dv_keep:
            store.delete(name, missing_ok=True)
    remove_scratch(store, run.write_id)
    for lease in run.leases:
        lease.release()


def cleanup_run(
    run: Run,
    *,
    keep: Mapping[str, Sequence[WrittenFile]] | None = None,
    committed: bool = False,
) -> None:
    """Remove this run's files: after a failure, all of them that no version references (the
    tombstone table may have committed before the topic table's commit failed); after the
    run, the attempts' leftovers (all of them if it committed nothing). Then its scratch and
    its leases: the run is over."""
    if keep is None:
        referenced = DeltaLog(run.root).referenced_files()
        cleanup_write_files(run.root, run.write_id, keep=referenced)
        if run.tomb_root is not None:
            cleanup_write_files(
                run.tomb_root, run.write_id, keep=DeltaLog(run.tomb_root).referenced_files()
            )
        _end(run, referenced)
        return
    main = {unquote(f.path) for f in keep.get("main", [])} if committed else set()
    main |= (
        {f"{CHANGE_DATA}/{unquote(f.path)}" for f in keep.get("cdc", [])} if committed else set()
    )
    cleanup_write_files(run.root, run.write_id, keep=main)
    if run.tomb_root is not None:
        tomb = {unquote(f.path) for f in keep.get("tomb", [])} if committed else set()
        cleanup_write_files(run.tomb_root, run.write_id, keep=tomb)
    _end(run, set(run.dv_files()) if committed else None)
