"""A small scheduler for background storage work: flushes, retention, checkpoints, deletes.

One daemon thread runs due tasks in time order from a heap (Kafka's ``KafkaScheduler`` uses a
thread pool; one thread is enough for this engine's short tasks and keeps them serialised).
A task that raises is logged and, if periodic, rescheduled: one failing partition must not stop
retention for the others. :meth:`Scheduler.shutdown` stops the thread; tasks still queued are
dropped unless ``run_pending=True``. Thread-safe: tasks may be scheduled from any thread,
including from inside a task.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["ScheduledTask", "Scheduler"]

_log = logging.getLogger(__name__)


@dataclass(order=True)
class ScheduledTask:
    due: float
    seq: int
    name: str = field(compare=False)
    fn: Callable[[], object] = field(compare=False)
    period_s: float | None = field(compare=False, default=None)
    cancelled: bool = field(compare=False, default=False)

    def cancel(self) -> None:
        self.cancelled = True


class Scheduler:
    """Run callables after a delay, optionally periodically, on one background thread."""

    def __init__(self, *, name: str = "logstore-scheduler") -> None:
        self._name = name
        self._heap: list[ScheduledTask] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def start(self) -> None:
        with self._cond:
            if self._thread is not None:
                return
            self._stopped = False
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._stopped

    def schedule(
        self,
        name: str,
        fn: Callable[[], object],
        *,
        delay_ms: float = 0,
        period_ms: float | None = None,
    ) -> ScheduledTask:
        """Run ``fn`` after ``delay_ms``, then every ``period_ms`` if given."""
        task = ScheduledTask(
            due=time.monotonic() + delay_ms / 1000.0,
            seq=next(self._seq),
            name=name,
            fn=fn,
            period_s=None if period_ms is None else max(period_ms, 1) / 1000.0,
        )
        with self._cond:
            heapq.heappush(self._heap, task)
            self._cond.notify()
        return task

    def pending(self) -> int:
        with self._cond:
            return sum(1 for t in self._heap if not t.cancelled)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    if self._heap and self._heap[0].cancelled:
                        heapq.heappop(self._heap)
                        continue
                    if self._heap and self._heap[0].due <= time.monotonic():
                        break
                    timeout = self._heap[0].due - time.monotonic() if self._heap else None
                    self._cond.wait(timeout)
                if self._stopped:
                    return
                task = heapq.heappop(self._heap)
            self._execute(task)

    def _execute(self, task: ScheduledTask) -> None:
        try:
            task.fn()
        except Exception:
            _log.exception("scheduled task %s failed", task.name)
        if task.period_s is not None and not task.cancelled:
            with self._cond:
                if not self._stopped:
                    task.due = time.monotonic() + task.period_s
                    task.seq = next(self._seq)
                    heapq.heappush(self._heap, task)

    def shutdown(self, *, run_pending: bool = False, timeout_s: float = 30.0) -> None:
        """Stop the thread; with ``run_pending`` run the queued one-shot tasks first, here."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
            thread, self._thread = self._thread, None
            remaining = [] if not run_pending else sorted(self._heap)
            self._heap = []
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
        for task in remaining:
            if not task.cancelled and task.period_s is None:
                try:
                    task.fn()
                except Exception:
                    _log.exception("scheduled task %s failed at shutdown", task.name)
