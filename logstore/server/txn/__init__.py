"""The transaction coordinator (KIP-98): state machine, ``__transaction_state`` log, ids."""

from logstore.server.txn.coordinator import (
    MarkerWriter,
    TransactionCoordinator,
    TxnConfig,
)
from logstore.server.txn.state_log import TRANSACTION_STATE_TOPIC, TxnStateLog

__all__ = [
    "TRANSACTION_STATE_TOPIC",
    "MarkerWriter",
    "TransactionCoordinator",
    "TxnConfig",
    "TxnStateLog",
]
