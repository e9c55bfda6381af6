"""What every loglake task does first in a Spark Python worker.

A reused pyspark worker runs a full ``gc.collect()`` after every task (``pyspark/daemon.py``),
and the next task waits for it. With numba, pyarrow and pyspark loaded that collection walks
~140k objects, ~85 ms, for every task (measured: 65-128 ms from a task's launch to the start
of its Python code, 8-30 ms with :func:`start_task`).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from logstore.objectstore import StorageSettings, use_job_settings

__all__ = ["arrow_single_threaded", "start_task", "without_huge_pages"]


def start_task(*, settings: StorageSettings | None = None) -> None:
    """Freeze what is alive when a task starts (modules, compiled kernels, caches): it moves to
    the permanent generation and the collections look only at what tasks create afterwards.
    And install the task's object-store ``settings`` as this process's
    (:func:`logstore.objectstore.use_job_settings`; None: the environment's), so that a reused
    worker never keeps the settings of an earlier task or job.

    The price: a reference cycle among the frozen objects is never collected. Call it at the
    start of a task's Python code, in the executor, never in the driver.
    """
    gc.freeze()
    use_job_settings(settings)


@contextlib.contextmanager
def arrow_single_threaded() -> Iterator[None]:
    """Arrow's thread pool at one thread for the task: Spark already runs one task per core, and
    Arrow's threads on top cost more CPU than they save (measured in-process, 2M records: stage
    1 3.2 -> 1.9 CPU seconds). Restored afterwards (the worker process may run other tasks)."""
    before = pa.cpu_count()
    pa.set_cpu_count(1)
    try:
        yield
    finally:
        pa.set_cpu_count(before)


_PR_SET_THP_DISABLE = 41  # prctl(2)
_PR_GET_THP_DISABLE = 42


@contextlib.contextmanager
def without_huge_pages() -> Iterator[None]:
    """Transparent huge pages off for the task's process (Linux ``prctl``), restored afterwards.
    Compaction's tasks allocate and free a few hundred MB of short-lived buffers; with
    huge pages (Arrow's allocator gets them where the kernel offers them on ``madvise``) each
    first touch of 2 MB zeroes it and may compact memory first (measured in-process, 5M
    records on the 2-core test machine: 1.8 s of system time with, 0.7 s without; user time
    the same. Stage 2, bench_compact's incremental run into the 10M-key table, CPU of the
    stage-2 tasks: reading the matched rows 3.8 s with, 1.1 s without; writing 1.9 s, 1.0 s.
    The log's pass, 10M records in 4 partitions: a partition's key map 1.0 s with, 0.6 s
    without; the whole pass 4.3 s, 3.5 s).

    Not used by ingest's or the lookups job's tasks: they read 16 MB chunks through buffers
    the allocators reuse (a steady task of 134 MB faults in ~25 MB of new pages) and gain
    nothing (``tests/perf/bench_task_cpu.py``, the first task of 3M records, user+sys CPU,
    medians with / without huge pages, uncompressed then lz4: decode and write 0.50 / 0.49 s
    and 0.59 / 0.60 s; read_committed pre-pass 0.06 / 0.06 s and 0.04 / 0.04 s; offset lookup
    0.08 / 0.07 s and 0.06 / 0.06 s; index check 0.22 / 0.23 s and 0.16 / 0.17 s. The first
    task of a fresh worker process, 8 runs each: 0.83 / 0.85 s and 1.12 / 1.06 s, its system
    time above 0.3 s in 3 of 16 runs with huge pages, never without. Arrow single-threaded
    changes nothing there either: those tasks run no Arrow threads)."""
    libc: Any = None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        changed = libc.prctl(_PR_GET_THP_DISABLE, 0, 0, 0, 0) == 0 and (
            libc.prctl(_PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0
        )
    except (OSError, AttributeError):  # not Linux
        changed = False
    try:
        yield
    finally:
        if changed:
            libc.prctl(_PR_SET_THP_DISABLE, 0, 0, 0, 0)
