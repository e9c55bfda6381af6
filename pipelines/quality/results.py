"""What a quality run's rows are: ``quality_results``' schema, one row per expectation.

No Great Expectations import here: the job's report and the results Action share these.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

__all__ = ["RESULTS_SCHEMA", "RuleResult", "rule_results"]

RESULTS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("run_time", pa.timestamp("us", tz="UTC")),
        ("suite", pa.string()),
        ("rule", pa.string()),
        ("expectation", pa.string()),
        ("success", pa.bool_()),
        ("observed_value", pa.string()),
        ("unexpected_count", pa.int64()),
        ("details", pa.string()),
    ]
)


@dataclass(frozen=True)
class RuleResult:
    """One expectation's outcome in one run."""

    suite: str
    rule: str
    expectation: str
    success: bool
    observed_value: str | None
    unexpected_count: int | None
    details: str | None


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, default=str, sort_keys=True)


def rule_results(suite: str, result: Any) -> list[RuleResult]:
    """The expectations of one suite's validation result (rule: ``meta["rule"]``)."""
    out = []
    for r in result.results:
        cfg = r.expectation_config
        res = r.result or {}
        details = {k: res[k] for k in ("partial_unexpected_list", "unexpected_percent") if k in res}
        if r.exception_info and r.exception_info.get("raised_exception"):
            details["exception"] = r.exception_info.get("exception_message")
        out.append(
            RuleResult(
                suite=suite,
                rule=(cfg.meta or {}).get("rule", cfg.type),
                expectation=cfg.type,
                success=bool(r.success),
                observed_value=_json(res.get("observed_value")),
                unexpected_count=res.get("unexpected_count"),
                details=_json(details) if details else None,
            )
        )
    return out
