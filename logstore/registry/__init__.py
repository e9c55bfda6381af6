"""A Confluent-compatible schema registry served by the broker (``schema.registry.listeners``).

:func:`start_registry` replays ``_schemas`` (created when missing: 1 partition,
``cleanup.policy=compact``) into a :class:`~logstore.registry.store.SchemaStore` and serves
Confluent's REST API on a stdlib HTTP server (:mod:`logstore.registry.http`). Writes go through
the broker's own partition (``Partition.append_as_coordinator``), so consumers of ``_schemas``
see them at once and the log is recovered like any other on restart.

Security, from the broker's keys: ``schema.registry.listeners=https://...`` serves over TLS
(``schema.registry.ssl.*`` over the broker's ``ssl.*``: Kafka's PEM keys, ``client.auth`` for
mTLS); ``schema.registry.authentication.method=BASIC`` asks every request for HTTP basic auth
of a broker user (:func:`broker_users`): a PLAIN user of any SASL listener's JAAS config, or a
SCRAM user, whose password is checked by recomputing the salted credential the broker stores
(never stored in clear; a SCRAM check costs the credential's PBKDF2 iterations, a few ms, so a
verified password is remembered per credential for :data:`AUTH_CACHE_S`).
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from logstore.protocol.records import build_batch
from logstore.registry.http import RegistryServer
from logstore.registry.store import SCHEMAS_TOPIC, SchemaStore
from logstore.server.internal_log import CompactedInternalLog, iter_records
from logstore.server.security.scram import (
    MECHANISM_IDS,
    ScramCredential,
    ScramCredentials,
    verify_password,
)
from logstore.server.security.tls import build_server_context

__all__ = [
    "AUTH_CACHE_S",
    "SCHEMAS_TOPIC",
    "RegistryServer",
    "SchemaStore",
    "broker_users",
    "start_registry",
]

AUTH_CACHE_S: Final = 60.0


def broker_users(
    plain_users: Iterable[Mapping[str, str]], scram: ScramCredentials
) -> Callable[[str, str], bool]:
    """``authenticate(user, password)`` against the broker's users: ``plain_users`` (the
    PLAIN users of each SASL listener) first, then every SCRAM credential of the user (a
    password matching any of them). Thread-safe. A SCRAM check recomputes the salted password
    (PBKDF2, the credential's iterations); a success is remembered for :data:`AUTH_CACHE_S`
    against that very credential object, so a changed or deleted credential is checked anew."""
    plain = [dict(users) for users in plain_users]
    lock = threading.Lock()
    verified: dict[tuple[str, bytes], tuple[ScramCredential, float]] = {}

    def authenticate(user: str, password: str) -> bool:
        for users in plain:
            want = users.get(user)
            if want is not None and hmac.compare_digest(want.encode(), password.encode()):
                return True
        digest = hashlib.sha256(password.encode()).digest()
        now = time.monotonic()
        for mechanism in MECHANISM_IDS.values():
            cred = scram.get(user, mechanism)
            if cred is None:
                continue
            with lock:
                hit = verified.get((user, digest))
            if hit is not None and hit[0] is cred and now - hit[1] < AUTH_CACHE_S:
                return True
            if verify_password(mechanism, password, cred):
                with lock:
                    if len(verified) > 10_000:
                        verified.clear()
                    verified[(user, digest)] = (cred, now)
                return True
        return False

    return authenticate


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
    config = broker.config
    tls = build_server_context(config.registry_tls) if config.registry_tls is not None else None
    authenticate = None
    if config.get_str("schema.registry.authentication.method") == "BASIC":
        authenticate = broker_users(
            [s.plain_users for s in config.sasl.values()], broker.scram_credentials
        )
    server = RegistryServer(store, tls=tls, authenticate=authenticate)
    bound_host, bound_port = server.start(host, port)
    return server, bound_host, bound_port
