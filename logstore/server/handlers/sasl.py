"""SaslHandshake (key 17, v0-1) and SaslAuthenticate (key 36, v0-2): SASL on SASL listeners.

KIP-152 framing: the client names a mechanism with SaslHandshake v1, then sends its tokens
wrapped in SaslAuthenticate requests (each answered with the server's token); PLAIN takes
one token, SCRAM two (client-first, client-final: :mod:`logstore.server.security.scram`).
After a v0 SaslHandshake the tokens come as bare size-prefixed frames without a Kafka header
(before KIP-152) and are answered the same way; the dispatcher routes them to
:func:`authenticate_step` (a failure closes the connection without an answer, as Kafka's v0
does). Until a connection of a SASL listener is authenticated, only
ApiVersions, SaslHandshake and SaslAuthenticate are served; anything else closes it (the
dispatcher checks, :mod:`logstore.server.dispatch`).

A failed authentication answers SASL_AUTHENTICATION_FAILED with a message and then closes
the connection, as Kafka does; the answer is delayed by
``connection.failed.authentication.delay.ms`` (more for repeated failures of a host, see
:mod:`logstore.server.security.sasl`) on a timer, never on a handler thread. Re-authentication
(KIP-368) is the same exchange on an authenticated connection; with
``connections.max.reauth.ms`` > 0 SaslAuthenticate v1+ tells the client its session lifetime.
"""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any, Final

from kio.schema.errors import ErrorCode

from logstore.server.context import CloseAfter, Deferred, RequestContext
from logstore.server.handlers._util import build, response_module
from logstore.server.security.sasl import SaslSession, plain_authenticate
from logstore.server.security.scram import ScramAuthError, ScramExchange

__all__ = [
    "API_HANDLERS",
    "AUTHENTICATE_KEY",
    "HANDSHAKE_KEY",
    "AuthenticationFailed",
    "authenticate_step",
]

HANDSHAKE_KEY: Final = 17
AUTHENTICATE_KEY: Final = 36


def _listener(ctx: RequestContext) -> Any:
    return ctx.config.sasl.get(ctx.listener)


def handle_handshake(ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ctx)
    settings = _listener(ctx)
    if settings is None:
        # Not a SASL listener: nothing to authenticate here.
        return CloseAfter(
            build(mod.SaslHandshakeResponse, error_code=ErrorCode.illegal_sasl_state, mechanisms=())
        )
    mechanism = str(request.mechanism)
    if mechanism not in settings.mechanisms:
        return CloseAfter(
            build(
                mod.SaslHandshakeResponse,
                error_code=ErrorCode.unsupported_sasl_mechanism,
                mechanisms=settings.mechanisms,
            )
        )
    session = ctx.broker.sasl_sessions.get(ctx.connection_id)
    session.mechanism, session.exchange = mechanism, None
    # v0 (before KIP-152): the tokens follow as bare size-prefixed frames, no Kafka header
    session.raw = ctx.api_version == 0
    return build(
        mod.SaslHandshakeResponse, error_code=ErrorCode.none, mechanisms=settings.mechanisms
    )


def handle_authenticate(ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ctx)
    settings = _listener(ctx)
    sessions = ctx.broker.sasl_sessions
    session = sessions.peek(ctx.connection_id) if settings is not None else None
    if session is None or session.mechanism is None:
        return CloseAfter(
            build(
                mod.SaslAuthenticateResponse,
                error_code=ErrorCode.illegal_sasl_state,
                error_message="SaslAuthenticate before a SaslHandshake",
                auth_bytes=b"",
                session_lifetime=datetime.timedelta(0),
            )
        )
    mechanism = session.mechanism
    try:
        reply, done = authenticate_step(
            broker=ctx.broker,
            settings=settings,
            session=session,
            host=ctx.client_host,
            token=bytes(request.auth_bytes),
        )
    except AuthenticationFailed:
        # Kafka's message names neither the user nor which part was wrong.
        resp = build(
            mod.SaslAuthenticateResponse,
            error_code=ErrorCode.sasl_authentication_failed,
            error_message=f"Authentication failed: Invalid username or password ({mechanism})",
            auth_bytes=b"",
            session_lifetime=datetime.timedelta(0),
        )
        delay = sessions.failed(ctx.client_host)
        if delay <= 0:
            return CloseAfter(resp)
        later: Deferred[Any] = Deferred()
        timer = threading.Timer(delay, later.complete, (CloseAfter(resp),))
        timer.daemon = True
        timer.start()
        return later
    lifetime = ctx.config.get_int("connections.max.reauth.ms") if done else 0
    return _ok(mod, reply, lifetime)


class AuthenticationFailed(Exception):
    """A token was refused (internal: always answered as SASL_AUTHENTICATION_FAILED)."""


def authenticate_step(
    *, broker: Any, settings: Any, session: SaslSession, host: str, token: bytes
) -> tuple[bytes, bool]:
    """One client token of the exchange ``session.mechanism`` names: (server token, done).

    Done: the session has its principal (and expiry). :class:`AuthenticationFailed` for a
    wrong password, an unknown user, a bad SCRAM message, an oversized token or a
    re-authentication as another user; the session is reset then.
    """
    mechanism = session.mechanism
    user: str | None = None
    reply = b""
    # Before authentication the reactor refuses larger frames; a re-authentication's token
    # over the same bound fails like a wrong password.
    if len(token) > broker.config.get_int("sasl.server.max.receive.size"):
        pass
    elif mechanism == "PLAIN":
        user = plain_authenticate(token, settings.plain_users)
    elif mechanism is not None:
        try:
            if session.exchange is None:
                session.exchange = ScramExchange(mechanism, broker.scram_credentials)
                return session.exchange.first(token), False
            exchange = session.exchange
            reply = exchange.final(token)
            user = exchange.user
        except ScramAuthError:
            user = None
    session.mechanism = session.exchange = None  # one exchange per handshake
    if user is None or (session.principal is not None and session.principal != f"User:{user}"):
        raise AuthenticationFailed(mechanism)
    broker.sasl_sessions.succeeded(host)
    reauth_ms = broker.config.get_int("connections.max.reauth.ms")
    session.principal = f"User:{user}"
    session.expires_at = time.monotonic() + reauth_ms / 1000.0 if reauth_ms > 0 else None
    return reply, True


def _ok(mod: Any, auth_bytes: bytes, lifetime_ms: int) -> Any:
    return build(
        mod.SaslAuthenticateResponse,
        error_code=ErrorCode.none,
        error_message=None,
        auth_bytes=auth_bytes,
        session_lifetime=datetime.timedelta(milliseconds=lifetime_ms),
    )


API_HANDLERS: Final = {
    HANDSHAKE_KEY: (0, 1, handle_handshake),
    AUTHENTICATE_KEY: (0, 2, handle_authenticate),
}
