"""SCRAM-SHA-256/512 (RFC 5802, RFC 7677): the credential store and the server exchange.

Credentials (KIP-554). AlterUserScramCredentials carries, per user and mechanism, a salt, an
iteration count and the *salted* password (the client ran PBKDF2); the broker keeps only
``StoredKey = H(HMAC(salted, "Client Key"))`` and ``ServerKey = HMAC(salted, "Server Key")``
with the salt and iterations, as Kafka does: neither the password nor the salted password is
stored, and a stolen file does not let anyone log in (it lets an attacker check guesses,
slowed by the iterations).

File: ``<first log dir>/__scram_credentials.json``,
``{"version": 1, "users": {user: {mechanism: {"iterations", "salt", "stored_key",
"server_key"}}}}`` with base64 bytes. Every change rewrites it as the broker's checkpoints
are written (``<file>.tmp``, fsync, rename, directory fsync:
:func:`logstore.storage.files.write_atomically`), so after a crash it holds the credentials
before or after the last change, never a mix; a change is answered only once durable. A file
that does not parse stops the broker at start-up (:class:`ScramStoreError`, with the path):
credentials are never silently dropped.

Exchange (:class:`ScramExchange`): client-first ``n,,n=<user>,r=<cnonce>`` -> server-first
``r=<cnonce><snonce>,s=<salt>,i=<iterations>``; client-final ``c=<gs2 header>,r=<nonce>,
p=<proof>`` -> server-final ``v=<server signature>``. An unknown user, a nonce that is not
the one sent, a channel binding that is not the client-first header, or a proof that does
not verify raises :class:`ScramAuthError` (the caller answers SASL_AUTHENTICATION_FAILED and
closes). Thread-safety: the store locks its map; an exchange belongs to one connection.

Client (:class:`ScramClient`): the other side of the same exchange, for loglake's own clients
(``logstore.tools.connection``), on the same primitives (one implementation of the maths); it
refuses fewer than :data:`MIN_ITERATIONS` iterations and a server signature that does not
verify, as Kafka's ScramSaslClient does.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from logstore.errors import LoglakeError
from logstore.storage.files import write_atomically

__all__ = [
    "MAX_ITERATIONS",
    "MECHANISM_IDS",
    "MIN_ITERATIONS",
    "ScramAuthError",
    "ScramClient",
    "ScramCredential",
    "ScramCredentials",
    "ScramExchange",
    "ScramStoreError",
    "credential_from_salted",
    "salted_password",
    "verify_password",
]

# KIP-554's mechanism ids on the wire.
MECHANISM_IDS: Final = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
_HASH: Final = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MIN_ITERATIONS: Final = 4096  # Kafka's ScramMechanism.minIterations
MAX_ITERATIONS: Final = 16384  # Kafka's maximum for AlterUserScramCredentials
FILE_NAME: Final = "__scram_credentials.json"


class ScramStoreError(LoglakeError):
    """The credential file cannot be read or written."""


class ScramAuthError(LoglakeError):
    """A SCRAM exchange failed: unknown user, bad nonce, bad proof, malformed message."""


@dataclass(frozen=True, slots=True)
class ScramCredential:
    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes


def _hmac(mechanism: str, key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, _HASH[mechanism]).digest()


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """``Hi(password, salt, i)``: PBKDF2 with the mechanism's hash (what clients send)."""
    return hashlib.pbkdf2_hmac(_HASH[mechanism], password.encode(), salt, iterations)


def credential_from_salted(
    mechanism: str, salted: bytes, salt: bytes, iterations: int
) -> ScramCredential:
    client_key = _hmac(mechanism, salted, b"Client Key")
    stored = hashlib.new(_HASH[mechanism], client_key).digest()
    return ScramCredential(iterations, salt, stored, _hmac(mechanism, salted, b"Server Key"))


class ScramCredentials:
    """Users' SCRAM credentials, durable in one file (module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._users: dict[str, dict[str, ScramCredential]] = {}
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ScramStoreError(f"cannot read SCRAM credentials: {exc}", path=str(path)) from exc
        try:
            doc = json.loads(text)
            if doc.get("version") != 1:
                raise ValueError(f"version {doc.get('version')!r}, expected 1")
            for user, mechs in doc["users"].items():
                for mech, c in mechs.items():
                    if mech not in _HASH:
                        raise ValueError(f"unknown mechanism {mech!r}")
                    self._users.setdefault(user, {})[mech] = ScramCredential(
                        int(c["iterations"]),
                        base64.b64decode(c["salt"]),
                        base64.b64decode(c["stored_key"]),
                        base64.b64decode(c["server_key"]),
                    )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ScramStoreError(f"corrupt SCRAM credentials: {exc}", path=str(path)) from exc

    def get(self, user: str, mechanism: str) -> ScramCredential | None:
        with self._lock:
            return self._users.get(user, {}).get(mechanism)

    def describe(self, users: Iterable[str] | None) -> dict[str, dict[str, int]]:
        """user -> mechanism -> iterations, for ``users`` (None: all) that have any."""
        with self._lock:
            names = sorted(self._users) if users is None else list(users)
            return {
                u: {m: c.iterations for m, c in self._users[u].items()}
                for u in names
                if self._users.get(u)
            }

    def alter(
        self,
        *,
        upserts: Iterable[tuple[str, str, ScramCredential]],
        deletes: Iterable[tuple[str, str]],
    ) -> None:
        """Apply the changes and make them durable (OSError: nothing changed)."""
        with self._lock:
            users = {u: dict(m) for u, m in self._users.items()}
            for user, mech in deletes:
                users.get(user, {}).pop(mech, None)
                if user in users and not users[user]:
                    del users[user]
            for user, mech, cred in upserts:
                users.setdefault(user, {})[mech] = cred
            doc = {
                "version": 1,
                "users": {
                    u: {
                        m: {
                            "iterations": c.iterations,
                            "salt": base64.b64encode(c.salt).decode(),
                            "stored_key": base64.b64encode(c.stored_key).decode(),
                            "server_key": base64.b64encode(c.server_key).decode(),
                        }
                        for m, c in sorted(ms.items())
                    }
                    for u, ms in sorted(users.items())
                },
            }
            write_atomically(self.path, json.dumps(doc, indent=1).encode())
            self._users = users


def _attrs(msg: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in msg.split(","):
        if len(part) < 2 or part[1] != "=":
            raise ScramAuthError(f"malformed SCRAM attribute {part[:20]!r}")
        out.setdefault(part[0], part[2:])
    return out


class ScramExchange:
    """The server side of one SCRAM exchange (two client messages)."""

    def __init__(
        self, mechanism: str, store: ScramCredentials, *, server_nonce: str | None = None
    ) -> None:
        """``server_nonce``: the server's part of the nonce (tests: RFC 7677's example);
        by default 24 random bytes, URL-safe base64."""
        self.mechanism = mechanism
        self._snonce = server_nonce
        self._store = store
        self._first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._gs2 = ""
        self._cred: ScramCredential | None = None
        self.user: str | None = None

    def first(self, token: bytes) -> bytes:
        try:
            msg = token.decode("utf-8")
        except UnicodeDecodeError:
            raise ScramAuthError("client-first message is not UTF-8") from None
        if not msg.startswith(("n,", "y,")) or msg.count(",") < 3:
            raise ScramAuthError("malformed client-first message")
        cut = msg.index(",", msg.index(",") + 1) + 1
        self._gs2, self._first_bare = msg[:cut], msg[cut:]
        attrs = _attrs(self._first_bare)
        user = attrs.get("n", "").replace("=2C", ",").replace("=3D", "=")
        cnonce = attrs.get("r", "")
        if not user or not cnonce:
            raise ScramAuthError("client-first message without user or nonce")
        cred = self._store.get(user, self.mechanism)
        if cred is None:
            raise ScramAuthError("unknown user")
        self.user, self._cred = user, cred
        self._nonce = cnonce + (self._snonce or secrets.token_urlsafe(24))
        salt = base64.b64encode(cred.salt).decode()
        self._server_first = f"r={self._nonce},s={salt},i={cred.iterations}"
        return self._server_first.encode()

    def final(self, token: bytes) -> bytes:
        cred = self._cred
        if cred is None:
            raise ScramAuthError("client-final message before client-first")
        try:
            msg = token.decode("utf-8")
        except UnicodeDecodeError:
            raise ScramAuthError("client-final message is not UTF-8") from None
        head, sep, proof_b64 = msg.rpartition(",p=")
        if not sep:
            raise ScramAuthError("client-final message without proof")
        attrs = _attrs(head)
        if attrs.get("r") != self._nonce:
            raise ScramAuthError("nonce mismatch")
        if attrs.get("c") != base64.b64encode(self._gs2.encode()).decode():
            raise ScramAuthError("channel binding mismatch")
        try:
            proof = base64.b64decode(proof_b64, validate=True)
        except ValueError:
            raise ScramAuthError("proof is not base64") from None
        auth = f"{self._first_bare},{self._server_first},{head}".encode()
        signature = _hmac(self.mechanism, cred.stored_key, auth)
        if len(proof) != len(signature):
            raise ScramAuthError("bad proof")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        digest = hashlib.new(_HASH[self.mechanism], client_key).digest()
        if not hmac.compare_digest(digest, cred.stored_key):
            raise ScramAuthError("bad proof")
        server_sig = _hmac(self.mechanism, cred.server_key, auth)
        return b"v=" + base64.b64encode(server_sig)


class ScramClient:
    """The client side of one SCRAM exchange: :meth:`first`, :meth:`final`, :meth:`verify`."""

    def __init__(self, mechanism: str, user: str, password: str, *, nonce: str | None = None):
        if mechanism not in _HASH:
            raise ScramAuthError(f"unknown SCRAM mechanism {mechanism!r}")
        self.mechanism = mechanism
        self._password = password
        self._cnonce = nonce or secrets.token_urlsafe(24)
        name = user.replace("=", "=3D").replace(",", "=2C")
        self._first_bare = f"n={name},r={self._cnonce}"
        self._server_signature = b""

    def first(self) -> bytes:
        return f"n,,{self._first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        try:
            text = server_first.decode("utf-8")
        except UnicodeDecodeError:
            raise ScramAuthError("server-first message is not UTF-8") from None
        attrs = _attrs(text)
        nonce, salt_b64, iters = attrs.get("r", ""), attrs.get("s", ""), attrs.get("i", "")
        if not nonce.startswith(self._cnonce) or len(nonce) == len(self._cnonce):
            raise ScramAuthError("the server's nonce does not extend the client's")
        if not iters.isdigit() or int(iters) < MIN_ITERATIONS:
            raise ScramAuthError(f"iterations {iters!r}: at least {MIN_ITERATIONS} expected")
        try:
            salt = base64.b64decode(salt_b64, validate=True)
        except ValueError:
            raise ScramAuthError("the salt is not base64") from None
        salted = salted_password(self.mechanism, self._password, salt, int(iters))
        cred = credential_from_salted(self.mechanism, salted, salt, int(iters))
        head = f"c={base64.b64encode(b'n,,').decode()},r={nonce}"
        auth = f"{self._first_bare},{text},{head}".encode()
        client_key = _hmac(self.mechanism, salted, b"Client Key")
        signature = _hmac(self.mechanism, cred.stored_key, auth)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = _hmac(self.mechanism, cred.server_key, auth)
        return f"{head},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        """Check the server's signature (it proves the server holds the credential)."""
        want = b"v=" + base64.b64encode(self._server_signature)
        if not self._server_signature or not hmac.compare_digest(server_final, want):
            raise ScramAuthError("the server's signature does not verify")


def verify_password(mechanism: str, password: str, cred: ScramCredential) -> bool:
    """Whether ``password`` is the one ``cred`` was made from (recomputed with its salt and
    iterations; constant-time compare). For HTTP basic auth against SCRAM users."""
    salted = salted_password(mechanism, password, cred.salt, cred.iterations)
    mine = credential_from_salted(mechanism, salted, cred.salt, cred.iterations)
    return hmac.compare_digest(mine.stored_key, cred.stored_key)
