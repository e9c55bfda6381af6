"""The transaction coordinator's state machine over a real ``__transaction_state`` log.

Markers go to a recorder standing in for the partitions (the partition side has its own
tests); ``__consumer_offsets`` markers go to a real group coordinator. ``restart()`` reopens
the same log directory, as a broker restart does.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from logstore.errors import InvalidProducerEpochError, StorageError
from logstore.server.group.config import GroupConfig
from logstore.server.group.coordinator import GroupCoordinator
from logstore.server.group.messages import CommitRequest
from logstore.server.group.offset_store import OFFSETS_TOPIC
from logstore.server.txn.coordinator import TransactionCoordinator, TxnConfig
from logstore.server.txn.schemas import TxnState
from logstore.server.txn.state_log import TRANSACTION_STATE_TOPIC, TxnStateLog
from logstore.storage.config import LogConfig
from logstore.storage.log_manager import LogManager
from logstore.storage.partition import IsolationLevel, Partition

T0 = 1_700_000_000_000


class Markers:
    """Records every marker; ``fail`` makes writes raise a storage error (a full disk)."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.written: list[tuple[str, int, int, int, bool]] = []
        self.fail = False
        self.missing: set[tuple[str, int]] = set()

    def __call__(
        self,
        topic: str,
        partition: int,
        *,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
    ) -> bool:
        if self.fail:
            raise StorageError(f"{topic}-{partition}: no space left on device")
        if (topic, partition) in self.missing:
            return False
        if topic == OFFSETS_TOPIC:
            self.env.groups.complete_txn(
                partition,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                commit=commit,
                coordinator_epoch=coordinator_epoch,
            )
        self.written.append((topic, partition, producer_id, producer_epoch, commit))
        return True


class Env:
    def __init__(
        self, log_dir: Path, config: TxnConfig, snapshot_min_records: int = 10_000
    ) -> None:
        self.log_dir = log_dir
        self.snapshot_min_records = snapshot_min_records
        self.config = config
        self.now = T0
        self.ids = itertools.count(1000)
        self.markers = Markers(self)
        self._open()

    def clock(self) -> int:
        return self.now

    def _open(self) -> None:
        self.log_manager = LogManager(
            [str(self.log_dir)], default_config=LogConfig(), background=False
        )
        self.groups = GroupCoordinator(
            self.log_manager,
            config=GroupConfig(group_coordinator_tick_interval_ms=0),
            clock=self.clock,
        )
        self.groups.start()
        self.tc = TransactionCoordinator(
            TxnStateLog(
                self.log_manager,
                num_partitions=1,
                segment_bytes=1 << 20,
                snapshot_min_records=self.snapshot_min_records,
            ),
            config=self.config,
            next_producer_id=lambda: next(self.ids),
            write_marker=self.markers,
            offsets_partition_for=self.groups.offsets_partition_for,
            clock=self.clock,
        )
        self.tc.load()

    def restart(self) -> None:
        self.close()
        self._open()

    def close(self) -> None:
        self.groups.shutdown()
        self.log_manager.shutdown()

    def state(self, txn_id: str) -> Any:
        v = self.tc.describe(txn_id)
        assert v is not None
        return v


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path / "logs", TxnConfig(max_timeout_ms=60_000, id_expiration_ms=3_600_000))
    yield e
    e.close()


def _init(env: Env, txn: str = "tx", timeout: int = 10_000, **kw: int) -> tuple[int, int]:
    err, pid, epoch = env.tc.init_producer_id(txn, timeout, **kw)
    assert err is ErrorCode.none
    return pid, epoch


def _txn_commit(
    env: Env, pid: int, epoch: int, offset: int, *, generation_id: int = -1, member_id: str = ""
) -> list[ErrorCode]:
    """TxnOffsetCommit of group ``g``'s offset of ``in``-0 to the group coordinator."""
    return env.groups.txn_commit_offsets(
        "g",
        producer_id=pid,
        producer_epoch=epoch,
        generation_id=generation_id,
        member_id=member_id,
        group_instance_id=None,
        offsets=[CommitRequest("in", 0, offset)],
    )


def _txn_offsets(env: Env, pid: int, epoch: int, offset: int) -> None:
    """AddOffsetsToTxn then TxnOffsetCommit, both accepted."""
    assert env.tc.add_offsets("tx", pid, epoch, "g") is ErrorCode.none
    assert _txn_commit(env, pid, epoch, offset) == [ErrorCode.none]


def _assert_stable_offset_also_after_a_restart(env: Env, offset: int) -> None:
    """Group ``g``'s stable offset of ``in``-0 is ``offset`` (-1: none), before and after a
    restart (the env is left restarted)."""
    for _ in range(2):
        _, res = env.groups.fetch_offsets("g", [("in", 0)], require_stable=True)
        assert (res[0].error, res[0].offset) == (ErrorCode.none, offset)
        env.restart()


def test_init_gives_epoch_zero_then_bumps_and_fences_the_old_producer(env):
    pid, epoch = _init(env)
    assert epoch == 0
    pid2, epoch2 = _init(env)
    assert (pid2, epoch2) == (pid, 1)
    assert env.tc.add_partitions("tx", pid, 0, [("t", 0)]) is ErrorCode.producer_fenced
    assert env.tc.end_txn("tx", pid, 0, commit=True) is ErrorCode.producer_fenced
    assert env.tc.add_partitions("tx", pid + 1, 1, [("t", 0)]) is (
        ErrorCode.invalid_producer_id_mapping
    )
    assert env.tc.add_partitions("other", pid, 1, [("t", 0)]) is (
        ErrorCode.invalid_producer_id_mapping
    )


def test_invalid_timeout_and_empty_id(env):
    assert env.tc.init_producer_id("tx", 60_001)[0] is ErrorCode.invalid_transaction_timeout
    assert env.tc.init_producer_id("tx", 0)[0] is ErrorCode.invalid_transaction_timeout
    assert env.tc.init_producer_id("", 1000)[0] is ErrorCode.invalid_request


def test_commit_writes_a_marker_to_every_partition_then_completes(env):
    pid, epoch = _init(env)
    assert env.tc.add_partitions("tx", pid, epoch, [("a", 0), ("b", 1)]) is ErrorCode.none
    env.now += 5
    assert env.tc.add_partitions("tx", pid, epoch, [("a", 0), ("a", 1)]) is ErrorCode.none
    s = env.state("tx")
    assert s.state is TxnState.ONGOING and s.start_ms == T0
    assert s.partitions == (("a", (0, 1)), ("b", (1,)))
    assert env.tc.end_txn("tx", pid, epoch, commit=True) is ErrorCode.none
    assert sorted(env.markers.written) == [
        ("a", 0, pid, epoch, True),
        ("a", 1, pid, epoch, True),
        ("b", 1, pid, epoch, True),
    ]
    s = env.state("tx")
    assert s.state is TxnState.COMPLETE_COMMIT and s.partitions == ()
    # a retried commit is answered NONE; the opposite decision is refused
    assert env.tc.end_txn("tx", pid, epoch, commit=True) is ErrorCode.none
    assert env.tc.end_txn("tx", pid, epoch, commit=False) is ErrorCode.invalid_txn_state
    # the next transaction starts from CompleteCommit; nothing open: EndTxn is refused
    assert env.tc.end_txn("tx", pid, epoch + 5, commit=True) is ErrorCode.producer_fenced
    assert len(env.markers.written) == 3


def test_end_without_a_transaction_is_invalid_state(env):
    pid, epoch = _init(env)
    assert env.tc.end_txn("tx", pid, epoch, commit=True) is ErrorCode.invalid_txn_state


def test_init_during_an_ongoing_transaction_aborts_it_under_a_bumped_epoch(env):
    pid, epoch = _init(env)
    env.tc.add_partitions("tx", pid, epoch, [("t", 0)])
    err, _, _ = env.tc.init_producer_id("tx", 10_000)
    assert err is ErrorCode.concurrent_transactions
    assert env.markers.written == [("t", 0, pid, epoch + 1, False)]
    assert env.state("tx").state is TxnState.COMPLETE_ABORT
    # the client retries and gets the next epoch; the zombie is fenced
    assert _init(env) == (pid, epoch + 2)
    assert env.tc.end_txn("tx", pid, epoch, commit=True) is ErrorCode.producer_fenced


def test_expected_epoch_retry_and_fencing(env):
    pid, e0 = _init(env)
    pid1, e1 = _init(env, expected_producer_id=pid, expected_epoch=e0)
    assert (pid1, e1) == (pid, e0 + 1)
    # the same request again (its answer was lost): the same answer
    assert _init(env, expected_producer_id=pid, expected_epoch=e0) == (pid, e1)
    # an epoch that is neither current nor the previous one: fenced
    err, _, _ = env.tc.init_producer_id("tx", 1000, expected_producer_id=pid, expected_epoch=7)
    assert err is ErrorCode.producer_fenced
    err, _, _ = env.tc.init_producer_id("tx", 1000, expected_producer_id=99, expected_epoch=0)
    assert err is ErrorCode.producer_fenced


def test_a_retried_bump_gets_the_same_answer_and_its_timeout_is_persisted(env):
    pid, e0 = _init(env, timeout=10_000)
    assert _init(env, timeout=10_000, expected_producer_id=pid, expected_epoch=e0) == (pid, e0 + 1)
    # the retry (Kafka's prepareIncrementProducerEpoch with the previous epoch) keeps the
    # epoch and takes the request's timeout, as a state-log record
    assert _init(env, timeout=20_000, expected_producer_id=pid, expected_epoch=e0) == (pid, e0 + 1)
    env.restart()
    assert env.state("tx").timeout_ms == 20_000
    assert env.state("tx").producer_epoch == e0 + 1


def test_an_exhausted_epoch_rotates_the_producer_id_and_a_retry_gets_the_same_one(env):
    pid, _ = _init(env)
    # 32766 bumps through the state log would take minutes: start from the last usable
    # epoch (Kafka's TransactionMetadata.isEpochExhausted: Short.MaxValue - 1)
    env.tc._txns["tx"].producer_epoch = 32766
    new_pid, epoch = _init(env, expected_producer_id=pid, expected_epoch=32766)
    assert new_pid != pid and epoch == 0
    # the answer was lost: the client asks again with the old id and epoch
    assert _init(env, expected_producer_id=pid, expected_epoch=32766) == (new_pid, 0)
    # anyone else's old id or epoch is fenced
    err, _, _ = env.tc.init_producer_id("tx", 1000, expected_producer_id=pid, expected_epoch=3)
    assert err is ErrorCode.producer_fenced
    assert env.tc.add_partitions("tx", pid, 32766, [("t", 0)]) is not ErrorCode.none


def test_timed_out_transaction_is_aborted_and_its_producer_fenced(env):
    pid, epoch = _init(env, timeout=1_000)
    env.tc.add_partitions("tx", pid, epoch, [("t", 0), ("t", 1)])
    env.now += 999
    assert env.tc.abort_timed_out() == 0
    env.now += 1
    assert env.tc.abort_timed_out() == 1
    assert sorted(env.markers.written) == [
        ("t", 0, pid, epoch + 1, False),
        ("t", 1, pid, epoch + 1, False),
    ]
    s = env.state("tx")
    assert (s.state, s.producer_epoch) == (TxnState.COMPLETE_ABORT, epoch + 1)
    assert env.tc.end_txn("tx", pid, epoch, commit=True) is ErrorCode.producer_fenced


def test_state_survives_a_restart(env):
    pid, epoch = _init(env)
    env.tc.add_partitions("tx", pid, epoch, [("t", 3)])
    env.restart()
    s = env.state("tx")
    assert (s.producer_id, s.producer_epoch, s.state) == (pid, epoch, TxnState.ONGOING)
    assert s.partitions == (("t", (3,)),) and s.start_ms == T0
    # the transaction goes on after the restart
    assert env.tc.end_txn("tx", pid, epoch, commit=True) is ErrorCode.none
    assert env.markers.written == [("t", 3, pid, epoch, True)]
    env.restart()
    assert env.state("tx").state is TxnState.COMPLETE_COMMIT
    # a new producer gets the next epoch, not 0
    assert _init(env) == (pid, epoch + 1)


def test_ongoing_transaction_after_restart_times_out_from_its_start(env):
    pid, epoch = _init(env, timeout=5_000)
    env.tc.add_partitions("tx", pid, epoch, [("t", 0)])
    env.restart()
    env.now += 5_000
    assert env.tc.abort_timed_out() == 1
    assert env.markers.written == [("t", 0, pid, epoch + 1, False)]


def test_markers_that_cannot_be_written_are_retried_and_survive_a_restart(env):
    pid, epoch = _init(env)
    env.tc.add_partitions("tx", pid, epoch, [("t", 0), ("u", 0)])
    env.markers.fail = True
    # the decision is persisted and answered; completion waits for the markers
    assert env.tc.end_txn("tx", pid, epoch, commit=True) is ErrorCode.none
    assert env.state("tx").state is TxnState.PREPARE_COMMIT
    assert env.tc.add_partitions("tx", pid, epoch, [("t", 0)]) is (
        ErrorCode.concurrent_transactions
    )
    assert env.tc.init_producer_id("tx", 1000)[0] is ErrorCode.concurrent_transactions
    assert env.tc.end_txn("tx", pid, epoch, commit=True) is ErrorCode.concurrent_transactions
    assert env.tc.complete_pending() == 0
    env.restart()  # still failing: loading leaves it in PrepareCommit
    assert env.state("tx").state is TxnState.PREPARE_COMMIT
    env.markers.fail = False
    env.restart()  # the load completes it as decided
    assert sorted(env.markers.written) == [("t", 0, pid, epoch, True), ("u", 0, pid, epoch, True)]
    assert env.state("tx").state is TxnState.COMPLETE_COMMIT


def test_a_deleted_partition_is_skipped(env):
    pid, epoch = _init(env)
    env.tc.add_partitions("tx", pid, epoch, [("gone", 0), ("t", 0)])
    env.markers.missing.add(("gone", 0))
    assert env.tc.end_txn("tx", pid, epoch, commit=False) is ErrorCode.none
    assert env.markers.written == [("t", 0, pid, epoch, False)]
    assert env.state("tx").state is TxnState.COMPLETE_ABORT


def test_idle_ids_expire(env):
    pid, _ = _init(env)
    _init(env, "busy")
    env.now += 3_600_000 - 1
    assert env.tc.expire_transactional_ids() == 0
    pid_b, epoch_b = _init(env, "busy")  # touched: stays
    env.tc.add_partitions("busy", pid_b, epoch_b, [("t", 0)])
    env.now += 1
    assert env.tc.expire_transactional_ids() == 1
    assert env.tc.describe("tx") is None
    env.restart()
    assert env.tc.describe("tx") is None and env.tc.describe("busy") is not None
    # the id starts again from scratch: a new producer id
    new_pid, new_epoch = _init(env)
    assert new_pid != pid and new_epoch == 0


def test_state_is_a_compacted_topic_of_kafka_records(env):
    _init(env)
    lg = env.log_manager.get_log(TRANSACTION_STATE_TOPIC, 0)
    assert lg is not None and lg.log_end_offset == 1
    assert lg.config.compact


def test_offsets_are_pending_until_commit(env):
    pid, epoch = _init(env)
    gc = env.groups
    assert env.tc.check_offset_commit("tx", pid, epoch, "g") is ErrorCode.invalid_txn_state
    assert env.tc.add_offsets("tx", pid, epoch, "g") is ErrorCode.none
    assert env.tc.check_offset_commit("tx", pid, epoch, "g") is ErrorCode.none
    assert env.tc.check_offset_commit("tx", pid, epoch + 1, "g") is (
        ErrorCode.invalid_producer_epoch
    )
    assert _txn_commit(env, pid, epoch, 42) == [ErrorCode.none]
    _, res = gc.fetch_offsets("g", [("in", 0)])
    assert res[0].offset == -1
    _, res = gc.fetch_offsets("g", [("in", 0)], require_stable=True)
    assert res[0].error is ErrorCode.unstable_offset_commit
    env.restart()  # pending survives a restart, still pending
    gc = env.groups
    _, res = gc.fetch_offsets("g", [("in", 0)], require_stable=True)
    assert res[0].error is ErrorCode.unstable_offset_commit
    assert env.tc.end_txn("tx", pid, epoch, commit=True) is ErrorCode.none
    _assert_stable_offset_also_after_a_restart(env, 42)


def test_aborted_offsets_are_dropped_also_after_a_restart(env):
    pid, epoch = _init(env)
    _txn_offsets(env, pid, epoch, 7)
    assert env.tc.end_txn("tx", pid, epoch, commit=False) is ErrorCode.none
    _assert_stable_offset_also_after_a_restart(env, -1)


def test_txn_offset_commit_checks_member_and_generation_when_given(env):
    pid, epoch = _init(env)
    env.tc.add_offsets("tx", pid, epoch, "g")
    assert _txn_commit(env, pid, epoch, 7, generation_id=3) == [ErrorCode.illegal_generation]
    assert _txn_commit(env, pid, epoch, 7, member_id="nobody") == [ErrorCode.unknown_member_id]


def test_state_log_is_compacted_by_snapshot_and_loads_the_same(tmp_path):
    e = Env(tmp_path / "logs", TxnConfig(), snapshot_min_records=20)
    try:
        ids = {t: _init(e, t) for t in ("a", "b", "c")}
        for _ in range(12):
            for t, (pid, epoch) in ids.items():
                assert e.tc.add_partitions(t, pid, epoch, [("t", 0)]) is ErrorCode.none
                assert e.tc.end_txn(t, pid, epoch, commit=t != "b") is ErrorCode.none
        e.now += 1
        e.tc.init_producer_id("c", 10_000)  # c: Empty, epoch 1
        before = {t: e.state(t) for t in ids}
        lg = e.log_manager.get_log(TRANSACTION_STATE_TOPIC, 0)
        assert lg.log_start_offset > 0  # older records were dropped
        assert lg.log_end_offset - lg.log_start_offset < 20
        e.restart()
        assert {t: e.state(t) for t in ids} == before
        assert before["b"].state is TxnState.COMPLETE_ABORT
        assert before["c"].state is TxnState.EMPTY and before["c"].producer_epoch == 1
    finally:
        e.close()


def _plain_offset(env: Env, offset: int) -> None:
    errs = env.groups.commit_offsets(
        "g",
        generation_id=-1,
        member_id="",
        group_instance_id=None,
        offsets=[CommitRequest("in", 0, offset)],
    )
    assert errs == [ErrorCode.none]


def _offsets_partition(env: Env) -> Partition:
    topic, p = env.groups.offsets_partition_for("g")
    lg = env.log_manager.get_log(topic, p)
    assert lg is not None
    return Partition.load(topic, p, lg)  # the broker's view: the log's producer state


def test_a_pending_txn_offset_commit_holds_the_offsets_partitions_lso(env):
    _plain_offset(env, 5)  # offset 0 of the partition: stable
    pid, epoch = _init(env)
    _txn_offsets(env, pid, epoch, 42)  # offset 1: pending
    part = _offsets_partition(env)
    assert (part.last_stable_offset, part.high_watermark) == (1, 2)
    rd = part.read(0, 10**6, isolation=IsolationLevel.READ_COMMITTED)
    assert rd.slice is not None and rd.last_stable_offset == 1
    assert part.read(1, 10**6, isolation=IsolationLevel.READ_COMMITTED).slice is None
    env.restart()  # the same after a restart (producer state rebuilt from the log)
    part = _offsets_partition(env)
    assert (part.last_stable_offset, part.high_watermark) == (1, 2)
    assert env.tc.end_txn("tx", pid, epoch, commit=False) is ErrorCode.none
    part = _offsets_partition(env)
    # the ABORT marker at 2 ends it: stable to the end, the aborted offsets listed
    assert part.last_stable_offset == part.high_watermark == 3
    rd = part.read(0, 10**6, isolation=IsolationLevel.READ_COMMITTED)
    assert [(a.producer_id, a.first_offset) for a in rd.aborted_transactions or []] == [(pid, 1)]


def test_a_plain_commit_made_while_the_transaction_was_open_wins(env):
    pid, epoch = _init(env)
    _txn_offsets(env, pid, epoch, 42)
    _plain_offset(env, 50)  # later in the log than the transaction's offset
    assert env.tc.end_txn("tx", pid, epoch, commit=True) is ErrorCode.none
    _assert_stable_offset_also_after_a_restart(env, 50)
    # the other order: the transaction's offset is the later one and wins at its commit
    _, epoch = _init(env)
    _plain_offset(env, 60)
    _txn_offsets(env, pid, epoch, 70)
    assert env.tc.end_txn("tx", pid, epoch, commit=True) is ErrorCode.none
    _assert_stable_offset_also_after_a_restart(env, 70)


def test_an_obsolete_offsets_marker_is_refused_and_drops_the_pending_offsets(env):
    _init(env)
    pid, epoch = _init(env)  # epoch 1
    assert epoch == 1
    _txn_offsets(env, pid, epoch, 42)
    _, p = env.groups.offsets_partition_for("g")
    end = _offsets_partition(env).log_end_offset
    # a marker of an older epoch than the partition's producer state has: refused, nothing
    # appended, and the offsets it would have committed can never be: dropped
    with pytest.raises(InvalidProducerEpochError):
        env.groups.complete_txn(
            p, producer_id=pid, producer_epoch=epoch - 1, commit=True, coordinator_epoch=0
        )
    assert _offsets_partition(env).log_end_offset == end
    _, res = env.groups.fetch_offsets("g", [("in", 0)], require_stable=True)
    assert (res[0].error, res[0].offset) == (ErrorCode.none, -1)
