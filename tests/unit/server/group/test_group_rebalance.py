"""The classic rebalance protocol of GroupCoordinator, driven step by step with a manual
clock over a real log directory."""

from __future__ import annotations

from collections.abc import Callable

from kio.schema.errors import ErrorCode

from logstore.server.group.group import GroupState

from .conftest import Env

G = "g"


def _stable_single(env: Env) -> str:
    """One member through MEMBER_ID_REQUIRED, the initial delay and SyncGroup."""
    box = env.join_new(G)
    assert not box.done  # waits for group.initial.rebalance.delay.ms
    assert env.coordinator.group_state(G) is GroupState.PREPARING_REBALANCE
    env.tick(2_999)
    assert not box.done
    env.tick(1)
    r = box.value
    assert r.error is ErrorCode.none
    assert r.generation_id == 1
    assert r.leader_id == r.member_id
    assert r.protocol_name == "range"
    assert r.members == ((r.member_id, None, b"sub"),)
    s = env.sync(G, r.member_id, 1, {r.member_id: b"all"})
    assert s.value.error is ErrorCode.none
    assert s.value.assignment == b"all"
    assert env.coordinator.group_state(G) is GroupState.STABLE
    member_id: str = r.member_id
    return member_id


def test_first_member_gets_id_then_generation_one(env: Env) -> None:
    m1 = _stable_single(env)
    assert (
        env.coordinator.heartbeat(G, member_id=m1, group_instance_id=None, generation_id=1)
        is ErrorCode.none
    )


def test_old_join_version_gets_member_id_without_extra_round(env: Env) -> None:
    box = env.join(G, require_known=False)
    env.tick(3_000)
    r = box.value
    assert r.error is ErrorCode.none
    assert r.member_id.startswith("client-")
    assert r.generation_id == 1


def test_initial_delay_extends_while_members_arrive(env: Env) -> None:
    a = env.join_new(G, client_id="a")
    env.tick(2_000)
    b = env.join_new(G, client_id="b")
    env.tick(1_000)  # first delay over, but a member arrived during it: wait again
    assert not a.done and not b.done
    env.tick(3_000)
    ra, rb = a.value, b.value
    assert ra.generation_id == rb.generation_id == 1
    assert ra.leader_id == rb.leader_id == ra.member_id
    assert {m[0] for m in ra.members} == {ra.member_id, rb.member_id}
    assert rb.members == ()  # only the leader gets the metadata


def test_second_member_triggers_rebalance_and_partitions_split(env: Env) -> None:
    m1 = _stable_single(env)
    b = env.join_new(G, client_id="b")
    assert not b.done
    assert env.coordinator.group_state(G) is GroupState.PREPARING_REBALANCE
    # The existing member learns of the rebalance from its heartbeat and rejoins.
    assert (
        env.coordinator.heartbeat(G, member_id=m1, group_instance_id=None, generation_id=1)
        is ErrorCode.rebalance_in_progress
    )
    a = env.join(G, m1)
    # Everyone rejoined: the join phase ends at once, no timer needed.
    ra, rb = a.value, b.value
    assert ra.generation_id == rb.generation_id == 2
    assert ra.leader_id == m1
    assert len(ra.members) == 2
    assert env.coordinator.group_state(G) is GroupState.COMPLETING_REBALANCE
    # The follower's SyncGroup waits for the leader's.
    sb = env.sync(G, rb.member_id, 2)
    assert not sb.done
    assert (
        env.coordinator.heartbeat(
            G, member_id=rb.member_id, group_instance_id=None, generation_id=2
        )
        is ErrorCode.none
    )
    sa = env.sync(G, m1, 2, {m1: b"p0", rb.member_id: b"p1"})
    assert sa.value.assignment == b"p0"
    assert sb.value.assignment == b"p1"
    assert env.coordinator.group_state(G) is GroupState.STABLE


def test_leave_group_rebalances_the_rest(env: Env) -> None:
    m1 = _stable_single(env)
    b = env.join_new(G, client_id="b")
    a = env.join(G, m1)
    m2 = b.value.member_id
    env.sync(G, m1, 2, {m1: b"p0", m2: b"p1"})
    env.sync(G, m2, 2)
    err, members = env.coordinator.leave_group(G, [(m1, None)])
    assert err is ErrorCode.none and members == [(m1, None, ErrorCode.none)]
    assert env.coordinator.group_state(G) is GroupState.PREPARING_REBALANCE
    assert a.value.generation_id == 2
    assert (
        env.coordinator.heartbeat(G, member_id=m2, group_instance_id=None, generation_id=2)
        is ErrorCode.rebalance_in_progress
    )
    rejoin = env.join(G, m2)
    r = rejoin.value
    assert r.generation_id == 3
    assert r.leader_id == m2  # leadership moved to the member that stayed
    assert r.members == ((m2, None, b"sub"),)
    assert env.sync(G, m2, 3, {m2: b"p0p1"}).value.assignment == b"p0p1"
    # the member that left is gone
    assert (
        env.coordinator.heartbeat(G, member_id=m1, group_instance_id=None, generation_id=3)
        is ErrorCode.unknown_member_id
    )


def test_last_member_leaving_empties_the_group(env: Env) -> None:
    m1 = _stable_single(env)
    env.coordinator.leave_group(G, [(m1, None)])
    assert env.coordinator.group_state(G) is GroupState.EMPTY
    assert env.coordinator.generation(G) == 2


def test_session_timeout_expires_member(env: Env) -> None:
    m1 = _stable_single(env)
    env.tick(9_999)
    assert (
        env.coordinator.heartbeat(G, member_id=m1, group_instance_id=None, generation_id=1)
        is ErrorCode.none
    )
    env.tick(9_999)
    assert env.coordinator.group_state(G) is GroupState.STABLE
    env.tick(1)
    assert env.coordinator.group_state(G) is GroupState.EMPTY
    assert (
        env.coordinator.heartbeat(G, member_id=m1, group_instance_id=None, generation_id=1)
        is ErrorCode.unknown_member_id
    )


def test_member_not_rejoining_is_dropped_at_rebalance_timeout(env: Env) -> None:
    m1 = _stable_single(env)
    b = env.join_new(G, client_id="b", rebalance_ms=20_000)
    # m1 keeps heartbeating but never rejoins
    for _ in range(3):
        env.tick(9_000)
        assert (
            env.coordinator.heartbeat(G, member_id=m1, group_instance_id=None, generation_id=1)
            is ErrorCode.rebalance_in_progress
        )
    assert not b.done
    env.tick(3_000)  # 30 s: the group's rebalance timeout (largest of its members')
    rb = b.value
    assert rb.generation_id == 2 and rb.leader_id == rb.member_id
    assert [m[0] for m in rb.members] == [rb.member_id]
    assert (
        env.coordinator.heartbeat(G, member_id=m1, group_instance_id=None, generation_id=1)
        is ErrorCode.unknown_member_id
    )


def test_member_not_syncing_is_removed(env: Env) -> None:
    m1 = _stable_single(env)
    b = env.join_new(G, client_id="b")
    env.join(G, m1)
    m2 = b.value.member_id
    env.sync(G, m1, 2, {m1: b"p0", m2: b"p1"})
    assert env.coordinator.group_state(G) is GroupState.STABLE
    for _ in range(5):  # both stay alive, but m2 never sends SyncGroup
        env.tick(5_000)
        for m in (m1, m2):
            assert (
                env.coordinator.heartbeat(G, member_id=m, group_instance_id=None, generation_id=2)
                is ErrorCode.none
            )
    env.tick(4_999)
    assert env.coordinator.group_state(G) is GroupState.STABLE
    env.tick(1)  # the rebalance timeout (30 s) since generation 2 started
    assert env.coordinator.group_state(G) is GroupState.PREPARING_REBALANCE
    assert (
        env.coordinator.heartbeat(G, member_id=m2, group_instance_id=None, generation_id=2)
        is ErrorCode.unknown_member_id
    )


def test_rebalance_during_completing_fails_waiting_sync(env: Env) -> None:
    m1 = _stable_single(env)
    b = env.join_new(G, client_id="b")
    env.join(G, m1)
    m2 = b.value.member_id
    s2 = env.sync(G, m2, 2)
    c = env.join_new(G, client_id="c")
    assert s2.value.error is ErrorCode.rebalance_in_progress
    assert not c.done


def test_group_max_size(make_env: Callable[..., Env]) -> None:
    env = make_env(group_max_size=1)
    m1 = _stable_single(env)
    assert env.join(G, client_id="y").value.error is ErrorCode.group_max_size_reached
    assert env.join(G, m1).value.error is ErrorCode.none  # a known member may rejoin


def test_errors(env: Env) -> None:
    m1 = _stable_single(env)
    c = env.coordinator
    assert env.join(G, "nobody").value.error is ErrorCode.unknown_member_id
    assert env.join("other", "nobody").value.error is ErrorCode.unknown_member_id
    assert env.join(G, session_ms=10).value.error is ErrorCode.invalid_session_timeout
    assert env.join("", require_known=False).value.error is ErrorCode.invalid_group_id
    bad = env.join(G, protocols=(("roundrobin", b""),), client_id="x")
    assert bad.value.error is ErrorCode.inconsistent_group_protocol
    assert (
        c.heartbeat(G, member_id=m1, group_instance_id=None, generation_id=7)
        is ErrorCode.illegal_generation
    )
    assert env.sync(G, m1, 7).value.error is ErrorCode.illegal_generation
    assert env.sync(G, "nobody", 1).value.error is ErrorCode.unknown_member_id
    assert (
        c.heartbeat("unknown", member_id="m", group_instance_id=None, generation_id=1)
        is ErrorCode.unknown_member_id
    )
    refused = env.join("fresh", protocols=())
    assert refused.value.error is ErrorCode.inconsistent_group_protocol
    assert c.group_state("fresh") is None  # a refused first join leaves no empty group
    err, members = c.leave_group("unknown", [("m", None)])
    assert err is ErrorCode.none
    assert members == [("m", None, ErrorCode.unknown_member_id)]


def test_protocol_selection_by_vote(env: Env) -> None:
    a = env.join_new(G, client_id="a", protocols=(("range", b"A"), ("roundrobin", b"a")))
    b = env.join_new(G, client_id="b", protocols=(("roundrobin", b"b"), ("range", b"B")))
    c = env.join_new(G, client_id="c", protocols=(("roundrobin", b"c"),))
    env.tick(3_000)
    env.tick(3_000)
    for box in (a, b, c):
        assert box.value.protocol_name == "roundrobin"
    assert sorted(m[2] for m in a.value.members) == [b"a", b"b", b"c"]


def test_static_member_rejoin_keeps_assignment_without_rebalance(env: Env) -> None:
    first = env.join(G, instance_id="i-1")
    env.tick(3_000)
    r1 = first.value
    assert r1.error is ErrorCode.none and r1.member_id.startswith("i-1-")
    env.sync(G, r1.member_id, 1, {r1.member_id: b"A"}, instance_id="i-1")
    second = env.join(G, instance_id="i-2")
    env.join(G, r1.member_id, instance_id="i-1")
    r2 = second.value
    env.sync(G, r1.member_id, 2, {r1.member_id: b"A", r2.member_id: b"B"}, instance_id="i-1")
    assert env.sync(G, r2.member_id, 2, instance_id="i-2").value.assignment == b"B"
    # i-2 restarts: same instance id, new member id, no rebalance
    again = env.join(G, instance_id="i-2")
    r3 = again.value
    assert r3.error is ErrorCode.none and r3.member_id != r2.member_id
    assert r3.generation_id == 2
    assert env.coordinator.group_state(G) is GroupState.STABLE
    assert env.sync(G, r3.member_id, 2, instance_id="i-2").value.assignment == b"B"
    assert (
        env.coordinator.heartbeat(
            G, member_id=r2.member_id, group_instance_id="i-2", generation_id=2
        )
        is ErrorCode.fenced_instance_id
    )
    err, members = env.coordinator.leave_group(G, [("", "i-2")])
    assert err is ErrorCode.none
    assert members == [("", "i-2", ErrorCode.none)]
    assert env.coordinator.group_state(G) is GroupState.PREPARING_REBALANCE


def test_list_and_describe(env: Env) -> None:
    m1 = _stable_single(env)
    err, groups = env.coordinator.list_groups()
    assert err is ErrorCode.none
    assert [(g.group_id, g.protocol_type, g.state) for g in groups] == [(G, "consumer", "Stable")]
    assert env.coordinator.list_groups(states=["empty"])[1] == []
    [d, unknown] = env.coordinator.describe_groups([G, "nope"])
    assert (d.state, d.protocol_type, d.protocol_data) == ("Stable", "consumer", "range")
    assert [(m.member_id, m.client_id, m.metadata, m.assignment) for m in d.members] == [
        (m1, "client", b"sub", b"all")
    ]
    assert (unknown.error, unknown.state, unknown.members) == (ErrorCode.none, "Dead", ())
