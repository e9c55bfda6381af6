"""spark-submit jobs/quality.py --config conf/pipeline.toml [--log-dirs DIR] [--lake DIR]

Runs the Great Expectations suites over the lake's tables (records, offset gaps, lookups,
quarantine, compacted topic tables), one GX Checkpoint per suite, whose Actions build Data Docs
at <lake>/_quality/data_docs/index.html (rendering offline: their CSS/JS are in the site),
append one row per expectation to <lake>/quality_results, then run your own Actions
([quality] actions). Thresholds and actions: [quality] in the config file.

Output: one line per suite on stderr, then a JSON summary as the last line on stdout.
Exit codes: 0 every expectation held; 1 failed (could not run); 2 bad arguments, or a topic of
[ingest] topics in none of the log dirs (nothing checked; --allow-missing-topics: a warning on
stderr instead); 5 at least one expectation failed (listed on stderr and in the summary's
"failed").
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from logstore.errors import LoglakeError
from pipelines.config import EXIT_MISSING_TOPICS, MissingTopicsError, check_topics, job_parser


def _import_great_expectations() -> None:
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations  # noqa: F401, PLC0415

    import pipelines.quality.suites  # noqa: F401, PLC0415


def main(argv: list[str] | None = None) -> int:
    parser = job_parser("spark-submit jobs/quality.py", __doc__ or "", topics=True)
    parser.add_argument("--run-id", help="id of this run in quality_results (default: generated)")
    args = parser.parse_args(argv)
    # Imported once the arguments are parsed: --help and argument errors load no pyspark,
    # deltalake or numba (tests/unit/pipelines/test_job_imports.py).
    from pipelines.ingest import load_config  # noqa: PLC0415
    from pipelines.quality import load_quality_config, run_quality  # noqa: PLC0415
    from pipelines.quality.run import log_progress  # noqa: PLC0415
    from pipelines.session import get_spark, spark_conf  # noqa: PLC0415

    try:
        config = load_config(args.config, log_dirs=args.log_dirs, lake=args.lake)
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
        spark = get_spark(
            "loglake-quality",
            master=config.master,
            conf=spark_conf(config.spark_conf, verbose=args.verbose),
            delta_reader=False,
        )
        log_progress(f"Spark session in {time.monotonic() - started:.1f} s")
        preload.join()
        report = run_quality(spark, config, quality, run_id=args.run_id)
    except MissingTopicsError as exc:
        print(f"quality failed: {exc}", file=sys.stderr)
        return EXIT_MISSING_TOPICS
    except LoglakeError as exc:
        print(f"quality failed: {exc}", file=sys.stderr)
        return 1
    if not report.success:
        print(f"quality: expectations failed: {', '.join(report.failed)}", file=sys.stderr)
    print(json.dumps(report.to_json()))
    return 0 if report.success else 5


if __name__ == "__main__":
    sys.exit(main())
