"""Producer ids, unique across restarts without persisted state.

``(wall clock ms at start) * 1024 + counter``: below 2**63 and growing monotonically as long
as the clock does (a restart starts above every id the previous run handed out unless it
handed out more than 1024 a millisecond of its lifetime). Idempotent producers
(InitProducerId without a transactional id) and the transaction coordinator share it.

Thread-safety: :func:`next_producer_id` may be called from any thread.
"""

from __future__ import annotations

import itertools
import threading
import time

__all__ = ["next_producer_id"]

_lock = threading.Lock()
_counter = itertools.count((time.time_ns() // 1_000_000) * 1024)


def next_producer_id() -> int:
    with _lock:
        return next(_counter)
