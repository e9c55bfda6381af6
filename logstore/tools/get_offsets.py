"""``loglake get-offsets``: partitions' offsets by time, as ``kafka-get-offsets.sh``.

::

    loglake get-offsets [--topic REGEX] [--partitions 0,1] [--time T] [--exclude-internal-topics]

``--time``: ``-1``/``latest`` (log end offset, the default), ``-2``/``earliest`` (log start
offset), ``-3``/``max-timestamp`` (the record with the largest timestamp), or a timestamp in
ms (the first offset whose timestamp is at or after it). ``--topic`` is a regular expression
matched against whole topic names (every topic without it); internal topics are included
unless ``--exclude-internal-topics``. Output, Kafka's: ``topic:partition:offset`` per line,
sorted by ``topic-partition``; a partition with no offset for that time (every record older)
prints no line, as in Kafka; a partition whose leader answers with an error prints
``Skip getting offsets for topic-partition t-0 due to error: ...`` on stderr. ListOffsets
goes to each partition's leader.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Final

from kio.schema.errors import ErrorCode

from logstore.errors import LoglakeError
from logstore.tools.admin import (
    EARLIEST,
    LATEST,
    MAX_TIMESTAMP,
    Admin,
    ToolError,
    add_bootstrap_argument,
    bootstrap_of,
    client_config_of,
    error_name,
)

__all__ = ["EPILOG", "add_arguments", "parse_time", "run"]

EPILOG: Final = (
    "Exit codes: 0 offsets printed (partitions with no offset for --time print no line);"
    " 1 a partition's leader answered with an error (printed on stderr); 2 bad arguments (a"
    " malformed --time, --partitions or --topic regex), no topic-partition matching the"
    " filters, or the broker cannot be reached; 130 interrupted."
)

_NAMED: Final = {"latest": LATEST, "earliest": EARLIEST, "max-timestamp": MAX_TIMESTAMP}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    add_bootstrap_argument(parser)
    parser.add_argument("--topic", metavar="REGEX", help="topics to query (default: every one)")
    parser.add_argument("--partitions", metavar="P,P", help="partition ids (default: every one)")
    parser.add_argument(
        "--time",
        default="latest",
        metavar="T",
        help="-1 or latest, -2 or earliest, -3 or max-timestamp, or a timestamp in ms",
    )
    parser.add_argument(
        "--exclude-internal-topics", action="store_true", help="leave out internal topics"
    )


def parse_time(text: str) -> int:
    """ListOffsets' timestamp for ``--time``; ToolError when malformed."""
    if text in _NAMED:
        return _NAMED[text]
    try:
        value = int(text)
    except ValueError:
        value = -9
    if value < MAX_TIMESTAMP:
        raise ToolError(
            f"Malformed time argument {text}. Please use -1 or latest / -2 or earliest / -3 or"
            " max-timestamp, or a timestamp in ms (>= 0)"
        )
    return value


def run(args: argparse.Namespace) -> int:
    try:
        timestamp = parse_time(args.time)
        wanted: set[int] | None = None
        if args.partitions:
            try:
                wanted = {int(p) for p in args.partitions.split(",")}
            except ValueError:
                raise ToolError(
                    "--partitions expects a comma separated list of numeric partition ids, but"
                    f" received: {args.partitions}"
                ) from None
        try:
            pattern = re.compile(args.topic or ".*")
        except re.error as exc:
            raise ToolError(f"--topic {args.topic!r}: not a regular expression: {exc}") from None
        with Admin(
            bootstrap_of(args), client_id="loglake-get-offsets", config=client_config_of(args)
        ) as admin:
            md = admin.metadata(None)
            spec = {
                (str(t.name), int(p.partition_index)): timestamp
                for t in md.topics
                if pattern.fullmatch(str(t.name))
                and not (args.exclude_internal_topics and t.is_internal)
                for p in t.partitions
                if wanted is None or int(p.partition_index) in wanted
            }
            if not spec:
                raise ToolError("Could not match any topic-partitions with the specified filters")
            results = admin.list_offsets_results(spec)
        code = 0
        for (topic, part), (error, offset) in sorted(
            results.items(), key=lambda kv: f"{kv[0][0]}-{kv[0][1]}"
        ):
            if error != ErrorCode.none:
                print(
                    f"Skip getting offsets for topic-partition {topic}-{part} due to error:"
                    f" {error_name(error)}",
                    file=sys.stderr,
                )
                code = 1
            elif offset >= 0:
                print(f"{topic}:{part}:{offset}")
        return code
    except ToolError as exc:
        print(f"Error occurred: {exc}", file=sys.stderr)
        return 1 if exc.retriable else 2
    except LoglakeError as exc:
        print(f"Error occurred: {exc}", file=sys.stderr)
        return 2
