"""Kafka's topic-level log configs as one frozen value (re-exported by ``logstore.storage.log``).

Keys are Kafka's topic config names (``segment.bytes``, ``cleanup.policy``, ...); defaults are
Kafka's. Broker-level names (``log.segment.bytes``, ``log.retention.hours``, ...) map onto the
same fields through :meth:`LogConfig.from_broker_properties`. Immutable, hence thread-safe.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from logstore.errors import InvalidConfigError
from logstore.storage.topic_config_defs import TOPIC_CONFIGS, parse_topic_value

__all__ = ["BROKER_KEYS", "LONG_MAX", "TOPIC_KEYS", "LogConfig", "format_value"]

LONG_MAX = 2**63 - 1

# topic config key -> LogConfig field: the keys of the registry this value carries (the others
# are no-ops, validated and stored but read by nothing; see topic_config_defs)
TOPIC_KEYS: dict[str, str] = {
    "segment.bytes": "segment_bytes",
    "segment.ms": "segment_ms",
    "segment.jitter.ms": "segment_jitter_ms",
    "segment.index.bytes": "segment_index_bytes",
    "index.interval.bytes": "index_interval_bytes",
    "flush.messages": "flush_messages",
    "flush.ms": "flush_ms",
    "retention.ms": "retention_ms",
    "retention.bytes": "retention_bytes",
    "file.delete.delay.ms": "file_delete_delay_ms",
    "cleanup.policy": "cleanup_policy",
    "min.compaction.lag.ms": "min_compaction_lag_ms",
    "max.compaction.lag.ms": "max_compaction_lag_ms",
    "min.cleanable.dirty.ratio": "min_cleanable_dirty_ratio",
    "delete.retention.ms": "delete_retention_ms",
    "message.timestamp.type": "message_timestamp_type",
    "message.timestamp.before.max.ms": "message_timestamp_before_max_ms",
    "message.timestamp.after.max.ms": "message_timestamp_after_max_ms",
    "max.message.bytes": "max_message_bytes",
    "compression.type": "compression_type",
    "compression.gzip.level": "compression_gzip_level",
    "compression.lz4.level": "compression_lz4_level",
    "compression.zstd.level": "compression_zstd_level",
    "preallocate": "preallocate",
    # loglake's (KIP-280's name): which record of a key wins in compaction (pipelines.compaction)
    "compaction.strategy": "compaction_strategy",
    # tiered storage (KIP-405; logstore.tier)
    "remote.storage.enable": "remote_storage_enable",
    "local.retention.ms": "local_retention_ms",
    "local.retention.bytes": "local_retention_bytes",
}

# broker key -> (topic key, multiplier to the topic key's unit), from the registry's synonyms
BROKER_KEYS: dict[str, tuple[str, int]] = {
    broker_key: (
        key,
        3_600_000
        if broker_key.endswith(".hours")
        else 60_000
        if broker_key.endswith(".minutes")
        else 1,
    )
    for key in TOPIC_KEYS
    for broker_key in TOPIC_CONFIGS[key].synonyms
}
# how specific a broker key is: a later synonym in the registry is a coarser fallback
_SPECIFICITY: dict[str, int] = {
    broker_key: rank
    for key in TOPIC_KEYS
    for rank, broker_key in enumerate(TOPIC_CONFIGS[key].synonyms)
}


@dataclass(frozen=True, slots=True, kw_only=True)
class LogConfig:
    """One partition's log settings, Kafka's defaults.

    ``flush_messages``/``flush_ms`` default to ``LONG_MAX``: flushing is left to the OS and
    durability comes from recovery, as in Kafka. ``retention_ms``/``retention_bytes`` of -1
    mean unlimited. Every field is checked against its key's rule in
    :data:`~logstore.storage.topic_config_defs.TOPIC_CONFIGS` on construction.
    """

    segment_bytes: int = 1024 * 1024 * 1024
    segment_ms: int = 7 * 24 * 3_600_000
    segment_jitter_ms: int = 0
    segment_index_bytes: int = 10 * 1024 * 1024
    index_interval_bytes: int = 4096
    flush_messages: int = LONG_MAX
    flush_ms: int = LONG_MAX
    retention_ms: int = 7 * 24 * 3_600_000
    retention_bytes: int = -1
    file_delete_delay_ms: int = 60_000
    cleanup_policy: str = "delete"
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX
    min_cleanable_dirty_ratio: float = 0.5
    delete_retention_ms: int = 24 * 3_600_000
    message_timestamp_type: Literal["CreateTime", "LogAppendTime"] = "CreateTime"
    message_timestamp_before_max_ms: int = LONG_MAX
    message_timestamp_after_max_ms: int = 3_600_000
    max_message_bytes: int = 1024 * 1024 + 12
    compression_type: str = "producer"
    compression_gzip_level: int = -1
    compression_lz4_level: int = 9
    compression_zstd_level: int = 3
    preallocate: bool = False
    compaction_strategy: str = "offset"
    remote_storage_enable: bool = False
    local_retention_ms: int = -2
    local_retention_bytes: int = -2

    def __post_init__(self) -> None:
        for key, field in TOPIC_KEYS.items():
            value = getattr(self, field)
            default = _DEFAULTS[field]
            if type(value) is type(default) and value == default:
                continue  # Kafka's defaults obey their rules (tests/unit/storage)
            if isinstance(value, bool) != (TOPIC_CONFIGS[key].type == "boolean"):
                raise InvalidConfigError(f"{key} = {value!r}: wrong type")
            parse_topic_value(key, format_value(value))

    def random_segment_jitter(self) -> int:
        """A new segment's roll jitter: uniform in ``[0, min(segment.jitter.ms, segment.ms))``
        (Kafka's ``LogConfig.randomSegmentJitter``), so that many partitions created together
        do not all roll at once."""
        if self.segment_jitter_ms == 0:
            return 0
        return random.randrange(min(self.segment_jitter_ms, self.segment_ms))

    @property
    def compact(self) -> bool:
        return "compact" in {p.strip() for p in self.cleanup_policy.split(",")}

    @property
    def delete(self) -> bool:
        return "delete" in {p.strip() for p in self.cleanup_policy.split(",")}

    @property
    def tiered(self) -> bool:
        """Whether segments of this topic go to the tier (KIP-405): ``remote.storage.enable``
        and not compacted (Kafka never tiers compacted topics)."""
        return self.remote_storage_enable and not self.compact

    @property
    def effective_local_retention_ms(self) -> int:
        """``local.retention.ms``, ``retention.ms`` for -2 (Kafka's rule)."""
        return self.retention_ms if self.local_retention_ms == -2 else self.local_retention_ms

    @property
    def effective_local_retention_bytes(self) -> int:
        """``local.retention.bytes``, ``retention.bytes`` for -2 (Kafka's rule)."""
        if self.local_retention_bytes == -2:
            return self.retention_bytes
        return self.local_retention_bytes

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
            field = TOPIC_KEYS.get(key)
            if field is not None:
                changes[field] = parse_topic_value(key, raw)
        return dataclasses.replace(base, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_broker_properties(
        cls, props: Mapping[str, str], *, defaults: LogConfig | None = None
    ) -> LogConfig:
        """Defaults from a broker's ``server.properties`` (``log.segment.bytes`` ...).

        Of several broker keys behind one topic key the most specific wins, as in Kafka
        (``log.roll.ms`` over ``log.roll.hours``); a negative time in a coarse unit means -1.
        """
        topic: dict[str, str] = {}
        for key in sorted((k for k in props if k in BROKER_KEYS), key=_rank):
            topic_key, mult = BROKER_KEYS[key]
            raw = props[key].strip()
            if mult != 1:
                try:
                    units = int(raw)
                except ValueError:
                    raise InvalidConfigError(f"{key} = {props[key]!r}: not an integer") from None
                raw = str(-1 if units < 0 else units * mult)
            else:
                try:  # the topic key's rule, reported under the broker key the file holds
                    parse_topic_value(topic_key, raw)
                except InvalidConfigError as exc:
                    rule = str(exc).split(":", 1)[-1].strip()
                    raise InvalidConfigError(f"{key}={raw!r}: {rule}") from None
            topic[topic_key] = raw
        return cls.from_properties(topic, defaults=defaults)

    def to_properties(self) -> dict[str, str]:
        """Every setting as Kafka topic keys (strings, as Kafka shows them)."""
        return {key: format_value(getattr(self, field)) for key, field in TOPIC_KEYS.items()}

    def overrides(self, base: LogConfig | None = None) -> dict[str, str]:
        """Topic keys whose value differs from ``base`` (default: Kafka's defaults)."""
        ref = base if base is not None else LogConfig()
        return {
            key: format_value(getattr(self, field))
            for key, field in TOPIC_KEYS.items()
            if getattr(self, field) != getattr(ref, field)
        }


_DEFAULTS: dict[str, object] = {f.name: f.default for f in dataclasses.fields(LogConfig)}


def format_value(value: object) -> str:
    """A config value as Kafka writes it (``true``/``false`` for booleans)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _rank(key: str) -> int:
    """Coarser synonyms first, so that the most specific one is applied last and wins."""
    return -_SPECIFICITY[key]
