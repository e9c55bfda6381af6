"""InitProducerId (key 22), v0-v4: producer ids for idempotent producers.

Without a transactional id: a fresh producer id with epoch 0, or (v3+, KIP-360) the same id
with its epoch bumped when the client passes its current id and epoch. Ids are unique across
restarts without persisted state: ``(wall clock ms at start) * 1024 + counter``, which stays
below 2**63 and grows monotonically as long as the clock does.

With a transactional id: transactions are not supported, so the answer is Kafka's
``TRANSACTIONAL_ID_AUTHORIZATION_FAILED`` (fatal in every client: a clear error, not a
retry loop). The transactional APIs answer with the same error
(``logstore.server.handlers.transactions``).
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Final

from kio.schema.errors import ErrorCode

from logstore.server.context import RequestContext
from logstore.server.handlers._util import ZERO_MS, build, response_module

__all__ = ["API_KEY", "MAX_VERSION", "MIN_VERSION", "handle"]

API_KEY: Final = 22
MIN_VERSION: Final = 0
MAX_VERSION: Final = 4

_lock = threading.Lock()
_counter = itertools.count((time.time_ns() // 1_000_000) * 1024)
_MAX_EPOCH: Final = 32767


def _next_id() -> int:
    with _lock:
        return next(_counter)


def handle(ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ctx)
    if request.transactional_id is not None:
        return build(
            mod.InitProducerIdResponse,
            throttle_time=ZERO_MS,
            error_code=ErrorCode.transactional_id_authorization_failed,
            producer_id=-1,
            producer_epoch=-1,
        )
    pid = int(getattr(request, "producer_id", -1))
    epoch = int(getattr(request, "producer_epoch", -1))
    if pid >= 0 and 0 <= epoch < _MAX_EPOCH - 1:
        new_pid, new_epoch = pid, epoch + 1
    else:
        new_pid, new_epoch = _next_id(), 0
    return build(
        mod.InitProducerIdResponse,
        throttle_time=ZERO_MS,
        error_code=ErrorCode.none,
        producer_id=new_pid,
        producer_epoch=new_epoch,
    )
