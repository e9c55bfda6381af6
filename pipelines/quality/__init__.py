"""Data quality: Great Expectations suites over the lake's tables (see :mod:`.run`)."""

from __future__ import annotations

from pipelines.quality.config import QualityConfig, load_quality_config
from pipelines.quality.results import RuleResult
from pipelines.quality.run import QUALITY_DIR, RESULTS_TABLE, QualityReport, run_quality

__all__ = [
    "QUALITY_DIR",
    "RESULTS_TABLE",
    "QualityConfig",
    "QualityReport",
    "RuleResult",
    "load_quality_config",
    "run_quality",
]
