"""spark-submit jobs/quality.py --config conf/pipeline.toml [--log-dirs DIR] [--lake DIR]

Runs the Great Expectations suites over the lake's tables (records, offset gaps, lookups,
quarantine, compacted topic tables), builds Data Docs at <lake>/_quality/data_docs/index.html
and appends one row per expectation to <lake>/quality_results. Thresholds: [quality] in the
config file.

Output: one line per suite on stderr, then a JSON summary as the last line on stdout.
Exit codes: 0 every expectation held; 1 failed (could not run); 2 bad arguments; 5 at least
one expectation failed (listed on stderr and in the summary's "failed").
"""

from __future__ import annotations

import argparse
import json
import sys

from logstore.errors import LoglakeError
from pipelines.ingest import load_config
from pipelines.quality import load_quality_config, run_quality
from pipelines.session import get_spark


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="spark-submit jobs/quality.py",
        description=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[2:]),
    )
    parser.add_argument("--config", required=True, help="pipeline TOML, e.g. conf/pipeline.toml")
    parser.add_argument("--log-dirs", action="append", help="broker log dir (repeatable)")
    parser.add_argument("--lake", help="lake directory holding the tables")
    parser.add_argument("--run-id", help="id of this run in quality_results (default: generated)")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config, log_dirs=args.log_dirs, lake=args.lake)
        quality = load_quality_config(args.config)
        spark = get_spark("loglake-quality", master=config.master, conf=config.spark_conf)
        report = run_quality(spark, config, quality, run_id=args.run_id)
    except LoglakeError as exc:
        print(f"quality failed: {exc}", file=sys.stderr)
        return 1
    if not report.success:
        print(f"quality: expectations failed: {', '.join(report.failed)}", file=sys.stderr)
    print(json.dumps(report.to_json()))
    return 0 if report.success else 5


if __name__ == "__main__":
    sys.exit(main())
