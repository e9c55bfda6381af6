"""Which reader answers ``format("delta")``: Delta's own when the session has it, else ours.

No Delta jars can be had offline, so the session is a stand-in carrying only what
``register_delta_source`` asks: its configuration, its JVM handle (None, as under Spark
Connect, where the configured extension is trusted) and ``dataSource.register``.
"""

from __future__ import annotations

from typing import Any

from pipelines.delta.source import DeltaSnapshotSource, register_delta_source
from pipelines.session import DELTA_EXTENSION


class _Registry:
    def __init__(self) -> None:
        self.registered: list[type] = []

    def register(self, cls: type) -> None:
        self.registered.append(cls)


class _Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


class _Session:
    _jvm = None

    def __init__(self, extensions: str) -> None:
        self.conf = _Conf({"spark.sql.extensions": extensions})
        self.dataSource = _Registry()


def test_native_delta_is_left_alone() -> None:
    session = _Session(f"some.Other, {DELTA_EXTENSION}")
    assert register_delta_source(session) is False  # type: ignore[arg-type]
    assert session.dataSource.registered == []


def test_without_native_delta_ours_is_registered_once() -> None:
    session = _Session("")
    assert register_delta_source(session) is True  # type: ignore[arg-type]
    assert register_delta_source(session) is True  # type: ignore[arg-type]
    assert session.dataSource.registered == [DeltaSnapshotSource]
    assert DeltaSnapshotSource.name() == "delta"
