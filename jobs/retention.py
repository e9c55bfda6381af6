"""spark-submit jobs/retention.py --config conf/pipeline.toml [--bootstrap-server HOST:PORT]
[--dry-run] [--force] [--log-dirs DIR] [--lake DIR] [--broker-config FILE]

Kafka's log retention over every partition of the log dirs, planned on the Spark executors
from the segment files (sizes, time index tails): retention.ms against each segment's largest
timestamp (the .log file's mtime when it has none), retention.bytes, segments below the log
start offset; never the active segment; topic configs (<log_dir>/topic-configs) over the
broker defaults (--broker-config, [retention] broker_config, else conf/broker.properties);
cleanup.policy=compact alone gets no time or size retention, compact,delete does.

Lake-aware: a segment of an ingested topic ([ingest] topics, or every topic not starting with
"__") goes only once every record in it is committed to <lake>/records; the others are held
and counted (held_segments). --force deletes them anyway (the next ingest reports the gap).
Topics that are not ingested get Kafka's retention alone.

Deletion: with --bootstrap-server through Kafka's DeleteRecords on the running broker
(connecting with [kafka]: Kafka's client properties, TLS and SASL PLAIN/SCRAM; a refused login
exits 2); without it directly on the log dirs under their .lock (refused while a broker holds
it). --dry-run
prints the plan as a table and deletes nothing. What went is appended to <lake>/retention_log.
Online, [retention] delete_records_chunk partitions go per DeleteRecords request (default
1000). Before deleting, the run journals its intended rows in <lake>/_retention_pending/; a run
killed midway leaves it there and the next run logs what the dead one removed (counted in
"settled_segments") before planning, so each removed segment has exactly one row.

No log dirs ([paths] log_dirs = [], no --log-dirs: a cluster without the broker's disk): the
log side is the broker's own retention (lake-bounded with log.retention.lake.group), as in
Kafka; the run says so on stderr, plans and deletes nothing, starts no Spark and exits 0
(summary mode "broker"). The table side, jobs/maintain.py, needs no log dirs. Executors that
cannot see a log dir the driver sees: exit 2 at once ("the executors cannot see log dir ...").

Output: the plan as a table on stdout (dry run), a summary on stderr, then the summary as one
JSON line, last on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING

from pipelines.config import check_log_dirs, check_topics, job_parser, option_type
from pipelines.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from pipelines.jobrun import job_spark, run_job

if TYPE_CHECKING:
    from pipelines.retention.plan import PartitionPlan

EXIT_CODES = {
    EXIT_FAILED: 'or some partitions could not be trimmed (listed in "errors")',
    EXIT_USAGE: "or a topic of [ingest] topics in none of the log dirs (nothing "
    "deleted; --allow-missing-topics: a warning on stderr instead), or executors that cannot "
    "see a log dir the driver sees (no shared disk: set log_dirs = [])",
}


def _stderr(message: str) -> None:
    print(f"[retention {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = job_parser(
        "spark-submit jobs/retention.py", __doc__ or "", topics=True, exit_codes=EXIT_CODES
    )
    parser.add_argument(
        "--broker-config",
        help="broker.properties giving the default retention (log.retention.*); overrides "
        "[retention] broker_config; default conf/broker.properties",
    )
    parser.add_argument(
        "--bootstrap-server",
        metavar="HOST:PORT",
        type=option_type("ingest", "bootstrap_servers"),
        help="delete through this running broker (DeleteRecords); without it: offline",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the plan, delete nothing")
    parser.add_argument(
        "--force", action="store_true", help="also delete segments not yet in the lake"
    )
    args = parser.parse_args(argv)
    return run_job("retention", args.config, lambda: _retention(args))


def _retention(args: argparse.Namespace) -> int:
    # Imported once the arguments and the config are checked: --help and their errors load
    # no pyspark, deltalake or numba (tests/unit/pipelines/test_job_imports.py).
    from pipelines.retention.job import (  # noqa: PLC0415
        format_plan,
        load_retention_config,
        run_retention,
    )

    config = load_retention_config(
        args.config, log_dirs=args.log_dirs, lake=args.lake, broker_config=args.broker_config
    )
    check_log_dirs(config.log_dirs, from_command_line=bool(args.log_dirs), config=args.config)
    spark = None
    if config.log_dirs:  # without any: the broker's own retention, no Spark (run_retention)
        check_topics(
            {"[ingest] topics": config.ingest_topics or ()},
            config.log_dirs,
            allow_missing=args.allow_missing_topics,
        )
        spark = job_spark(
            config.app_name,
            master=config.master,
            spark_conf=config.spark_conf,
            verbose=args.verbose,
        )
    plans: list[PartitionPlan] = []
    summary = run_retention(
        spark,
        config,
        bootstrap=args.bootstrap_server,
        dry_run=args.dry_run,
        force=args.force,
        log=_stderr,
        plan_out=plans,
    )
    if args.dry_run:
        print(format_plan(plans))
    print(summary.describe(), file=sys.stderr)
    for error in summary.errors:
        print(f"not trimmed: {error}", file=sys.stderr)
    print(json.dumps(summary.to_json()))
    return EXIT_FAILED if summary.errors else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
