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
from logstore.server.handlers._alter import resource_results
from logstore.server.handlers._util import ZERO_MS, build, response_module
from logstore.server.handlers.describe_configs import validate_topic_configs
from logstore.storage.topic_config_defs import TOPIC_CONFIGS

__all__ = ["API_KEY", "MAX_VERSION", "MIN_VERSION", "handle"]

API_KEY: Final = 44
MIN_VERSION: Final = 0
MAX_VERSION: Final = 1

_SET, _DELETE, _APPEND, _SUBTRACT = 0, 1, 2, 3
_LIST_KEYS: Final = frozenset(k for k, d in TOPIC_CONFIGS.items() if d.type == "list")


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
    broker = ctx.broker
    validate_only = bool(request.validate_only)

    def alter_topic(topic: str, ops: Any) -> tuple[ErrorCode, str | None]:
        props = _apply(
            broker.topic_overrides.get(topic, {}), ops, broker.default_log_config.to_properties()
        )
        validate_topic_configs(props)
        if not validate_only:
            broker.set_topic_overrides(topic, props)
        return ErrorCode.none, None

    mod = response_module(ctx)
    results = resource_results(ctx, mod, request.resources, alter_topic)
    return build(mod.IncrementalAlterConfigsResponse, throttle_time=ZERO_MS, responses=results)
