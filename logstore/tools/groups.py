"""``loglake groups``: consumer groups, as Kafka's ``kafka-consumer-groups.sh``.

::

    loglake groups --list
    loglake groups --describe --group G [--group G2 ...] [--members | --state]
    loglake groups --reset-offsets --group G (--topic T[:P,P...] ... | --all-topics)
                   (--to-earliest | --to-latest | --to-offset N | --shift-by N |
                    --to-datetime YYYY-MM-DDTHH:mm:SS.sss[zone] | --by-duration PnDTnHnMnS |
                    --to-current) [--dry-run | --execute]
    loglake groups --delete --group G [--group G2 ...]

Flags and output as Kafka's tool: ``--describe`` prints ``GROUP TOPIC PARTITION
CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID`` (``-`` where a partition has no
commit or no owner); ``--members`` one line per member with its partition count; ``--state``
the coordinator, assignment strategy, state and member count. ``--reset-offsets`` prints
``GROUP TOPIC PARTITION NEW-OFFSET`` and commits only with ``--execute`` (a dry run is the
default, as in Kafka); like Kafka it refuses a group with live members, clamps offsets into
``[log start, log end]``, resolves ``--to-datetime`` / ``--by-duration`` with ListOffsets by
timestamp (the log end when no record is that recent) and, for ``--all-topics``, resets the
topics the group has committed offsets for. A ``--to-datetime`` without a zone is local time,
as in Kafka.

Everything goes over the Kafka protocol (:class:`~logstore.tools.admin.Admin`: FindCoordinator,
ListGroups, DescribeGroups, OffsetFetch, ListOffsets, OffsetCommit, DeleteGroups), so the tool
works against any Kafka cluster. Exit codes in :data:`EPILOG`.
"""

from __future__ import annotations

import argparse
import datetime
import re
import sys
import time
from typing import Any, Final

from kio.schema.errors import ErrorCode

from logstore.errors import CorruptRecordError, LoglakeError
from logstore.tools.admin import (
    EARLIEST,
    LATEST,
    Admin,
    ToolError,
    add_bootstrap_argument,
    bootstrap_of,
    client_config_of,
    error_name,
    table,
)
from logstore.tools.internal_records import decode_assignment

__all__ = ["EPILOG", "add_arguments", "parse_duration", "parse_topic_partitions", "run"]

EPILOG: Final = (
    "Exit codes: 0 success; 1 the broker refused and may accept later (the group still has"
    " members, its coordinator is loading or moved); 2 bad arguments (a missing or"
    " contradictory option, a bad reset spec, date or duration), an unknown group, topic or"
    " partition, or the broker cannot be reached; 130 interrupted."
)

_INACTIVE: Final = ("Empty", "Dead")
Millis = int  # a timestamp in ms since the epoch (named apart from the exit codes)
_DURATION = re.compile(
    r"^(?P<sign>[-+]?)P(?:(?P<d>[-+]?\d+)D)?"
    r"(?:T(?:(?P<h>[-+]?\d+)H)?(?:(?P<m>[-+]?\d+)M)?(?:(?P<s>[-+]?\d+(?:\.\d{1,9})?)S)?)?$",
    re.IGNORECASE,
)
_RESET_SPECS: Final = (
    "to_earliest",
    "to_latest",
    "to_offset",
    "shift_by",
    "to_datetime",
    "by_duration",
    "to_current",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    add_bootstrap_argument(parser)
    actions = parser.add_mutually_exclusive_group(required=True)
    actions.add_argument("--list", action="store_true", help="list every consumer group")
    actions.add_argument(
        "--describe", action="store_true", help="offsets, lag and owners of --group's partitions"
    )
    actions.add_argument(
        "--reset-offsets", action="store_true", help="set --group's committed offsets"
    )
    actions.add_argument("--delete", action="store_true", help="delete --group (no members)")
    parser.add_argument("--group", action="append", default=[], metavar="G", help="a group")
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument("--members", action="store_true", help="with --describe: the members")
    shape.add_argument("--state", action="store_true", help="with --describe: the group state")
    parser.add_argument(
        "--topic",
        action="append",
        default=[],
        metavar="T[:P,...]",
        help="with --reset-offsets: a topic, or some of its partitions (repeatable)",
    )
    parser.add_argument(
        "--all-topics", action="store_true", help="with --reset-offsets: every committed topic"
    )
    spec = parser.add_mutually_exclusive_group()
    spec.add_argument("--to-earliest", action="store_true", help="the log start offset")
    spec.add_argument("--to-latest", action="store_true", help="the log end offset")
    spec.add_argument("--to-offset", type=int, metavar="N", help="offset N (clamped)")
    spec.add_argument("--shift-by", type=int, metavar="N", help="committed offset + N (clamped)")
    spec.add_argument(
        "--to-datetime",
        metavar="YYYY-MM-DDTHH:mm:SS.sss",
        help="first offset at or after this time (ISO 8601; local time without a zone)",
    )
    spec.add_argument(
        "--by-duration", metavar="PnDTnHnMnS", help="first offset at or after now - duration"
    )
    spec.add_argument("--to-current", action="store_true", help="the committed offset")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the new offsets (default)")
    mode.add_argument("--execute", action="store_true", help="commit the new offsets")


def parse_topic_partitions(item: str) -> tuple[str, list[int] | None]:
    """``t`` -> (t, None: every partition); ``t:0,2`` -> (t, [0, 2]); ToolError otherwise."""
    topic, sep, parts = item.partition(":")
    if not topic:
        raise ToolError(f"--topic {item!r}: no topic name")
    if not sep:
        return topic, None
    try:
        partitions = [int(p) for p in parts.split(",")]
    except ValueError:
        raise ToolError(f"--topic {item!r}: expected TOPIC:PARTITION[,PARTITION...]") from None
    if any(p < 0 for p in partitions):
        raise ToolError(f"--topic {item!r}: partitions are numbers >= 0")
    return topic, partitions


def parse_duration(text: str) -> datetime.timedelta:
    """An ISO 8601 duration as Java's ``Duration.parse`` reads it (``PnDTnHnMnS``)."""
    m = _DURATION.match(text.strip())
    if m is None or not any(m.group(g) for g in ("d", "h", "m", "s")):
        raise ToolError(
            f"--by-duration {text!r}: expected an ISO 8601 duration PnDTnHnMnS (e.g. PT1H30M)"
        )
    delta = datetime.timedelta(
        days=int(m.group("d") or 0),
        hours=int(m.group("h") or 0),
        minutes=int(m.group("m") or 0),
        seconds=float(m.group("s") or 0),
    )
    return -delta if m.group("sign") == "-" else delta


def _parse_datetime(text: str) -> Millis:
    try:
        when = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ToolError(
            f"--to-datetime {text!r}: expected YYYY-MM-DDTHH:mm:SS.sss, optionally with a zone"
            " (Z or +hh:mm)"
        ) from None
    if when.tzinfo is None:
        when = when.astimezone()  # local time, as Kafka's tool
    return int(when.timestamp() * 1000)


def _check(args: argparse.Namespace) -> None:
    """Kafka's argument rules: which options go with which action."""
    if not args.list and not args.group:
        raise ToolError("--group is required with --describe, --reset-offsets and --delete")
    if (args.members or args.state) and not args.describe:
        raise ToolError("--members and --state go with --describe")
    specs = [s for s in _RESET_SPECS if getattr(args, s) not in (None, False)]
    scoped = bool(args.topic or args.all_topics)
    if not args.reset_offsets:
        if specs or scoped or args.execute or args.dry_run:
            raise ToolError(
                "--topic, --all-topics, --to-*, --shift-by, --by-duration, --dry-run and"
                " --execute go with --reset-offsets"
            )
        return
    if not specs:
        raise ToolError(
            "--reset-offsets needs one reset spec: --to-earliest, --to-latest, --to-offset,"
            " --shift-by, --to-datetime, --by-duration or --to-current"
        )
    if args.topic and args.all_topics:
        raise ToolError("--topic and --all-topics exclude each other")
    if not scoped:
        raise ToolError("--reset-offsets needs a scope: --topic T[:P,...] or --all-topics")
    if len(args.group) > 1:
        raise ToolError("--reset-offsets takes one --group")
    for item in args.topic:
        parse_topic_partitions(item)
    if args.by_duration is not None:
        parse_duration(args.by_duration)
    if args.to_datetime is not None:
        _parse_datetime(args.to_datetime)


def run(args: argparse.Namespace) -> int:
    try:
        _check(args)
        with Admin(
            bootstrap_of(args), client_id="loglake-groups", config=client_config_of(args)
        ) as admin:
            if args.list:
                for group, _protocol, _state in admin.list_groups():
                    print(group)
                return 0
            if args.describe:
                for group in args.group:
                    _describe(admin, group, args)
                return 0
            if args.reset_offsets:
                return _reset(admin, args.group[0], args)
            return _delete(admin, args.group)
    except ToolError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1 if exc.retriable else 2
    except LoglakeError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2


# -- describe ---------------------------------------------------------------------------------


def _existing(admin: Admin, group: str) -> Any:
    described = admin.describe_group(group)
    if described.group_state == "Dead":
        raise ToolError(f"Consumer group '{group}' does not exist.")
    return described


def _owners(described: Any) -> dict[tuple[str, int], Any]:
    owners: dict[tuple[str, int], Any] = {}
    if described.protocol_type != "consumer":
        return owners
    for m in described.members:
        try:
            assignment = decode_assignment(bytes(m.member_assignment))
        except (CorruptRecordError, UnicodeDecodeError):
            continue
        for tp in assignment["assignedPartitions"]:
            for p in tp["partitions"]:
                owners[(tp["topic"], p)] = m
    return owners


def _describe(admin: Admin, group: str, args: argparse.Namespace) -> None:
    described = _existing(admin, group)
    print()
    if args.state:
        node = admin.coordinator_id(group)
        print(
            "\n".join(
                table(
                    [
                        ("GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"),
                        (
                            group,
                            node,
                            described.protocol_data or "",
                            described.group_state,
                            len(described.members),
                        ),
                    ]
                )
            )
        )
        return
    owners = _owners(described)
    if args.members:
        if not described.members:
            print(f"Consumer group '{group}' has no active members.")
            return
        counts: dict[str, int] = {}
        for m in owners.values():
            counts[m.member_id] = counts.get(m.member_id, 0) + 1
        rows: list[tuple[object, ...]] = [
            ("GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS")
        ]
        rows += [
            (group, m.member_id, m.client_host, m.client_id, counts.get(m.member_id, 0))
            for m in described.members
        ]
        print("\n".join(table(rows)))
        return
    committed = admin.committed(group)
    partitions = sorted(set(committed) | set(owners))
    ends = admin.list_offsets({tp: LATEST for tp in partitions}) if partitions else {}
    if not described.members:
        print(f"Consumer group '{group}' has no active members.")
        print()
    rows = [
        (
            "GROUP",
            "TOPIC",
            "PARTITION",
            "CURRENT-OFFSET",
            "LOG-END-OFFSET",
            "LAG",
            "CONSUMER-ID",
            "HOST",
            "CLIENT-ID",
        )
    ]
    for tp in partitions:
        current = committed.get(tp)
        end = ends[tp]
        owner = owners.get(tp)
        rows.append(
            (
                group,
                tp[0],
                tp[1],
                "-" if current is None else current,
                end,
                "-" if current is None else max(end - current, 0),
                "-" if owner is None else owner.member_id,
                "-" if owner is None else owner.client_host,
                "-" if owner is None else owner.client_id,
            )
        )
    print("\n".join(table(rows)))


# -- reset ------------------------------------------------------------------------------------


def _scope(admin: Admin, group: str, args: argparse.Namespace) -> list[tuple[str, int]]:
    if args.all_topics:
        return sorted(admin.committed(group))
    wanted = [parse_topic_partitions(item) for item in args.topic]
    known = admin.partitions(t for t, _p in wanted)
    out: set[tuple[str, int]] = set()
    for topic, parts in wanted:
        if parts is None:
            out.update((topic, p) for p in known[topic])
            continue
        for p in parts:
            if p not in known[topic]:
                raise ToolError(f"partition {topic}-{p} does not exist")
            out.add((topic, p))
    return sorted(out)


def _by_time(admin: Admin, scope: list[tuple[str, int]], ts: int) -> dict[tuple[str, int], int]:
    found = admin.list_offsets({tp: ts for tp in scope})
    missing = [tp for tp, offset in found.items() if offset < 0]
    ends = admin.list_offsets({tp: LATEST for tp in missing}) if missing else {}
    return {tp: ends.get(tp, offset) for tp, offset in found.items()}


def _clamped(admin: Admin, wanted: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    lows = admin.list_offsets({tp: EARLIEST for tp in wanted})
    highs = admin.list_offsets({tp: LATEST for tp in wanted})
    out = {}
    for tp, offset in wanted.items():
        clamped = min(max(offset, lows[tp]), highs[tp])
        if clamped != offset:
            bound = "higher than latest" if offset > highs[tp] else "lower than earliest"
            print(
                f"New offset ({offset}) is {bound} offset for topic partition {tp[0]}-{tp[1]}."
                f" Value will be set to {clamped}",
                file=sys.stderr,
            )
        out[tp] = clamped
    return out


def _new_offsets(
    admin: Admin, group: str, scope: list[tuple[str, int]], args: argparse.Namespace
) -> dict[tuple[str, int], int]:
    if args.to_earliest:
        return admin.list_offsets({tp: EARLIEST for tp in scope})
    if args.to_latest:
        return admin.list_offsets({tp: LATEST for tp in scope})
    if args.to_offset is not None:
        return _clamped(admin, {tp: args.to_offset for tp in scope})
    if args.to_datetime is not None:
        return _by_time(admin, scope, _parse_datetime(args.to_datetime))
    if args.by_duration is not None:
        ago = parse_duration(args.by_duration)
        return _by_time(admin, scope, int(time.time() * 1000 - ago.total_seconds() * 1000))
    committed = admin.committed(group)
    if args.shift_by is not None:
        without = [tp for tp in scope if tp not in committed]
        if without:
            tp = without[0]
            raise ToolError(
                f"Cannot shift offset for partition {tp[0]}-{tp[1]} since there is no current"
                " committed offset"
            )
        return _clamped(admin, {tp: committed[tp] + args.shift_by for tp in scope})
    # --to-current: the committed offset; the log end where there is none (as Kafka)
    ends = admin.list_offsets({tp: LATEST for tp in scope if tp not in committed})
    return {tp: committed.get(tp, ends.get(tp, -1)) for tp in scope}


def _reset(admin: Admin, group: str, args: argparse.Namespace) -> int:
    state = admin.describe_group(group).group_state
    if state not in _INACTIVE:
        raise ToolError(
            f"Assignments can only be reset if the group '{group}' is inactive, but the current"
            f" state is {state}.",
            retriable=True,
        )
    scope = _scope(admin, group, args)
    if not scope:
        raise ToolError(f"no partition to reset: group '{group}' has no committed offsets")
    offsets = _new_offsets(admin, group, scope, args)
    if args.execute:
        admin.commit(group, offsets)
    elif not args.dry_run:  # Kafka's warning when neither --dry-run nor --execute is given
        print(
            "WARN: No action will be performed as the --execute option is missing. Add"
            " --dry-run to say a dry run is meant, or --execute to commit the new offsets.",
            file=sys.stderr,
        )
    print()
    rows: list[tuple[object, ...]] = [("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET")]
    rows += [(group, tp[0], tp[1], offsets[tp]) for tp in sorted(offsets)]
    print("\n".join(table(rows)))
    return 0


# -- delete -----------------------------------------------------------------------------------


def _delete(admin: Admin, groups: list[str]) -> int:
    failed: dict[str, ErrorCode] = {}
    for group in groups:
        code = admin.delete_group(group)
        if code != ErrorCode.none:
            failed[group] = code
    done = [g for g in groups if g not in failed]
    if done:
        names = ", ".join(f"'{g}'" for g in done)
        print(f"Deletion of requested consumer groups ({names}) was successful.")
    if not failed:
        return 0
    lines = [
        f"* Group '{g}' could not be deleted due to: {error_name(c)}" for g, c in failed.items()
    ]
    print("Error: Deletion of some consumer groups failed:\n" + "\n".join(lines), file=sys.stderr)
    usage = {ErrorCode.group_id_not_found, ErrorCode.invalid_group_id}
    return 2 if all(c in usage for c in failed.values()) else 1
