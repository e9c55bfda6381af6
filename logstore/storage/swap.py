"""Hand-over of cleaned segments to the log: the manifest, its checks, Kafka's swap protocol.

The cleaning job (a Spark executor, another process) never touches the live log. It writes,
per partition directory:

1. ``<base>.log.cleaned`` + ``<base>.index.cleaned`` + ``<base>.timeindex.cleaned`` for each
   segment group (:func:`logstore.storage.cleaner.rewrite_group`, fsynced);
2. then ``cleaner-manifest.json`` (:mod:`logstore.storage.cleaner_manifest`; write-temp, fsync,
   rename, fsync dir): per group its base
   offset, the ``.cleaned`` size, and the replaced segments as the job read them
   (:class:`~logstore.storage.cleaner.SegmentRef`: base offset, size, position and CRC of the
   last batch, next offset, mtime); plus the offset the ``cleaner-offset-checkpoint`` gets.

Whoever owns the log dir applies it (:func:`apply_manifest`):

- a running broker: the log manager's ``cleaner-swaps`` scheduler task polls each log's
  directory for the manifest (one ``stat`` per log and second) and applies it under the log's
  lock (:meth:`~logstore.storage.log.Log.replace_segments`), while produce and fetch go on;
- no broker (the job could take the log dir's ``.lock``): the job itself, under that lock
  (:func:`apply_offline`).

Checks before a group is swapped in (:func:`validate_group`; a failure rejects the manifest,
deletes its ``.cleaned`` files and changes nothing): the replaced segments are consecutive
live segments, not the active one, each with the size and last batch (position, CRC) the job
read (retention, truncation or appends since make the job's output stale); the ``.cleaned``
file has the announced size and only whole batches with valid CRC-32C and magic 2, whose
``(base offset, last offset, producer id, epoch, base sequence)`` are those of batches of the
replaced segments, in order (so the offsets are a subsequence of the originals: records are
only ever removed from a batch that keeps its offsets), and nothing at or past the replaced
range's end.

The swap of one group, Kafka's ``LocalLog.replaceSegments`` (step names of
:func:`logstore.failpoints.failpoint` in brackets, each ``cleaner.<name>``; crash tests SIGKILL
the process at each):

a. rename the three ``.cleaned`` files to ``.swap``, fsync the directory [``before_swap``,
   ``swapped``]. From the moment no ``.cleaned`` is left the swap is committed;
b. rename the replaced segments to ``.deleted`` and, in memory, put the new segment in their
   place (one list assignment: readers see the old list or the new one) [``retiring`` after
   the first rename (offline path), ``retired``]. Open
   descriptors of the old files stay valid, so fetches in flight finish; the files go after
   ``file.delete.delay.ms``;
c. rename ``.swap`` to the live names, fsync the directory [``live_partial`` after the
   ``.log``'s rename, ``live``].

After every group: ``cleaner-offset-checkpoint`` updated [``checkpointed``], then the manifest
deleted.

Crash at any step, recovery on load (:mod:`logstore.storage.loader`, Kafka's rules; by the
broker's next start, or with no broker by the next job run,
:func:`pipelines.compaction.log.recover_pending`): ``.cleaned`` files are deleted and so is
every ``.swap`` at or above the smallest ``.cleaned`` base offset (a swap not yet committed);
``.deleted`` files are deleted; a committed ``.swap`` replaces every segment overlapping
``[its base, end)``, where ``end`` is the replaced range's end from the manifest (a cleaned segment
may end before its group did: without the manifest a replaced segment whose records all went
would survive next to it) or else the swap's own next offset; then the manifest is deleted. A
job killed before its manifest leaves only ``.cleaned`` files, removed by the next run of the
job or the next load. Kafka's failure modes, none losing data: a rejected or discarded pass is
simply redone.

Thread-safety: :func:`apply_manifest` holds the log's lock; checkpoint updates in one process
are serialised by a module lock.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from logstore.errors import LoglakeError
from logstore.failpoints import armed, failpoint
from logstore.protocol.batch import validate_batch
from logstore.storage.cleaner import SegmentRef, scan_segment, update_cleaner_checkpoint
from logstore.storage.cleaner_manifest import (
    CleanerManifest,
    ManifestGroup,
    read_manifest,
    remove_manifest,
)
from logstore.storage.config import LogConfig
from logstore.storage.files import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SWAP_SUFFIX,
    TIME_INDEX_SUFFIX,
    fsync_dir,
    offset_from_file_name,
    parse_partition_dir,
    segment_path,
)
from logstore.storage.segment import LogSegment

if TYPE_CHECKING:
    from logstore.storage.log import Log

__all__ = [
    "SwapRejectedError",
    "apply_manifest",
    "apply_offline",
    "discard_cleaned",
    "swap_group",
    "validate_cleaned",
    "validate_group",
]

_log = logging.getLogger(__name__)
_checkpoint_lock = threading.Lock()


class SwapRejectedError(LoglakeError):
    """A cleaner manifest failed its checks; nothing was swapped for that group."""


def discard_cleaned(dir: str | os.PathLike[str]) -> list[str]:
    """Delete every ``.cleaned`` file of a partition directory; their names."""
    root = Path(dir)
    gone = []
    for name in sorted(os.listdir(root)):
        parsed = offset_from_file_name(name)
        if parsed is not None and parsed[1].endswith(CLEANED_SUFFIX):
            (root / name).unlink(missing_ok=True)
            gone.append(name)
    return gone


def _batch_ids(dir: Path, ref: SegmentRef) -> list[tuple[int, int, int, int, int]]:
    _, headers = scan_segment(segment_path(dir, ref.base_offset, LOG_SUFFIX))
    return [
        (h.base_offset, h.last_offset, h.producer_id, h.producer_epoch, h.base_sequence)
        for h in headers
    ]


def validate_group(
    dir: str | os.PathLike[str],
    group: ManifestGroup,
    current: Sequence[LogSegment],
    *,
    active_base_offset: int,
    check_cleaned: bool = True,
) -> list[LogSegment]:
    """The checks of the module docstring; the live segments the group replaces.

    ``current``: the live segments (at least the replaced ones), in order. The identity of
    the replaced segments is checked here (cheap: under the log's lock); the ``.cleaned``
    file too (:func:`validate_cleaned`) unless ``check_cleaned`` is false.
    Raises :class:`SwapRejectedError` naming the first failed check.
    """
    root = Path(dir)
    by_base = {s.base_offset: i for i, s in enumerate(current)}
    first = by_base.get(group.base_offset)
    if first is None:
        raise SwapRejectedError(f"segment {group.base_offset} is gone", path=str(root))
    replaced = list(current[first : first + len(group.replaced)])
    if len(replaced) != len(group.replaced):
        raise SwapRejectedError("fewer live segments than the group replaces", path=str(root))
    for seg, ref in zip(replaced, group.replaced, strict=True):
        if seg.base_offset != ref.base_offset:
            raise SwapRejectedError(
                f"segments changed: {seg.base_offset} where {ref.base_offset} was",
                path=str(root),
            )
        if seg.base_offset >= active_base_offset:
            raise SwapRejectedError(
                f"segment {seg.base_offset} is the active segment", path=str(root)
            )
        if seg.size != ref.size:
            raise SwapRejectedError(
                f"segment {seg.base_offset} is {seg.size} bytes, the job read {ref.size}",
                path=str(seg.path),
            )
        if ref.last_batch_position >= 0:
            head = os.pread(seg.fileno, 21, ref.last_batch_position)
            crc = int.from_bytes(head[17:21], "big") if len(head) == 21 else -1
            if crc != ref.last_batch_crc:
                raise SwapRejectedError(
                    f"segment {seg.base_offset}: last batch changed since the job read it",
                    path=str(seg.path),
                )
    if check_cleaned:
        validate_cleaned(root, group)
    return replaced


def validate_cleaned(dir: str | os.PathLike[str], group: ManifestGroup) -> None:
    """The ``.cleaned`` segment's checks (size, CRCs, batches a subsequence of the replaced
    segments', nothing past the range): the costly part, which needs no lock (only the job
    writes ``.cleaned`` files, and it finished before writing the manifest; a replaced
    segment changed meanwhile fails the identity check made under the lock)."""
    root = Path(dir)
    cleaned = segment_path(root, group.base_offset, LOG_SUFFIX + CLEANED_SUFFIX)
    try:
        data = cleaned.read_bytes()
    except FileNotFoundError:
        raise SwapRejectedError("cleaned segment missing", path=str(cleaned)) from None
    if len(data) != group.size:
        raise SwapRejectedError(
            f"cleaned segment is {len(data)} bytes, the manifest says {group.size}",
            path=str(cleaned),
        )
    try:
        originals = [bid for ref in group.replaced for bid in _batch_ids(root, ref)]
    except (OSError, LoglakeError) as exc:
        raise SwapRejectedError(f"replaced segments unreadable: {exc}", path=str(root)) from None
    j = 0
    pos = 0
    while pos < len(data):
        try:
            h = validate_batch(data, pos)
        except LoglakeError as exc:
            raise SwapRejectedError(f"bad batch: {exc.message}", path=str(cleaned)) from None
        bid = (h.base_offset, h.last_offset, h.producer_id, h.producer_epoch, h.base_sequence)
        while j < len(originals) and originals[j] != bid:
            j += 1
        if j == len(originals):
            raise SwapRejectedError(
                f"batch at position {pos} (offsets {h.base_offset}..{h.last_offset}) is not "
                "one of the replaced segments' batches, in order",
                path=str(cleaned),
            )
        if h.last_offset >= group.end_offset:
            raise SwapRejectedError(
                f"offset {h.last_offset} past the cleaned range's end {group.end_offset}",
                path=str(cleaned),
            )
        j += 1
        pos += h.size


def swap_group(
    dir: str | os.PathLike[str],
    group: ManifestGroup,
    config: LogConfig,
    retire: Callable[[LogSegment], None],
) -> LogSegment:
    """Steps a-c of the module docstring for one validated group. ``retire(new)`` does step b
    (renames the replaced segments ``.deleted`` and puts ``new`` in their place)."""
    root = Path(dir)
    failpoint("cleaner.before_swap")
    new = LogSegment.open(
        root,
        group.base_offset,
        index_interval_bytes=config.index_interval_bytes,
        max_index_size=config.segment_index_bytes,
        file_suffix=CLEANED_SUFFIX,
        preallocate=False,
    )
    try:
        new.change_file_suffixes(CLEANED_SUFFIX, SWAP_SUFFIX)
        fsync_dir(root)
        failpoint("cleaner.swapped")
        retire(new)
        failpoint("cleaner.retired")
        if armed("cleaner.live_partial"):
            # tests: die after the first of step c's three renames (the .log's, which
            # change_file_suffixes does first), the indexes still .swap
            live = segment_path(root, group.base_offset, LOG_SUFFIX)
            os.replace(segment_path(root, group.base_offset, LOG_SUFFIX + SWAP_SUFFIX), live)
            fsync_dir(root)
            failpoint("cleaner.live_partial")
        new.change_file_suffixes(SWAP_SUFFIX, "")
        fsync_dir(root)
        failpoint("cleaner.live")
    except BaseException:
        new.close_handlers()
        raise
    return new


def _finish(root: Path, manifest: CleanerManifest) -> None:
    parsed = parse_partition_dir(root.name)
    if parsed is None:  # pragma: no cover - callers pass partition directories
        raise LoglakeError("not a partition directory", path=str(root))
    with _checkpoint_lock:
        update_cleaner_checkpoint(root.parent, parsed[0], parsed[1], manifest.checkpoint_offset)
    failpoint("cleaner.checkpointed")
    remove_manifest(root)


def _check_target(root: Path, manifest: CleanerManifest) -> None:
    if parse_partition_dir(root.name) != (manifest.topic, manifest.partition):
        raise SwapRejectedError(
            f"manifest for {manifest.topic}-{manifest.partition} in another directory",
            path=str(root),
        )


def _reject(root: Path, exc: Exception) -> bool:
    """Drop a pending hand-over that cannot be applied (its ``.cleaned`` files and manifest):
    the log stays as it is and the next job run cleans it again."""
    _log.warning("%s: cleaned segments rejected: %s", root.name, exc)
    discard_cleaned(root)
    remove_manifest(root)
    return False


def _pending_manifest(root: Path) -> CleanerManifest | bool | None:
    """The manifest waiting in ``root``, else what applying it returns: None when there is
    none, False when it cannot be read (rejected: :func:`_reject`)."""
    try:
        manifest = read_manifest(root)
    except LoglakeError as exc:
        return _reject(root, exc)
    return manifest


def apply_manifest(log: Log) -> bool | None:
    """Apply the log's pending manifest (the broker's path): True swapped, False rejected,
    None when there is none. The ``.cleaned`` files are checked first without the log's
    lock; the replaced segments' identity and the swap itself happen under it."""
    root = log.dir
    manifest = _pending_manifest(root)
    if not isinstance(manifest, CleanerManifest):
        return manifest
    try:
        # the costly checks before taking the lock: appends are not held up by them
        _check_target(root, manifest)
        for group in manifest.groups:
            validate_cleaned(root, group)
    except SwapRejectedError as exc:
        return _reject(root, exc)
    with log.lock:
        if log.closed:
            return None
        try:
            for group in manifest.groups:
                segs = log.segments
                replaced = validate_group(
                    root,
                    group,
                    segs,
                    active_base_offset=segs[-1].base_offset,
                    check_cleaned=False,
                )

                def retire(new: LogSegment, old: list[LogSegment] = replaced) -> None:
                    log.replace_segments(new, old)

                swap_group(root, group, log.config, retire)
        except SwapRejectedError as exc:
            return _reject(root, exc)
        _finish(root, manifest)
        _log.info(
            "%s: swapped in %d cleaned segment group(s) up to offset %d",
            root.name,
            len(manifest.groups),
            manifest.checkpoint_offset,
        )
        return True


def apply_offline(dir: str | os.PathLike[str], config: LogConfig) -> bool | None:
    """Apply a partition's pending manifest with no broker running. The caller holds the log
    dir's ``.lock`` (:class:`~logstore.storage.dirlock.DirLock`). Same result as
    :func:`apply_manifest`; replaced segments are deleted at once."""
    root = Path(dir)
    manifest = _pending_manifest(root)
    if not isinstance(manifest, CleanerManifest):
        return manifest
    try:
        _check_target(root, manifest)
        for group in manifest.groups:
            bases = sorted(
                p[0]
                for p in map(offset_from_file_name, os.listdir(root))
                if p is not None and p[1] == LOG_SUFFIX
            )
            segs = [
                LogSegment.open(
                    root,
                    ref.base_offset,
                    index_interval_bytes=config.index_interval_bytes,
                    max_index_size=config.segment_index_bytes,
                    preallocate=False,
                )
                for ref in group.replaced
                if ref.base_offset in bases
            ]
            try:
                replaced = validate_group(root, group, segs, active_base_offset=bases[-1])

                def retire(new: LogSegment, old: list[LogSegment] = replaced) -> None:
                    for seg in old:
                        seg.change_file_suffixes("", DELETED_SUFFIX)
                        failpoint("cleaner.retiring")
                    fsync_dir(root)
                    for seg in old:
                        seg.delete()

                swap_group(root, group, config, retire).close_handlers()
            finally:
                for seg in segs:
                    seg.close_handlers()
    except SwapRejectedError as exc:
        return _reject(root, exc)
    _finish(root, manifest)
    return True


# the suffixes a group's files go through, for tests and tools
GROUP_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX)
