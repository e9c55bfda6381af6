"""The transaction coordinator (Kafka's ``TransactionCoordinator``, KIP-98), single broker.

One :class:`TxnMetadata` per transactional id, persisted as a ``__transaction_state`` record
(:mod:`logstore.server.txn.state_log`) before any answer depends on it. States and the
transitions a request makes (Kafka's ``TransactionState``):

- InitProducerId: a new id gets a producer id and epoch 0 (Empty). A known id in Empty,
  CompleteCommit or CompleteAbort gets its epoch bumped (Empty): the previous producer of
  the id is fenced (its next request gets ``PRODUCER_FENCED`` / ``INVALID_PRODUCER_EPOCH``);
  an exhausted epoch (32766) rotates to a new producer id. An Ongoing transaction of the old
  producer is aborted first with a bumped epoch (its markers fence the zombie in every
  partition) and the answer is ``CONCURRENT_TRANSACTIONS``: the client retries and gets the
  next epoch. PrepareCommit/PrepareAbort (markers not all written): ``CONCURRENT_TRANSACTIONS``.
  With an expected producer id/epoch (v3+, KIP-360) a retry of a bump gets the same answer,
  another producer's id or epoch ``PRODUCER_FENCED``.
- AddPartitionsToTxn / AddOffsetsToTxn (the group's ``__consumer_offsets`` partition):
  Empty/Complete* -> Ongoing (the transaction starts now), Ongoing -> Ongoing with more
  partitions (no record when nothing is new).
- EndTxn: Ongoing -> PrepareCommit/PrepareAbort (persisted: the decision), then a COMMIT or
  ABORT marker is written to every partition of the transaction (``MarkerWriter``), then
  CompleteCommit/CompleteAbort (persisted). The client is answered after the markers, so a
  READ_COMMITTED consumer sees a transaction as soon as its producer's commit returned.
  A retried EndTxn of the same decision after completion answers NONE (Kafka).
- Timeouts: :meth:`TransactionCoordinator.abort_timed_out` (a scheduler task every
  ``transaction.abort.timed.out.transaction.cleanup.interval.ms``) aborts, with a bumped
  epoch, every Ongoing transaction older than its ``transaction.timeout.ms``.
- Expiry: :meth:`TransactionCoordinator.expire_transactional_ids` tombstones ids idle (Empty
  or Complete*) for ``transactional.id.expiration.ms``.

Crash behaviour: the state log is the truth. :meth:`TransactionCoordinator.start` reloads it;
a transaction found in PrepareCommit/PrepareAbort gets its markers (re)written and completes
as decided; an Ongoing one stays Ongoing and is aborted at its timeout (counted from its
persisted start), or at once by the next InitProducerId of its id — what Kafka does. A marker
that cannot be written (a full disk) leaves the transaction in Prepare*; a scheduler task
retries every second until every partition has its marker (or no longer exists).

Failpoints (crash tests): ``LOGLAKE_FAILPOINT=txn.after_prepare`` SIGKILLs the process
right after a PrepareCommit/PrepareAbort record is appended (and flushed), before any marker;
``txn.after_markers`` after the markers, before the Complete* record.

Thread-safety: the id -> metadata map is guarded by one lock; every operation on an id holds
that id's lock for its whole transition (append included), so an id's records are written in
order and two requests for one id never interleave. Markers are written under the id's lock;
a marker writer takes only the partition's own locks.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from kio.schema.errors import ErrorCode

from logstore.errors import LoglakeError
from logstore.failpoints import failpoint
from logstore.server.txn.schemas import TxnLogValue, TxnState
from logstore.server.txn.state_log import TxnStateLog

__all__ = [
    "MarkerWriter",
    "TransactionCoordinator",
    "TxnConfig",
    "TxnMetadata",
]

log = logging.getLogger(__name__)

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
_MAX_EPOCH = 32767
# Kafka's TransactionMetadata.isEpochExhausted: one value is kept for the fencing bump.
_EXHAUSTED_EPOCH = _MAX_EPOCH - 1
# Single broker, one leader epoch of the state log forever: the markers' coordinator epoch.
COORDINATOR_EPOCH = 0

_PREPARE = (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)
_IDLE = (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)

TopicPartition = tuple[str, int]


class MarkerWriter(Protocol):
    """Writes one COMMIT/ABORT marker. Returns False when the partition no longer exists
    (the marker is skipped, as Kafka skips deleted partitions); raises
    :class:`~logstore.errors.LoglakeError` / ``OSError`` when it could not be written now
    (retried later)."""

    def __call__(
        self,
        topic: str,
        partition: int,
        *,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
    ) -> bool: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class TxnConfig:
    """The broker keys the coordinator reads (Kafka's names and defaults, except the
    partition count: one partition suits a single broker, as ``offsets.topic.num.partitions``)."""

    max_timeout_ms: int = 900_000
    id_expiration_ms: int = 604_800_000
    abort_timed_out_interval_ms: int = 10_000
    remove_expired_interval_ms: int = 3_600_000
    num_partitions: int = 1
    segment_bytes: int = 104_857_600

    @classmethod
    def from_broker_config(cls, config: object) -> TxnConfig:
        get = getattr(config, "get_int", None)
        if get is None:
            return cls()
        return cls(
            max_timeout_ms=get("transaction.max.timeout.ms"),
            id_expiration_ms=get("transactional.id.expiration.ms"),
            abort_timed_out_interval_ms=get(
                "transaction.abort.timed.out.transaction.cleanup.interval.ms"
            ),
            remove_expired_interval_ms=get(
                "transaction.remove.expired.transaction.cleanup.interval.ms"
            ),
            num_partitions=get("transaction.state.log.num.partitions"),
            segment_bytes=get("transaction.state.log.segment.bytes"),
        )


@dataclass(slots=True)
class TxnMetadata:
    """One transactional id's state (Kafka's ``TransactionMetadata``), guarded by ``lock``.

    ``partitions`` are the transaction's partitions while Ongoing, and those still without
    their marker while Prepare*. ``last_producer_id`` / ``last_producer_epoch`` are what a
    retried InitProducerId may present (memory only, as Kafka's v0 record has no room).
    ``persisted`` is False for an id created by an InitProducerId whose record failed.
    """

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: set[TopicPartition]
    start_ms: int
    last_update_ms: int
    last_producer_id: int = NO_PRODUCER_ID
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    persisted: bool = True
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def to_value(self) -> TxnLogValue:
        by_topic: dict[str, list[int]] = {}
        for t, p in self.partitions:
            by_topic.setdefault(t, []).append(p)
        return TxnLogValue(
            self.producer_id,
            self.producer_epoch,
            self.timeout_ms,
            self.state,
            tuple((t, tuple(sorted(ps))) for t, ps in sorted(by_topic.items())),
            self.last_update_ms,
            self.start_ms,
        )

    @classmethod
    def from_value(cls, transactional_id: str, v: TxnLogValue) -> TxnMetadata:
        return cls(
            transactional_id,
            v.producer_id,
            v.producer_epoch,
            v.timeout_ms,
            v.state,
            {(t, p) for t, ps in v.partitions for p in ps},
            v.start_ms,
            v.last_update_ms,
        )


class _Failed(Exception):
    """A state record could not be appended (carries the error code to answer)."""

    def __init__(self, code: ErrorCode) -> None:
        super().__init__(code.name)
        self.code = code


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class TransactionCoordinator:
    """Coordinator of every transactional id on this broker (see the module docstring).

    ``next_producer_id`` allocates producer ids (shared with idempotent producers);
    ``write_marker`` writes one marker; ``offsets_partition_for(group)`` is the group's
    ``__consumer_offsets`` partition (AddOffsetsToTxn).
    """

    def __init__(
        self,
        state_log: TxnStateLog,
        *,
        config: TxnConfig,
        next_producer_id: Callable[[], int],
        write_marker: MarkerWriter,
        offsets_partition_for: Callable[[str], TopicPartition],
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.config = config
        self._state_log = state_log
        self._next_producer_id = next_producer_id
        self._write_marker = write_marker
        self._offsets_partition_for = offsets_partition_for
        self._clock = clock if clock is not None else _wall_clock_ms
        self._lock = threading.Lock()
        self._txns: dict[str, TxnMetadata] = {}

    # --- lifecycle -------------------------------------------------------------------------

    def load(self) -> None:
        """Read the state log; complete every transaction found in Prepare*."""
        loaded = self._state_log.load()
        with self._lock:
            self._txns = {t: TxnMetadata.from_value(t, v) for t, v in loaded.items()}
        counts: dict[str, int] = {}
        for md in self._txns.values():
            counts[md.state.name] = counts.get(md.state.name, 0) + 1
        log.info("transaction coordinator loaded %d transactional ids %s", len(loaded), counts)
        pending = counts.get("PREPARE_COMMIT", 0) + counts.get("PREPARE_ABORT", 0)
        if pending:
            done = self.complete_pending()
            log.info("completed %d of %d transactions decided before the restart", done, pending)

    def complete_pending(self) -> int:
        """Write the missing markers of every Prepare* transaction (startup, and the retry
        task); returns how many transactions completed."""
        done = 0
        for md in self._snapshot():
            with md.lock:
                if md.state in _PREPARE:
                    try:
                        if self._complete(md):
                            done += 1
                    except _Failed:
                        continue
        return done

    # --- introspection (tests, tools) ------------------------------------------------------

    def describe(self, transactional_id: str) -> TxnLogValue | None:
        """The id's state (DescribeTransactions, KIP-664), read under its lock; None for an
        unknown id or one being expired (Dead), which Kafka answers as not found. While
        Prepare*, ``partitions`` are those still without their marker, as in Kafka."""
        md = self._txns.get(transactional_id)
        if md is None:
            return None
        with md.lock:
            return None if md.state is TxnState.DEAD else md.to_value()

    def list_transactions(
        self,
        *,
        states: frozenset[TxnState] = frozenset(),
        producer_ids: frozenset[int] = frozenset(),
        min_duration_ms: int = -1,
        now_ms: int | None = None,
    ) -> list[tuple[str, int, TxnState]]:
        """``(transactional id, producer id, state)`` of every id that passes the filters
        (ListTransactions, KIP-664; Kafka's ``TransactionStateManager.listTransactionStates``):
        an empty ``states`` / ``producer_ids`` filter lets every id through; a
        ``min_duration_ms`` >= 0 keeps the ids whose transaction started more than that many
        ms before now (KIP-994; compared with the start timestamp alone, as Kafka does, so an
        id that never started one, start -1, passes). Dead ids (being expired) never appear.
        Sorted by id. Each id is read under its own lock, not all at once: a snapshot per id."""
        now = self._clock() if now_ms is None else now_ms
        out: list[tuple[str, int, TxnState]] = []
        for md in self._snapshot():
            with md.lock:
                state, pid, start = md.state, md.producer_id, md.start_ms
            if state is TxnState.DEAD:
                continue
            if producer_ids and pid not in producer_ids:
                continue
            if states and state not in states:
                continue
            if min_duration_ms >= 0 and now - start <= min_duration_ms:
                continue
            out.append((md.transactional_id, pid, state))
        out.sort()
        return out

    def _snapshot(self) -> list[TxnMetadata]:
        with self._lock:
            return list(self._txns.values())

    # --- InitProducerId --------------------------------------------------------------------

    def init_producer_id(
        self,
        transactional_id: str,
        timeout_ms: int,
        *,
        expected_producer_id: int = NO_PRODUCER_ID,
        expected_epoch: int = NO_PRODUCER_EPOCH,
    ) -> tuple[ErrorCode, int, int]:
        """(error, producer id, epoch) for a transactional producer's InitProducerId."""
        if not transactional_id:
            return ErrorCode.invalid_request, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        if not 0 < timeout_ms <= self.config.max_timeout_ms:
            return ErrorCode.invalid_transaction_timeout, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        expected = expected_producer_id != NO_PRODUCER_ID
        while True:
            with self._lock:
                md = self._txns.get(transactional_id)
                if md is None:
                    now = self._clock()
                    md = TxnMetadata(
                        transactional_id,
                        self._next_producer_id(),
                        NO_PRODUCER_EPOCH,
                        timeout_ms,
                        TxnState.EMPTY,
                        set(),
                        -1,
                        now,
                        persisted=False,
                    )
                    self._txns[transactional_id] = md
            with md.lock:
                if md.state is TxnState.DEAD:
                    continue  # expired meanwhile: look it up again
                return self._init_locked(
                    md, timeout_ms, expected, expected_producer_id, expected_epoch
                )

    def _init_locked(
        self,
        md: TxnMetadata,
        timeout_ms: int,
        expected: bool,
        expected_pid: int,
        expected_epoch: int,
    ) -> tuple[ErrorCode, int, int]:
        fail = (NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
        if expected and not (
            md.producer_epoch == NO_PRODUCER_EPOCH
            or expected_pid == md.producer_id
            or (expected_pid == md.last_producer_id and expected_epoch >= _EXHAUSTED_EPOCH)
        ):
            return (ErrorCode.producer_fenced, *fail)
        if md.state in _PREPARE:
            return (ErrorCode.concurrent_transactions, *fail)
        if md.state is TxnState.ONGOING:
            # Fence the old producer: abort its transaction under a bumped epoch, then let
            # the client retry (Kafka's PrepareEpochFence -> PrepareAbort path).
            try:
                self._fence_and_abort(md)
            except _Failed as f:
                return (f.code, *fail)
            return (ErrorCode.concurrent_transactions, *fail)
        now = self._clock()
        pid, epoch = md.producer_id, md.producer_epoch
        last_pid, last_epoch = md.last_producer_id, NO_PRODUCER_EPOCH
        if md.producer_epoch >= _EXHAUSTED_EPOCH and (
            not expected or expected_epoch == md.producer_epoch
        ):
            # Kafka's prepareProducerIdRotation: the old id and (for a KIP-360 request) its
            # epoch are remembered, so that a retry of this request gets this answer again.
            last_pid, pid, epoch = md.producer_id, self._next_producer_id(), 0
            if expected:
                last_epoch = md.producer_epoch
        elif not expected:
            epoch = md.producer_epoch + 1
        elif md.producer_epoch in (NO_PRODUCER_EPOCH, expected_epoch):
            epoch, last_epoch = md.producer_epoch + 1, md.producer_epoch
        elif expected_epoch == md.last_producer_epoch and md.last_producer_epoch >= 0:
            # A retry of a bump whose answer the client lost: the same answer again, and
            # (Kafka's prepareIncrementProducerEpoch) the request's timeout, persisted.
            last_epoch = md.last_producer_epoch
        else:
            return (ErrorCode.producer_fenced, *fail)
        try:
            self._transit(
                md,
                producer_id=pid,
                producer_epoch=epoch,
                timeout_ms=timeout_ms,
                state=TxnState.EMPTY,
                partitions=set(),
                start_ms=-1,
                now=now,
            )
        except _Failed as f:
            return (f.code, *fail)
        md.last_producer_id, md.last_producer_epoch = last_pid, last_epoch
        return ErrorCode.none, pid, epoch

    # --- AddPartitionsToTxn / AddOffsetsToTxn ----------------------------------------------

    def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> ErrorCode:
        """Add ``partitions`` to the producer's transaction (starting it if none is open)."""
        wanted = set(partitions)
        md, err = self._locked_for(transactional_id, producer_id, producer_epoch)
        if md is None:
            return err
        try:
            if md.state in _PREPARE:
                return ErrorCode.concurrent_transactions
            if md.state is TxnState.ONGOING and wanted <= md.partitions:
                return ErrorCode.none
            now = self._clock()
            ongoing = md.state is TxnState.ONGOING
            try:
                self._transit(
                    md,
                    state=TxnState.ONGOING,
                    partitions=(md.partitions | wanted) if ongoing else wanted,
                    start_ms=md.start_ms if ongoing else now,
                    now=now,
                )
            except _Failed as f:
                return f.code
            return ErrorCode.none
        finally:
            md.lock.release()

    def add_offsets(
        self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str
    ) -> ErrorCode:
        """AddOffsetsToTxn: the group's ``__consumer_offsets`` partition joins the transaction."""
        if not group_id:
            return ErrorCode.invalid_group_id
        return self.add_partitions(
            transactional_id, producer_id, producer_epoch, [self._offsets_partition_for(group_id)]
        )

    def check_offset_commit(
        self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str
    ) -> ErrorCode:
        """TxnOffsetCommit's precondition: the producer's transaction is Ongoing and holds
        the group's offsets partition (AddOffsetsToTxn came first), else the error to answer
        (KIP-890's verification: an offset commit outside a transaction would stay pending)."""
        md, err = self._locked_for(transactional_id, producer_id, producer_epoch)
        if md is None:
            return ErrorCode.invalid_producer_epoch if err is ErrorCode.producer_fenced else err
        try:
            if md.state is not TxnState.ONGOING:
                return (
                    ErrorCode.concurrent_transactions
                    if md.state in _PREPARE
                    else ErrorCode.invalid_txn_state
                )
            if self._offsets_partition_for(group_id) not in md.partitions:
                return ErrorCode.invalid_txn_state
            return ErrorCode.none
        finally:
            md.lock.release()

    def _locked_for(
        self, transactional_id: str, producer_id: int, producer_epoch: int
    ) -> tuple[TxnMetadata | None, ErrorCode]:
        """The id's metadata, locked, when the producer id and epoch are the current ones;
        else (None, the error)."""
        if not transactional_id:
            return None, ErrorCode.invalid_request
        md = self._txns.get(transactional_id)
        if md is None or not md.persisted:
            return None, ErrorCode.invalid_producer_id_mapping
        md.lock.acquire()
        if md.state is TxnState.DEAD or md.producer_id != producer_id:
            md.lock.release()
            return None, ErrorCode.invalid_producer_id_mapping
        if md.producer_epoch != producer_epoch:
            md.lock.release()
            return None, ErrorCode.producer_fenced
        return md, ErrorCode.none

    # --- EndTxn ----------------------------------------------------------------------------

    def end_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, *, commit: bool
    ) -> ErrorCode:
        """Commit or abort the producer's transaction (markers written before returning)."""
        md, err = self._locked_for(transactional_id, producer_id, producer_epoch)
        if md is None:
            return err
        try:
            state = md.state
            if state is TxnState.ONGOING:
                try:
                    self._end(md, commit=commit)
                except _Failed as f:
                    return f.code
                return ErrorCode.none
            done = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
            pending = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
            if state is done:
                return ErrorCode.none  # a retry of an EndTxn that completed
            if state is pending:
                return ErrorCode.concurrent_transactions
            return ErrorCode.invalid_txn_state
        finally:
            md.lock.release()

    def _end(self, md: TxnMetadata, *, commit: bool) -> None:
        """Ongoing -> Prepare* -> markers -> Complete* (the last two steps may be left to
        the retry task when a marker cannot be written). Raises :class:`_Failed` when the
        Prepare* record cannot be appended (nothing changed then)."""
        self._transit(
            md,
            state=TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT,
            now=self._clock(),
        )
        failpoint("txn.after_prepare", before=self._state_log_flush(md))
        with contextlib.suppress(_Failed):  # decided and persisted: the retry task completes it
            self._complete(md)

    def _fence_and_abort(self, md: TxnMetadata) -> None:
        """Abort ``md``'s Ongoing transaction under a bumped epoch (timeouts, and an
        InitProducerId of the same id): the markers carry the new epoch, which fences the
        old producer in every partition of the transaction."""
        if md.producer_epoch < _MAX_EPOCH:
            md.last_producer_epoch = NO_PRODUCER_EPOCH
            md.producer_epoch += 1
            try:
                self._end(md, commit=False)
            except _Failed:
                md.producer_epoch -= 1
                raise
        else:
            self._end(md, commit=False)

    def _complete(self, md: TxnMetadata) -> bool:
        """Write the markers ``md`` (in Prepare*) still needs, then Complete*; True when
        complete. Raises :class:`_Failed` when the Complete* record cannot be appended."""
        commit = md.state is TxnState.PREPARE_COMMIT
        for topic, partition in sorted(md.partitions):
            try:
                written = self._write_marker(
                    topic,
                    partition,
                    producer_id=md.producer_id,
                    producer_epoch=md.producer_epoch,
                    commit=commit,
                    coordinator_epoch=COORDINATOR_EPOCH,
                )
            except (LoglakeError, OSError) as e:
                log.warning(
                    "transaction %r: %s marker for %s-%d not written (retried): %s",
                    md.transactional_id,
                    "COMMIT" if commit else "ABORT",
                    topic,
                    partition,
                    e,
                )
                return False
            if not written:
                log.info(
                    "transaction %r: %s-%d no longer exists; its marker is skipped",
                    md.transactional_id,
                    topic,
                    partition,
                )
            md.partitions.discard((topic, partition))
        failpoint("txn.after_markers", before=self._state_log_flush(md))
        self._transit(
            md,
            state=TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT,
            partitions=set(),
            now=self._clock(),
        )
        return True

    def _state_log_flush(self, md: TxnMetadata) -> Callable[[], object]:
        return lambda: self._state_log.flush(md.transactional_id)

    # --- timers ----------------------------------------------------------------------------

    def abort_timed_out(self, now_ms: int | None = None) -> int:
        """Abort (with an epoch bump) every Ongoing transaction past its timeout; how many."""
        now = self._clock() if now_ms is None else now_ms
        aborted = 0
        for md in self._snapshot():
            if md.state is not TxnState.ONGOING or md.start_ms + md.timeout_ms > now:
                continue
            with md.lock:
                if md.state is not TxnState.ONGOING or md.start_ms + md.timeout_ms > now:
                    continue
                log.info(
                    "transaction %r (producer %d epoch %d) timed out after %d ms: aborting",
                    md.transactional_id,
                    md.producer_id,
                    md.producer_epoch,
                    md.timeout_ms,
                )
                try:
                    self._fence_and_abort(md)
                except _Failed:
                    continue
                aborted += 1
        return aborted

    def expire_transactional_ids(self, now_ms: int | None = None) -> int:
        """Tombstone ids idle for ``transactional.id.expiration.ms``; how many."""
        now = self._clock() if now_ms is None else now_ms
        expired = 0
        for md in self._snapshot():
            if md.state not in _IDLE or md.last_update_ms + self.config.id_expiration_ms > now:
                continue
            with md.lock:
                if md.state not in _IDLE or md.last_update_ms + self.config.id_expiration_ms > now:
                    continue
                try:
                    if md.persisted:
                        self._state_log.write(md.transactional_id, None, now_ms=now)
                except (LoglakeError, OSError) as e:
                    log.error("transaction %r: cannot expire: %s", md.transactional_id, e)
                    continue
                md.state = TxnState.DEAD
                with self._lock:
                    if self._txns.get(md.transactional_id) is md:
                        del self._txns[md.transactional_id]
                expired += 1
                log.info("transactional id %r expired", md.transactional_id)
        return expired

    # --- persistence -----------------------------------------------------------------------

    def _transit(
        self,
        md: TxnMetadata,
        *,
        now: int,
        state: TxnState,
        producer_id: int | None = None,
        producer_epoch: int | None = None,
        timeout_ms: int | None = None,
        partitions: set[TopicPartition] | None = None,
        start_ms: int | None = None,
    ) -> None:
        """Append ``md`` with the changes applied, then apply them (all or nothing)."""
        target = TxnMetadata(
            md.transactional_id,
            md.producer_id if producer_id is None else producer_id,
            md.producer_epoch if producer_epoch is None else producer_epoch,
            md.timeout_ms if timeout_ms is None else timeout_ms,
            state,
            set(md.partitions) if partitions is None else set(partitions),
            md.start_ms if start_ms is None else start_ms,
            now,
        )
        try:
            self._state_log.write(md.transactional_id, target.to_value(), now_ms=now)
        except (LoglakeError, OSError) as e:
            log.error(
                "transaction %r: cannot append %s to the state log: %s",
                md.transactional_id,
                state.name,
                e,
            )
            raise _Failed(ErrorCode.coordinator_not_available) from e
        md.producer_id = target.producer_id
        md.producer_epoch = target.producer_epoch
        md.timeout_ms = target.timeout_ms
        md.state = state
        md.partitions = target.partitions
        md.start_ms = target.start_ms
        md.last_update_ms = now
        md.persisted = True
