"""The transactional APIs of the transaction coordinator (KIP-98), versions 0-3 and 0-4.

AddPartitionsToTxn (24), AddOffsetsToTxn (25) and EndTxn (26) go to
:class:`logstore.server.txn.coordinator.TransactionCoordinator`; TxnOffsetCommit (28) is
checked there (the producer's transaction is Ongoing and holds the group's offsets partition)
and stored by the group coordinator as pending offsets of the transaction.

Served: AddPartitionsToTxn v0-v3 (v4+ batch several transactions and are sent by brokers
only), AddOffsetsToTxn, EndTxn and TxnOffsetCommit v0-v4 (v4 only lets the client receive
KIP-890's ``TRANSACTION_ABORTABLE``, which this coordinator never sends). EndTxn and
TxnOffsetCommit v5 belong to transaction protocol v2 (KIP-890 part 2: an epoch bump per
transaction, partitions added implicitly), which clients use only when the broker
finalizes the ``transaction.version`` feature in ApiVersions: this one does not, so
clients of Kafka 4.x stay on v4 and the AddPartitionsToTxn/AddOffsetsToTxn calls.
``PRODUCER_FENCED`` exists from v2 of AddPartitionsToTxn, AddOffsetsToTxn and EndTxn
(KIP-588); older versions get ``INVALID_PRODUCER_EPOCH`` instead, as from Kafka.

AddPartitionsToTxn naming a partition that does not exist: ``UNKNOWN_TOPIC_OR_PARTITION`` for
it and ``OPERATION_NOT_ATTEMPTED`` for the others (Kafka's answer); nothing is added. An
internal topic (which no client produces to; AddOffsetsToTxn adds ``__consumer_offsets``)
is answered the same way with ``INVALID_TOPIC_EXCEPTION``, Produce's answer for it.

Authorization (with ``authorizer.class.name``): WRITE on the transactional id for each of them
(else ``TRANSACTIONAL_ID_AUTHORIZATION_FAILED``); AddPartitionsToTxn WRITE on each topic,
AddOffsetsToTxn and TxnOffsetCommit READ on the group (and TxnOffsetCommit READ on each topic):
``TOPIC_`` / ``GROUP_AUTHORIZATION_FAILED``, as Kafka's ``KafkaApis``.
"""

from __future__ import annotations

from typing import Any, Final

from kio.schema.errors import ErrorCode

from logstore.server.context import RequestContext
from logstore.server.group.messages import CommitRequest
from logstore.server.handlers._util import ZERO_MS, build, response_module
from logstore.server.handlers.metadata import INTERNAL_TOPICS
from logstore.server.security.acls import AclOperation, ResourceType
from logstore.server.security.authorizer import authorized

__all__ = ["API_HANDLERS"]


def _fenced_for(ctx: RequestContext, error: ErrorCode, *, since: int) -> ErrorCode:
    if error is ErrorCode.producer_fenced and ctx.api_version < since:
        return ErrorCode.invalid_producer_epoch
    return error


def _exists(ctx: RequestContext, topic: str, partition: int) -> bool:
    return ctx.log_manager.get_log(topic, partition) is not None


def _txn_id_ok(ctx: RequestContext, transactional_id: str) -> bool:
    """Kafka: every transactional API needs WRITE on the transactional id."""
    return authorized(ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)


def _group_ok(ctx: RequestContext, group_id: str) -> bool:
    return authorized(ctx, AclOperation.READ, ResourceType.GROUP, group_id)


def add_partitions_to_txn(ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ctx)
    wanted = [(str(t.name), int(p)) for t in request.v3_and_below_topics for p in t.partitions]
    refused: dict[tuple[str, int], ErrorCode]
    if not _txn_id_ok(ctx, str(request.v3_and_below_transactional_id)):
        refused = dict.fromkeys(wanted, ErrorCode.transactional_id_authorization_failed)
    else:
        # Kafka: WRITE on each topic, checked before existence (nothing leaks)
        refused = {
            tp: ErrorCode.topic_authorization_failed
            for tp in wanted
            if not authorized(ctx, AclOperation.WRITE, ResourceType.TOPIC, tp[0])
        }
    refused = refused or {
        tp: ErrorCode.invalid_topic_exception
        if tp[0] in INTERNAL_TOPICS
        else ErrorCode.unknown_topic_or_partition
        for tp in wanted
        if tp[0] in INTERNAL_TOPICS or not _exists(ctx, *tp)
    }
    errors: dict[tuple[str, int], ErrorCode]
    if refused:
        errors = {tp: refused.get(tp, ErrorCode.operation_not_attempted) for tp in wanted}
    else:
        error = ctx.broker.txn_coordinator.add_partitions(
            str(request.v3_and_below_transactional_id),
            int(request.v3_and_below_producer_id),
            int(request.v3_and_below_producer_epoch),
            wanted,
        )
        error = _fenced_for(ctx, error, since=2)
        errors = dict.fromkeys(wanted, error)
    topics = tuple(
        build(
            mod.AddPartitionsToTxnTopicResult,
            name=t.name,
            results_by_partition=tuple(
                build(
                    mod.AddPartitionsToTxnPartitionResult,
                    partition_index=p,
                    partition_error_code=errors[(str(t.name), int(p))],
                )
                for p in t.partitions
            ),
        )
        for t in request.v3_and_below_topics
    )
    return build(
        mod.AddPartitionsToTxnResponse, throttle_time=ZERO_MS, results_by_topic_v3_and_below=topics
    )


def add_offsets_to_txn(ctx: RequestContext, request: Any) -> Any:
    if not _txn_id_ok(ctx, str(request.transactional_id)):
        error = ErrorCode.transactional_id_authorization_failed
    elif not _group_ok(ctx, str(request.group_id)):
        error = ErrorCode.group_authorization_failed
    else:
        error = ctx.broker.txn_coordinator.add_offsets(
            str(request.transactional_id),
            int(request.producer_id),
            int(request.producer_epoch),
            str(request.group_id),
        )
    return build(
        response_module(ctx).AddOffsetsToTxnResponse,
        throttle_time=ZERO_MS,
        error_code=_fenced_for(ctx, error, since=2),
    )


def end_txn(ctx: RequestContext, request: Any) -> Any:
    if not _txn_id_ok(ctx, str(request.transactional_id)):
        error = ErrorCode.transactional_id_authorization_failed
    else:
        error = ctx.broker.txn_coordinator.end_txn(
            str(request.transactional_id),
            int(request.producer_id),
            int(request.producer_epoch),
            commit=bool(request.committed),
        )
    return build(
        response_module(ctx).EndTxnResponse,
        throttle_time=ZERO_MS,
        error_code=_fenced_for(ctx, error, since=2),
    )


def txn_offset_commit(ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ctx)
    group_id = str(request.group_id)
    if not _txn_id_ok(ctx, str(request.transactional_id)):
        error = ErrorCode.transactional_id_authorization_failed
    elif not _group_ok(ctx, group_id):
        error = ErrorCode.group_authorization_failed
    else:
        error = ctx.broker.txn_coordinator.check_offset_commit(
            str(request.transactional_id),
            int(request.producer_id),
            int(request.producer_epoch),
            group_id,
        )
    slots: list[tuple[int, int, ErrorCode | None]] = []  # (topic index, partition, error)
    commits: list[CommitRequest] = []
    for ti, t in enumerate(request.topics):
        topic_ok = authorized(ctx, AclOperation.READ, ResourceType.TOPIC, str(t.name))
        for p in t.partitions:
            if error is not ErrorCode.none:
                slots.append((ti, int(p.partition_index), error))
            elif not topic_ok:
                slots.append((ti, int(p.partition_index), ErrorCode.topic_authorization_failed))
            elif not _exists(ctx, str(t.name), int(p.partition_index)):
                slots.append((ti, int(p.partition_index), ErrorCode.unknown_topic_or_partition))
            else:
                commits.append(
                    CommitRequest(
                        topic=str(t.name),
                        partition=int(p.partition_index),
                        offset=int(p.committed_offset),
                        leader_epoch=int(getattr(p, "committed_leader_epoch", -1)),
                        metadata=p.committed_metadata,
                    )
                )
                slots.append((ti, int(p.partition_index), None))
    results = iter(
        ctx.group_coordinator.txn_commit_offsets(
            group_id,
            producer_id=int(request.producer_id),
            producer_epoch=int(request.producer_epoch),
            generation_id=int(getattr(request, "generation_id", -1)),
            member_id=str(getattr(request, "member_id", "")),
            group_instance_id=getattr(request, "group_instance_id", None),
            offsets=commits,
        )
        if commits
        else []
    )
    by_topic: list[list[Any]] = [[] for _ in request.topics]
    for ti, partition, err in slots:
        by_topic[ti].append(
            build(
                mod.TxnOffsetCommitResponsePartition,
                partition_index=partition,
                error_code=err if err is not None else next(results),
            )
        )
    topics = tuple(
        build(mod.TxnOffsetCommitResponseTopic, name=t.name, partitions=tuple(parts))
        for t, parts in zip(request.topics, by_topic, strict=True)
    )
    return build(mod.TxnOffsetCommitResponse, throttle_time=ZERO_MS, topics=topics)


API_HANDLERS: Final[dict[int, tuple[int, int, Any]]] = {
    24: (0, 3, add_partitions_to_txn),
    25: (0, 4, add_offsets_to_txn),
    26: (0, 4, end_txn),
    28: (0, 4, txn_offset_commit),
}
