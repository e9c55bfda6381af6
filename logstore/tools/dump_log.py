"""``loglake dump-log``: like Kafka's ``kafka-dump-log.sh`` (being built: issue 2)."""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--files", nargs="+", required=True, metavar="F", help="segment files")


def run(args: argparse.Namespace) -> int:
    print("dump-log is not implemented yet", file=sys.stderr)
    return 2
