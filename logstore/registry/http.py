"""Confluent Schema Registry's REST API over :class:`~logstore.registry.store.SchemaStore`.

A stdlib ``ThreadingHTTPServer`` (one daemon thread per connection, never the broker's network
threads); a request body above :data:`MAX_BODY` answers 413 unread, a socket idle for
:data:`SOCKET_TIMEOUT_S` is closed. Every answer is JSON with content type
``application/vnd.schemaregistry.v1+json``; every failure is Confluent's
``{"error_code", "message"}`` (an unexpected exception: 500/50001, logged, never a crash).

Security (``schema.registry.*`` broker keys, :mod:`logstore.registry`): with a TLS context the
listening socket is wrapped (``https``); the handshake runs lazily in the connection's own
thread on its first read (``do_handshake_on_connect=False``), so a client that never finishes
it holds only its thread, for at most :data:`SOCKET_TIMEOUT_S`, never the accept loop. With an
``authenticate(user, password) -> bool`` every request needs an ``Authorization: Basic``
header naming a user it accepts, checked before the body is read; otherwise 401 with
``WWW-Authenticate: Basic realm="SchemaRegistry"`` and Confluent's ``{"error_code": 401,
"message": "Unauthorized"}``.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
import ssl
import sys
import threading
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from logstore.registry.errors import RegistryError
from logstore.registry.formats import SCHEMA_TYPES
from logstore.registry.store import SchemaStore, Version

__all__ = ["CONTENT_TYPE", "MAX_BODY", "RegistryServer"]

log = logging.getLogger("logstore.registry")

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
MAX_BODY = 16 * 1024 * 1024
SOCKET_TIMEOUT_S = 30.0

Route = Callable[["_Request"], Any]
Authenticate = Callable[[str, str], bool]
REALM = "SchemaRegistry"


class _Request:
    def __init__(self, match: re.Match[str], query: dict[str, str], body: Any) -> None:
        self.args = [urllib.parse.unquote(g) for g in match.groups()]
        self.query = query
        self.body = body

    def flag(self, name: str) -> bool:
        return self.query.get(name, "false").lower() == "true"


def _schema_body(v: Version) -> dict[str, Any]:
    out: dict[str, Any] = {"schema": v.schema}
    if v.schema_type != "AVRO":
        out["schemaType"] = v.schema_type
    if v.references:
        out["references"] = v.references
    return out


def _raw_schema(v: Version) -> Any:
    """``.../schema``: the schema itself, as Confluent answers it (a JSON document for AVRO and
    JSON, the text for PROTOBUF)."""
    if v.schema_type == "PROTOBUF":
        return v.schema
    try:
        return json.loads(v.schema)
    except ValueError:
        return v.schema


def _schema_id(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise RegistryError(f"Schema {text} not found", status=404, error_code=40403) from None


def _routes(store: SchemaStore) -> list[tuple[str, str, Route]]:
    s = store

    def compat(r: _Request) -> Any:
        version = r.args[1] if len(r.args) > 1 else None
        problems = s.compatibility(r.args[0], r.body, version=version)
        out: dict[str, Any] = {"is_compatible": not problems}
        if r.flag("verbose"):
            out["messages"] = problems
        return out

    def subject_config(r: _Request) -> Any:
        level = s.config(r.args[0], fallback=r.flag("defaultToGlobal"))
        if level is None:
            raise RegistryError(
                f"Subject '{r.args[0]}' does not have subject-level compatibility configured",
                status=404,
                error_code=40408,
            )
        return {"compatibilityLevel": level}

    def subject_mode(r: _Request) -> Any:
        mode = s.mode(r.args[0], fallback=r.flag("defaultToGlobal"))
        if mode is None:
            raise RegistryError(
                f"Subject '{r.args[0]}' does not have subject-level mode configured",
                status=404,
                error_code=40409,
            )
        return {"mode": mode}

    def level_of(r: _Request) -> Any:
        return (r.body or {}).get("compatibility") if isinstance(r.body, dict) else None

    def mode_of(r: _Request) -> Any:
        return r.body.get("mode") if isinstance(r.body, dict) else None

    sub = r"/subjects/([^/]+)"
    ver = sub + r"/versions/([^/]+)"
    return [
        ("GET", r"/", lambda r: {}),
        ("GET", r"/schemas/types", lambda r: list(SCHEMA_TYPES)),
        ("GET", r"/schemas/ids/([^/]+)", lambda r: _schema_body(s.by_id(_schema_id(r.args[0])))),
        (
            "GET",
            r"/schemas/ids/([^/]+)/schema",
            lambda r: _raw_schema(s.by_id(_schema_id(r.args[0]))),
        ),
        (
            "GET",
            r"/schemas/ids/([^/]+)/subjects",
            lambda r: sorted(
                {v.subject for v in s.id_usages(_schema_id(r.args[0]), deleted=r.flag("deleted"))}
            ),
        ),
        (
            "GET",
            r"/schemas/ids/([^/]+)/versions",
            lambda r: [
                {"subject": v.subject, "version": v.version}
                for v in s.id_usages(_schema_id(r.args[0]), deleted=r.flag("deleted"))
            ],
        ),
        ("GET", r"/subjects", lambda r: s.subjects(deleted=r.flag("deleted"))),
        ("POST", sub, lambda r: s.lookup(r.args[0], r.body, deleted=r.flag("deleted")).value()),
        (
            "DELETE",
            sub,
            lambda r: s.delete_subject(r.args[0], permanent=r.flag("permanent")),
        ),
        ("GET", sub + r"/versions", lambda r: s.versions(r.args[0], deleted=r.flag("deleted"))),
        ("POST", sub + r"/versions", lambda r: {"id": s.register(r.args[0], r.body)}),
        ("GET", ver, lambda r: s.version(*r.args, deleted=r.flag("deleted")).value()),
        ("GET", ver + r"/schema", lambda r: _raw_schema(s.version(*r.args))),
        (
            "GET",
            ver + r"/referencedby",
            lambda r: s.referenced_by(r.args[0], s.version(*r.args).version),
        ),
        (
            "DELETE",
            ver,
            lambda r: s.delete_version(r.args[0], r.args[1], permanent=r.flag("permanent")),
        ),
        ("GET", r"/config", lambda r: {"compatibilityLevel": s.config(None)}),
        ("PUT", r"/config", lambda r: {"compatibility": s.set_config(None, level_of(r))}),
        ("DELETE", r"/config", lambda r: {"compatibilityLevel": s.delete_config(None)}),
        ("GET", r"/config/([^/]+)", subject_config),
        (
            "PUT",
            r"/config/([^/]+)",
            lambda r: {"compatibility": s.set_config(r.args[0], level_of(r))},
        ),
        (
            "DELETE",
            r"/config/([^/]+)",
            lambda r: {"compatibilityLevel": s.delete_config(r.args[0])},
        ),
        ("GET", r"/mode", lambda r: {"mode": s.mode(None)}),
        ("PUT", r"/mode", lambda r: {"mode": s.set_mode(None, mode_of(r))}),
        ("DELETE", r"/mode", lambda r: {"mode": s.delete_mode(None)}),
        ("GET", r"/mode/([^/]+)", subject_mode),
        ("PUT", r"/mode/([^/]+)", lambda r: {"mode": s.set_mode(r.args[0], mode_of(r))}),
        ("DELETE", r"/mode/([^/]+)", lambda r: {"mode": s.delete_mode(r.args[0])}),
        ("POST", r"/compatibility" + ver, compat),
        ("POST", r"/compatibility" + sub + r"/versions", compat),
    ]


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A failed TLS handshake (plaintext on the https port, a client certificate the
        # truststore refuses) or a reset connection: that connection only, one log line.
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            log.info("schema registry: connection from %s closed: %s", client_address, exc)
        else:
            super().handle_error(request, client_address)


class RegistryServer:
    """The HTTP server; :meth:`start` binds (port 0: the OS chooses) and serves in a thread.

    ``tls``: a server context (https); ``authenticate``: HTTP basic auth (module docstring)."""

    def __init__(
        self,
        store: SchemaStore,
        *,
        tls: ssl.SSLContext | None = None,
        authenticate: Authenticate | None = None,
    ) -> None:
        self._routes = [
            (method, re.compile(pattern + r"/?\Z"), fn) for method, pattern, fn in _routes(store)
        ]
        self._tls = tls
        self._authenticate = authenticate
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self, host: str, port: int) -> tuple[str, int]:
        routes = self._routes
        authenticate = self._authenticate

        class Handler(BaseHTTPRequestHandler):
            timeout = SOCKET_TIMEOUT_S
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("%s " + format, self.address_string(), *args)

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _error(self, status: int, code: int, message: str) -> None:
                self._send(status, {"error_code": code, "message": message})

            def _authorized(self) -> bool:
                """HTTP basic auth (RFC 7617) when required; False: 401 sent, connection
                closed (the body, if any, is not read)."""
                if authenticate is None:
                    return True
                scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
                try:
                    user, sep, password = (
                        base64.b64decode(token.strip(), validate=True)
                        .decode("utf-8")
                        .partition(":")
                    )
                except (binascii.Error, UnicodeDecodeError):
                    sep = ""
                if scheme.lower() == "basic" and sep and user and authenticate(user, password):
                    return True
                self.close_connection = True
                data = json.dumps({"error_code": 401, "message": "Unauthorized"}).encode()
                self.send_response(401)
                self.send_header("WWW-Authenticate", f'Basic realm="{REALM}"')
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return False

            def _handle(self) -> None:
                if not self._authorized():
                    return
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    length = -1
                if length < 0:
                    self.close_connection = True
                    self._error(400, 400, "bad Content-Length")
                    return
                if length > MAX_BODY:
                    self.close_connection = True
                    self._error(413, 413, f"request body over {MAX_BODY} bytes")
                    return
                raw = self.rfile.read(length) if length else b""
                url = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(url.query))
                path = url.path.rstrip("/") or "/"
                allowed = False
                for method, pattern, fn in routes:
                    m = pattern.match(path)
                    if m is None:
                        continue
                    allowed = True
                    if method != self.command:
                        continue
                    try:
                        body = json.loads(raw) if raw.strip() else None
                    except ValueError as exc:
                        self._error(400, 400, f"Unrecognized JSON: {exc}")
                        return
                    try:
                        self._send(200, fn(_Request(m, query, body)))
                    except RegistryError as exc:
                        self._error(exc.status, exc.error_code, exc.message)
                    except Exception as exc:
                        log.exception("schema registry: %s %s failed", self.command, self.path)
                        self._error(500, 50001, f"Error in the backend data store: {exc}")
                    return
                if allowed:
                    self._error(405, 405, f"HTTP {self.command} is not allowed on {path}")
                else:
                    self._error(404, 404, f"HTTP 404 Not Found: {path}")

            do_GET = do_POST = do_PUT = do_DELETE = _handle  # noqa: N815

        httpd = _Server((host, port), Handler)
        httpd.daemon_threads = True
        if self._tls is not None:
            httpd.socket = self._tls.wrap_socket(
                httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, name="schema-registry", daemon=True
        )
        self._thread.start()
        bound_host, bound_port = httpd.server_address[:2]
        return str(bound_host), int(bound_port)

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
