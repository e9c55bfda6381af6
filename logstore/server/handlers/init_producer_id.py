"""InitProducerId (key 22), v0-v5: producer ids for idempotent and transactional producers.

Kafka's answers (``KafkaApis.handleInitProducerIdRequest`` and
``TransactionCoordinator.handleInitProducerId``), step by step:

1. The request's ``producer_id``/``producer_epoch`` (v3+, KIP-360) are both -1 (none given)
   or both set; one without the other is ``INVALID_REQUEST``.
2. Without a transactional id (an idempotent producer): always a fresh producer id
   (:mod:`logstore.server.txn.producer_ids`, unique across restarts) with epoch 0. The given
   id and epoch are ignored, as Kafka ignores them: trusting them would hand one producer id
   to every client that sends ``0/0`` instead of ``-1/-1`` (the JavaScript client
   @platformatic/kafka 1.35 does), so that a second producer's first batch was taken for a
   duplicate of the first's and acknowledged without being written; and it would let any
   client continue any other producer's id.
3. With a transactional id: the transaction coordinator's answer
   (:meth:`logstore.server.txn.coordinator.TransactionCoordinator.init_producer_id`): the
   id's producer id with a bumped epoch, fencing the previous producer of the id; a KIP-360
   bump only when the given id and epoch are the coordinator's, else ``PRODUCER_FENCED``.
   ``PRODUCER_FENCED`` exists from v4 on (KIP-588); older versions get
   ``INVALID_PRODUCER_EPOCH``, as from Kafka.

v5 has v4's fields (KIP-890 only lets the client receive ``TRANSACTION_ABORTABLE``, which
this broker never sends).

Authorization (with ``authorizer.class.name``): WRITE on the transactional id (else
``TRANSACTIONAL_ID_AUTHORIZATION_FAILED``); without one, IDEMPOTENT_WRITE on the cluster or
WRITE on any topic (Kafka 4, KIP-679; else ``CLUSTER_AUTHORIZATION_FAILED``).
"""

from __future__ import annotations

from typing import Any, Final

from kio.schema.errors import ErrorCode

from logstore.server.context import RequestContext
from logstore.server.handlers._util import ZERO_MS, build, response_module
from logstore.server.security.acls import AclOperation, ResourceType
from logstore.server.security.authorizer import authorized, authorized_any, authorized_cluster
from logstore.server.txn.producer_ids import next_producer_id

__all__ = ["API_KEY", "MAX_VERSION", "MIN_VERSION", "handle"]

API_KEY: Final = 22
MIN_VERSION: Final = 0
MAX_VERSION: Final = 5

_NO_PRODUCER_ID: Final = -1
_NO_PRODUCER_EPOCH: Final = -1


def handle(ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ctx)
    # v0-v2 have neither field: none given
    pid = int(getattr(request, "producer_id", _NO_PRODUCER_ID))
    epoch = int(getattr(request, "producer_epoch", _NO_PRODUCER_EPOCH))
    new_pid, new_epoch = _NO_PRODUCER_ID, _NO_PRODUCER_EPOCH
    if request.transactional_id is not None and not authorized(
        ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, str(request.transactional_id)
    ):
        error = ErrorCode.transactional_id_authorization_failed
    elif request.transactional_id is None and not (
        authorized_cluster(ctx, AclOperation.IDEMPOTENT_WRITE)
        or authorized_any(ctx, AclOperation.WRITE, ResourceType.TOPIC)
    ):
        # Kafka 4 (KIP-679): IDEMPOTENT_WRITE on the cluster, or WRITE on any topic
        error = ErrorCode.cluster_authorization_failed
    elif (pid == _NO_PRODUCER_ID) != (epoch == _NO_PRODUCER_EPOCH):
        error = ErrorCode.invalid_request
    elif request.transactional_id is None:
        error, new_pid, new_epoch = ErrorCode.none, next_producer_id(), 0
    else:
        error, new_pid, new_epoch = ctx.broker.txn_coordinator.init_producer_id(
            str(request.transactional_id),
            int(request.transaction_timeout.total_seconds() * 1000),
            expected_producer_id=pid,
            expected_epoch=epoch,
        )
        if error is ErrorCode.producer_fenced and ctx.api_version < 4:
            error = ErrorCode.invalid_producer_epoch
    return build(
        mod.InitProducerIdResponse,
        throttle_time=ZERO_MS,
        error_code=error,
        producer_id=new_pid,
        producer_epoch=new_epoch,
    )
