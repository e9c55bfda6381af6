"""The transactional APIs, answered with Kafka's error for an unusable transactional id.

Transactions are not supported yet. Kafka brokers always advertise AddPartitionsToTxn (24),
AddOffsetsToTxn (25), EndTxn (26) and TxnOffsetCommit (28), so a client that sends one
anyway gets a well-formed answer rather than a closed connection (which clients retry —
a hang): ``TRANSACTIONAL_ID_AUTHORIZATION_FAILED`` for every partition / the request, the
same error InitProducerId gives a transactional id. It is fatal in every client, with a
message naming the transactional id. Versions 0-3 (the ones before KIP-890's batching).
"""

from __future__ import annotations

from typing import Any, Final

from kio.schema.errors import ErrorCode

from logstore.server.context import RequestContext
from logstore.server.handlers._util import ZERO_MS, build, response_module

__all__ = ["API_HANDLERS"]

_ERROR: Final = ErrorCode.transactional_id_authorization_failed


def add_partitions_to_txn(ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ctx)
    topics = tuple(
        build(
            mod.AddPartitionsToTxnTopicResult,
            name=t.name,
            results_by_partition=tuple(
                build(
                    mod.AddPartitionsToTxnPartitionResult,
                    partition_index=p,
                    partition_error_code=_ERROR,
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
    return build(
        response_module(ctx).AddOffsetsToTxnResponse, throttle_time=ZERO_MS, error_code=_ERROR
    )


def end_txn(ctx: RequestContext, request: Any) -> Any:
    return build(response_module(ctx).EndTxnResponse, throttle_time=ZERO_MS, error_code=_ERROR)


def txn_offset_commit(ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ctx)
    topics = tuple(
        build(
            mod.TxnOffsetCommitResponseTopic,
            name=t.name,
            partitions=tuple(
                build(
                    mod.TxnOffsetCommitResponsePartition,
                    partition_index=p.partition_index,
                    error_code=_ERROR,
                )
                for p in t.partitions
            ),
        )
        for t in request.topics
    )
    return build(mod.TxnOffsetCommitResponse, throttle_time=ZERO_MS, topics=topics)


API_HANDLERS: Final[dict[int, tuple[int, int, Any]]] = {
    24: (0, 3, add_partitions_to_txn),
    25: (0, 3, add_offsets_to_txn),
    26: (0, 3, end_txn),
    28: (0, 3, txn_offset_commit),
}
