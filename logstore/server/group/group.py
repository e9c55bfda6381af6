"""The in-memory state of one classic consumer group (Kafka's ``GroupMetadata``).

States and the transitions Kafka allows (``GroupState.valid_previous``)::

    Empty               <- PreparingRebalance          (no member rejoined)
    PreparingRebalance  <- Empty, Stable, CompletingRebalance
    CompletingRebalance <- PreparingRebalance          (every member joined or timed out)
    Stable              <- CompletingRebalance         (the leader's SyncGroup arrived)
    Dead                <- any                         (offsets expired / group deleted)

A member's pending JoinGroup and SyncGroup answers are callbacks held here until the
coordinator completes them; at most one of each per member (a second request replaces the
first, which is answered with ``REBALANCE_IN_PROGRESS`` / the current state by the caller).

Thread-safety: none; the coordinator guards every group with its own lock.
Crash behaviour: nothing here is durable; the coordinator writes a group metadata record to
``__consumer_offsets`` when a generation is stable or the group becomes empty, and rebuilds
this state from it on start.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from logstore.server.group.schemas import GroupValue, MemberValue

__all__ = ["Group", "GroupState", "Member"]


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"

    @property
    def valid_previous(self) -> frozenset[GroupState]:
        return _VALID_PREVIOUS[self]


_VALID_PREVIOUS: dict[GroupState, frozenset[GroupState]] = {
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.PREPARING_REBALANCE: frozenset(
        {GroupState.EMPTY, GroupState.STABLE, GroupState.COMPLETING_REBALANCE}
    ),
    GroupState.COMPLETING_REBALANCE: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.STABLE: frozenset({GroupState.COMPLETING_REBALANCE}),
    GroupState.DEAD: frozenset(GroupState),
}


@dataclass(slots=True, eq=False)
class Member:
    """One member: its protocols (name -> metadata, in preference order) and assignment."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    # Set while a JoinGroup / SyncGroup of this member waits for the rebalance.
    join_callback: Callable[[Any], object] | None = None
    sync_callback: Callable[[Any], object] | None = None
    # A member that joined but has not been answered yet cannot heartbeat; Kafka keeps it
    # for group.new.member.join.timeout instead of its session timeout.
    is_new: bool = False
    heartbeat_deadline_ms: int = 0

    @property
    def awaiting_join(self) -> bool:
        return self.join_callback is not None

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_callback is not None

    def metadata_for(self, protocol: str) -> bytes:
        for name, data in self.protocols:
            if name == protocol:
                return data
        raise KeyError(f"member {self.member_id} does not support protocol {protocol!r}")

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols


@dataclass(slots=True, eq=False)
class Group:
    """A group's generation, members, leader and chosen protocol (see module docstring)."""

    group_id: str
    state: GroupState = GroupState.EMPTY
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    # Member ids handed out with MEMBER_ID_REQUIRED (JoinGroup v4+) -> expiry deadline.
    pending_members: dict[str, int] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    # Members that got their JoinGroup answer but have not sent SyncGroup yet.
    pending_sync: set[str] = field(default_factory=set)
    # PreparingRebalance: when the join phase ends regardless of missing members.
    join_deadline_ms: int | None = None
    # Initial delay of an empty group (KIP-134): the phase may be extended while members
    # keep arriving, up to the rebalance timeout in total.
    initial_delay_active: bool = False
    initial_delay_remaining_ms: int = 0
    new_member_added: bool = False
    sync_deadline_ms: int | None = None
    current_state_timestamp_ms: int = -1

    # --- membership -------------------------------------------------------------------

    def add(self, member: Member) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if self.leader_id is None:
            self.leader_id = member.member_id

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        self.pending_sync.discard(member_id)
        instance_id = None if member is None else member.group_instance_id
        if instance_id is not None and self.static_members.get(instance_id) == member_id:
            del self.static_members[instance_id]
        if self.leader_id == member_id:
            # Prefer a member that already rejoined this round, as Kafka does.
            waiting = [m.member_id for m in self.members.values() if m.awaiting_join]
            candidates = waiting or list(self.members)
            self.leader_id = candidates[0] if candidates else None
        return member

    def has(self, member_id: str) -> bool:
        return member_id in self.members

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def transition(self, state: GroupState, now_ms: int) -> None:
        if self.state not in state.valid_previous:
            raise RuntimeError(
                f"group {self.group_id!r}: illegal transition {self.state.value} -> {state.value}"
            )
        self.state = state
        self.current_state_timestamp_ms = now_ms

    def in_state(self, *states: GroupState) -> bool:
        return self.state in states

    @property
    def can_rebalance(self) -> bool:
        return self.state in GroupState.PREPARING_REBALANCE.valid_previous

    @property
    def all_members_joined(self) -> bool:
        return not self.pending_members and all(m.awaiting_join for m in self.members.values())

    @property
    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    # --- protocols --------------------------------------------------------------------

    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        """Kafka's ``supportsProtocols``: a group without members takes any non-empty
        request; otherwise the type must match and one protocol must be common to all."""
        if not protocol_type or not protocols:
            return False
        if not self.members:
            return True
        if protocol_type != self.protocol_type:
            return False
        names = {name for name, _ in protocols}
        return bool(names & self._candidates())

    def _candidates(self) -> set[str]:
        sets = [{name for name, _ in m.protocols} for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def select_protocol(self) -> str:
        """Each member votes for its most preferred protocol that every member supports."""
        candidates = self._candidates()
        if not candidates:
            raise RuntimeError(f"group {self.group_id!r}: members share no protocol")
        votes: dict[str, int] = {}
        for m in self.members.values():
            choice = next(name for name, _ in m.protocols if name in candidates)
            votes[choice] = votes.get(choice, 0) + 1
        # Ties go to the name first seen, so the choice does not depend on dict hashing.
        return max(votes, key=lambda name: votes[name])

    def member_metadata(self) -> list[tuple[str, str | None, bytes]]:
        """(member id, instance id, metadata of the chosen protocol) for the leader."""
        if self.protocol_name is None:
            return []
        return [
            (m.member_id, m.group_instance_id, m.metadata_for(self.protocol_name))
            for m in self.members.values()
        ]

    # --- the group metadata record ------------------------------------------------------

    def to_record(self) -> GroupValue:
        """The group as Kafka's group metadata value (subscriptions of the chosen protocol)."""
        return GroupValue(
            protocol_type=self.protocol_type or "",
            generation=self.generation_id,
            protocol=self.protocol_name,
            leader=self.leader_id if self.members else None,
            current_state_timestamp=self.current_state_timestamp_ms,
            members=tuple(
                MemberValue(
                    m.member_id,
                    m.group_instance_id,
                    m.client_id,
                    m.client_host,
                    m.rebalance_timeout_ms,
                    m.session_timeout_ms,
                    m.metadata_for(self.protocol_name) if self.protocol_name else b"",
                    m.assignment,
                )
                for m in self.members.values()
            ),
        )

    @classmethod
    def from_record(cls, group_id: str, value: GroupValue, now_ms: int) -> Group:
        """A group rebuilt from its last metadata record: Stable with the recorded members
        (their sessions start at ``now_ms``) when it had any, else Empty."""
        group = cls(
            group_id,
            generation_id=value.generation,
            protocol_type=value.protocol_type or None,
            protocol_name=value.protocol,
            current_state_timestamp_ms=(
                value.current_state_timestamp if value.current_state_timestamp >= 0 else now_ms
            ),
        )
        if value.members and value.protocol is not None:
            for mv in value.members:
                group.add(
                    Member(
                        member_id=mv.member_id,
                        group_instance_id=mv.group_instance_id,
                        client_id=mv.client_id,
                        client_host=mv.client_host,
                        rebalance_timeout_ms=mv.rebalance_timeout,
                        session_timeout_ms=mv.session_timeout,
                        protocol_type=value.protocol_type,
                        protocols=[(value.protocol, mv.subscription)],
                        assignment=mv.assignment,
                        heartbeat_deadline_ms=now_ms + mv.session_timeout,
                    )
                )
            if value.leader in group.members:
                group.leader_id = value.leader
            group.state = GroupState.STABLE
        return group
