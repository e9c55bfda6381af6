"""OffsetCommit/OffsetFetch validation and durability in __consumer_offsets, read back both
through a restarted coordinator and independently from the segment files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kio.schema.errors import ErrorCode

from logstore.protocol.batch import iter_batches
from logstore.protocol.records import decode_batch
from logstore.server.group.group import GroupState
from logstore.server.group.messages import CommitRequest
from logstore.server.group.schemas import (
    GroupKey,
    OffsetKey,
    decode_group_value,
    decode_key,
    decode_offset_value,
    partition_for,
)

from .conftest import Env

G = "offsets-group"


def _commit(
    env: Env,
    *offsets: tuple[str, int, int],
    generation: int = -1,
    member: str = "",
    metadata: str = "",
) -> list[ErrorCode]:
    return env.coordinator.commit_offsets(
        G,
        generation_id=generation,
        member_id=member,
        group_instance_id=None,
        offsets=[CommitRequest(t, p, o, 3, metadata) for t, p, o in offsets],
    )


def _fetched(env: Env, partitions: list[tuple[str, int]] | None = None) -> dict:
    err, results = env.coordinator.fetch_offsets(G, partitions)
    assert err is ErrorCode.none
    return {(r.topic, r.partition): (r.offset, r.leader_epoch, r.metadata) for r in results}


def _segment_records(log_dir: Path, partition: int) -> list[tuple[bytes, bytes | None]]:
    """Every (key, value) of a __consumer_offsets partition, read from its .log files."""
    out = []
    for seg in sorted((log_dir / f"__consumer_offsets-{partition}").glob("*.log")):
        data = seg.read_bytes()
        for pos, _ in iter_batches(data):
            _, records = decode_batch(data, pos)
            out.extend((r.key, r.value) for r in records)
    return out


def test_simple_commit_and_fetch(env: Env) -> None:
    assert _commit(env, ("t", 0, 10), ("t", 1, 20), metadata="m") == [ErrorCode.none] * 2
    assert _fetched(env) == {("t", 0): (10, 3, "m"), ("t", 1): (20, 3, "m")}
    assert _fetched(env, [("t", 1), ("u", 0)]) == {("t", 1): (20, 3, "m"), ("u", 0): (-1, -1, "")}
    assert env.coordinator.group_state(G) is GroupState.EMPTY
    err, none = env.coordinator.fetch_offsets("nobody", None)
    assert (err, none) == (ErrorCode.none, [])


def test_commits_survive_restart_and_are_kafka_records(env: Env) -> None:
    _commit(env, ("t", 0, 10))
    _commit(env, ("t", 0, 11), ("t", 2, 5))
    records = _segment_records(env.log_dir, partition_for(G, 1))
    decoded = [(decode_key(k), decode_offset_value(v)) for k, v in records if v is not None]
    assert [(k, v.offset) for k, v in decoded] == [
        (OffsetKey(G, "t", 0), 10),
        (OffsetKey(G, "t", 0), 11),
        (OffsetKey(G, "t", 2), 5),
    ]
    assert all(v.commit_timestamp == env.clock.now for _, v in decoded)
    env.restart()
    assert _fetched(env) == {("t", 0): (11, 3, ""), ("t", 2): (5, 3, "")}


def test_member_commit_validation(env: Env) -> None:
    box = env.join_new(G)
    env.tick(3_000)
    m = box.value.member_id
    # generation 1 is CompletingRebalance until the leader syncs
    assert _commit(env, ("t", 0, 1), generation=1, member=m) == [ErrorCode.rebalance_in_progress]
    env.sync(G, m, 1, {m: b"a"})
    assert _commit(env, ("t", 0, 1), generation=1, member=m) == [ErrorCode.none]
    assert _commit(env, ("t", 0, 2), generation=2, member=m) == [ErrorCode.illegal_generation]
    assert _commit(env, ("t", 0, 2), generation=1, member="x") == [ErrorCode.unknown_member_id]
    # a bare commit while the group has members
    assert _commit(env, ("t", 0, 2)) == [ErrorCode.unknown_member_id]
    assert _fetched(env) == {("t", 0): (1, 3, "")}
    big = "x" * 5000
    assert (
        _commit(env, ("t", 0, 3), ("t", 1, 3), generation=1, member=m, metadata=big)
        == [ErrorCode.offset_metadata_too_large] * 2
    )


def test_commit_to_unknown_group_with_generation_is_rejected(env: Env) -> None:
    assert _commit(env, ("t", 0, 1), generation=4, member="m") == [ErrorCode.illegal_generation]


def test_stable_group_reloads_with_members_after_restart(env: Env) -> None:
    box = env.join_new(G)
    env.tick(3_000)
    m = box.value.member_id
    env.sync(G, m, 1, {m: b"assigned"})
    _commit(env, ("t", 0, 7), generation=1, member=m)
    records = _segment_records(env.log_dir, partition_for(G, 1))
    groups = [decode_group_value(v) for k, v in records if v and decode_key(k) == GroupKey(G)]
    assert [
        (g.generation, g.protocol, g.leader, [x.assignment for x in g.members]) for g in groups
    ] == [(1, "range", m, [b"assigned"])]
    c = env.restart()
    assert c.group_state(G) is GroupState.STABLE
    assert c.heartbeat(G, member_id=m, group_instance_id=None, generation_id=1) is ErrorCode.none
    assert env.sync(G, m, 1).value.assignment == b"assigned"
    assert _fetched(env) == {("t", 0): (7, 3, "")}
    # The member's session restarts at load and still expires without heartbeats.
    env.tick(10_001)
    assert c.group_state(G) is GroupState.EMPTY


def test_empty_group_offsets_expire_and_group_is_removed(make_env: Callable[..., Env]) -> None:
    env = make_env(offsets_retention_minutes=1, offsets_retention_check_interval_ms=1_000)
    _commit(env, ("t", 0, 1))
    env.tick(59_000)
    assert _fetched(env) == {("t", 0): (1, 3, "")}
    env.tick(2_000)
    assert _fetched(env) == {}
    assert env.coordinator.group_state(G) is None
    records = _segment_records(env.log_dir, partition_for(G, 1))
    assert (records[-2][1], records[-1][1]) == (None, None)  # offset and group tombstones
    env.restart()
    assert _fetched(env) == {}
    assert env.coordinator.group_state(G) is None


def test_groups_spread_over_offsets_partitions(make_env: Callable[..., Env]) -> None:
    env = make_env(offsets_topic_num_partitions=5)
    groups = [f"group-{i}" for i in range(12)]
    for g in groups:
        env.coordinator.commit_offsets(
            g,
            generation_id=-1,
            member_id="",
            group_instance_id=None,
            offsets=[CommitRequest("t", 0, len(g))],
        )
    used = {partition_for(g, 5) for g in groups}
    assert len(used) > 1
    dirs = {p.name for p in env.log_dir.iterdir() if p.name.startswith("__consumer_offsets-")}
    assert dirs == {f"__consumer_offsets-{p}" for p in used}
    env.restart()
    for g in groups:
        _, results = env.coordinator.fetch_offsets(g, None)
        assert [(r.topic, r.offset) for r in results] == [("t", len(g))]


def test_offsets_partition_is_compacted_by_snapshot(make_env: Callable[..., Env]) -> None:
    env = make_env(offsets_snapshot_min_records=40)
    box = env.join_new(G)
    env.tick(3_000)
    m = box.value.member_id
    env.sync(G, m, 1, {m: b"assigned"})
    _commit(env, ("other", 0, 99))  # rejected (group has members): not live, not written
    for i in range(60):  # 2 live keys, many dead records
        assert (
            _commit(env, ("t", 0, i), ("t", 1, 1000 + i), generation=1, member=m)
            == [ErrorCode.none] * 2
        )
    log = env.log_manager.get_log("__consumer_offsets", 0)
    assert log.log_start_offset > 0
    assert log.log_end_offset - log.log_start_offset < 40
    records = _segment_records(env.log_dir, 0)  # what is left on disk
    assert len(records) == log.log_end_offset - log.log_start_offset
    assert len(list((env.log_dir / "__consumer_offsets-0").glob("*.log"))) == 1
    c = env.restart()
    assert _fetched(env) == {("t", 0): (59, 3, ""), ("t", 1): (1059, 3, "")}
    assert c.group_state(G) is GroupState.STABLE
    assert env.sync(G, m, 1).value.assignment == b"assigned"
