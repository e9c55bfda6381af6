"""Every advertised version of every group API, end to end through the handlers: kio
request in, response encoded with kio's writer and decoded back, over a real coordinator
and log directory."""

from __future__ import annotations

import datetime
import io
import struct
from types import SimpleNamespace
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from logstore.server.context import Deferred, RequestContext
from logstore.server.group.handlers import API_HANDLERS, build
from logstore.server.group.messages import CommitRequest
from logstore.storage.config import LogConfig

from .conftest import Env

FIND_COORDINATOR, JOIN, HEARTBEAT, LEAVE, SYNC = 10, 11, 12, 13, 14
COMMIT, FETCH, DESCRIBE, LIST = 8, 9, 15, 16


def _ms(n: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=n)


class Client:
    def __init__(self, env: Env, log_manager: Any) -> None:
        self.env = env
        self.broker = SimpleNamespace(
            node_id=7,
            advertised_host="127.0.0.1",
            advertised_port=19092,
            group_coordinator=env.coordinator,
            log_manager=log_manager,
        )

    def call(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        """Handle one request; returns the decoded response (after wire round trip), or the
        Deferred when the coordinator has not answered yet."""
        lo, hi, handler = API_HANDLERS[api_key]
        assert lo <= version <= hi
        request = build(load_request_schema(api_key, version), body)
        ctx = RequestContext(
            broker=self.broker,
            config=None,
            api_key=api_key,
            api_version=version,  # type: ignore[arg-type]
            correlation_id=1,
            client_id="unit-client",
            connection_id="c-1",
            client_host="127.0.0.1",
        )
        result = handler(ctx, request)
        if isinstance(result, Deferred):
            return result
        return self.wire(api_key, version, result)

    @staticmethod
    def wire(api_key: int, version: int, response: Any) -> Any:
        cls = load_response_schema(api_key, version)
        assert type(response) is cls
        buf = io.BytesIO()
        entity_writer(cls)(buf, response)
        decoded, size = entity_reader(cls)(buf.getvalue(), 0)
        assert size == len(buf.getvalue())
        return decoded


@pytest.fixture
def client(env: Env) -> Client:
    return Client(env, env.log_manager)


def test_advertised_ranges() -> None:
    assert {k: v[:2] for k, v in API_HANDLERS.items()} == {
        8: (2, 9),
        9: (1, 9),
        10: (0, 6),
        11: (0, 9),
        12: (0, 4),
        13: (0, 5),
        14: (0, 5),
        15: (0, 6),
        16: (0, 5),
        42: (0, 2),
        47: (0, 0),
    }


@pytest.mark.parametrize("version", range(7))
def test_find_coordinator(client: Client, version: int) -> None:
    if version >= 4:
        r = client.call(FIND_COORDINATOR, version, {"key_type": 0, "coordinator_keys": ("a", "b")})
        assert [(c.key, c.node_id, c.host, c.port, c.error_code) for c in r.coordinators] == [
            ("a", 7, "127.0.0.1", 19092, ErrorCode.none),
            ("b", 7, "127.0.0.1", 19092, ErrorCode.none),
        ]
        bad = client.call(FIND_COORDINATOR, version, {"key_type": 2, "coordinator_keys": ("a",)})
        assert bad.coordinators[0].error_code is ErrorCode.invalid_request
    else:
        r = client.call(FIND_COORDINATOR, version, {"key": "grp", "key_type": 0})
        assert (r.error_code, r.node_id, r.host, r.port) == (ErrorCode.none, 7, "127.0.0.1", 19092)


def _join_body(version: int, member_id: str, group: str) -> dict[str, Any]:
    return {
        "group_id": group,
        "session_timeout": _ms(10_000),
        "rebalance_timeout": _ms(30_000),
        "member_id": member_id,
        "group_instance_id": None,
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b"meta"}],
        "reason": None,
    }


@pytest.mark.parametrize("version", range(10))
def test_join_sync_heartbeat_commit_fetch_leave(env: Env, client: Client, version: int) -> None:
    group = f"group-v{version}"
    for partition in (0, 1):
        env.log_manager.get_or_create_log("t", partition, LogConfig())
    r = client.call(JOIN, version, _join_body(version, "", group))
    if version >= 4:
        assert r.error_code is ErrorCode.member_id_required
        assert r.member_id.startswith("unit-client-")
        r = client.call(JOIN, version, _join_body(version, r.member_id, group))
    assert isinstance(r, Deferred) and not r.done()
    env.tick(3_000)
    joined = client.wire(JOIN, version, r.result(timeout=0))
    assert joined.error_code is ErrorCode.none
    assert joined.generation_id == 1
    assert joined.leader == joined.member_id
    assert joined.protocol_name == "range"
    assert [(m.member_id, m.metadata) for m in joined.members] == [(joined.member_id, b"meta")]
    member = joined.member_id

    sync_version = min(version, 5)
    s = client.call(
        SYNC,
        sync_version,
        {
            "group_id": group,
            "generation_id": 1,
            "member_id": member,
            "protocol_type": "consumer",
            "protocol_name": "range",
            "assignments": [{"member_id": member, "assignment": b"mine"}],
        },
    )
    assert (s.error_code, s.assignment) == (ErrorCode.none, b"mine")

    hb = client.call(
        HEARTBEAT, min(version, 4), {"group_id": group, "generation_id": 1, "member_id": member}
    )
    assert hb.error_code is ErrorCode.none
    hb = client.call(
        HEARTBEAT, min(version, 4), {"group_id": group, "generation_id": 9, "member_id": member}
    )
    assert hb.error_code is ErrorCode.illegal_generation

    commit_version = min(max(version, 2), 9)
    c = client.call(
        COMMIT,
        commit_version,
        {
            "group_id": group,
            "generation_id_or_member_epoch": 1,
            "member_id": member,
            "retention_time": _ms(-1),
            "topics": [
                {
                    "name": "t",
                    "partitions": [
                        {
                            "partition_index": 0,
                            "committed_offset": 41,
                            "committed_leader_epoch": 2,
                            "committed_metadata": "md",
                        },
                    ],
                }
            ],
        },
    )
    assert [
        (t.name, [(p.partition_index, p.error_code) for p in t.partitions]) for t in c.topics
    ] == [("t", [(0, ErrorCode.none)])]

    fetch_version = min(max(version, 1), 9)
    if fetch_version >= 8:
        f = client.call(
            FETCH,
            fetch_version,
            {
                "groups": [
                    {"group_id": group, "topics": [{"name": "t", "partition_indexes": (0, 1)}]}
                ]
            },
        )
        assert f.groups[0].error_code is ErrorCode.none
        topics = f.groups[0].topics
    else:
        f = client.call(
            FETCH,
            fetch_version,
            {"group_id": group, "topics": [{"name": "t", "partition_indexes": (0, 1)}]},
        )
        topics = f.topics
    got = [(p.partition_index, p.committed_offset, p.metadata) for p in topics[0].partitions]
    assert got == [(0, 41, "md"), (1, -1, "")]

    if version >= 3:
        leave = client.call(
            LEAVE,
            min(version, 5),
            {"group_id": group, "members": [{"member_id": member, "reason": None}]},
        )
        assert [(m.member_id, m.error_code) for m in leave.members] == [(member, ErrorCode.none)]
    else:
        leave = client.call(LEAVE, version, {"group_id": group, "member_id": member})
    assert leave.error_code is ErrorCode.none
    assert env.coordinator.group_state(group).value == "Empty"


@pytest.mark.parametrize("version", range(6))
def test_list_and_describe_groups(env: Env, client: Client, version: int) -> None:
    env.coordinator.commit_offsets(
        "simple", generation_id=-1, member_id="", group_instance_id=None, offsets=[]
    )
    lst = client.call(LIST, version, {"states_filter": (), "types_filter": ()})
    assert lst.error_code is ErrorCode.none
    assert [g.group_id for g in lst.groups] == ["simple"]
    if version >= 4:
        assert lst.groups[0].group_state == "Empty"
        filtered = client.call(LIST, version, {"states_filter": ("Stable",), "types_filter": ()})
        assert filtered.groups == ()
    d = client.call(
        DESCRIBE, version, {"groups": ("simple", "missing"), "include_authorized_operations": False}
    )
    assert [(g.group_id, g.group_state, g.error_code) for g in d.groups] == [
        ("simple", "Empty", ErrorCode.none),
        ("missing", "Dead", ErrorCode.none),
    ]


def test_commit_to_missing_partition(env: Env, client: Client) -> None:
    # the log manager has no topic "t": the commit is refused, as Kafka does
    assert env.log_manager.get_log("t", 0) is None
    c = client.call(
        COMMIT,
        9,
        {
            "group_id": "g",
            "generation_id_or_member_epoch": -1,
            "member_id": "",
            "topics": [
                {
                    "name": "t",
                    "partitions": [
                        {"partition_index": 0, "committed_offset": 1, "committed_metadata": None}
                    ],
                }
            ],
        },
    )
    assert c.topics[0].partitions[0].error_code is ErrorCode.unknown_topic_or_partition


def _consumer_subscription(*topics: str) -> bytes:
    """ConsumerProtocolSubscription v0: version, topics, null user data."""
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


@pytest.mark.parametrize("version", range(3))
def test_delete_groups(env: Env, client: Client, version: int) -> None:
    env.coordinator.commit_offsets(
        "empty",
        generation_id=-1,
        member_id="",
        group_instance_id=None,
        offsets=[CommitRequest("t", 0, 1)],
    )
    env.join_new("busy")
    r = client.call(42, version, {"groups_names": ("empty", "busy", "nope")})
    assert [(x.group_id, x.error_code) for x in r.results] == [
        ("empty", ErrorCode.none),
        ("busy", ErrorCode.non_empty_group),
        ("nope", ErrorCode.group_id_not_found),
    ]
    assert env.coordinator.fetch_offsets("empty", None) == (ErrorCode.none, [])
    assert env.coordinator.group_state("empty") is None
    env.restart()
    assert env.coordinator.fetch_offsets("empty", None) == (ErrorCode.none, [])
    assert env.coordinator.group_state("empty") is None


def test_offset_delete_spares_subscribed_topics(env: Env, client: Client) -> None:
    first = env.join("g", protocols=(("range", _consumer_subscription("sub")),))
    box = env.join(
        "g", first.value.member_id, protocols=(("range", _consumer_subscription("sub")),)
    )
    env.tick(3_000)
    m = box.value.member_id
    env.sync("g", m, 1, {m: b""})
    for topic in ("sub", "gone"):
        env.coordinator.commit_offsets(
            "g",
            generation_id=1,
            member_id=m,
            group_instance_id=None,
            offsets=[CommitRequest(topic, 0, 5)],
        )
    r = client.call(
        47,
        0,
        {
            "group_id": "g",
            "topics": [
                {"name": "sub", "partitions": [{"partition_index": 0}]},
                {"name": "gone", "partitions": [{"partition_index": 0}]},
            ],
        },
    )
    assert r.error_code is ErrorCode.none
    assert [(t.name, t.partitions[0].error_code) for t in r.topics] == [
        ("sub", ErrorCode.group_subscribed_to_topic),
        ("gone", ErrorCode.none),
    ]
    _, left = env.coordinator.fetch_offsets("g", None)
    assert [(x.topic, x.offset) for x in left] == [("sub", 5)]
    missing = client.call(47, 0, {"group_id": "nope", "topics": []})
    assert missing.error_code is ErrorCode.group_id_not_found
