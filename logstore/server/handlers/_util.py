"""Helpers shared by the handlers: version-independent construction of kio responses.

kio generates one dataclass per API *version*, and fields come and go between versions
(``throttle_time`` from v1, ``log_start_offset`` from Produce v5 ...). Handlers describe a
response once with every field they know and :func:`build` keeps the ones the version has;
nested classes are looked up by name in the same version's module with :func:`nested`.
"""

from __future__ import annotations

import datetime
import functools
from dataclasses import fields
from types import ModuleType
from typing import Any

from kio.index import load_payload_module
from kio.static.constants import EntityType

from logstore.server.context import RequestContext

__all__ = ["ZERO_MS", "build", "field_names", "response_module"]

ZERO_MS = datetime.timedelta(0)


_FIELD_NAMES: dict[type[Any], frozenset[str]] = {}


def field_names(cls: type[Any]) -> frozenset[str]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = frozenset(f.name for f in fields(cls))
    return names


def build(cls: type[Any], **values: Any) -> Any:
    """``cls(**values)`` keeping only the fields ``cls`` (one kio version) declares."""
    names = field_names(cls)
    return cls(**{k: v for k, v in values.items() if k in names})


@functools.cache
def _module(api_key: int, version: int) -> ModuleType:
    return load_payload_module(api_key, version, EntityType.response)


def response_module(ctx: RequestContext) -> ModuleType:
    """The kio response module of the request's API and version."""
    return _module(ctx.api_key, ctx.api_version)
