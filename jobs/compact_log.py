"""spark-submit jobs/compact_log.py --log-dirs DIR [--topic T] [--force] [--master M]

Compacts the broker's log itself (Kafka's cleaner semantics, pipelines.compaction.log): every
due partition of a compacted topic (cleanup.policy contains compact in its topic config, or
named with --topic) gets its cleanable segments rewritten by a Spark task and swapped in, by
the running broker or, with none, by this job under the log dir's .lock. To be wired as
`jobs/compact.py --log` when both halves of compaction are merged.

Output: one line per cleaned partition on stderr, then a JSON list of results on stdout.
Exit codes: 0 done (a partition whose swap the broker rejected is reported, not an error: the
next run redoes it); 1 failed; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from logstore.errors import LoglakeError
from pipelines.compaction.log import run_log_compaction
from pipelines.session import get_spark, spark_conf


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="spark-submit jobs/compact_log.py",
        description=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[2:]),
    )
    parser.add_argument("--log-dirs", action="append", required=True, help="broker log dir")
    parser.add_argument("--topic", action="append", default=[], help="also compact this topic")
    parser.add_argument("--force", action="store_true", help="clean partitions not yet due")
    parser.add_argument("--master", help="Spark master (default: spark-defaults)")
    parser.add_argument("--timeout", type=float, default=30.0, help="wait for the broker (s)")
    parser.add_argument("--verbose", action="store_true", help="Spark's INFO lines too")
    args = parser.parse_args(argv)
    try:
        spark = get_spark(
            "loglake-compact-log", master=args.master, conf=spark_conf({}, verbose=args.verbose)
        )
        results = run_log_compaction(
            spark,
            args.log_dirs,
            topics=args.topic,
            force=args.force,
            hand_over_timeout_s=args.timeout,
        )
    except LoglakeError as exc:
        print(f"log compaction failed: {exc}", file=sys.stderr)
        return 1
    for r in results:
        if r.groups:
            print(
                f"{r.dir}: {r.records_in} -> {r.records_out} records, {r.bytes_in} -> "
                f"{r.bytes_out} bytes, {r.note}",
                file=sys.stderr,
            )
    print(json.dumps([dataclasses.asdict(r) for r in results]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
