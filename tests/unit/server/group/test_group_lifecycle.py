"""Coordinator lifecycle: before start, after shutdown, its own timer thread, callbacks run
outside the lock, and loading a __consumer_offsets log that holds foreign records."""

from __future__ import annotations

import threading
from pathlib import Path

from kio.schema.errors import ErrorCode

from logstore.protocol.records import build_batch
from logstore.server.group.config import GroupConfig
from logstore.server.group.coordinator import GroupCoordinator
from logstore.server.group.messages import CommitRequest, JoinRequest, JoinResult
from logstore.server.group.offset_store import OFFSETS_TOPIC
from logstore.server.group.schemas import partition_for
from logstore.storage.config import LogConfig
from logstore.storage.log_manager import LogManager

from .conftest import Box, Env


def _join_request(member_id: str = "") -> JoinRequest:
    return JoinRequest(
        group_id="g",
        member_id=member_id,
        group_instance_id=None,
        client_id="c",
        client_host="/127.0.0.1",
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        protocol_type="consumer",
        protocols=(("range", b""),),
        require_known_member_id=True,
    )


def test_not_started_and_shut_down(tmp_path: Path) -> None:
    lm = LogManager([str(tmp_path)], default_config=LogConfig(), background=False)
    c = GroupCoordinator(lm, config=GroupConfig(group_coordinator_tick_interval_ms=0))
    try:
        box = Box()
        c.join_group(_join_request(), box)
        assert box.value.error is ErrorCode.coordinator_load_in_progress
        assert c.fetch_offsets("g", None) == (ErrorCode.coordinator_load_in_progress, [])
        c.start()
        first = Box()
        c.join_group(_join_request(), first)
        waiting = Box()
        c.join_group(_join_request(first.value.member_id), waiting)
        assert not waiting.done
        c.shutdown()
        # a waiting JoinGroup is answered so the client looks for the coordinator again
        assert waiting.value.error is ErrorCode.not_coordinator
        assert (
            c.heartbeat("g", member_id="m", group_instance_id=None, generation_id=1)
            is ErrorCode.not_coordinator
        )
        assert c.commit_offsets(
            "g",
            generation_id=-1,
            member_id="",
            group_instance_id=None,
            offsets=[CommitRequest("t", 0, 1)],
        ) == [ErrorCode.not_coordinator]
    finally:
        c.shutdown()
        lm.shutdown()


def test_timer_thread_completes_the_join(tmp_path: Path) -> None:
    lm = LogManager([str(tmp_path)], default_config=LogConfig(), background=False)
    config = GroupConfig(group_coordinator_tick_interval_ms=5, group_initial_rebalance_delay_ms=20)
    c = GroupCoordinator(lm, config=config)  # the wall clock
    c.start()
    try:
        done = threading.Event()
        results: list[JoinResult] = []

        def on_join(r: JoinResult) -> None:
            results.append(r)
            done.set()

        first = Box()
        c.join_group(_join_request(), first)
        c.join_group(_join_request(first.value.member_id), on_join)
        assert done.wait(30), "the timer thread never ended the join phase"
        assert results[0].error is ErrorCode.none and results[0].generation_id == 1
    finally:
        c.shutdown()
        lm.shutdown()


def test_callbacks_run_outside_the_lock(env: Env) -> None:
    """A callback may call the coordinator again (the reactor may, on completion)."""
    seen: list[ErrorCode] = []

    def reenter(r: JoinResult) -> None:
        seen.append(r.error)
        seen.append(
            env.coordinator.heartbeat(
                "g", member_id=r.member_id, group_instance_id=None, generation_id=1
            )
        )

    first = env.join("g")
    env.coordinator.join_group(_join_request(first.value.member_id), reenter)
    env.tick(3_000)
    assert seen == [ErrorCode.none, ErrorCode.none]


def test_load_skips_foreign_records(env: Env) -> None:
    env.coordinator.commit_offsets(
        "g",
        generation_id=-1,
        member_id="",
        group_instance_id=None,
        offsets=[CommitRequest("t", 0, 5)],
    )
    log = env.log_manager.get_log(OFFSETS_TOPIC, partition_for("g", 1))
    junk = build_batch([(b"\x00\x09junk", b"x"), (None, b"no key"), (b"\x00\x01\x00", b"")])
    log.append(junk)
    env.coordinator.commit_offsets(
        "g",
        generation_id=-1,
        member_id="",
        group_instance_id=None,
        offsets=[CommitRequest("t", 1, 6)],
    )
    c = env.restart()
    _, results = c.fetch_offsets("g", None)
    assert [(r.topic, r.partition, r.offset) for r in results] == [("t", 0, 5), ("t", 1, 6)]
