"""Delayed operations (Kafka's purgatory): complete when a condition holds or at a deadline.

A :class:`DelayedOperation` is something like a Fetch waiting for ``min_bytes``: it watches
keys (``(topic, partition)``), is re-checked by :meth:`Purgatory.check_and_complete` when
one of its keys changes (an append), and is force-completed by the timer thread when its
deadline passes. ``try_complete`` / ``on_expire`` run at most once successfully: the
operation's ``completed`` flag is taken under a lock so a wake-up and the timer may race.

Thread-safety: every method may be called from any thread. Callbacks run on the calling
thread (handler thread for wake-ups, the purgatory's timer thread for expiry) and must not
block.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Hashable, Iterable
from typing import Final

__all__ = ["DelayedOperation", "Purgatory"]

log = logging.getLogger(__name__)


class DelayedOperation:
    """Subclass and implement :meth:`ready` and :meth:`complete`.

    ``ready()`` says whether the operation can complete now; ``complete(expired)`` produces
    the result (called exactly once, either because ``ready()`` was true or the deadline
    passed).
    """

    def __init__(self, deadline_ms: int) -> None:
        self.deadline_ms = deadline_ms
        self._lock = threading.Lock()
        self.completed = False

    def ready(self) -> bool:
        raise NotImplementedError

    def complete(self, *, expired: bool) -> None:
        raise NotImplementedError

    def try_complete(self, *, expired: bool = False) -> bool:
        """Complete if ready (or expired); True when this call completed it."""
        with self._lock:
            if self.completed:
                return False
            if not expired and not self.ready():
                return False
            self.completed = True
        try:
            self.complete(expired=expired)
        except Exception:
            log.exception("delayed operation failed to complete")
        return True


class Purgatory:
    """Watch lists per key plus a deadline heap served by one timer thread."""

    _TICK_S: Final = 0.05

    def __init__(self, name: str = "fetch") -> None:
        self._lock = threading.Lock()
        self._watchers: dict[Hashable, list[DelayedOperation]] = {}
        self._heap: list[tuple[int, int, DelayedOperation]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition(self._lock)
        self._running = True
        self._thread = threading.Thread(
            target=self._run, name=f"loglake-purgatory-{name}", daemon=True
        )
        self._thread.start()

    def try_complete_else_watch(self, op: DelayedOperation, keys: Iterable[Hashable]) -> bool:
        """Complete ``op`` now if it is ready, otherwise watch it; True if completed now."""
        if op.try_complete():
            return True
        with self._lock:
            if not self._running:
                expire_now = True
            else:
                expire_now = False
                for key in keys:
                    self._watchers.setdefault(key, []).append(op)
                heapq.heappush(self._heap, (op.deadline_ms, next(self._seq), op))
                self._cond.notify()
        if expire_now:  # shut down: nobody would ever expire it
            return op.try_complete(expired=True)
        # An append between the first check and the watch would otherwise be missed.
        return op.try_complete()

    def check_and_complete(self, key: Hashable) -> int:
        """Re-check the operations watching ``key``; returns how many completed."""
        with self._lock:
            ops = self._watchers.get(key)
            if not ops:
                return 0
            pending = [op for op in ops if not op.completed]
            if pending:
                self._watchers[key] = pending
            else:
                del self._watchers[key]
        done = 0
        for op in pending:
            if op.try_complete():
                done += 1
        return done

    def _run(self) -> None:
        while True:
            expired: list[DelayedOperation] = []
            with self._lock:
                if not self._running:
                    expired = [op for _, _, op in self._heap]
                    self._heap.clear()
                else:
                    now = time.monotonic_ns() // 1_000_000
                    while self._heap and (self._heap[0][0] <= now or self._heap[0][2].completed):
                        expired.append(heapq.heappop(self._heap)[2])
                    if not expired:
                        wait = (self._heap[0][0] - now) / 1000 if self._heap else 1.0
                        self._cond.wait(min(max(wait, 0.001), 1.0))
                        if len(self._watchers) > 1024:
                            self._purge()
                        continue
            for op in expired:
                op.try_complete(expired=True)
            if not self._running:
                return

    def _purge(self) -> None:
        for key in list(self._watchers):
            live = [op for op in self._watchers[key] if not op.completed]
            if live:
                self._watchers[key] = live
            else:
                del self._watchers[key]

    def shutdown(self) -> None:
        """Expire every waiting operation now and stop the timer thread."""
        with self._lock:
            self._running = False
            self._cond.notify()
        self._thread.join(timeout=5)
