"""``loglake delete-records``: advance partitions' log start offsets, as
``kafka-delete-records.sh``.

::

    loglake delete-records --offset-json-file F

``F`` is Kafka's JSON: ``{"partitions": [{"topic": "t", "partition": 0, "offset": 3}, ...],
"version": 1}``; ``offset`` -1 means the high watermark. The whole file is checked before
any request (valid JSON, version 1, each entry a topic string, a partition >= 0 and an
offset >= -1, no topic-partition twice), so a bad file deletes nothing. One DeleteRecords
request per partition leader; the output is Kafka's::

    Executing records delete operation
    Records delete operation completed:
    partition: t-0	low_watermark: 3
    partition: t-1	error: OFFSET_OUT_OF_RANGE
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Final

from kio.schema.errors import ErrorCode

from logstore.errors import LoglakeError
from logstore.tools.admin import (
    Admin,
    ToolError,
    add_bootstrap_argument,
    bootstrap_of,
    client_config_of,
    error_name,
    raise_for,
)

__all__ = ["EPILOG", "add_arguments", "parse_offset_json", "run"]

EPILOG: Final = (
    "Exit codes: 0 every partition's records deleted; 1 a partition failed for a reason that"
    " may pass (e.g. NOT_LEADER_OR_FOLLOWER); 2 bad arguments, an unreadable or invalid JSON"
    " file (nothing is deleted), an unknown topic or partition, an offset above the high"
    " watermark (OFFSET_OUT_OF_RANGE), or the broker cannot be reached; 130 interrupted."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    add_bootstrap_argument(parser)
    parser.add_argument(
        "--offset-json-file",
        required=True,
        metavar="F",
        help='{"partitions": [{"topic": "t", "partition": 0, "offset": 3}], "version": 1}',
    )


def parse_offset_json(
    text: str, *, source: str = "--offset-json-file"
) -> dict[tuple[str, int], int]:
    """``{(topic, partition): offset}`` from Kafka's JSON; ToolError naming what is wrong."""
    try:
        doc: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ToolError(f"{source}: not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("partitions"), list):
        raise ToolError(f'{source}: expected {{"partitions": [...], "version": 1}}')
    version = doc.get("version", 1)
    if version != 1:
        raise ToolError(f"{source}: unsupported version {version!r} (expected 1)")
    out: dict[tuple[str, int], int] = {}
    for i, entry in enumerate(doc["partitions"]):
        where = f"{source}: partitions[{i}]"
        if not isinstance(entry, dict):
            raise ToolError(f"{where}: expected an object with topic, partition and offset")
        topic, part, offset = entry.get("topic"), entry.get("partition"), entry.get("offset")
        if not isinstance(topic, str) or not topic:
            raise ToolError(f"{where}: 'topic' must be a non-empty string, got {topic!r}")
        if isinstance(part, bool) or not isinstance(part, int) or part < 0:
            raise ToolError(f"{where}: 'partition' must be an integer >= 0, got {part!r}")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < -1:
            raise ToolError(
                f"{where}: 'offset' must be an integer >= 0 (or -1: the high watermark),"
                f" got {offset!r}"
            )
        if (topic, part) in out:
            raise ToolError(f"{source}: contains duplicate topic partitions: {topic}-{part}")
        out[(topic, part)] = offset
    if not out:
        raise ToolError(f"{source}: no partitions")
    return out


def run(args: argparse.Namespace) -> int:
    try:
        path = Path(args.offset_json_file)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ToolError(f"cannot read {path}: {exc.strerror or exc}") from None
        offsets = parse_offset_json(text, source=str(path))
        with Admin(
            bootstrap_of(args), client_id="loglake-delete-records", config=client_config_of(args)
        ) as admin:
            print("Executing records delete operation")
            results = admin.delete_records(offsets)
        print("Records delete operation completed:")
        worst = 0
        for (topic, part), (error, low) in sorted(results.items()):
            if error == ErrorCode.none:
                print(f"partition: {topic}-{part}\tlow_watermark: {low}")
                continue
            print(f"partition: {topic}-{part}\terror: {error_name(error)}")
            try:
                raise_for(error, f"{topic}-{part}")
            except ToolError as exc:
                worst = max(worst, 1 if exc.retriable else 2)
        return worst
    except ToolError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1 if exc.retriable else 2
    except LoglakeError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
