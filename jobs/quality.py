"""spark-submit jobs/quality.py --config conf/pipeline.toml [--log-dirs DIR] [--lake DIR]

Runs the Great Expectations suites over the lake's tables (records, offset gaps, lookups,
quarantine, compacted topic tables), one GX Checkpoint per suite, whose Actions build Data Docs
at <lake>/_quality/data_docs/index.html (rendering offline: their CSS/JS are in the site),
append one row per expectation to <lake>/quality_results, then run your own Actions
([quality] actions). Thresholds and actions: [quality] in the config file.

Output: one line per suite on stderr, then a JSON summary as the last line on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

from pipelines.config import check_log_dirs, check_topics, job_parser
from pipelines.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_QUALITY, EXIT_USAGE
from pipelines.jobrun import job_spark, run_job

EXIT_CODES = {
    EXIT_OK: "every expectation held",
    EXIT_FAILED: "the suites could not run",
    EXIT_USAGE: "or a topic of [ingest] topics in none of the log dirs (nothing "
    "checked; --allow-missing-topics: a warning on stderr instead)",
    EXIT_QUALITY: "at least one expectation failed (listed on stderr and in the summary's "
    '"failed")',
}


def _import_great_expectations() -> None:
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations  # noqa: F401, PLC0415

    import pipelines.quality.suites  # noqa: F401, PLC0415


def main(argv: list[str] | None = None) -> int:
    parser = job_parser(
        "spark-submit jobs/quality.py", __doc__ or "", topics=True, exit_codes=EXIT_CODES
    )
    parser.add_argument("--run-id", help="id of this run in quality_results (default: generated)")
    args = parser.parse_args(argv)
    return run_job("quality", args.config, lambda: _quality(args))


def _quality(args: argparse.Namespace) -> int:
    # Imported once the arguments and the config are checked: --help and their errors load
    # no pyspark, deltalake or numba (tests/unit/pipelines/test_job_imports.py).
    from pipelines.ingest import load_config  # noqa: PLC0415
    from pipelines.quality import load_quality_config, run_quality  # noqa: PLC0415
    from pipelines.quality.run import log_progress  # noqa: PLC0415

    config = load_config(args.config, log_dirs=args.log_dirs, lake=args.lake)
    check_log_dirs(config.log_dirs, from_command_line=bool(args.log_dirs), config=args.config)
    quality = load_quality_config(args.config)
    check_topics(
        {"[ingest] topics": config.topics or ()},
        config.log_dirs,
        allow_missing=args.allow_missing_topics,
    )
    # Great Expectations takes seconds to import: meanwhile Spark starts its session
    # (waiting on the JVM, GIL released); the import is done before the run needs it.
    preload = threading.Thread(target=_import_great_expectations, daemon=True)
    preload.start()
    started = time.monotonic()
    spark = job_spark(
        "loglake-quality", master=config.master, spark_conf=config.spark_conf, verbose=args.verbose
    )
    log_progress(f"Spark session in {time.monotonic() - started:.1f} s")
    preload.join()
    report = run_quality(spark, config, quality, run_id=args.run_id)
    if not report.success:
        print(f"quality: expectations failed: {', '.join(report.failed)}", file=sys.stderr)
    print(json.dumps(report.to_json()))
    return EXIT_OK if report.success else EXIT_QUALITY


if __name__ == "__main__":
    sys.exit(main())
