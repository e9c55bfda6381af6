"""A plain reference model of Kafka's retention, written independently of the broker's code.

Transcribed from Kafka's ``UnifiedLog.deleteOldSegments`` (3.x): three passes over the
segments, each deleting the oldest segments while a predicate holds, each pass working on
what the previous one left; ``deletableSegments`` never offers the active segment nor a
segment whose successor starts above the high watermark. Used only by the tests, against the
Spark job on generated log directories; it takes the generator's description of a partition,
not the files.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ModelPartition", "ModelSegment", "expected_log_start"]


@dataclass(frozen=True)
class ModelSegment:
    base_offset: int
    size: int
    max_timestamp: int | None  # None: no timestamp in the segment (Kafka uses the mtime)
    mtime_ms: int


@dataclass(frozen=True)
class ModelPartition:
    segments: list[ModelSegment]  # oldest first, the last one active
    retention_ms: int
    retention_bytes: int
    cleanup_policy: str
    log_start_offset: int
    high_watermark: int | None
    progress: int | None  # ingest progress; None: not lake-protected


def _kafka_deletions(p: ModelPartition, now_ms: int) -> list[tuple[ModelSegment, str]]:
    if p.high_watermark is None:
        return []
    hw = p.high_watermark
    log = list(p.segments)
    gone: list[tuple[ModelSegment, str]] = []
    policies = {x.strip() for x in p.cleanup_policy.split(",")}

    def delete_while(pred: object, rule: str) -> None:
        nonlocal log
        while len(log) > 1 and log[1].base_offset <= hw and pred(log[0]):  # type: ignore[operator]
            gone.append((log[0], rule))
            log = log[1:]

    if "delete" in policies:
        if p.retention_ms >= 0:

            def expired(s: ModelSegment) -> bool:
                largest = s.mtime_ms if s.max_timestamp is None else s.max_timestamp
                return now_ms - largest > p.retention_ms

            delete_while(expired, "retention.ms")
        if p.retention_bytes >= 0:
            diff = [sum(s.size for s in log) - p.retention_bytes]
            if diff[0] > 0:

                def over(s: ModelSegment) -> bool:
                    if diff[0] - s.size >= 0:
                        diff[0] -= s.size
                        return True
                    return False

                delete_while(over, "retention.bytes")
    start = max(p.log_start_offset, log[0].base_offset)
    delete_while(lambda s: log[1].base_offset <= start, "log.start.offset")
    return gone


def expected_log_start(
    p: ModelPartition, now_ms: int, *, force: bool
) -> tuple[int | None, list[str], int]:
    """``(new log start or None, rule of each deleted segment, segments held by the lake)``."""
    wanted = _kafka_deletions(p, now_ms)
    bases = [s.base_offset for s in p.segments]
    new_start: int | None = None
    rules: list[str] = []
    held = 0
    for seg, rule in wanted:
        nxt = bases[bases.index(seg.base_offset) + 1]
        if not force and p.progress is not None and nxt > p.progress:
            held += 1
            continue
        if held:
            held += 1
            continue
        new_start = nxt
        rules.append(rule)
    return new_start, rules, held
