"""Reading a partition through Kafka's Fetch: the same decoder as segment files, no log dirs.

Driver side, :func:`plan_fetch_ranges`: Metadata (topics, partitions, leaders) and
ListOffsets (earliest, and latest under ``read_committed`` = the last stable offset) give each
partition its readable window ``[max(start, log start), LSO)``; the window is cut by offset
into :class:`FetchRange` pieces of at most ``max_offsets`` offsets so that a task stays
bounded. Only what Apache Kafka serves is used (Metadata v12, ListOffsets v11, Fetch v12), so
this reads any Kafka cluster, loglake's broker included.

Executor side, :func:`read_fetch_range`: Fetch v12 with ``isolation_level=read_committed``
from ``start_offset``, ``max_bytes`` per response (the broker returns at least one whole batch,
KIP-74), until ``until``. Each response's records are *raw batch bytes* — for loglake's broker
the segment's bytes unchanged — handed to :func:`pipelines.sources.read.read_records` as a
buffer (``data=``): the same scan, CRC and damage checks, the same vectorised decode, no
per-record Python object. A response may end with a partial batch (the size limit cut it); it
is a soft gap of a tail range and the next Fetch starts at the end of the last whole batch.

Aborted transactions: a read_committed Fetch lists the transactions aborted in the bytes
returned (producer id, first offset); as Kafka's consumer does, a producer's transactional
batches from that first offset up to its ABORT marker are dropped — the marker is found in the
same bytes (:func:`pipelines.decode.transactions.txn_frames`), else the transaction runs past
the response and every later batch of it in the response is aborted. The ranges are the same
:class:`~pipelines.sources.transactions.AbortedRanges` the segment path builds from the
events of its records pass, applied by the same mask.

Rows: ``segment_base_offset`` and ``batch_position`` name a local file's segment and byte
position; through Fetch no file is read, so both are ``-1`` (every other column is equal, row
for row, to a read of the same offsets from the log dirs).

Errors: retriable Fetch/ListOffsets/Metadata errors (a leader moving, a broker restarting, a
socket failure) are retried ``RETRIES`` times, backing off from 0.2 s doubling up to 5 s (~16 s in
all: a broker restart on a loaded host is ridden out), refreshing the leader
each time; then, and for any other error code (offset out of range: retention deleted the
start), :class:`FetchError` names the partition, the offset and the code. A batch that cannot
be decoded follows ``on_decode_error`` as in :mod:`pipelines.sources.read`; other damage is
reported in the :class:`~pipelines.sources.read.RangeReport` like a segment's.

Not thread-safe per call; each task opens its own connection to the leader and closes it.
"""

from __future__ import annotations

import dataclasses
import datetime
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from kio.schema.describe_configs.v4.request import (
    DescribeConfigsRequest,
    DescribeConfigsResource,
)
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.list_offsets.v11.request import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i32Timedelta, i64

from logstore.errors import InvalidConfigError, InvalidTopicError, LoglakeError
from logstore.tools.client_config import ClientConfig
from logstore.tools.connection import KafkaConnection
from pipelines.sources.plan import SegmentRange
from pipelines.sources.transactions import AbortedRanges

__all__ = [
    "DEFAULT_FETCH_MAX_BYTES",
    "DEFAULT_MAX_OFFSETS",
    "MIN_TIMESTAMP",
    "RETRIES",
    "BatchHeader",
    "FetchError",
    "FetchRange",
    "aborted_transactions_at",
    "batch_headers_at",
    "cluster_topics",
    "fetch_path",
    "merge_report",
    "plan_fetch_ranges",
    "read_fetch_batches",
    "read_fetch_range",
    "topic_configs",
]

DEFAULT_FETCH_MAX_BYTES = 8 << 20
DEFAULT_MAX_OFFSETS = 1_000_000
RETRIES = 8
_BACKOFF_S = 0.2
_MAX_BACKOFF_S = 5.0
_EARLIEST = -2
_LATEST = -1
MAX_OFFSET = 2**63 - 1
_CLIENT_ID = "loglake-ingest"
_T = TypeVar("_T")


class FetchError(LoglakeError):
    """A Fetch, ListOffsets or Metadata call failed for good (after the retries for retriable
    errors): the message names the partition, the offset and the broker's error code."""


@dataclass(frozen=True, slots=True)
class FetchRange:
    """One task: offsets ``[start_offset, until)`` of ``topic``-``partition`` through Fetch.

    ``bootstrap``: where Metadata finds the leader; ``config``: the client's security
    (``[kafka]``); ``isolation``: Fetch's isolation level. Picklable (sent to an executor)."""

    topic: str
    partition: int
    start_offset: int
    until: int
    bootstrap: str
    config: ClientConfig | None = None
    isolation: int = 1  # 1: read_committed (aborted transactions left out), 0: uncommitted


def fetch_path(bootstrap: str, topic: str, partition: int) -> str:
    """What a report or a damaged-batch row names as the "file" of bytes read through Fetch."""
    return f"kafka://{bootstrap}/{topic}-{partition}"


def _connect(bootstrap: str, config: ClientConfig | None) -> KafkaConnection:
    return KafkaConnection(bootstrap, client_id=_CLIENT_ID, config=config)


def _retrying(what: str, attempt: Callable[[], _T]) -> _T:
    """``attempt()`` again after a retriable failure (:class:`_Retriable` or a socket error
    surfacing as :class:`LoglakeError`), at most :data:`RETRIES` times, backing off."""
    last: Exception | None = None
    for n in range(RETRIES):
        try:
            return attempt()
        except (FetchError, InvalidConfigError, InvalidTopicError):
            raise  # for good: a refused login, an offset out of range...
        except (_Retriable, LoglakeError) as exc:
            last = exc
            if n + 1 < RETRIES:
                # 0.2 s doubling, at most 5 s: ~16 s in all, a broker restart on a loaded host
                time.sleep(min(_MAX_BACKOFF_S, _BACKOFF_S * 2**n))
    raise FetchError(f"{what}: still failing after {RETRIES} attempts: {last}") from last


class _Retriable(Exception):
    """A retriable error code (Kafka's: the leader moved, not available yet...)."""


def _check(code: ErrorCode, what: str) -> None:
    if code == ErrorCode.none:
        return
    if code.retriable:
        raise _Retriable(f"{what}: {code.name.upper()}")
    raise FetchError(f"{what}: {code.name.upper()}")


def _metadata(
    bootstrap: str, config: ClientConfig | None, topics: Iterable[str] | None
) -> tuple[dict[int, str], dict[tuple[str, int], int]]:
    """``(broker id -> host:port, (topic, partition) -> leader id)``; internal topics are
    left out unless named."""
    names = (
        None
        if topics is None
        else tuple(MetadataRequestTopic(name=TopicName(t), topic_id=None) for t in topics)
    )
    with _connect(bootstrap, config) as conn:
        resp = conn.call(
            MetadataRequest(
                topics=names,
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            )
        )
    brokers = {int(b.node_id): f"{b.host}:{int(b.port)}" for b in resp.brokers}
    leaders: dict[tuple[str, int], int] = {}
    for t in resp.topics:
        if t.error_code == ErrorCode.unknown_topic_or_partition and topics is not None:
            # as a topic missing from the log dirs: a configuration error (the jobs exit 2)
            raise InvalidTopicError(f"topic {t.name!r} does not exist on {bootstrap}")
        _check(t.error_code, f"Metadata of topic {t.name}")
        if topics is None and t.is_internal:
            continue
        for p in t.partitions:
            _check(p.error_code, f"Metadata of {t.name}-{int(p.partition_index)}")
            leaders[(str(t.name), int(p.partition_index))] = int(p.leader_id)
    return brokers, leaders


def _leader(rng: FetchRange) -> str:
    brokers, leaders = _metadata(rng.bootstrap, rng.config, [rng.topic])
    leader = leaders.get((rng.topic, rng.partition))
    if leader is None or leader not in brokers:
        raise _Retriable(f"no leader known for {rng.topic}-{rng.partition}")
    return brokers[leader]


def cluster_topics(bootstrap: str, *, config: ClientConfig | None = None) -> list[str]:
    """The cluster's topics (Metadata), Kafka's internal ones left out (flagged internal, or
    named ``__...`` as the jobs leave them out of log dirs): what a log dir's partition
    directories tell the jobs when there is no log dir."""
    _, leaders = _retrying(f"Metadata of {bootstrap}", lambda: _metadata(bootstrap, config, None))
    return sorted({t for t, _ in leaders if not t.startswith("__")})


def _list_offsets(
    conn: KafkaConnection,
    parts: list[tuple[str, int]],
    timestamp: int,
    isolation: int,
    *,
    missing_ok: bool = False,
) -> dict[tuple[str, int], int]:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in parts:
        by_topic.setdefault(topic, []).append(partition)
    resp = conn.call(
        ListOffsetsRequest(
            replica_id=BrokerId(-1),
            isolation_level=i8(isolation),
            topics=tuple(
                ListOffsetsTopic(
                    name=TopicName(topic),
                    partitions=tuple(
                        ListOffsetsPartition(partition_index=i32(p), timestamp=i64(timestamp))
                        for p in ps
                    ),
                )
                for topic, ps in by_topic.items()
            ),
            timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
        )
    )
    out = {}
    for t in resp.topics:
        for p in t.partitions:
            if missing_ok and p.error_code == ErrorCode.unknown_topic_or_partition:
                continue
            _check(p.error_code, f"ListOffsets {timestamp} of {t.name}-{int(p.partition_index)}")
            out[(str(t.name), int(p.partition_index))] = int(p.offset)
    return out


def plan_fetch_ranges(
    bootstrap: str,
    *,
    topics: Iterable[str] | None = None,
    starts: Mapping[tuple[str, int], int] | None = None,
    config: ClientConfig | None = None,
    max_offsets: int = DEFAULT_MAX_OFFSETS,
    isolation: int = 1,
    missing_ok: bool = False,
) -> tuple[list[FetchRange], dict[tuple[str, int], tuple[int, int]]]:
    """``(ranges, {(topic, partition): (log start, end)})`` of every partition
    of ``topics`` (None: every non-internal topic) on the cluster at ``bootstrap``.

    A partition's ranges cover ``[max(starts[tp], log start), LSO)`` in pieces of at most
    ``max_offsets`` offsets, in offset order. The end is the last stable offset
    (``isolation`` 1, read_committed) or the high watermark (0). Planned from each
    partition's leader. ``missing_ok``: a partition that Metadata lists and ListOffsets does
    not know is left out instead of retried then refused."""
    if max_offsets < 1:
        raise LoglakeError(f"max_offsets must be positive, got {max_offsets}")
    wanted = None if topics is None else sorted(set(topics))

    def plan() -> dict[tuple[str, int], tuple[int, int]]:
        brokers, leaders = _metadata(bootstrap, config, wanted)
        by_leader: dict[int, list[tuple[str, int]]] = {}
        for tp, leader in sorted(leaders.items()):
            if leader not in brokers:
                raise _Retriable(f"no leader for {tp[0]}-{tp[1]}")
            by_leader.setdefault(leader, []).append(tp)
        bounds: dict[tuple[str, int], tuple[int, int]] = {}
        for leader, parts in by_leader.items():
            with _connect(brokers[leader], config) as conn:
                earliest = _list_offsets(conn, parts, _EARLIEST, isolation, missing_ok=missing_ok)
                stable = _list_offsets(conn, parts, _LATEST, isolation, missing_ok=missing_ok)
            for tp in parts:
                if tp in earliest and tp in stable:
                    bounds[tp] = (earliest[tp], stable[tp])
        return bounds

    bounds = _retrying(f"planning the Fetch of {bootstrap}", plan)
    ranges: list[FetchRange] = []
    for (topic, partition), (log_start, lso) in sorted(bounds.items()):
        low = max(log_start, (starts or {}).get((topic, partition), log_start))
        for a in range(low, lso, max_offsets):
            ranges.append(
                FetchRange(
                    topic, partition, a, min(a + max_offsets, lso), bootstrap, config, isolation
                )
            )
    return ranges, bounds


@dataclass(frozen=True, slots=True)
class _Fetched:
    records: bytes
    aborted: list[tuple[int, int]]


def _fetch(conn: KafkaConnection, rng: FetchRange, offset: int, max_bytes: int) -> _Fetched:
    resp = conn.call(
        FetchRequest(
            max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=0)),
            min_bytes=i32(1),
            max_bytes=i32(max_bytes),
            isolation_level=i8(rng.isolation),
            topics=(
                FetchTopic(
                    topic=TopicName(rng.topic),
                    partitions=(
                        FetchPartition(
                            partition=i32(rng.partition),
                            fetch_offset=i64(offset),
                            partition_max_bytes=i32(max_bytes),
                        ),
                    ),
                ),
            ),
            forgotten_topics_data=(),
        )
    )
    _check(resp.error_code, f"Fetch of {rng.topic}-{rng.partition}")
    part = resp.responses[0].partitions[0]
    _check(part.error_code, f"Fetch of {rng.topic}-{rng.partition} at offset {offset}")
    aborted = [(int(a.producer_id), int(a.first_offset)) for a in part.aborted_transactions or ()]
    return _Fetched(bytes(part.records or b""), aborted)


def _aborted_ranges(
    data: bytes, rng: SegmentRange, listed: list[tuple[int, int]]
) -> AbortedRanges | None:
    """The aborted transactions a Fetch listed, each up to its ABORT marker in ``data`` (or
    past the end of it): see the module docstring."""
    if not listed:
        return None
    # Imported here: the driver plans without loading the decoder (numba).
    from pipelines.decode.transactions import KIND_ABORT  # noqa: PLC0415
    from pipelines.sources.read import read_txn_frames  # noqa: PLC0415

    pid, kind, first, _last = read_txn_frames(rng, data=data)
    marker = kind == KIND_ABORT
    ends = []
    for producer, start in listed:
        at = np.flatnonzero(marker & (pid == producer) & (first >= start))
        ends.append(int(first[at[0]]) if at.shape[0] else MAX_OFFSET)
    return AbortedRanges.of([p for p, _ in listed], [f for _, f in listed], ends)


_NO_FILE = -1


def _without_file_columns(batch: pa.RecordBatch) -> pa.RecordBatch:
    n = batch.num_rows
    none = pa.array(np.full(n, _NO_FILE, np.int64))
    out = batch.set_column(batch.schema.get_field_index("segment_base_offset"),
                           batch.schema.field("segment_base_offset"), none)  # fmt: skip
    return out.set_column(out.schema.get_field_index("batch_position"),
                          out.schema.field("batch_position"), none)  # fmt: skip


def read_fetch_range(
    rng: FetchRange,
    *,
    min_timestamp: int,
    max_timestamp: int,
    max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
    on_decode_error: str = "skip",
    report: Any = None,
) -> Iterator[pa.RecordBatch]:
    """The records of ``rng`` (read_committed) as :data:`RECORDS_ARROW_SCHEMA` batches.

    ``report``: a :class:`~pipelines.sources.read.RangeReport` filled as the responses are
    read (one pass per response, like consecutive ranges of a segment)."""
    # Imported here: the driver plans without loading the decoder (numba).
    from pipelines.sources.read import RangeReport, read_records  # noqa: PLC0415

    offset = rng.start_offset
    with _Cursor(rng) as cursor:
        while offset < rng.until:
            data, seg, listed = cursor.get(offset, max_bytes)
            aborted = _aborted_ranges(data, seg, listed)
            part = RangeReport(rng.topic, rng.partition)
            for batch in read_records(
                seg, min_timestamp=min_timestamp, max_timestamp=max_timestamp,
                on_decode_error=on_decode_error, report=part, aborted=aborted, data=data,
            ):  # fmt: skip
                yield _without_file_columns(batch)
            if report is not None:
                merge_report(report, part)
            offset = _advanced(rng, offset, part.last_end, len(data))


def _advanced(rng: FetchRange, offset: int, last_end: int | None, size: int) -> int:
    """Where the next Fetch starts: after the last whole batch of the response."""
    if last_end is None or last_end <= offset:
        raise FetchError(
            f"Fetch of {rng.topic}-{rng.partition} at offset {offset}: no readable "
            f"batch in {size} bytes"
        )
    return last_end


class _Cursor:
    """One task's Fetches of ``rng``: the leader found once, one connection kept, a
    retriable failure retried (the leader found again). A context manager (closes it)."""

    def __init__(self, rng: FetchRange) -> None:
        self.rng = rng
        self.leader = _retrying(f"the leader of {rng.topic}-{rng.partition}", lambda: _leader(rng))
        self.conn: KafkaConnection | None = None

    def __enter__(self) -> _Cursor:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def _call(self, offset: int, max_bytes: int) -> _Fetched:
        try:
            if self.conn is None:
                self.conn = _connect(self.leader, self.rng.config)
            return _fetch(self.conn, self.rng, offset, max_bytes)
        except (_Retriable, LoglakeError):
            self.__exit__()
            self.leader = _leader(self.rng)
            raise

    def fetched(self, offset: int, max_bytes: int) -> _Fetched:
        """One Fetch at ``offset`` (retried as the module docstring says)."""
        rng = self.rng
        return _retrying(
            f"Fetch of {rng.topic}-{rng.partition} at {offset}",
            lambda: self._call(offset, max_bytes),
        )

    def get(self, offset: int, max_bytes: int) -> tuple[bytes, SegmentRange, list[tuple[int, int]]]:
        """``(raw batches, the range they are to the decoder, aborted transactions listed)``
        of one Fetch at ``offset``; nothing returned below the range's end is an error."""
        rng = self.rng
        fetched = self.fetched(offset, max_bytes)
        data = fetched.records
        if not data:
            raise FetchError(
                f"Fetch of {rng.topic}-{rng.partition} at offset {offset} returned nothing "
                f"below the planned end {rng.until} (the log was truncated?)"
            )
        first_base = int.from_bytes(data[:8], "big", signed=True)
        seg = SegmentRange(
            topic=rng.topic,
            partition=rng.partition,
            path=fetch_path(rng.bootstrap, rng.topic, rng.partition),
            segment_base_offset=min(first_base, offset),
            start=0,
            end=len(data),
            start_offset=offset,
            until=rng.until,
            next_base_offset=None,
            is_tail=True,  # a batch cut by max_bytes is in flight, not damage
        )
        return data, seg, fetched.aborted


def read_fetch_batches(
    rng: FetchRange, *, min_timestamp: int, max_bytes: int = DEFAULT_FETCH_MAX_BYTES
) -> Iterator[tuple[pa.RecordBatch, bytes]]:
    """The batch headers of ``rng`` as :data:`BATCHES_ARROW_SCHEMA` rows, as
    :func:`pipelines.sources.read.read_batches` gives them for a segment, each with the
    Fetch response's bytes that its ``position`` s index (to read a batch's first bytes, as
    from a file; the position of the batch in the log is not known).

    No file is read: ``file`` is :func:`fetch_path` and ``segment_base_offset`` is ``-1``.
    Every batch the broker serves whose last offset is in ``[rng.start_offset, rng.until)``
    (so that consecutive ranges share no batch), with the range's isolation level (``0``:
    every batch up to the high watermark, aborted ones and markers included)."""
    from pipelines.sources.read import read_batches  # noqa: PLC0415 (numba on executors only)

    offset = rng.start_offset
    with _Cursor(rng) as cursor:
        while offset < rng.until:
            data, seg, _aborted = cursor.get(offset, max_bytes)
            last_end: int | None = None
            for batch in read_batches(seg, min_timestamp=MIN_TIMESTAMP, data=data):
                sound = pc.is_null(batch.column("error"))
                last = pc.max(pc.filter(batch.column("last_offset"), sound)).as_py()
                if last is not None:
                    last_end = max(last_end or 0, last + 1)
                # a batch belongs to the range holding its last offset: a batch across two
                # ranges' boundary is served to both, and kept once
                ends_here = pc.less(batch.column("last_offset"), rng.until)
                recent = pc.greater_equal(batch.column("max_timestamp"), min_timestamp)
                keep = pc.and_(sound, pc.and_(ends_here, recent))
                keep = pc.or_(keep, pc.invert(sound))  # damage is always reported
                yield _without_batch_file(batch.filter(keep), seg.path), data
            offset = _advanced(rng, offset, last_end, len(data))


MIN_TIMESTAMP = -(2**63)


def _without_batch_file(batch: pa.RecordBatch, path: str) -> pa.RecordBatch:
    n = batch.num_rows
    none = pa.array(np.full(n, _NO_FILE, np.int64))
    i = batch.schema.get_field_index("segment_base_offset")
    batch = batch.set_column(i, batch.schema.field(i), none)
    i = batch.schema.get_field_index("file")
    return batch.set_column(i, batch.schema.field(i), pa.array([path] * n, pa.string()))


BatchHeader = tuple[int, int, int, int]
"""A v2 batch's ``(base offset, last offset, partitionLeaderEpoch, CRC)``."""
# baseOffset i64, batchLength i32, partitionLeaderEpoch i32, magic i8, crc u32, attributes i16,
# lastOffsetDelta i32 (the first 27 bytes of a v2 batch header)
_HEADER = struct.Struct(">qiibIhi")
_PROBE_BYTES = 64 << 10  # the broker returns the first batch whole even when larger (KIP-74)


def batch_headers_at(
    bootstrap: str,
    offsets: Mapping[tuple[str, int], int],
    *,
    config: ClientConfig | None = None,
) -> dict[tuple[str, int], BatchHeader | None]:
    """Per partition, the header of the whole batch the broker serves at ``offsets[tp]``:
    one Fetch (read_uncommitted) there, the first batch of the response whose last offset is
    at or past it (the batch holding the offset, or the next one past a compacted gap).
    None: no such batch (the offset is out of range, at or past the high watermark, or the
    batch is not a v2 batch). Used by the divergence check through Fetch
    (:mod:`pipelines.divergence`); a few small Fetches, one per partition."""
    out: dict[tuple[str, int], BatchHeader | None] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        rng = FetchRange(topic, partition, offset, offset + 1, bootstrap, config, 0)
        try:
            with _Cursor(rng) as cursor:
                data = cursor.fetched(offset, _PROBE_BYTES).records
        except FetchError as exc:
            if "OFFSET_OUT_OF_RANGE" not in str(exc):
                raise
            data = b""
        out[(topic, partition)] = _header_at(data, offset)
    return out


def _header_at(data: bytes, offset: int) -> BatchHeader | None:
    """Walks batch headers (one per batch, never a record) to the first ending at/after
    ``offset``."""
    pos = 0
    while pos + _HEADER.size <= len(data):
        base, length, epoch, magic, crc, _attrs, last_delta = _HEADER.unpack_from(data, pos)
        if magic != 2 or pos + 12 + length > len(data):
            return None
        if base + last_delta >= offset:
            return base, base + last_delta, epoch, crc
        pos += 12 + length
    return None


def topic_configs(
    bootstrap: str,
    topics: Iterable[str],
    *,
    config: ClientConfig | None = None,
    effective: bool = False,
) -> dict[str, dict[str, str]]:
    """Each topic's own configs, the overrides (DescribeConfigs v4, source
    DYNAMIC_TOPIC_CONFIG): what a log dir's ``topic-configs/<topic>.properties`` tells the
    jobs when there is no log dir. ``effective``: every key's value in force instead (the
    broker's defaults too, as ``kafka-configs --describe --all``). Keys without a value are
    left out. A topic the cluster does not have raises :class:`InvalidTopicError` (exit 2)."""
    names = sorted(set(topics))
    if not names:
        return {}

    def describe() -> dict[str, dict[str, str]]:
        with _connect(bootstrap, config) as conn:
            resp = conn.call(
                DescribeConfigsRequest(
                    resources=tuple(
                        DescribeConfigsResource(
                            resource_type=i8(_TOPIC_RESOURCE), resource_name=t,
                            configuration_keys=None,
                        )
                        for t in names
                    ),
                )
            )  # fmt: skip
        out: dict[str, dict[str, str]] = {}
        for r in resp.results:
            if r.error_code == ErrorCode.unknown_topic_or_partition:
                raise InvalidTopicError(f"topic {r.resource_name!r} does not exist on {bootstrap}")
            _check(r.error_code, f"DescribeConfigs of topic {r.resource_name}")
            out[str(r.resource_name)] = {
                str(c.name): str(c.value)
                for c in r.configs
                if c.value is not None and (effective or int(c.config_source) == _OVERRIDE)
            }
        return out

    return _retrying(f"DescribeConfigs on {bootstrap}", describe)


_TOPIC_RESOURCE = 2  # Kafka's ConfigResource.Type.TOPIC
_OVERRIDE = 1  # Kafka's DescribeConfigs source DYNAMIC_TOPIC_CONFIG: the topic's own value


def merge_report(into: Any, part: Any) -> None:
    """Fold one response's (or window's) report into the range's (offsets ascend across
    them): :mod:`pipelines.sources.tier` reads a remote segment in windows the same way."""
    if part.next_offset is not None:
        into.next_offset = max(into.next_offset or part.next_offset, part.next_offset)
    into.bytes += part.bytes
    into.control_batches += part.control_batches
    into.damaged.extend(part.damaged)
    if into.first_sound is None:
        into.first_sound = part.first_sound
    if part.last_end is not None:
        into.last_end = part.last_end
    into.regions.extend(part.to_json()["regions"])
    if into.file is None:
        into.file, into.segment_base_offset, into.start = part.file, part.segment_base_offset, 0


def aborted_transactions_at(rng: FetchRange, *, max_bytes: int = 1 << 16) -> list[tuple[int, int]]:
    """``(producer id, first offset)`` of the aborted transactions one read_committed Fetch at
    ``rng.start_offset`` lists: those reaching the bytes it returns, first offsets below the
    fetch offset included (Kafka searches the transaction indexes from the fetch offset's
    segment on until its answer is complete). :mod:`pipelines.sources.tier` asks this at the
    end of the tier for the transactions whose ABORT marker is not tiered yet."""
    if rng.start_offset >= rng.until:
        return []
    leader = _retrying(f"the leader of {rng.topic}-{rng.partition}", lambda: _leader(rng))

    def call() -> _Fetched:
        with _connect(leader, rng.config) as conn:
            return _fetch(conn, dataclasses.replace(rng, isolation=1), rng.start_offset, max_bytes)

    where = f"Fetch of {rng.topic}-{rng.partition} at {rng.start_offset}"
    return _retrying(where, call).aborted
