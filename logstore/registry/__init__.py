"""A Confluent-compatible schema registry served by the broker (``schema.registry.listeners``).

:func:`start_registry` replays ``_schemas`` (created when missing: 1 partition,
``cleanup.policy=compact``) into a :class:`~logstore.registry.store.SchemaStore` and serves
Confluent's REST API on a stdlib HTTP server (:mod:`logstore.registry.http`). Writes go through
the broker's own partition (``Partition.append_as_coordinator``), so consumers of ``_schemas``
see them at once and the log is recovered like any other on restart.
"""

from __future__ import annotations

import time
from typing import Any

from logstore.protocol.records import build_batch
from logstore.registry.http import RegistryServer
from logstore.registry.store import SCHEMAS_TOPIC, SchemaStore
from logstore.server.internal_log import CompactedInternalLog, iter_records

__all__ = ["SCHEMAS_TOPIC", "RegistryServer", "SchemaStore", "start_registry"]


def start_registry(broker: Any, *, host: str, port: int) -> tuple[RegistryServer, str, int]:
    """Load ``_schemas`` and serve the registry on ``host:port``; (server, bound host, port).

    Raises ``OSError`` when the address cannot be bound, the storage errors when ``_schemas``
    cannot be read."""
    topic = CompactedInternalLog(
        broker.log_manager,
        SCHEMAS_TOPIC,
        segment_bytes=broker.config.get_int("log.segment.bytes"),
        snapshot_min_records=1 << 62,  # never: every record stays (ids are not reused)
    )
    log_ = topic.log(0)
    broker.topic_overrides.setdefault(SCHEMAS_TOPIC, {})["cleanup.policy"] = "compact"

    def append(records: list[tuple[bytes, bytes | None]]) -> None:
        now = int(time.time() * 1000)
        buf = build_batch([(k, v, (), now) for k, v in records], base_timestamp=now)
        part = broker.partition(SCHEMAS_TOPIC, 0)
        if part is None:
            raise OSError(f"{SCHEMAS_TOPIC}-0 is gone")
        part.append_as_coordinator(buf, now_ms=now)
        broker.purgatory.check_and_complete((SCHEMAS_TOPIC, 0))

    store = SchemaStore(append=append)
    store.load((rec.key, rec.value) for header, rec in iter_records(log_) if not header.is_control)
    server = RegistryServer(store)
    bound_host, bound_port = server.start(host, port)
    return server, bound_host, bound_port
