"""The lookup tables through Fetch (no log dirs): :func:`pipelines.lookups.build_lookups`'
planning and executor task when ``[paths] log_dirs = []``; see that module's docstring for
what the rows hold (``segment`` and ``position`` -1, ``file`` naming the broker).

A partition is cut into pieces by offsets (at least one per core while there is that much to
read), from its progress in the table to its high watermark; a batch belongs to the piece
holding its last offset (:func:`~pipelines.sources.fetch.read_fetch_batches`), so that no
batch is indexed twice. A control batch's marker type is read from the Fetch response's bytes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
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

__all__ = ["fetch_lookup_task", "fetch_tasks"]


def fetch_lookup_task(ranges: list[FetchRange], *, table: str) -> Iterator[Any]:
    """Executor side: the segment task of :mod:`pipelines.lookups` through Fetch, the same
    rows and reports, the batches read by :func:`~pipelines.sources.fetch.read_fetch_batches`
    (``segment`` and ``position`` are -1, ``file`` names the broker)."""

    ends: dict[tuple[str, int], tuple[int, int]] = {}
    for rng in ranges:
        key = (rng.topic, rng.partition)
        for batch, data in read_fetch_batches(rng, min_timestamp=MIN_TIMESTAMP):
            rows = lookup_rows(table, batch, data=data)
            at = rows.schema.get_field_index("position")  # in the response: not the log's
            unknown = pa.array(np.full(rows.num_rows, -1, np.int64))
            rows = rows.set_column(at, rows.schema.field(at), unknown)
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
) -> list[list[FetchRange]]:
    """The Fetch ranges from each partition's progress to its high watermark, at least one
    piece per core while there is that much (as ingest through Fetch cuts them)."""
    starts = {(t, int(p)): v for t, parts in starting.items() for p, v in parts.items()}
    _, bounds = plan_fetch_ranges(bootstrap, topics=topics, config=kafka, isolation=0)
    todo = {
        tp: (max(begin, starts.get(tp, begin)), end)
        for tp, (begin, end) in bounds.items()
        if topics is not None or not tp[0].startswith("__")  # as from log dirs: not internal
    }
    left = sum(max(0, end - s) for s, end in todo.values())
    piece = max(1, -(-left // max(1, cores)))
    return [
        [FetchRange(t, p, a, min(a + piece, end), bootstrap, kafka, 0)]
        for (t, p), (s, end) in sorted(todo.items())
        for a in range(s, end, piece)
    ]
