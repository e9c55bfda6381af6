"""Key compaction: the reference model, the winner rule over Arrow, and the Delta upsert tables.

- ``model``: the rules in plain Python (the specification the tests hold the job to);
- ``plan``: the same rule column at a time (``winner_indices``), shared by every output;
- ``table``: ``<lake>/topics/<topic>``, one row per live key, merged incrementally by Spark
  (the run's orchestration); its steps: ``snapshot`` (plan: progress and files), ``stage``
  (stage 1 and the Spark jobs), ``merge`` (one bucket), ``commit``, ``runs`` (run markers,
  leftovers, reaping), ``setup`` (table creation and settings), ``layout`` (names);
- ``config``: ``[compact]`` of ``conf/pipeline.toml`` and the topics to compact.
"""

from __future__ import annotations

from pipelines.compaction.config import CompactConfig, compacted_topics, load_compact_config
from pipelines.compaction.model import Rec, Strategy, compact, latest, parse_strategy
from pipelines.compaction.plan import winner_indices, winners

__all__ = [
    "CompactConfig",
    "Rec",
    "Strategy",
    "compact",
    "compacted_topics",
    "latest",
    "load_compact_config",
    "parse_strategy",
    "winner_indices",
    "winners",
]
