"""Every API the broker serves except ApiVersions: ``api_key -> (min, max, handler)``.

A static table of plain imports: the broker's handler modules
(``logstore/server/handlers/<api>.py``, each with ``API_KEY``, ``MIN_VERSION``,
``MAX_VERSION`` and ``handle``, or an ``API_HANDLERS`` of its own for a family of APIs) and
the group coordinator's (``logstore.server.group.handlers.API_HANDLERS``). A module that
fails to import fails this import, and with it the broker's start: no API silently goes
missing from what ApiVersions advertises.

ApiVersions itself is added by :mod:`logstore.server.apis`: it advertises this table (plus
its own range), so its handler imports this module, and this module cannot import it. The
import graph is one-way: ``apis -> handlers.api_versions -> registry -> handlers``.

Thread-safety: built once at import, read-only afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final

from logstore.server.context import RequestContext
from logstore.server.group import handlers as group_handlers
from logstore.server.handlers import (
    acls,
    alter_configs,
    create_partitions,
    create_topics,
    delete_records,
    delete_topics,
    describe_configs,
    describe_log_dirs,
    describe_transactions,
    fetch,
    incremental_alter_configs,
    init_producer_id,
    list_offsets,
    list_transactions,
    metadata,
    produce,
    sasl,
    scram_credentials,
    transactions,
)

__all__ = ["API_HANDLERS", "Handler"]

# Returns a Response or a Deferred of one (see logstore.server.context).
Handler = Callable[[RequestContext, Any], Any]


def _build() -> dict[int, tuple[int, int, Handler]]:
    table: dict[int, tuple[int, int, Handler]] = {}

    def add(key: int, lo: int, hi: int, fn: Handler, owner: str) -> None:
        if key in table:
            raise RuntimeError(f"api key {key} is registered twice (again by {owner})")
        table[key] = (lo, hi, fn)

    for mod in (
        metadata,
        produce,
        fetch,
        list_offsets,
        create_topics,
        delete_topics,
        describe_configs,
        incremental_alter_configs,
        init_producer_id,
        delete_records,
        alter_configs,
        create_partitions,
        describe_transactions,
        list_transactions,
        describe_log_dirs,
    ):
        add(int(mod.API_KEY), int(mod.MIN_VERSION), int(mod.MAX_VERSION), mod.handle, mod.__name__)
    for family in (transactions, group_handlers, sasl, scram_credentials, acls):
        for key, (lo, hi, fn) in family.API_HANDLERS.items():
            add(int(key), int(lo), int(hi), fn, family.__name__)
    return dict(sorted(table.items()))


API_HANDLERS: Final[Mapping[int, tuple[int, int, Handler]]] = MappingProxyType(_build())
