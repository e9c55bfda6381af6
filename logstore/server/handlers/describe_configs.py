"""DescribeConfigs (key 32), v1-v4: topic configs (overrides + broker defaults) and broker configs.

Resource types (Kafka's ``ConfigResource.Type``): TOPIC = 2, BROKER = 4. Config sources:
DYNAMIC_TOPIC_CONFIG = 1 (a persisted override), STATIC_BROKER_CONFIG = 4 (set in the
broker's properties), DEFAULT_CONFIG = 5. ``configuration_keys`` null = every key.
Topic keys are every key of Kafka 4.x's LogConfig plus loglake's
(``logstore.storage.topic_config_defs.TOPIC_CONFIGS``, no-ops included), typed as Kafka types
them (KIP-569 ``config_type``); with ``include_synonyms`` a topic key lists its override, the
broker keys set behind it (``log.roll.ms`` before ``log.roll.hours``) and the default, most
specific first.

Authorization (with ``authorizer.class.name``): DESCRIBE_CONFIGS on the topic
(``TOPIC_AUTHORIZATION_FAILED``) or, for a broker, on the cluster
(``CLUSTER_AUTHORIZATION_FAILED``), as Kafka.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from kio.schema.errors import ErrorCode

from logstore.server.config import BROKER_CONFIG_DEFS
from logstore.server.context import RequestContext
from logstore.server.handlers._util import ZERO_MS, build, response_module
from logstore.server.security.acls import AclOperation, ResourceType
from logstore.server.security.authorizer import authorized, authorized_cluster
from logstore.storage.config import LogConfig, format_value
from logstore.storage.topic_config_defs import (
    TOPIC_CONFIGS,
    parse_topic_value,
    validate_topic_properties,
)

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
_TYPES: Final = {"bool": 1, "string": 2, "int": 3, "long": 5, "double": 6, "list": 7}


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    name: str
    value: str | None
    source: int
    type: int
    synonyms: tuple[tuple[str, str | None, int], ...]
    doc: str | None = None


def validate_topic_configs(props: Mapping[str, str]) -> LogConfig:
    """Raise InvalidConfigError for an unknown topic key (naming the nearest known one) or a
    value breaking its key's rule (Kafka's type, range or enum); else the config."""
    validate_topic_properties(props)
    return LogConfig.from_properties(props)


def topic_config_entries(broker: Any, topic: str, *, pending: bool = False) -> list[ConfigEntry]:
    """Every topic-level key of ``topic`` (the whole registry, no-ops included) with its
    effective value, source and synonyms (override, broker keys set, default; most
    specific first, as Kafka lists them)."""
    overrides: dict[str, str] = {} if pending else broker.topic_overrides.get(topic, {})
    defaults = broker.default_log_config.to_properties()
    config = broker.config
    out = []
    for key, d in TOPIC_CONFIGS.items():
        synonyms: list[tuple[str, str | None, int]] = []
        if key in overrides:
            synonyms.append((key, overrides[key], SOURCE_DYNAMIC_TOPIC))
        static = [b for b in d.synonyms if b in config.originals]
        synonyms += [(b, config.originals[b], SOURCE_STATIC_BROKER) for b in static]
        default = d.default
        if key in defaults:
            default = defaults[key]  # the broker's effective default (units applied)
        elif static:
            default = format_value(parse_topic_value(key, config.originals[static[0]]))
        synonyms.append((d.synonyms[0] if d.synonyms else key, d.default, SOURCE_DEFAULT))
        _name, value, source = synonyms[0]
        if source != SOURCE_DYNAMIC_TOPIC:
            value = default
        doc = f"{d.doc} (loglake: {d.status})"
        out.append(ConfigEntry(key, value, source, d.type_id, tuple(synonyms), doc))
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
            ConfigEntry(name, value, source, _TYPES.get(d.type, 2), ((name, value, source),), d.doc)
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
        # Kafka: DESCRIBE_CONFIGS on the topic / the cluster (for a broker)
        if res.resource_type == RESOURCE_TOPIC and not authorized(
            ctx, AclOperation.DESCRIBE_CONFIGS, ResourceType.TOPIC, res.resource_name
        ):
            error = ErrorCode.topic_authorization_failed
        elif res.resource_type == RESOURCE_BROKER and not authorized_cluster(
            ctx, AclOperation.DESCRIBE_CONFIGS
        ):
            error = ErrorCode.cluster_authorization_failed
        elif res.resource_type == RESOURCE_TOPIC:
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
                documentation=e.doc if getattr(request, "include_documentation", False) else None,
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
