"""AlterConfigs (key 33), v0-v2: replace a topic's config overrides (the non-incremental API).

Kafka's semantics: the configs in the request become the topic's complete set of overrides
(every override not named goes back to the broker default; an entry with a null value is
left out). Validation is the one CreateTopics and IncrementalAlterConfigs use
(``describe_configs.validate_topic_configs``: known topic keys only, values parsed and range
checked as a whole): ``INVALID_CONFIG``. A key named twice in one resource:
``INVALID_REQUEST`` (Kafka: "duplicate config keys"). Unknown topic:
``UNKNOWN_TOPIC_OR_PARTITION``. Broker resources are static here: ``INVALID_REQUEST``.
``validate_only`` checks without applying. The overrides are persisted atomically in every
log dir and applied to the topic's logs (``Broker.set_topic_overrides``), as by
IncrementalAlterConfigs.
"""

from __future__ import annotations

from typing import Any, Final

from kio.schema.errors import ErrorCode

from logstore.server.context import RequestContext
from logstore.server.handlers._alter import resource_results
from logstore.server.handlers._util import ZERO_MS, build, response_module
from logstore.server.handlers.describe_configs import validate_topic_configs

__all__ = ["API_KEY", "MAX_VERSION", "MIN_VERSION", "handle"]

API_KEY: Final = 33
MIN_VERSION: Final = 0
MAX_VERSION: Final = 2


def handle(ctx: RequestContext, request: Any) -> Any:
    broker = ctx.broker
    validate_only = bool(request.validate_only)

    def alter_topic(topic: str, configs: Any) -> tuple[ErrorCode, str | None]:
        names = [c.name for c in configs]
        dups = sorted({n for n in names if names.count(n) > 1})
        if dups:
            return ErrorCode.invalid_request, f"duplicate config keys: {', '.join(dups)}"
        props = {c.name: c.value for c in configs if c.value is not None}
        validate_topic_configs(props)
        if not validate_only:
            broker.set_topic_overrides(topic, props)
        return ErrorCode.none, None

    mod = response_module(ctx)
    results = resource_results(ctx, mod, request.resources, alter_topic)
    return build(mod.AlterConfigsResponse, throttle_time=ZERO_MS, responses=results)
