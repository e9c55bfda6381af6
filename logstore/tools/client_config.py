"""Kafka client properties for loglake's own clients: the tools, the jobs, the demo.

Format: a Java properties file (``java.util.Properties.load``'s syntax, the parser of the
broker's configs: :func:`logstore.storage.properties.parse_properties`), as Kafka's tools read
``--command-config client.properties``; the jobs take the same keys from ``conf/pipeline.toml``
(``[kafka]``, :mod:`pipelines.config`). Values are trimmed as Kafka's ``ConfigDef`` trims them.

Keys loglake's clients act on:

- ``security.protocol``: ``PLAINTEXT`` (default), ``SSL``, ``SASL_PLAINTEXT``, ``SASL_SSL``;
- ``sasl.mechanism``: ``PLAIN``, ``SCRAM-SHA-256``, ``SCRAM-SHA-512`` (Kafka's default GSSAPI
  does not exist here, so a SASL protocol must name one);
- the login: ``sasl.jaas.config`` in Kafka's syntax, ``org.apache.kafka.common.security.plain.
  PlainLoginModule required username="..." password="...";`` (PLAIN) or ``...scram.
  ScramLoginModule required ...;`` (SCRAM), or librdkafka's ``sasl.username`` /
  ``sasl.password`` (not both forms);
- TLS: ``ssl.truststore.type=PEM`` with ``ssl.truststore.location`` (a PEM file) or
  ``ssl.truststore.certificates`` (PEM text); neither: the system's CAs, as Java falls back to
  its own; ``ssl.keystore.type=PEM`` with ``ssl.keystore.location`` (key and chain in one file)
  or ``ssl.keystore.key`` + ``ssl.keystore.certificate.chain`` (mTLS), ``ssl.key.password``;
  ``ssl.endpoint.identification.algorithm`` (``https``, the default: the broker's certificate
  must name the host connected to; empty: not checked); ``ssl.enabled.protocols``
  (``TLSv1.2``, ``TLSv1.3``);
- ``client.id``, ``request.timeout.ms``.

:func:`librdkafka_config` gives the same settings in librdkafka's (confluent-kafka's) names,
for loglake's own confluent-kafka clients (the demo's producers).

Every other key of Kafka's producer, consumer and admin clients is accepted and has no effect
(Kafka accepts a client file written for another client the same way); a key that is none of
Kafka's is refused naming the nearest valid one. Every file is read and checked, PEM files
loaded, before any connection opens (:class:`ClientConfigError`, an
:class:`~logstore.errors.InvalidConfigError`: the tools and jobs exit 2). The password never
appears in a message or a ``repr``.
"""

from __future__ import annotations

import difflib
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from logstore.errors import InvalidConfigError
from logstore.server.security.sasl import MECHANISMS, SaslConfigError, parse_jaas
from logstore.server.security.tls import load_key_and_chain
from logstore.storage.properties import parse_properties

__all__ = [
    "KAFKA_CLIENT_KEYS",
    "PROTOCOLS",
    "ClientConfig",
    "ClientConfigError",
    "client_config",
    "librdkafka_config",
    "load_client_config",
    "read_client_properties",
]

Protocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_TLS_VERSIONS: Final = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
_LOGIN_MODULES: Final = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
# Java's String.trim(): every char up to and including the space.
_TRIM: Final = "".join(chr(c) for c in range(0x21))

_COMMON: Final = """bootstrap.servers client.dns.lookup client.id client.rack
connections.max.idle.ms default.api.timeout.ms metadata.max.age.ms metadata.recovery.strategy
metadata.recovery.rebootstrap.trigger.ms metric.reporters metrics.num.samples
metrics.recording.level metrics.sample.window.ms receive.buffer.bytes reconnect.backoff.max.ms
reconnect.backoff.ms request.timeout.ms retries retry.backoff.ms retry.backoff.max.ms
security.protocol security.providers send.buffer.bytes socket.connection.setup.timeout.ms
socket.connection.setup.timeout.max.ms auto.include.jmx.reporter enable.metrics.push"""
_SASL: Final = """sasl.mechanism sasl.jaas.config sasl.client.callback.handler.class
sasl.login.callback.handler.class sasl.login.class sasl.kerberos.service.name
sasl.kerberos.kinit.cmd sasl.kerberos.ticket.renew.window.factor
sasl.kerberos.ticket.renew.jitter sasl.kerberos.min.time.before.relogin
sasl.login.refresh.window.factor sasl.login.refresh.window.jitter
sasl.login.refresh.min.period.seconds sasl.login.refresh.buffer.seconds
sasl.login.connect.timeout.ms sasl.login.read.timeout.ms sasl.login.retry.backoff.max.ms
sasl.login.retry.backoff.ms sasl.oauthbearer.scope.claim.name sasl.oauthbearer.sub.claim.name
sasl.oauthbearer.token.endpoint.url sasl.oauthbearer.jwks.endpoint.url
sasl.oauthbearer.jwks.endpoint.refresh.ms sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms
sasl.oauthbearer.jwks.endpoint.retry.backoff.ms sasl.oauthbearer.clock.skew.seconds
sasl.oauthbearer.expected.audience sasl.oauthbearer.expected.issuer
sasl.oauthbearer.header.urlencode sasl.username sasl.password"""
_SSL: Final = """ssl.protocol ssl.provider ssl.cipher.suites ssl.enabled.protocols
ssl.keystore.type ssl.keystore.location ssl.keystore.password ssl.key.password ssl.keystore.key
ssl.keystore.certificate.chain ssl.truststore.certificates ssl.truststore.type
ssl.truststore.location ssl.truststore.password ssl.keymanager.algorithm
ssl.trustmanager.algorithm ssl.endpoint.identification.algorithm
ssl.secure.random.implementation ssl.engine.factory.class"""
_PRODUCER: Final = """acks batch.size buffer.memory compression.type compression.gzip.level
compression.lz4.level compression.zstd.level delivery.timeout.ms enable.idempotence
interceptor.classes key.serializer value.serializer linger.ms max.block.ms
max.in.flight.requests.per.connection max.request.size metadata.max.idle.ms partitioner.class
partitioner.ignore.keys partitioner.adaptive.partitioning.enable
partitioner.availability.timeout.ms transaction.timeout.ms transactional.id"""
_CONSUMER: Final = """allow.auto.create.topics auto.commit.interval.ms auto.offset.reset
check.crcs enable.auto.commit exclude.internal.topics fetch.max.bytes fetch.max.wait.ms
fetch.min.bytes group.id group.instance.id group.protocol group.remote.assignor
heartbeat.interval.ms isolation.level key.deserializer value.deserializer
max.partition.fetch.bytes max.poll.interval.ms max.poll.records partition.assignment.strategy
session.timeout.ms"""
# Kafka's client configs (CommonClientConfigs, SaslConfigs, SslConfigs, ProducerConfig,
# ConsumerConfig, AdminClientConfig) plus librdkafka's sasl.username / sasl.password.
KAFKA_CLIENT_KEYS: Final = frozenset(" ".join((_COMMON, _SASL, _SSL, _PRODUCER, _CONSUMER)).split())


class ClientConfigError(InvalidConfigError):
    """A client property is unknown, malformed, inconsistent or names an unreadable file."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientConfig:
    """Validated client properties (PEM text loaded; see the module docstring).

    ``source`` names where they came from, for messages. Immutable and safe to share
    between threads; :meth:`ssl_context` builds a new context per call."""

    source: str = "<defaults>"
    security_protocol: Protocol = "PLAINTEXT"
    sasl_mechanism: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    trust_pem: str | None = None
    key_pem: str | None = field(default=None, repr=False)
    chain_pem: str | None = None
    key_password: str | None = field(default=None, repr=False)
    check_hostname: bool = True
    tls_versions: tuple[str, ...] = ("TLSv1.2", "TLSv1.3")
    client_id: str | None = None
    request_timeout_s: float | None = None

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context: the truststore (else the system's CAs), the keystore for
        mTLS, the host name checked unless ``ssl.endpoint.identification.algorithm`` is
        empty."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        versions = sorted(_TLS_VERSIONS[v] for v in self.tls_versions)
        ctx.minimum_version, ctx.maximum_version = versions[0], versions[-1]
        ctx.check_hostname = self.check_hostname
        ctx.verify_mode = ssl.CERT_REQUIRED
        try:
            if self.trust_pem is not None:
                ctx.load_verify_locations(cadata=self.trust_pem)
            else:
                ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
        except (ssl.SSLError, ValueError) as exc:
            raise ClientConfigError(
                f"{self.source}: the truststore's certificates do not load: {exc}"
            ) from exc
        if self.key_pem is not None and self.chain_pem is not None:
            try:
                load_key_and_chain(
                    ctx, key_pem=self.key_pem, chain_pem=self.chain_pem, password=self.key_password
                )
            except (ssl.SSLError, OSError, ValueError) as exc:
                raise ClientConfigError(
                    f"{self.source}: the keystore's key and certificate chain do not load: {exc}"
                ) from exc
        return ctx


def read_client_properties(path: str | os.PathLike[str]) -> dict[str, str]:
    """The properties of a ``client.properties`` file, trimmed (not yet validated)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ClientConfigError(f"cannot read the client properties {path}: {exc}") from exc
    try:
        props = parse_properties(text, source=str(path))
    except InvalidConfigError as exc:
        raise ClientConfigError(exc.message) from exc
    return {k: v.strip(_TRIM) for k, v in props.items()}


def load_client_config(path: str | os.PathLike[str]) -> ClientConfig:
    """Read and validate a ``client.properties`` file (``--command-config``)."""
    return client_config(read_client_properties(path), source=str(path))


def _read_pem(source: str, key: str, path: str) -> str:
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ClientConfigError(
            f"{source}: {key}={path!r}: cannot read the PEM file: {exc}"
        ) from exc


def client_config(props: Mapping[str, str], *, source: str) -> ClientConfig:
    """Validate Kafka client properties (values as strings) into a :class:`ClientConfig`."""
    for key in props:
        if key not in KAFKA_CLIENT_KEYS:
            near = difflib.get_close_matches(key, sorted(KAFKA_CLIENT_KEYS), n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ClientConfigError(f"{source}: unknown client property {key!r}{hint}")

    def get(key: str) -> str | None:
        value = props.get(key)
        return value if value else None

    protocol = (get("security.protocol") or "PLAINTEXT").upper()
    if protocol not in PROTOCOLS:
        raise ClientConfigError(
            f"{source}: security.protocol={props['security.protocol']!r}: expected one of"
            f" {', '.join(PROTOCOLS)}"
        )
    uses_sasl = protocol.startswith("SASL_")
    mechanism = username = password = None
    if uses_sasl:
        mechanism, username, password = _login(props, source)
    else:
        set_sasl = [k for k in ("sasl.jaas.config", "sasl.username", "sasl.password") if get(k)]
        if set_sasl:
            raise ClientConfigError(
                f"{source}: {set_sasl[0]} is set but security.protocol={protocol} does not use"
                " SASL (SASL_PLAINTEXT or SASL_SSL)"
            )
    trust_pem = key_pem = chain_pem = None
    for store in ("keystore", "truststore"):
        typ = get(f"ssl.{store}.type")
        if typ is not None and typ.upper() != "PEM":
            raise ClientConfigError(
                f"{source}: ssl.{store}.type={typ!r}: only PEM is supported (JKS and PKCS12 are"
                " Java formats: convert them to PEM)"
            )
    loc, certs = get("ssl.truststore.location"), get("ssl.truststore.certificates")
    if loc and certs:
        raise ClientConfigError(
            f"{source}: set ssl.truststore.location or ssl.truststore.certificates, not both"
        )
    trust_pem = _read_pem(source, "ssl.truststore.location", loc) if loc else certs
    if trust_pem is not None and "CERTIFICATE-----" not in trust_pem:
        raise ClientConfigError(f"{source}: the truststore holds no PEM certificate")
    kloc, kkey, kchain = (
        get("ssl.keystore.location"),
        get("ssl.keystore.key"),
        get("ssl.keystore.certificate.chain"),
    )
    if kloc and (kkey or kchain):
        raise ClientConfigError(
            f"{source}: set ssl.keystore.location or ssl.keystore.key with"
            " ssl.keystore.certificate.chain, not both"
        )
    if kloc:
        key_pem = chain_pem = _read_pem(source, "ssl.keystore.location", kloc)
    elif kkey or kchain:
        if not (kkey and kchain):
            raise ClientConfigError(
                f"{source}: ssl.keystore.key and ssl.keystore.certificate.chain go together"
            )
        key_pem, chain_pem = kkey, kchain
    if key_pem is not None and "PRIVATE KEY-----" not in key_pem:
        raise ClientConfigError(f"{source}: the keystore holds no PEM private key")
    if chain_pem is not None and "CERTIFICATE-----" not in chain_pem:
        raise ClientConfigError(f"{source}: the keystore holds no PEM certificate chain")
    algorithm = props.get("ssl.endpoint.identification.algorithm", "https")
    if algorithm.lower() not in ("https", ""):
        raise ClientConfigError(
            f"{source}: ssl.endpoint.identification.algorithm={algorithm!r}: expected https"
            " or empty (no host name check)"
        )
    versions = tuple(
        v.strip()
        for v in (get("ssl.enabled.protocols") or "TLSv1.2,TLSv1.3").split(",")
        if v.strip()
    )
    if not versions or any(v not in _TLS_VERSIONS for v in versions):
        raise ClientConfigError(
            f"{source}: ssl.enabled.protocols={props.get('ssl.enabled.protocols')!r}: expected"
            f" a subset of {', '.join(_TLS_VERSIONS)}"
        )
    timeout_s = None
    if get("request.timeout.ms") is not None:
        raw = props["request.timeout.ms"]
        if not raw.isdigit() or int(raw) < 1 or int(raw) > 2**31 - 1:
            raise ClientConfigError(
                f"{source}: request.timeout.ms={raw!r}: expected an integer in 1..2147483647"
            )
        timeout_s = int(raw) / 1000.0
    cfg = ClientConfig(
        source=source,
        security_protocol=protocol,  # type: ignore[arg-type]  # checked against PROTOCOLS
        sasl_mechanism=mechanism,
        username=username,
        password=password,
        trust_pem=trust_pem,
        key_pem=key_pem,
        chain_pem=chain_pem,
        key_password=get("ssl.key.password"),
        check_hostname=algorithm.lower() == "https",
        tls_versions=versions,
        client_id=get("client.id"),
        request_timeout_s=timeout_s,
    )
    if cfg.uses_tls:
        cfg.ssl_context()  # a bad CA, key or chain fails now, not at the first connection
    return cfg


def _login(props: Mapping[str, str], source: str) -> tuple[str, str, str]:
    """(mechanism, user, password) of a SASL client, from ``sasl.jaas.config`` or
    ``sasl.username``/``sasl.password``."""
    mechanism = props.get("sasl.mechanism", "")
    if mechanism not in MECHANISMS:
        shown = repr(mechanism) if mechanism else "unset (Kafka's default GSSAPI)"
        raise ClientConfigError(
            f"{source}: sasl.mechanism is {shown}: expected one of {', '.join(MECHANISMS)}"
        )
    jaas = props.get("sasl.jaas.config", "")
    user, password = props.get("sasl.username", ""), props.get("sasl.password", "")
    if jaas and (user or password):
        raise ClientConfigError(
            f"{source}: set sasl.jaas.config or sasl.username/sasl.password, not both"
        )
    if jaas:
        try:
            module, options = parse_jaas(jaas, key="sasl.jaas.config")
        except SaslConfigError as exc:
            raise ClientConfigError(f"{source}: {exc.message}") from None
        if module != _LOGIN_MODULES[mechanism]:
            raise ClientConfigError(
                f"{source}: sasl.jaas.config names {module}; sasl.mechanism={mechanism} needs"
                f" {_LOGIN_MODULES[mechanism]}"
            )
        user, password = options.get("username", ""), options.get("password", "")
        if not user or not password:
            raise ClientConfigError(
                f'{source}: sasl.jaas.config needs username="..." and password="..."'
            )
        return mechanism, user, password
    if not user or not password:
        raise ClientConfigError(
            f"{source}: security.protocol={props.get('security.protocol')} needs a login:"
            f' sasl.jaas.config ({_LOGIN_MODULES[mechanism]} required username="..."'
            ' password="...";) or sasl.username and sasl.password'
        )
    return mechanism, user, password


_PEM_CERT: Final = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)


def librdkafka_config(cfg: ClientConfig) -> dict[str, str]:
    """``cfg`` as librdkafka's properties (PEM text inline: ``ssl.ca.pem``, ``ssl.key.pem``,
    ``ssl.certificate.pem``; ``ssl.endpoint.identification.algorithm`` ``https`` or
    ``none``); without a truststore librdkafka uses the system's CAs as loglake does."""
    out = {"security.protocol": cfg.security_protocol.lower()}
    if cfg.uses_sasl:
        assert cfg.sasl_mechanism and cfg.username is not None and cfg.password is not None
        out |= {
            "sasl.mechanism": cfg.sasl_mechanism,
            "sasl.username": cfg.username,
            "sasl.password": cfg.password,
        }
    if cfg.uses_tls:
        out["ssl.endpoint.identification.algorithm"] = "https" if cfg.check_hostname else "none"
        if cfg.trust_pem is not None:
            out["ssl.ca.pem"] = cfg.trust_pem
        if cfg.key_pem is not None and cfg.chain_pem is not None:
            # one keystore file holds both: librdkafka wants the certificates alone
            out["ssl.key.pem"] = cfg.key_pem
            out["ssl.certificate.pem"] = "\n".join(_PEM_CERT.findall(cfg.chain_pem))
            if cfg.key_password is not None:
                out["ssl.key.password"] = cfg.key_password
    if cfg.client_id is not None:
        out["client.id"] = cfg.client_id
    return out
