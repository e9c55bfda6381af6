"""What every loglake task does first in a Spark Python worker.

A reused pyspark worker runs a full ``gc.collect()`` after every task (``pyspark/daemon.py``),
and the next task waits for it. With numba, pyarrow and pyspark loaded that collection walks
~140k objects, ~85 ms, for every task (measured: 65-128 ms from a task's launch to the start
of its Python code, 8-30 ms with :func:`start_task`).
"""

from __future__ import annotations

import gc

__all__ = ["start_task"]


def start_task() -> None:
    """Freeze what is alive when a task starts (modules, compiled kernels, caches): it moves to
    the permanent generation and the collections look only at what tasks create afterwards.

    The price: a reference cycle among the frozen objects is never collected. Call it at the
    start of a task's Python code, in the executor, never in the driver.
    """
    gc.freeze()
