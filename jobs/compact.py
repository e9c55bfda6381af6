"""spark-submit jobs/compact.py --config conf/pipeline.toml [--lake DIR] [--full] [--topic T]

Merges the records ingested since the last run into <lake>/topics/<topic>, one Delta upsert
table per compacted topic (cleanup.policy=compact in the broker's topic configs, or named in
[compact] topics): one row per live (partition, key), change data feed on, exactly once
(progress rides in the same Delta commit; a re-run is a no-op).

Output: progress lines and a summary on stderr, then the summary as one JSON line, last on
stdout. Exit codes: 0 done; 1 failed (the tables are as they were); 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys

from logstore.errors import LoglakeError
from pipelines.compaction.config import load_compact_config
from pipelines.compaction.table import run_compact
from pipelines.session import get_spark


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="spark-submit jobs/compact.py",
        description=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[2:]),
    )
    parser.add_argument("--config", required=True, help="pipeline TOML, e.g. conf/pipeline.toml")
    parser.add_argument(
        "--log-dirs",
        action="append",
        help="broker log dir (repeatable; read for topic configs only); overrides [paths]",
    )
    parser.add_argument("--lake", help="lake directory holding the tables; overrides [paths] lake")
    parser.add_argument(
        "--full", action="store_true", help="rebuild the tables from all of records"
    )
    parser.add_argument("--topic", action="append", help="compact only this topic (repeatable)")
    args = parser.parse_args(argv)
    try:
        config = load_compact_config(args.config, log_dirs=args.log_dirs, lake=args.lake)
        spark = get_spark(config.app_name, master=config.master, conf=config.spark_conf)
        summary = run_compact(spark, config, full=args.full, topics=args.topic)
    except LoglakeError as exc:
        print(f"compact failed: {exc}", file=sys.stderr)
        return 1
    print(summary.describe(), file=sys.stderr)
    print(json.dumps(summary.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
