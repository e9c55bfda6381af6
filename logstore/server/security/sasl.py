"""SASL for SASL_PLAINTEXT and SASL_SSL listeners: settings, sessions, the PLAIN mechanism.

Settings (Kafka's keys): ``sasl.enabled.mechanisms`` (broker-wide) or
``listener.name.<listener>.sasl.enabled.mechanisms`` (per listener, listener name in lower
case), a subset of ``PLAIN``, ``SCRAM-SHA-256``, ``SCRAM-SHA-512`` (SCRAM's users:
:mod:`.scram`, managed with AlterUserScramCredentials); Kafka's default (GSSAPI) does not
exist here, so a SASL listener must name its mechanisms. PLAIN's users come from the
listener's JAAS config, ``listener.name.<listener>.plain.sasl.jaas.config``, in Kafka's
syntax::

    org.apache.kafka.common.security.plain.PlainLoginModule required
        username="admin" password="admin-secret" user_admin="admin-secret" user_alice="pw";

(``user_<name>="<password>"`` are the users; ``username``/``password`` are the broker's own
inter-broker login, unused on a single node). ``connections.max.reauth.ms`` (KIP-368) is the
session lifetime given to clients in SaslAuthenticate v1+; a request other than SaslHandshake
and SaslAuthenticate on a session past it closes the connection, as in Kafka.
``connection.failed.authentication.delay.ms`` delays the answer to a failed authentication,
more for repeated failures from one host (doubling per failure within a minute, at most
16 times the delay), so guessing passwords is slow without blocking a handler thread.

Sessions (:class:`SaslSessions`) live per connection id, are dropped when the connection
closes, and are only touched by the handler of that connection's current request (one
request per connection is in flight) and by the close hook: a lock guards the maps.
"""

from __future__ import annotations

import hmac
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from logstore.errors import LoglakeError

__all__ = [
    "MECHANISMS",
    "SaslConfigError",
    "SaslListener",
    "SaslSession",
    "SaslSessions",
    "parse_jaas",
    "parse_plain_users",
    "plain_authenticate",
    "sasl_settings",
]

MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_JAAS_OPTION = re.compile(r'([A-Za-z0-9_.\-]+)\s*=\s*"((?:[^"\\]|\\.)*)"')
_JAAS_HEAD = re.compile(r"^\s*([A-Za-z0-9_.$]+)\s+(required|requisite|sufficient|optional)\b")
PLAIN_MODULE: Final = "org.apache.kafka.common.security.plain.PlainLoginModule"


class SaslConfigError(LoglakeError):
    """A SASL key of a listener is missing or malformed."""


def parse_jaas(text: str, *, key: str) -> tuple[str, dict[str, str]]:
    """One JAAS entry in Kafka's syntax, ``<LoginModule class> required k="v" ...;``: the
    module's class name and its options (quotes and backslash escapes removed). Brokers read
    PLAIN's users from it, clients (:mod:`logstore.tools.client_config`) their login."""
    head = _JAAS_HEAD.match(text)
    if head is None:
        raise SaslConfigError(f"{key}: expected '<LoginModule class> required name=\"value\" ...;'")
    body = text[head.end() :].strip()
    if not body.endswith(";"):
        raise SaslConfigError(f"{key}: the JAAS entry must end with ';'")
    body = body[:-1]
    options: dict[str, str] = {}
    pos = 0
    for m in _JAAS_OPTION.finditer(body):
        if body[pos : m.start()].strip():
            raise SaslConfigError(f"{key}: cannot parse {body[pos : m.start()].strip()!r}")
        pos = m.end()
        options[m.group(1)] = re.sub(r"\\(.)", r"\1", m.group(2))
    if body[pos:].strip():
        raise SaslConfigError(f"{key}: cannot parse {body[pos:].strip()!r}")
    return head.group(1), options


def parse_plain_users(text: str, *, key: str) -> dict[str, str]:
    """``user_<name>="<password>"`` options of a PlainLoginModule JAAS entry."""
    head = _JAAS_HEAD.match(text)
    if head is None or head.group(1) != PLAIN_MODULE:
        raise SaslConfigError(
            f"{key}: expected '{PLAIN_MODULE} required user_<name>=\"<password>\" ...;'"
        )
    _module, options = parse_jaas(text, key=key)
    return {
        name[5:]: value
        for name, value in options.items()
        if name.startswith("user_") and len(name) > 5
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class SaslListener:
    """One SASL listener's validated settings."""

    listener: str
    mechanisms: tuple[str, ...]
    plain_users: Mapping[str, str] = field(default_factory=dict)


def _get(props: Mapping[str, str], listener: str, key: str) -> tuple[str, str] | None:
    for full in (f"listener.name.{listener.lower()}.{key}", f"listener.name.{listener}.{key}"):
        if full in props:
            return full, props[full]
    return None


def sasl_settings(props: Mapping[str, str], listener: str) -> SaslListener:
    """Validate the SASL settings of ``listener`` from Kafka's keys."""
    found = _get(props, listener, "sasl.enabled.mechanisms")
    if found is None and "sasl.enabled.mechanisms" in props:
        found = ("sasl.enabled.mechanisms", props["sasl.enabled.mechanisms"])
    if found is None:
        raise SaslConfigError(
            f"listener {listener} uses SASL: set sasl.enabled.mechanisms (or"
            f" listener.name.{listener.lower()}.sasl.enabled.mechanisms) to a subset of"
            f" {MECHANISMS} (Kafka's default GSSAPI is not supported)"
        )
    mechs = tuple(m.strip() for m in found[1].split(",") if m.strip())
    bad = [m for m in mechs if m not in MECHANISMS]
    if bad or not mechs:
        raise SaslConfigError(f"{found[0]}={found[1]!r}: expected a subset of {MECHANISMS}")
    users: dict[str, str] = {}
    if "PLAIN" in mechs:
        jaas = _get(props, listener, "plain.sasl.jaas.config")
        if jaas is None:
            raise SaslConfigError(
                f"listener {listener} enables PLAIN: set"
                f" listener.name.{listener.lower()}.plain.sasl.jaas.config"
                f' ({PLAIN_MODULE} required user_<name>="<password>";)'
            )
        users = parse_plain_users(jaas[1], key=jaas[0])
        if not users:
            raise SaslConfigError(f'{jaas[0]}: no user_<name>="<password>" option')
    return SaslListener(listener=listener, mechanisms=mechs, plain_users=users)


def plain_authenticate(token: bytes, users: Mapping[str, str]) -> str | None:
    """RFC 4616 ``[authzid] NUL authcid NUL passwd``: the user name, or None if refused.

    An authorization id other than empty or the user itself is refused (Kafka's
    PlainSaslServer does the same); the password compare takes constant time.
    """
    parts = token.split(b"\x00")
    if len(parts) != 3:
        return None
    try:
        authzid, user, password = (p.decode("utf-8") for p in parts)
    except UnicodeDecodeError:
        return None
    if not user or (authzid and authzid != user):
        return None
    want = users.get(user)
    # compare against something even for an unknown user: no timing hint of who exists
    ok = hmac.compare_digest(password.encode(), (want if want is not None else "\x00").encode())
    return user if ok and want is not None else None


@dataclass(slots=True)
class SaslSession:
    """One connection's SASL state: the mechanism chosen, the principal once authenticated
    and when the session expires (monotonic seconds; None: never)."""

    mechanism: str | None = None
    principal: str | None = None
    expires_at: float | None = None
    exchange: Any = None  # a SCRAM exchange between its two messages
    raw: bool = False  # after SaslHandshake v0: tokens as bare frames (no Kafka header)

    def valid(self, now: float) -> bool:
        return self.principal is not None and (self.expires_at is None or now < self.expires_at)


class SaslSessions:
    """Per-connection sessions and per-host failure counts (thread-safe)."""

    def __init__(self, *, failure_delay_ms: int) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[str, SaslSession] = {}
        self._failures: dict[str, tuple[int, float]] = {}  # host -> (count, last failure)
        self._delay_s = failure_delay_ms / 1000.0

    def get(self, connection_id: str) -> SaslSession:
        with self._lock:
            s = self._sessions.get(connection_id)
            if s is None:
                s = self._sessions[connection_id] = SaslSession()
            return s

    def peek(self, connection_id: str) -> SaslSession | None:
        with self._lock:
            return self._sessions.get(connection_id)

    def authenticated(self, connection_id: str) -> bool:
        """True once the connection has authenticated (expired or not: the dispatcher
        closes an expired session at its next request)."""
        with self._lock:
            s = self._sessions.get(connection_id)
            return s is not None and s.principal is not None

    def drop(self, connection_id: str) -> None:
        with self._lock:
            self._sessions.pop(connection_id, None)

    def failed(self, host: str) -> float:
        """Count a failed authentication from ``host``; seconds to delay the answer."""
        now = time.monotonic()
        with self._lock:
            count, last = self._failures.get(host, (0, 0.0))
            count = count + 1 if now - last < 60.0 else 1
            self._failures[host] = (count, now)
            if len(self._failures) > 10_000:  # bounded: forget the oldest sources
                for h, _ in sorted(self._failures.items(), key=lambda kv: kv[1][1])[:1000]:
                    del self._failures[h]
        return self._delay_s * float(min(16, 1 << (count - 1)))

    def succeeded(self, host: str) -> None:
        with self._lock:
            self._failures.pop(host, None)
