"""The ``loglake`` command line: one subcommand per tool.

Each subcommand lives in its own module and exposes ``add_arguments(parser)`` and
``run(args) -> int``; this module only wires them together, so ``loglake --help`` lists
exactly what is installed.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]

# name -> (module, one-line help)
_COMMANDS: dict[str, tuple[str, str]] = {
    "broker": (
        "logstore.server.cli",
        "run the Kafka-protocol broker (Kafka's server.properties key names)",
    ),
    "topics": (
        "logstore.tools.topics",
        "create, list, describe and delete topics over the Kafka protocol",
    ),
    "dump-log": (
        "logstore.tools.dump_log",
        "print the batches, records and index entries of Kafka segment files",
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
