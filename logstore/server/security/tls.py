"""TLS for SSL listeners, configured with Kafka's PEM keys.

Keys (broker-wide ``ssl.<key>``, overridden per listener by ``listener.name.<l>.ssl.<key>``,
``<l>`` in lower case as Kafka writes it, or as named):

- ``ssl.keystore.type=PEM`` with ``ssl.keystore.location`` (a PEM file holding the private
  key and the certificate chain) or ``ssl.keystore.key`` and
  ``ssl.keystore.certificate.chain`` (PEM text in the value itself); ``ssl.key.password``
  decrypts an encrypted key.
- ``ssl.truststore.type=PEM`` with ``ssl.truststore.location`` or
  ``ssl.truststore.certificates``: the CAs client certificates must chain to.
- ``ssl.client.auth``: ``none`` | ``requested`` | ``required`` (mTLS).
- ``ssl.enabled.protocols``: a subset of ``TLSv1.2,TLSv1.3`` (default both).
- ``ssl.principal.mapping.rules``: how a client certificate's subject becomes the principal
  (:mod:`.principal`; default ``DEFAULT``: the whole DN).

Only PEM stores exist here (Kafka's JKS/PKCS12 are Java formats): any other type is refused
at start-up, as is every malformed value; the error names the key. The values are read from
the broker's original properties (Kafka's ``ssl.*``/``listener.name.*`` keys are accepted by
:mod:`logstore.server.config` as a family) and validated here, once, before any socket opens.

Thread-safety: a built :class:`ssl.SSLContext` is shared by every connection of a listener
(OpenSSL contexts are safe to share once configured).
"""

from __future__ import annotations

import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from logstore.errors import LoglakeError
from logstore.server.security.principal import MappingRule, PrincipalError, parse_mapping_rules

__all__ = [
    "SSL_KEYS",
    "TlsConfigError",
    "TlsSettings",
    "build_server_context",
    "load_key_and_chain",
    "tls_settings",
]

ClientAuth = Literal["none", "requested", "required"]

# Every ssl.* key this module reads; the others of Kafka's family are accepted and ignored.
SSL_KEYS: Final = (
    "keystore.type",
    "keystore.location",
    "keystore.key",
    "keystore.certificate.chain",
    "key.password",
    "truststore.type",
    "truststore.location",
    "truststore.certificates",
    "client.auth",
    "enabled.protocols",
    "principal.mapping.rules",
)
_PROTOCOLS: Final = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
_CLIENT_AUTH: Final = ("none", "requested", "required")


class TlsConfigError(LoglakeError):
    """An ``ssl.*`` key of a listener is missing, malformed or unreadable."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsSettings:
    """One listener's validated TLS settings (PEM text, never a path after loading)."""

    listener: str
    key_pem: str
    chain_pem: str
    key_password: str | None
    trust_pem: str | None
    client_auth: ClientAuth
    protocols: tuple[str, ...]
    principal_rules: tuple[MappingRule, ...] = ()


def _lookup(props: Mapping[str, str], listener: str, key: str) -> tuple[str, str] | None:
    """(key as written, value) of ``key`` for ``listener``: per-listener first."""
    for full in (
        f"listener.name.{listener.lower()}.ssl.{key}",
        f"listener.name.{listener}.ssl.{key}",
        f"ssl.{key}",
    ):
        if full in props and props[full].strip():
            return full, props[full].strip()
    return None


def _read(path_key: str, path: str) -> str:
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise TlsConfigError(f"{path_key}={path!r}: cannot read the PEM file: {exc}") from exc


def tls_settings(props: Mapping[str, str], listener: str) -> TlsSettings:
    """Validate and load the TLS settings of ``listener`` from Kafka's keys."""

    def get(key: str) -> tuple[str, str] | None:
        return _lookup(props, listener, key)

    for store in ("keystore", "truststore"):
        typ = get(f"{store}.type")
        if typ is not None and typ[1].upper() != "PEM":
            raise TlsConfigError(
                f"{typ[0]}={typ[1]!r}: only PEM is supported (JKS and PKCS12 are Java formats)"
            )
    location = get("keystore.location")
    key = get("keystore.key")
    chain = get("keystore.certificate.chain")
    if location is not None and (key or chain):
        raise TlsConfigError(
            f"listener {listener}: set {location[0]} or ssl.keystore.key with"
            " ssl.keystore.certificate.chain, not both"
        )
    if location is not None:
        text = _read(*location)
        key_pem = chain_pem = text
        if "PRIVATE KEY-----" not in text or "CERTIFICATE-----" not in text:
            raise TlsConfigError(
                f"{location[0]}={location[1]!r}: expected a PEM private key and certificate chain"
            )
    elif key is not None and chain is not None:
        key_pem, chain_pem = key[1], chain[1]
        if "PRIVATE KEY-----" not in key_pem:
            raise TlsConfigError(f"{key[0]}: expected a PEM private key")
        if "CERTIFICATE-----" not in chain_pem:
            raise TlsConfigError(f"{chain[0]}: expected PEM certificates")
    else:
        raise TlsConfigError(
            f"listener {listener} uses TLS: set ssl.keystore.location (PEM key and chain)"
            " or ssl.keystore.key and ssl.keystore.certificate.chain"
            f" (or listener.name.{listener.lower()}.ssl.*)"
        )
    trust_loc = get("truststore.location")
    trust_certs = get("truststore.certificates")
    trust_pem: str | None = None
    if trust_loc is not None and trust_certs is not None:
        raise TlsConfigError(
            f"listener {listener}: set {trust_loc[0]} or {trust_certs[0]}, not both"
        )
    if trust_loc is not None:
        trust_pem = _read(*trust_loc)
    elif trust_certs is not None:
        trust_pem = trust_certs[1]
    auth_kv = get("client.auth")
    auth = auth_kv[1].lower() if auth_kv is not None else "none"
    if auth not in _CLIENT_AUTH:
        raise TlsConfigError(
            f"{auth_kv[0] if auth_kv else 'ssl.client.auth'}={auth!r}:"
            f" expected one of {_CLIENT_AUTH}"
        )
    if auth != "none" and trust_pem is None:
        raise TlsConfigError(
            f"listener {listener}: ssl.client.auth={auth} needs ssl.truststore.location"
            " or ssl.truststore.certificates (the CAs client certificates chain to)"
        )
    proto_kv = get("enabled.protocols")
    protocols = (
        tuple(p.strip() for p in proto_kv[1].split(",") if p.strip())
        if proto_kv is not None
        else ("TLSv1.2", "TLSv1.3")
    )
    bad = [p for p in protocols if p not in _PROTOCOLS]
    if bad or not protocols:
        raise TlsConfigError(
            f"{proto_kv[0] if proto_kv else 'ssl.enabled.protocols'}={','.join(protocols)!r}:"
            f" expected a subset of {tuple(_PROTOCOLS)}"
        )
    rules_kv = get("principal.mapping.rules")
    try:
        rules = (
            parse_mapping_rules(rules_kv[1], key=rules_kv[0]) if rules_kv else [MappingRule(None)]
        )
    except PrincipalError as exc:
        raise TlsConfigError(str(exc)) from None
    pw = get("key.password")
    settings = TlsSettings(
        listener=listener,
        key_pem=key_pem,
        chain_pem=chain_pem,
        key_password=pw[1] if pw is not None else None,
        trust_pem=trust_pem,
        client_auth=auth,  # type: ignore[arg-type]  # checked against _CLIENT_AUTH above
        protocols=protocols,
        principal_rules=tuple(rules),
    )
    build_server_context(settings)  # a bad key, chain or CA fails now, not at first connect
    return settings


def build_server_context(settings: TlsSettings) -> ssl.SSLContext:
    """A server-side context for ``settings``; :class:`TlsConfigError` if OpenSSL refuses."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    versions = sorted(_PROTOCOLS[p] for p in settings.protocols)
    ctx.minimum_version = versions[0]
    ctx.maximum_version = versions[-1]
    try:
        load_key_and_chain(
            ctx,
            key_pem=settings.key_pem,
            chain_pem=settings.chain_pem,
            password=settings.key_password,
        )
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise TlsConfigError(
            f"listener {settings.listener}: the keystore's key and certificate chain do not"
            f" load: {exc}"
        ) from exc
    if settings.trust_pem is not None:
        try:
            ctx.load_verify_locations(cadata=settings.trust_pem)
        except (ssl.SSLError, ValueError) as exc:
            raise TlsConfigError(
                f"listener {settings.listener}: the truststore's certificates do not load: {exc}"
            ) from exc
    ctx.verify_mode = {
        "none": ssl.CERT_NONE,
        "requested": ssl.CERT_OPTIONAL,
        "required": ssl.CERT_REQUIRED,
    }[settings.client_auth]
    return ctx


def load_key_and_chain(
    ctx: ssl.SSLContext, *, key_pem: str, chain_pem: str, password: str | None
) -> None:
    """Load a PEM private key and certificate chain (the same text when one file holds both)
    into ``ctx``; OpenSSL's errors propagate. ``load_cert_chain`` only takes a path, so the PEM
    goes through a private (0600) temporary file removed at once."""
    fd, path = tempfile.mkstemp(prefix="loglake-tls-", suffix=".pem")
    try:
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(key_pem)
            if chain_pem is not key_pem:
                fh.write("\n" + chain_pem)
        ctx.load_cert_chain(path, password=password)
    finally:
        os.unlink(path)
