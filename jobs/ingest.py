"""spark-submit jobs/ingest.py --config conf/pipeline.toml [--log-dirs DIR] [--lake DIR]

Appends new records from the broker's log directories to <lake>/records, exactly once per
offset (progress rides in the same Delta commit).

Damage in a segment (a CRC mismatch, an impossible batchLength, torn bytes below the high
watermark) never ends the read: the unreadable bytes go to <lake>/quarantine (file, position,
size, error), reading resumes at the next sound batch, and progress moves past them. Each
such run is printed on stderr as "SKIPPED topic/partition: offsets [a, b) ... N bytes at
position P of FILE" and listed in the summary ("skipped", with the totals "skipped_offsets"
and "skipped_bytes"); the run still exits 0.

Transactions ([ingest] isolation): by default as a READ_COMMITTED consumer — records of
aborted transactions are left out and each partition stops at its last stable offset (the
first offset of a transaction still open); the summary counts "aborted_transactions" and
"open_transactions" and lists the partitions "held_at_lso". "read_uncommitted" takes every
record below the high watermark.

Output: progress lines and a summary on stderr (spark-submit merges them into stdout), then
the summary as one JSON line, last on stdout.

The lake group: with --bootstrap-server (or [ingest] bootstrap_servers) the next offset to
ingest of every partition the run reads is committed, after the Delta commit, to the consumer
group [ingest] lake_group (default loglake-ingest): Kafka tools show the lake's lag, and a
broker with log.retention.lake.group set to it keeps what the lake has not ingested from its
time/size retention. A broker that cannot be reached is one line on stderr, never a failed
run; the summary's "lake_group_partitions" says how many partitions were committed (null:
none). The connection uses [kafka] (Kafka's client properties: TLS, SASL PLAIN/SCRAM); a
refused login is such a line too.

Missing topics: a topic of [ingest] topics that is in none of the log dirs exits 2, nothing
ingested; with --allow-missing-topics it is a warning on stderr and the others are ingested.

No log dirs (no --log-dirs, [paths] log_dirs = []) with --bootstrap-server: everything is
read through Fetch from that cluster (any Kafka cluster; pipelines/sources/fetch_ingest.py),
into the same table with the same exactly-once progress; a topic it does not have exits 2.
With --remote-log-storage s3://bucket/prefix too, what the cluster has tiered (KIP-405) is read
from the bucket on the executors, the live segments learnt from __remote_log_metadata; an
object missing or the store unreachable fails the run (exit 1), nothing committed.
"""

from __future__ import annotations

import argparse
import json
import sys

from pipelines.config import ON_DIVERGENCE, check_log_dirs, check_topics, job_parser, option_type
from pipelines.exit_codes import EXIT_CORRUPT, EXIT_DIVERGED, EXIT_OK, EXIT_USAGE
from pipelines.jobrun import job_spark, run_job

EXIT_CODES = {
    EXIT_OK: "check skipped_offsets: damaged offsets were skipped and quarantined",
    EXIT_USAGE: "or a topic of [ingest] topics in none of the log dirs (below)",
    EXIT_CORRUPT: "they are in <lake>/quarantine, nothing is committed, progress is not moved",
    EXIT_DIVERGED: "a partition's log was truncated below, or rewritten under, offsets already "
    "ingested; nothing is ingested: restore the log or re-run with --on-divergence=rewind",
}


def main(argv: list[str] | None = None) -> int:
    parser = job_parser(
        "spark-submit jobs/ingest.py", __doc__ or "", topics=True, exit_codes=EXIT_CODES
    )
    parser.add_argument(
        "--fail-on-corrupt",
        action="store_true",
        default=None,
        help="exit 3 when damaged batches are found (they are quarantined, nothing is "
        "committed); without it they are skipped, reported and the run exits 0",
    )
    parser.add_argument(
        "--on-divergence",
        choices=ON_DIVERGENCE,
        help="a log that went backwards under the lake: fail (exit 4, the default) or rewind "
        "(move the lake's rows from the first differing offset to <lake>/diverged and ingest "
        "what the log holds now, in one commit); overrides [ingest] on_divergence",
    )
    parser.add_argument(
        "--bootstrap-server",
        metavar="HOST:PORT",
        type=option_type("ingest", "bootstrap_servers"),
        help="commit the lake's progress to the consumer group [ingest] lake_group on this "
        "broker after the run (never fails the run); without log dirs (no --log-dirs, "
        "[paths] log_dirs = []) read everything through Fetch from it; overrides [ingest] "
        "bootstrap_servers",
    )
    parser.add_argument(
        "--remote-log-storage",
        metavar="URI",
        type=option_type("paths", "remote_log_storage"),
        help="the cluster's tiered storage, s3://bucket/prefix (the Aiven plugin's layout, "
        "credentials from the AWS environment / [storage]): offsets it holds are read from "
        "it on the executors, the rest through Fetch (no log dirs) or, with log dirs, from "
        "them (the tier then reads only what is below their log start); needs "
        "--bootstrap-server; overrides [paths] remote_log_storage",
    )
    args = parser.parse_args(argv)
    return run_job("ingest", args.config, lambda: _ingest(args))


def _ingest(args: argparse.Namespace) -> int:
    # Imported once the arguments and the config are checked: --help and their errors load
    # no pyspark, deltalake or numba (tests/unit/pipelines/test_job_imports.py).
    from pipelines.ingest import load_config, run_ingest  # noqa: PLC0415

    config = load_config(
        args.config,
        log_dirs=args.log_dirs,
        lake=args.lake,
        fail_on_corrupt=args.fail_on_corrupt,
        on_divergence=args.on_divergence,
        bootstrap_servers=args.bootstrap_server,
        remote_log_storage=args.remote_log_storage,
    )
    check_log_dirs(config.log_dirs, from_command_line=bool(args.log_dirs), config=args.config)
    if config.log_dirs:  # without log dirs the Fetch plan refuses a missing topic (exit 2)
        check_topics(
            {"[ingest] topics": config.topics or ()},
            config.log_dirs,
            allow_missing=args.allow_missing_topics,
        )
    spark = job_spark(
        config.app_name, master=config.master, spark_conf=config.spark_conf, verbose=args.verbose
    )
    summary = run_ingest(spark, config)
    print(summary.describe(), file=sys.stderr)
    print(json.dumps(summary.to_json()))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
