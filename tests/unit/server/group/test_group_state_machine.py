"""Random sequences of JoinGroup/SyncGroup/Heartbeat/LeaveGroup/commit and time passing,
checked against the protocol's invariants (Hypothesis stateful test, real log dir)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from kio.schema.errors import ErrorCode

from logstore.server.group.config import GroupConfig
from logstore.server.group.group import GroupState
from logstore.server.group.messages import CommitRequest

from .conftest import Box, Env

G = "prop"


class GroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="group-sm-"))
        self.env = Env(
            self.tmp,
            GroupConfig(group_coordinator_tick_interval_ms=0, group_initial_rebalance_delay_ms=500),
        )
        self.joins: list[Box] = []
        self.syncs: list[Box] = []
        self.known: list[str] = []  # member ids handed out
        self.generation = 0
        self.committed: dict[int, int] = {}

    # --- rules ----------------------------------------------------------------------

    @rule(client=st.sampled_from(["a", "b", "c"]))
    def join_new(self, client: str) -> None:
        first = self.env.join(G, client_id=client, session_ms=10_000, rebalance_ms=8_000)
        r = first.value
        assert r.error is ErrorCode.member_id_required
        self.known.append(r.member_id)
        self.joins.append(
            self.env.join(G, r.member_id, client_id=client, session_ms=10_000, rebalance_ms=8_000)
        )

    @precondition(lambda self: self.known)
    @rule(data=st.data())
    def rejoin(self, data: st.DataObject) -> None:
        m = data.draw(st.sampled_from(self.known))
        self.joins.append(self.env.join(G, m, session_ms=10_000, rebalance_ms=8_000))

    @precondition(lambda self: self.known)
    @rule(data=st.data())
    def sync(self, data: st.DataObject) -> None:
        m = data.draw(st.sampled_from(self.known))
        gen = self.env.coordinator.generation(G)
        assignments = {k: k.encode()[:4] for k in self.known}
        self.syncs.append(self.env.sync(G, m, gen, assignments))

    @precondition(lambda self: self.known)
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        m = data.draw(st.sampled_from(self.known))
        err = self.env.coordinator.heartbeat(
            G,
            member_id=m,
            group_instance_id=None,
            generation_id=self.env.coordinator.generation(G),
        )
        assert err in (ErrorCode.none, ErrorCode.rebalance_in_progress, ErrorCode.unknown_member_id)

    @precondition(lambda self: self.known)
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        m = data.draw(st.sampled_from(self.known))
        err, results = self.env.coordinator.leave_group(G, [(m, None)])
        assert err is ErrorCode.none
        assert results[0][2] in (ErrorCode.none, ErrorCode.unknown_member_id)

    @rule(offset=st.integers(0, 1000))
    def simple_commit(self, offset: int) -> None:
        [err] = self.env.coordinator.commit_offsets(
            G,
            generation_id=-1,
            member_id="",
            group_instance_id=None,
            offsets=[CommitRequest("t", 0, offset)],
        )
        state = self.env.coordinator.group_state(G)
        if state in (None, GroupState.EMPTY):
            assert err is ErrorCode.none
            self.committed[0] = offset
        else:
            assert err is ErrorCode.unknown_member_id

    @rule(ms=st.integers(0, 12_000))
    def time_passes(self, ms: int) -> None:
        self.env.tick(ms)

    @rule()
    def restart(self) -> None:
        self.env.restart()
        # As in Kafka, a generation is stored once it is stable (or empty): one that was
        # still completing when the coordinator stopped is not, and its number may be
        # handed out again (harmless: member ids are never reused).
        self.generation = max(self.env.coordinator.generation(G), 0)
        # waiting requests were answered NOT_COORDINATOR at shutdown
        for box in self.joins + self.syncs:
            assert len(box.values) == 1

    # --- invariants -----------------------------------------------------------------

    @invariant()
    def answered_at_most_once(self) -> None:
        assert all(len(b.values) <= 1 for b in self.joins + self.syncs)

    @invariant()
    def generation_never_goes_back(self) -> None:
        gen = self.env.coordinator.generation(G)
        if gen >= 0:
            assert gen >= self.generation
            self.generation = gen

    @invariant()
    def group_is_consistent(self) -> None:
        c = self.env.coordinator
        with c._lock:
            group = c._groups.get(G)
            if group is None:
                return
            if group.members:
                assert group.leader_id in group.members
            if group.state is GroupState.STABLE:
                assert not any(m.awaiting_join for m in group.members.values())
            if group.state is GroupState.EMPTY:
                assert not group.members
            if group.state is GroupState.COMPLETING_REBALANCE:
                assert group.protocol_name == "range"

    @invariant()
    def commits_are_readable(self) -> None:
        err, results = self.env.coordinator.fetch_offsets(G, [("t", 0)])
        assert err is ErrorCode.none
        assert results[0].offset == self.committed.get(0, -1)

    def teardown(self) -> None:
        self.env.close()
        for box in self.joins + self.syncs:
            assert len(box.values) == 1, "a request was never answered"
        shutil.rmtree(self.tmp, ignore_errors=True)


GroupMachine.TestCase.settings = settings(max_examples=20, stateful_step_count=25, deadline=None)
TestGroupStateMachine = GroupMachine.TestCase
