"""spark-submit jobs/ingest.py --config conf/pipeline.toml [--log-dirs DIR] [--lake DIR]

Appends new records from the broker's log directories to <lake>/records, exactly once per
offset (progress rides in the same Delta commit).

Damage in a segment (a CRC mismatch, an impossible batchLength, torn bytes below the high
watermark) never ends the read: the unreadable bytes go to <lake>/quarantine (file, position,
size, error), reading resumes at the next sound batch, and progress moves past them. Each
such run is printed on stderr as "SKIPPED topic/partition: offsets [a, b) ... N bytes at
position P of FILE" and listed in the summary ("skipped", with the totals "skipped_offsets"
and "skipped_bytes"); the run still exits 0.

Output: progress lines and a summary on stderr (spark-submit merges them into stdout), then
the summary as one JSON line, last on stdout. Exit codes: 0 done (check skipped_offsets:
damaged offsets were skipped and quarantined); 1 failed (nothing half-committed); 2 bad
arguments; 3 damaged batches found with --fail-on-corrupt (they are in <lake>/quarantine,
nothing is committed, progress is not moved).
"""

from __future__ import annotations

import argparse
import json
import sys

from logstore.errors import CorruptRecordError, LoglakeError
from pipelines.ingest import load_config, run_ingest
from pipelines.session import get_spark, spark_conf


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="spark-submit jobs/ingest.py",
        description=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[2:]),
    )
    parser.add_argument("--config", required=True, help="pipeline TOML, e.g. conf/pipeline.toml")
    parser.add_argument(
        "--log-dirs",
        action="append",
        help="broker log dir (repeatable); overrides [paths] log_dirs",
    )
    parser.add_argument("--lake", help="lake directory holding the tables; overrides [paths] lake")
    parser.add_argument(
        "--fail-on-corrupt",
        action="store_true",
        default=None,
        help="exit 3 when damaged batches are found (they are quarantined, nothing is "
        "committed); without it they are skipped, reported and the run exits 0",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="Spark's own INFO log lines on stderr too"
    )
    args = parser.parse_args(argv)
    try:
        config = load_config(
            args.config,
            log_dirs=args.log_dirs,
            lake=args.lake,
            fail_on_corrupt=args.fail_on_corrupt,
        )
        spark = get_spark(
            config.app_name,
            master=config.master,
            conf=spark_conf(config.spark_conf, verbose=args.verbose),
        )
        summary = run_ingest(spark, config)
    except CorruptRecordError as exc:
        print(f"ingest failed: {exc}", file=sys.stderr)
        return 3
    except LoglakeError as exc:
        print(f"ingest failed: {exc}", file=sys.stderr)
        return 1
    print(summary.describe(), file=sys.stderr)
    print(json.dumps(summary.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
