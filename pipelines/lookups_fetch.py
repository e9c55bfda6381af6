"""The lookup tables through Fetch (no log dirs): :func:`pipelines.lookups.build_lookups`'
planning and executor task when ``[paths] log_dirs = []``; see that module's docstring for
what the rows hold (``segment`` and ``position`` -1, ``file`` naming the broker).

A partition is cut into pieces by offsets (at least one per core while there is that much to
read), from its progress in the table to its high watermark; a batch belongs to the piece
holding its last offset (:func:`~pipelines.sources.fetch.read_fetch_batches`), so that no
batch is indexed twice. A control batch's marker type is read from the Fetch response's bytes.

With ``[paths] remote_log_storage`` the offsets the cluster's tier holds are read from the
object store instead (:mod:`pipelines.sources.tier`: the live segments from
``__remote_log_metadata``, the ``.log`` objects in windows of ranged GETs, each window's
batch headers by :func:`~pipelines.sources.read.read_batches` with ``data=``), and only the
rest through Fetch. Those rows have real file columns: the object is the broker's segment
file byte for byte, so ``segment`` is the remote segment's base offset, ``position`` the
batch's byte position in it (both equal to a log-dir run's), and ``file`` the ``.log``
object's URI (``s3://bucket/prefix/<topic>-<id>/<partition>/<base>-<segment id>.log``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from logstore.tools.client_config import ClientConfig
from pipelines.lookups import lookup_rows
from pipelines.sources.fetch import (
    MIN_TIMESTAMP,
    FetchRange,
    plan_fetch_ranges,
    read_fetch_batches,
)
from pipelines.sources.plan import SegmentRange
from pipelines.sources.tier import TierRange, plan_summary, plan_tier, read_tier_windows, tier_tasks

__all__ = ["fetch_lookup_task", "fetch_tasks"]


def _fetched_rows(rng: FetchRange, table: str) -> Iterator[pa.RecordBatch]:
    for batch, data in read_fetch_batches(rng, min_timestamp=MIN_TIMESTAMP):
        rows = lookup_rows(table, batch, data=data)
        at = rows.schema.get_field_index("position")  # in the response: not the log's
        unknown = pa.array(np.full(rows.num_rows, -1, np.int64))
        yield rows.set_column(at, rows.schema.field(at), unknown)


def _tier_rows(rng: TierRange, table: str) -> Iterator[pa.RecordBatch]:
    from pipelines.sources.read import read_batches  # noqa: PLC0415 (numba on executors only)

    def read(window: SegmentRange, data: memoryview, part: Any) -> Iterator[pa.RecordBatch]:
        for batch in read_batches(window, min_timestamp=MIN_TIMESTAMP, data=data):
            rows = lookup_rows(table, batch, data=data)  # positions in ``data``: the markers
            if rows.num_rows:
                last = pc.max(rows.column("last_offset")).as_py()
                if last is not None:
                    part.last_end = max(part.last_end or 0, last + 1)
            yield rows

    yield from read_tier_windows(rng, read, position="position")


def fetch_lookup_task(ranges: Sequence[FetchRange | TierRange], *, table: str) -> Iterator[Any]:
    """Executor side: the segment task of :mod:`pipelines.lookups` through Fetch, the same
    rows and reports, the batches read by :func:`~pipelines.sources.fetch.read_fetch_batches`
    (``segment`` and ``position`` are -1, ``file`` names the broker), or from the tier's
    objects for a :class:`~pipelines.sources.tier.TierRange` (module docstring)."""

    ends: dict[tuple[str, int], tuple[int, int]] = {}
    for rng in ranges:
        key = (rng.topic, rng.partition)
        found = _tier_rows(rng, table) if isinstance(rng, TierRange) else _fetched_rows(rng, table)
        for rows in found:
            if rows.num_rows:
                last = pc.max(rows.column("last_offset")).as_py()
                end, n = ends.get(key, (-1, 0))
                ends[key] = (max(end, -1 if last is None else last), n + rows.num_rows)
                yield rows
    for (topic, partition), (end, n) in ends.items():
        yield {"topic": topic, "partition": partition, "next_offset": end + 1, "rows": n,
               "deleted_segments": 0}  # fmt: skip


def fetch_tasks(
    bootstrap: str,
    *,
    kafka: ClientConfig | None,
    topics: Sequence[str] | None,
    starting: dict[str, dict[str, int]],
    cores: int,
    remote_log_storage: str = "",
    log: Callable[[str], None] | None = None,
) -> list[list[FetchRange | TierRange]]:
    """The ranges from each partition's progress to its high watermark: what the tier holds
    (with ``remote_log_storage``: about one task per core, consecutive segments together),
    then Fetch ranges, at least one piece per core while there is that much (as ingest
    through Fetch cuts them)."""
    starts = {(t, int(p)): v for t, parts in starting.items() for p, v in parts.items()}
    _, bounds = plan_fetch_ranges(bootstrap, topics=topics, config=kafka, isolation=0)
    todo = {
        tp: (max(begin, starts.get(tp, begin)), end)
        for tp, (begin, end) in bounds.items()
        if topics is not None or not tp[0].startswith("__")  # as from log dirs: not internal
    }
    tasks: list[list[FetchRange | TierRange]] = []
    if remote_log_storage and todo:
        plan = plan_tier(bootstrap, remote_log_storage, {tp: s for tp, (s, _e) in todo.items()},
                         {tp: e for tp, (_s, e) in todo.items()}, config=kafka,
                         read_committed=False)  # fmt: skip
        tasks.extend(list(t) for t in tier_tasks(plan.ranges, cores))
        todo = {tp: (plan.fetch_from[tp], end) for tp, (_s, end) in todo.items()}
        if log is not None:
            log(plan_summary(plan, todo) + f" at {remote_log_storage}")
    left = sum(max(0, end - s) for s, end in todo.values())
    piece = max(1, -(-left // max(1, cores)))
    tasks.extend(
        [FetchRange(t, p, a, min(a + piece, end), bootstrap, kafka, 0)]
        for (t, p), (s, end) in sorted(todo.items())
        for a in range(s, end, piece)
    )
    return tasks
