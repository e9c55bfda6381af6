"""Driver side of the ``logsegments`` source: options, log-dir discovery, input ranges.

A log dir holds ``<topic>-<partition>/`` directories of segments ``<base offset:020d>.log``
with their ``.index`` (8-byte entries: relative offset i32 = last offset of a batch, position
i32 = that batch's start) and ``.timeindex`` (12-byte entries: timestamp i64, relative offset
i32; the last entry of a rolled segment is its largest timestamp), plus the broker's
checkpoints (``replication-offset-checkpoint``: high watermarks; ``log-start-offset-
checkpoint``). Nothing here reads records: only directory listings, index files, checkpoint
files and one 61-byte header per chosen split point.

Planning rules:

- one :class:`SegmentRange` per segment; a segment larger than ``maxPartitionBytes`` is cut
  at ``.index`` positions (batch starts) into ranges of about that size. Every cut is checked
  by reading the batch header there (magic 2, sane batchLength); a bad index entry is simply
  not used as a cut, so a stale index can never make a range start inside a batch;
- the readable end of each partition is ``until``: the high watermark from
  ``replication-offset-checkpoint`` by default (``until="latest"`` or a partition missing
  from that file, or no file at all: every whole batch); ranges wholly at or above it, or
  wholly below the start offset (``startingOffsets``, never below the log start offset),
  are dropped;
- ``minTimestamp`` drops rolled segments whose last ``.timeindex`` entry is older (the
  active segment's time index is incomplete, so it is always read).

Sizes are those seen at planning time: a segment that grows later is read only up to its
planned size (and up to ``until``).

Retention may delete a segment at any time (the broker's periodic retention renames it
``.deleted``, then removes it). A segment gone between the listing and its planning or its
read raises :class:`SegmentVanishedError`; jobs run their plan-and-read step through
:func:`replanned`, which plans again (a bounded number of attempts, each logged): the new plan
starts at the new log start, so what retention took before it was read is seen as a gap.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

import numpy as np

from logstore.errors import InvalidConfigError
from pipelines.logdir import (
    LOG_START_OFFSET_CHECKPOINT,
    PARTITION_DIR_MISSING,
    REPLICATION_OFFSET_CHECKPOINT,
    SEGMENT_VANISHED,
    LogDirNotSharedError,
    PartitionDirMissingError,
    SegmentVanishedError,
    log_segments,
    partition_dirs,
    read_checkpoint,
    segment_bases,
)

__all__ = [
    "DEFAULT_MAX_PARTITION_BYTES",
    "REPLAN_ATTEMPTS",
    "SEGMENT_VANISHED",
    "UNDECODABLE_BATCH",
    "Kind",
    "LogDirNotSharedError",
    "SegmentRange",
    "SegmentVanishedError",
    "SourceOptions",
    "check_partition_dir_missing",
    "deleted_from_front",
    "guided_cuts",
    "missing_partition_dir",
    "parse_options",
    "plan_ranges",
    "replanned",
    "segment_vanished",
]

Kind = Literal["records", "batches"]
DEFAULT_MAX_PARTITION_BYTES = 128 << 20
MIN_OFFSET = -(2**63)
MAX_OFFSET = 2**63 - 1
# Starts the message of the error ``onDecodeError=fail`` raises on the executors, so the driver
# can recognise it inside Spark's wrapping (a Py4J/Python exception whose text holds it).
UNDECODABLE_BATCH = "undecodable batch (CRC valid)"
_HEADER = struct.Struct(">qiib")  # baseOffset, batchLength, partitionLeaderEpoch, magic
# Plan-and-read attempts of one job run (replanned): retention racing a run deletes a segment
# under it now and then; five tries in a row all losing that race means something else.
REPLAN_ATTEMPTS = 5
# Files of a segment whose FileNotFoundError means retention took the segment.
_SEGMENT_SUFFIXES = (".log", ".index", ".timeindex", ".txnindex", ".deleted")
_T = TypeVar("_T")


def segment_vanished(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it wraps: Spark and the Delta sink wrap an executor's
    error, keeping its text) is a segment that vanished under a read."""
    return _vanished_line(exc) is not None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then the errors it wraps (causes, else contexts), each once."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _vanished_line(exc: BaseException) -> str | None:
    """The line saying which segment vanished, from ``exc`` or the errors it wraps."""
    for cur in _chain(exc):
        text = str(cur)
        if SEGMENT_VANISHED in text:
            return next(x.strip() for x in text.splitlines() if SEGMENT_VANISHED in x)
        if isinstance(cur, SegmentVanishedError):
            return text
        if isinstance(cur, PartitionDirMissingError):
            return None  # not a segment: the driver decides (check_partition_dir_missing)
        if isinstance(cur, FileNotFoundError) and str(cur.filename or "").endswith(
            _SEGMENT_SUFFIXES
        ):
            return text
    return None


_MISSING_DIR = re.compile(re.escape(PARTITION_DIR_MISSING) + r" \[(?P<dir>[^\]\n]+)\]")


def missing_partition_dir(exc: BaseException) -> str | None:
    """The partition directory a task found missing (:class:`PartitionDirMissingError`), from
    ``exc`` or the errors it wraps (Spark keeps the executor's text); None: not that error."""
    for cur in _chain(exc):
        if isinstance(cur, PartitionDirMissingError) and cur.path is not None:
            return cur.path
        found = _MISSING_DIR.search(str(cur))
        if found is not None:
            return found["dir"]
    return None


def check_partition_dir_missing(exc: BaseException) -> None:
    """Raise :class:`LogDirNotSharedError` when ``exc`` is a task's missing partition directory
    that this process (the driver, which planned from it) still sees: the executors do not
    share the driver's disk, and no re-plan can help. A directory gone here too is a topic
    deleted under the run: the caller plans again, as for a vanished segment."""
    part_dir = missing_partition_dir(exc)
    if part_dir is not None and os.path.isdir(part_dir):
        log_dir = os.path.dirname(part_dir.rstrip("/"))
        raise LogDirNotSharedError(
            f"the executors cannot see log dir {log_dir} (no shared disk?): set log_dirs = [] "
            f"to read through the broker (a task found {part_dir} missing; the driver sees it)"
        ) from exc


def deleted_from_front(rng: SegmentRange) -> bool:
    """Whether ``rng``'s segment, found gone, went the way retention deletes (oldest first, as
    the broker's retention and DeleteRecords do): the partition's first segment now starts
    after it. A segment gone from the middle (a cleaner's swap) is not."""
    if rng.next_base_offset is None:
        return False  # the active segment is never deleted by retention
    remaining = segment_bases(Path(rng.path).parent)
    return bool(remaining) and remaining[0] > rng.segment_base_offset


def replanned(
    attempt: Callable[[], _T],
    *,
    what: str,
    log: Callable[[str], None],
    attempts: int = REPLAN_ATTEMPTS,
) -> _T:
    """``attempt()`` (one plan-and-read step that leaves nothing behind when it raises), again
    while a segment vanishes under it (:func:`segment_vanished`), at most ``attempts`` times;
    each retry is logged. A partition directory that the executors cannot see while the driver
    does raises :class:`LogDirNotSharedError` at once (:func:`check_partition_dir_missing`); one
    gone for the driver too (a deleted topic) is planned again. Any other error, or the last
    attempt's, is raised as it is."""
    for n in range(1, attempts):
        try:
            return attempt()
        except Exception as exc:
            check_partition_dir_missing(exc)
            line = _vanished_line(exc)
            if line is None:
                missing = missing_partition_dir(exc)
                if missing is None:
                    raise
                line = f"{PARTITION_DIR_MISSING} [{missing}]"
            log(
                f"{what}: a segment was deleted under the run ({line[:300]}); "
                f"planning again (attempt {n + 1} of {attempts})"
            )
    try:
        return attempt()
    except Exception as exc:
        check_partition_dir_missing(exc)
        raise


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """Parsed options (all keyword; Spark hands them over as strings)."""

    log_dirs: tuple[str, ...]
    kind: Kind = "records"
    topics: frozenset[str] | None = None
    starting_offsets: Mapping[str, Mapping[int, int]] | None = None
    until: Literal["highWatermark", "latest"] | Mapping[str, Mapping[int, int]] = "highWatermark"
    min_timestamp: int = MIN_OFFSET
    max_timestamp: int = MAX_OFFSET
    max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES
    verify: Literal["crc", "full"] = "crc"
    on_decode_error: Literal["skip", "fail"] = "skip"


@dataclass(frozen=True, slots=True)
class SegmentRange:
    """One input partition: bytes ``[start, end)`` of one segment file (batch boundaries).

    ``start_offset``/``until`` bound the offsets to emit; ``next_base_offset`` is the next
    segment's base offset (None for the last segment), used to report batches whose offsets
    break the segment's bounds; ``is_tail`` marks the last range of the partition's last
    (active) segment, whose torn tail is in-flight data rather than damage. Picklable.
    """

    topic: str
    partition: int
    path: str
    segment_base_offset: int
    start: int
    end: int
    start_offset: int
    until: int
    next_base_offset: int | None
    is_tail: bool


def _offsets_json(text: str, name: str) -> dict[str, dict[int, int]]:
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise TypeError("not an object")
        return {
            str(topic): {int(p): int(o) for p, o in parts.items()} for topic, parts in raw.items()
        }
    except (ValueError, TypeError, AttributeError) as exc:
        raise InvalidConfigError(
            f'option {name} must be JSON like {{"topic": {{"0": 42}}}}, got {text!r}: {exc}'
        ) from None


def _int_option(opts: Mapping[str, str], name: str, default: int) -> int:
    value = _get(opts, name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise InvalidConfigError(f"option {name} must be an integer, got {value!r}") from None


def _get(opts: Mapping[str, str], name: str) -> str | None:
    # Spark's options are case-insensitive; a plain dict from a caller may not be.
    for key, value in opts.items():
        if key.lower() == name.lower():
            return str(value)
    return None


def parse_options(opts: Mapping[str, str]) -> SourceOptions:
    """Options of ``spark.read.format("logsegments")`` (``path`` = comma-separated log dirs)."""
    path = _get(opts, "path") or _get(opts, "logDirs")
    if not path:
        raise InvalidConfigError("logsegments needs a log dir: .load(<log.dirs>) or option path")
    log_dirs = tuple(p.strip() for p in path.split(",") if p.strip())
    kind = (_get(opts, "kind") or "records").lower()
    if kind not in ("records", "batches"):
        raise InvalidConfigError(f"option kind must be records or batches, got {kind!r}")
    topics_opt = _get(opts, "topics")
    topics = None
    if topics_opt:
        topics = frozenset(t.strip() for t in topics_opt.split(",") if t.strip())
    starting = _get(opts, "startingOffsets")
    starting_offsets = None
    if starting and starting.strip().lower() != "earliest":
        starting_offsets = _offsets_json(starting, "startingOffsets")
    until_opt = (_get(opts, "until") or "highWatermark").strip()
    until: Literal["highWatermark", "latest"] | dict[str, dict[int, int]]
    if until_opt.lower() in ("highwatermark", "high_watermark"):
        until = "highWatermark"
    elif until_opt.lower() == "latest":
        until = "latest"
    else:
        until = _offsets_json(until_opt, "until")
    verify = (_get(opts, "verify") or "crc").lower()
    if verify not in ("crc", "full"):
        raise InvalidConfigError(f"option verify must be crc or full, got {verify!r}")
    on_decode_error = (_get(opts, "onDecodeError") or "skip").lower()
    if on_decode_error not in ("skip", "fail"):
        raise InvalidConfigError(
            f"option onDecodeError must be skip or fail, got {on_decode_error!r}"
        )
    max_bytes = _int_option(opts, "maxPartitionBytes", DEFAULT_MAX_PARTITION_BYTES)
    if max_bytes < 1:
        raise InvalidConfigError(f"option maxPartitionBytes must be positive, got {max_bytes}")
    return SourceOptions(
        log_dirs=log_dirs,
        kind=kind,  # type: ignore[arg-type]
        topics=topics,
        starting_offsets=starting_offsets,
        until=until,
        min_timestamp=_int_option(opts, "minTimestamp", MIN_OFFSET),
        max_timestamp=_int_option(opts, "maxTimestamp", MAX_OFFSET),
        max_partition_bytes=max_bytes,
        verify=verify,  # type: ignore[arg-type]
        on_decode_error=on_decode_error,  # type: ignore[arg-type]
    )


def _index_positions(path: Path, size: int) -> np.ndarray:
    """Valid ``.index`` positions (strictly increasing, inside the file); empty if none."""
    index = path.with_suffix(".index")
    try:
        raw = np.fromfile(index, dtype=">i4")
    except OSError:
        return np.empty(0, np.int64)
    entries = raw[: raw.shape[0] // 2 * 2].reshape(-1, 2).astype(np.int64)
    rel, pos = entries[:, 0], entries[:, 1]
    # Preallocated / stale tails: keep the prefix where both columns strictly increase.
    good = np.ones(rel.shape[0], np.bool_)
    good[1:] = (np.diff(rel) > 0) & (np.diff(pos) > 0)
    bad = np.flatnonzero(~good | (pos <= 0) | (pos >= size) | (rel < 0))
    stop = int(bad[0]) if bad.size else rel.shape[0]
    return pos[:stop]


def _last_time_index_ts(path: Path) -> int | None:
    """The largest timestamp of a rolled segment's ``.timeindex``; None when unknown."""
    try:
        raw = np.fromfile(path.with_suffix(".timeindex"), dtype=np.uint8)
    except OSError:
        return None
    n = raw.shape[0] // 12
    if n == 0:
        return None
    ts = raw[: n * 12].reshape(n, 12)[:, :8].copy().view(">i8").reshape(n)
    good = np.ones(n, np.bool_)
    good[1:] = np.diff(ts) > 0
    bad = np.flatnonzero(~good)
    stop = int(bad[0]) if bad.size else n
    return int(ts[stop - 1]) if stop else None


def _header_at(fd: int, position: int) -> tuple[int, int] | None:
    """``(base_offset, size)`` of a plausible v2 batch at ``position``, else None."""
    raw = os.pread(fd, _HEADER.size, position)
    if len(raw) < _HEADER.size:
        return None
    base_offset, length, _epoch, magic = _HEADER.unpack(raw)
    if magic != 2 or length < 49:
        return None
    return base_offset, length + 12


def _cuts(fd: int, positions: np.ndarray, size: int, target: int) -> list[tuple[int, int]]:
    """``[(position, base_offset)]`` cut points (position 0 first) about ``target`` apart."""
    first = _header_at(fd, 0)
    cuts = [(0, first[0] if first else MIN_OFFSET)]
    i = 0
    n = positions.shape[0]
    while i < n:
        want = cuts[-1][0] + target
        if size - cuts[-1][0] <= target:
            break
        j = int(np.searchsorted(positions, want, side="right")) - 1
        j = max(j, i)
        while j < n:
            pos = int(positions[j])
            header = _header_at(fd, pos) if pos > cuts[-1][0] else None
            if header is not None:
                cuts.append((pos, header[0]))
                break
            j += 1
        i = j + 1
    return cuts


def plan_ranges(options: SourceOptions) -> list[SegmentRange]:
    """Every input range of ``options``, ordered by log dir, topic, partition, position."""
    out: list[SegmentRange] = []
    for log_dir_text in options.log_dirs:
        log_dir = Path(log_dir_text).resolve()
        parts = partition_dirs(log_dir, topics=options.topics)
        high_watermarks = read_checkpoint(log_dir, REPLICATION_OFFSET_CHECKPOINT)
        log_starts = read_checkpoint(log_dir, LOG_START_OFFSET_CHECKPOINT) or {}
        for topic, partition, part_dir in parts:
            start_offset = log_starts.get((topic, partition), 0)
            if options.starting_offsets is not None:
                wanted = options.starting_offsets.get(topic, {}).get(partition)
                if wanted is not None:
                    start_offset = max(start_offset, wanted)
            until = _until(options, high_watermarks, topic, partition)
            out.extend(_plan_partition(options, topic, partition, part_dir, start_offset, until))
    return out


def _until(
    options: SourceOptions,
    high_watermarks: Mapping[tuple[str, int], int] | None,
    topic: str,
    partition: int,
) -> int:
    if isinstance(options.until, Mapping):
        explicit = options.until.get(topic, {}).get(partition)
        if explicit is not None:
            return explicit
    elif options.until == "latest":
        return MAX_OFFSET
    if high_watermarks is None:
        return MAX_OFFSET
    return high_watermarks.get((topic, partition), MAX_OFFSET)


def _plan_partition(  # noqa: PLR0917
    options: SourceOptions,
    topic: str,
    partition: int,
    part_dir: Path,
    start_offset: int,
    until: int,
) -> Iterable[SegmentRange]:
    segments = log_segments(part_dir)
    for n, (base, path) in enumerate(segments):
        is_last = n == len(segments) - 1
        next_base = None if is_last else segments[n + 1][0]
        if next_base is not None and next_base <= start_offset:
            continue  # every offset of this segment is below the start
        if base >= until:
            break
        if not is_last and options.min_timestamp > MIN_OFFSET:
            largest = _last_time_index_ts(path)
            if largest is not None and largest < options.min_timestamp:
                continue
        try:
            size = path.stat().st_size
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise SegmentVanishedError(SEGMENT_VANISHED, path=str(path)) from None
        if size == 0:
            os.close(fd)
            continue
        try:
            if size > options.max_partition_bytes:
                cuts = _cuts(fd, _index_positions(path, size), size, options.max_partition_bytes)
            else:
                first = _header_at(fd, 0)
                cuts = [(0, first[0] if first else MIN_OFFSET)]
        finally:
            os.close(fd)
        bounds = [c[0] for c in cuts] + [size]
        for i, (position, first_offset) in enumerate(cuts):
            following = cuts[i + 1][1] if i + 1 < len(cuts) else None
            if following is not None and following <= start_offset:
                continue
            if i > 0 and first_offset >= until:
                break
            yield SegmentRange(
                topic=topic,
                partition=partition,
                path=str(path),
                segment_base_offset=base,
                start=position,
                end=bounds[i + 1],
                start_offset=start_offset,
                until=until,
                next_base_offset=next_base,
                is_tail=is_last and i == len(cuts) - 1,
            )


def guided_cuts(
    sizes: Sequence[int], cores: int, max_bytes: int, min_bytes: int
) -> list[tuple[int, int]]:
    """Consecutive items of ``sizes`` bytes cut into tasks ``[lo, hi)`` that run out small
    (guided self-scheduling): a task takes ``max_bytes`` while more than ``cores`` tasks of
    that size are left, then a core's share of the rest (``left / cores``), and so on down to
    ``min_bytes``; a run of less than ``min_bytes`` a core goes down to its share a core
    instead, so every core still gets some; a rest under half of the smallest task joins the
    last task. Why tasks that run out small: :func:`pipelines.ingest.schedule_tasks`; the
    tier's tasks are cut the same way (:func:`pipelines.sources.tier.tier_tasks`)."""
    cores = max(1, cores)
    left = sum(sizes)
    smallest = min(min_bytes, -(-left // cores))
    target = max(smallest, min(max_bytes, -(-left // cores)))
    cuts: list[tuple[int, int]] = []
    lo, size = 0, 0
    for i, n in enumerate(sizes):
        if i > lo and size + n > target and left - size > smallest // 2:
            cuts.append((lo, i))
            left -= size
            lo, size = i, 0
            target = max(smallest, min(max_bytes, -(-left // cores)))
        size += n
    if lo < len(sizes):
        cuts.append((lo, len(sizes)))
    return cuts
