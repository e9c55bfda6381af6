"""``loglake configs``: describe and alter topic and broker configs, as ``kafka-configs.sh``.

::

    loglake configs --describe --entity-type topics|brokers --entity-name X [--all]
    loglake configs --alter --entity-type topics|brokers --entity-name X
                    [--add-config k1=v1,k2=[v1,v2]] [--delete-config k1,k2]

``--topic T`` and ``--broker N`` are Kafka's shorthands for the entity options;
``--entity-default`` with brokers names the cluster-wide broker default (resource name "").
``--describe`` uses DescribeConfigs (with synonyms) and prints Kafka's lines::

    Dynamic configs for topic t are:
      retention.ms=1000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=1000, ...}

(``--all``: every config, "All configs for ..."). ``--alter`` sends one
IncrementalAlterConfigs request (SET for ``--add-config``, DELETE for ``--delete-config``);
the keys and values are checked by the broker, not here, so Kafka's own keys go through as
Kafka accepts them and a refusal comes back with the broker's message. ``--add-config`` is
split as Kafka splits it: on commas outside square brackets, ``[a,b]`` giving the value
``a,b``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Final

from logstore.errors import LoglakeError
from logstore.tools.admin import (
    RESOURCE_BROKER,
    RESOURCE_TOPIC,
    Admin,
    ToolError,
    add_bootstrap_argument,
    bootstrap_of,
    client_config_of,
)

__all__ = ["EPILOG", "add_arguments", "parse_add_config", "run"]

EPILOG: Final = (
    "Exit codes: 0 success; 1 the broker refused for a reason that may pass; 2 bad arguments"
    " (a missing entity, a malformed --add-config), a config the broker refuses"
    " (INVALID_CONFIG, with its message), an unknown topic or broker, or the broker cannot be"
    " reached; 130 interrupted."
)

# Kafka's ConfigSource ids -> names (DescribeConfigs' config_source)
_SOURCES: Final = {
    0: "UNKNOWN_CONFIG",
    1: "DYNAMIC_TOPIC_CONFIG",
    2: "DYNAMIC_BROKER_CONFIG",
    3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
    4: "STATIC_BROKER_CONFIG",
    5: "DEFAULT_CONFIG",
    6: "DYNAMIC_BROKER_LOGGER_CONFIG",
    7: "CLIENT_METRICS_CONFIG",
    8: "GROUP_CONFIG",
}
_DYNAMIC: Final = {"topics": {1}, "brokers": {2, 3}}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    add_bootstrap_argument(parser)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--describe", action="store_true", help="list the entity's configs")
    action.add_argument("--alter", action="store_true", help="set or delete configs")
    parser.add_argument("--entity-type", choices=("topics", "brokers"), help="the entity kind")
    parser.add_argument("--entity-name", metavar="NAME", help="topic name or broker id")
    parser.add_argument(
        "--entity-default", action="store_true", help="with brokers: the cluster-wide default"
    )
    parser.add_argument("--topic", metavar="T", help="= --entity-type topics --entity-name T")
    parser.add_argument("--broker", metavar="N", help="= --entity-type brokers --entity-name N")
    parser.add_argument(
        "--all", action="store_true", help="with --describe: every config, not only overrides"
    )
    parser.add_argument(
        "--add-config", metavar="K=V,K2=[V1,V2]", help="configs to set (comma-separated)"
    )
    parser.add_argument("--delete-config", metavar="K,K2", help="configs to remove")


def parse_add_config(text: str) -> dict[str, str]:
    """``k1=v1,k2=[a,b]`` -> ``{"k1": "v1", "k2": "a,b"}``; ToolError when malformed."""
    items: list[str] = []
    depth = 0
    current = ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
    items.append(current)
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or depth != 0:
            raise ToolError(
                f"--add-config {text!r}: all configs to be added must be in the format"
                ' "key=val" or "key=[val1,val2]"'
            )
        value = value.strip()
        if value.startswith("[") and value.endswith("]"):
            value = value[1:-1]
        out[key.strip()] = value
    return out


def _entity(args: argparse.Namespace) -> tuple[str, str]:
    """(entity type, resource name) from the entity options and the shorthands."""
    kind, name = args.entity_type, args.entity_name
    if args.topic is not None or args.broker is not None:
        if kind is not None or name is not None or (args.topic and args.broker):
            raise ToolError("--topic/--broker replace --entity-type and --entity-name")
        kind, name = ("topics", args.topic) if args.topic is not None else ("brokers", args.broker)
    if kind is None:
        raise ToolError("--entity-type topics|brokers is required (or --topic / --broker)")
    if args.entity_default:
        if kind != "brokers" or name is not None:
            raise ToolError("--entity-default goes with --entity-type brokers, without a name")
        return kind, ""
    if not name:
        raise ToolError(f"--entity-name is required with --entity-type {kind}")
    if kind == "brokers" and not name.isdigit():
        raise ToolError(f"the entity name for brokers must be a broker id, got {name!r}")
    return kind, name


def _label(kind: str, name: str) -> str:
    if kind == "brokers" and name == "":
        return "the default broker"
    return f"{kind[:-1]} {name}"


def _line(c: Any) -> str:
    value = None if c.is_sensitive else c.value
    synonyms = ", ".join(
        f"{_SOURCES.get(int(s.source), s.source)}:{s.name}={s.value}" for s in c.synonyms
    )
    return (
        f"  {c.name}={value} sensitive={str(bool(c.is_sensitive)).lower()} synonyms={{{synonyms}}}"
    )


def run(args: argparse.Namespace) -> int:
    try:
        kind, name = _entity(args)
        resource = RESOURCE_TOPIC if kind == "topics" else RESOURCE_BROKER
        to_set: dict[str, str] = {}
        to_delete: list[str] = []
        if args.describe and (args.add_config or args.delete_config):
            raise ToolError("--add-config and --delete-config go with --alter")
        if args.alter:
            if not args.add_config and not args.delete_config:
                raise ToolError("--alter needs --add-config and/or --delete-config")
            to_set = parse_add_config(args.add_config) if args.add_config else {}
            to_delete = [k.strip() for k in (args.delete_config or "").split(",") if k.strip()]
            both = sorted(set(to_set) & set(to_delete))
            if both:
                raise ToolError(f"configs both added and deleted: {', '.join(both)}")
        with Admin(
            bootstrap_of(args), client_id="loglake-configs", config=client_config_of(args)
        ) as admin:
            if args.describe:
                _describe(admin, resource, kind, name, every=bool(args.all))
                return 0
            admin.alter_configs(resource, name, set_=to_set, delete=to_delete)
        if kind == "brokers" and name == "":
            print("Completed updating default config for brokers in the cluster.")
        else:
            print(f"Completed updating config for {_label(kind, name)}.")
        return 0
    except ToolError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1 if exc.retriable else 2
    except LoglakeError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2


def _describe(admin: Admin, resource: int, kind: str, name: str, *, every: bool) -> None:
    result = admin.describe_configs(resource, name)
    configs = sorted(result.configs, key=lambda c: c.name)
    if not every:
        configs = [c for c in configs if int(c.config_source) in _DYNAMIC[kind]]
    if kind == "brokers" and name == "":
        print("Default configs for brokers in the cluster are:")
    else:
        print(f"{'All' if every else 'Dynamic'} configs for {_label(kind, name)} are:")
    for c in configs:
        print(_line(c))
