"""Fetch v4-v17 over the wire (raw kio requests): v13+ name topics by id (KIP-516); and
the other versions Kafka 4.0 added that the broker now serves (ListOffsets v8-v10, Metadata
v13, DescribeGroups v6).

Every version returns the same record bytes (served from the segment file with sendfile);
v13+ resolve the id Metadata returned, also after a restart when the client did not ask for
metadata again, and answer ``UNKNOWN_TOPIC_ID`` for an id of no topic, as Kafka does.
"""

from __future__ import annotations

import datetime
import importlib
import uuid
from typing import Any

import confluent_kafka as ck
import pytest
from kio.schema.describe_groups.v5.request import DescribeGroupsRequest as DescribeGroupsV5
from kio.schema.describe_groups.v6.request import DescribeGroupsRequest as DescribeGroupsV6
from kio.schema.errors import ErrorCode
from kio.schema.list_offsets.v10.request import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.metadata.v13.request import MetadataRequest as MetadataV13
from kio.schema.metadata.v13.request import MetadataRequestTopic as TopicV13
from kio.static.primitive import i8, i32, i64

from logstore.server.handlers import fetch, list_offsets
from tests.fixtures.broker import wait_for
from tests.integration.broker.clients import ck_produce, make_records, new_topic
from tests.integration.broker.rawclient import RawClient

pytestmark = pytest.mark.integration


def _topic_id(c: RawClient, topic: str) -> uuid.UUID:
    r = c.call(
        MetadataRequest(
            topics=(MetadataRequestTopic(topic_id=None, name=topic),),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
    )
    (t,) = r.topics
    assert t.error_code == ErrorCode.none and t.topic_id is not None
    return t.topic_id


def _fetch(c: RawClient, version: int, topic: str | uuid.UUID, partitions: int) -> Any:
    mod = importlib.import_module(f"kio.schema.fetch.v{version}.request")
    parts = tuple(
        mod.FetchPartition(partition=i32(p), fetch_offset=i64(0), partition_max_bytes=i32(1 << 20))
        for p in range(partitions)
    )
    named = {"topic_id": topic} if version >= 13 else {"topic": topic}
    req = mod.FetchRequest(
        max_wait=datetime.timedelta(milliseconds=0),
        min_bytes=i32(0),
        topics=(mod.FetchTopic(**named, partitions=parts),),
        **({"forgotten_topics_data": ()} if version >= 7 else {}),
    )
    return c.call(req)


def test_every_fetch_version_returns_the_same_records_and_v13_names_topics_by_id(broker):
    topic = new_topic(broker.bootstrap, partitions=2, prefix="fetchid")
    ck_produce(
        broker.bootstrap,
        topic,
        make_records(60, partitions=2, seed=13),
        codec="lz4",
        acks="all",
        idempotent=True,
    )
    with RawClient(broker.bootstrap) as c:
        tid = _topic_id(c, topic)
        by_version = {}
        for v in range(fetch.MIN_VERSION, fetch.MAX_VERSION + 1):
            r = _fetch(c, v, tid if v >= 13 else topic, 2)
            assert getattr(r, "error_code", ErrorCode.none) == ErrorCode.none  # v7+
            (t,) = r.responses
            assert (t.topic_id if v >= 13 else t.topic) == (tid if v >= 13 else topic)
            assert [p.error_code for p in t.partitions] == [ErrorCode.none] * 2
            by_version[v] = [(p.high_watermark, bytes(p.records or b"")) for p in t.partitions]
        assert sum(hw for hw, _ in by_version[4]) == 60
        assert all(data for _hw, data in by_version[4])
        assert all(got == by_version[4] for got in by_version.values())
        # an id of no topic: UNKNOWN_TOPIC_ID for each partition asked for, as Kafka answers
        for v in (13, fetch.MAX_VERSION):
            unknown = uuid.uuid4()
            (t,) = _fetch(c, v, unknown, 2).responses
            assert t.topic_id == unknown
            assert [(p.error_code, p.high_watermark, bool(p.records)) for p in t.partitions] == [
                (ErrorCode.unknown_topic_id, -1, False)
            ] * 2
        # a known id, a partition the topic does not have
        (t,) = _fetch(c, 13, tid, 3).responses
        assert [p.error_code for p in t.partitions] == [ErrorCode.none] * 2 + [
            ErrorCode.unknown_topic_or_partition
        ]


def test_a_topic_id_kept_across_a_restart_still_resolves(broker_factory):
    b = broker_factory()
    topic = new_topic(b.bootstrap, partitions=1, prefix="fetchid")
    ck_produce(
        b.bootstrap,
        topic,
        make_records(5, partitions=1, seed=5),
        codec="none",
        acks="all",
        idempotent=False,
    )
    with RawClient(b.bootstrap) as c:
        tid = _topic_id(c, topic)
    b.stop()
    b.start()
    # no Metadata request in this broker's life: the id is resolved from the log dirs
    with RawClient(b.bootstrap) as c:
        (t,) = _fetch(c, fetch.MAX_VERSION, tid, 1).responses
        (p,) = t.partitions
        assert (t.topic_id, p.error_code, p.high_watermark) == (tid, ErrorCode.none, 5)
        assert p.records


def test_list_offsets_v10_tiered_storage_timestamps_and_metadata_v13(broker):
    topic = new_topic(broker.bootstrap, partitions=1, prefix="lo10")
    ck_produce(
        broker.bootstrap,
        topic,
        make_records(7, partitions=1, seed=7),
        codec="none",
        acks="all",
        idempotent=False,
    )
    stamps = [
        list_offsets.EARLIEST,
        list_offsets.LATEST,
        list_offsets.EARLIEST_LOCAL,
        list_offsets.LATEST_TIERED,
        -6,  # EARLIEST_PENDING_UPLOAD, a v11 value: not in v10
    ]
    with RawClient(broker.bootstrap) as c:
        r = c.call(
            ListOffsetsRequest(
                replica_id=i32(-1),
                isolation_level=i8(0),
                timeout=datetime.timedelta(seconds=5),
                topics=(
                    ListOffsetsTopic(
                        name=topic,
                        partitions=tuple(
                            ListOffsetsPartition(partition_index=i32(0), timestamp=i64(ts))
                            for ts in stamps
                        ),
                    ),
                ),
            )
        )
        got = [(p.error_code, p.offset, p.leader_epoch) for p in r.topics[0].partitions]
        assert got == [
            (ErrorCode.none, 0, 0),
            (ErrorCode.none, 7, 0),
            (ErrorCode.none, 0, 0),  # every segment is local: the log start offset
            (ErrorCode.none, -1, -1),  # nothing tiered (Kafka's answer without remote storage)
            (ErrorCode.invalid_request, -1, -1),
        ]
        m = c.call(
            MetadataV13(
                topics=(TopicV13(topic_id=None, name=topic),),
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            )
        )
        assert m.error_code == ErrorCode.none  # v13's top-level error (KIP-1102)
        assert [(t.name, t.error_code, len(t.partitions)) for t in m.topics] == [
            (topic, ErrorCode.none, 1)
        ]


def test_describe_groups_v6_answers_group_id_not_found_for_an_unknown_group(broker):
    topic = new_topic(broker.bootstrap, partitions=1, prefix="dg6")
    consumer = ck.Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"{topic}-g",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.subscribe([topic])
        wait_for(lambda: consumer.poll(0.2) is None and bool(consumer.assignment()), 60)
        with RawClient(broker.bootstrap) as c:
            groups = (f"{topic}-g", f"{topic}-unknown")
            old = c.call(DescribeGroupsV5(groups=groups, include_authorized_operations=False))
            new = c.call(DescribeGroupsV6(groups=groups, include_authorized_operations=False))
        # v5: an unknown group is an empty Dead group, without error
        assert [(g.error_code, g.group_state) for g in old.groups] == [
            (ErrorCode.none, "Stable"),
            (ErrorCode.none, "Dead"),
        ]
        # v6 (KIP-1043): GROUP_ID_NOT_FOUND with a message; a known group as before
        assert [(g.error_code, g.group_state, g.error_message) for g in new.groups] == [
            (ErrorCode.none, "Stable", None),
            (ErrorCode.group_id_not_found, "", f"Group {topic}-unknown not found."),
        ]
        assert len(new.groups[0].members) == 1
    finally:
        consumer.close()
