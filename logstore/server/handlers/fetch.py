"""Fetch (key 1), v4-v17: records straight from the segment files, with long-polling.

The response is encoded here by hand (not by kio) because its ``records`` fields are not
bytes in memory: each is a :class:`~logstore.server.context.FileRegion` (a file, position
and length from ``Log.read``) that the reactor sends with ``os.sendfile``. Wire layout::

    v4-v6   throttle_time_ms i32, [topic]
    v7-v17  throttle_time_ms i32, error_code i16, session_id i32, [topic]
    topic   name string (v4-v12) | topic_id uuid (v13+, 16 bytes), [partition]
    partition
            partition_index i32, error_code i16, high_watermark i64, last_stable_offset i64,
            log_start_offset i64 (v5+), aborted_transactions [producer_id i64,
            first_offset i64] (null for read_uncommitted),
            preferred_read_replica i32 (v11+, -1), records bytes (i32 length + bytes)
    v12+ are flexible: arrays and strings are compact (uvarint length + 1), records are
    compact bytes, and every struct ends with an empty tagged-field section (0x00).
    v13-v17 differ from v12 only in naming topics by id (KIP-516) and in fields a consumer
    does not use (v15 ``replica_state``, v17 ``replica_directory_id``: follower fetching;
    v16 ``node_endpoints``, a tagged field sent with ``NOT_LEADER``, which a single broker
    never answers).

Topic ids (v13+): resolved by the log manager (``LogManager.topic_name``: the ids the
partition directories keep, a dict read fit for the network threads); an id of no existing
topic gets ``UNKNOWN_TOPIC_ID`` for each of its
partitions, as from Kafka (``KafkaApis.handleFetchRequest``).

Semantics (Kafka's): records up to the high watermark (``isolation_level`` read_uncommitted)
or the last stable offset (read_committed, with the aborted transactions overlapping the
records sent, from the segments' ``.txnindex``: clients drop those transactions' records),
through the partition's ``read`` (:mod:`logstore.storage.partition`); ``max_bytes`` for the whole
response and ``partition_max_bytes`` per partition, except that the first partition with
data returns at least one whole batch (KIP-74) so a consumer always progresses;
``OFFSET_OUT_OF_RANGE`` outside ``[log_start_offset, high_watermark]``. When fewer than
``min_bytes`` are available and ``max_wait_ms`` > 0 the request waits in the broker's
purgatory (a :class:`Deferred`), woken by appends to any of its partitions, answered at the
deadline otherwise. Fetch sessions (KIP-227) are not kept: ``session_id`` is always 0, so
clients send full fetch requests.

Authorization (with ``authorizer.class.name``): READ on each topic, else its partitions answer
``TOPIC_AUTHORIZATION_FAILED`` (an id of no topic stays ``UNKNOWN_TOPIC_ID``), as Kafka's
consumer fetch; the decision is a cached dict read, fit for the inline path. Each region owns a
file descriptor opened by path right after ``Log.read`` and checked against the file size, so
retention deleting the segment meanwhile cannot redirect the send to another file.
"""

from __future__ import annotations

import os
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from kio.schema.errors import ErrorCode

from logstore.errors import LoglakeError, OffsetOutOfRangeError
from logstore.protocol.varint import encode_unsigned_varint as _uvarint
from logstore.server.context import Deferred, FileRegion, RawResponse, RequestContext
from logstore.server.error_codes import error_code_for
from logstore.server.purgatory import DelayedOperation
from logstore.server.security.acls import AclOperation, ResourceType
from logstore.server.security.authorizer import authorized
from logstore.storage.partition import IsolationLevel

__all__ = ["API_KEY", "MAX_VERSION", "MIN_VERSION", "handle", "runs_inline"]

API_KEY: Final = 1
MIN_VERSION: Final = 4
MAX_VERSION: Final = 17

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_PART_HEAD = struct.Struct(">ihqq")  # partition_index, error_code, high_watermark, lso
_I64 = struct.Struct(">q")
_ABORTED = struct.Struct(">qq")  # producer_id, first_offset


@dataclass(frozen=True, slots=True)
class _Topic:
    """A requested topic: ``key`` as the request named it (the name up to v12, the id from
    v13 on, echoed in the response) and ``name``, None for an id of no known topic."""

    key: str | uuid.UUID
    name: str | None
    partitions: Sequence[Any]  # the request's FetchPartition entries


def _topics(broker: Any, request: Any) -> list[_Topic]:
    """The request's topics, ids resolved (a dict read: fit for the network threads);
    ``name`` None for an id of no existing topic."""
    out: list[_Topic] = []
    for t in request.topics:
        tid = getattr(t, "topic_id", None)
        if tid is None:  # v4-v12 (or a v13+ request with a null id: unknown, as in Kafka)
            if hasattr(t, "topic"):
                out.append(_Topic(t.topic, t.topic, t.partitions))
            else:
                out.append(_Topic(uuid.UUID(int=0), None, t.partitions))
            continue
        name = broker.log_manager.topic_name(tid)
        out.append(_Topic(tid, name, t.partitions))
    return out


@dataclass(slots=True)
class _PartitionRead:
    partition: int
    error: int
    high_watermark: int
    log_start_offset: int
    path: str | None = None
    position: int = 0
    length: int = 0
    last_stable_offset: int = -1
    aborted: list[tuple[int, int]] | None = None  # (producer_id, first_offset)
    # tiered storage: records read from the tier (bytes, not a file region), and the read
    # still to do on the tier's reader pool: (topic, fetch offset, max bytes, max offset)
    data: bytes | None = None
    remote: tuple[str, int, int, int] | None = None


def _failed_read(pid: int, part: Any, exc: LoglakeError) -> _PartitionRead:
    """The answer for a partition whose read raised ``exc``: its error code, with the offsets
    the partition has now (as before the read)."""
    return _PartitionRead(
        pid,
        error_code_for(exc),
        part.high_watermark,
        part.log_start_offset,
        last_stable_offset=part.last_stable_offset,
    )


def _read(
    ctx: RequestContext, request: Any, topics: list[_Topic]
) -> tuple[list[tuple[str | uuid.UUID, list[_PartitionRead]]], int, bool]:
    """One pass over the requested partitions: (results, bytes available, any error)."""
    broker = ctx.broker
    remaining = max(int(request.max_bytes), 0) if hasattr(request, "max_bytes") else 2**31 - 1
    total = 0
    errors = False
    out: list[tuple[str | uuid.UUID, list[_PartitionRead]]] = []
    # v4+ always carry the field; a value other than 0 or 1 (Kafka refuses the request)
    # gets the stricter read_committed.
    isolation = (
        IsolationLevel.READ_UNCOMMITTED
        if int(request.isolation_level) == IsolationLevel.READ_UNCOMMITTED
        else IsolationLevel.READ_COMMITTED
    )
    for t in topics:
        parts: list[_PartitionRead] = []
        if t.name is not None and not authorized(
            ctx, AclOperation.READ, ResourceType.TOPIC, t.name
        ):
            # Kafka: TOPIC_AUTHORIZATION_FAILED, existing or not (nothing leaks)
            parts = [
                _PartitionRead(int(p.partition), ErrorCode.topic_authorization_failed, -1, -1)
                for p in t.partitions
            ]
            errors = errors or bool(parts)
            out.append((t.key, parts))
            continue
        for p in t.partitions:
            pid = int(p.partition)
            part = None if t.name is None else broker.partition(t.name, pid)
            if part is None:
                unknown_id = isinstance(t.key, uuid.UUID) and (
                    t.name is None or broker.partition_count(t.name) is None
                )
                error = (
                    ErrorCode.unknown_topic_id
                    if unknown_id
                    else ErrorCode.unknown_topic_or_partition
                )
                parts.append(_PartitionRead(pid, error, -1, -1))
                errors = True
                continue
            limit = min(int(p.partition_max_bytes), remaining)
            try:
                rd = part.read(
                    int(p.fetch_offset), limit, isolation=isolation, min_one_batch=total == 0
                )
            except OffsetOutOfRangeError as exc:
                r = _remote_or_error(broker, str(t.name), part, p, limit, isolation, exc)
                errors = errors or r.remote is None
                if r.remote is not None:
                    total += max(int(getattr(request, "min_bytes", 1)), 1)  # answer now
            except LoglakeError as exc:
                r = _failed_read(pid, part, exc)
                errors = True
            else:
                r = _PartitionRead(
                    pid,
                    ErrorCode.none,
                    rd.high_watermark,
                    rd.log_start_offset,
                    last_stable_offset=rd.last_stable_offset,
                )
                if rd.aborted_transactions is not None:
                    r.aborted = [(a.producer_id, a.first_offset) for a in rd.aborted_transactions]
                sl = rd.slice
                if sl is not None:
                    r.path = str(sl.path)
                    r.position = sl.position
                    r.length = sl.length
                    total += sl.length
                    remaining -= sl.length
            tier = getattr(broker, "tier", None)
            if tier is not None and t.name is not None and tier.is_tiered(part.log):
                r.log_start_offset = tier.log_start_offset(t.name, pid, r.log_start_offset)
            parts.append(r)
        out.append((t.key, parts))
    return out, total, errors


def _remote_or_error(  # noqa: PLR0917
    broker: Any,
    topic: str,
    part: Any,
    p: Any,
    limit: int,
    isolation: IsolationLevel,
    exc: OffsetOutOfRangeError,
) -> _PartitionRead:
    """A fetch below the local log start: a read for the tier's pool when the tier holds the
    offset (KIP-405), else ``OFFSET_OUT_OF_RANGE``."""
    pid = int(p.partition)
    offset = int(p.fetch_offset)
    committed = isolation == IsolationLevel.READ_COMMITTED
    r = _failed_read(pid, part, exc)
    tier = getattr(broker, "tier", None)
    if tier is None or not tier.is_tiered(part.log):
        return r
    start = tier.log_start_offset(topic, pid, part.log_start_offset)
    if start <= offset < part.log_start_offset:
        r.error = ErrorCode.none
        r.aborted = [] if committed else None
        bound = part.last_stable_offset if committed else part.high_watermark
        r.remote = (topic, offset, limit, bound)
    return r


def _read_remote(broker: Any, results: list[tuple[str | uuid.UUID, list[_PartitionRead]]]) -> None:
    """Do the pending tier reads of ``results`` (on the tier's reader pool: waits for the
    store). A failure is the partition's error code (a missing object or an unreachable
    store: ``KAFKA_STORAGE_ERROR``), logged by the tier; never an empty answer."""
    for _key, parts in results:
        for r in parts:
            if r.remote is None:
                continue
            topic, offset, max_bytes, bound = r.remote
            r.remote = None
            try:
                data, aborted = broker.tier.read(
                    topic, r.partition, offset, max_bytes, max_offset=bound
                )
            except LoglakeError as exc:
                r.error = error_code_for(exc)
                r.aborted = None
                continue
            r.data = data
            r.length = len(data)
            if r.aborted is not None:
                r.aborted = aborted


def _answer_remote(
    ctx: RequestContext,
    topics: list[_Topic],
    results: list[tuple[str | uuid.UUID, list[_PartitionRead]]],
    deferred: Deferred[Any],
) -> None:
    def run() -> None:
        try:
            _read_remote(ctx.broker, results)
            _count(ctx, topics, results)
            deferred.complete(_encode(ctx.api_version, results))
        except Exception as exc:
            deferred.fail(exc)

    ctx.broker.tier.submit(run)


def _has_remote(results: list[tuple[str | uuid.UUID, list[_PartitionRead]]]) -> bool:
    return any(r.remote is not None for _key, parts in results for r in parts)


def _open_region(r: _PartitionRead) -> FileRegion | None:
    if r.path is None or r.length == 0:
        return None
    try:
        fd = os.open(r.path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size < r.position + r.length:
            os.close(fd)
            return None
    except OSError:
        os.close(fd)
        return None
    return FileRegion(fd, r.position, r.length)


def _encode(
    version: int, results: list[tuple[str | uuid.UUID, list[_PartitionRead]]]
) -> RawResponse:
    flexible = version >= 12
    parts: list[bytes | FileRegion] = []
    buf = bytearray()
    buf += _I32.pack(0)  # throttle_time_ms
    if version >= 7:
        buf += _I16.pack(0) + _I32.pack(0)  # error_code, session_id (no fetch sessions)
    buf += _uvarint(len(results) + 1) if flexible else _I32.pack(len(results))
    for topic, partitions in results:
        if isinstance(topic, uuid.UUID):  # v13+
            buf += topic.bytes
        else:
            name = topic.encode("utf-8")
            buf += (_uvarint(len(name) + 1) if flexible else _I16.pack(len(name))) + name
        buf += _uvarint(len(partitions) + 1) if flexible else _I32.pack(len(partitions))
        for r in partitions:
            buf += _PART_HEAD.pack(r.partition, r.error, r.high_watermark, r.last_stable_offset)
            if version >= 5:
                buf += _I64.pack(r.log_start_offset)
            aborted = r.aborted
            if aborted is None:
                buf += b"\x00" if flexible else _I32.pack(-1)  # aborted_transactions: null
            else:
                buf += _uvarint(len(aborted) + 1) if flexible else _I32.pack(len(aborted))
                for pid, first in aborted:
                    buf += _ABORTED.pack(pid, first)
                    if flexible:
                        buf += b"\x00"  # the entry's tagged fields
            if version >= 11:
                buf += _I32.pack(-1)  # preferred_read_replica
            region = _open_region(r)
            if r.data:
                buf += _uvarint(len(r.data) + 1) if flexible else _I32.pack(len(r.data))
                buf += r.data
            elif region is None:
                buf += _uvarint(1) if flexible else _I32.pack(0)  # empty records
            else:
                buf += _uvarint(region.length + 1) if flexible else _I32.pack(region.length)
                parts.append(bytes(buf))
                buf = bytearray()
                parts.append(region)
            if flexible:
                buf += b"\x00"
        if flexible:
            buf += b"\x00"
    if flexible:
        buf += b"\x00"
    parts.append(bytes(buf))
    return RawResponse(parts, flexible_header=flexible)


class _DelayedFetch(DelayedOperation):
    def __init__(
        self,
        ctx: RequestContext,
        request: Any,
        topics: list[_Topic],
        deadline_ms: int,
        result: Deferred[Any],
    ) -> None:
        super().__init__(deadline_ms)
        self.ctx = ctx
        self.request = request
        self.topics = topics
        self.min_bytes = int(request.min_bytes)
        self.result = result

    def ready(self) -> bool:
        _results, total, errors = _read(self.ctx, self.request, self.topics)
        return errors or total >= self.min_bytes

    def complete(self, *, expired: bool) -> None:
        try:
            results, _total, _errors = _read(self.ctx, self.request, self.topics)
            if _has_remote(results):
                _answer_remote(self.ctx, self.topics, results, self.result)
                return
            _count(self.ctx, self.topics, results)
            self.result.complete(_encode(self.ctx.api_version, results))
        except Exception as exc:
            self.result.fail(exc)


def _count(
    ctx: RequestContext,
    topics: list[_Topic],
    results: list[tuple[str | uuid.UUID, list[_PartitionRead]]],
) -> None:
    """Bytes out per topic and error codes for the broker's metrics (when on): the encoded
    response carries no kio objects for the dispatcher to count errors in. ``results`` is in
    the order of ``topics`` (:func:`_read`); the name, not a v13+ topic id, labels the bytes."""
    metrics = ctx.broker.metrics
    if metrics is None:
        return
    for t, (_key, parts) in zip(topics, results, strict=True):
        sent = 0
        for r in parts:
            sent += r.length
            if r.error:
                metrics.count_errors(API_KEY, r.error)
        if sent and t.name is not None:
            metrics.fetched(t.name, sent)


def runs_inline(broker: Any, request: Any) -> bool:
    """Whether this Fetch may run on a network thread: every partition it names is loaded.

    Then :func:`handle` does index lookups, header ``pread`` s, an ``open`` and an ``fstat``
    per partition (page-cache work, no waiting: a long-poll returns a Deferred), whereas a
    partition's first use takes the broker's partition lock, and unknown topics (or topic
    ids not resolved yet) look up the log manager: those go to the handler threads.
    """
    return all(
        t.name is not None and broker.loaded_partition(t.name, int(p.partition)) is not None
        for t in _topics(broker, request)
        for p in t.partitions
    )


def handle(ctx: RequestContext, request: Any) -> Any:
    topics = _topics(ctx.broker, request)
    results, total, errors = _read(ctx, request, topics)
    if _has_remote(results):
        remote: Deferred[Any] = Deferred()
        _answer_remote(ctx, topics, results, remote)
        return remote
    max_wait_ms = int(request.max_wait.total_seconds() * 1000)
    if errors or total >= int(request.min_bytes) or max_wait_ms <= 0 or not request.topics:
        _count(ctx, topics, results)
        return _encode(ctx.api_version, results)
    deferred: Deferred[Any] = Deferred()
    op = _DelayedFetch(ctx, request, topics, ctx.monotonic() + max_wait_ms, deferred)
    keys = [(t.name, int(p.partition)) for t in topics if t.name is not None for p in t.partitions]
    ctx.broker.purgatory.try_complete_else_watch(op, keys)
    return deferred
