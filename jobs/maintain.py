"""python jobs/maintain.py --config conf/pipeline.toml [--lake DIR] [--table NAME ...]
[--vacuum-hours H] [--zorder] [--no-records-retention] [--dry-run]

Table retention and maintenance of the lake, with delta-rs (no Spark session needed).

First records retention ([retention] records: "forever" keeps everything; "topic" mirrors
each topic's retention.ms, from the log dirs' topic configs or, with log_dirs = [], from
[ingest] bootstrap_servers (DescribeConfigs); an age such as "30d"): whole date partitions
of <lake>/records past it are deleted in one commit, logged in <lake>/retention_log. Then,
for every Delta table under the lake (or each --table): optimize (compaction; z-order by
offset with --zorder or [retention] zorder; rows deleted by deletion vectors stay deleted),
vacuum of files unreferenced for longer than --vacuum-hours ([retention] vacuum_hours,
default 168; deletion vector files under dv/ and change-data files included, live ones
never), a checkpoint and clean-up of expired log entries. Safe while an ingest runs:
conflicting commits are retried, then reported.

--dry-run lists what each step would do and changes nothing (no commit, no file removed,
nothing appended to retention_log): the partitions records retention would delete (topic,
partition, offsets, rows), per table the data files optimize would rewrite, the files vacuum
would remove, and the version a checkpoint would be written at.

Output: a summary on stderr (with --dry-run: the listing), then the summary as one JSON line,
last on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from pipelines.config import check_log_dirs, job_parser, option_type
from pipelines.exit_codes import EXIT_FAILED, EXIT_OK
from pipelines.jobrun import run_job

EXIT_CODES = {EXIT_FAILED: 'or a step reported errors (listed in "errors")'}


def _stderr(message: str) -> None:
    print(f"[maintain {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = job_parser(
        "python jobs/maintain.py", __doc__ or "", spark=False, exit_codes=EXIT_CODES
    )
    parser.add_argument("--broker-config", help="broker.properties (for records = topic)")
    parser.add_argument("--table", action="append", help="maintain only this table (repeatable)")
    parser.add_argument(
        "--vacuum-hours",
        type=option_type("retention", "vacuum_hours"),
        help="overrides [retention] vacuum_hours",
    )
    parser.add_argument("--zorder", action="store_true", default=None, help="z-order by offset")
    parser.add_argument(
        "--no-records-retention", action="store_true", help="skip the records retention step"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="list what each step would do, change nothing"
    )
    args = parser.parse_args(argv)
    return run_job("maintain", args.config, lambda: _maintain(args))


def _maintain(args: argparse.Namespace) -> int:
    # Imported once the arguments and the config are checked: --help and their errors load
    # no pyspark, deltalake or numba (tests/unit/pipelines/test_job_imports.py).
    from pipelines.maintenance.job import run_maintenance  # noqa: PLC0415
    from pipelines.retention.job import load_retention_config  # noqa: PLC0415

    config = load_retention_config(
        args.config, log_dirs=args.log_dirs, lake=args.lake, broker_config=args.broker_config
    )
    if config.records_retention == "topic" and not args.no_records_retention:  # reads them
        check_log_dirs(config.log_dirs, from_command_line=bool(args.log_dirs), config=args.config)
    if args.vacuum_hours is not None:
        config = dataclasses.replace(config, vacuum_hours=args.vacuum_hours)
    if args.zorder:
        config = dataclasses.replace(config, zorder=True)
    summary = run_maintenance(
        config,
        tables=args.table,
        records=not args.no_records_retention,
        log=_stderr,
        dry_run=args.dry_run,
    )
    print(summary.describe(), file=sys.stderr)
    print(json.dumps(summary.to_json(), default=str))
    return EXIT_FAILED if summary.errors else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
