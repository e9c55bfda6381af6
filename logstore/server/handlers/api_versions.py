"""ApiVersions (key 18), v0-v4: the API keys and version ranges of the registry, exactly.

The registry (:mod:`logstore.server.registry`) holds every other API; this module adds its
own range, and :mod:`logstore.server.apis` serves the same union.

v3+ requests are flexible and carry ``client_software_name/version``; the response header is
always v0 (KIP-511). A client sending a version newer than v4 gets, as from Kafka, a v0
response with ``UNSUPPORTED_VERSION`` and the supported ranges (the reactor produces that
one, because the request itself cannot be parsed: see ``unsupported_version_response``).
"""

from __future__ import annotations

from typing import Any, Final

from kio.schema.api_versions.v0.response import ApiVersion as ApiVersionV0
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsResponseV0
from kio.schema.errors import ErrorCode

from logstore.server import registry
from logstore.server.context import RequestContext
from logstore.server.handlers._util import ZERO_MS, build, response_module

__all__ = ["API_KEY", "MAX_VERSION", "MIN_VERSION", "handle", "unsupported_version_response"]

API_KEY: Final = 18
MIN_VERSION: Final = 0
MAX_VERSION: Final = 4


# What this broker serves: the registry (every other API) and ApiVersions itself, by key.
_RANGES: Final = tuple(
    sorted(
        [(k, lo, hi) for k, (lo, hi, _fn) in registry.API_HANDLERS.items()]
        + [(API_KEY, MIN_VERSION, MAX_VERSION)]
    )
)


def _ranges() -> tuple[tuple[int, int, int], ...]:
    return _RANGES


def handle(ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ctx)
    keys = tuple(
        build(mod.ApiVersion, api_key=k, min_version=lo, max_version=hi) for k, lo, hi in _ranges()
    )
    return build(
        mod.ApiVersionsResponse,
        error_code=ErrorCode.none,
        api_keys=keys,
        throttle_time=ZERO_MS,
    )


def unsupported_version_response() -> Any:
    """The v0 ``UNSUPPORTED_VERSION`` answer to an ApiVersions request of a newer version."""
    keys = tuple(
        build(ApiVersionV0, api_key=k, min_version=lo, max_version=hi) for k, lo, hi in _ranges()
    )
    return build(ApiVersionsResponseV0, error_code=ErrorCode.unsupported_version, api_keys=keys)
