"""From a request frame to a response on the wire: parse, route, encode.

Runs on the handler threads (``num.io.threads``). For each frame: parse the header
(``logstore.server.apis``), answer an ApiVersions request of an unsupported version with
Kafka's v0 ``UNSUPPORTED_VERSION`` response (KIP-511), close the connection for any other
unknown API key / version or unparseable request (logged once per burst), call the handler,
and encode its response — at once, or when its :class:`Deferred` completes.

A handler exception is a broker bug, not the client's: it is logged with its traceback and
the connection is closed, so the client retries on a fresh connection; other connections
are unaffected.

:meth:`Dispatcher.try_inline` is the reactor's inline hook (processor thread): it takes a
request only when its API says the request is cheap and cannot block — today a Fetch whose
partitions are all loaded already (see ``handlers.fetch.runs_inline``) — and runs it right
there, saving two thread hand-offs; everything else goes to the handler threads.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable
from typing import Any, Final

from logstore.server.apis import (
    API_HANDLERS,
    API_VERSIONS_KEY,
    InvalidRequestError,
    RequestHeader,
    UnsupportedVersionError,
    decode_request,
    encode_response,
    parse_request_header,
    response_header_bytes,
)
from logstore.server.context import CloseAfter, Deferred, NoResponse, RawResponse, RequestContext
from logstore.server.handlers import fetch, sasl
from logstore.server.handlers.api_versions import unsupported_version_response
from logstore.server.network import NetworkRequest, RateLimitedLog

__all__ = ["Dispatcher"]

log = logging.getLogger("logstore.server.dispatch")

_API_KEY = struct.Struct(">h")
# APIs a connection of a SASL listener may send before it is authenticated (Kafka's set).
_BEFORE_AUTH: Final = frozenset({API_VERSIONS_KEY, sasl.HANDSHAKE_KEY, sasl.AUTHENTICATE_KEY})

# api_key -> (handler it applies to, predicate(broker, request): cheap and non-blocking now).
_INLINE: Final[dict[int, tuple[Callable[..., Any], Callable[[Any, Any], bool]]]] = {
    fetch.API_KEY: (fetch.handle, fetch.runs_inline),
}


class Dispatcher:
    """Routes parsed requests to the registry's handlers for one broker."""

    def __init__(self, broker: Any) -> None:
        self._broker = broker
        self._bad = RateLimitedLog(log)
        self._sasl_listeners = frozenset(getattr(broker.config, "sasl", {}))

    def dispatch(self, req: NetworkRequest) -> None:
        if req.listener in self._sasl_listeners and self._raw_token(req):
            return
        parsed = self._parse(req)
        if parsed is not None:
            self._run(req, *parsed)

    def try_inline(self, req: NetworkRequest) -> bool:
        """Run ``req`` now on the calling (processor) thread if it is cheap; True if taken.

        A frame of an inline-capable API that cannot be parsed is answered here too (by
        closing, as :meth:`dispatch` would): that costs no more than declining it.
        """
        frame = req.frame
        if len(frame) < 2:
            return False
        if req.listener in self._sasl_listeners:
            session = self._broker.sasl_sessions.peek(req.connection_id)
            if session is None or session.raw:
                return False  # not authenticated, or a bare token (SaslHandshake v0)
        entry = _INLINE.get(_API_KEY.unpack_from(frame, 0)[0])
        if entry is None:
            return False
        handler, cheap = entry
        parsed = self._parse(req)
        if parsed is None:
            return True
        header, request = parsed
        if API_HANDLERS[header.api_key][2] is not handler or not cheap(self._broker, request):
            return False
        self._run(req, header, request)
        return True

    def _raw_token(self, req: NetworkRequest) -> bool:
        """After SaslHandshake v0 the next frames are bare SASL tokens, answered with bare
        size-prefixed tokens; True when ``req`` was one (and is answered or closed)."""
        sessions = self._broker.sasl_sessions
        session = sessions.peek(req.connection_id)
        if session is None or not session.raw:
            return False
        try:
            reply, done = sasl.authenticate_step(
                broker=self._broker,
                settings=self._broker.config.sasl[req.listener],
                session=session,
                host=req.client_host,
                token=bytes(req.frame),
            )
        except sasl.AuthenticationFailed:
            session.raw = False
            sessions.failed(req.client_host)
            self._bad.warning(
                "sasl-v0", "closing %s: SASL authentication failed (v0)", req.connection_id
            )
            req.close()
            return True
        if done:
            session.raw = False
        req.respond([struct.pack(">i", len(reply)) + reply])
        return True

    def _parse(self, req: NetworkRequest) -> tuple[RequestHeader, Any] | None:
        """Header and kio request; None when the request was answered (closed) instead."""
        frame = req.frame
        try:
            header = parse_request_header(frame)
        except UnsupportedVersionError as exc:
            if exc.api_key == API_VERSIONS_KEY and len(frame) >= 8:
                (correlation_id,) = struct.unpack_from(">i", frame, 4)
                req.respond([encode_response(correlation_id, unsupported_version_response())])
                return None
            self._bad.warning(
                "unsupported",
                "closing %s: %s (client sent an API or version this broker does not advertise)",
                req.connection_id,
                exc.message,
            )
            req.close()
            return None
        except InvalidRequestError as exc:
            self._bad.warning("malformed", "closing %s: %s", req.connection_id, exc)
            req.close()
            return None
        try:
            request = decode_request(frame, header)
        except InvalidRequestError as exc:
            self._bad.warning("malformed", "closing %s: %s", req.connection_id, exc)
            req.close()
            return None
        return header, request

    def _run(self, req: NetworkRequest, header: RequestHeader, request: Any) -> None:
        handler = API_HANDLERS[header.api_key][2]
        principal = req.principal
        if req.listener in self._sasl_listeners and header.api_key not in _BEFORE_AUTH:
            session = self._broker.sasl_sessions.peek(req.connection_id)
            if session is not None and session.valid(time.monotonic()):
                principal = str(session.principal)
            else:
                # Kafka closes a connection that sends anything else before authenticating,
                # or after its session expired without re-authenticating (KIP-368).
                self._bad.warning(
                    "unauthenticated",
                    "closing %s: api %d on SASL listener %s %s",
                    req.connection_id,
                    header.api_key,
                    req.listener,
                    "before authentication"
                    if session is None or session.principal is None
                    else "after the session expired (connections.max.reauth.ms)",
                )
                req.close()
                return
        ctx = RequestContext(
            broker=self._broker,
            config=self._broker.config,
            api_key=header.api_key,
            api_version=header.api_version,
            correlation_id=header.correlation_id,
            client_id=header.client_id,
            connection_id=req.connection_id,
            client_host=req.client_host,
            listener=req.listener,
            principal=principal,
        )
        result = handler(ctx, request)
        if isinstance(result, Deferred):
            result.add_done_callback(lambda d: self._complete(req, header, d))
        else:
            self._send(req, header, result)

    def _complete(self, req: NetworkRequest, header: RequestHeader, d: Deferred[Any]) -> None:
        try:
            response = d.result(timeout=0)
        except Exception:
            log.exception("deferred response failed; closing %s", req.connection_id)
            req.close()
            return
        try:
            self._send(req, header, response)
        except Exception:
            log.exception("cannot encode response; closing %s", req.connection_id)
            req.close()

    def _send(self, req: NetworkRequest, header: RequestHeader, response: Any) -> None:
        metrics = self._broker.metrics
        if metrics is not None:
            try:
                shown = response.response if isinstance(response, CloseAfter) else response
                metrics.request_done(header.api_key, req.received_ns, shown)
            except Exception:  # a metrics bug must not leave the client without its answer
                log.exception("metrics of api %d failed", header.api_key)
        if isinstance(response, CloseAfter):
            req.respond([encode_response(header.correlation_id, response.response)])
            req.processor.close_connection(req.connection_id)
        elif isinstance(response, NoResponse):
            req.respond([])
        elif isinstance(response, RawResponse):
            head = response_header_bytes(header.correlation_id, flexible=response.flexible_header)
            size = len(head) + response.size
            parts = [p for p in response.parts if not isinstance(p, bytes) or p]
            first = struct.pack(">i", size) + head
            lead = parts[0] if parts else None
            if isinstance(lead, bytes):
                # One write for the size, header and leading body bytes, not three packets.
                first += lead
                del parts[0]
            req.respond([first, *parts])
        else:
            req.respond([encode_response(header.correlation_id, response)])
