"""The rebalance state machine of the classic group protocol (mixed into the coordinator).

:class:`Rebalancer` holds the per-group steps that :class:`~logstore.server.group.coordinator.
GroupCoordinator` runs under its lock: JoinGroup (MEMBER_ID_REQUIRED, static members, the
initial delay, the end of the join phase), SyncGroup (the leader's assignment, stored
before anyone is answered), member removal, and the deadlines checked by ``tick``. The
protocol itself is described in the coordinator's module docstring.

Nothing here blocks or calls back directly: answers go to the :class:`Outbox`, which the
coordinator empties after releasing its lock.

Thread-safety: none of its own; every method runs under the coordinator's lock.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kio.schema.errors import ErrorCode

from logstore.errors import LoglakeError
from logstore.server.group.config import GroupConfig
from logstore.server.group.group import Group, GroupState, Member
from logstore.server.group.messages import JoinRequest, JoinResult, SyncRequest, SyncResult
from logstore.server.group.offset_store import OffsetStore

__all__ = ["Outbox", "Rebalancer"]

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(slots=True)
class Outbox:
    """Answers decided under the lock, delivered after it is released."""

    items: list[tuple[Callable[[Any], object], Any]] = field(default_factory=list)

    def put(self, callback: Callable[[T], object] | None, value: T) -> None:
        if callback is not None:
            self.items.append((callback, value))

    def take(self) -> list[tuple[Callable[[Any], object], Any]]:
        items, self.items = self.items, []
        return items


class Rebalancer:
    """The rebalance steps; the coordinator provides the state declared here."""

    config: GroupConfig
    _clock: Callable[[], int]
    _groups: dict[str, Group]
    _outbox: Outbox
    _store: OffsetStore
    _active: bool
    _shut_down: bool

    def _inactive_error(self) -> ErrorCode | None:
        if self._active:
            return None
        if self._shut_down:
            return ErrorCode.not_coordinator
        return ErrorCode.coordinator_load_in_progress

    def _join(self, req: JoinRequest, callback: Callable[[JoinResult], object]) -> None:
        created: Group | None = None

        def fail(error: ErrorCode) -> None:
            self._outbox.put(callback, JoinResult(error, req.member_id))
            if created is not None and self._groups.get(req.group_id) is created:
                # A refused first join leaves no trace (no empty group to list or expire).
                del self._groups[req.group_id]

        err = self._inactive_error()
        if err is not None:
            return fail(err)
        if not req.group_id:
            return fail(ErrorCode.invalid_group_id)
        if not (
            self.config.group_min_session_timeout_ms
            <= req.session_timeout_ms
            <= self.config.group_max_session_timeout_ms
        ):
            return fail(ErrorCode.invalid_session_timeout)
        now = self._clock()
        group = self._groups.get(req.group_id)
        member_id, instance_id = req.member_id, req.group_instance_id
        unknown_member = member_id == ""
        if group is None:
            if not unknown_member:
                return fail(ErrorCode.unknown_member_id)
            group = created = Group(req.group_id, current_state_timestamp_ms=now)
            self._groups[req.group_id] = group
        if group.state is GroupState.DEAD:
            return fail(ErrorCode.coordinator_not_available)
        known = member_id in group.members or member_id in group.pending_members
        if (
            not known
            and (instance_id is None or instance_id not in group.static_members)
            and len(group.members) + len(group.pending_members) >= self.config.group_max_size
        ):
            return fail(ErrorCode.group_max_size_reached)
        if not group.supports(req.protocol_type, list(req.protocols)):
            return fail(ErrorCode.inconsistent_group_protocol)
        if unknown_member:
            new_id = f"{instance_id or req.client_id}-{uuid.uuid4()}"
            if instance_id is not None:
                self._join_static(group, req, instance_id, new_id, callback, now=now)
            elif req.require_known_member_id:
                group.pending_members[new_id] = now + req.session_timeout_ms
                self._outbox.put(callback, JoinResult(ErrorCode.member_id_required, new_id))
            else:
                self._add_member_and_rebalance(group, req, new_id, callback, now)
            return None
        if member_id in group.pending_members:
            del group.pending_members[member_id]
            self._add_member_and_rebalance(group, req, member_id, callback, now)
            return None
        err = self._validate_member(group, member_id, instance_id)
        if err is not None:
            return fail(err)
        member = group.members[member_id]
        protocols = list(req.protocols)
        if group.state is GroupState.PREPARING_REBALANCE:
            self._update_member_and_rebalance(group, member, req, callback, now)
        elif group.state is GroupState.COMPLETING_REBALANCE:
            if member.matches(protocols):
                # A lost JoinGroup answer: repeat it rather than start over.
                self._outbox.put(callback, self._join_result(group, member))
            else:
                self._update_member_and_rebalance(group, member, req, callback, now)
        elif group.state is GroupState.STABLE:
            if group.is_leader(member_id) or not member.matches(protocols):
                # The leader rejoins when metadata changed (e.g. new partitions).
                self._update_member_and_rebalance(group, member, req, callback, now)
            else:
                self._outbox.put(callback, self._join_result(group, member))
        else:
            fail(ErrorCode.unknown_member_id)
        return None

    def _join_static(
        self,
        group: Group,
        req: JoinRequest,
        instance_id: str,
        new_id: str,
        callback: Callable[[JoinResult], object],
        *,
        now: int,
    ) -> None:
        old_id = group.static_members.get(instance_id)
        if old_id is None:
            self._add_member_and_rebalance(group, req, new_id, callback, now)
            return
        # KIP-345: a known instance comes back under a new id; the old id is fenced.
        member = group.members.pop(old_id)
        group.pending_sync.discard(old_id)
        self._outbox.put(member.join_callback, JoinResult(ErrorCode.fenced_instance_id, old_id))
        self._outbox.put(member.sync_callback, SyncResult(ErrorCode.fenced_instance_id))
        member.join_callback = member.sync_callback = None
        member.member_id = new_id
        group.members[new_id] = member
        group.static_members[instance_id] = new_id
        was_leader = group.leader_id == old_id
        if was_leader:
            group.leader_id = new_id
        member.client_id, member.client_host = req.client_id, req.client_host
        member.session_timeout_ms = req.session_timeout_ms
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        self._heartbeat(member, now)
        if (
            group.state is GroupState.STABLE
            and not was_leader
            and member.matches(list(req.protocols))
        ):
            # Same subscription: no rebalance; the member syncs to get its old assignment.
            self._persist_group(group, now)
            self._outbox.put(callback, self._join_result(group, member))
        else:
            self._update_member_and_rebalance(group, member, req, callback, now)

    def _add_member_and_rebalance(
        self,
        group: Group,
        req: JoinRequest,
        member_id: str,
        callback: Callable[[JoinResult], object],
        now: int,
    ) -> None:
        member = Member(
            member_id=member_id,
            group_instance_id=req.group_instance_id,
            client_id=req.client_id,
            client_host=req.client_host,
            rebalance_timeout_ms=req.rebalance_timeout_ms,
            session_timeout_ms=req.session_timeout_ms,
            protocol_type=req.protocol_type,
            protocols=list(req.protocols),
            join_callback=callback,
            is_new=True,
            heartbeat_deadline_ms=now + self.config.group_new_member_join_timeout_ms,
        )
        if group.state is GroupState.PREPARING_REBALANCE and group.initial_delay_active:
            group.new_member_added = True
        group.add(member)
        self._maybe_prepare_rebalance(group, now)
        self._try_complete_join(group, now)

    def _update_member_and_rebalance(
        self,
        group: Group,
        member: Member,
        req: JoinRequest,
        callback: Callable[[JoinResult], object],
        now: int,
    ) -> None:
        if member.join_callback is not None and member.join_callback is not callback:
            # The member re-sent JoinGroup; its earlier request is answered so that no
            # connection waits forever for it.
            self._outbox.put(
                member.join_callback, JoinResult(ErrorCode.rebalance_in_progress, member.member_id)
            )
        member.protocols = list(req.protocols)
        member.protocol_type = req.protocol_type
        member.session_timeout_ms = req.session_timeout_ms
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.join_callback = callback
        self._heartbeat(member, now)
        self._maybe_prepare_rebalance(group, now)
        self._try_complete_join(group, now)

    def _maybe_prepare_rebalance(self, group: Group, now: int) -> None:
        if group.can_rebalance:
            self._prepare_rebalance(group, now)

    def _prepare_rebalance(self, group: Group, now: int) -> None:
        if group.state is GroupState.COMPLETING_REBALANCE:
            for m in group.members.values():
                m.assignment = b""
                self._outbox.put(m.sync_callback, SyncResult(ErrorCode.rebalance_in_progress))
                m.sync_callback = None
        group.pending_sync.clear()
        group.sync_deadline_ms = None
        if group.state is GroupState.EMPTY:
            delay = min(self.config.group_initial_rebalance_delay_ms, group.rebalance_timeout_ms)
            group.initial_delay_active = True
            group.initial_delay_remaining_ms = max(group.rebalance_timeout_ms - delay, 0)
            group.new_member_added = False
            group.join_deadline_ms = now + delay
        else:
            group.initial_delay_active = False
            group.join_deadline_ms = now + group.rebalance_timeout_ms
        group.transition(GroupState.PREPARING_REBALANCE, now)
        log.info(
            "group %s: preparing rebalance (generation %d, %d members)",
            group.group_id,
            group.generation_id,
            len(group.members),
        )

    def _try_complete_join(self, group: Group, now: int) -> None:
        if (
            group.state is GroupState.PREPARING_REBALANCE
            and not group.initial_delay_active
            and group.all_members_joined
        ):
            self._complete_join(group, now)

    def _complete_join(self, group: Group, now: int) -> None:
        for m in [m for m in group.members.values() if not m.awaiting_join]:
            if m.group_instance_id is None:
                self._remove_member(group, m)
        group.join_deadline_ms = None
        group.initial_delay_active = False
        joined = [m for m in group.members.values() if m.awaiting_join]
        leader = group.members.get(group.leader_id or "")
        if leader is not None and not leader.awaiting_join and joined:
            group.leader_id = joined[0].member_id
        group.generation_id += 1
        if not group.members or not joined:
            group.protocol_name = None
            for m in list(group.members.values()):
                self._remove_member(group, m)
            group.leader_id = None
            group.transition(GroupState.EMPTY, now)
            self._persist_group(group, now)
            log.info("group %s: generation %d is empty", group.group_id, group.generation_id)
            return
        group.protocol_name = group.select_protocol()
        group.transition(GroupState.COMPLETING_REBALANCE, now)
        for m in joined:
            callback, m.join_callback = m.join_callback, None
            m.is_new = False
            self._heartbeat(m, now)
            self._outbox.put(callback, self._join_result(group, m))
        group.pending_sync = set(group.members)
        group.sync_deadline_ms = now + group.rebalance_timeout_ms
        log.info(
            "group %s: generation %d with %d members, leader %s, protocol %s",
            group.group_id,
            group.generation_id,
            len(group.members),
            group.leader_id,
            group.protocol_name,
        )

    def _join_result(self, group: Group, member: Member) -> JoinResult:
        leader = group.is_leader(member.member_id)
        return JoinResult(
            ErrorCode.none,
            member.member_id,
            group.generation_id,
            group.protocol_type,
            group.protocol_name,
            group.leader_id or "",
            tuple(group.member_metadata()) if leader else (),
        )

    def _sync(self, req: SyncRequest, callback: Callable[[SyncResult], object]) -> None:
        member_id = req.member_id

        def fail(error: ErrorCode) -> None:
            self._outbox.put(callback, SyncResult(error))

        err = self._inactive_error()
        if err is not None:
            return fail(err)
        group = self._groups.get(req.group_id)
        if group is None:
            return fail(ErrorCode.unknown_member_id)
        if group.state is GroupState.DEAD:
            return fail(ErrorCode.coordinator_not_available)
        err = self._validate_member(group, member_id, req.group_instance_id)
        if err is not None:
            return fail(err)
        if req.generation_id != group.generation_id:
            return fail(ErrorCode.illegal_generation)
        if (req.protocol_type is not None and req.protocol_type != group.protocol_type) or (
            req.protocol_name is not None and req.protocol_name != group.protocol_name
        ):
            return fail(ErrorCode.inconsistent_group_protocol)
        now = self._clock()
        member = group.members[member_id]
        if group.state is GroupState.EMPTY:
            return fail(ErrorCode.unknown_member_id)
        if group.state is GroupState.PREPARING_REBALANCE:
            return fail(ErrorCode.rebalance_in_progress)
        self._heartbeat(member, now)
        self._sync_received(group, member_id)
        if group.state is GroupState.STABLE:
            self._outbox.put(callback, self._sync_result(group, member))
            return None
        # CompletingRebalance
        if member.sync_callback is not None:
            self._outbox.put(member.sync_callback, SyncResult(ErrorCode.rebalance_in_progress))
        member.sync_callback = callback
        if not group.is_leader(member_id):
            return None
        for m in group.members.values():
            m.assignment = req.assignments.get(m.member_id, b"")
        try:
            self._persist_group(group, now, strict=True)
        except (LoglakeError, OSError) as e:
            log.error("group %s: cannot store the assignment: %s", group.group_id, e)
            for m in group.members.values():
                m.assignment = b""
                self._outbox.put(m.sync_callback, SyncResult(ErrorCode.coordinator_not_available))
                m.sync_callback = None
            self._prepare_rebalance(group, now)
            return None
        group.transition(GroupState.STABLE, now)
        for m in group.members.values():
            cb, m.sync_callback = m.sync_callback, None
            self._outbox.put(cb, self._sync_result(group, m))
        log.info("group %s: generation %d is stable", group.group_id, group.generation_id)
        return None

    @staticmethod
    def _sync_received(group: Group, member_id: str) -> None:
        group.pending_sync.discard(member_id)
        if not group.pending_sync:
            group.sync_deadline_ms = None

    @staticmethod
    def _sync_result(group: Group, member: Member) -> SyncResult:
        return SyncResult(
            ErrorCode.none, member.assignment, group.protocol_type, group.protocol_name
        )

    def _remove_member(self, group: Group, member: Member) -> None:
        self._outbox.put(
            member.join_callback, JoinResult(ErrorCode.unknown_member_id, member.member_id)
        )
        self._outbox.put(member.sync_callback, SyncResult(ErrorCode.unknown_member_id))
        member.join_callback = member.sync_callback = None
        group.remove(member.member_id)

    def _remove_member_and_update(self, group: Group, member: Member, now: int) -> None:
        self._remove_member(group, member)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, now)
        elif group.state is GroupState.PREPARING_REBALANCE:
            self._try_complete_join(group, now)
        if group.state is GroupState.PREPARING_REBALANCE and not group.members:
            # Nobody is left to wait for, the initial delay included.
            group.initial_delay_active = False
            self._complete_join(group, now)

    @staticmethod
    def _validate_member(group: Group, member_id: str, instance_id: str | None) -> ErrorCode | None:
        if instance_id is not None:
            known = group.static_members.get(instance_id)
            if known is not None and known != member_id:
                return ErrorCode.fenced_instance_id
        if member_id not in group.members:
            return ErrorCode.unknown_member_id
        return None

    @staticmethod
    def _heartbeat(member: Member, now: int) -> None:
        member.heartbeat_deadline_ms = now + member.session_timeout_ms

    def _tick_group(self, group: Group, now: int) -> None:
        for mid, deadline in list(group.pending_members.items()):
            if deadline <= now:
                del group.pending_members[mid]
                self._try_complete_join(group, now)
        for member in list(group.members.values()):
            if member.member_id not in group.members or member.heartbeat_deadline_ms > now:
                continue
            if member.awaiting_join and not member.is_new:
                continue  # the join phase's own deadline decides
            log.info(
                "group %s: member %s expired (session timeout %d ms)",
                group.group_id,
                member.member_id,
                member.session_timeout_ms,
            )
            self._remove_member_and_update(group, member, now)
        if (
            group.state is GroupState.PREPARING_REBALANCE
            and group.join_deadline_ms is not None
            and group.join_deadline_ms <= now
        ):
            if (
                group.initial_delay_active
                and group.new_member_added
                and group.initial_delay_remaining_ms > 0
            ):
                delay = min(
                    self.config.group_initial_rebalance_delay_ms, group.initial_delay_remaining_ms
                )
                group.initial_delay_remaining_ms -= delay
                group.new_member_added = False
                group.join_deadline_ms = now + delay
            else:
                self._complete_join(group, now)
        if (
            group.sync_deadline_ms is not None
            and group.sync_deadline_ms <= now
            and group.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE)
        ):
            missing = [group.members[m] for m in group.pending_sync if m in group.members]
            group.pending_sync.clear()
            group.sync_deadline_ms = None
            if missing:
                for m in missing:
                    log.info(
                        "group %s: member %s did not sync in time", group.group_id, m.member_id
                    )
                    self._remove_member(group, m)
                self._prepare_rebalance(group, now)
                self._try_complete_join(group, now)

    def _persist_group(self, group: Group, now: int, *, strict: bool = False) -> None:
        try:
            self._store.store_group(group.group_id, group.to_record(), now_ms=now)
        except (LoglakeError, OSError) as e:
            if strict:
                raise
            log.error("group %s: cannot store group metadata: %s", group.group_id, e)
