"""One ingest run through Fetch: ``[ingest] bootstrap_servers`` with no log dirs.

The driver asks the cluster (Metadata, ListOffsets: :func:`~pipelines.sources.fetch.
plan_fetch_ranges`) for each partition's log start and end (the last stable offset under
``read_committed``, else the high watermark), starts each partition at its progress in the
``records`` table (a progress below the log start is a :class:`~pipelines.ingest.Gap`, as
from log dirs), cuts the offsets to read into pieces (at most ``max_offsets`` offsets, and
at least one piece per core while there is that much to read), and the executors read them
through Fetch (:func:`~pipelines.sources.fetch.read_fetch_range`) into the same staged Delta
write. Quarantine, progress and the exactly-once commit are the log-dir run's
(:func:`pipelines.ingest.finish_run`): a run killed before the commit leaves nothing, a re-run
with nothing new commits nothing.

With ``[paths] remote_log_storage`` (``--remote-log-storage``): the offsets the cluster's tier
holds are read from the object store on the executors instead, the rest through Fetch
(:func:`pipelines.sources.tier.plan_tier`), into the same write and the same commit.

The divergence check (``on_divergence``) reads the log side through Fetch too
(:mod:`pipelines.sources.fetch_divergence`). Not done through Fetch: ``max_partition_bytes``
(a piece is bounded by offsets; a Fetch response by
:data:`~pipelines.sources.fetch.DEFAULT_FETCH_MAX_BYTES`).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pipelines.sources.fetch import (
    DEFAULT_FETCH_MAX_BYTES,
    DEFAULT_MAX_OFFSETS,
    FetchRange,
    plan_fetch_ranges,
    read_fetch_range,
)
from pipelines.sources.fetch_divergence import check_fetched_divergence
from pipelines.sources.plan import MAX_OFFSET, MIN_OFFSET
from pipelines.sources.tier import (
    TierRange,
    next_tier_ranges,
    plan_summary,
    plan_tier,
    read_tier_range,
    tier_tasks,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipelines.ingest import IngestConfig, IngestSummary, Log

__all__ = ["run_fetch_ingest"]


def _read(task: list[FetchRange | TierRange], *, max_bytes: int) -> Iterator[Any]:
    """Executor side: per range, its records then its report (JSON), as the log-dir path."""
    from pipelines.sources.read import RangeReport  # noqa: PLC0415
    from pipelines.worker import start_task  # noqa: PLC0415

    start_task()
    for i, rng in enumerate(task):
        report = RangeReport(rng.topic, rng.partition)
        if isinstance(rng, TierRange):
            yield from read_tier_range(
                rng, min_timestamp=MIN_OFFSET, max_timestamp=MAX_OFFSET, report=report,
                after=next_tier_ranges(task, i),
            )  # fmt: skip
        else:
            yield from read_fetch_range(
                rng,
                min_timestamp=MIN_OFFSET,
                max_timestamp=MAX_OFFSET,
                max_bytes=max_bytes,
                report=report,
            )
        yield report.to_json()


def run_fetch_ingest(
    spark: SparkSession,
    config: IngestConfig,
    *,
    log: Log,
    max_offsets: int = DEFAULT_MAX_OFFSETS,
    max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
) -> IngestSummary:
    """One run (module docstring); raises ``LoglakeError`` on failure, committing nothing."""
    # Imported here: pipelines.ingest imports this module's caller hook lazily too.
    from pipelines.ingest import (  # noqa: PLC0415
        Gap,
        IngestSummary,
        finish_run,
        read_progress,
        stage_records,
    )

    started = time.monotonic()
    summary = IngestSummary()
    progress = read_progress(config.records_path)
    isolation = 1 if config.isolation == "read_committed" else 0
    _, bounds = plan_fetch_ranges(
        config.bootstrap_servers, topics=config.topics, config=config.kafka, isolation=isolation
    )
    starts = {}
    for (topic, partition), (begin, _end) in sorted(bounds.items()):
        done = progress.get((topic, partition), 0)
        if done < begin:
            summary.gaps.append(Gap(topic, partition, done, begin))
            log(
                f"GAP {topic}/{partition}: offsets [{done}, {begin}) were removed from the log "
                "before they were ingested; continuing at the log start offset"
            )
        starts[(topic, partition)] = max(done, begin)
    divergence = check_fetched_divergence(config, bounds, progress, log)
    starts.update(divergence.starts)
    limits = {tp: end for tp, (_begin, end) in bounds.items()}
    fetch_from = dict(starts)
    tier: list[TierRange] = []
    if config.remote_log_storage:
        plan = plan_tier(config.bootstrap_servers, config.remote_log_storage, starts, limits,
                         config=config.kafka, read_committed=bool(isolation))  # fmt: skip
        tier, fetch_from = plan.ranges, plan.fetch_from
        log(plan_summary(plan, starts) + f" at {config.remote_log_storage}")
    left = sum(max(0, limits[tp] - s) for tp, s in fetch_from.items())
    cores = spark.sparkContext.defaultParallelism
    piece = max(1, min(max_offsets, -(-left // max(1, cores))))
    # planned again from the chosen starts, against the same ends (the first plan's)
    ranges = [
        FetchRange(
            t,
            p,
            a,
            min(a + piece, limits[(t, p)]),
            config.bootstrap_servers,
            config.kafka,
            isolation,
        )
        for (t, p), s in sorted(fetch_from.items())
        for a in range(s, limits[(t, p)], piece)
    ]
    log(
        f"{len(bounds)} partitions through Fetch from {config.bootstrap_servers}; progress known "
        f"for {len(progress)}; reading {left} offsets in {len(ranges)} pieces; lake {config.lake}"
    )
    staged = stage_records(
        spark,
        config,
        [*tier_tasks(tier, cores, max_bytes=config.max_partition_bytes), *([r] for r in ranges)],
        functools.partial(_read, max_bytes=max_bytes),
        log,
    )
    log(f"planned ends: {json.dumps({f'{t}/{p}': e for (t, p), e in sorted(limits.items())})}")
    try:
        return finish_run(spark, config, summary, staged, starts, progress, limits, log, divergence)
    finally:
        summary.seconds = time.monotonic() - started
