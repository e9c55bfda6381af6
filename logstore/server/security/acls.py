"""ACL bindings, filters and their durable store, with Kafka's codes and matching rules.

A binding is Kafka's ``AclBinding``: a resource pattern (type, name, pattern type) and an
entry (principal, host, operation, permission). The numeric codes are Kafka's wire codes
(``ResourceType``, ``PatternType``, ``AclOperation``, ``AclPermissionType``), so bindings go
to and from CreateAcls/DescribeAcls/DeleteAcls without translation.

Filters (DescribeAcls, DeleteAcls) match as Kafka's ``AclBindingFilter.matches``: ``ANY``
matches every value, a null name/principal/host matches every one; pattern type ``MATCH``
matches the stored patterns that would apply to the filter's name (the literal name, the
literal ``*`` wildcard, and every prefix of it stored as ``PREFIXED``); a filter naming a
concrete pattern type matches that type with that exact name.

File: ``<first log dir>/__acls.json``, ``{"version": 1, "acls": [[resource_type,
resource_name, pattern_type, principal, host, operation, permission], ...]}``. Every change
rewrites it with :func:`logstore.storage.files.write_atomically` (tmp, fsync, rename,
directory fsync), and is applied in memory only once durable: after a crash (kill -9) the
file holds the ACLs before or after the last change, never a mix, and a change the client
saw acknowledged is there. A file that does not parse stops the broker (:class:`AclStoreError`
naming it): ACLs are never silently dropped, which would widen or narrow access unseen.

Index (:class:`AclIndex`): literal bindings by ``(resource type, name)`` (the ``*`` wildcard is
the literal name ``*``), prefixed ones by ``(resource type, prefix)`` with the set of prefix
lengths per resource type, so the bindings that apply to one resource are found with a few
dict lookups whatever the number of ACLs (Kafka scans a sorted set; a topic name is at most
249 characters and the lengths in use are few). An index is immutable: a change builds a new
one and swaps the reference, so readers (every request handler, the network threads' inline
fetches) never lock.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Final

from logstore.errors import LoglakeError
from logstore.storage.files import write_atomically

__all__ = [
    "CLUSTER_NAME",
    "FILE_NAME",
    "WILDCARD",
    "WILDCARD_PRINCIPAL",
    "AclBinding",
    "AclFilter",
    "AclIndex",
    "AclOperation",
    "AclPermission",
    "AclStore",
    "AclStoreError",
    "InvalidAclError",
    "PatternType",
    "ResourceType",
    "validate_binding",
]

FILE_NAME: Final = "__acls.json"
WILDCARD: Final = "*"
WILDCARD_PRINCIPAL: Final = "User:*"
CLUSTER_NAME: Final = "kafka-cluster"


class ResourceType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14
    TWO_PHASE_COMMIT = 15


class AclPermission(IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


class AclStoreError(LoglakeError):
    """The ACL file cannot be read or parsed."""


class InvalidAclError(LoglakeError):
    """A binding or filter Kafka refuses with INVALID_REQUEST."""


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL (Kafka's ``AclBinding``); fields hold Kafka's wire codes."""

    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission: int

    def as_list(self) -> list[object]:
        return [
            self.resource_type,
            self.resource_name,
            self.pattern_type,
            self.principal,
            self.host,
            self.operation,
            self.permission,
        ]


def _code(enum: type[IntEnum], value: int, what: str) -> IntEnum:
    try:
        return enum(value)
    except ValueError:
        raise InvalidAclError(f"unknown {what} code {value}") from None


def validate_binding(b: AclBinding) -> None:
    """Raise :class:`InvalidAclError` for a binding CreateAcls must refuse (Kafka's
    ``AclControlManager.validateNewAcl`` and the CLUSTER name rule)."""
    rtype = _code(ResourceType, b.resource_type, "resource type")
    if rtype in (ResourceType.UNKNOWN, ResourceType.ANY):
        raise InvalidAclError(f"Invalid resourceType {rtype.name}")
    ptype = _code(PatternType, b.pattern_type, "pattern type")
    if ptype not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise InvalidAclError(f"Invalid patternType {ptype.name}")
    op = _code(AclOperation, b.operation, "operation")
    if op in (AclOperation.UNKNOWN, AclOperation.ANY):
        raise InvalidAclError(f"Invalid operation {op.name}")
    perm = _code(AclPermission, b.permission, "permission type")
    if perm not in (AclPermission.ALLOW, AclPermission.DENY):
        raise InvalidAclError(f"Invalid permissionType {perm.name}")
    if not b.resource_name:
        raise InvalidAclError("Resource name should not be empty")
    if rtype == ResourceType.CLUSTER and b.resource_name != CLUSTER_NAME:
        raise InvalidAclError(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
    kind, sep, name = b.principal.partition(":")
    if not sep or not kind or not name:
        raise InvalidAclError(f"Could not parse principal from `{b.principal}` (no colon is found)")
    if not b.host:
        raise InvalidAclError("Host should not be empty (use * for every host)")


@dataclass(frozen=True, slots=True)
class AclFilter:
    """Kafka's ``AclBindingFilter``: None name/principal/host match every value."""

    resource_type: int
    resource_name: str | None
    pattern_type: int
    principal: str | None
    host: str | None
    operation: int
    permission: int

    def validate(self) -> None:
        """INVALID_REQUEST for a filter with an UNKNOWN (or undefined) element, as Kafka's
        DescribeAclsRequest/DeleteAclsRequest refuse it."""
        for enum, value, what in (
            (ResourceType, self.resource_type, "resource type"),
            (PatternType, self.pattern_type, "pattern type"),
            (AclOperation, self.operation, "operation"),
            (AclPermission, self.permission, "permission type"),
        ):
            if _code(enum, value, what) == 0:
                raise InvalidAclError(f"Filter contains UNKNOWN {what}")

    def matches(self, b: AclBinding) -> bool:
        if self.resource_type not in (ResourceType.ANY, b.resource_type):
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH, b.pattern_type):
            return False
        if self.resource_name is not None:
            if self.pattern_type in (PatternType.ANY, b.pattern_type):
                if self.resource_name != b.resource_name:
                    return False
            elif b.pattern_type == PatternType.LITERAL:  # MATCH
                if b.resource_name not in (self.resource_name, WILDCARD):
                    return False
            elif not self.resource_name.startswith(b.resource_name):  # MATCH, PREFIXED
                return False
        if self.principal is not None and self.principal != b.principal:
            return False
        if self.host is not None and self.host != b.host:
            return False
        if self.operation not in (AclOperation.ANY, b.operation):
            return False
        return self.permission in (AclPermission.ANY, b.permission)


class AclIndex:
    """Immutable lookup of the bindings that apply to one resource (module docstring)."""

    __slots__ = ("_literal", "_prefix_lengths", "_prefixed", "bindings")

    def __init__(self, bindings: Iterable[AclBinding]) -> None:
        self.bindings: tuple[AclBinding, ...] = tuple(dict.fromkeys(bindings))
        literal: dict[tuple[int, str], list[AclBinding]] = {}
        prefixed: dict[tuple[int, str], list[AclBinding]] = {}
        lengths: dict[int, set[int]] = {}
        for b in self.bindings:
            key = (b.resource_type, b.resource_name)
            if b.pattern_type == PatternType.PREFIXED:
                prefixed.setdefault(key, []).append(b)
                lengths.setdefault(b.resource_type, set()).add(len(b.resource_name))
            else:
                literal.setdefault(key, []).append(b)
        self._literal = {k: tuple(v) for k, v in literal.items()}
        self._prefixed = {k: tuple(v) for k, v in prefixed.items()}
        self._prefix_lengths = {k: tuple(sorted(v)) for k, v in lengths.items()}

    def __len__(self) -> int:
        return len(self.bindings)

    def applying(self, resource_type: int, name: str) -> list[AclBinding]:
        """Every binding whose pattern covers ``name``: the literal name, the literal ``*``,
        and the prefixed patterns that are a prefix of ``name``."""
        out: list[AclBinding] = []
        out += self._literal.get((resource_type, name), ())
        if name != WILDCARD:
            out += self._literal.get((resource_type, WILDCARD), ())
        for n in self._prefix_lengths.get(resource_type, ()):
            if n > len(name):
                break
            out += self._prefixed.get((resource_type, name[:n]), ())
        return out

    def of_type(self, resource_type: int) -> list[AclBinding]:
        return [b for b in self.bindings if b.resource_type == resource_type]


def _parse_file(path: Path) -> list[AclBinding]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise AclStoreError(f"cannot read ACLs: {exc}", path=str(path)) from exc
    try:
        doc = json.loads(text)
        if doc.get("version") != 1:
            raise ValueError(f"version {doc.get('version')!r}, expected 1")
        out = []
        for row in doc["acls"]:
            rt, name, pt, principal, host, op, perm = row
            b = AclBinding(
                int(rt), str(name), int(pt), str(principal), str(host), int(op), int(perm)
            )
            validate_binding(b)
            out.append(b)
        return out
    except (ValueError, KeyError, TypeError, AttributeError, InvalidAclError) as exc:
        raise AclStoreError(f"corrupt ACL file: {exc}", path=str(path)) from exc


class AclStore:
    """Every ACL, durable in one file, with an :class:`AclIndex` snapshot (module docstring).

    Thread-safety: changes are serialised by a lock; :attr:`index` is replaced whole after
    the file is durable, so readers see the old or the new set, never a part. ``on_change``
    listeners (the authorizer's decision cache) run after each swap.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self.index = AclIndex(_parse_file(path))
        self._listeners: list[Callable[[], None]] = []

    def on_change(self, fn: Callable[[], None]) -> None:
        self._listeners.append(fn)

    def _commit(self, bindings: Sequence[AclBinding]) -> None:
        """Write ``bindings`` durably, then publish them (OSError: nothing changed)."""
        doc = {"version": 1, "acls": [b.as_list() for b in bindings]}
        write_atomically(self.path, json.dumps(doc, separators=(",", ":")).encode())
        self.index = AclIndex(bindings)
        for fn in self._listeners:
            fn()

    def create(self, bindings: Sequence[AclBinding]) -> None:
        """Add ``bindings`` (already validated); one that exists already is kept once, as
        Kafka answers success for a duplicate creation."""
        with self._lock:
            current = self.index.bindings
            have = set(current)
            new = [b for b in dict.fromkeys(bindings) if b not in have]
            if new:
                self._commit([*current, *new])

    def delete(self, filters: Sequence[AclFilter]) -> list[list[AclBinding]]:
        """Remove every binding a filter matches; the matches per filter, in order."""
        with self._lock:
            current = self.index.bindings
            matched = [[b for b in current if f.matches(b)] for f in filters]
            gone = {b for m in matched for b in m}
            if gone:
                self._commit([b for b in current if b not in gone])
            return matched

    def describe(self, flt: AclFilter) -> list[AclBinding]:
        return [b for b in self.index.bindings if flt.matches(b)]
