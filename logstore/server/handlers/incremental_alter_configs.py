"""IncrementalAlterConfigs (key 44), v0-v1: change topic-level config overrides.

Operations (Kafka's ``AlterConfigOp.OpType``): SET 0, DELETE 1 (back to the broker
default), APPEND 2 / SUBTRACT 3 (list keys: ``cleanup.policy``). The resulting overrides
are validated as a whole, persisted atomically in every log dir
(``<log_dir>/topic-configs/<topic>.properties``) and applied to the topic's logs. Broker
resources are static here: ``INVALID_REQUEST``. ``validate_only`` checks without applying.
"""

from __future__ import annotations

from typing import Any, Final

from kio.schema.errors import ErrorCode

from logstore.errors import InvalidConfigError
from logstore.server.context import RequestContext
from logstore.server.handlers._util import ZERO_MS, build, response_module
from logstore.server.handlers.describe_configs import (
    RESOURCE_BROKER,
    RESOURCE_TOPIC,
    validate_topic_configs,
)

__all__ = ["API_KEY", "MAX_VERSION", "MIN_VERSION", "handle"]

API_KEY: Final = 44
MIN_VERSION: Final = 0
MAX_VERSION: Final = 1

_SET, _DELETE, _APPEND, _SUBTRACT = 0, 1, 2, 3
_LIST_KEYS: Final = frozenset({"cleanup.policy"})


def _apply(current: dict[str, str], ops: Any, defaults: dict[str, str]) -> dict[str, str]:
    props = dict(current)
    for op in ops:
        key = op.name
        kind = int(op.config_operation)
        if kind == _SET:
            if op.value is None:
                raise InvalidConfigError(f"{key}: SET needs a value")
            props[key] = op.value
        elif kind == _DELETE:
            props.pop(key, None)
        elif kind in (_APPEND, _SUBTRACT):
            if key not in _LIST_KEYS:
                raise InvalidConfigError(f"{key} is not a list config: APPEND/SUBTRACT invalid")
            base = props.get(key, defaults.get(key, ""))
            items = [p.strip() for p in base.split(",") if p.strip()]
            values = [p.strip() for p in (op.value or "").split(",") if p.strip()]
            if kind == _APPEND:
                items += [v for v in values if v not in items]
            else:
                items = [i for i in items if i not in values]
            props[key] = ",".join(items)
        else:
            raise InvalidConfigError(f"{key}: unknown operation {kind}")
    return props


def handle(ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ctx)
    broker = ctx.broker
    results = []
    for res in request.resources:
        error = ErrorCode.none
        message = None
        if res.resource_type == RESOURCE_TOPIC:
            topic = res.resource_name
            if broker.partition_count(topic) is None:
                error, message = ErrorCode.unknown_topic_or_partition, f"unknown topic {topic!r}"
            else:
                try:
                    props = _apply(
                        broker.topic_overrides.get(topic, {}),
                        res.configs,
                        broker.default_log_config.to_properties(),
                    )
                    validate_topic_configs(props)
                    if not request.validate_only:
                        broker.set_topic_overrides(topic, props)
                except InvalidConfigError as exc:
                    error, message = ErrorCode.invalid_config, exc.message
        elif res.resource_type == RESOURCE_BROKER:
            error, message = ErrorCode.invalid_request, "broker configs are static"
        else:
            error = ErrorCode.invalid_request
            message = f"unsupported resource type {res.resource_type}"
        results.append(
            build(
                mod.AlterConfigsResourceResponse,
                error_code=error,
                error_message=message,
                resource_type=res.resource_type,
                resource_name=res.resource_name,
            )
        )
    return build(
        mod.IncrementalAlterConfigsResponse, throttle_time=ZERO_MS, responses=tuple(results)
    )
