"""DescribeConfigs (key 32), v1-v4: topic configs (overrides + broker defaults) and broker configs.

Resource types (Kafka's ``ConfigResource.Type``): TOPIC = 2, BROKER = 4. Config sources:
DYNAMIC_TOPIC_CONFIG = 1 (a persisted override), STATIC_BROKER_CONFIG = 4 (set in the
broker's properties), DEFAULT_CONFIG = 5. ``configuration_keys`` null = every key.
Topic keys are Kafka's (``logstore.storage.config.TOPIC_KEYS``); with ``include_synonyms``
a topic key lists its override, its broker key and the default, most specific first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from kio.schema.errors import ErrorCode

from logstore.errors import InvalidConfigError
from logstore.server.config import BROKER_CONFIG_DEFS, TOPIC_KEY_FOR_BROKER_KEY
from logstore.server.context import RequestContext
from logstore.server.handlers._util import ZERO_MS, build, response_module
from logstore.storage.config import TOPIC_KEYS, LogConfig

__all__ = [
    "API_KEY",
    "MAX_VERSION",
    "MIN_VERSION",
    "RESOURCE_BROKER",
    "RESOURCE_TOPIC",
    "ConfigEntry",
    "handle",
    "topic_config_entries",
    "validate_topic_configs",
]

API_KEY: Final = 32
MIN_VERSION: Final = 1
MAX_VERSION: Final = 4

RESOURCE_TOPIC: Final = 2
RESOURCE_BROKER: Final = 4
SOURCE_DYNAMIC_TOPIC: Final = 1
SOURCE_STATIC_BROKER: Final = 4
SOURCE_DEFAULT: Final = 5
# Kafka's ConfigType: BOOLEAN 1, STRING 2, INT 3, SHORT 4, LONG 5, DOUBLE 6, LIST 7.
_TYPES: Final = {"bool": 1, "string": 2, "int": 3, "long": 5, "list": 7}

_BROKER_KEY_FOR_TOPIC_KEY: Final = {v: k for k, v in TOPIC_KEY_FOR_BROKER_KEY.items()} | {
    "retention.ms": "log.retention.ms",
    "segment.ms": "log.roll.ms",
    "flush.ms": "log.flush.interval.ms",
}
_TOPIC_TYPES: Final = {
    "cleanup.policy": 7,
    "message.timestamp.type": 2,
    "compaction.strategy": 2,
    "segment.bytes": 3,
    "segment.index.bytes": 3,
    "index.interval.bytes": 3,
    "max.message.bytes": 3,
}


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    name: str
    value: str | None
    source: int
    type: int
    synonyms: tuple[tuple[str, str | None, int], ...]


def validate_topic_configs(props: Mapping[str, str]) -> LogConfig:
    """Raise InvalidConfigError for an unknown topic key or a bad value; else the config."""
    for key, value in props.items():
        if key not in TOPIC_KEYS:
            raise InvalidConfigError(f"unknown topic config {key!r}")
        if key == "cleanup.policy":
            parts = [p.strip() for p in value.split(",") if p.strip()]
            if not parts or any(p not in ("delete", "compact") for p in parts):
                raise InvalidConfigError(
                    f"cleanup.policy={value!r}: expected delete and/or compact"
                )
        if key == "message.timestamp.type" and value not in ("CreateTime", "LogAppendTime"):
            raise InvalidConfigError(
                f"message.timestamp.type={value!r}: expected CreateTime or LogAppendTime"
            )
    try:
        return LogConfig.from_properties(props)
    except (InvalidConfigError, ValueError, TypeError) as exc:
        raise InvalidConfigError(str(exc)) from exc


def topic_config_entries(broker: Any, topic: str, *, pending: bool = False) -> list[ConfigEntry]:
    """Every topic-level key of ``topic`` with its effective value and source."""
    overrides: dict[str, str] = {} if pending else broker.topic_overrides.get(topic, {})
    defaults = broker.default_log_config.to_properties()
    config = broker.config
    out = []
    for key in TOPIC_KEYS:
        synonyms: list[tuple[str, str | None, int]] = []
        if key in overrides:
            synonyms.append((key, overrides[key], SOURCE_DYNAMIC_TOPIC))
        bkey = _BROKER_KEY_FOR_TOPIC_KEY.get(key)
        if bkey is not None and bkey in config.originals:
            synonyms.append((bkey, config.originals[bkey], SOURCE_STATIC_BROKER))
        synonyms.append((bkey or key, defaults[key], SOURCE_DEFAULT))
        _name, value, source = synonyms[0]
        if source != SOURCE_DYNAMIC_TOPIC:
            value = defaults[key]
        out.append(ConfigEntry(key, value, source, _TOPIC_TYPES.get(key, 5), tuple(synonyms)))
    return out


def _broker_entries(config: Any) -> list[ConfigEntry]:
    out = []
    for name, d in BROKER_CONFIG_DEFS.items():
        v = config.values.get(name)
        if isinstance(v, list):
            value: str | None = ",".join(v)
        elif isinstance(v, bool):
            value = "true" if v else "false"
        else:
            value = None if v is None else str(v)
        source = SOURCE_STATIC_BROKER if name in config.originals else SOURCE_DEFAULT
        out.append(
            ConfigEntry(name, value, source, _TYPES.get(d.type, 2), ((name, value, source),))
        )
    return out


def handle(ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ctx)
    broker = ctx.broker
    results = []
    for res in request.resources:
        error = ErrorCode.none
        message = None
        entries: list[ConfigEntry] = []
        if res.resource_type == RESOURCE_TOPIC:
            if broker.partition_count(res.resource_name) is None:
                error = ErrorCode.unknown_topic_or_partition
                message = f"unknown topic {res.resource_name!r}"
            else:
                entries = topic_config_entries(broker, res.resource_name)
        elif res.resource_type == RESOURCE_BROKER:
            if res.resource_name not in ("", str(broker.node_id)):
                error = ErrorCode.invalid_request
                message = f"unknown broker {res.resource_name!r}"
            else:
                entries = _broker_entries(ctx.config)
        else:
            error = ErrorCode.invalid_request
            message = f"unsupported resource type {res.resource_type}"
        if res.configuration_keys is not None:
            keys = set(res.configuration_keys)
            entries = [e for e in entries if e.name in keys]
        configs = tuple(
            build(
                mod.DescribeConfigsResourceResult,
                name=e.name,
                value=e.value,
                read_only=res.resource_type == RESOURCE_BROKER,
                config_source=e.source,
                is_default=e.source == SOURCE_DEFAULT,
                is_sensitive=False,
                synonyms=tuple(
                    build(mod.DescribeConfigsSynonym, name=n, value=v, source=s)
                    for n, v, s in (e.synonyms if request.include_synonyms else ())
                ),
                config_type=e.type,
                documentation=None,
            )
            for e in entries
        )
        results.append(
            build(
                mod.DescribeConfigsResult,
                error_code=error,
                error_message=message,
                resource_type=res.resource_type,
                resource_name=res.resource_name,
                configs=configs,
            )
        )
    return build(mod.DescribeConfigsResponse, throttle_time=ZERO_MS, results=tuple(results))
