"""Kafka's topic-level log configs as one frozen value (re-exported by ``logstore.storage.log``).

Keys are Kafka's topic config names (``segment.bytes``, ``cleanup.policy``, ...); defaults are
Kafka's. Broker-level names (``log.segment.bytes``, ``log.retention.hours``, ...) map onto the
same fields through :meth:`LogConfig.from_broker_properties`. Immutable, hence thread-safe.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from logstore.errors import InvalidConfigError

__all__ = ["BROKER_KEYS", "LONG_MAX", "TOPIC_KEYS", "LogConfig"]

LONG_MAX = 2**63 - 1

# topic config key -> (field, minimum)
TOPIC_KEYS: dict[str, tuple[str, int | None]] = {
    "segment.bytes": ("segment_bytes", 14),
    "segment.ms": ("segment_ms", 1),
    "segment.index.bytes": ("segment_index_bytes", 8),
    "index.interval.bytes": ("index_interval_bytes", 0),
    "flush.messages": ("flush_messages", 1),
    "flush.ms": ("flush_ms", 0),
    "retention.ms": ("retention_ms", -1),
    "retention.bytes": ("retention_bytes", None),
    "file.delete.delay.ms": ("file_delete_delay_ms", 0),
    "cleanup.policy": ("cleanup_policy", None),
    "min.compaction.lag.ms": ("min_compaction_lag_ms", 0),
    "delete.retention.ms": ("delete_retention_ms", 0),
    "message.timestamp.type": ("message_timestamp_type", None),
    "max.message.bytes": ("max_message_bytes", 0),
    # loglake's (KIP-280's name): which record of a key wins in compaction (pipelines.compaction)
    "compaction.strategy": ("compaction_strategy", None),
}

# broker key -> (topic key, multiplier to the topic key's unit)
BROKER_KEYS: dict[str, tuple[str, int]] = {
    "log.segment.bytes": ("segment.bytes", 1),
    "log.roll.ms": ("segment.ms", 1),
    "log.roll.hours": ("segment.ms", 3_600_000),
    "log.index.size.max.bytes": ("segment.index.bytes", 1),
    "log.index.interval.bytes": ("index.interval.bytes", 1),
    "log.flush.interval.messages": ("flush.messages", 1),
    "log.flush.interval.ms": ("flush.ms", 1),
    "log.retention.ms": ("retention.ms", 1),
    "log.retention.minutes": ("retention.ms", 60_000),
    "log.retention.hours": ("retention.ms", 3_600_000),
    "log.retention.bytes": ("retention.bytes", 1),
    "log.segment.delete.delay.ms": ("file.delete.delay.ms", 1),
    "log.cleanup.policy": ("cleanup.policy", 1),
    "log.cleaner.min.compaction.lag.ms": ("min.compaction.lag.ms", 1),
    "log.cleaner.delete.retention.ms": ("delete.retention.ms", 1),
    "log.message.timestamp.type": ("message.timestamp.type", 1),
    "message.max.bytes": ("max.message.bytes", 1),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class LogConfig:
    """One partition's log settings, Kafka's defaults.

    ``flush_messages``/``flush_ms`` default to ``LONG_MAX``: flushing is left to the OS and
    durability comes from recovery, as in Kafka. ``retention_ms``/``retention_bytes`` of -1
    mean unlimited.
    """

    segment_bytes: int = 1024 * 1024 * 1024
    segment_ms: int = 7 * 24 * 3_600_000
    segment_index_bytes: int = 10 * 1024 * 1024
    index_interval_bytes: int = 4096
    flush_messages: int = LONG_MAX
    flush_ms: int = LONG_MAX
    retention_ms: int = 7 * 24 * 3_600_000
    retention_bytes: int = -1
    file_delete_delay_ms: int = 60_000
    cleanup_policy: str = "delete"
    min_compaction_lag_ms: int = 0
    delete_retention_ms: int = 24 * 3_600_000
    message_timestamp_type: Literal["CreateTime", "LogAppendTime"] = "CreateTime"
    max_message_bytes: int = 1024 * 1024 + 12
    compaction_strategy: str = "offset"

    def __post_init__(self) -> None:
        for key, (field, minimum) in TOPIC_KEYS.items():
            value = getattr(self, field)
            if minimum is not None and (not isinstance(value, int) or value < minimum):
                raise InvalidConfigError(f"{key} = {value!r}: must be an integer >= {minimum}")
        policies = self.cleanup_policy.split(",") if self.cleanup_policy else []
        if any(p.strip() not in ("delete", "compact") for p in policies):
            raise InvalidConfigError(
                f"cleanup.policy = {self.cleanup_policy!r}: expected delete, compact or both"
            )
        if self.message_timestamp_type not in ("CreateTime", "LogAppendTime"):
            raise InvalidConfigError(
                f"message.timestamp.type = {self.message_timestamp_type!r}: expected "
                "CreateTime or LogAppendTime"
            )

        if not _valid_strategy(self.compaction_strategy):
            raise InvalidConfigError(
                f"compaction.strategy = {self.compaction_strategy!r}: expected offset, "
                "timestamp or header:<name>"
            )

    @property
    def compact(self) -> bool:
        return "compact" in {p.strip() for p in self.cleanup_policy.split(",")}

    @property
    def delete(self) -> bool:
        return "delete" in {p.strip() for p in self.cleanup_policy.split(",")}

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    @classmethod
    def from_properties(
        cls, props: Mapping[str, str], *, defaults: LogConfig | None = None
    ) -> LogConfig:
        """Apply Kafka topic-level keys (``segment.bytes`` ...) over ``defaults``.

        Unknown keys are ignored (Kafka topics carry many configs this engine does not use);
        bad values raise :class:`InvalidConfigError`.
        """
        base = defaults if defaults is not None else cls()
        changes: dict[str, object] = {}
        for key, raw in props.items():
            spec = TOPIC_KEYS.get(key)
            if spec is None:
                continue
            field, _ = spec
            value = str(raw).strip()
            if field == "cleanup_policy":
                changes[field] = ",".join(p.strip() for p in value.split(",") if p.strip())
            elif field in ("message_timestamp_type", "compaction_strategy"):
                changes[field] = value
            else:
                try:
                    changes[field] = int(value)
                except ValueError:
                    raise InvalidConfigError(f"{key} = {raw!r}: not an integer") from None
        return dataclasses.replace(base, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_broker_properties(
        cls, props: Mapping[str, str], *, defaults: LogConfig | None = None
    ) -> LogConfig:
        """Defaults from a broker's ``server.properties`` (``log.segment.bytes`` ...)."""
        topic: dict[str, str] = {}
        # hours first, then minutes, then ms, so the finer unit wins as in Kafka
        for key in sorted((k for k in props if k in BROKER_KEYS), key=_rank):
            topic_key, mult = BROKER_KEYS[key]
            raw = props[key].strip()
            if mult != 1:
                try:
                    raw = str(int(raw) * mult)
                except ValueError:
                    raise InvalidConfigError(f"{key} = {props[key]!r}: not an integer") from None
            topic[topic_key] = raw
        return cls.from_properties(topic, defaults=defaults)

    def to_properties(self) -> dict[str, str]:
        """Every setting as Kafka topic keys (strings)."""
        return {key: str(getattr(self, field)) for key, (field, _) in TOPIC_KEYS.items()}

    def overrides(self, base: LogConfig | None = None) -> dict[str, str]:
        """Topic keys whose value differs from ``base`` (default: Kafka's defaults)."""
        ref = base if base is not None else LogConfig()
        return {
            key: str(getattr(self, field))
            for key, (field, _) in TOPIC_KEYS.items()
            if getattr(self, field) != getattr(ref, field)
        }


def _valid_strategy(text: object) -> bool:
    """``offset`` | ``timestamp`` | ``header:<name>`` (non-empty name): the same grammar as
    ``pipelines.compaction.model.parse_strategy`` (the storage layer does not import it)."""
    if not isinstance(text, str):
        return False
    return text in ("offset", "timestamp") or (text.startswith("header:") and len(text) > 7)


def _rank(key: str) -> int:
    if key.endswith(".hours"):
        return 0
    if key.endswith(".minutes"):
        return 1
    return 2
