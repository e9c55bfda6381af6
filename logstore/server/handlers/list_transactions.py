"""ListTransactions (key 66), v0-v1 (KIP-664; v1's duration filter: KIP-994).

Every transactional id the coordinator knows, with its producer id and state (Kafka's state
names), filtered as Kafka filters (``TransactionStateManager.listTransactionStates``):

- ``state_filters``: only ids in one of these states; a name Kafka does not know is left out
  of the filter and returned in ``unknown_state_filters`` (so ``["Bogus"]`` alone lists
  nothing, as in Kafka: the filter is non-empty and matches no state);
- ``producer_id_filters``: only ids whose current producer id is one of these;
- ``duration_filter`` (v1): when >= 0, only ids whose transaction started more than that many
  ms ago (see :meth:`~logstore.server.txn.coordinator.TransactionCoordinator.list_transactions`).

Ids being expired (Dead) are never listed. ``COORDINATOR_NOT_AVAILABLE`` when the coordinator
is not running; ``COORDINATOR_LOAD_IN_PROGRESS`` cannot arise (it loads before the listener
opens). v2 (KIP-1152's transactional id regular expression, a Java regex) is not
implemented, so not advertised: clients that need the pattern refuse to send it to v0-v1.

Authorization (with ``authorizer.class.name``): only the transactional ids the principal may
DESCRIBE are listed, as Kafka.
"""

from __future__ import annotations

from typing import Any, Final

from kio.schema.errors import ErrorCode

from logstore.server.context import RequestContext
from logstore.server.handlers._util import ZERO_MS, build, response_module
from logstore.server.security.acls import AclOperation, ResourceType
from logstore.server.security.authorizer import authorized
from logstore.server.txn.schemas import TxnState

__all__ = ["API_KEY", "MAX_VERSION", "MIN_VERSION", "handle"]

API_KEY: Final = 66
MIN_VERSION: Final = 0
MAX_VERSION: Final = 1


def handle(ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ctx)
    coordinator = ctx.broker.txn_coordinator
    if coordinator is None:
        return build(
            mod.ListTransactionsResponse,
            throttle_time=ZERO_MS,
            error_code=ErrorCode.coordinator_not_available,
            unknown_state_filters=(),
            transaction_states=(),
        )
    states: set[TxnState] = set()
    unknown: list[str] = []
    for name in request.state_filters:
        state = TxnState.from_kafka_name(str(name))
        if state is None:
            unknown.append(str(name))
        else:
            states.add(state)
    if request.state_filters and not states:
        listed: list[tuple[str, int, TxnState]] = []  # a filter that matches no state
    else:
        listed = coordinator.list_transactions(
            states=frozenset(states),
            producer_ids=frozenset(int(p) for p in request.producer_id_filters),
            min_duration_ms=int(getattr(request, "duration_filter", -1)),
        )
    return build(
        mod.ListTransactionsResponse,
        throttle_time=ZERO_MS,
        error_code=ErrorCode.none,
        unknown_state_filters=tuple(unknown),
        transaction_states=tuple(
            build(
                mod.TransactionState,
                transactional_id=txn_id,
                producer_id=pid,
                transaction_state=state.kafka_name,
            )
            for txn_id, pid, state in listed
            # Kafka lists only the transactional ids the principal may DESCRIBE
            if authorized(ctx, AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, txn_id)
        ),
    )
