"""What a compaction run reports: per topic (:class:`TopicResult`) and in all
(:class:`CompactSummary`, the job's JSON summary)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["CompactSummary", "TopicResult"]


@dataclass
class TopicResult:
    """What a run did to one topic's table."""

    topic: str
    strategy: str
    committed: bool = False
    table_version: int | None = None
    records_read: int = 0
    buckets_rewritten: int = 0
    buckets_with_deletion_vectors: int = 0
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    progress: dict[str, int] = field(default_factory=dict)
    # wall-clock seconds of the run's steps: plan (snapshots, file lists), stage1 (read, own
    # winners, bucket, stage), stage2 (merge, write), commit; and stage2_cpu_<phase>: CPU
    # seconds of an incremental run's stage-2 phases, summed over its tasks (merge.merge_rows)
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class CompactSummary:
    topics: list[TopicResult] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        parts = [
            f"{t.topic}: +{t.inserted} ~{t.updated} -{t.deleted} "
            f"({t.records_read} records, {t.buckets_rewritten} buckets, "
            f"version {t.table_version}, committed={t.committed})"
            for t in self.topics
        ]
        return (
            f"compact summary: {'; '.join(parts) or 'no compacted topics'} in {self.seconds:.1f}s"
        )
