"""The jobs' schema registry client: Confluent Schema Registry's REST API over HTTP.

Only what decoding needs: a schema by id (``GET /schemas/ids/{id}``, with its references
resolved through ``GET /subjects/{s}/versions/{v}``), the latest version of a subject, the
subjects. Any Confluent-compatible registry answers it: the broker's own
(``schema.registry.listeners``), Confluent's, Karapace, Redpanda's.

Why HTTP and not ``_schemas`` read from the log dirs: the registry is the authority on what a
schema id means (soft and hard deletes, references, modes), and replaying ``_schemas``
ourselves would be a second implementation of its store to keep in step; the log dirs the
jobs see may also lag the broker's page cache or be elsewhere (a Confluent registry on another
cluster). A registry that does not answer fails the run (exit 1, retried): nothing decoded is
committed without its schema.

Thread-safety: a :class:`RegistryClient` caches answers in plain dicts; use one per thread or
task. Schemas by id never change (ids are never reused), so they are cached for the client's
life; subjects' latest versions are cached for the life of the client too (one run).
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from logstore.errors import LoglakeError

__all__ = ["RegisteredSchema", "RegistryClient", "RegistryError", "SchemaNotFoundError"]

_CT = "application/vnd.schemaregistry.v1+json"


class RegistryError(LoglakeError):
    """The registry did not answer, or answered something other than the API's JSON."""


class SchemaNotFoundError(RegistryError):
    """The registry has no such schema id or subject (its 404: 40401, 40403)."""


@dataclass(frozen=True)
class RegisteredSchema:
    """A schema as the registry holds it: ``schema_type`` AVRO, JSON or PROTOBUF, ``text`` as
    registered, ``references`` resolved (name -> schema), ``id``/``version`` where known."""

    schema_type: str
    text: str
    id: int | None = None
    subject: str | None = None
    version: int | None = None
    references: dict[str, RegisteredSchema] = field(default_factory=dict)


class RegistryClient:
    """A client of the registry at ``url`` (``http(s)://host:port[/path]``; user info in the
    URL is sent as basic auth)."""

    def __init__(self, url: str, *, timeout_s: float = 30.0) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise LoglakeError(f"schema registry URL {url!r}: expected http(s)://host:port")
        self._auth: str | None = None
        if parts.username is not None:
            user = urllib.parse.unquote(parts.username)
            password = urllib.parse.unquote(parts.password or "")
            self._auth = base64.b64encode(f"{user}:{password}".encode()).decode()
            netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
            parts = parts._replace(netloc=netloc)
        self.url = urllib.parse.urlunsplit(parts).rstrip("/")
        self._timeout = timeout_s
        self._by_id: dict[int, RegisteredSchema] = {}
        self._latest: dict[str, RegisteredSchema | None] = {}

    def _get(self, path: str) -> Any:
        request = urllib.request.Request(self.url + path, headers={"Accept": _CT})
        if self._auth is not None:
            request.add_header("Authorization", f"Basic {self._auth}")
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            body = exc.read().decode("utf-8", "replace")[:300]
            if exc.code == 404:
                raise SchemaNotFoundError(f"{path}: {body}", path=self.url) from None
            raise RegistryError(f"GET {path}: HTTP {exc.code} {body}", path=self.url) from None
        except (OSError, ValueError) as exc:
            raise RegistryError(f"GET {path}: {exc}", path=self.url) from None

    def _schema(self, body: dict[str, Any], **known: Any) -> RegisteredSchema:
        refs = {
            str(r["name"]): self.version(str(r["subject"]), int(r["version"]))
            for r in body.get("references") or ()
        }
        return RegisteredSchema(
            schema_type=str(body.get("schemaType") or "AVRO"),
            text=str(body["schema"]),
            id=known.get("id", body.get("id")),
            subject=known.get("subject", body.get("subject")),
            version=known.get("version", body.get("version")),
            references=refs,
        )

    def by_id(self, schema_id: int) -> RegisteredSchema:
        """The schema with id ``schema_id`` (:class:`SchemaNotFoundError` when unknown)."""
        if schema_id not in self._by_id:
            self._by_id[schema_id] = self._schema(
                self._get(f"/schemas/ids/{schema_id}"), id=schema_id
            )
        return self._by_id[schema_id]

    def version(self, subject: str, version: int | str) -> RegisteredSchema:
        """Version ``version`` (a number or ``latest``) of ``subject``."""
        quoted = urllib.parse.quote(subject, safe="")
        return self._schema(self._get(f"/subjects/{quoted}/versions/{version}"))

    def latest(self, subject: str) -> RegisteredSchema | None:
        """The latest version of ``subject``, None when the registry has no such subject."""
        if subject not in self._latest:
            try:
                self._latest[subject] = self.version(subject, "latest")
            except SchemaNotFoundError:
                self._latest[subject] = None
        return self._latest[subject]

    def subjects(self) -> list[str]:
        """Every live subject."""
        return [str(s) for s in self._get("/subjects")]
