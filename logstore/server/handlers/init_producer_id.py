"""InitProducerId (key 22), v0-v4: producer ids for idempotent and transactional producers.

Without a transactional id: a fresh producer id with epoch 0, or (v3+, KIP-360) the same id
with its epoch bumped when the client passes its current id and epoch
(:mod:`logstore.server.txn.producer_ids` makes ids unique across restarts).

With a transactional id: the transaction coordinator's answer
(:meth:`logstore.server.txn.coordinator.TransactionCoordinator.init_producer_id`): the id's
producer id with a bumped epoch, fencing the previous producer of the id. ``PRODUCER_FENCED``
exists from v4 on (KIP-588); older versions get ``INVALID_PRODUCER_EPOCH``, as from Kafka.
"""

from __future__ import annotations

from typing import Any, Final

from kio.schema.errors import ErrorCode

from logstore.server.context import RequestContext
from logstore.server.handlers._util import ZERO_MS, build, response_module
from logstore.server.txn.producer_ids import next_producer_id

__all__ = ["API_KEY", "MAX_VERSION", "MIN_VERSION", "handle"]

API_KEY: Final = 22
MIN_VERSION: Final = 0
MAX_VERSION: Final = 4

_MAX_EPOCH: Final = 32767


def handle(ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ctx)
    pid = int(getattr(request, "producer_id", -1))
    epoch = int(getattr(request, "producer_epoch", -1))
    if request.transactional_id is not None:
        error, new_pid, new_epoch = ctx.broker.txn_coordinator.init_producer_id(
            str(request.transactional_id),
            int(request.transaction_timeout.total_seconds() * 1000),
            expected_producer_id=pid,
            expected_epoch=epoch,
        )
        if error is ErrorCode.producer_fenced and ctx.api_version < 4:
            error = ErrorCode.invalid_producer_epoch
    elif pid >= 0 and 0 <= epoch < _MAX_EPOCH - 1:
        error, new_pid, new_epoch = ErrorCode.none, pid, epoch + 1
    else:
        error, new_pid, new_epoch = ErrorCode.none, next_producer_id(), 0
    return build(
        mod.InitProducerIdResponse,
        throttle_time=ZERO_MS,
        error_code=error,
        producer_id=new_pid,
        producer_epoch=new_epoch,
    )
