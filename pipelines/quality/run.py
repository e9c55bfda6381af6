"""One quality run: the suites over the lake's tables, Data Docs, ``quality_results``.

1. read the tables (``pipelines.delta.read_delta``) and the partitions' bounds from the log
   dirs (:mod:`pipelines.quality.bounds`); build the checked DataFrames
   (:mod:`pipelines.quality.checks`), each computed once and kept in memory (records' columns
   are read once: the gaps are computed from the records suite's rows);
2. validate each with its suite (:mod:`pipelines.quality.suites`) through a GX Checkpoint
   ``loglake_<suite>`` in a Great Expectations file context under ``<lake>/_quality/gx``
   (suites, validation definitions, Checkpoints and results are kept there, so Data Docs show
   every run). Each Checkpoint's Actions (:mod:`pipelines.quality.actions`) do the rest:
3. the Data Docs site at ``<lake>/_quality/data_docs/index.html``: the run's pages and the
   index (earlier runs' pages are already there), its CSS/JS served by the site itself;
4. one row per expectation appended to ``<lake>/quality_results`` (run id, run time, suite,
   rule, expectation type, success, observed value, unexpected count, details), one commit
   per suite;
5. the users' Actions of ``[quality] actions`` (notifications...).

Suites: ``records`` and ``records_gaps`` always (the ``records`` table must exist);
``lookups`` when ``offset_lookup`` exists; ``quarantine`` always (no table = no rows);
``topic_<name>`` for every compacted table ``<lake>/topics/<name>``; ``typed_<name>`` for
every typed table ``<lake>/tables/<name>`` (dead-letter rate; one row per key when upserted).

On an object store (``s3://``) the tables are read through the store, ``quality_results`` is
committed there, and the file context and Data Docs are built in a local copy of
``<lake>/_quality`` uploaded after the run (:mod:`pipelines.quality.workdir`).

Not safe to run twice at once on one lake (the file context is shared); a crashed run leaves
the rows and pages of the suites validated before the crash, and at most one suite's
validation result without its ``quality_results`` rows.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, SparkSession

from logstore.errors import LoglakeError
from logstore.objectstore import LakeLocation, ObjectStore
from pipelines.delta import read_app_transactions, read_delta
from pipelines.delta.commit import load_table
from pipelines.ingest import IngestConfig, read_progress
from pipelines.quality.bounds import partition_bounds
from pipelines.quality.checks import (
    bounds_frame,
    compacted_check,
    local_frame,
    lookup_agreement,
    lookup_progress_frame,
    offset_gaps,
    records_checked,
    typed_check,
)
from pipelines.quality.config import QualityConfig
from pipelines.quality.results import RuleResult, rule_results
from pipelines.quality.workdir import pull, push

if TYPE_CHECKING:
    from great_expectations.data_context.store.store import DataDocsSiteConfigTypedDict

__all__ = [
    "QUALITY_DIR",
    "RESULTS_TABLE",
    "QualityReport",
    "log_progress",
    "run_quality",
]

QUALITY_DIR = "_quality"
RESULTS_TABLE = "quality_results"
DOCS_SITE = "loglake"
Log = Callable[[str], None]


@dataclass
class QualityReport:
    """What a run found; ``success`` when every expectation of every suite held."""

    run_id: str
    success: bool = True
    suites: dict[str, bool] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    results: list[RuleResult] = field(default_factory=list)
    docs: str | None = None
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("results")
        return out


def log_progress(message: str) -> None:
    print(f"[quality {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _context(root: Path, docs: bool) -> Any:
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx  # noqa: PLC0415 (slow import: only when a run starts)
    from great_expectations.data_context.types.base import (  # noqa: PLC0415
        ProgressBarsConfig,
    )

    root.mkdir(parents=True, exist_ok=True)
    context = gx.get_context(mode="file", project_root_dir=str(root))
    bars = context.variables.progress_bars
    if (bars.get("globally") if isinstance(bars, dict) else getattr(bars, "globally", None)) in (
        None,
        True,
    ):
        context.variables.progress_bars = ProgressBarsConfig(globally=False)
        context.variables.save()
    if docs:
        # The site's directory is an absolute path: a lake that was moved or copied gets its
        # own again (else its Data Docs would be written under the lake it came from).
        site: DataDocsSiteConfigTypedDict = {
            "class_name": "SiteBuilder",
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            "store_backend": {
                "class_name": "TupleFilesystemStoreBackend",
                "base_directory": str(root / "data_docs"),
            },
        }
        # a file context's config is a DataContextConfig (declared: that, a dict or a str)
        current = (context.get_config().data_docs_sites or {}).get(DOCS_SITE)  # type: ignore[union-attr]
        if current is None:
            context.add_data_docs_site(site_name=DOCS_SITE, site_config=site)
        elif (current.get("store_backend") or {}).get("base_directory") != str(root / "data_docs"):
            context.update_data_docs_site(site_name=DOCS_SITE, site_config=site)
    return context


def _validate(context: Any, suite: Any, df: DataFrame, run_id: Any, actions: list[Any]) -> Any:
    """Validate ``df`` with ``suite`` through the Checkpoint ``loglake_<suite>`` and its
    ``actions`` (objects made once per context; suite, definition and Checkpoint replaced,
    so that a changed config takes effect); the suite's validation result."""
    import great_expectations as gx  # noqa: PLC0415

    try:
        source = context.data_sources.get("loglake")
    except KeyError:
        source = context.data_sources.add_spark(name="loglake")
    try:
        asset = source.get_asset(suite.name)
    except LookupError:
        asset = source.add_dataframe_asset(name=suite.name)
    try:
        batch = asset.get_batch_definition("whole")
    except KeyError:
        batch = asset.add_batch_definition_whole_dataframe("whole")
    suite = context.suites.add_or_update(suite)
    definition = context.validation_definitions.add_or_update(
        gx.ValidationDefinition(name=suite.name, data=batch, suite=suite)
    )
    # Replaced without being loaded: the stored one names the Actions of the last run by type,
    # and GX cannot load an Action whose class is not imported (a user Action since removed
    # from [quality] actions).
    store = context.checkpoint_store
    key = store.get_key(name=f"loglake_{suite.name}")
    if store.has_key(key):
        store.remove_key(key)
    checkpoint = context.checkpoints.add(
        gx.Checkpoint(
            name=f"loglake_{suite.name}",
            validation_definitions=[definition],
            actions=actions,
            # BASIC: counts, percentages and up to 10 unexpected values, all that
            # quality_results and Data Docs show (SUMMARY adds value counts: one more Spark
            # job per expectation)
            result_format={"result_format": "BASIC", "partial_unexpected_count": 10},
        )
    )
    result = checkpoint.run(batch_parameters={"dataframe": df}, run_id=run_id)
    return next(iter(result.run_results.values()))


def _actions(
    lake: LakeLocation, quality_dir: Path, quality: QualityConfig, *, build_index: bool = True
) -> list[Any]:
    """loglake's Actions (Data Docs when ``docs``, then ``quality_results``), then the
    users'. ``build_index``: of the Data Docs Action."""
    from pipelines.quality.actions import (  # noqa: PLC0415
        OfflineDataDocsAction,
        QualityResultsAction,
        user_actions,
    )

    actions: list[Any] = []
    if quality.docs:
        actions.append(
            OfflineDataDocsAction(
                name="data_docs",
                site_names=[DOCS_SITE],
                site_dir=str(quality_dir / "data_docs"),
                build_index=build_index,
            )
        )
    actions.append(QualityResultsAction(name="quality_results", table=lake.join(RESULTS_TABLE).uri))
    return actions + user_actions(quality.actions)


def _materialize(df: DataFrame) -> DataFrame:
    """``df`` computed now and kept in the executors' storage, its plan cut there
    (``localCheckpoint``): every later action scans those rows instead of running the joins
    and windows behind them again, and Spark plans each of those actions in no time. (A local
    checkpoint lives as long as its executors: fine for one short run, as here.)"""
    return df.localCheckpoint(eager=True)


def _table(spark: SparkSession, lake: LakeLocation, name: str) -> DataFrame | None:
    where = lake.join(name)
    return read_delta(spark, where.uri) if load_table(where) is not None else None


def _subtables(lake: LakeLocation, parent: str) -> list[str]:
    """The names of the directories below ``<lake>/<parent>`` (none when it is absent)."""
    return ObjectStore(lake).list_dirs(parent)


def _typed_jobs(
    spark: SparkSession, lake: LakeLocation, records: DataFrame, quality: QualityConfig
) -> list[tuple[Any, DataFrame]]:
    """A ``typed_<topic>`` suite per typed table ``tables/<topic>`` (jobs/decode.py)."""
    from pipelines.quality import suites  # noqa: PLC0415

    tables_dir = lake.join("tables")
    dead_letters = _table(spark, lake, "dead_letters")
    jobs: list[tuple[Any, DataFrame]] = []
    for name in _subtables(lake, "tables"):
        table = _table(spark, tables_dir, name)
        if table is None:
            continue
        prefix = f"loglake-decode/{name}/"
        progress = {
            int(app[len(prefix):]): v
            for app, v in read_app_transactions(tables_dir.join(name)).items()
            if app.startswith(prefix) and app[len(prefix):].isdigit()
        }  # fmt: skip
        upsert = "_version" in table.columns
        jobs.append((
            suites.typed_suite(name, quality.max_dead_letter_rate, upsert=upsert),
            typed_check(table, records, dead_letters, name, progress),
        ))  # fmt: skip
    return jobs


def run_quality(
    spark: SparkSession,
    config: IngestConfig,
    quality: QualityConfig,
    *,
    run_id: str | None = None,
    log: Log = log_progress,
) -> QualityReport:
    """One run (see the module docstring). Raises ``LoglakeError`` when it cannot run at all;
    failed expectations are in the report (``success`` False), not raised."""
    lake = LakeLocation.parse(config.lake)
    if lake.is_local:
        quality_dir = lake.local_path / QUALITY_DIR
        return _run(spark, config, quality, lake, quality_dir, run_id=run_id, log=log)
    if load_table(lake.join("records")) is None:  # before copying anything
        raise LoglakeError("no records table: run the ingest job first", path=lake.uri)
    remote = lake.join(QUALITY_DIR)
    with tempfile.TemporaryDirectory(prefix="loglake-quality-") as tmp:
        local = Path(tmp)
        pulled = pull(remote, local)
        log(f"{len(pulled)} files of {remote.uri} copied to {local}")
        report = _run(spark, config, quality, lake, local, run_id=run_id, log=log)
        sent = push(local, remote, pulled)
        log(f"{len(sent)} files uploaded to {remote.uri}")
    if report.docs is not None:
        report.docs = remote.join("data_docs", "index.html").uri
    return report


def _run(
    spark: SparkSession,
    config: IngestConfig,
    quality: QualityConfig,
    lake: LakeLocation,
    quality_dir: Path,
    *,
    run_id: str | None,
    log: Log,
) -> QualityReport:
    """:func:`run_quality` with the tables at ``lake`` and the file context and Data Docs in
    the local directory ``quality_dir``."""
    started = time.monotonic()
    from great_expectations.core.run_identifier import RunIdentifier  # noqa: PLC0415

    from pipelines.quality import suites  # noqa: PLC0415

    log(f"Great Expectations imported in {time.monotonic() - started:.1f} s")
    now = dt.datetime.now(dt.UTC)
    run_id = run_id or f"quality-{now:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"
    report = QualityReport(run_id=run_id)
    records = _table(spark, lake, "records")
    if records is None:
        raise LoglakeError("no records table: run the ingest job first", path=lake.uri)

    # 1. the checked DataFrames (suites need the context to exist first)
    t0 = time.monotonic()
    context = _context(quality_dir, quality.docs)
    actions = _actions(lake, quality_dir, quality)  # the users' are imported now: errors early
    log(f"context at {quality_dir / 'gx'} in {time.monotonic() - t0:.1f} s")
    t0 = time.monotonic()
    bounds = bounds_frame(
        spark,
        partition_bounds(
            config.log_dirs, read_progress(lake.join("records")), topics=config.topics
        ),
    ).cache()
    offset_lookup = _table(spark, lake, "offset_lookup")
    quarantine = _table(spark, lake, "quarantine")
    built = (
        lookup_progress_frame(spark, read_app_transactions(lake.join("offset_lookup")))
        if offset_lookup is not None
        else None
    )
    retention_log = _table(spark, lake, "retention_log")
    # the one pass over records' topic/partition/offset; the gaps are computed from it
    checked = _materialize(records_checked(records, bounds, retention_log, offset_lookup))
    jobs: list[tuple[Any, DataFrame]] = [
        (suites.records_suite(quality), checked),
        (suites.gaps_suite(), offset_gaps(checked, bounds, offset_lookup, quarantine, built)),
    ]
    if offset_lookup is not None:
        jobs.append((suites.lookups_suite(), lookup_agreement(records, offset_lookup)))
    jobs.append(
        (
            suites.quarantine_suite(quality),
            quarantine if quarantine is not None else local_frame(spark, [], "position long"),
        )
    )
    topics_dir = lake.join("topics")
    for name in _subtables(lake, "topics"):
        table = _table(spark, topics_dir, name)
        if table is not None:
            jobs.append(
                (suites.compacted_suite(name), compacted_check(table, records, name))
            )  # fmt: skip
    jobs += _typed_jobs(spark, lake, records, quality)

    # 2. validate. Great Expectations runs several Spark jobs per expectation (its metrics,
    # the unexpected values) over each DataFrame: each is computed once first, and its plan
    # cut there (see _materialize), so that those jobs scan a few in-memory rows, not the
    # plan of joins and windows behind them.
    jobs = [(suite, df if df is checked else _materialize(df)) for suite, df in jobs]
    log(f"tables read, checked rows computed in {time.monotonic() - t0:.1f} s")
    gx_run = RunIdentifier(run_name=run_id, run_time=now)
    # the Data Docs index once, by the last suite's Checkpoint (see actions.OfflineDataDocsAction)
    pages_only = _actions(lake, quality_dir, quality, build_index=False)
    try:
        for suite, df in jobs:
            t0 = time.monotonic()
            last = suite is jobs[-1][0]
            result = _validate(context, suite, df, gx_run, actions if last else pages_only)
            rows = rule_results(suite.name, result)
            report.results += rows
            report.suites[suite.name] = bool(result.success)
            bad = [r.rule for r in rows if not r.success]
            report.failed += [f"{suite.name}.{rule}" for rule in bad]
            log(
                f"suite {suite.name}: {'passed' if result.success else 'FAILED'} "
                f"({len(rows) - len(bad)}/{len(rows)} expectations, "
                f"{time.monotonic() - t0:.1f} s){': ' + ', '.join(bad) if bad else ''}"
            )
    finally:
        for _, df in jobs:
            df.unpersist()
        bounds.unpersist()
    report.success = all(report.suites.values())

    if quality.docs:
        report.docs = str(quality_dir / "data_docs" / "index.html")
        log(f"Data Docs: {report.docs}")
    report.seconds = time.monotonic() - started
    return report
