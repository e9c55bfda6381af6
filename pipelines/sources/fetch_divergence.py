"""The divergence check of ingest through Fetch (no log dirs): :mod:`pipelines.divergence`,
the log side read through the Kafka protocol.

What the lake remembers is the same (each ingest commit's ``commitInfo``: per partition the
next offset and the identity of the batch holding ``next - 1``: base and last offset,
partitionLeaderEpoch, CRC). Through Fetch that identity is read from the header of the batch
the broker serves at ``next - 1`` (:func:`~pipelines.sources.fetch.batch_headers_at`; the
broker serves the segment's bytes unchanged, so it is the header the log-dir path reads from
the file); the file columns are -1 (no file).

The check, per partition with progress ``P`` at or above the log start (ListOffsets): the
log's end below ``P`` (a log that went backwards: truncated, or the topic deleted and made
again with fewer records) is divergence; else the batch the broker now serves at the
remembered batch's last offset must have the same base and last offset, epoch and CRC (a log
truncated and written again has new batches there). The end is the one the run reads to:
the last stable offset under ``read_committed`` (the high watermark is asked for too when a
progress is past it, so that a lake ingested ``read_uncommitted`` beyond an open transaction
is not taken for diverged). Cost: Metadata, ListOffsets, one DescribeConfigs and one small
Fetch per partition with progress.

Compacted topics (``cleanup.policy`` has ``compact``, from DescribeConfigs): a cleaner may
rewrite the remembered batch under the same offsets and the broker does not tell how far it
cleaned (the log-dir check reads ``cleaner-offset-checkpoint``), so only their log end is
checked, and each run says so (every topic's, when the principal may not describe the topic
configs: logged too).

``on_divergence="rewind"``: the divergence point is found as from the log dirs
(:func:`pipelines.divergence.divergence_point_from`), the log's records read through Fetch
from windows growing backwards from the limit (:data:`_WINDOWS`) where the log dirs use
segment bases; the rewind commit is the log-dir run's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

import pyarrow as pa

from logstore.storage.topic_config import is_compacted
from logstore.tools.client_config import ClientConfig
from pipelines.divergence import (
    BatchId,
    Divergence,
    divergence_error,
    divergence_limit,
    divergence_point_from,
    offset_to_compare,
    read_fingerprints,
    rewind_id,
)
from pipelines.sources.fetch import (
    FetchError,
    FetchRange,
    batch_headers_at,
    plan_fetch_ranges,
    read_fetch_range,
    topic_configs,
)

if TYPE_CHECKING:
    from pipelines.ingest import Divergences, IngestConfig

__all__ = ["check_fetched", "check_fetched_divergence", "fetched_batch_ids"]

TopicPartition = tuple[str, int]
# how far back from the limit the divergence point is looked for, in offsets (then the log
# start): as the log-dir path goes one segment further back while the first record differs
_WINDOWS = (1 << 10, 1 << 14, 1 << 18, 1 << 22)
_MIN_TS, _MAX_TS = -(2**63), 2**63 - 1


def check_fetched(
    bootstrap: str,
    *,
    config: ClientConfig | None,
    bounds: Mapping[TopicPartition, tuple[int, int]],
    progress: Mapping[TopicPartition, int],
    fingerprints: Mapping[TopicPartition, BatchId | None],
    compacted: Iterable[str] = (),
) -> list[Divergence]:
    """The partitions of ``bounds`` (``(log start, end)`` from ListOffsets) whose log no
    longer holds what the lake ingested (module docstring); ``compacted``: topics whose log
    end alone is checked."""
    skip = set(compacted)
    found: list[Divergence] = []
    probes: dict[TopicPartition, int] = {}
    for tp, (start, end) in sorted(bounds.items()):
        done = progress.get(tp, 0)
        if done <= 0 or done < start:
            continue  # nothing ingested, or a gap (reported by the run as such)
        fp = fingerprints.get(tp)
        if end < done:
            found.append(Divergence(tp[0], tp[1], done, end, fp, None))
            continue
        at = offset_to_compare(done, end, start, fp, tp in fingerprints, 0)
        if tp[0] not in skip and at is not None:
            probes[tp] = at
    for tp, header in batch_headers_at(bootstrap, probes, config=config).items():
        fp = fingerprints[tp]
        current = None if header is None else BatchId(*header, -1, -1)
        if current is None or fp is None or not current.same_batch(fp):
            found.append(Divergence(tp[0], tp[1], progress[tp], bounds[tp][1], fp, current))
    return sorted(found, key=lambda d: (d.topic, d.partition))


def fetched_batch_ids(
    bootstrap: str, next_offsets: Mapping[TopicPartition, int], *, config: ClientConfig | None
) -> dict[TopicPartition, BatchId | None]:
    """Through Fetch, what :func:`pipelines.divergence.commit_info` reads from the segment
    files: the batch ending at each ``next - 1`` (None: no batch ends there)."""
    wanted = {tp: n - 1 for tp, n in next_offsets.items() if n > 0}
    out: dict[TopicPartition, BatchId | None] = dict.fromkeys(next_offsets)
    for tp, header in batch_headers_at(bootstrap, wanted, config=config).items():
        if header is not None and header[1] == wanted[tp]:
            out[tp] = BatchId(*header, -1, -1)
    return out


def _log_records(rng: FetchRange, tp: TopicPartition, lo: int, hi: int) -> pa.Table:
    """The log's records ``[lo, hi)`` through Fetch, as ``divergence._log_records`` gives
    them from the files (offset-sorted; the driver decodes: a rare repair, not a hot path)."""
    from pipelines.divergence import COMPARED_COLUMNS  # noqa: PLC0415
    from pipelines.sources.schema import RECORDS_ARROW_SCHEMA  # noqa: PLC0415

    if hi <= lo:
        return RECORDS_ARROW_SCHEMA.empty_table().select(["offset", *COMPARED_COLUMNS, "headers"])
    part = FetchRange(tp[0], tp[1], lo, hi, rng.bootstrap, rng.config, rng.isolation)
    batches = list(read_fetch_range(part, min_timestamp=_MIN_TS, max_timestamp=_MAX_TS))
    table = pa.Table.from_batches(batches, schema=RECORDS_ARROW_SCHEMA)
    return table.select(["offset", *COMPARED_COLUMNS, "headers"]).sort_by("offset")


def check_fetched_divergence(
    config: IngestConfig,
    bounds: Mapping[TopicPartition, tuple[int, int]],
    progress: Mapping[TopicPartition, int],
    log: Callable[[str], None],
) -> Divergences:
    """Ingest's step 1b through Fetch: raises :class:`~pipelines.divergence.DivergenceError`
    (``on_divergence="fail"``, exit 4) or returns the partitions to rewind with their
    divergence points, and how the run's commit learns its batches' identities."""
    from pipelines.ingest import Divergences  # noqa: PLC0415 (pipelines.ingest imports us)

    bootstrap, kafka = config.bootstrap_servers, config.kafka
    isolation = 1 if config.isolation == "read_committed" else 0
    out = Divergences(
        fingerprints=read_fingerprints(config.records_path, progress),
        batch_ids=functools.partial(fetched_batch_ids, bootstrap, config=kafka),
    )
    ends = dict(bounds)
    if isolation and any(progress.get(tp, 0) > end for tp, (_s, end) in bounds.items()):
        # past the last stable offset: judged by the high watermark (module docstring)
        _, high = plan_fetch_ranges(bootstrap, topics=sorted({t for t, _ in bounds}),
                                    config=kafka, isolation=0)  # fmt: skip
        ends = {tp: (s, max(e, high.get(tp, (s, e))[1])) for tp, (s, e) in bounds.items()}
    moved = sorted({t for t, p in bounds if progress.get((t, p), 0) > 0})
    try:
        configs = topic_configs(bootstrap, moved, config=kafka, effective=True)
    except FetchError as exc:  # e.g. no DESCRIBE_CONFIGS right: judged as compacted, and said
        log(f"divergence check: the topic configs are not readable ({exc})")
        configs = {t: {"cleanup.policy": "compact"} for t in moved}
    compacted = [t for t, props in configs.items() if is_compacted(props)]
    if compacted:
        log(
            f"divergence check of compacted topics {', '.join(compacted)} through Fetch: by "
            "their log end only (the broker does not tell how far its cleaner rewrote them)"
        )
    found = check_fetched(bootstrap, config=kafka, bounds=ends, progress=progress,
                          fingerprints=out.fingerprints, compacted=compacted)  # fmt: skip
    if not found:
        return out
    if config.on_divergence == "fail":
        raise divergence_error(found, diverged_path=config.diverged_path)
    for div in found:
        tp = (div.topic, div.partition)
        start = bounds[tp][0]
        limit = divergence_limit(div)
        rng = FetchRange(tp[0], tp[1], start, start, bootstrap, kafka, isolation)
        point = divergence_point_from(
            config.records_path, div, start,
            bases=sorted({start} | {max(start, limit - w) for w in _WINDOWS}),
            read_log=functools.partial(_log_records, rng),
        )  # fmt: skip
        out.starts[tp] = point
        out.ids[tp] = rewind_id(tp, div.progress, out.fingerprints.get(tp))
        out.reasons[tp] = div.describe()
        log(f"DIVERGED {div.describe()}; rewinding {tp[0]}/{tp[1]} from offset {point}")
    return out
