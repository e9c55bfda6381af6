"""A minimal blocking Kafka client connection: one request in flight, kio's codecs.

Security (:class:`~logstore.tools.client_config.ClientConfig`, Kafka's client properties):
``SSL`` / ``SASL_SSL`` wrap the socket in TLS (the truststore, the keystore for mTLS, the host
name checked unless ``ssl.endpoint.identification.algorithm`` is empty); ``SASL_PLAINTEXT`` /
``SASL_SSL`` then authenticate before the first request, as Kafka's clients do: SaslHandshake
v1 naming ``sasl.mechanism``, then SaslAuthenticate v2 with RFC 4616's PLAIN token or the two
SCRAM messages (:class:`~logstore.server.security.scram.ScramClient`; the server's final
signature is verified). A refusal raises :class:`AuthenticationError` with the broker's message
(the password never appears). The session lifetime a broker gives (KIP-368) is not renewed:
these connections live for one tool run or one job step, and a broker closing an expired one
surfaces as an ordinary connection failure.

:class:`KafkaConnection` frames a kio request (request header v1, or v2 for flexible
versions), sends it, reads the size-prefixed response, checks the correlation id and decodes
the response with the kio schema of the same API and version. No retries, no pipelining: the
tools and the jobs' small admin calls (``pipelines/lake_group.py``, ``pipelines/retention``)
need nothing more. Every socket failure becomes a :class:`~logstore.errors.LoglakeError`
naming the broker. Not thread-safe (one per thread).
"""

from __future__ import annotations

import io
import socket
import ssl
import struct
from typing import Any

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
from kio.serial import entity_reader, entity_writer

from logstore.errors import InvalidConfigError, LoglakeError
from logstore.server.security.scram import ScramAuthError, ScramClient
from logstore.tools.client_config import ClientConfig

__all__ = ["AuthenticationError", "KafkaConnection"]


class AuthenticationError(InvalidConfigError):
    """The TLS handshake or the SASL login failed: the client's properties or credentials do
    not fit the broker, and retrying the same thing changes nothing (Kafka's clients treat
    authentication failures as fatal too), hence a configuration error: the tools and the
    jobs (``pipelines.jobrun``) exit 2."""


class KafkaConnection:
    """A blocking connection sending kio requests and reading their responses.

    ``config``: the client properties (None: PLAINTEXT); ``timeout`` (seconds) bounds the
    connect and every read, unless ``request.timeout.ms`` in ``config`` says otherwise."""

    def __init__(
        self,
        bootstrap: str,
        *,
        client_id: str = "loglake-topics",
        timeout: float = 30.0,
        config: ClientConfig | None = None,
    ):
        host, sep, port = bootstrap.rpartition(":")
        if not sep or not port.isdigit():
            raise LoglakeError(f"--bootstrap-server {bootstrap!r}: expected host:port")
        cfg = config or ClientConfig()
        if cfg.request_timeout_s is not None:
            timeout = cfg.request_timeout_s
        host = host or "127.0.0.1"
        try:
            self._sock: socket.socket = socket.create_connection((host, int(port)), timeout=timeout)
        except OSError as exc:
            raise LoglakeError(f"cannot connect to {bootstrap}: {exc.strerror or exc}") from exc
        self._client_id = (cfg.client_id or client_id).encode()
        self._correlation_id = 0
        self._bootstrap = bootstrap
        try:
            if cfg.uses_tls:
                self._sock = self._tls(cfg, host)
            if cfg.uses_sasl:
                self._authenticate(cfg)
        except BaseException:
            self._sock.close()
            raise

    def _tls(self, cfg: ClientConfig, host: str) -> ssl.SSLSocket:
        ctx = cfg.ssl_context()
        try:
            return ctx.wrap_socket(self._sock, server_hostname=host)
        except ssl.SSLError as exc:
            raise AuthenticationError(
                f"TLS handshake with {self._bootstrap} failed ({cfg.source}): {exc}"
            ) from exc
        except OSError as exc:
            raise LoglakeError(f"TLS handshake with {self._bootstrap} failed: {exc}") from exc

    def _authenticate(self, cfg: ClientConfig) -> None:
        mechanism, user, password = cfg.sasl_mechanism, cfg.username, cfg.password
        assert mechanism is not None and user is not None and password is not None  # validated
        hs = self.call(SaslHandshakeRequest(mechanism=mechanism))
        if hs.error_code != ErrorCode.none:
            raise AuthenticationError(
                f"{self._bootstrap} does not take SASL mechanism {mechanism} on this listener"
                f" (it offers {', '.join(hs.mechanisms) or 'none'}; {cfg.source})"
            )
        if mechanism == "PLAIN":
            self._sasl_step(b"\x00" + user.encode() + b"\x00" + password.encode(), user)
            return
        client = ScramClient(mechanism, user, password)
        try:
            server_first = self._sasl_step(client.first(), user)
            server_final = self._sasl_step(client.final(server_first), user)
            client.verify(server_final)
        except ScramAuthError as exc:
            raise AuthenticationError(
                f"SASL {mechanism} login of {user!r} to {self._bootstrap}: {exc.message}"
            ) from None

    def _sasl_step(self, token: bytes, user: str) -> bytes:
        resp = self.call(SaslAuthenticateRequest(auth_bytes=token))
        if resp.error_code != ErrorCode.none:
            raise AuthenticationError(
                f"{self._bootstrap} refused the SASL login of {user!r}:"
                f" {resp.error_code.name.upper()}: {resp.error_message or ''}".rstrip(": ")
            )
        return bytes(resp.auth_bytes)

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> KafkaConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, request: Any) -> Any:
        self._correlation_id += 1
        head = struct.pack(
            ">hhih",
            request.__api_key__,
            request.__version__,
            self._correlation_id,
            len(self._client_id),
        )
        buf = io.BytesIO()
        buf.write(head + self._client_id + (b"\x00" if request.__flexible__ else b""))
        entity_writer(type(request))(buf, request)
        payload = buf.getvalue()
        try:
            self._sock.sendall(struct.pack(">i", len(payload)) + payload)
            (size,) = struct.unpack(">i", self._recv(4))
            frame = self._recv(size)
        except OSError as exc:
            raise LoglakeError(f"connection to the broker failed: {exc}") from exc
        (cid,) = struct.unpack_from(">i", frame, 0)
        if cid != self._correlation_id:
            raise LoglakeError(f"correlation id {cid} != {self._correlation_id}")
        cls = load_response_schema(request.__api_key__, request.__version__)
        pos = 4 + (1 if cls.__header_schema__.__flexible__ else 0)
        response, _size = entity_reader(cls)(frame, pos)
        return response

    def _recv(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self._sock.recv(n - len(out))
            if not chunk:
                raise LoglakeError("the broker closed the connection")
            out += chunk
        return bytes(out)
