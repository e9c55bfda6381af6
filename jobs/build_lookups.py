"""spark-submit jobs/build_lookups.py --config conf/pipeline.toml [--log-dirs DIR] [--lake DIR]

Appends the batches written since the last run to <lake>/offset_lookup and <lake>/time_lookup
(incremental, exactly once per table: progress rides in each table's commit) and checks the
broker's .index/.timeindex files against the data. Topics: [ingest] topics (empty: every
topic but Kafka's internal ones).

No log dirs ([paths] log_dirs = [], no --log-dirs) with [ingest] bootstrap_servers (or
--bootstrap-server): the batches are read through Fetch from that cluster, into the same rows
but for what only a file has (segment and position -1, file kafka://<bootstrap>/<topic>-<n>:
pipelines/lookups.py); the index check is not done (it reads the broker's index files) and
the run says so on stderr; a topic the cluster does not have exits 2. With [paths]
remote_log_storage (or --remote-log-storage) too, what the cluster's tier holds is read from
the object store (segment and position real, file the segment's .log object), the rest
through Fetch; with log dirs the tier is not read.

Output: the summary as one JSON line on stdout; index problems, one per line, on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys

from pipelines.config import check_log_dirs, check_topics, job_parser, option_type
from pipelines.exit_codes import EXIT_INDEX_MISMATCH, EXIT_OK, EXIT_USAGE
from pipelines.jobrun import job_spark, run_job

EXIT_CODES = {
    EXIT_USAGE: "or a topic of [ingest] topics in none of the log dirs (nothing written; "
    "--allow-missing-topics: a warning on stderr instead)",
    EXIT_INDEX_MISMATCH: "index files disagree with the data (the tables are still written; "
    "the problems are listed on stderr)",
}


def main(argv: list[str] | None = None) -> int:
    parser = job_parser(
        "spark-submit jobs/build_lookups.py", __doc__ or "", topics=True, exit_codes=EXIT_CODES
    )
    parser.add_argument("--no-check", action="store_true", help="skip the index consistency check")
    parser.add_argument(
        "--bootstrap-server",
        metavar="HOST:PORT",
        type=option_type("ingest", "bootstrap_servers"),
        help="without log dirs (no --log-dirs, [paths] log_dirs = []) read the batches through "
        "Fetch from this broker; overrides [ingest] bootstrap_servers",
    )
    parser.add_argument(
        "--remote-log-storage",
        metavar="URI",
        type=option_type("paths", "remote_log_storage"),
        help="the cluster's tiered storage, s3://bucket/prefix: without log dirs, the batches "
        "it holds are read from it on the executors, the rest through Fetch; overrides [paths] "
        "remote_log_storage",
    )
    args = parser.parse_args(argv)
    return run_job("build_lookups", args.config, lambda: _build_lookups(args))


def _build_lookups(args: argparse.Namespace) -> int:
    # Imported once the arguments and the config are checked: --help and their errors load
    # no pyspark, deltalake or numba (tests/unit/pipelines/test_job_imports.py).
    from pipelines.ingest import load_config  # noqa: PLC0415
    from pipelines.lookups import build_lookups  # noqa: PLC0415

    config = load_config(
        args.config,
        log_dirs=args.log_dirs,
        lake=args.lake,
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
        "loglake-build-lookups",
        master=config.master,
        spark_conf=config.spark_conf,
        verbose=args.verbose,
    )
    summary = build_lookups(
        spark,
        log_dirs=config.log_dirs,
        lake=config.lake,
        topics=config.topics,
        max_partition_bytes=config.max_partition_bytes,
        check=not args.no_check,
        bootstrap_servers=config.bootstrap_servers,
        kafka=config.kafka,
        remote_log_storage=config.remote_log_storage,
    )
    for p in summary.index_problems:
        print(
            f"{p.file}: {p.kind} entry {p.entry} (offset {p.offset}): {p.problem}", file=sys.stderr
        )
    print(json.dumps({"rows": summary.rows, "progress": summary.progress,
                      "index_problems": len(summary.index_problems)}))  # fmt: skip
    return EXIT_INDEX_MISMATCH if summary.index_problems else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
