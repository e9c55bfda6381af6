"""Broker configuration with Kafka's own key names (``server.properties`` style).

The file is Java properties text: ``key=value`` or ``key: value`` per line, ``#``/``!``
comments, a trailing backslash continues a line. ``--override key=value`` wins over the
file. Every key loglake reads must hold a value valid for its type and range, otherwise
:class:`ConfigError` names the key, the value and what was expected — at start-up, never
later. Keys Kafka accepts but which make no sense for a single-node broker (replication)
are still known and validated, with only the values that are true here allowed. Kafka's
other broker keys (:mod:`logstore.server.kafka_keys`: the KRaft quorum, share groups, ...)
are accepted and logged once as ignored, so that Kafka's stock ``server.properties`` starts
the broker as it is; any other key is refused, naming the nearest known one.

Listeners: ``listeners`` may hold KRaft controller listeners (named in
``controller.listener.names``), accepted and never opened — a single node is its own
controller — besides one or more client listeners, each on its own port, whose security protocol
(``listener.security.protocol.map``) is PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL
(``ssl.*`` keys: :mod:`logstore.server.security.tls`; SASL: :mod:`.security.sasl`).

Broker-wide ``log.*`` keys are the defaults of the topic-level keys (``log.segment.bytes``
-> ``segment.bytes`` ...); :meth:`BrokerConfig.topic_defaults` returns them under the
topic names, which is what ``LogConfig.from_properties`` and DescribeConfigs use.

The keys themselves (types, defaults, ranges, docs) are the table of
:mod:`logstore.server.config_defs`, re-exported here.

Thread-safety: immutable after construction.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from logstore.errors import InvalidConfigError
from logstore.server.config_defs import (
    BROKER_CONFIG_DEFS,
    INT_MAX,
    LONG_MAX,
    TOPIC_KEY_FOR_BROKER_KEY,
    ConfigDef,
)
from logstore.server.kafka_keys import is_ignored_kafka_key
from logstore.server.security.sasl import SaslConfigError, SaslListener, sasl_settings
from logstore.server.security.tls import SSL_KEYS, TlsConfigError, TlsSettings, tls_settings
from logstore.storage.config import BROKER_KEYS, LogConfig
from logstore.storage.properties import parse_properties as _parse_java_properties
from logstore.storage.topic_config_defs import nearest_key, parse_topic_value

__all__ = [
    "BROKER_CONFIG_DEFS",
    "REGISTRY_SSL_KEYS",
    "SUPPORTED_PROTOCOLS",
    "TOPIC_KEY_FOR_BROKER_KEY",
    "BrokerConfig",
    "ConfigDef",
    "ConfigError",
    "Listener",
    "parse_properties",
]


_log = logging.getLogger(__name__)


# Security protocols a client listener may use.
SUPPORTED_PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


class ConfigError(InvalidConfigError):
    """An unknown broker configuration key or an invalid value (an :class:`InvalidConfigError`:
    one branch of the tree for every bad setting, so a job reading the broker's file exits 2)."""


_LISTENER = re.compile(
    r"^(?:(?P<name>[A-Za-z_][A-Za-z0-9_]*)://)(?P<host>\[[^\]]*\]|[^:]*):(?P<port>\d+)$"
)


@dataclass(frozen=True, slots=True)
class Listener:
    name: str
    host: str
    port: int


def parse_properties(text: str, *, source: str = "<properties>") -> dict[str, str]:
    """Java properties text -> dict: ``java.util.Properties.load``'s rules
    (:mod:`logstore.storage.properties`, the parser of topic configs too), then each value
    trimmed as Kafka's ``ConfigDef`` trims what it parses. :class:`ConfigError` names
    ``source`` for the one thing Java refuses, a malformed ``\\uXXXX`` escape."""
    try:
        props = _parse_java_properties(text, source=source)
    except InvalidConfigError as exc:
        raise ConfigError(exc.message) from exc
    return {k: v.strip(_JAVA_TRIM) for k, v in props.items()}


# What Java's String.trim() removes: every char up to and including the space.
_JAVA_TRIM: Final = "".join(map(chr, range(0x21)))


def _parse_value(d: ConfigDef, raw: str) -> object:
    if d.type in ("int", "long"):
        try:
            value = int(raw.strip())
        except ValueError:
            raise ConfigError(f"{d.name}={raw!r}: expected an integer") from None
        hi = INT_MAX if d.type == "int" else LONG_MAX
        if d.high is not None:
            hi = min(hi, d.high)
        lo = -INT_MAX - 1 if d.type == "int" else -LONG_MAX - 1
        if d.low is not None:
            lo = max(lo, d.low)
        if not lo <= value <= hi:
            raise ConfigError(f"{d.name}={raw!r}: expected a value in [{lo}, {hi}]")
        return value
    if d.type == "double":
        try:
            number = float(raw.strip())
        except ValueError:
            raise ConfigError(f"{d.name}={raw!r}: expected a number") from None
        if math.isnan(number):
            raise ConfigError(f"{d.name}={raw!r}: expected a number")
        return number
    if d.type == "bool":
        v = raw.strip().lower()
        if v not in ("true", "false"):
            raise ConfigError(f"{d.name}={raw!r}: expected true or false")
        return v == "true"
    if d.type == "list":
        items = [s.strip() for s in raw.split(",") if s.strip()]
        if d.choices is not None:
            for item in items:
                if item not in d.choices:
                    raise ConfigError(f"{d.name}={raw!r}: {item!r} is not one of {d.choices}")
        return items
    value_s = raw.strip()
    if d.choices is not None and value_s not in d.choices:
        raise ConfigError(f"{d.name}={raw!r}: expected one of {d.choices}")
    return value_s


def _parse_listener(text: str, key: str) -> Listener:
    m = _LISTENER.match(text)
    if m is None:
        raise ConfigError(f"{key}={text!r}: expected PLAINTEXT://host:port (NAME://host:port)")
    port = int(m.group("port"))
    if port > 65535:
        raise ConfigError(f"{key}={text!r}: port {port} is out of range")
    host = m.group("host").strip("[]")
    return Listener(m.group("name"), host, port)


def _parse_metrics_listener(text: str, key: str = "metrics.listeners") -> Listener:
    m = _LISTENER.match(text)
    if m is None or m.group("name").lower() != "http":
        raise ConfigError(f"{key}={text!r}: expected http://host:port")
    port = int(m.group("port"))
    if port > 65535:
        raise ConfigError(f"{key}={text!r}: port {port} is out of range")
    return Listener("http", m.group("host").strip("[]") or "0.0.0.0", port)


def _unknown_key(key: str) -> str:
    near = nearest_key(key, tuple(BROKER_CONFIG_DEFS))
    return f"{key!r} (did you mean {near!r}?)" if near else repr(key)


def _check_topic_default(key: str, raw: str) -> None:
    """A broker key behind a topic key (``log.cleaner.min.cleanable.ratio``...) obeys the
    topic key's rule too (Kafka validates both with one definition)."""
    topic_key, mult = BROKER_KEYS[key]
    if mult != 1:
        return  # a unit-scaled key (hours, minutes): its own integer range is the rule
    try:
        parse_topic_value(topic_key, raw)
    except InvalidConfigError as exc:
        rule = exc.message.split(":", 1)[-1].strip()
        raise ConfigError(f"{key}={raw!r}: {rule}") from None


# loglake's own keys are named as Kafka names its keys (dotted lower-case words, the subsystem
# first, the unit last: `log.retention.lake.max.ms`, `metrics.listeners`); conf/broker.properties
# marks each "loglake:". A key renamed to follow that style is still read under its old name.
RENAMED_KEYS: Final[dict[str, str]] = {
    "loglake.request.read.timeout.ms": "socket.request.read.timeout.ms",
}


def _renamed(props: Mapping[str, str]) -> dict[str, str]:
    """``props`` with old key names (:data:`RENAMED_KEYS`) under their new names, each
    named once in the log; both names at once is an error (which one was meant?)."""
    out = dict(props)
    for old, new in RENAMED_KEYS.items():
        if old not in out:
            continue
        if new in out:
            raise ConfigError(f"{old} and {new} are both set: {old} is the old name of {new}")
        out[new] = out.pop(old)
        _log.warning("%s is now named %s; please rename it", old, new)
    return out


# The schema registry's own TLS keys (schema.registry.ssl.<Kafka's ssl key>), not shown by
# DescribeConfigs (they may hold a key password or PEM text).
_REGISTRY_SSL: Final = "schema.registry.ssl."
REGISTRY_SSL_KEYS: Final = frozenset(
    _REGISTRY_SSL + k for k in SSL_KEYS if k != "principal.mapping.rules"
)


class BrokerConfig:
    """Validated broker configuration; typed accessors for the keys the broker reads.

    ``originals`` are the keys as given (file then overrides); ``values`` every known key
    with its parsed value or default (``None`` where Kafka's default is null).
    """

    def __init__(self, props: Mapping[str, str]) -> None:
        props = _renamed(props)
        unknown = [k for k in props if k not in BROKER_CONFIG_DEFS and k not in REGISTRY_SSL_KEYS]
        refused = sorted(k for k in unknown if not is_ignored_kafka_key(k))
        if refused:
            raise ConfigError(
                f"unknown configuration key(s): {', '.join(map(_unknown_key, refused))}"
                " (see conf/broker.properties for the supported keys)"
            )
        self.originals: dict[str, str] = dict(props)
        self.values: dict[str, object] = {}
        for name, d in BROKER_CONFIG_DEFS.items():
            raw = props.get(name, d.default)
            self.values[name] = None if raw is None else _parse_value(d, raw)
            if raw is not None and name in BROKER_KEYS:
                _check_topic_default(name, raw)
        broker_id = self.values["broker.id"]
        if broker_id is not None and "node.id" in props and broker_id != self.values["node.id"]:
            raise ConfigError(f"broker.id={broker_id} and node.id={self.values['node.id']} differ")
        self._set_listeners()
        self._set_registry()
        # Kafka's keys that mean nothing on this broker: accepted, named once at start-up
        # (the ssl.* keys of TLS listeners are read by logstore.server.security.tls)
        self.ignored: list[str] = sorted(k for k in unknown if not self._tls_key(k))
        if self.ignored:
            _log.info(
                "ignoring Kafka broker keys loglake does not use: %s", ", ".join(self.ignored)
            )
        metrics = self.get_str("metrics.listeners")
        self.metrics_listener: Listener | None = (
            _parse_metrics_listener(metrics) if metrics else None
        )
        dirs = self.values["log.dirs"]
        if dirs is None:
            self.log_dirs = [Path(self.get_str("log.dir"))]
        else:
            self.log_dirs = [Path(p) for p in self._list("log.dirs")]
        if not self.log_dirs:
            raise ConfigError("log.dirs is empty")
        if not self._list("log.cleanup.policy"):
            raise ConfigError("log.cleanup.policy is empty")

    @classmethod
    def load(cls, path: str | Path | None, *, overrides: Iterable[str] = ()) -> BrokerConfig:
        """Read ``path`` (None: defaults only) and apply ``key=value`` overrides."""
        props: dict[str, str] = {}
        if path is not None:
            p = Path(path)
            try:
                text = p.read_text(encoding="utf-8")
            except OSError as exc:
                raise ConfigError(f"cannot read config file: {exc.strerror}", path=str(p)) from exc
            props.update(parse_properties(text, source=str(p)))
        for item in overrides:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ConfigError(f"--override {item!r}: expected key=value")
            props[key.strip()] = value.strip()
        return cls(props)

    def _list(self, key: str) -> list[str]:
        v = self.values[key]
        return list(v) if isinstance(v, list) else []

    def get_int(self, key: str) -> int:
        v = self.values[key]
        if not isinstance(v, int) or isinstance(v, bool):
            raise ConfigError(f"{key} has no integer value")
        return v

    def get_optional_int(self, key: str) -> int | None:
        v = self.values[key]
        return None if v is None else self.get_int(key)

    def get_bool(self, key: str) -> bool:
        v = self.values[key]
        if not isinstance(v, bool):
            raise ConfigError(f"{key} has no boolean value")
        return v

    def get_str(self, key: str) -> str:
        v = self.values[key]
        if isinstance(v, list):
            return ",".join(v)
        if not isinstance(v, str):
            raise ConfigError(f"{key} has no string value")
        return v

    @property
    def node_id(self) -> int:
        return self.get_int("node.id")

    @property
    def retention_ms(self) -> int:
        for key, factor in (
            ("log.retention.ms", 1),
            ("log.retention.minutes", 60_000),
            ("log.retention.hours", 3_600_000),
        ):
            v = self.get_optional_int(key)
            if v is not None:
                return -1 if v < 0 else v * factor
        return 168 * 3_600_000

    @property
    def roll_ms(self) -> int:
        v = self.get_optional_int("log.roll.ms")
        return v if v is not None else self.get_int("log.roll.hours") * 3_600_000

    @property
    def flush_ms(self) -> int:
        v = self.get_optional_int("log.flush.interval.ms")
        return v if v is not None else self.get_int("log.flush.scheduler.interval.ms")

    def topic_defaults(self) -> dict[str, str]:
        """The broker's defaults for every topic-level key LogConfig carries, under the topic
        key names (Kafka's synonyms: ``log.roll.hours`` -> ``segment.ms`` ...)."""
        return LogConfig.from_broker_properties(self.originals).to_properties()

    def _tls_key(self, key: str) -> bool:
        """True for an ``ssl.*``/``sasl.*`` key (or a listener's override) that TLS or SASL
        of a listener reads."""
        keys = [f"ssl.{k}" for k in SSL_KEYS] if self.tls or self.registry_tls else []
        if self.sasl:
            keys += ["sasl.enabled.mechanisms", "plain.sasl.jaas.config"]
        if key in keys:
            return True
        names = {*self.tls, *self.sasl}
        names |= {n.lower() for n in names}
        return any(key == f"listener.name.{n}.{k}" for n in names for k in keys)

    def _set_registry(self) -> None:
        """``schema.registry.listeners`` (http or https) and, for https, its TLS settings:
        ``schema.registry.ssl.<key>`` over the broker-wide ``ssl.<key>`` (Kafka's PEM keys,
        :mod:`.security.tls`), loaded and checked now."""
        key = "schema.registry.listeners"
        text = self.get_str(key)
        self.registry_listener: Listener | None = None
        self.registry_tls: TlsSettings | None = None
        if not text:
            return
        m = _LISTENER.match(text)
        scheme = m.group("name").lower() if m is not None else ""
        if m is None or scheme not in ("http", "https"):
            raise ConfigError(f"{key}={text!r}: expected http://host:port or https://host:port")
        listener = _parse_metrics_listener("http" + text[len(scheme) :], key)
        self.registry_listener = Listener(scheme, listener.host, listener.port)
        if scheme == "https":
            view = {k: v for k, v in self.originals.items() if k.startswith("ssl.")}
            view |= {"ssl." + k[len(_REGISTRY_SSL) :]: v for k, v in self.originals.items()
                     if k in REGISTRY_SSL_KEYS}  # fmt: skip
            try:
                self.registry_tls = tls_settings(view, "schema.registry")
            except TlsConfigError as exc:
                raise ConfigError(
                    f"{key}={text!r} (TLS from schema.registry.ssl.* or ssl.*): {exc}"
                ) from None
        elif any(k in REGISTRY_SSL_KEYS for k in self.originals):
            raise ConfigError(f"schema.registry.ssl.* is set but {key}={text!r} is not https")

    def _set_listeners(self) -> None:
        """``listeners`` (the client listeners), their protocols and advertised addresses.

        ``listeners`` may name a KRaft CONTROLLER listener (``controller.listener.names``):
        it is accepted and not opened — a single node is its own controller and has no quorum
        to serve. Every other listener serves clients on its own port, with the security
        protocol ``listener.security.protocol.map`` gives it (a listener named after a
        protocol maps to it): PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL (TLS settings:
        :mod:`.security.tls`, SASL settings: :mod:`.security.sasl`).
        ``listener`` is the first client listener (the one tools and the readiness line
        name); ``advertised`` maps each client listener to what Metadata tells clients that
        connected through it (``advertised.listeners``, else the listener itself); entries
        of controller listeners are ignored.
        """
        controllers = set(self._list("controller.listener.names"))
        protocols: dict[str, str] = {}
        for item in self._list("listener.security.protocol.map"):
            name, sep, proto = item.partition(":")
            if not sep or not name.strip() or not proto.strip():
                raise ConfigError(f"listener.security.protocol.map: {item!r} is not NAME:PROTOCOL")
            protocols[name.strip()] = proto.strip()
        roles = self._list("process.roles")
        if "broker" not in roles:
            raise ConfigError(f"process.roles={roles!r}: loglake is a broker; include broker")
        parsed = [_parse_listener(text, "listeners") for text in self._list("listeners")]
        clients = [lst for lst in parsed if lst.name not in controllers]
        if not clients:
            raise ConfigError(
                f"listeners={self.get_str('listeners')!r}: no client listener besides the"
                f" controller listener(s) {sorted(controllers)}"
            )
        names = [lst.name for lst in clients]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConfigError(f"listeners: listener name(s) {dup} appear more than once")
        self.listeners: list[Listener] = clients
        self.listener = clients[0]
        self.controller_listeners = [lst for lst in parsed if lst.name in controllers]
        self.security_protocols: dict[str, str] = {}
        for lst in clients:
            proto = protocols.get(lst.name, lst.name)
            if proto not in SUPPORTED_PROTOCOLS:
                raise ConfigError(
                    f"listeners: {lst.name} uses security protocol {proto!r}; expected one of"
                    f" {SUPPORTED_PROTOCOLS} (listener.security.protocol.map)"
                )
            self.security_protocols[lst.name] = proto
        inter = self.values["inter.broker.listener.name"]
        if inter is not None and inter not in names:
            raise ConfigError(
                f"inter.broker.listener.name={inter!r}: expected a client listener {names}"
            )
        self.advertised_listeners: dict[str, Listener] = {}
        if self.values["advertised.listeners"] is not None:
            adv = [
                _parse_listener(text, "advertised.listeners")
                for text in self._list("advertised.listeners")
            ]
            for lst in adv:
                if lst.name in controllers:
                    continue
                if lst.name not in names or lst.name in self.advertised_listeners:
                    raise ConfigError(
                        f"advertised.listeners={self.get_str('advertised.listeners')!r}:"
                        f" {lst.name!r} is not a client listener {names} or appears twice"
                    )
                self.advertised_listeners[lst.name] = lst
        self.advertised: Listener | None = self.advertised_listeners.get(self.listener.name)
        self.tls: dict[str, TlsSettings] = {}
        self.sasl: dict[str, SaslListener] = {}
        for lst in clients:
            proto = self.security_protocols[lst.name]
            try:
                if proto in ("SSL", "SASL_SSL"):
                    self.tls[lst.name] = tls_settings(self.originals, lst.name)
                if proto in ("SASL_PLAINTEXT", "SASL_SSL"):
                    self.sasl[lst.name] = sasl_settings(self.originals, lst.name)
            except (TlsConfigError, SaslConfigError) as exc:
                raise ConfigError(str(exc)) from None
