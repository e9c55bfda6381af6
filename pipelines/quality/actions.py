"""The Actions of loglake's quality Checkpoints, and the users' own from ``[quality] actions``.

A quality run validates each suite through a GX Checkpoint ``loglake_<suite>`` (one per
suite: a Spark DataFrame asset takes its DataFrame as the run's only batch parameter, so one
Checkpoint cannot validate two DataFrames). Each Checkpoint runs these Actions, in order:

1. :class:`OfflineDataDocsAction` (``type = "loglake_data_docs"``): GX's
   ``UpdateDataDocsAction``, building this run's pages in one pass (GX's own builds the index
   again for each result; here the last suite's Checkpoint builds it, once per quality run),
   then :func:`pipelines.quality.docs_site.make_offline`;
2. :class:`QualityResultsAction` (``type = "loglake_quality_results"``): one row per
   expectation into the ``quality_results`` Delta table, one commit per Checkpoint run;
3. the users' Actions, in the order of ``[quality] actions``: any ``ValidationAction``
   subclass importable by the job (notifications, GX's own Slack/email Actions...).

Crash behaviour: an action that raises fails the run (the job exits non-zero); the suites'
Checkpoints that ran before keep their rows and pages.
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
from great_expectations.checkpoint import UpdateDataDocsAction, ValidationAction
from great_expectations.checkpoint.checkpoint import CheckpointResult

from logstore.errors import InvalidConfigError
from pipelines.delta.direct import append_table
from pipelines.quality.docs_site import make_offline
from pipelines.quality.results import RESULTS_SCHEMA, rule_results

__all__ = ["OfflineDataDocsAction", "QualityResultsAction", "user_actions"]


class OfflineDataDocsAction(UpdateDataDocsAction):
    """Builds the Checkpoint run's pages and the index of ``site_names`` once, then serves
    the pages' CSS/JS from the site itself (``site_dir``: the site's directory)."""

    type: Literal["loglake_data_docs"] = "loglake_data_docs"  # type: ignore[assignment]
    site_dir: str
    # False: the pages only. The index reads every validation result the context holds (all
    # runs'): a quality run builds it once, in its last suite's Checkpoint, not once per suite
    build_index: bool = True

    def run(
        self, checkpoint_result: CheckpointResult, action_context: Any = None
    ) -> dict[Any, Any]:
        from great_expectations.data_context.types.resource_identifiers import (  # noqa: PLC0415
            ExpectationSuiteIdentifier,
        )

        started = time.time_ns()
        pages: list[Any] = []
        for key, result in checkpoint_result.run_results.items():
            pages += [key, ExpectationSuiteIdentifier(name=result.suite_name)]
        self._resolve_context().context.build_data_docs(
            site_names=self.site_names, resource_identifiers=pages, build_index=self.build_index
        )
        try:
            unknown = make_offline(Path(self.site_dir), since_ns=started)
        except FileNotFoundError as exc:
            # the data were checked: a site that needs the network is no reason to fail that
            print(f"[quality] WARNING: Data Docs need the network: {exc}", file=sys.stderr)
        else:
            if unknown:
                print(
                    "[quality] WARNING: Data Docs load these from the network (not in "
                    f"pipelines/quality/docs_site.ASSETS): {', '.join(unknown)}",
                    file=sys.stderr,
                )
        out: dict[Any, Any] = {}
        for key in checkpoint_result.run_results:
            sites = self._get_docs_sites_urls(resource_identifier=key, site_names=self.site_names)
            out[key] = {s["site_name"]: s["site_url"] for s in sites}
        return out


class QualityResultsAction(ValidationAction):
    """Appends one row per expectation of the Checkpoint run to the Delta table at ``table``
    (``RESULTS_SCHEMA``; ``run_id`` is the GX run name), in one commit."""

    type: Literal["loglake_quality_results"] = "loglake_quality_results"
    table: str

    def run(
        self, checkpoint_result: CheckpointResult, action_context: Any = None
    ) -> dict[str, Any]:
        run_id = checkpoint_result.run_id
        rows = [
            {"run_id": run_id.run_name, "run_time": run_id.run_time, **vars(r)}
            for result in checkpoint_result.run_results.values()
            for r in rule_results(result.suite_name, result)
        ]
        # (from the driver: a Python data source sink would start a planner worker of
        # pyspark's own daemon, which may print a BrokenPipeError traceback; see
        # pipelines.session.get_spark)
        append_table(self.table, pa.Table.from_pylist(rows, RESULTS_SCHEMA), schema=RESULTS_SCHEMA)
        return {"table": self.table, "rows": len(rows)}


def user_actions(specs: Sequence[dict[str, Any]]) -> list[ValidationAction]:
    """The Actions of ``[quality] actions`` (already checked for shape by
    :func:`pipelines.quality.config.load_quality_config`): each spec's ``class``
    (``package.module.Class`` or ``package.module:Class``) imported and made with the other
    keys as its fields (``name`` defaults to the class name). Raises ``InvalidConfigError``
    naming the entry when the class cannot be imported, is no ``ValidationAction``, or
    refuses the fields."""
    out: list[ValidationAction] = []
    for i, spec in enumerate(specs):
        where = f"[quality] actions[{i}]"
        path = spec["class"]
        module, _, name = path.rpartition(":") if ":" in path else path.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError) as exc:
            raise InvalidConfigError(f"{where}: cannot import {path!r}: {exc}") from None
        if not (isinstance(cls, type) and issubclass(cls, ValidationAction)):
            raise InvalidConfigError(
                f"{where}: {path!r} is not a great_expectations ValidationAction subclass"
            )
        fields = {k: v for k, v in spec.items() if k != "class"}
        fields.setdefault("name", name)
        try:
            out.append(cls(**fields))
        except Exception as exc:  # pydantic's ValidationError names the bad field
            raise InvalidConfigError(f"{where}: {path} refused its fields: {exc}") from None
    return out
