"""The coordinator's requests and answers as plain values, independent of wire versions.

The kio adapters (:mod:`logstore.server.group.handlers`) turn each API version into these
and back; tests drive the coordinator with them directly. All are immutable.
"""

from __future__ import annotations

from dataclasses import dataclass

from kio.schema.errors import ErrorCode

__all__ = [
    "CommitRequest",
    "GroupDescription",
    "GroupListing",
    "JoinRequest",
    "JoinResult",
    "MemberDescription",
    "OffsetFetchResult",
    "SyncRequest",
    "SyncResult",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinRequest:
    """A JoinGroup, any version (absent fields: their Kafka defaults)."""

    group_id: str
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    require_known_member_id: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncRequest:
    """A SyncGroup; ``assignments`` only from the leader."""

    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None
    protocol_type: str | None
    protocol_name: str | None
    assignments: dict[str, bytes]


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: ErrorCode
    member_id: str
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    # (member id, group instance id, metadata); only the leader's answer carries them.
    members: tuple[tuple[str, str | None, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: ErrorCode
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(frozen=True, slots=True)
class CommitRequest:
    topic: str
    partition: int
    offset: int
    leader_epoch: int = -1
    metadata: str | None = ""


@dataclass(frozen=True, slots=True)
class OffsetFetchResult:
    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str
    error: ErrorCode


@dataclass(frozen=True, slots=True)
class GroupListing:
    group_id: str
    protocol_type: str
    state: str


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupDescription:
    error: ErrorCode
    group_id: str
    state: str
    protocol_type: str
    protocol_data: str
    members: tuple[MemberDescription, ...] = ()
