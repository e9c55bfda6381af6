"""spark-submit jobs/decode.py --config conf/pipeline.toml [--lake DIR] [--topic T]

Decodes the records ingested since the last run into typed tables, <lake>/tables/<topic>: one
column per field of the topic's value schema (Avro, Protobuf or JSON Schema, from the
Confluent-compatible registry at [decode] schema_registry_url), _key when the key has a
schema, and _kafka (partition, offset, timestamp, timestamp type, key bytes, headers, schema
ids). Records that do not decode go to <lake>/dead_letters ([decode] on_error). Exactly once:
progress rides in the tables' commits; a re-run is a no-op.

Topics: [decode] topics, [decode.subject] and [decode.cdc] (or --topic); none named: every
ingested topic whose subject <topic>-value the registry holds. A schema that adds fields adds
nullable columns (Delta schema evolution); older records decode into the newest shape.

Output: a summary on stderr, then the summary as one JSON line, last on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys

from pipelines.config import job_parser
from pipelines.exit_codes import EXIT_CORRUPT, EXIT_FAILED, EXIT_OK, EXIT_USAGE
from pipelines.jobrun import job_spark, run_job

EXIT_CODES = {
    EXIT_FAILED: "or the registry did not answer; the tables are as they were",
    EXIT_USAGE: (
        "or a topic whose subject the registry does not hold, or a table whose column types no "
        "version of the subject keeps (types are never widened: README, Typed tables)"
    ),
    EXIT_CORRUPT: 'records did not decode under [decode] on_error = "fail" (nothing committed)',
}


def main(argv: list[str] | None = None) -> int:
    parser = job_parser(
        "spark-submit jobs/decode.py",
        __doc__ or "",
        exit_codes=EXIT_CODES,
        log_dirs_help="broker log dir (repeatable; unused by decode); overrides [paths]",
    )
    parser.add_argument("--topic", action="append", help="decode only this topic (repeatable)")
    parser.add_argument(
        "--schema-registry-url", help="the registry; overrides [decode] schema_registry_url"
    )
    args = parser.parse_args(argv)
    return run_job("decode", args.config, lambda: _decode(args))


def _decode(args: argparse.Namespace) -> int:
    # Imported once the arguments and the config are checked: --help and their errors load
    # no pyspark or deltalake (tests/unit/pipelines/test_job_imports.py).
    from pipelines.typed.config import load_decode_config  # noqa: PLC0415
    from pipelines.typed.job import run_decode  # noqa: PLC0415

    config = load_decode_config(
        args.config, log_dirs=args.log_dirs, lake=args.lake, registry_url=args.schema_registry_url
    )
    if not config.registry_url:
        # no registry, nothing to decode: no Spark session either (the DAG runs decode always)
        print("decode: [decode] schema_registry_url is not set: nothing to decode", file=sys.stderr)
        print(json.dumps({"topics": []}))
        return EXIT_OK
    spark = job_spark(
        config.app_name, master=config.master, spark_conf=config.spark_conf, verbose=args.verbose
    )
    summary = run_decode(
        spark, config, topics=args.topic, log=lambda m: print(m, file=sys.stderr, flush=True)
    )
    print(summary.describe(), file=sys.stderr)
    print(json.dumps(summary.to_json()))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
