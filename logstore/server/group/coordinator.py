"""The classic group coordinator (Kafka's ``GroupCoordinator``), protocol-neutral.

Requests come in as plain Python values (the kio adapters live in
:mod:`logstore.server.group.handlers`); JoinGroup and SyncGroup, which wait for the rest of
the group, take a callback that receives a :class:`JoinResult` / :class:`SyncResult` once
the rebalance allows an answer — possibly before the call returns.

The rebalance protocol, per group (states in :mod:`logstore.server.group.group`):

1. A JoinGroup from an unknown member (empty member id) on v4+ gets ``MEMBER_ID_REQUIRED``
   with a coordinator-made id (``<client id>-<uuid4>``) and must rejoin with it (KIP-394).
2. A (re)join moves the group to PreparingRebalance. The join phase ends when every known
   member has rejoined, or at the rebalance timeout (the largest of the members'); members
   that did not rejoin are removed (static members, KIP-345, are kept). A group that was
   Empty first waits ``group.initial.rebalance.delay.ms`` and again each time a new member
   arrives, up to the rebalance timeout in total (KIP-134).
3. Ending the join phase starts the next generation: the protocol that most members
   prefer among those all support is chosen, every waiting member gets the generation,
   the leader also gets every member's metadata, and the group is CompletingRebalance.
4. The leader's SyncGroup carries the assignment: it is written to ``__consumer_offsets``
   with the member list, then every member waiting in SyncGroup gets its part and the
   group is Stable. Members that do not send SyncGroup within the rebalance timeout are
   removed and a new rebalance starts.
5. Heartbeats keep a member alive (``session.timeout.ms``); during a rebalance they answer
   ``REBALANCE_IN_PROGRESS`` so the member rejoins. LeaveGroup removes a member at once.

Committed offsets are validated against the generation (a member of a group with a
generation must present it; a bare commit with generation -1 is accepted only while the
group has no members) and appended to ``__consumer_offsets`` before they are answered.
Offsets of a group that stayed empty for ``offsets.retention.minutes`` expire (KIP-211),
and the group with them; DeleteGroups removes an empty group at once, OffsetDelete single
partitions (never those of a topic a live member subscribes to).

Transactional offset commits (TxnOffsetCommit) are validated like OffsetCommit (member and
generation only when given, KIP-447) and stay pending in the store until the transaction
coordinator's marker reaches the group's ``__consumer_offsets`` partition
(:meth:`GroupCoordinator.complete_txn`); an OffsetFetch that requires stable offsets (v7+,
READ_COMMITTED consumers) gets ``UNSTABLE_OFFSET_COMMIT`` for a partition with one pending.

Time: ``clock()`` returns wall-clock milliseconds (commit timestamps are persisted);
deadlines are checked by :meth:`GroupCoordinator.tick`, called by the coordinator's own
timer thread every ``group.coordinator.tick.interval.ms`` (0: the caller drives it).

Thread-safety: every public method takes one lock; callbacks run after it is released, on
the calling thread (a handler thread or the timer thread), never under the lock.
Crash behaviour: what was answered as committed is in the log; groups are rebuilt from their
last metadata record (Stable with the recorded members, whose sessions restart at load), so
consumers can keep heartbeating the same generation after a restart.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kio.schema.errors import ErrorCode

from logstore.errors import CorruptRecordError, LoglakeError
from logstore.server.group.config import GroupConfig
from logstore.server.group.group import Group, GroupState
from logstore.server.group.messages import (
    CommitRequest,
    GroupDescription,
    GroupListing,
    JoinRequest,
    JoinResult,
    MemberDescription,
    OffsetFetchResult,
    SyncRequest,
    SyncResult,
)
from logstore.server.group.offset_store import OFFSETS_TOPIC, OffsetStore
from logstore.server.group.rebalance import Outbox, Rebalancer
from logstore.server.group.schemas import OffsetValue, subscribed_topics
from logstore.storage.log_manager import LogManager

__all__ = ["GroupCoordinator"]

log = logging.getLogger(__name__)


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class GroupCoordinator(Rebalancer):
    """Coordinator of every classic group on this broker (see the module docstring)."""

    def __init__(
        self,
        log_manager: LogManager,
        *,
        config: GroupConfig | Any = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.config = GroupConfig.from_broker_config(config)
        self._clock = clock if clock is not None else _wall_clock_ms
        self._store = OffsetStore(
            log_manager,
            num_partitions=self.config.offsets_topic_num_partitions,
            segment_bytes=self.config.offsets_topic_segment_bytes,
            snapshot_min_records=self.config.offsets_snapshot_min_records,
        )
        self._lock = threading.Lock()
        self._groups: dict[str, Group] = {}
        self._outbox = Outbox()
        self._active = False
        self._shut_down = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_cleanup_ms = 0

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Load groups and offsets from ``__consumer_offsets``; start the timer thread."""
        loaded = self._store.load()
        now = self._clock()
        with self._lock:
            for group_id, value in loaded.groups.items():
                self._groups[group_id] = Group.from_record(group_id, value, now)
            for group_id in loaded.offsets:
                if group_id not in self._groups:
                    self._groups[group_id] = Group(group_id, current_state_timestamp_ms=now)
            self._active = True
            self._shut_down = False
            self._next_cleanup_ms = now + self.config.offsets_retention_check_interval_ms
        log.info(
            "group coordinator loaded %d groups, %d with offsets, from %d records",
            len(loaded.groups),
            len(loaded.offsets),
            loaded.records,
        )
        interval = self.config.group_coordinator_tick_interval_ms
        if interval > 0 and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run_timer,
                args=(interval / 1000.0,),
                name="group-coordinator-timer",
                daemon=True,
            )
            self._thread.start()

    def shutdown(self) -> None:
        """Stop the timer; answer every waiting JoinGroup/SyncGroup with ``NOT_COORDINATOR``
        (Kafka's answer on resignation: clients look the coordinator up again)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        with self._lock:
            self._active = False
            self._shut_down = True
            for group in self._groups.values():
                for m in group.members.values():
                    self._outbox.put(
                        m.join_callback, JoinResult(ErrorCode.not_coordinator, m.member_id)
                    )
                    self._outbox.put(m.sync_callback, SyncResult(ErrorCode.not_coordinator))
                    m.join_callback = m.sync_callback = None
            out = self._outbox.take()
        _deliver(out)

    def _run_timer(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.tick(self._clock())
            except Exception:  # the timer must survive a bug in one group
                log.exception("group coordinator tick failed")

    # --- JoinGroup -------------------------------------------------------------------------

    def join_group(self, request: JoinRequest, callback: Callable[[JoinResult], object]) -> None:
        """Join (or rejoin) a group; ``callback`` gets the answer, maybe much later."""
        with self._lock:
            self._join(request, callback)
            out = self._outbox.take()
        _deliver(out)

    # --- SyncGroup -------------------------------------------------------------------------

    def sync_group(self, request: SyncRequest, callback: Callable[[SyncResult], object]) -> None:
        """Sync to the generation; the leader's assignments complete the rebalance."""
        with self._lock:
            self._sync(request, callback)
            out = self._outbox.take()
        _deliver(out)

    # --- Heartbeat / LeaveGroup ----------------------------------------------------------

    def heartbeat(
        self,
        group_id: str,
        *,
        member_id: str,
        group_instance_id: str | None,
        generation_id: int,
    ) -> ErrorCode:
        with self._lock:
            err = self._inactive_error()
            if err is not None:
                return err
            group = self._groups.get(group_id)
            if group is None:
                return ErrorCode.unknown_member_id
            if group.state is GroupState.DEAD:
                return ErrorCode.coordinator_not_available
            if group.state is GroupState.EMPTY:
                return ErrorCode.unknown_member_id
            err = self._validate_member(group, member_id, group_instance_id)
            if err is not None:
                return err
            if generation_id != group.generation_id:
                return ErrorCode.illegal_generation
            self._heartbeat(group.members[member_id], self._clock())
            if group.state is GroupState.PREPARING_REBALANCE:
                return ErrorCode.rebalance_in_progress
            return ErrorCode.none

    def leave_group(
        self, group_id: str, members: Sequence[tuple[str, str | None]]
    ) -> tuple[ErrorCode, list[tuple[str, str | None, ErrorCode]]]:
        """Remove ``(member id, group instance id)`` members; per-member errors (v3+)."""
        with self._lock:
            result = self._leave(group_id, members)
            out = self._outbox.take()
        _deliver(out)
        return result

    def _leave(
        self, group_id: str, members: Sequence[tuple[str, str | None]]
    ) -> tuple[ErrorCode, list[tuple[str, str | None, ErrorCode]]]:
        err = self._inactive_error()
        if err is not None:
            return err, []
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.none, [(m, i, ErrorCode.unknown_member_id) for m, i in members]
        if group.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available, []
        now = self._clock()
        out: list[tuple[str, str | None, ErrorCode]] = []
        for member_id, instance_id in members:
            mid = member_id
            if instance_id is not None:
                known = group.static_members.get(instance_id)
                if known is None:
                    out.append((member_id, instance_id, ErrorCode.unknown_member_id))
                    continue
                if member_id and member_id != known:
                    out.append((member_id, instance_id, ErrorCode.fenced_instance_id))
                    continue
                mid = known
            if mid in group.pending_members:
                del group.pending_members[mid]
                self._try_complete_join(group, now)
                out.append((member_id, instance_id, ErrorCode.none))
                continue
            member = group.members.get(mid)
            if member is None:
                out.append((member_id, instance_id, ErrorCode.unknown_member_id))
                continue
            log.info("group %s: member %s leaves", group.group_id, mid)
            self._remove_member_and_update(group, member, now)
            out.append((member_id, instance_id, ErrorCode.none))
        return ErrorCode.none, out

    # --- timers ----------------------------------------------------------------------------

    def tick(self, now_ms: int) -> None:
        """Expire sessions, pending member ids, join and sync phases due at ``now_ms``;
        expire old offsets of empty groups every ``offsets.retention.check.interval.ms``."""
        with self._lock:
            if self._active:
                for group in list(self._groups.values()):
                    self._tick_group(group, now_ms)
                if now_ms >= self._next_cleanup_ms:
                    self._next_cleanup_ms = now_ms + self.config.offsets_retention_check_interval_ms
                    self._expire_offsets(now_ms)
            out = self._outbox.take()
        _deliver(out)

    def _expire_offsets(self, now: int) -> None:
        for group_id, group in list(self._groups.items()):
            if group.state is not GroupState.EMPTY:
                continue
            try:
                emptied = self._store.expire(
                    group_id,
                    base_ms=group.current_state_timestamp_ms,
                    retention_ms=self.config.offsets_retention_ms,
                    now_ms=now,
                    delete_group=not group.pending_members,
                )
            except (LoglakeError, OSError) as e:
                log.error("group %s: cannot write offset expiry: %s", group_id, e)
                continue
            if emptied and not group.pending_members:
                group.transition(GroupState.DEAD, now)
                del self._groups[group_id]
                log.info("group %s: removed (no members, offsets expired)", group_id)

    # --- offsets ---------------------------------------------------------------------------

    def commit_offsets(
        self,
        group_id: str,
        *,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: Sequence[CommitRequest],
        retention_ms: int = -1,
    ) -> list[ErrorCode]:
        """Validate and store ``offsets``; returns one error code per request, in order."""
        with self._lock:
            result = self._commit(
                group_id, generation_id, member_id, group_instance_id, offsets, retention_ms
            )
            out = self._outbox.take()
        _deliver(out)
        return result

    def _commit(  # noqa: PLR0917 - the request's fields, private
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        instance_id: str | None,
        offsets: Sequence[CommitRequest],
        retention_ms: int,
    ) -> list[ErrorCode]:
        checked = self._commit_group(group_id, create=generation_id < 0)
        if isinstance(checked, ErrorCode):
            return [checked] * len(offsets)
        group, now = checked
        if generation_id < 0 and group.state is GroupState.EMPTY:
            pass  # a "simple" consumer group: Kafka only stores its offsets
        elif generation_id >= 0 or member_id or instance_id is not None:
            err = self._validate_member(group, member_id, instance_id)
            if err is None and generation_id != group.generation_id:
                err = ErrorCode.illegal_generation
            if err is None and group.state is GroupState.COMPLETING_REBALANCE:
                err = ErrorCode.rebalance_in_progress
            if err is not None:
                return [err] * len(offsets)
            self._heartbeat(group.members[member_id], now)
        else:
            return [ErrorCode.unknown_member_id] * len(offsets)
        expire = now + retention_ms if retention_ms > 0 else -1
        return self._store_offsets(
            group_id,
            offsets,
            now,
            expire,
            lambda values: self._store.commit(group_id, values, now_ms=now),
        )

    def txn_commit_offsets(
        self,
        group_id: str,
        *,
        producer_id: int,
        producer_epoch: int,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: Sequence[CommitRequest],
    ) -> list[ErrorCode]:
        """TxnOffsetCommit: validate and append ``offsets`` as pending offsets of the
        producer's transaction; one error code per request, in order."""
        with self._lock:
            result = self._txn_commit(
                group_id,
                producer_id,
                producer_epoch,
                generation_id,
                member_id,
                group_instance_id,
                offsets,
            )
        return result

    def _txn_commit(  # noqa: PLR0917 - the request's fields, private
        self,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        generation_id: int,
        member_id: str,
        instance_id: str | None,
        offsets: Sequence[CommitRequest],
    ) -> list[ErrorCode]:
        # Kafka creates the group: a producer need not be a member of it.
        checked = self._commit_group(group_id, create=True)
        if isinstance(checked, ErrorCode):
            return [checked] * len(offsets)
        group, now = checked
        # KIP-447: member and generation are checked when the producer sends them.
        err: ErrorCode | None = None
        if instance_id is not None:
            known = group.static_members.get(instance_id)
            if known is not None and member_id and known != member_id:
                err = ErrorCode.fenced_instance_id
        if err is None and member_id and member_id not in group.members:
            err = ErrorCode.unknown_member_id
        if err is None and generation_id >= 0 and generation_id != group.generation_id:
            err = ErrorCode.illegal_generation
        if err is not None:
            return [err] * len(offsets)
        return self._store_offsets(
            group_id,
            offsets,
            now,
            -1,
            lambda values: self._store.txn_commit(
                group_id,
                values,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                now_ms=now,
            ),
        )

    def _commit_group(self, group_id: str, *, create: bool) -> tuple[Group, int] | ErrorCode:
        """The checks OffsetCommit and TxnOffsetCommit share before their member checks: the
        coordinator is active, the group id is valid, the group exists (created when
        ``create``, else ``illegal_generation``) and is not dead. Returns the group and the
        time of the commit, or the error for every partition of the request."""
        err = self._inactive_error()
        if err is not None:
            return err
        if not group_id:
            return ErrorCode.invalid_group_id
        now = self._clock()
        group = self._groups.get(group_id)
        if group is None:
            if not create:
                return ErrorCode.illegal_generation
            group = Group(group_id, current_state_timestamp_ms=now)
            self._groups[group_id] = group
        if group.state is GroupState.DEAD:
            return ErrorCode.coordinator_not_available
        return group, now

    def _store_offsets(
        self,
        group_id: str,
        offsets: Sequence[CommitRequest],
        now: int,
        expire: int,
        store: Callable[[list[tuple[tuple[str, int], OffsetValue]]], None],
    ) -> list[ErrorCode]:
        """Refuse each offset whose metadata is too large, ``store`` the others as one batch;
        one error code per request, in order (``coordinator_not_available`` for the stored
        ones when the store refuses: nothing was stored then)."""
        errors: list[ErrorCode] = []
        values: list[tuple[tuple[str, int], OffsetValue]] = []
        for c in offsets:
            metadata = c.metadata or ""
            if len(metadata.encode()) > self.config.offset_metadata_max_bytes:
                errors.append(ErrorCode.offset_metadata_too_large)
                continue
            value = OffsetValue(c.offset, metadata, now, c.leader_epoch, expire)
            values.append(((c.topic, c.partition), value))
            errors.append(ErrorCode.none)
        if values:
            try:
                store(values)
            except (LoglakeError, OSError) as e:
                log.error("group %s: cannot store offsets: %s", group_id, e)
                return [
                    ErrorCode.coordinator_not_available if e_ is ErrorCode.none else e_
                    for e_ in errors
                ]
        return errors

    def offsets_partition_for(self, group_id: str) -> tuple[str, int]:
        """The ``__consumer_offsets`` partition holding ``group_id``'s offsets."""
        return OFFSETS_TOPIC, self._store.partition_for(group_id)

    def complete_txn(
        self,
        partition: int,
        *,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
    ) -> None:
        """The transaction coordinator's marker for ``__consumer_offsets`` ``partition``:
        the producer's pending offsets there become committed (or are dropped). Raises
        :class:`~logstore.errors.LoglakeError` / ``OSError`` when it cannot be written."""
        with self._lock:
            self._store.complete_txn(
                partition,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                commit=commit,
                coordinator_epoch=coordinator_epoch,
                now_ms=self._clock(),
            )

    def fetch_offsets(
        self,
        group_id: str,
        partitions: Iterable[tuple[str, int]] | None,
        *,
        require_stable: bool = False,
    ) -> tuple[ErrorCode, list[OffsetFetchResult]]:
        """Committed offsets (-1 where none); ``partitions`` None means all of the group's.
        With ``require_stable`` a partition with a pending transactional offset answers
        ``UNSTABLE_OFFSET_COMMIT`` (the client retries until the transaction completes)."""
        with self._lock:
            err = self._inactive_error()
            if err is not None:
                return err, []
            offsets = self._store.offsets_of(group_id)
            wanted = sorted(offsets) if partitions is None else list(partitions)
            out = []
            for topic, partition in wanted:
                v = offsets.get((topic, partition))
                if require_stable and self._store.has_pending(group_id, (topic, partition)):
                    out.append(
                        OffsetFetchResult(
                            topic, partition, -1, -1, "", ErrorCode.unstable_offset_commit
                        )
                    )
                elif v is None:
                    out.append(OffsetFetchResult(topic, partition, -1, -1, "", ErrorCode.none))
                else:
                    out.append(
                        OffsetFetchResult(
                            topic, partition, v.offset, v.leader_epoch, v.metadata, ErrorCode.none
                        )
                    )
            return ErrorCode.none, out

    def committed_offset(self, group_id: str, topic: str, partition: int) -> tuple[int, int] | None:
        """``group_id``'s committed offset of ``topic``/``partition`` and its commit time (ms),
        or None (none committed, or only a pending transactional one). For the broker's lake
        bound on retention (``log.retention.lake.group``); any thread."""
        with self._lock:
            v = self._store.offsets_of(group_id).get((topic, partition))
            return None if v is None else (v.offset, v.commit_timestamp)

    def all_committed_offsets(self) -> dict[str, dict[tuple[str, int], int]]:
        """Every group's committed offsets, ``{group: {(topic, partition): offset}}`` (a
        copy; pending transactional commits not included). For the broker's lag metrics,
        at scrape time; any thread."""
        with self._lock:
            return {
                group_id: {tp: v.offset for tp, v in self._store.offsets_of(group_id).items()}
                for group_id in self._groups
            }

    def delete_offsets(
        self, group_id: str, partitions: Sequence[tuple[str, int]]
    ) -> tuple[ErrorCode, list[tuple[str, int, ErrorCode]]]:
        """OffsetDelete: drop committed offsets, except those of topics a live ``consumer``
        group still subscribes to (``GROUP_SUBSCRIBED_TO_TOPIC``), as Kafka does."""
        with self._lock:
            err = self._inactive_error()
            if err is not None:
                return err, []
            group = self._groups.get(group_id)
            if group is None or group.state is GroupState.DEAD:
                return ErrorCode.group_id_not_found, []
            subscribed: set[str] = set()
            if group.members:
                if group.protocol_type != "consumer":
                    return ErrorCode.non_empty_group, []
                for m in group.members.values():
                    for _, metadata in m.protocols[:1]:
                        try:
                            subscribed |= subscribed_topics(metadata)
                        except CorruptRecordError:
                            return ErrorCode.non_empty_group, []
            results = [
                (t, p, ErrorCode.group_subscribed_to_topic if t in subscribed else ErrorCode.none)
                for t, p in partitions
            ]
            doomed = [(t, p) for t, p, e in results if e is ErrorCode.none]
            try:
                self._store.delete(group_id, doomed, delete_group=False, now_ms=self._clock())
            except (LoglakeError, OSError) as e:
                log.error("group %s: cannot delete offsets: %s", group_id, e)
                return ErrorCode.coordinator_not_available, []
            return ErrorCode.none, results

    def delete_groups(self, group_ids: Iterable[str]) -> list[tuple[str, ErrorCode]]:
        """DeleteGroups: an empty group and all its offsets are removed (tombstoned)."""
        out: list[tuple[str, ErrorCode]] = []
        with self._lock:
            err = self._inactive_error()
            now = self._clock()
            for group_id in group_ids:
                group = self._groups.get(group_id)
                if err is not None:
                    out.append((group_id, err))
                elif not group_id:
                    out.append((group_id, ErrorCode.invalid_group_id))
                elif group is None or group.state is GroupState.DEAD:
                    out.append((group_id, ErrorCode.group_id_not_found))
                elif group.state is not GroupState.EMPTY or group.pending_members:
                    out.append((group_id, ErrorCode.non_empty_group))
                else:
                    partitions = list(self._store.offsets_of(group_id))
                    try:
                        self._store.delete(group_id, partitions, delete_group=True, now_ms=now)
                    except (LoglakeError, OSError) as e:
                        log.error("group %s: cannot delete: %s", group_id, e)
                        out.append((group_id, ErrorCode.coordinator_not_available))
                        continue
                    group.transition(GroupState.DEAD, now)
                    del self._groups[group_id]
                    log.info("group %s: deleted", group_id)
                    out.append((group_id, ErrorCode.none))
        return out

    # --- ListGroups / DescribeGroups -------------------------------------------------------

    def list_groups(self, *, states: Iterable[str] = ()) -> tuple[ErrorCode, list[GroupListing]]:
        wanted = {s.lower() for s in states}
        with self._lock:
            err = self._inactive_error()
            if err is not None:
                return err, []
            return ErrorCode.none, [
                GroupListing(g.group_id, g.protocol_type or "", g.state.value)
                for g in self._groups.values()
                if not wanted or g.state.value.lower() in wanted
            ]

    def describe_groups(self, group_ids: Iterable[str]) -> list[GroupDescription]:
        with self._lock:
            err = self._inactive_error()
            out = []
            for gid in group_ids:
                if err is not None:
                    out.append(GroupDescription(err, gid, "", "", ""))
                    continue
                g = self._groups.get(gid)
                if g is None:
                    out.append(GroupDescription(ErrorCode.none, gid, GroupState.DEAD.value, "", ""))
                    continue
                stable = g.state is GroupState.STABLE
                members = tuple(
                    MemberDescription(
                        m.member_id,
                        m.group_instance_id,
                        m.client_id,
                        m.client_host,
                        m.metadata_for(g.protocol_name) if stable and g.protocol_name else b"",
                        m.assignment if stable else b"",
                    )
                    for m in g.members.values()
                )
                out.append(
                    GroupDescription(
                        ErrorCode.none,
                        gid,
                        g.state.value,
                        g.protocol_type or "",
                        (g.protocol_name or "") if stable else "",
                        members,
                    )
                )
            return out

    # --- persistence -----------------------------------------------------------------------

    # --- introspection (tests, tools) ------------------------------------------------------

    def group_state(self, group_id: str) -> GroupState | None:
        with self._lock:
            g = self._groups.get(group_id)
            return None if g is None else g.state

    def generation(self, group_id: str) -> int:
        with self._lock:
            g = self._groups.get(group_id)
            return -1 if g is None else g.generation_id


def _deliver(items: list[tuple[Callable[[Any], object], Any]]) -> None:
    for callback, value in items:
        try:
            callback(value)
        except Exception:  # one broken callback must not starve the others
            log.exception("group coordinator callback failed")
