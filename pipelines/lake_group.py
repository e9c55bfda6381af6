"""Tell the broker how far the lake has read: ingest's progress as a Kafka consumer group.

After its Delta commit, ingest commits every partition's next offset to ingest (the ``records``
table's progress) to the consumer group ``[ingest] lake_group`` on ``[ingest]
bootstrap_servers``, with one OffsetCommit request (v8, a simple commit: generation -1, no
member, as ``kafka-consumer-groups --reset-offsets`` or a consumer that never subscribed
does). Then:

* Kafka tools show the lake's lag (``kafka-consumer-groups --describe --group loglake-ingest``);
* a broker with ``log.retention.lake.group`` set to that group bounds its periodic time/size
  retention by these offsets: no segment holding an offset the lake has not ingested is
  deleted (conf/broker.properties, within its ``log.retention.lake.max.*`` safety valves);
  a partition this group has no offset for yet is held from its log start until the first
  commit (``logstore.storage.log_manager.LogManager.set_lake_bound``).

Never fails the ingest: the Delta commit is the lake's truth and this a copy of it, so a broker
that cannot be reached or refuses the commit is one line in the log, and the next run commits
again. Every run commits every partition it reads (``[ingest] topics``), also those with
nothing new: that keeps the commit's timestamp fresh for ``log.retention.lake.max.ms``; a topic
no longer ingested is no longer committed, so its commit ages out (that valve, then
``offsets.retention.minutes``) instead of holding its segments forever.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kio.schema.errors import ErrorCode
from kio.schema.offset_commit.v8.request import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import i32, i64

from logstore.errors import LoglakeError
from logstore.tools.client_config import ClientConfig
from logstore.tools.connection import KafkaConnection

__all__ = ["commit_lake_offsets"]

_TIMEOUT_S = 30.0


def commit_lake_offsets(
    bootstrap: str,
    group: str,
    offsets: Mapping[tuple[str, int], int],
    *,
    log: Callable[[str], None],
    client: ClientConfig | None = None,
) -> int | None:
    """Commit ``offsets`` (``{(topic, partition): next offset}``) to ``group`` on the broker at
    ``bootstrap`` (``host:port``), connecting with ``client`` (``[kafka]``; None: PLAINTEXT).
    Returns how many partitions were committed, None when the commit failed (logged in one
    line, never raised: a refused login too)."""
    if not offsets:
        return 0
    by_topic: dict[str, list[OffsetCommitRequestPartition]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        by_topic.setdefault(topic, []).append(
            OffsetCommitRequestPartition(
                partition_index=i32(partition),
                committed_offset=i64(offset),
                committed_metadata="",
            )
        )
    request = OffsetCommitRequest(
        group_id=GroupId(group),
        generation_id_or_member_epoch=i32(-1),
        member_id="",
        topics=tuple(
            OffsetCommitRequestTopic(name=TopicName(t), partitions=tuple(ps))
            for t, ps in by_topic.items()
        ),
    )
    first = bootstrap.split(",", maxsplit=1)[0].strip()  # a single-node broker: its coordinator too
    try:
        with KafkaConnection(
            first, client_id="loglake-ingest", timeout=_TIMEOUT_S, config=client
        ) as conn:
            response = conn.call(request)
    except (LoglakeError, OSError) as exc:
        log(f"lake group {group!r} not committed to {bootstrap}: {exc}")
        return None
    errors = [
        f"{t.name}/{p.partition_index}: {p.error_code.name}"
        for t in response.topics
        for p in t.partitions
        if p.error_code != ErrorCode.none
    ]
    if errors:
        shown = ", ".join(errors[:5]) + (f" and {len(errors) - 5} more" if len(errors) > 5 else "")
        log(
            f"lake group {group!r} not committed to {bootstrap} for {len(errors)} "
            f"partitions: {shown}"
        )
        return len(offsets) - len(errors) or None
    log(f"lake group {group!r}: committed {len(offsets)} partitions' offsets to {bootstrap}")
    return len(offsets)
