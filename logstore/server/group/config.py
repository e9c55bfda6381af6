"""Group coordinator settings, under Kafka's broker configuration names.

Every field maps to one ``group.*`` / ``offsets.*`` / ``offset.*`` key of a Kafka broker
(see :data:`PROPERTY_NAMES`); :meth:`GroupConfig.from_properties` takes those keys, so the
broker can hand over its whole property map and the coordinator picks what it owns.

Three knobs have no Kafka counterpart (``group.coordinator.tick.interval.ms``,
``group.new.member.join.timeout.ms``, ``offsets.snapshot.min.records``); Kafka hard-codes the
first two and compacts the topic with its log cleaner instead of the third.

The one deliberate difference from Kafka's defaults is ``group.initial.rebalance.delay.ms``:
Kafka waits 3 s after the first member of an empty group joins, hoping more arrive before
the first generation; a single broker that clients and tests start together gains little
from it, so the default here is 100 ms (set it to 3000 for Kafka's behaviour).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from logstore.errors import InvalidConfigError

__all__ = ["PROPERTY_NAMES", "GroupConfig", "GroupConfigError"]


class GroupConfigError(InvalidConfigError):
    """A group coordinator property is unknown to this module's keys or not a valid value."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupConfig:
    """Settings of the group coordinator and of its ``__consumer_offsets`` topic.

    Invariants (checked on construction): timeouts and intervals are positive where Kafka
    requires it, ``group_min_session_timeout_ms <= group_max_session_timeout_ms``,
    ``offsets_topic_num_partitions >= 1``.
    """

    group_min_session_timeout_ms: int = 6_000
    group_max_session_timeout_ms: int = 1_800_000
    group_initial_rebalance_delay_ms: int = 100
    group_max_size: int = 2_147_483_647
    offsets_topic_num_partitions: int = 1
    offsets_topic_segment_bytes: int = 104_857_600
    offsets_retention_minutes: int = 10_080
    offsets_retention_check_interval_ms: int = 600_000
    offset_metadata_max_bytes: int = 4_096
    # Accepted for the broker's sake; commits here are appended synchronously, never wait.
    offsets_commit_timeout_ms: int = 5_000
    # How often the coordinator's own timer thread calls tick(); 0 disables the thread
    # (the broker, or a test, then drives tick(now_ms) itself).
    group_coordinator_tick_interval_ms: int = 50
    # Kafka's fixed 5 minutes for a member that joined but has not been answered yet.
    group_new_member_join_timeout_ms: int = 300_000
    # A __consumer_offsets partition is compacted by snapshot once it spans at least this
    # many offsets and half of them are dead (Kafka's min.cleanable.dirty.ratio 0.5).
    offsets_snapshot_min_records: int = 10_000

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise GroupConfigError(f"{f.name} must be an int, got {value!r}")
            if value < 0:
                raise GroupConfigError(f"{f.name} must be >= 0, got {value}")
        if self.group_min_session_timeout_ms > self.group_max_session_timeout_ms:
            raise GroupConfigError(
                "group.min.session.timeout.ms must be <= group.max.session.timeout.ms, got "
                f"{self.group_min_session_timeout_ms} > {self.group_max_session_timeout_ms}"
            )
        if self.offsets_topic_num_partitions < 1:
            raise GroupConfigError(
                "offsets.topic.num.partitions must be >= 1, got "
                f"{self.offsets_topic_num_partitions}"
            )
        if self.group_max_size < 1:
            raise GroupConfigError(f"group.max.size must be >= 1, got {self.group_max_size}")

    @property
    def offsets_retention_ms(self) -> int:
        return self.offsets_retention_minutes * 60_000

    @classmethod
    def from_broker_config(cls, config: object) -> GroupConfig:
        """From a ``GroupConfig`` (returned as is), a mapping of Kafka keys, or an object whose
        ``values`` attribute is such a mapping (``logstore.server.config.BrokerConfig``)."""
        if isinstance(config, GroupConfig):
            return config
        if config is None:
            return cls()
        if isinstance(config, Mapping):
            return cls.from_properties(config)
        values = getattr(config, "values", None)
        if isinstance(values, Mapping):
            return cls.from_properties({k: v for k, v in values.items() if v is not None})
        raise GroupConfigError(f"cannot read group settings from {type(config).__name__}")

    @classmethod
    def from_properties(
        cls, props: Mapping[str, Any], *, ignore_unknown: bool = True
    ) -> GroupConfig:
        """Build from Kafka-named keys (``group.max.size`` ...); values are str or int.

        Keys this module does not own are ignored when ``ignore_unknown`` (the broker passes
        its whole configuration); otherwise they raise :class:`GroupConfigError`.
        """
        values: dict[str, int] = {}
        for key, raw in props.items():
            attr = PROPERTY_NAMES.get(key)
            if attr is None:
                if ignore_unknown:
                    continue
                raise GroupConfigError(f"unknown group coordinator property {key!r}")
            try:
                values[attr] = int(str(raw).strip())
            except ValueError:
                raise GroupConfigError(f"{key} must be an integer, got {raw!r}") from None
        return cls(**values)


PROPERTY_NAMES: dict[str, str] = {f.name.replace("_", "."): f.name for f in fields(GroupConfig)}
