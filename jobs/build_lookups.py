"""spark-submit jobs/build_lookups.py --config conf/pipeline.toml [--log-dirs DIR] [--lake DIR]

Appends the batches written since the last run to <lake>/offset_lookup and <lake>/time_lookup
(incremental, exactly once per table: progress rides in each table's commit) and checks the
broker's .index/.timeindex files against the data. Topics: [ingest] topics (empty: every
topic but Kafka's internal ones). Exit codes: 0 done (summary as one JSON line on stdout), 1
failed, 2 bad arguments, or a topic of [ingest] topics in none of the log dirs (nothing
written; --allow-missing-topics: a warning on stderr instead), 4 index files disagree with the
data (the tables are still written; the problems are listed on stderr).
"""

from __future__ import annotations

import json
import sys

from logstore.errors import LoglakeError
from pipelines.config import EXIT_MISSING_TOPICS, MissingTopicsError, check_topics, job_parser


def main(argv: list[str] | None = None) -> int:
    parser = job_parser("spark-submit jobs/build_lookups.py", __doc__ or "", topics=True)
    parser.add_argument("--no-check", action="store_true", help="skip the index consistency check")
    args = parser.parse_args(argv)
    # Imported once the arguments are parsed: --help and argument errors load no pyspark,
    # deltalake or numba (tests/unit/pipelines/test_job_imports.py).
    from pipelines.ingest import load_config  # noqa: PLC0415
    from pipelines.lookups import build_lookups  # noqa: PLC0415
    from pipelines.session import get_spark, spark_conf  # noqa: PLC0415

    try:
        config = load_config(args.config, log_dirs=args.log_dirs, lake=args.lake)
        check_topics(
            {"[ingest] topics": config.topics or ()},
            config.log_dirs,
            allow_missing=args.allow_missing_topics,
        )
        spark = get_spark(
            "loglake-build-lookups",
            master=config.master,
            conf=spark_conf(config.spark_conf, verbose=args.verbose),
            delta_reader=False,
        )
        summary = build_lookups(
            spark,
            log_dirs=config.log_dirs,
            lake=config.lake,
            topics=config.topics,
            max_partition_bytes=config.max_partition_bytes,
            check=not args.no_check,
        )
    except MissingTopicsError as exc:
        print(f"build_lookups failed: {exc}", file=sys.stderr)
        return EXIT_MISSING_TOPICS
    except LoglakeError as exc:
        print(f"build_lookups failed: {exc}", file=sys.stderr)
        return 1
    for p in summary.index_problems:
        print(
            f"{p.file}: {p.kind} entry {p.entry} (offset {p.offset}): {p.problem}", file=sys.stderr
        )
    print(json.dumps({"rows": summary.rows, "progress": summary.progress,
                      "index_problems": len(summary.index_problems)}))  # fmt: skip
    return 4 if summary.index_problems else 0


if __name__ == "__main__":
    sys.exit(main())
