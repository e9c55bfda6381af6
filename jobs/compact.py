"""spark-submit jobs/compact.py --config conf/pipeline.toml [--lake DIR] [--full] [--log]

Merges the records ingested since the last run into <lake>/topics/<topic>, one Delta upsert
table per compacted topic (cleanup.policy=compact in the broker's topic configs, or named in
[compact] topics): one row per live (partition, key), change data feed on, exactly once
(progress rides in the same Delta commit; a re-run is a no-op). With --log it compacts the
broker's log itself instead (Kafka's cleaner semantics, pipelines.compaction.log): every due
partition of those topics gets its cleanable segments rewritten by a Spark task and swapped
in, by the running broker or, with none running, by this job under the log dir's .lock.
Due as Kafka's cleaner decides (pipelines.compaction.due): dirty ratio >=
min.cleanable.dirty.ratio, or the first dirty batch older than max.compaction.lag.ms, each
topic's own configs over the broker config's defaults (--broker-config, else [retention]
broker_config, else conf/broker.properties); a partition not due is skipped and reported
(--force cleans it); log.cleaner.enable=false in the broker config: nothing is cleaned.

No log dirs ([paths] log_dirs = [], no --log-dirs): the topic configs come from [ingest]
bootstrap_servers through the Kafka protocol (Metadata, DescribeConfigs; [kafka] says how to
connect), and the tables are the same; --log needs the log dirs (exit 2 without them).

Output: progress lines and a summary on stderr, then the summary as one JSON line, last on
stdout (with --log: one line per cleaned partition, then a JSON list of results).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import TYPE_CHECKING, Any

from logstore.errors import InvalidConfigError
from pipelines.config import check_log_dirs, check_topics, job_parser
from pipelines.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from pipelines.jobrun import job_spark, run_job

if TYPE_CHECKING:
    from pipelines.compaction.config import CompactConfig
    from pipelines.compaction.due import CleanerDefaults

EXIT_CODES = {
    EXIT_OK: "with --log, a partition whose swap the broker rejected is reported, not an "
    "error: the next run redoes it",
    EXIT_FAILED: "the tables are as they were",
    EXIT_USAGE: "or a topic of [compact] topics, [compact.strategy] or --topic in none "
    "of the log dirs (without them: not on [ingest] bootstrap_servers) nor in records "
    "(checked when log dirs or bootstrap servers are configured; nothing done; "
    "--allow-missing-topics: a warning on stderr instead); or --log without log dirs",
}


def main(argv: list[str] | None = None) -> int:
    parser = job_parser(
        "spark-submit jobs/compact.py",
        __doc__ or "",
        log_dirs_help="broker log dir (repeatable; read for topic configs only); overrides [paths]",
        topics=True,
        exit_codes=EXIT_CODES,
    )
    parser.add_argument(
        "--full", action="store_true", help="rebuild the tables from all of records"
    )
    parser.add_argument("--topic", action="append", help="compact only this topic (repeatable)")
    parser.add_argument(
        "--log", action="store_true", help="compact the broker's log segments, not the tables"
    )
    parser.add_argument(
        "--force", action="store_true", help="with --log: clean partitions not yet due"
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="with --log: seconds to wait for the broker"
    )
    parser.add_argument(
        "--broker-config",
        help="with --log: broker.properties with the cleaner defaults (log.cleaner.*); "
        "default: [retention] broker_config, else conf/broker.properties",
    )
    args = parser.parse_args(argv)
    return run_job("compact", args.config, lambda: _compact(args))


def _compact(args: argparse.Namespace) -> int:
    # Imported once the arguments and the config are checked: --help and their errors load
    # no pyspark, deltalake or numba (tests/unit/pipelines/test_job_imports.py).
    from pipelines.compaction.config import load_compact_config  # noqa: PLC0415
    from pipelines.compaction.table import run_compact  # noqa: PLC0415

    config = load_compact_config(args.config, log_dirs=args.log_dirs, lake=args.lake)
    check_log_dirs(config.log_dirs, from_command_line=bool(args.log_dirs), config=args.config)
    if args.log and not config.log_dirs:
        raise InvalidConfigError(
            "compact --log rewrites the broker's segment files: it needs the log dirs "
            "([paths] log_dirs or --log-dirs); without them only the tables are built"
        )
    if config.log_dirs or config.bootstrap_servers:
        present = ingested_topics(config.records_path)
        if not config.log_dirs:  # the cluster's topics, through the Kafka protocol
            from pipelines.sources.fetch import cluster_topics  # noqa: PLC0415

            present |= set(cluster_topics(config.bootstrap_servers, config=config.kafka))
        check_topics(
            {"[compact] topics": config.topics, "[compact.strategy]": config.strategies,
             "--topic": args.topic or ()},
            config.log_dirs,
            allow_missing=args.allow_missing_topics,
            also_present=present,
        )  # fmt: skip
    defaults = None
    if args.log:
        from pipelines.compaction.due import (  # noqa: PLC0415
            broker_config_path,
            load_cleaner_defaults,
        )

        defaults = load_cleaner_defaults(broker_config_path(args.config, args.broker_config))
        if not defaults.enabled:
            print("compact --log: log.cleaner.enable=false: nothing cleaned", file=sys.stderr)
            print("[]")
            return EXIT_OK
    spark = job_spark(
        config.app_name, master=config.master, spark_conf=config.spark_conf, verbose=args.verbose
    )
    if args.log:
        return _compact_log(spark, config, args, defaults)
    summary = run_compact(spark, config, full=args.full, topics=args.topic)
    print(summary.describe(), file=sys.stderr)
    print(json.dumps(summary.to_json()))
    return EXIT_OK


def ingested_topics(records_path: str) -> set[str]:
    """The topics with ingest progress in ``records`` (the tables are built from it)."""
    from pipelines.delta.commit import load_table  # noqa: PLC0415
    from pipelines.ingest import read_progress  # noqa: PLC0415

    if load_table(records_path) is None:  # a local path or an object-store URI
        return set()
    return {topic for topic, _ in read_progress(records_path)}


def _compact_log(
    spark: Any, config: CompactConfig, args: argparse.Namespace, defaults: CleanerDefaults | None
) -> int:
    from pipelines.compaction.config import compacted_topics  # noqa: PLC0415
    from pipelines.compaction.log import run_log_compaction  # noqa: PLC0415

    results = run_log_compaction(
        spark,
        list(config.log_dirs),
        topics=args.topic or list(config.topics),
        force=args.force,
        strategies=compacted_topics(config),
        hand_over_timeout_s=args.timeout,
        defaults=defaults,
    )
    for r in results:
        if r.groups:
            print(
                f"{r.dir}: {r.records_in} -> {r.records_out} records, {r.bytes_in} -> "
                f"{r.bytes_out} bytes, {r.note}",
                file=sys.stderr,
            )
        elif not r.due:
            print(f"{r.dir}: skipped, not due ({r.reason})", file=sys.stderr)
    print(json.dumps([dataclasses.asdict(r) for r in results]))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
