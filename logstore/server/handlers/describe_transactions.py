"""DescribeTransactions (key 65), v0 (KIP-664): the coordinator's state of transactional ids.

One answer per transactional id of the request, in its order (duplicates included, as
Kafka answers them): state by Kafka's name (``Empty``, ``Ongoing``, ``PrepareCommit``,
``PrepareAbort``, ``CompleteCommit``, ``CompleteAbort``, ``PrepareEpochFence``), producer id and
epoch, ``transaction.timeout.ms``, the start of the current (or last) transaction (-1 when the
producer never started one), and the transaction's partitions (while Prepare*, only those
still without their marker). Errors per id, as Kafka's ``handleDescribeTransactions``:

- ``TRANSACTIONAL_ID_NOT_FOUND``: an id the coordinator does not know, or one being expired;
- ``INVALID_REQUEST``: the empty id;
- ``COORDINATOR_NOT_AVAILABLE``: the coordinator is not running (broker starting or
  stopping).

``NOT_COORDINATOR`` and ``COORDINATOR_LOAD_IN_PROGRESS`` cannot arise on this single broker:
it leads every ``__transaction_state`` partition and loads them all before its listener
opens. There is no authorization (so no ``TRANSACTIONAL_ID_AUTHORIZATION_FAILED``).
"""

from __future__ import annotations

import datetime
from typing import Any, Final

from kio.schema.errors import ErrorCode

from logstore.server.context import RequestContext
from logstore.server.handlers._util import ZERO_MS, build, response_module
from logstore.server.security.acls import AclOperation, ResourceType
from logstore.server.security.authorizer import authorized

__all__ = ["API_KEY", "MAX_VERSION", "MIN_VERSION", "handle"]

API_KEY: Final = 65
MIN_VERSION: Final = 0
MAX_VERSION: Final = 0

_EPOCH_0: Final = datetime.datetime.fromtimestamp(0, tz=datetime.UTC)


def _ms(ms: int) -> datetime.datetime:
    return _EPOCH_0 + datetime.timedelta(milliseconds=ms)


def _describe_one(ctx: RequestContext, mod: Any, coordinator: Any, transactional_id: str) -> Any:
    def failed(error: ErrorCode) -> Any:
        # Kafka's defaults for the fields it leaves unset.
        return build(
            mod.TransactionState,
            error_code=error,
            transactional_id=transactional_id,
            transaction_state="",
            transaction_timeout=ZERO_MS,
            transaction_start_time=_EPOCH_0,
            producer_id=0,
            producer_epoch=0,
            topics=(),
        )

    if coordinator is None:
        return failed(ErrorCode.coordinator_not_available)
    if not authorized(ctx, AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, transactional_id):
        return failed(ErrorCode.transactional_id_authorization_failed)  # Kafka: DESCRIBE
    if not transactional_id:
        return failed(ErrorCode.invalid_request)
    v = coordinator.describe(transactional_id)
    if v is None:
        return failed(ErrorCode.transactional_id_not_found)
    return build(
        mod.TransactionState,
        error_code=ErrorCode.none,
        transactional_id=transactional_id,
        transaction_state=v.state.kafka_name,
        transaction_timeout=datetime.timedelta(milliseconds=v.timeout_ms),
        transaction_start_time=_ms(v.start_ms),
        producer_id=v.producer_id,
        producer_epoch=v.producer_epoch,
        topics=tuple(
            build(mod.TopicData, topic=topic, partitions=partitions)
            for topic, partitions in v.partitions
            # Kafka leaves out the topics the principal may not DESCRIBE
            if authorized(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, topic)
        ),
    )


def handle(ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ctx)
    coordinator = ctx.broker.txn_coordinator
    return build(
        mod.DescribeTransactionsResponse,
        throttle_time=ZERO_MS,
        transaction_states=tuple(
            _describe_one(ctx, mod, coordinator, str(t)) for t in request.transactional_ids
        ),
    )
