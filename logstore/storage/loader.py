"""Opening a partition directory: clean-up of temporary files, loading and recovery.

Kafka's ``LogLoader``, in numbered steps:

1. Temporary files. ``*.deleted`` files (segments waiting for ``file.delete.delay.ms`` when
   the process stopped) are deleted. ``*.cleaned`` files (cleaner output that never reached the
   swap step) are deleted, and the smallest base offset among them is noted. ``*.swap`` files
   whose base offset is >= that smallest ``.cleaned`` offset belong to the same unfinished
   cleaning pass and are deleted too; the other ``.swap`` files are complete and are swapped
   in at step 4. Index files without their ``.log`` are deleted.
2. Segments. Every ``<base offset>.log`` is opened with its indexes. A segment whose
   ``.index``/``.timeindex`` is missing or fails its sanity check is recovered on the spot
   (index rebuilt from the batches; a corrupt tail truncated).
3. Recovery. Unless the log directory was shut down cleanly, every segment from the one holding
   the recovery point onwards is recovered (:meth:`LogSegment.recover`: each batch validated —
   whole, size >= 61, magic 2, CRC, offsets increasing and within the segment — and the indexes
   rebuilt). At the first segment that had to be truncated, every later segment is deleted: the
   log ends at the last whole valid batch.
4. Swaps. Each valid ``.swap`` segment is recovered, the segments it replaces (those whose
   offsets overlap its range: from its base offset to its next offset or, when the cleaner's
   ``cleaner-manifest.json`` names the group, to the end of the range the group replaced) are
   deleted, and its files are renamed to their final names. The manifest is then deleted
   (see :mod:`logstore.storage.swap`).
5. An empty directory gets one empty segment at the log start offset. The log end offset is
   the next offset of the last segment (never below its base offset: a segment may be empty).
   The active (last) segment's indexes are preallocated for appends.

A full disk. Loading needs no free space of its own: segments are opened without preallocating
missing index files, and recovery writes rebuilt indexes with ``write(2)`` in the space the old
files held (:meth:`LogSegment.recover`). Two things can still lack room; neither stops the load
nor loses a byte of the ``.log``: a rebuilt index that cannot be written is removed (the
segment is served by scanning from its start; the next start rebuilds it), and the active
segment's indexes may not be preallocatable. Either way :attr:`LoadResult.offline_reason` says
why, and the log opens offline for appends (readable; see :class:`~logstore.storage.log.Log`).

Nothing here is thread-safe: it runs before the log is shared. Crash-safe by construction: every
step can be interrupted and redone, since each one only deletes files that a later step would
not need or renames complete files into place.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from logstore.errors import CorruptIndexError, LoglakeError, StorageError
from logstore.storage.cleaner_manifest import manifest_end_offset, remove_manifest
from logstore.storage.config import LogConfig
from logstore.storage.files import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SWAP_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    offset_from_file_name,
    segment_path,
)
from logstore.storage.segment import IndexRebuildError, LogSegment

__all__ = ["LoadResult", "load_segments"]

_log = logging.getLogger(__name__)
_INDEX_SUFFIXES = (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)


@dataclass
class LoadResult:
    """What :func:`load_segments` found and did."""

    segments: list[LogSegment]
    next_offset: int
    recovery_point: int
    log_start_offset: int
    truncated_bytes: int = 0
    recovered_segments: list[int] = field(default_factory=list)
    deleted_files: list[str] = field(default_factory=list)
    swapped_segments: list[int] = field(default_factory=list)
    # why the log cannot take appends yet (a full disk while loading); None: it can
    offline_reason: str | None = None


def _open_segment(dir: Path, base_offset: int, config: LogConfig, suffix: str = "") -> LogSegment:
    # No preallocation: a missing index is created empty and rebuilt by recovery, and only
    # the active segment gets room for appends (step 5), where a full disk is not fatal.
    return LogSegment.open(
        dir,
        base_offset,
        index_interval_bytes=config.index_interval_bytes,
        max_index_size=config.segment_index_bytes,
        file_suffix=suffix,
        preallocate=False,
    )


def _recover(seg: LogSegment, result: LoadResult) -> int:
    """``seg.recover()``; an index that cannot be written for lack of space takes the log
    offline instead of failing the load (the ``.log`` itself was recovered)."""
    try:
        return seg.recover(max_message_size=None)
    except IndexRebuildError as exc:
        _log.error("%s; lookups in this segment scan from its start", exc)
        if result.offline_reason is None:
            result.offline_reason = str(exc)
        return exc.truncated


def _unlink(path: Path, result: LoadResult) -> None:
    try:
        path.unlink()
        result.deleted_files.append(path.name)
    except FileNotFoundError:
        pass


def load_segments(
    dir: str | os.PathLike[str],
    config: LogConfig,
    *,
    recovery_point: int = 0,
    log_start_offset: int = 0,
    clean_shutdown: bool = False,
) -> LoadResult:
    """Clean up, load and (if needed) recover the segments of one partition directory."""
    root = Path(dir)
    root.mkdir(parents=True, exist_ok=True)
    result = LoadResult([], 0, recovery_point, log_start_offset)

    # 1. temporary files
    names = sorted(os.listdir(root))
    min_cleaned: int | None = None
    swap_logs: list[int] = []
    for name in names:
        parsed = offset_from_file_name(name)
        if parsed is None:
            continue
        base, suffix = parsed
        if suffix.endswith(DELETED_SUFFIX):
            _unlink(root / name, result)
        elif suffix.endswith(CLEANED_SUFFIX):
            min_cleaned = base if min_cleaned is None else min(min_cleaned, base)
            _unlink(root / name, result)
        elif suffix == LOG_SUFFIX + SWAP_SUFFIX:
            swap_logs.append(base)
    valid_swaps: list[int] = []
    for base in swap_logs:
        if min_cleaned is not None and base >= min_cleaned:
            for suffix in (LOG_SUFFIX, *_INDEX_SUFFIXES):
                _unlink(segment_path(root, base, suffix + SWAP_SUFFIX), result)
        else:
            valid_swaps.append(base)
    log_bases: list[int] = []
    for name in sorted(os.listdir(root)):
        parsed = offset_from_file_name(name)
        if parsed is None:
            continue
        base, suffix = parsed
        if suffix == LOG_SUFFIX:
            log_bases.append(base)
        elif (suffix in _INDEX_SUFFIXES and not segment_path(root, base, LOG_SUFFIX).exists()) or (
            suffix.endswith(SWAP_SUFFIX)
            and suffix != LOG_SUFFIX + SWAP_SUFFIX
            and base not in valid_swaps
        ):
            _unlink(root / name, result)
    log_bases.sort()

    # 2. segments, recovering those whose indexes are missing or corrupt
    segments: list[LogSegment] = []
    recovered: set[int] = set()
    truncated_early: dict[int, int] = {}
    try:
        for base in log_bases:
            seg = _open_segment(root, base, config)
            segments.append(seg)
            try:
                seg.sanity_check()
            except CorruptIndexError as exc:
                _log.warning("rebuilding indexes of %s: %s", seg.path, exc.message)
                truncated_early[base] = _recover(seg, result)
                result.truncated_bytes += truncated_early[base]
                recovered.add(base)

        # 3. recovery from the recovery point after an unclean shutdown
        if not clean_shutdown:
            start = 0
            for i, seg in enumerate(segments):
                if seg.base_offset <= recovery_point:
                    start = i
            i = start
            while i < len(segments):
                seg = segments[i]
                if seg.base_offset in recovered:
                    # recovered at step 2: a truncation there still ends the log here
                    truncated = truncated_early.get(seg.base_offset, 0)
                else:
                    truncated = _recover(seg, result)
                    recovered.add(seg.base_offset)
                    result.truncated_bytes += truncated
                    if truncated:
                        _log.warning(
                            "truncated %d bytes of %s at position %d: %s",
                            truncated,
                            seg.path,
                            seg.size,
                            seg.recovery_stop_reason,
                        )
                if truncated > 0:
                    for later in segments[i + 1 :]:
                        _log.warning(
                            "deleting %s after a corrupt batch in %s", later.path, seg.path
                        )
                        later.delete()
                        result.deleted_files.append(later.path.name)
                    del segments[i + 1 :]
                    break
                i += 1

        # 4. finish swaps
        for base in sorted(valid_swaps):
            swap = _open_segment(root, base, config, SWAP_SUFFIX)
            _recover(swap, result)
            # a cleaned segment may end before the range it replaces: the cleaner's manifest
            # says where that range ended (logstore.storage.swap)
            end = max(swap.read_next_offset(), manifest_end_offset(root, base) or 0)
            keep: list[LogSegment] = []
            for seg in segments:
                seg_end = seg.read_next_offset()
                overlaps = seg.base_offset < end and seg_end > base
                if overlaps or seg.base_offset == base:
                    seg.delete()
                    result.deleted_files.append(seg.path.name)
                else:
                    keep.append(seg)
            swap.change_file_suffixes(SWAP_SUFFIX, "")
            keep.append(swap)
            keep.sort(key=lambda s: s.base_offset)
            segments = keep
            result.swapped_segments.append(base)
            recovered.add(base)

        # a cleaner manifest is finished (swaps above) or stale (its .cleaned files are gone)
        remove_manifest(root)

        # 5. an empty log gets its first segment
        if not segments:
            segments.append(_open_segment(root, log_start_offset, config))
        active = segments[-1]
        try:
            active.resize_indexes(config.segment_index_bytes)
            active.prepare_active(
                roll_jitter_ms=config.random_segment_jitter(),
                reserve_bytes=config.segment_bytes if config.preallocate else 0,
            )
        except StorageError as exc:
            if result.offline_reason is None:
                result.offline_reason = f"cannot preallocate the active segment's indexes: {exc}"
        next_offset = max(active.read_next_offset(), active.base_offset)
    except (LoglakeError, OSError):
        for seg in segments:
            seg.close_handlers()
        raise

    result.segments = segments
    result.next_offset = next_offset
    result.recovered_segments = sorted(recovered)
    result.log_start_offset = min(max(log_start_offset, segments[0].base_offset), next_offset)
    if clean_shutdown:
        result.recovery_point = next_offset
    else:
        result.recovery_point = max(min(recovery_point, next_offset), result.log_start_offset)
    return result
