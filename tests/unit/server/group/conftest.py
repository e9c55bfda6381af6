"""Shared set-up for the group coordinator tests: a real LogManager in a tmp dir, a clock
the test advances by hand, and helpers that drive JoinGroup/SyncGroup rounds."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from logstore.server.group.config import GroupConfig
from logstore.server.group.coordinator import GroupCoordinator
from logstore.server.group.messages import (
    JoinRequest,
    JoinResult,
    SyncRequest,
    SyncResult,
)
from logstore.storage.config import LogConfig
from logstore.storage.log_manager import LogManager


class ManualClock:
    def __init__(self, start: int = 1_700_000_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> int:
        self.now += ms
        return self.now


class Box:
    """Collects what a callback was given."""

    def __init__(self) -> None:
        self.values: list[Any] = []

    def __call__(self, value: Any) -> None:
        self.values.append(value)

    @property
    def value(self) -> Any:
        assert len(self.values) == 1, self.values
        return self.values[0]

    @property
    def done(self) -> bool:
        return bool(self.values)


class Env:
    """A coordinator over a real log directory; ``restart()`` reopens the same directory."""

    def __init__(self, log_dir: Path, config: GroupConfig) -> None:
        self.log_dir = log_dir
        self.config = config
        self.clock = ManualClock()
        self.log_manager: Any = None
        self.coordinator: GroupCoordinator = self._open()

    def _open(self) -> GroupCoordinator:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_manager = LogManager(
            [str(self.log_dir)], default_config=LogConfig(), background=False
        )
        c = GroupCoordinator(self.log_manager, config=self.config, clock=self.clock)
        c.start()
        return c

    def restart(self) -> GroupCoordinator:
        self.coordinator.shutdown()
        self.log_manager.shutdown()
        self.coordinator = self._open()
        return self.coordinator

    def close(self) -> None:
        self.coordinator.shutdown()
        self.log_manager.shutdown()

    def tick(self, advance_ms: int = 0) -> None:
        self.coordinator.tick(self.clock.advance(advance_ms))

    def join(
        self,
        group: str,
        member_id: str = "",
        *,
        protocols: tuple[tuple[str, bytes], ...] = (("range", b"sub"),),
        instance_id: str | None = None,
        session_ms: int = 10_000,
        rebalance_ms: int = 30_000,
        require_known: bool = True,
        client_id: str = "client",
    ) -> Box:
        box = Box()
        self.coordinator.join_group(
            JoinRequest(
                group_id=group,
                member_id=member_id,
                group_instance_id=instance_id,
                client_id=client_id,
                client_host="/127.0.0.1",
                session_timeout_ms=session_ms,
                rebalance_timeout_ms=rebalance_ms,
                protocol_type="consumer",
                protocols=protocols,
                require_known_member_id=require_known,
            ),
            box,
        )
        return box

    def join_new(self, group: str, **kw: Any) -> Box:
        """Both rounds of a v4+ join: MEMBER_ID_REQUIRED, then the join with that id."""
        first = self.join(group, **kw)
        r: JoinResult = first.value
        assert r.error.name == "member_id_required"
        assert r.member_id.startswith(kw.get("client_id", "client") + "-")
        return self.join(group, r.member_id, **kw)

    def sync(
        self,
        group: str,
        member_id: str,
        generation: int,
        assignments: dict[str, bytes] | None = None,
        instance_id: str | None = None,
    ) -> Box:
        box = Box()
        self.coordinator.sync_group(
            SyncRequest(
                group_id=group,
                generation_id=generation,
                member_id=member_id,
                group_instance_id=instance_id,
                protocol_type="consumer",
                protocol_name=None,
                assignments=assignments or {},
            ),
            box,
        )
        return box


@pytest.fixture
def make_env(tmp_path: Path) -> Iterator[Callable[..., Env]]:
    envs: list[Env] = []

    def make(**overrides: int) -> Env:
        settings: dict[str, int] = {
            "group_coordinator_tick_interval_ms": 0,  # the test drives tick()
            "group_initial_rebalance_delay_ms": 3_000,
        }
        settings.update(overrides)
        env = Env(tmp_path / f"logs{len(envs)}", GroupConfig(**settings))
        envs.append(env)
        return env

    yield make
    for env in envs:
        env.close()


@pytest.fixture
def env(make_env: Callable[..., Env]) -> Env:
    return make_env()


__all__ = ["Box", "Env", "JoinResult", "ManualClock", "SyncResult"]
