"""Ingest's steps 3 and 4 (see :mod:`pipelines.ingest`): damaged batches appended to
``quarantine``, then the staged ``records`` files committed with the new progress in one
commit (:func:`finish_run`), and a rewind's rows moved to ``diverged`` in that same run
(:class:`Divergences`: what the divergence check of step 1 found)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from logstore.errors import CorruptRecordError
from pipelines.delta.commit import load_table
from pipelines.delta.direct import StagedWrite, append_table
from pipelines.delta.files import RECORDS_PARQUET_OPTIONS
from pipelines.divergence import (
    BatchId,
    commit_info,
    plan_rewind,
    write_diverged,
)
from pipelines.ingest.config import (
    BatchIdsOf,
    IngestConfig,
    IngestSummary,
    Log,
    TopicPartition,
    app_id,
)
from pipelines.sources import BATCHES_ARROW_SCHEMA
from pipelines.sources.damage import skipped_offsets

__all__ = [
    "QUARANTINE_ARROW_SCHEMA",
    "Divergences",
    "finish_run",
]

_QUARANTINE_KEY = ["topic", "partition", "file", "position"]

QUARANTINE_ARROW_SCHEMA: pa.Schema = BATCHES_ARROW_SCHEMA.append(
    pa.field("quarantined_at", pa.timestamp("us", tz="UTC"))
)


def _quarantine(rows: list[dict[str, Any]], path: str, log: Log, *, compression: str) -> int:
    """Append the damaged-batch ``rows`` not yet in the quarantine table; returns how many
    were new. Written from the driver (a handful of rows): no Spark job, and no Python data
    source whose planner worker could print pyspark's daemon traceback on the console."""
    new = pa.Table.from_pylist(rows, schema=BATCHES_ARROW_SCHEMA)
    dt = load_table(path)
    if dt is not None and new.num_rows:
        seen = dt.to_pyarrow_table(columns=_QUARANTINE_KEY)
        known = set(zip(*(seen.column(k).to_pylist() for k in _QUARANTINE_KEY), strict=True))
        keep = [tuple(r[k] for k in _QUARANTINE_KEY) not in known for r in new.to_pylist()]
        new = new.filter(pa.array(keep, pa.bool_()))
    if new.num_rows == 0:
        return 0
    stamp = QUARANTINE_ARROW_SCHEMA.field("quarantined_at").type
    new = new.append_column("quarantined_at", pa.array([datetime.now(UTC)] * new.num_rows, stamp))
    append_table(
        path, new, schema=QUARANTINE_ARROW_SCHEMA, partition_by=["topic"], compression=compression
    )
    log(f"quarantined {new.num_rows} new damaged batches into {path}")
    return int(new.num_rows)


def finish_run(  # noqa: PLR0917
    spark: SparkSession,
    config: IngestConfig,
    summary: IngestSummary,
    staged: StagedWrite,
    starts: Mapping[TopicPartition, int],
    progress: Mapping[TopicPartition, int],
    high_watermarks: Mapping[TopicPartition, int] | None,
    log: Log,
    divergence: Divergences | None = None,
) -> IngestSummary:
    """Steps 3 and 4: quarantine, then commit the staged files with the new progress.

    ``high_watermarks``: where each partition's offsets to ingest end (the high watermark,
    or the last stable offset below it under ``read_committed``)."""
    divergence = divergence or Divergences()
    ends: dict[TopicPartition, int] = {}
    sizes: dict[TopicPartition, tuple[int, int]] = {}
    damaged: dict[tuple[str, int, str, int], dict[str, Any]] = {}
    for report in staged.reports:
        tp = (report["topic"], report["partition"])
        if report["next_offset"] is not None:
            ends[tp] = max(ends.get(tp, report["next_offset"]), report["next_offset"])
        b, c = sizes.get(tp, (0, 0))
        sizes[tp] = (b + report["bytes"], c + report["control_batches"])
    # Damage: runs of unreadable bytes between sound batches; progress moves past each run
    # below the high watermark, and its offsets are reported as skipped (never a silent gap).
    skipped, damage_rows, past_damage = skipped_offsets(staged.reports, starts, high_watermarks)
    for row in damage_rows:
        damaged[(row["topic"], row["partition"], row["file"], row["position"])] = row
    for tp, end in past_damage.items():
        ends[tp] = max(ends.get(tp, end), end)
    summary.skipped = skipped
    summary.skipped_offsets = sum(s.offsets for s in skipped)
    summary.skipped_bytes = sum(s.bytes for s in skipped)
    for s in skipped:
        to = "the unknown log end" if s.to_offset is None else s.to_offset
        log(
            f"SKIPPED {s.topic}/{s.partition}: offsets [{s.from_offset}, {to}) ({s.offsets} "
            f"offsets) are unreadable: {s.bytes} bytes at position {s.position} of {s.file} "
            f"({s.error})"
        )
    try:
        summary.corrupt_batches = len(damaged)
        if damaged:
            log(f"{len(damaged)} damaged batches found")
            summary.quarantined += _quarantine(
                list(damaged.values()), config.quarantine_path, log, compression=config.compression
            )
        if damaged and config.fail_on_corrupt:
            raise CorruptRecordError(
                f"{len(damaged)} damaged batches (see {config.quarantine_path}): "
                f"{summary.skipped_offsets} offsets in {summary.skipped_bytes} bytes unreadable; "
                "fail_on_corrupt is set, progress not moved"
            )
        new_progress: dict[TopicPartition, int] = {}
        for tp, start in starts.items():
            end = ends.get(tp, start)
            if high_watermarks is not None and tp in high_watermarks:
                end = min(end, high_watermarks[tp])
            if end > start:
                new_progress[tp] = end
                summary.partitions += 1
                summary.bytes += sizes[tp][0]
                summary.control_batches += sizes[tp][1]
            elif start > progress.get(tp, 0):
                # Only a gap was skipped: the partition still moves, so it is reported once.
                new_progress[tp] = start
        new_progress.update(divergence.progress_after(new_progress))
        if not new_progress:
            log("nothing new to ingest")
            staged.abort()
            return summary
    except BaseException:
        staged.abort()
        raise
    log(
        f"committing {staged.num_rows} records of {len(new_progress)} partitions: "
        + ", ".join(
            f"{t}/{p} [{starts[(t, p)]}, {new_progress[(t, p)]})" for t, p in sorted(new_progress)
        )
    )
    apps = {app_id(t, p): v for (t, p), v in new_progress.items()}
    expected = {app_id(t, p): progress.get((t, p)) for (t, p) in new_progress}
    try:
        extra = _rewind(config, staged, divergence, summary, log)
        # through Fetch, the batches' identities are read from the broker: may fail too
        found = divergence.batch_ids(new_progress) if divergence.batch_ids else None
    except BaseException:
        staged.abort()
        raise
    extra["commit_info"] = commit_info(
        new_progress, divergence.parts, divergence.fingerprints, progress, divergence.ids.values(),
        found=found,
    )  # fmt: skip
    result = staged.commit(app_transactions=apps, expected_versions=expected, **extra)
    summary.records = result.num_rows
    if result.committed:  # rows a rewind wrote back to new files are not new records
        summary.records -= sum(f.num_rows for f in extra.get("extra_files", ()))
    summary.committed = result.committed
    summary.table_version = result.version
    summary.progress = dict(sorted(apps.items()))
    if not result.committed:
        log("another run already committed exactly this range: nothing written")
    return summary


@dataclass
class Divergences:
    """What the divergence check of a run found (see :mod:`pipelines.divergence`)."""

    parts: Mapping[TopicPartition, Path] = field(default_factory=dict)
    fingerprints: dict[TopicPartition, BatchId | None] = field(default_factory=dict)
    starts: dict[TopicPartition, int] = field(default_factory=dict)  # divergence points
    ids: dict[TopicPartition, str] = field(default_factory=dict)
    reasons: dict[TopicPartition, str] = field(default_factory=dict)
    # through Fetch (no log dirs, so no parts): the batches ending at the new progress - 1
    batch_ids: BatchIdsOf | None = None

    def progress_after(
        self, new_progress: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """Rewound partitions with nothing re-read still move: back to their divergence point."""
        return {tp: d for tp, d in self.starts.items() if tp not in new_progress}


def _rewind(
    config: IngestConfig,
    staged: StagedWrite,
    divergence: Divergences,
    summary: IngestSummary,
    log: Log,
) -> dict[str, Any]:
    """Rewind step 1 (``diverged`` written); returns what the records commit needs for step 2."""
    if not divergence.starts:
        return {}
    options = {
        "compression": config.compression,
        "max_rows_per_file": config.max_rows_per_file,
        **RECORDS_PARQUET_OPTIONS,
    }
    rewind = plan_rewind(
        config.records_path,
        divergence.starts,
        divergence.ids,
        divergence.reasons,
        write_id=staged.write_id,
        writer_options=options,
    )
    summary.diverged_rows = write_diverged(
        config.diverged_path, rewind, compression=config.compression
    )
    summary.rewinds = [
        f"{t}/{p} from offset {d}" for (t, p), d in sorted(divergence.starts.items())
    ]
    log(
        f"moved {summary.diverged_rows} rows to {config.diverged_path}: {rewind.describe()}; "
        f"{len(rewind.removes)} data files rewritten in the records commit"
    )
    return {
        "extra_files": rewind.kept_files,
        "removes": rewind.removes,
        "read_version": rewind.read_version,
        "rewind_apps": {app_id(t, p) for t, p in divergence.starts},
    }
