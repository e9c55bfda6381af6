"""Output 2 of compaction: the broker's log, cleaned by Spark (Kafka's LogCleaner semantics).

Per compacted partition, one Spark task (on an executor that sees the log dirs):

1. plans the pass from the segment files (:func:`logstore.storage.cleaner.plan_cleaning`:
   cleanable range, dirty ratio, ``max.compaction.lag.ms``, segment groups); a partition that
   is not due is left alone unless ``force``;
2. decides the winners over the whole cleanable range (:func:`winning_offsets`: for the
   offset strategy, the offsets, keys and null-value flags of the records only, walked in
   place in the segment's bytes (:mod:`pipelines.compaction._keymap`; compressed batches
   through the vectorised decoder), then a compiled key map of each key's last record
   (:func:`pipelines.compaction._select.last_per_key`: hash, radix split, small in-cache
   tables, keys compared exactly); else the vectorised decoder, then
   :func:`pipelines.compaction.plan.winner_indices`, the reference model's rule over Arrow
   that the Delta table output uses too; no Python object per record);
3. rewrites each segment group into ``.cleaned`` segments
   (:func:`logstore.storage.cleaner.rewrite_group`: whole batches, original offsets, producer
   fields, codec, timestamps and headers, fresh CRC and indexes, KIP-534 tombstone horizon;
   batches of aborted transactions and markers no longer needed removed, as Kafka's cleaner
   does, :mod:`logstore.storage.cleaner_txn`; records of aborted transactions never win);
4. writes the partition's ``cleaner-manifest.json`` (:mod:`logstore.storage.swap`).

Then, on the driver, the hand-over: if the log dir's ``.lock`` is free (no broker), the job
takes it before the tasks start, holds it for the run and swaps each partition's segments in
itself as soon as that partition's manifest is written, while other tasks still run
(:class:`_OfflineSwapper`); otherwise the running broker does it within about a second (its
``cleaner-swaps`` task) and the job waits for each manifest to go and reads the
``cleaner-offset-checkpoint`` to learn whether it was accepted (:func:`hand_over`).

What this relies on from the compaction helper's modules (``model.py`` and ``plan.py`` are
their files, verbatim): ``plan.versions(table, strategy)`` and ``plan.winner_indices(table,
version) -> row indices`` over a table with ``partition``, ``key``, ``offset``,
``timestamp`` (int64 ms), ``headers`` (the decoder's list<struct<key, value>>): one winner per
(partition, key), keyless rows excluded; ``model.latest`` for the same rule per record.

Crash behaviour: see :mod:`logstore.storage.swap`; a job killed anywhere leaves the log as it
was or swapped, never in between after the broker's next load or, with no broker, the next
job run (:func:`recover_pending`, the loader's rules under ``.lock``), and a re-run redoes the
pass. Crash tests: ``LOGLAKE_FAILPOINT=cleaner.rewritten`` kills the executor after the
``.cleaned`` files, before the manifest; the swap's steps are ``cleaner.*`` too.
Executors must see the broker's log dirs at the same paths (one host, or a shared mount).
"""

from __future__ import annotations

import os
import threading
import time
from array import array
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from logstore.errors import LogDirLockedError, LoglakeError
from logstore.failpoints import failpoint
from logstore.storage.checkpoints import read_offset_checkpoint
from logstore.storage.cleaner import (
    CleanerSettings,
    SegmentRef,
    plan_cleaning,
    read_cleaner_checkpoint,
    rewrite_group,
)
from logstore.storage.cleaner_manifest import (
    MANIFEST_FILE,
    CleanerManifest,
    ManifestGroup,
    write_manifest,
)
from logstore.storage.cleaner_txn import TransactionFilter
from logstore.storage.config import LogConfig
from logstore.storage.dirlock import DirLock
from logstore.storage.files import (
    CLEANED_SUFFIX,
    LOG_START_OFFSET_CHECKPOINT,
    LOG_SUFFIX,
    RECOVERY_POINT_CHECKPOINT,
    SWAP_SUFFIX,
    parse_partition_dir,
    segment_path,
)
from logstore.storage.log import Log
from logstore.storage.swap import apply_offline
from logstore.storage.topic_config import is_compacted, read_topic_config, read_topic_configs
from pipelines.compaction._keymap import record_keys
from pipelines.compaction._select import last_per_key, last_per_key_into, make_selector
from pipelines.compaction.due import CleanerDefaults, topic_settings
from pipelines.compaction.model import DEFAULT_STRATEGY, Rec, Strategy, latest, parse_strategy
from pipelines.compaction.plan import versions, winner_indices
from pipelines.decode import BatchScan, decode_records, scan_batches, verify_batches
from pipelines.decode._kernels import ERROR_REASONS
from pipelines.decode.batches import ATTR_CODEC_MASK, ATTR_CONTROL, HEADER_SIZE
from pipelines.logdir import as_partition_dir, partition_dirs
from pipelines.worker import start_task, without_huge_pages

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "LogCleanResult",
    "clean_partition",
    "compacted_partitions",
    "hand_over",
    "recover_pending",
    "run_log_compaction",
    "winners",
    "winning_offsets",
]


_SWAP_THREADS = 4  # partitions swapped at once when the job swaps under the .lock


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def winners(records: Iterable[Rec], strategy: Strategy = DEFAULT_STRATEGY) -> set[int]:
    """The offsets of the records that win their ``(partition, key)`` (tombstones included),
    by the reference model itself (one Python object per record: tests and tools)."""
    return {rec.offset for rec in latest(records, strategy).values()}


def _outside(offsets: np.ndarray, ranges: Sequence[tuple[int, int]]) -> np.ndarray:
    """Mask: True where an offset is in none of the sorted, disjoint ``[first, last]``."""
    if not ranges:
        return np.ones(len(offsets), bool)
    firsts = np.fromiter((r[0] for r in ranges), np.int64, len(ranges))
    lasts = np.fromiter((r[1] for r in ranges), np.int64, len(ranges))
    i = np.searchsorted(firsts, offsets, side="right") - 1
    inside = (i >= 0) & (offsets <= lasts[np.clip(i, 0, None)])
    return ~inside


def _key_buffers(keys: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A binary column as ``(int64 offsets, data, validity)`` numpy arrays (one copy of the
    offsets and the key bytes; no Python object per row)."""
    if isinstance(keys, pa.ChunkedArray):
        chunks = [c.cast(pa.large_binary()) for c in keys.chunks]
        arr = pa.concat_arrays(chunks) if chunks else pa.array([], pa.large_binary())
    else:
        arr = keys.cast(pa.large_binary())
    n = len(arr)
    _, off_buf, data_buf = arr.buffers()
    offsets = (
        np.frombuffer(off_buf, np.int64, n + 1, arr.offset * 8) if n else np.zeros(1, np.int64)
    )
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False))
    return offsets, data, valid


def _last_per_key(table: pa.Table, eligible: np.ndarray | None = None) -> np.ndarray:
    """The offset strategy's winners (model rule 3: the greatest offset of each key; keyless
    rows excluded) for rows in increasing offset order, one partition: each key's last row,
    as sorted row indices. One compiled pass with a hash map
    (:func:`pipelines.compaction._select.last_per_key`), instead of the general rule's sort by
    ``(key, version, offset)`` (:func:`pipelines.compaction.plan.winner_indices`).
    ``eligible``: rows that may win at all (default: every row)."""
    offsets, data, valid = _key_buffers(table.column("key"))
    if eligible is not None:
        valid = valid & eligible
    return np.flatnonzero(last_per_key(offsets[:-1], offsets[1:], data, valid))


def _pooled(count: int, dtype: type[np.generic] | np.dtype) -> np.ndarray:  # type: ignore[type-arg]
    """An uninitialised array in Arrow's memory pool, whose pages are reused from call to
    call (a fresh numpy allocation of this size costs a page fault per 4 KiB written; see
    :func:`pipelines.decode.records._empty`)."""
    dt = np.dtype(dtype)
    return np.frombuffer(pa.allocate_buffer(count * dt.itemsize), dt)


class _KeyRows:
    """Per record of the cleanable range, in offset order: offset, key (Arrow
    ``large_binary`` layout: int64 offsets + bytes), key-null and value-null flags. What the
    offset strategy's key map needs and nothing else; grown segment by segment."""

    def __init__(self, rows: int = 0, key_bytes: int = 0) -> None:
        """Room for ``rows`` records and ``key_bytes`` of keys to begin with."""
        self.n = 0
        self.offsets = _pooled(rows, np.int64)
        self.k_null = _pooled(rows, np.bool_)
        self.v_null = _pooled(rows, np.bool_)
        self.k_off = _pooled(rows + 1, np.int64)
        self.k_off[0] = 0
        self.k_data = _pooled(key_bytes, np.uint8)

    def _reserve(self, rows: int, key_bytes: int) -> None:
        need = self.n + rows
        if need > self.offsets.shape[0]:
            cap = max(need, 2 * self.offsets.shape[0])
            for name in ("offsets", "k_null", "v_null"):
                old = getattr(self, name)
                new = _pooled(cap, old.dtype)
                new[: self.n] = old[: self.n]
                setattr(self, name, new)
            k_off = _pooled(cap + 1, np.int64)
            k_off[: self.n + 1] = self.k_off[: self.n + 1]
            self.k_off = k_off
        used = int(self.k_off[self.n])
        if used + key_bytes > self.k_data.shape[0]:
            k_data = _pooled(max(used + key_bytes, 2 * self.k_data.shape[0]), np.uint8)
            k_data[:used] = self.k_data[:used]
            self.k_data = k_data

    def add_in_place(self, data: np.ndarray, scan: BatchScan, idx: np.ndarray) -> int:
        """The records of the uncompressed batches ``idx`` of ``scan`` (frames in ``data``),
        walked where they lie (:func:`pipelines.compaction._keymap.record_keys`). The
        status of the first batch that failed, else 0 (then nothing was added)."""
        starts = scan.position[idx] + HEADER_SIZE
        ends = scan.position[idx] + scan.size[idx]
        counts = scan.records_count[idx]
        self._reserve(int(counts.clip(0).sum(dtype=np.int64)), int((ends - starts).sum()))
        n, status = record_keys(
            data, starts, ends, counts, scan.base_offset[idx], self.n,
            self.offsets, self.k_off, self.k_data, self.k_null, self.v_null,
        )  # fmt: skip
        bad = np.flatnonzero(status)
        if bad.size:
            return int(status[bad[0]])
        self.n = int(n)
        return 0

    def add_decoded(self, rb: pa.RecordBatch) -> None:
        """Rows the full decoder produced (compressed batches)."""
        m = rb.num_rows
        keys = rb.column("key").cast(pa.large_binary())
        _, off_buf, data_buf = keys.buffers()
        k_off = np.frombuffer(off_buf, np.int64, m + 1, keys.offset * 8)
        first, last = int(k_off[0]), int(k_off[m])
        self._reserve(m, last - first)
        base = int(self.k_off[self.n])
        if last > first:
            self.k_data[base : base + last - first] = np.frombuffer(data_buf, np.uint8)[first:last]
        self.k_off[self.n + 1 : self.n + m + 1] = k_off[1:] - first + base
        self.offsets[self.n : self.n + m] = rb.column("offset").to_numpy()
        self.k_null[self.n : self.n + m] = keys.is_null().to_numpy(zero_copy_only=False)
        self.v_null[self.n : self.n + m] = (
            rb.column("value").is_null().to_numpy(zero_copy_only=False)
        )
        self.n += m


def _add_segment(rows: _KeyRows, data: np.ndarray, scan: BatchScan, path: Path) -> None:
    """The key rows of one verified segment: runs of uncompressed batches walked in place,
    runs of compressed ones through the full decoder (its decompression, its checks)."""
    idx = np.flatnonzero((scan.magic == 2) & ((scan.attributes & ATTR_CONTROL) == 0))
    if idx.size == 0:
        return
    packed = (scan.attributes[idx] & ATTR_CODEC_MASK) != 0
    cuts = np.flatnonzero(packed[1:] != packed[:-1]) + 1
    for run in np.split(np.arange(idx.size), cuts):
        if not packed[run[0]]:
            status = rows.add_in_place(data, scan, idx[run])
            if status:
                raise LoglakeError(f"damaged batch: {ERROR_REASONS[status]}", path=str(path))
            continue
        select = np.zeros(len(scan), np.bool_)
        select[idx[run]] = True
        for chunk in decode_records(data, scan, select=select):
            if chunk.errors:
                raise LoglakeError(f"damaged batch: {chunk.errors[0].reason}", path=str(path))
            rows.add_decoded(chunk.records)


def _read_segment(path: Path, size: int, into: np.ndarray | None = None) -> np.ndarray:
    """The first ``size`` bytes of a segment (it may have grown since the plan, not shrunk),
    read into ``into[:size]`` when given (reused from segment to segment), else a new array.
    Read, not mapped: a file truncated under a mapping kills the process with SIGBUS."""
    out = _pooled(size, np.uint8) if into is None else into[:size]
    got = 0
    with open(path, "rb") as f:
        while got < size:  # one read returns at most ~2 GiB
            n = os.preadv(f.fileno(), [out[got:]], got)
            if n <= 0:
                break
            got += n
    if got < size:
        raise LoglakeError(f"segment shrank to {got} bytes since the plan", path=str(path))
    return out


def winning_offsets(
    dir: str | os.PathLike[str],
    segments: Sequence[SegmentRef],
    strategy: Strategy,
    *,
    aborted_batches: Sequence[tuple[int, int]] = (),
    full_decode: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """``(keep, tombstones)``: sorted offsets of the records of ``segments`` that win their
    key (:func:`pipelines.compaction.plan.winner_indices`, the model's rule over Arrow), and
    the subset of those that are tombstones. Records of aborted transactions (in
    ``aborted_batches``, the plan's sorted ``[first, last]`` offset ranges) take no part.
    CRCs are checked first (a damaged batch fails the pass); control batches are skipped.

    The offset strategy takes the lean path: the key, offset and value-null flag of each
    record only (:class:`_KeyRows`: uncompressed batches walked in place, compressed ones
    decoded), then the compiled key map. The other strategies, and ``full_decode`` (the
    reference: tests, benchmarks), decode every record fully with the vectorised decoder.
    No Python object per record either way."""
    root = Path(dir)
    by_offset = strategy.kind == "offset"
    lean = by_offset and not full_decode
    # room for the records to begin with: one per offset, unless the segment is too small
    # to hold that many records of 32 bytes (compacted already): then it grows as needed
    guess = sum(min(max(r.next_offset - r.base_offset, 0), r.size // 32) for r in segments)
    rows = _KeyRows(guess if lean else 0, 16 * guess if lean else 0)
    # one read buffer for all segments (the full decoder's columns are copies, never views)
    buffer = _pooled(max((r.size for r in segments), default=0), np.uint8)
    parts: list[pa.Table] = []
    for ref in segments:
        if ref.size == 0:
            continue
        path = segment_path(root, ref.base_offset, LOG_SUFFIX)
        data = _read_segment(path, ref.size, buffer)
        scan = scan_batches(data)
        _, errors = verify_batches(data, scan)
        bad = next((e for e in errors if e is not None), None)
        if bad is not None:
            raise LoglakeError(f"damaged batch, not cleaning: {bad}", path=str(path))
        if lean:
            _add_segment(rows, data, scan, path)
            continue
        for chunk in decode_records(data, scan):
            if chunk.errors:
                raise LoglakeError(f"damaged batch: {chunk.errors[0].reason}", path=str(path))
            rb = chunk.records
            columns = {
                "key": rb.column("key"),
                "offset": rb.column("offset"),
                "tombstone": pc.is_null(rb.column("value")),
            }
            if not by_offset:  # the general rule needs the version columns too
                columns["partition"] = pa.array(np.zeros(rb.num_rows, np.int32))
                columns["timestamp"] = rb.column("timestamp")
                columns["headers"] = rb.column("headers")
            parts.append(pa.table(columns))
    if lean:
        return _lean_winners(rows, aborted_batches, root)
    if not parts:
        empty = np.zeros(0, np.int64)
        return empty, empty
    table = pa.concat_tables(parts)
    all_offsets = np.asarray(table.column("offset").to_numpy())
    if by_offset:
        # rows are in offset order (segments in order, batches in order): no sort needed
        _check_increasing(all_offsets, root)
        committed = _outside(all_offsets, aborted_batches) if aborted_batches else None
        picked = _last_per_key(table, committed)
        offsets = all_offsets[picked]
        dead = np.asarray(table.column("tombstone").to_numpy(zero_copy_only=False))[picked]
        return offsets, offsets[dead]
    if aborted_batches:
        table = table.filter(pa.array(_outside(all_offsets, aborted_batches)))
    picked = winner_indices(table, versions(table, strategy))
    offsets = np.asarray(table.column("offset").to_numpy())[picked]
    dead = np.asarray(table.column("tombstone").to_numpy(zero_copy_only=False))[picked]
    order = np.argsort(offsets, kind="stable")
    return offsets[order], offsets[order][dead[order]]


def _check_increasing(offsets: np.ndarray, root: Path) -> None:
    if len(offsets) > 1 and not bool((offsets[1:] > offsets[:-1]).all()):
        raise LoglakeError("offsets not increasing in the cleanable range", path=str(root))


def _lean_winners(
    rows: _KeyRows, aborted_batches: Sequence[tuple[int, int]], root: Path
) -> tuple[np.ndarray, np.ndarray]:
    """Each key's last row (rows in offset order, as read), keyless and aborted rows out."""
    n = rows.n
    offsets = rows.offsets[:n]
    _check_increasing(offsets, root)
    valid = ~rows.k_null[:n]
    if aborted_batches:
        valid &= _outside(offsets, aborted_batches)
    last = last_per_key_into(
        rows.k_off[:n], rows.k_off[1 : n + 1], rows.k_data, valid,
        _pooled(n, np.int64), _pooled(5 * n, np.int64),
    )  # fmt: skip
    picked = np.flatnonzero(last)
    keep = offsets[picked]
    return keep, keep[rows.v_null[:n][picked]]


@dataclass
class LogCleanResult:
    """One partition's pass, as returned by the Spark task and completed by the hand-over."""

    dir: str
    due: bool
    reason: str
    first_dirty_offset: int = 0
    end_offset: int = 0
    groups: int = 0
    records_in: int = 0
    records_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    swapped: bool | None = None  # None: nothing handed over
    note: str = ""
    extra: dict[str, int] = field(default_factory=dict)


def _settings(
    log_dir: Path, topic: str, defaults: CleanerDefaults | None = None
) -> tuple[LogConfig, CleanerSettings]:
    return topic_settings(log_dir, topic, defaults)


def strategy_of(log_dir: Path, topic: str) -> Strategy:
    """The topic config's ``compaction.strategy`` (KIP-280), else ``offset``."""
    text = read_topic_config(log_dir, topic).get("compaction.strategy")
    return DEFAULT_STRATEGY if text is None else parse_strategy(text.strip())


class _Steps:
    """Wall and thread-CPU microseconds of consecutive steps, into a result's ``extra``
    (``<step>_us``, ``<step>_cpu_us``): the per-step profile the benchmark prints."""

    def __init__(self) -> None:
        self._wall = time.perf_counter_ns()
        self._cpu = time.thread_time_ns()

    def lap(self, step: str, into: dict[str, int]) -> None:
        wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
        into[f"{step}_us"] = (wall - self._wall) // 1000
        into[f"{step}_cpu_us"] = (cpu - self._cpu) // 1000
        self._wall, self._cpu = wall, cpu


def clean_partition(
    dir: str | os.PathLike[str],
    *,
    strategy: Strategy | None = None,
    now_ms: int | None = None,
    force: bool = False,
    high_watermark: int | None = None,
    defaults: CleanerDefaults | None = None,
) -> LogCleanResult:
    """Steps 1-4 of the module docstring for one partition directory (no hand-over).
    ``defaults``: the broker's (:mod:`pipelines.compaction.due`), under the topic's own
    configs; Kafka's when None."""
    started = time.perf_counter()
    root = Path(dir)
    topic, partition, _ = as_partition_dir(root)
    _, settings = _settings(root.parent, topic, defaults)
    if strategy is None:
        strategy = strategy_of(root.parent, topic)
    now = _now_ms() if now_ms is None else now_ms
    clock = _Steps()
    plan = plan_cleaning(root, settings, now_ms=now, high_watermark=high_watermark)
    result = LogCleanResult(str(root), plan.due, plan.reason, plan.first_dirty_offset)
    clock.lap("plan", result.extra)
    if not plan.segments or not (plan.due or force):
        return result
    if (root / MANIFEST_FILE).exists():
        result.note = "a manifest is still pending: skipped"
        return result
    keep_np, dead_np = winning_offsets(
        root, plan.segments, strategy, aborted_batches=plan.aborted_batches
    )
    clock.lap("keymap", result.extra)
    # sorted int64 arrays the storage layer bisects (no numpy there)
    keep, tombstones = array("q", keep_np.tobytes()), array("q", dead_np.tobytes())
    groups = []
    transactions = TransactionFilter(plan.aborted_transactions)  # one per pass, in order
    select = make_selector(keep_np)  # the compiled loop for partly kept batches
    for group in plan.groups:
        cleaned = rewrite_group(
            root,
            group,
            keep=keep,
            tombstones=tombstones,
            settings=settings,
            producer_last_offsets=plan.producer_last_offsets,
            now_ms=now,
            transactions=transactions,
            select=select,
        )
        groups.append(ManifestGroup(cleaned.base_offset, cleaned.size, cleaned.replaced))
        result.records_in += cleaned.records_in
        result.records_out += cleaned.records_out
        result.bytes_in += sum(r.size for r in cleaned.replaced)
        result.bytes_out += cleaned.size
    clock.lap("rewrite", result.extra)
    failpoint("cleaner.rewritten")
    write_manifest(root, CleanerManifest(topic, partition, tuple(groups), plan.end_offset))
    clock.lap("manifest", result.extra)
    result.end_offset = plan.end_offset
    result.groups = len(groups)
    result.seconds = time.perf_counter() - started
    return result


def hand_over(
    dir: str | os.PathLike[str],
    *,
    timeout_s: float = 30.0,
    poll_s: float = 0.2,
    defaults: CleanerDefaults | None = None,
) -> tuple[bool, str]:
    """Get a written manifest applied: by this process under the log dir's ``.lock`` when no
    broker holds it, else by the broker (waits up to ``timeout_s``). ``(swapped, how)``."""
    root = Path(dir)
    as_partition_dir(root)
    lock = DirLock(root.parent)
    try:
        lock.acquire()
    except LogDirLockedError:
        deadline = time.monotonic() + timeout_s
        while (root / MANIFEST_FILE).exists():
            if time.monotonic() > deadline:
                return False, "the broker has not applied the manifest yet"
            time.sleep(poll_s)
        return True, "applied or rejected by the broker (see the checkpoint)"
    try:
        return _apply_locked(str(root), defaults)
    finally:
        lock.release()


def _pending(root: Path) -> bool:
    return any(
        name == MANIFEST_FILE or name.endswith((CLEANED_SUFFIX, SWAP_SUFFIX))
        for name in os.listdir(root)
    )


def recover_pending(
    dir: str | os.PathLike[str], defaults: CleanerDefaults | None = None
) -> str | None:
    """A pass that a killed job left behind (a manifest, ``.cleaned`` or ``.swap`` files),
    with no broker running: finish or discard it as the broker's load would (the loader's
    rules, :mod:`logstore.storage.swap`), under the log dir's ``.lock``. A running broker
    holds the lock and does this itself (its load, then its ``cleaner-swaps`` task).
    What was done, or None when nothing was pending or the broker owns the log dir."""
    root = Path(dir)
    part = as_partition_dir(root)
    if not _pending(root):
        return None
    lock = DirLock(root.parent)
    try:
        lock.acquire()
    except LogDirLockedError:
        return None
    try:
        if not _pending(root):
            return None
        config, _ = _settings(root.parent, part.topic, defaults)
        log = Log.open(
            root,
            config,
            recovery_point=read_offset_checkpoint(root.parent / RECOVERY_POINT_CHECKPOINT).get(
                part.tp, 0
            ),
            log_start_offset=read_offset_checkpoint(root.parent / LOG_START_OFFSET_CHECKPOINT).get(
                part.tp, 0
            ),
        )
        swapped = log.load_result.swapped_segments
        log.close()
    finally:
        lock.release()
    return (
        f"recovered a killed pass: {len(swapped)} swap(s) finished"
        if swapped
        else ("recovered a killed pass: discarded")
    )


def compacted_partitions(
    log_dirs: Iterable[str | os.PathLike[str]], topics: Iterable[str] = ()
) -> list[tuple[str, Strategy]]:
    """Partition directories of every topic whose config says ``cleanup.policy`` contains
    ``compact``, plus ``topics``; with each topic's strategy."""
    out = []
    named = set(topics)
    for d in log_dirs:
        log_dir = Path(d)
        configs = read_topic_configs(log_dir)
        wanted = set(named)
        for topic, props in configs.items():
            if is_compacted(props):
                wanted.add(topic)
        for part in partition_dirs(log_dir, topics=wanted):
            out.append((str(part.path), strategy_of(log_dir, part.topic)))
    return out


def _task(item: tuple[str, Strategy, int, bool, CleanerDefaults | None]) -> LogCleanResult:
    start_task()
    dir, strategy, now_ms, force, defaults = item
    with without_huge_pages():  # key map 1.0 -> 0.6 s per partition (pipelines.worker)
        return clean_partition(
            dir, strategy=strategy, now_ms=now_ms, force=force, defaults=defaults
        )


def run_log_compaction(
    spark: SparkSession,
    log_dirs: Iterable[str | os.PathLike[str]],
    *,
    topics: Iterable[str] = (),
    force: bool = False,
    now_ms: int | None = None,
    strategies: Mapping[str, Strategy] | None = None,
    hand_over_timeout_s: float = 30.0,
    defaults: CleanerDefaults | None = None,
) -> list[LogCleanResult]:
    """Clean every due compacted partition (one Spark task each), then hand the results over.
    Partitions that are not due come back with ``due=False`` and the reason, untouched.
    ``defaults``: the broker config's (:func:`pipelines.compaction.due.load_cleaner_defaults`);
    when it disables the cleaner (``log.cleaner.enable=false``) nothing is done."""
    if defaults is not None and not defaults.enabled:
        return []
    now = _now_ms() if now_ms is None else now_ms
    parts = compacted_partitions(log_dirs, topics)
    for dir, _ in parts:
        recover_pending(dir, defaults)  # a killed run's pass, finished or discarded (no broker)
    items = []
    for dir, from_config in parts:
        topic = as_partition_dir(dir).topic
        chosen = strategies[topic] if strategies and topic in strategies else from_config
        items.append((dir, chosen, now, force, defaults))
    if not items:
        return []
    swapper = _OfflineSwapper([dir for dir, *_ in items], defaults)
    try:
        results: list[LogCleanResult] = (
            spark.sparkContext.parallelize(items, len(items)).map(_task).collect()
        )
        swapper.finish(results)
    finally:
        swapper.close()
    for res in results:
        if res.groups and res.swapped is None:  # the broker holds the log dir
            res.swapped, res.note = hand_over(
                res.dir, timeout_s=hand_over_timeout_s, defaults=defaults
            )
            if res.swapped and res.note.startswith("applied or rejected"):
                res.swapped = _checkpoint(res.dir) == res.end_offset
                res.note = "swapped by the broker" if res.swapped else "rejected by the broker"
    return results


def _apply_locked(dir: str, defaults: CleanerDefaults | None = None) -> tuple[bool, str]:
    """:func:`hand_over`'s offline branch, the caller holding the log dir's ``.lock``."""
    root = Path(dir)
    config, _ = _settings(root.parent, as_partition_dir(root).topic, defaults)
    done = apply_offline(root, config)
    return bool(done), "swapped offline" if done else "rejected offline"


class _OfflineSwapper:
    """The hand-over for log dirs no broker holds, overlapped with the Spark job: the ``.lock``
    of each such log dir is taken before the tasks start and held until every swap is done,
    and a driver thread applies each partition's manifest as soon as its task has written it
    (what the broker's ``cleaner-swaps`` task does when a broker runs), a few at once (each
    swap is mostly checks of its own files, unlinks and fsyncs; the shared
    ``cleaner-offset-checkpoint`` is updated under the swap module's lock). So the swaps of
    the first tasks run while the last ones still compute (10M records in 4 partitions on 2
    cores: 0.7 s of swaps after the job before). Log dirs whose lock is held (a running
    broker) are left to :func:`hand_over`."""

    def __init__(
        self, dirs: Sequence[str], defaults: CleanerDefaults | None = None, poll_s: float = 0.05
    ) -> None:
        self._defaults = defaults
        self._locks: list[DirLock] = []
        self._watched: list[str] = []
        locked: dict[Path, bool] = {}
        for dir in dirs:
            log_dir = Path(dir).parent
            if log_dir not in locked:
                lock = DirLock(log_dir)
                try:
                    lock.acquire()
                except LogDirLockedError:
                    locked[log_dir] = False
                else:
                    locked[log_dir] = True
                    self._locks.append(lock)
            if locked[log_dir]:
                self._watched.append(dir)
        self._pool = ThreadPoolExecutor(_SWAP_THREADS) if self._watched else None
        self._started: dict[str, Future[tuple[bool, str, int]]] = {}
        self._stop = threading.Event()
        self._poll_s = poll_s
        self._thread: threading.Thread | None = None
        if self._watched:
            self._thread = threading.Thread(target=self._poll, name="log-swaps", daemon=True)
            self._thread.start()

    def _start(self, dir: str) -> None:
        assert self._pool is not None
        if dir not in self._started:
            self._started[dir] = self._pool.submit(_apply_timed, dir, self._defaults)

    def _poll(self) -> None:
        waiting = list(self._watched)
        while waiting and not self._stop.wait(self._poll_s):
            for dir in [d for d in waiting if os.path.exists(os.path.join(d, MANIFEST_FILE))]:
                waiting.remove(dir)
                self._start(dir)

    def finish(self, results: Sequence[LogCleanResult]) -> None:
        """Every result with groups in a watched log dir swapped (or rejected); outcomes into
        the results (``swapped``, ``note``, ``extra["swap_us"]``)."""
        self._halt()
        watched = set(self._watched)
        mine = [res for res in results if res.groups and res.dir in watched]
        for res in mine:
            self._start(res.dir)  # the manifests the thread had not seen yet
        for res in mine:
            res.swapped, res.note, res.extra["swap_us"] = self._started[res.dir].result()
            if os.path.exists(os.path.join(res.dir, MANIFEST_FILE)):
                # a retried task's second manifest, written after the first was applied
                res.swapped, res.note, res.extra["swap_us"] = _apply_timed(res.dir, self._defaults)

    def _halt(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def close(self) -> None:
        """Wait for the swaps under way, then release the locks (also after a failed job)."""
        self._halt()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        for lock in self._locks:
            lock.release()


def _apply_timed(dir: str, defaults: CleanerDefaults | None) -> tuple[bool, str, int]:
    started = time.perf_counter_ns()
    swapped, note = _apply_locked(dir, defaults)
    return swapped, note, (time.perf_counter_ns() - started) // 1000


def _checkpoint(dir: str) -> int | None:
    root = Path(dir)
    parsed = parse_partition_dir(root.name)
    return read_cleaner_checkpoint(root.parent).get(parsed) if parsed else None
