"""The ``loglake`` command line: one subcommand per tool.

Each subcommand lives in its own module and exposes ``add_arguments(parser)`` and
``run(args) -> int``; this module only wires them together, so ``loglake --help`` lists
exactly what is installed. The operators' tools follow Kafka's scripts (``kafka-topics.sh``,
``kafka-consumer-groups.sh``, ``kafka-configs.sh``, ``kafka-acls.sh``, ``kafka-delete-records.sh``,
``kafka-get-offsets.sh``, ``kafka-dump-log.sh``): the same flags, the same output, and only
the Kafka protocol, so they work against Apache Kafka too. ``--bootstrap-server`` is accepted
before the subcommand as well as after it, and so is ``--command-config`` (Kafka's
client properties: TLS, SASL); ``loglake --version`` prints the version.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from logstore import __version__
from logstore.tools.admin import add_bootstrap_argument

__all__ = ["main"]

# name -> (module, one-line help)
_COMMANDS: dict[str, tuple[str, str]] = {
    "broker": (
        "logstore.server.cli",
        "run the Kafka-protocol broker (Kafka's server.properties key names)",
    ),
    "topics": (
        "logstore.tools.topics",
        "create, list, describe, alter and delete topics over the Kafka protocol (kafka-topics)",
    ),
    "groups": (
        "logstore.tools.groups",
        "list, describe, reset the offsets of and delete consumer groups (kafka-consumer-groups)",
    ),
    "configs": (
        "logstore.tools.configs",
        "describe and alter topic and broker configs (kafka-configs)",
    ),
    "acls": (
        "logstore.tools.acls",
        "add, remove and list ACLs over the Kafka protocol (kafka-acls)",
    ),
    "delete-records": (
        "logstore.tools.delete_records",
        "advance partitions' log start offsets from Kafka's offset JSON (kafka-delete-records)",
    ),
    "get-offsets": (
        "logstore.tools.get_offsets",
        "partitions' earliest, latest or by-timestamp offsets (kafka-get-offsets)",
    ),
    "users": (
        "logstore.tools.users",
        "add, delete and describe users' SCRAM credentials (kafka-configs --entity-type users)",
    ),
    "dump-log": (
        "logstore.tools.dump_log",
        "print the batches, records, index entries and producer snapshots of Kafka log files",
    ),
    # Lives in pipelines/ (Arrow, delta-rs); its module imports only the standard library, the
    # engine is loaded when the subcommand runs.
    "sql": (
        "pipelines.sqlcli",
        "SQL over the lake's Delta tables (delta-rs/DataFusion, no Spark); a prompt if no query",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loglake",
        description="loglake: a Kafka-compatible broker and a Spark-native log lakehouse.",
    )
    parser.add_argument("--version", action="version", version=f"loglake {__version__}")
    add_bootstrap_argument(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in _COMMANDS.items():
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args._run(args)
    except BrokenPipeError:  # `loglake dump-log ... | head`
        code = 0
    except KeyboardInterrupt:
        code = 130
    return code


if __name__ == "__main__":
    sys.exit(main())
