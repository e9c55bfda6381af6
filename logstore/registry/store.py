"""The registry's state and its log: subjects, versions, global ids, configs and modes, kept
in the compacted topic ``_schemas`` in Confluent's record format.

Records (key and value are JSON, as Confluent's ``KafkaStore`` writes them, so a Confluent
registry could take the topic over):

- ``{"keytype":"SCHEMA","subject":s,"version":v,"magic":1}`` ->
  ``{"subject","version","id","schema","schemaType" (absent for AVRO),"references","deleted"}``;
  a null value (tombstone) is a permanent delete of that version;
- ``{"keytype":"CONFIG","subject":s|null,"magic":0}`` -> ``{"compatibilityLevel": L}``;
- ``{"keytype":"MODE","subject":s|null,"magic":0}`` -> ``{"mode": M}``;
- ``{"keytype":"DELETE_SUBJECT","subject":s,"magic":0}`` -> ``{"subject": s, "version": v}``
  (a soft delete of the subject up to version ``v``; each version's SCHEMA record is rewritten
  with ``deleted: true`` too).

Invariants: every change is appended (one batch) *before* the in-memory state changes, under
one lock, so the state is always what the log says. Ids are global: the same schema (type,
canonical text, references) gets the same id in every subject; a new id is one above the
highest id in the log, so an id is not reused while its records are in the log (every record
stays: nothing but a lake compaction job cleans ``_schemas``).

Crash behaviour: a change whose append failed is not applied (the client gets 50001); a crash
after the append leaves it in the log, and :meth:`SchemaStore.load` replays the whole topic on
start. Thread-safety: every public method takes the store's lock.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Iterable
from typing import Any

from logstore.registry.errors import (
    IncompatibleSchemaError,
    InvalidSchemaError,
    RegistryError,
    SchemaNotFoundError,
    SubjectNotFoundError,
    VersionNotFoundError,
)
from logstore.registry.formats import ParsedSchema, canonical, parse, read_problems

__all__ = [
    "COMPATIBILITY_LEVELS",
    "MODES",
    "SCHEMAS_TOPIC",
    "SchemaStore",
    "Version",
    "schema_fields",
]

SCHEMAS_TOPIC = "_schemas"
COMPATIBILITY_LEVELS = (
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
    "NONE",
)
MODES = ("READWRITE", "READONLY", "IMPORT")

Append = Callable[[list[tuple[bytes, bytes | None]]], None]


@dataclasses.dataclass
class Version:
    subject: str
    version: int
    id: int
    schema: str
    schema_type: str
    references: list[dict[str, Any]]
    deleted: bool = False

    def value(self) -> dict[str, Any]:
        """The ``_schemas`` record value (and the body of GET .../versions/{v})."""
        out: dict[str, Any] = {
            "subject": self.subject,
            "version": self.version,
            "id": self.id,
            "schema": self.schema,
        }
        if self.schema_type != "AVRO":
            out["schemaType"] = self.schema_type
        if self.references:
            out["references"] = self.references
        return out


def _key(keytype: str, subject: str | None, **extra: Any) -> bytes:
    body: dict[str, Any] = {"keytype": keytype, "subject": subject, **extra}
    body.setdefault("magic", 0)
    return json.dumps(body, separators=(",", ":")).encode()


class SchemaStore:
    """Subjects and schemas over ``_schemas`` (see the module docstring)."""

    def __init__(self, *, append: Append) -> None:
        self._append = append
        self._lock = threading.RLock()
        self._subjects: dict[str, dict[int, Version]] = {}
        self._by_id: dict[int, Version] = {}
        self._parsed: dict[int, ParsedSchema] = {}
        self._configs: dict[str | None, str] = {}
        self._modes: dict[str | None, str] = {}
        self._max_id = 0

    # --- loading -----------------------------------------------------------------------

    def load(self, records: Iterable[tuple[bytes | None, bytes | None]]) -> None:
        """Replay ``_schemas`` records (key, value) in log order; a record that is not JSON or
        not one of the key types is skipped (Confluent skips NOOP and unknown keys too)."""
        with self._lock:
            for key, value in records:
                try:
                    k = json.loads(key) if key else None
                    v = json.loads(value) if value is not None else None
                except ValueError:
                    continue
                if isinstance(k, dict):
                    self._apply(k, v)

    def _apply(self, k: dict[str, Any], v: Any) -> None:
        keytype, subject = k.get("keytype"), k.get("subject")
        if keytype == "SCHEMA" and isinstance(subject, str):
            versions = self._subjects.setdefault(subject, {})
            if v is None:
                versions.pop(int(k["version"]), None)
                if not versions:
                    self._subjects.pop(subject, None)
                return
            ver = Version(
                subject,
                int(v["version"]),
                int(v["id"]),
                v["schema"],
                v.get("schemaType") or "AVRO",
                list(v.get("references") or []),
                bool(v.get("deleted", False)),
            )
            versions[ver.version] = ver
            self._by_id.setdefault(ver.id, ver)
            self._max_id = max(self._max_id, ver.id)
        elif keytype == "CONFIG":
            if v is None:
                self._configs.pop(subject, None)
            else:
                self._configs[subject] = v["compatibilityLevel"]
        elif keytype == "MODE":
            if v is None:
                self._modes.pop(subject, None)
            else:
                self._modes[subject] = v["mode"]
        elif keytype == "DELETE_SUBJECT" and isinstance(v, dict):
            for ver in self._subjects.get(str(subject), {}).values():
                if ver.version <= int(v["version"]):
                    ver.deleted = True

    def _write(self, records: list[tuple[dict[str, Any], Any]]) -> None:
        """Append then apply (the module docstring's invariant)."""
        encoded: list[tuple[bytes, bytes | None]] = []
        for k, v in records:
            kb = json.dumps(k, separators=(",", ":")).encode()
            encoded.append((kb, None if v is None else json.dumps(v).encode()))
        try:
            self._append(encoded)
        except Exception as exc:
            raise RegistryError(
                f"Error while writing to {SCHEMAS_TOPIC}: {exc}", status=500, error_code=50001
            ) from exc
        for k, v in records:
            self._apply(k, v)

    # --- lookups -----------------------------------------------------------------------

    def subjects(self, *, deleted: bool = False) -> list[str]:
        with self._lock:
            return sorted(
                s
                for s, vs in self._subjects.items()
                if any(deleted or not v.deleted for v in vs.values())
            )

    def _live(self, subject: str, *, deleted: bool = False) -> dict[int, Version]:
        vs = {n: v for n, v in self._subjects.get(subject, {}).items() if deleted or not v.deleted}
        if not vs:
            raise SubjectNotFoundError(subject)
        return vs

    def versions(self, subject: str, *, deleted: bool = False) -> list[int]:
        with self._lock:
            return sorted(self._live(subject, deleted=deleted))

    def version(self, subject: str, version: str | int, *, deleted: bool = False) -> Version:
        with self._lock:
            vs = self._live(subject, deleted=deleted)
            n = _version_number(version)
            if n == -1:
                return vs[max(vs)]
            if n not in vs:
                raise VersionNotFoundError(subject, n)
            return vs[n]

    def by_id(self, schema_id: int) -> Version:
        with self._lock:
            ver = self._by_id.get(schema_id)
            if ver is None or not any(
                v.id == schema_id for vs in self._subjects.values() for v in vs.values()
            ):
                raise SchemaNotFoundError(f"Schema {schema_id} not found")
            return ver

    def id_usages(self, schema_id: int, *, deleted: bool = False) -> list[Version]:
        with self._lock:
            self.by_id(schema_id)
            return [
                v
                for s in sorted(self._subjects)
                for _, v in sorted(self._subjects[s].items())
                if v.id == schema_id and (deleted or not v.deleted)
            ]

    def referenced_by(self, subject: str, version: int) -> list[int]:
        with self._lock:
            return sorted(
                {
                    v.id
                    for vs in self._subjects.values()
                    for v in vs.values()
                    if not v.deleted
                    and any(
                        r.get("subject") == subject and int(r.get("version", -2)) == version
                        for r in v.references
                    )
                }
            )

    def config(self, subject: str | None, *, fallback: bool = True) -> str | None:
        with self._lock:
            level = self._configs.get(subject)
            if level is None and fallback:
                level = self._configs.get(None, "BACKWARD")
            return level

    def mode(self, subject: str | None, *, fallback: bool = True) -> str | None:
        with self._lock:
            mode = self._modes.get(subject)
            if mode is None and fallback:
                mode = self._modes.get(None, "READWRITE")
            return mode

    # --- parsing and compatibility ------------------------------------------------------

    def _parsed_of(self, ver: Version) -> ParsedSchema:
        p = self._parsed.get(ver.id)
        if p is None:
            p = parse(ver.schema_type, ver.schema, references=self.resolve(ver.references))
            self._parsed[ver.id] = p
        return p

    def resolve(self, references: list[dict[str, Any]]) -> list[ParsedSchema]:
        out = []
        for ref in references:
            if not isinstance(ref, dict) or not {"name", "subject", "version"} <= set(ref):
                raise InvalidSchemaError(f"a reference needs name, subject and version: {ref!r}")
            try:
                target = self.version(ref["subject"], ref["version"])
            except (SubjectNotFoundError, VersionNotFoundError) as exc:
                raise InvalidSchemaError(f"reference {ref['name']!r}: {exc.message}") from None
            out.append(self._parsed_of(target))
        return out

    def check(
        self, subject: str, parsed: ParsedSchema, *, against: list[Version], level: str
    ) -> list[str]:
        """Why ``parsed`` breaks ``level`` against ``against`` (oldest first; empty: fine)."""
        if level == "NONE" or not against:
            return []
        targets = against if level.endswith("_TRANSITIVE") else against[-1:]
        out: list[str] = []
        for old in targets:
            prev = self._parsed_of(old)
            if level.startswith(("BACKWARD", "FULL")):
                out += [f"v{old.version} (backward): {m}" for m in read_problems(parsed, prev)]
            if level.startswith(("FORWARD", "FULL")):
                out += [f"v{old.version} (forward): {m}" for m in read_problems(prev, parsed)]
        return out

    def compatibility(
        self, subject: str, body: dict[str, Any], *, version: str | None = None
    ) -> list[str]:
        """POST /compatibility/subjects/{s}/versions[/{v}]: why ``body``'s schema breaks the
        subject's level against version ``v`` (the level's non-transitive form), or against
        the versions the level names when ``v`` is None (no version: compatible)."""
        schema_type, text, refs = schema_fields(body)
        with self._lock:
            parsed = parse(schema_type, text, references=self.resolve(refs))
            level = str(self.config(subject))
            versions = self._subjects.get(subject, {})
            live = [versions[n] for n in sorted(versions) if not versions[n].deleted]
            if version is None:
                against = live
            elif _version_number(version) == -1:
                against = live[-1:]  # latest of nothing: compatible, as Confluent
                level = level.replace("_TRANSITIVE", "")
            else:
                if not live:  # Confluent answers 40402 here, not 40401
                    raise VersionNotFoundError(subject, version)
                against = [self.version(subject, version)]
                level = level.replace("_TRANSITIVE", "")
            return self.check(subject, parsed, against=against, level=level)

    # --- changes -----------------------------------------------------------------------

    def lookup(self, subject: str, body: dict[str, Any], *, deleted: bool = False) -> Version:
        """POST /subjects/{s}: the version of ``subject`` holding this schema."""
        schema_type, text, refs = schema_fields(body)
        with self._lock:
            vs = self._live(subject, deleted=deleted)
            want = canonical(schema_type, text)
            for n in sorted(vs):
                v = vs[n]
                if (
                    v.schema_type == schema_type
                    and canonical(v.schema_type, v.schema) == want
                    and v.references == refs
                ):
                    return v
            raise SchemaNotFoundError()

    def register(self, subject: str, body: dict[str, Any]) -> int:
        """POST /subjects/{s}/versions: the schema's id (idempotent: the same schema in the same
        subject returns its existing id and adds no version)."""
        schema_type, text, refs = schema_fields(body)
        with self._lock:
            mode = self.mode(subject)
            if mode == "READONLY":
                raise RegistryError(
                    f"Subject {subject} is in read-only mode", status=422, error_code=42205
                )
            parsed = parse(schema_type, text, references=self.resolve(refs))
            want = canonical(schema_type, text)
            versions = self._subjects.get(subject, {})
            live = [versions[n] for n in sorted(versions) if not versions[n].deleted]
            for v in live:
                if (
                    v.schema_type == schema_type
                    and canonical(v.schema_type, v.schema) == want
                    and v.references == refs
                ):
                    return v.id
            if mode != "IMPORT":
                problems = self.check(
                    subject, parsed, against=live, level=str(self.config(subject))
                )
                if problems:
                    raise IncompatibleSchemaError(problems)
            schema_id, version = self._new_id_and_version(
                subject=subject, schema_type=schema_type, want=want, refs=refs, body=body, mode=mode
            )
            ver = Version(subject, version, schema_id, text, schema_type, refs)
            self._write(
                [
                    (
                        {"keytype": "SCHEMA", "subject": subject, "version": version, "magic": 1},
                        {
                            **ver.value(),
                            "schemaType": schema_type,
                            "references": refs,
                            "deleted": False,
                        },
                    )
                ]
            )
            self._parsed.setdefault(schema_id, parsed)
            return schema_id

    def _new_id_and_version(
        self,
        *,
        subject: str,
        schema_type: str,
        want: str,
        refs: list[dict[str, Any]],
        body: dict[str, Any],
        mode: str | None,
    ) -> tuple[int, int]:
        existing = self._subjects.get(subject, {})
        version = max(existing, default=0) + 1
        schema_id = next(
            (
                i
                for i, v in self._by_id.items()
                if v.schema_type == schema_type
                and canonical(v.schema_type, v.schema) == want
                and v.references == refs
            ),
            self._max_id + 1,
        )
        if mode == "IMPORT" and body.get("id") is not None:
            asked = int(body["id"])
            other = self._by_id.get(asked)
            if other is not None and canonical(other.schema_type, other.schema) != want:
                raise RegistryError(
                    f"Overwrite new schema with id {asked} is not permitted.",
                    status=422,
                    error_code=42205,
                )
            schema_id = asked
            version = int(body.get("version") or version)
        return schema_id, version

    def delete_version(self, subject: str, version: str | int, *, permanent: bool) -> int:
        with self._lock:
            self._writable(subject)
            vs = self._live(subject, deleted=True)
            n = _version_number(version)
            ver = vs[max(vs)] if n == -1 else vs.get(n)
            if ver is None:
                raise VersionNotFoundError(subject, n)
            if permanent and not ver.deleted:
                raise RegistryError(
                    f"Subject '{subject}' Version {ver.version} was not deleted first before"
                    " being permanently deleted",
                    status=404,
                    error_code=40407,
                )
            if not permanent and ver.deleted:
                raise RegistryError(
                    f"Subject '{subject}' Version {ver.version} was soft deleted. Set"
                    " permanent=true to delete permanently",
                    status=404,
                    error_code=40406,
                )
            if self.referenced_by(subject, ver.version):
                raise RegistryError(
                    f"One or more references exist to the schema {{subject={subject},"
                    f" version={ver.version}}}",
                    status=422,
                    error_code=42206,
                )
            key = {"keytype": "SCHEMA", "subject": subject, "version": ver.version, "magic": 1}
            if permanent:
                self._write([(key, None)])
            else:
                value = {**ver.value(), "schemaType": ver.schema_type, "deleted": True}
                value["references"] = ver.references
                self._write([(key, value)])
            return ver.version

    def delete_subject(self, subject: str, *, permanent: bool) -> list[int]:
        with self._lock:
            self._writable(subject)
            vs = self._live(subject, deleted=True)
            if permanent:
                if any(not v.deleted for v in vs.values()):
                    raise RegistryError(
                        f"Subject '{subject}' was not deleted first before being permanently"
                        " deleted",
                        status=404,
                        error_code=40405,
                    )
                numbers = sorted(vs)
                self._write(
                    [
                        ({"keytype": "SCHEMA", "subject": subject, "version": n, "magic": 1}, None)
                        for n in numbers
                    ]
                )
                return numbers
            live = sorted(n for n, v in vs.items() if not v.deleted)
            if not live:
                raise RegistryError(
                    f"Subject '{subject}' was soft deleted. Set permanent=true to delete"
                    " permanently",
                    status=404,
                    error_code=40404,
                )
            for n in live:
                if self.referenced_by(subject, n):
                    raise RegistryError(
                        f"One or more references exist to the schema {{subject={subject},"
                        f" version={n}}}",
                        status=422,
                        error_code=42206,
                    )
            records: list[tuple[dict[str, Any], Any]] = []
            for n in live:
                v = vs[n]
                value = {**v.value(), "schemaType": v.schema_type, "references": v.references}
                records.append(
                    (
                        {"keytype": "SCHEMA", "subject": subject, "version": n, "magic": 1},
                        {**value, "deleted": True},
                    )
                )
            records.append(
                (
                    {"keytype": "DELETE_SUBJECT", "subject": subject, "magic": 0},
                    {"subject": subject, "version": max(live)},
                )
            )
            self._write(records)
            return live

    def set_config(self, subject: str | None, level: Any) -> str:
        if not isinstance(level, str) or level.upper() not in COMPATIBILITY_LEVELS:
            raise RegistryError(
                f"Invalid compatibility level {level!r}: one of {', '.join(COMPATIBILITY_LEVELS)}",
                status=422,
                error_code=42203,
            )
        with self._lock:
            key = {"keytype": "CONFIG", "subject": subject, "magic": 0}
            self._write([(key, {"compatibilityLevel": level.upper()})])
            return level.upper()

    def delete_config(self, subject: str | None) -> str:
        with self._lock:
            previous = self.config(subject)
            if subject is not None and self._configs.get(subject) is None:
                raise SubjectNotFoundError(subject)
            self._write([({"keytype": "CONFIG", "subject": subject, "magic": 0}, None)])
            return str(previous)

    def set_mode(self, subject: str | None, mode: Any) -> str:
        if not isinstance(mode, str) or mode.upper() not in MODES:
            raise RegistryError(
                f"Invalid mode {mode!r}: one of {', '.join(MODES)}", status=422, error_code=42204
            )
        with self._lock:
            self._write(
                [({"keytype": "MODE", "subject": subject, "magic": 0}, {"mode": mode.upper()})]
            )
            return mode.upper()

    def delete_mode(self, subject: str | None) -> str:
        with self._lock:
            previous = self.mode(subject)
            self._write([({"keytype": "MODE", "subject": subject, "magic": 0}, None)])
            return str(previous)

    def _writable(self, subject: str) -> None:
        if self.mode(subject) == "READONLY":
            raise RegistryError(
                f"Subject {subject} is in read-only mode", status=422, error_code=42205
            )


def _version_number(version: str | int) -> int:
    """``latest`` and -1 are the newest version; otherwise 1..2^31-1, else 42202."""
    if version in ("latest", -1, "-1"):
        return -1
    try:
        n = int(version)
    except (TypeError, ValueError):
        n = 0
    if not 1 <= n <= 2**31 - 1:
        raise RegistryError(
            f"The specified version '{version}' is not a valid version id. Allowed values are"
            ' between [1, 2^31-1] and the string "latest"',
            status=422,
            error_code=42202,
        )
    return n


def schema_fields(body: dict[str, Any]) -> tuple[str, str, list[dict[str, Any]]]:
    if not isinstance(body, dict):
        raise RegistryError("the request body is a JSON object", status=422, error_code=422)
    text = body.get("schema")
    if not isinstance(text, str) or not text:
        raise InvalidSchemaError("'schema' (a string) is required")
    schema_type = body.get("schemaType") or "AVRO"
    refs = body.get("references") or []
    if not isinstance(refs, list):
        raise InvalidSchemaError("'references' is a list")
    return str(schema_type).upper(), text, [dict(r) for r in refs]
