"""A log that went backwards under the lake: detect it, and optionally rewind the lake.

After an unclean restart a broker truncates its log to the last valid batch (as Kafka does),
and new acknowledged records then reuse offsets the lake already holds. Ingest must not take
that for "nothing new".

**What the lake remembers.** Every ingest commit to ``records`` carries, in its ``commitInfo``
(key :data:`COMMIT_INFO_KEY`, a JSON string), one entry per partition with known progress:
``{"next": N, "batch": {...}}`` where ``batch`` is the identity of the log batch holding offset
``N - 1`` when it was ingested (:class:`BatchId`: base and last offset, partitionLeaderEpoch,
CRC, segment base offset and position; absent when the partition only skipped a gap). The
entries of partitions a run did not move are carried forward, so the newest ingest commit
normally describes every partition; it is in the same commit as the records and the progress
(app transactions), hence exactly as durable. Reading it costs the newest ``_delta_log`` JSON
files (newest first, stopping once every partition is resolved), never the data. An entry
counts only when its ``next`` equals the partition's progress (a commit racing another run
may carry stale entries: those are ignored, and the partition is checked by its log end only).

**The check** (:func:`check_partition`, per partition with progress ``P`` at or above the log
start ``L``; ``P < L`` stays a *gap*, reported by the ingest job as before): the log's
readable end ``E`` (whole batches, capped at the high watermark) below ``P`` is divergence
(truncated, not refilled); otherwise the log's batch holding ``P - 1`` must be the batch the
lake remembers (same base and last offset, epoch and CRC: a refilled log has new batches
there, whose CRC differs even when the broker kept the epoch). Cost: a few 61-byte header
reads per partition (from the ``.index`` entry before ``P - 1``).

**The divergence point** ``D`` (rewind only, :func:`divergence_point`): the first offset
where the lake's rows and the log's records differ (offset, timestamp, key, value, headers,
producer and epoch fields), comparing both from the start of the log segment that holds the
log's end (a segment further back while even that segment's first record differs), and no
later than ``E`` and than the remembered batch's base when that batch changed.

**Rewind** (``on_divergence="rewind"``): rows of the partition at offsets ``>= D`` leave
``records`` and go to the ``diverged`` table, and the log's current records from ``D`` on are
ingested, in one ``records`` commit: the data files holding such rows are removed and their
other rows written back to new files (:func:`plan_rewind`), together with the newly ingested
files and the progress set back to the new end (app-transaction versions may go down for the
rewound partitions only, and only from the version this run read). Ordering and why nothing
is lost or duplicated:

1. ``diverged`` is written first, by replace-where on ``rewind_id`` (a hash of the partition,
   its progress and the remembered batch: the lake state being rewound). A re-run after a crash
   sees the same lake state, hence the same ``rewind_id``, and replaces those rows: never twice.
2. ``records`` is committed (removes, kept rows, new rows, progress; ``read_version`` checked,
   so a concurrent writer makes the commit fail instead of removing files it chose from an old
   snapshot). Its ``commitInfo`` lists the completed ``rewind_id`` s.

A crash between 1 and 2 leaves ``records`` exactly as before and ``diverged`` holding rows of
a ``rewind_id`` that no ``records`` commit lists (the next run replaces them); a crash in 2
is atomic. A completed rewind changes the progress and remembered batch, so a re-run finds no
divergence and is a no-op.

Limits: a compacted topic whose cleaner removed the remembered batch would read as diverged
(loglake has no cleaner writing into the broker's log yet). A lake written before commits
carried batch identities is checked by its log end only until its next ingest commit. A
rewind reads each affected data file whole on the driver (up to ``max_rows_per_file`` rows)
and decodes the compared log segments there: fine for a rare repair, not a hot path.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from logstore.errors import LoglakeError
from logstore.objectstore import open_store
from pipelines.config import ON_DIVERGENCE
from pipelines.delta.commit import RemovedFile, commit_files, load_table
from pipelines.delta.files import PartitionedFileWriter, WrittenFile, partition_value_string
from pipelines.delta.log import DeltaLog
from pipelines.logdir import log_segments, segment_bases
from pipelines.sources.schema import RECORDS_ARROW_SCHEMA

__all__ = [
    "COMMIT_INFO_KEY",
    "COMPARED_COLUMNS",
    "DIVERGED_ARROW_SCHEMA",
    "ON_DIVERGENCE",
    "BatchId",
    "Divergence",
    "DivergenceError",
    "Rewind",
    "batch_at",
    "check_partition",
    "commit_info",
    "divergence_error",
    "divergence_limit",
    "divergence_point",
    "divergence_point_from",
    "log_end",
    "offset_to_compare",
    "plan_rewind",
    "read_fingerprints",
    "rewind_id",
    "write_diverged",
]

COMMIT_INFO_KEY = "loglakeIngest"
TopicPartition = tuple[str, int]

DIVERGED_ARROW_SCHEMA: pa.Schema = (
    RECORDS_ARROW_SCHEMA.append(
        pa.field("diverged_at", pa.timestamp("us", tz="UTC"), nullable=False)
    )
    .append(pa.field("reason", pa.string(), nullable=False))
    .append(pa.field("rewind_id", pa.string(), nullable=False))
)
DIVERGED_PARTITION_BY = ["topic", "rewind_id"]
# baseOffset i64, batchLength i32, partitionLeaderEpoch i32, magic i8, crc u32, attributes i16,
# lastOffsetDelta i32 (the first 27 bytes of a v2 batch header)
_HEADER = struct.Struct(">qiibIhi")
_ENTRY = struct.Struct(">ii")  # an .index entry
_MIN_BATCH_LENGTH = 49  # batchLength of a v2 batch without records
# columns compared between the lake's rows and the log's records to find the divergence point
COMPARED_COLUMNS = (
    "timestamp",
    "timestamp_type",
    "key",
    "value",
    "producer_id",
    "producer_epoch",
    "base_sequence",
    "is_transactional",
    "leader_epoch",
)


class DivergenceError(LoglakeError):
    """A partition's log no longer holds what the lake ingested from it (see the module doc)."""


@dataclass(frozen=True)
class BatchId:
    """Identity of one record batch of a partition's log (header fields, and where it was)."""

    base_offset: int
    last_offset: int
    leader_epoch: int
    crc: int
    segment_base_offset: int
    position: int

    def same_batch(self, other: BatchId) -> bool:
        """Same batch bytes, as far as the header tells (positions may move: not compared)."""
        return (self.base_offset, self.last_offset, self.leader_epoch, self.crc) == (
            other.base_offset,
            other.last_offset,
            other.leader_epoch,
            other.crc,
        )

    def describe(self) -> str:
        return (
            f"batch [{self.base_offset}, {self.last_offset}] epoch {self.leader_epoch} "
            f"crc 0x{self.crc:08x} (segment {self.segment_base_offset}, position {self.position})"
        )


@dataclass(frozen=True)
class Divergence:
    """What :func:`check_partition` found wrong with one partition."""

    topic: str
    partition: int
    progress: int  # the lake's next offset
    log_end: int  # the log's readable end
    lake_batch: BatchId | None
    log_batch: BatchId | None

    def describe(self) -> str:
        where = f"{self.topic}/{self.partition}"
        if self.log_end < self.progress:
            what = (
                f"the log ends at offset {self.log_end}, below the lake's progress "
                f"{self.progress} (the lake holds offsets up to {self.progress - 1})"
            )
        else:
            what = f"offset {self.progress - 1}: the lake has " + (
                self.lake_batch.describe() if self.lake_batch else "no batch identity"
            )
            what += ", the log has " + (
                self.log_batch.describe() if self.log_batch else "no whole batch there"
            )
        return f"{where}: {what}"


# --------------------------------------------------------------------------- the log side


def _header(fd: int, position: int, size: int, base: int) -> BatchId | None:
    """The whole v2 batch at ``position`` of a segment of ``size`` bytes, else None."""
    raw = os.pread(fd, _HEADER.size, position)
    if len(raw) < _HEADER.size:
        return None
    base_offset, length, epoch, magic, crc, _attrs, last_delta = _HEADER.unpack(raw)
    if magic != 2 or length < _MIN_BATCH_LENGTH or position + 12 + length > size:
        return None
    return BatchId(base_offset, base_offset + last_delta, epoch, crc, base, position)


def _index_start(path: Path, base: int, offset: int, size: int) -> int:
    """A batch start at or before the batch holding ``offset`` (from ``.index``), or 0.

    Entries (relative offset i32 = a batch's last offset, position i32 = its start) increase;
    the active segment's file is preallocated with zeros after them. A binary search with
    8-byte reads finds the last entry below ``offset`` without reading the (10 MiB) file. The
    broker may roll the segment meanwhile, cutting the file to its entries: a read past the
    new end is no entry, like the zeros it replaced.
    """
    try:
        fd = os.open(path.with_suffix(".index"), os.O_RDONLY)
    except OSError:
        return 0
    try:
        n = os.fstat(fd).st_size // 8

        def below(i: int) -> tuple[bool, int]:
            raw = os.pread(fd, 8, i * 8)
            if len(raw) < 8:  # cut since the fstat: the segment rolled and its index was
                return False, 0  # trimmed to its entries (all before this one)
            rel, pos = _ENTRY.unpack(raw)
            sane = (i == 0 or rel > 0) and 0 <= pos < size and rel >= 0
            return sane and rel + base < offset, pos

        lo, hi, found = 0, n, 0
        while lo < hi:  # invariant: entries before lo are below offset
            mid = (lo + hi) // 2
            ok, pos = below(mid)
            if ok:
                lo, found = mid + 1, pos
            else:
                hi = mid
        return found
    finally:
        os.close(fd)


def _scan(path: Path, base: int, offset: int | None) -> tuple[BatchId | None, int | None, int]:
    """Walk batch headers of one segment: ``(batch holding offset, end offset of the walk,
    byte position where the walk stopped)``.

    With ``offset`` None the walk goes to the last whole batch (its end is the second value).
    """
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        position = _index_start(path, base, offset if offset is not None else 2**62, size)
        first = _header(fd, position, size, base)
        if position and first is None:
            position = 0  # a stale index entry: walk from the start
        end: int | None = None
        while True:
            batch = _header(fd, position, size, base)
            if batch is None:
                return None, end, position
            if offset is not None and batch.base_offset > offset:
                return None, end, position
            if offset is not None and batch.last_offset >= offset:
                return batch, batch.last_offset + 1, position
            end = batch.last_offset + 1
            position += 12 + int.from_bytes(os.pread(fd, 4, position + 8), "big", signed=True)
    finally:
        os.close(fd)


def batch_at(part_dir: Path, offset: int) -> BatchId | None:
    """The whole batch of the partition's log holding ``offset`` (header walk), or None."""
    candidates = [(b, p) for b, p in log_segments(part_dir) if b <= offset]
    if not candidates:
        return None
    base, path = candidates[-1]
    return _scan(path, base, offset)[0]


def log_end(part_dir: Path, high_watermark: int | None) -> int:
    """The partition's readable end: one past its last whole batch, capped at the HW.

    A walk that stops at damaged bytes (not at the end of the file or at preallocated zero
    fill) has not found the end of the log: ingest quarantines such a byte range and moves
    past it (``pipelines.sources.damage``), so the log still reaches its high watermark there.
    """
    segments = log_segments(part_dir)
    if not segments:
        return 0
    base, path = segments[-1]
    _, last, stop = _scan(path, base, None)
    end = base if last is None else last  # an active segment without a whole batch: its base
    if high_watermark is None:
        return end
    if end < high_watermark and _damaged_from(path, stop):
        return high_watermark
    return min(end, high_watermark)


def _damaged_from(path: Path, position: int) -> bool:
    """Bytes other than zero fill follow ``position`` of segment ``path`` (64 KiB looked at)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return any(os.pread(fd, 1 << 16, position))
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- the lake side


def read_fingerprints(
    records_path: str | Path, progress: Mapping[TopicPartition, int]
) -> dict[TopicPartition, BatchId | None]:
    """Per partition with progress, the remembered batch at ``progress - 1`` (None: none kept).

    Partitions absent from the result have no entry matching their progress (see module doc).
    """
    if not progress:
        return {}
    seen: set[TopicPartition] = set()
    out: dict[TopicPartition, BatchId | None] = {}
    for info in DeltaLog(records_path).commit_infos():
        raw = info.get(COMMIT_INFO_KEY)
        if raw is None:
            continue
        entries = json.loads(raw).get("batches", {})
        for key, entry in entries.items():
            topic, _, part = key.rpartition("/")
            tp = (topic, int(part))
            if tp in seen:
                continue
            seen.add(tp)
            if tp in progress and entry.get("next") == progress[tp]:
                batch = entry.get("batch")
                out[tp] = BatchId(**batch) if batch else None
        if seen >= set(progress):
            break
    return out


def commit_info(
    new_progress: Mapping[TopicPartition, int],
    parts: Mapping[TopicPartition, Path],
    carried: Mapping[TopicPartition, BatchId | None],
    progress: Mapping[TopicPartition, int],
    rewinds: Iterable[str] = (),
    *,
    found: Mapping[TopicPartition, BatchId | None] | None = None,
) -> dict[str, str]:
    """The ``commitInfo`` entry of an ingest commit: the batch at each new progress - 1.

    ``carried`` (valid entries read at the start of the run, at ``progress``) is kept for the
    partitions this commit does not move. ``found``: those batches already read (through
    Fetch, :func:`fetched_batch_ids`) instead of from ``parts``' segment files.
    """
    batches: dict[str, dict[str, Any]] = {}
    for tp, nxt in progress.items():
        if tp in carried and tp not in new_progress:
            batch = carried[tp]
            batches[f"{tp[0]}/{tp[1]}"] = {"next": nxt, "batch": asdict(batch) if batch else None}
    for tp, nxt in new_progress.items():
        if found is not None:
            batch = found.get(tp)
        else:
            batch = batch_at(parts[tp], nxt - 1) if tp in parts and nxt > 0 else None
        if batch is not None and batch.last_offset != nxt - 1:
            batch = None
        batches[f"{tp[0]}/{tp[1]}"] = {"next": nxt, "batch": asdict(batch) if batch else None}
    info = {"batches": dict(sorted(batches.items())), "rewinds": sorted(rewinds)}
    return {COMMIT_INFO_KEY: json.dumps(info, separators=(",", ":"))}


def check_partition(
    tp: TopicPartition,
    part_dir: Path,
    *,
    progress: int,
    log_start: int,
    high_watermark: int | None,
    fingerprint: BatchId | None,
    known: bool,
    cleaned_to: int = 0,
) -> Divergence | None:
    """Does the partition's log still hold what the lake ingested up to ``progress``?

    ``known``: the lake has an entry for this partition at ``progress`` (``fingerprint``
    None then means that entry has no batch, e.g. progress moved over a gap only).
    """
    if progress <= 0 or progress < log_start:
        return None  # nothing ingested, or a gap (reported by the job as such)
    end = log_end(part_dir, high_watermark)
    if end < progress:
        return Divergence(tp[0], tp[1], progress, end, fingerprint, None)
    at = offset_to_compare(progress, end, log_start, fingerprint, known, cleaned_to)
    if at is None or fingerprint is None:
        return None
    current = batch_at(part_dir, at)
    if current is not None and current.same_batch(fingerprint):
        return None
    return Divergence(tp[0], tp[1], progress, end, fingerprint, current)


def offset_to_compare(  # noqa: PLR0917
    progress: int,
    end: int,
    log_start: int,
    fingerprint: BatchId | None,
    known: bool,
    cleaned_to: int,
) -> int | None:
    """The offset whose batch the log must still hold as the lake remembers it (the
    remembered batch's last offset), or None: nothing to compare (the log end alone judges).
    """
    if end < progress:
        return None  # diverged already: ended below the progress
    if not known or fingerprint is None or fingerprint.base_offset < log_start:
        return None  # nothing to compare the log's batch with
    if fingerprint.last_offset < cleaned_to:
        # compacted since (cleaner-offset-checkpoint past it): the cleaner rewrote that batch
        # (records dropped, new CRC) under the same offsets; only the log end can tell.
        return None
    return fingerprint.last_offset


def divergence_error(found: Iterable[Divergence], *, diverged_path: str) -> DivergenceError:
    """The error of ``on_divergence="fail"`` (the jobs exit 4), naming every partition."""
    found = list(found)
    text = "; ".join(d.describe() for d in found)
    return DivergenceError(
        f"the log went backwards under the lake in {len(found)} partition(s): {text}. "
        "The broker truncated its log (an unclean restart?) and may have written new "
        "records under offsets the lake already holds; nothing was ingested. To proceed: "
        "restore the log, or re-run with --on-divergence=rewind (or [ingest] "
        f'on_divergence = "rewind") to move the lake\'s rows from the first differing '
        f"offset on into {diverged_path} and ingest what the log holds now"
    )


# --------------------------------------------------------------------------- the divergence point


def _lake_rows(records_path: str, tp: TopicPartition, lo: int, hi: int) -> pa.Table:
    dt = load_table(records_path)
    if dt is None:
        return RECORDS_ARROW_SCHEMA.empty_table()
    dataset = dt.to_pyarrow_dataset()
    filt = (
        (ds.field("topic") == tp[0])
        & (ds.field("partition") == tp[1])
        & (ds.field("offset") >= lo)
        & (ds.field("offset") < hi)
    )
    cols = ["offset", *COMPARED_COLUMNS, "headers"]
    return dataset.to_table(columns=cols, filter=filt).sort_by("offset")


def _log_records(part_dir: Path, tp: TopicPartition, lo: int, hi: int) -> pa.Table:
    # Imported here: only a rewind decodes records on the driver (loads numba).
    from pipelines.sources.plan import SegmentRange  # noqa: PLC0415
    from pipelines.sources.read import read_records  # noqa: PLC0415

    segments = log_segments(part_dir)
    batches: list[pa.RecordBatch] = []
    for n, (base, path) in enumerate(segments):
        nxt = segments[n + 1][0] if n + 1 < len(segments) else None
        if (nxt is not None and nxt <= lo) or base >= hi:
            continue
        rng = SegmentRange(
            topic=tp[0],
            partition=tp[1],
            path=str(path),
            segment_base_offset=base,
            start=0,
            end=path.stat().st_size,
            start_offset=lo,
            until=hi,
            next_base_offset=nxt,
            is_tail=nxt is None,
        )
        batches.extend(read_records(rng, min_timestamp=-(2**63), max_timestamp=2**63 - 1))
    table = pa.Table.from_batches(batches, schema=RECORDS_ARROW_SCHEMA)
    return table.select(["offset", *COMPARED_COLUMNS, "headers"]).sort_by("offset")


def _first_difference(lake: pa.Table, log: pa.Table) -> int | None:
    """Index of the first row where the two offset-sorted tables differ (None: equal)."""
    n = min(lake.num_rows, log.num_rows)
    differs = np.zeros(n, np.bool_)
    a, b = lake.slice(0, n), log.slice(0, n)
    for name in ("offset", *COMPARED_COLUMNS):
        x, y = a.column(name), b.column(name)
        eq = pc.equal(x, y)
        both_null = pc.and_(pc.is_null(x), pc.is_null(y))
        ok = pc.or_(pc.fill_null(eq, False), both_null)
        differs |= ~np.asarray(ok.to_numpy(zero_copy_only=False), np.bool_)
    # headers (list<struct<key, value>>): counts per row, then the flattened pairs of the rows
    # before the first count that differs (there the flattened arrays still line up)
    hx, hy = a.column("headers").combine_chunks(), b.column("headers").combine_chunks()
    lx = np.asarray(pc.list_value_length(hx).to_numpy(zero_copy_only=False), np.int64)
    ly = np.asarray(pc.list_value_length(hy).to_numpy(zero_copy_only=False), np.int64)
    count_differs = np.flatnonzero(lx != ly)
    differs[count_differs] = True
    k = int(count_differs[0]) if count_differs.size else n
    flat = int(lx[:k].sum())
    if flat:
        fx, fy = pc.list_flatten(hx).slice(0, flat), pc.list_flatten(hy).slice(0, flat)
        parent = np.asarray(pc.list_parent_indices(hx).to_numpy(zero_copy_only=False))[:flat]
        for fld in ("key", "value"):
            x, y = pc.struct_field(fx, fld), pc.struct_field(fy, fld)
            ok = pc.or_(pc.fill_null(pc.equal(x, y), False), pc.and_(pc.is_null(x), pc.is_null(y)))
            bad = ~np.asarray(ok.to_numpy(zero_copy_only=False), np.bool_)
            differs[parent[bad]] = True
    hits = np.flatnonzero(differs)
    if hits.size:
        return int(hits[0])
    return None if lake.num_rows == log.num_rows else n


def divergence_point(records_path: str, part_dir: Path, div: Divergence, log_start: int) -> int:
    """The first offset at which the lake and the log differ (see the module docstring)."""
    return divergence_point_from(
        records_path, div, log_start, bases=segment_bases(part_dir),
        read_log=lambda tp, lo, hi: _log_records(part_dir, tp, lo, hi),
    )  # fmt: skip


def divergence_limit(div: Divergence) -> int:
    """The divergence point is no later than this (see the module docstring)."""
    bound = min(div.progress, div.log_end)
    if div.lake_batch is not None and div.log_end >= div.progress:
        bound = min(bound, div.lake_batch.base_offset)  # that batch changed
    return bound


def divergence_point_from(
    records_path: str,
    div: Divergence,
    log_start: int,
    *,
    bases: Iterable[int],
    read_log: Callable[[TopicPartition, int, int], pa.Table],
) -> int:
    """:func:`divergence_point` comparing from each of ``bases`` in turn (the last below the
    limit first, then further back while the first record compared differs), the log's
    records of ``[lo, hi)`` read by ``read_log(tp, lo, hi)`` (offset-sorted, the compared
    columns): from the segment files, or through Fetch."""
    tp = (div.topic, div.partition)
    bound = divergence_limit(div)
    bases = [b for b in bases if b < max(bound, log_start + 1)]
    idx = len(bases) - 1
    while True:
        lo = max(log_start, bases[idx] if idx >= 0 else log_start)
        lake = _lake_rows(records_path, tp, lo, div.progress)
        log = read_log(tp, lo, min(div.progress, div.log_end))
        i = _first_difference(lake, log)
        if i is None:
            return bound
        offsets: list[int] = [t.column("offset")[i].as_py() for t in (lake, log) if i < t.num_rows]
        point = min(offsets)
        if point > lo or idx <= 0 or point >= bound:
            return min(point, bound)
        idx -= 1  # the segment's very first record differs: look one segment further back


def rewind_id(tp: TopicPartition, progress: int, fingerprint: BatchId | None) -> str:
    """Names one rewind of one lake state (partition, its progress, its remembered batch)."""
    text = json.dumps([tp[0], tp[1], progress, asdict(fingerprint) if fingerprint else None])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- rewinding


@dataclass
class Rewind:
    """What one rewind commit removes from and writes back to ``records``."""

    read_version: int
    removes: list[RemovedFile]
    kept_files: list[WrittenFile]
    moved: pa.Table  # DIVERGED_ARROW_SCHEMA rows
    ids: dict[TopicPartition, str]
    points: dict[TopicPartition, int]

    def describe(self) -> str:
        return ", ".join(
            f"{t}/{p} from offset {d} (rewind {self.ids[(t, p)]})"
            for (t, p), d in sorted(self.points.items())
        )


def _with_partition_columns(table: pa.Table, values: Mapping[str, str | None]) -> pa.Table:
    n = table.num_rows
    cols = {}
    for f in RECORDS_ARROW_SCHEMA:
        if f.name == "topic":
            cols[f.name] = pa.array([values["topic"]] * n, pa.string())
        elif f.name == "date":
            cols[f.name] = pc.cast(pa.array([values["date"]] * n, pa.string()), pa.date32())
        else:
            cols[f.name] = table.column(f.name)
    return pa.table(cols).cast(RECORDS_ARROW_SCHEMA)


def plan_rewind(
    records_path: str,
    points: Mapping[TopicPartition, int],
    ids: Mapping[TopicPartition, str],
    reasons: Mapping[TopicPartition, str],
    *,
    write_id: str,
    writer_options: Mapping[str, Any],
) -> Rewind:
    """Read the data files holding rows at or past each partition's divergence point; write
    their other rows back (files of write ``write_id``, so the staged write's abort removes
    them) and return those, the files to remove and the rows that move to ``diverged``."""
    dt = load_table(records_path)
    if dt is None:
        raise LoglakeError("cannot rewind: no records table", path=records_path)
    version = dt.version()
    store = open_store(records_path)  # the lake's store: local disk or an object store
    adds = pa.table(dt.get_add_actions(flatten=True))
    now = pa.scalar(int(time.time() * 1_000_000), pa.timestamp("us", tz="UTC"))
    removes: list[RemovedFile] = []
    kept_files: list[WrittenFile] = []
    moved: list[pa.Table] = []
    writer = PartitionedFileWriter(
        records_path,
        write_id=write_id,
        task_id=99_999,  # the driver's own files: no Spark task has this index
        attempt=0,
        partition_by=["topic", "date"],
        **writer_options,
    )
    try:
        for row in adds.to_pylist():
            values = {
                "topic": partition_value_string(row.get("partition.topic")),
                "date": partition_value_string(row.get("partition.date")),
            }
            hits = [
                tp
                for tp, d in points.items()
                if tp[0] == values["topic"]
                and (row.get("min.partition") is None or row["min.partition"] <= tp[1])
                and (row.get("max.partition") is None or tp[1] <= row["max.partition"])
                and (row.get("max.offset") is None or row["max.offset"] >= d)
            ]
            if not hits:
                continue
            data = pq.read_table(pa.BufferReader(store.read(unquote(row["path"]))))
            full = _with_partition_columns(data, values)
            mask = None
            for tp in hits:
                m = pc.and_(
                    pc.equal(full.column("partition"), tp[1]),
                    pc.greater_equal(full.column("offset"), points[tp]),
                )
                mask = m if mask is None else pc.or_(mask, m)
            if not pc.any(mask).as_py():
                continue
            removes.append(RemovedFile(row["path"], row["size_bytes"], values))
            keep = full.filter(pc.invert(mask))
            if keep.num_rows:
                writer.write(keep)
            gone = full.filter(mask)
            moved.append(_diverged_rows(gone, now, reasons, ids))
        kept_files = writer.close()
    except BaseException:
        writer.abort()
        raise
    table = pa.concat_tables(moved) if moved else DIVERGED_ARROW_SCHEMA.empty_table()
    return Rewind(version, removes, kept_files, table, dict(ids), dict(points))


def _diverged_rows(
    rows: pa.Table,
    now: pa.Scalar,
    reasons: Mapping[TopicPartition, str],
    ids: Mapping[TopicPartition, str],
) -> pa.Table:
    keys = list(
        zip(rows.column("topic").to_pylist(), rows.column("partition").to_pylist(), strict=True)
    )
    n = rows.num_rows
    return (
        rows.append_column("diverged_at", pa.array([now.as_py()] * n, now.type))
        .append_column("reason", pa.array([reasons[k] for k in keys], pa.string()))
        .append_column("rewind_id", pa.array([ids[k] for k in keys], pa.string()))
        .cast(DIVERGED_ARROW_SCHEMA)
    )


def write_diverged(diverged_path: str, rewind: Rewind, *, compression: str) -> int:
    """Step 1 of a rewind: replace ``diverged``'s rows of these rewind ids with ``rewind.moved``.

    Idempotent: a re-run of the same rewind replaces its rows instead of adding them again.
    Returns the number of rows written.
    """
    ids = sorted(set(rewind.ids.values()))
    dt = load_table(diverged_path)
    removes: list[RemovedFile] = []
    if dt is not None:
        adds = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
        for row in adds:
            if row.get("partition.rewind_id") in ids:
                values = {
                    "topic": partition_value_string(row["partition.topic"]),
                    "rewind_id": partition_value_string(row["partition.rewind_id"]),
                }
                removes.append(RemovedFile(row["path"], row["size_bytes"], values))
    writer = PartitionedFileWriter(  # it makes its directories on local disk
        diverged_path,
        write_id=os.urandom(16).hex(),
        task_id=0,
        attempt=0,
        partition_by=DIVERGED_PARTITION_BY,
        compression=compression,
    )
    try:
        if rewind.moved.num_rows:
            writer.write(rewind.moved)
        files = writer.close()
        predicate = "rewind_id IN (" + ", ".join(f"'{i}'" for i in ids) + ")"
        commit_files(
            diverged_path,
            files,
            schema=DIVERGED_ARROW_SCHEMA,
            partition_by=DIVERGED_PARTITION_BY,
            mode="overwrite",
            predicate=predicate,
            removes=removes,
            read_version=dt.version() if dt is not None else None,
        )
    except BaseException:
        writer.abort()
        raise
    moved: int = rewind.moved.num_rows
    return moved
