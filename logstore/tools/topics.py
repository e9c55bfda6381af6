"""``loglake topics create|list|describe|delete`` over the Kafka protocol.

Like Kafka's ``kafka-topics.sh``, it talks to a broker (``--bootstrap-server``, default
``127.0.0.1:9092``) with CreateTopics, Metadata, DescribeConfigs and DeleteTopics, so it
works against loglake and against any Kafka broker::

    loglake topics create NAME [--partitions N] [--config key=value ...] [--if-not-exists]
    loglake topics list
    loglake topics describe [NAME ...] [--if-exists]
    loglake topics alter NAME [--partitions N] [--config key=value ...] [--delete-config key ...]
                         [--if-exists]
    loglake topics delete NAME [NAME ...] [--if-exists]

As in Kafka's script, ``--if-not-exists`` makes creating an existing topic a silent success
and ``--if-exists`` makes naming a missing topic one; ``--bootstrap-server`` goes anywhere on
the line. ``alter`` adds partitions (CreatePartitions: a count only grows) and sets or removes
config overrides (IncrementalAlterConfigs; the broker validates them, as for
``loglake configs --alter``).

Exit codes: 0 success, 1 a broker-side error (its Kafka error name is printed), 2 usage or
connection problems; ``alter`` exits 2 also for a config or partition count the broker
refuses as invalid. Requests go through :class:`KafkaConnection`, a minimal blocking client
on kio's codecs (one request in flight, correlation ids checked).
"""

from __future__ import annotations

import argparse
import datetime
import sys
from typing import Any

from kio.schema.create_topics.v7.request import (
    CreatableTopic,
    CreatableTopicConfig,
    CreateTopicsRequest,
)
from kio.schema.delete_topics.v6.request import DeleteTopicsRequest, DeleteTopicState
from kio.schema.describe_configs.v4.request import (
    DescribeConfigsRequest,
    DescribeConfigsResource,
)
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.types import TopicName
from kio.static.primitive import i8, i16, i32

from logstore.errors import LoglakeError
from logstore.tools.admin import (
    RESOURCE_TOPIC,
    Admin,
    ToolError,
    add_bootstrap_argument,
    bootstrap_of,
    client_config_of,
)
from logstore.tools.connection import KafkaConnection

__all__ = ["KafkaConnection", "add_arguments", "run"]

_TIMEOUT: Any = datetime.timedelta(seconds=30)
_RESOURCE_TOPIC = i8(2)
_SOURCE_DYNAMIC_TOPIC = 1


EPILOG = (
    "Exit codes: 0 success; 1 a broker-side error (its Kafka error name is printed, e.g."
    " TOPIC_ALREADY_EXISTS, UNKNOWN_TOPIC_OR_PARTITION); 2 bad arguments (a --config item"
    " without '=', a --bootstrap-server that is not host:port), for alter a config or"
    " partition count the broker refuses as invalid or an unknown topic, or the broker cannot"
    " be reached or broke the connection; 130 interrupted."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    add_bootstrap_argument(parser)
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = sub.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=-1, help="default: num.partitions")
    create.add_argument(
        "--config", action="append", default=[], metavar="KEY=VALUE", help="topic config"
    )
    create.add_argument(
        "--if-not-exists", action="store_true", help="succeed quietly if the topic exists"
    )
    listing = sub.add_parser("list", help="list topics")
    describe = sub.add_parser("describe", help="partitions and config overrides")
    describe.add_argument("names", nargs="*", help="default: every topic")
    alter = sub.add_parser("alter", help="add partitions, set or remove config overrides")
    alter.add_argument("name")
    alter.add_argument("--partitions", type=int, metavar="N", help="the new partition count")
    alter.add_argument(
        "--config", action="append", default=[], metavar="KEY=VALUE", help="set a config"
    )
    alter.add_argument(
        "--delete-config", action="append", default=[], metavar="KEY", help="remove an override"
    )
    delete = sub.add_parser("delete", help="delete topics")
    delete.add_argument("names", nargs="+")
    for p in (describe, alter, delete):
        p.add_argument(
            "--if-exists", action="store_true", help="succeed quietly for a missing topic"
        )
    for p in (create, listing, describe, alter, delete):
        add_bootstrap_argument(p)


def _configs(items: list[str]) -> dict[str, str] | None:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"loglake topics: --config {item!r}: expected key=value", file=sys.stderr)
            return None
        out[key.strip()] = value.strip()
    return out


def _metadata(conn: KafkaConnection, names: list[str] | None) -> Any:
    topics = (
        None
        if names is None
        else tuple(MetadataRequestTopic(topic_id=None, name=TopicName(n)) for n in names)
    )
    return conn.call(
        MetadataRequest(
            topics=topics,
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
    )


def _create(conn: KafkaConnection, args: argparse.Namespace) -> int:
    props = _configs(args.config)
    if props is None:
        return 2
    configs = [CreatableTopicConfig(name=k, value=v) for k, v in props.items()]
    resp = conn.call(
        CreateTopicsRequest(
            topics=(
                CreatableTopic(
                    name=args.name,
                    num_partitions=i32(args.partitions),
                    replication_factor=i16(-1),
                    assignments=(),
                    configs=tuple(configs),
                ),
            ),
            timeout=_TIMEOUT,
            validate_only=False,
        )
    )
    result = resp.topics[0]
    if result.error_code == ErrorCode.topic_already_exists and args.if_not_exists:
        return 0
    if result.error_code != ErrorCode.none:
        error = result.error_code.name.upper()
        print(f"Error creating {args.name}: {error}: {result.error_message or ''}")
        return 1
    print(f"Created topic {args.name} with {result.num_partitions} partition(s).")
    return 0


def _list(conn: KafkaConnection) -> int:
    for t in sorted(_metadata(conn, None).topics, key=lambda t: t.name or ""):
        print(t.name)
    return 0


def _describe(conn: KafkaConnection, names: list[str], *, if_exists: bool) -> int:
    md = _metadata(conn, names or None)
    code = 0
    for t in sorted(md.topics, key=lambda t: t.name or ""):
        if t.error_code == ErrorCode.unknown_topic_or_partition and if_exists:
            continue
        if t.error_code != ErrorCode.none:
            print(f"Error describing {t.name}: {t.error_code.name.upper()}")
            code = 1
            continue
        cfg = conn.call(
            DescribeConfigsRequest(
                resources=(
                    DescribeConfigsResource(
                        resource_type=_RESOURCE_TOPIC, resource_name=t.name, configuration_keys=None
                    ),
                ),
                include_synonyms=False,
                include_documentation=False,
            )
        )
        overrides = [
            f"{c.name}={c.value}"
            for c in cfg.results[0].configs
            if c.config_source == _SOURCE_DYNAMIC_TOPIC
        ]
        print(
            f"Topic: {t.name}\tTopicId: {t.topic_id}\tPartitionCount: {len(t.partitions)}\t"
            f"Configs: {','.join(overrides)}"
        )
        for p in sorted(t.partitions, key=lambda p: p.partition_index):
            print(
                f"\tTopic: {t.name}\tPartition: {p.partition_index}\tLeader: {p.leader_id}\t"
                f"Replicas: {','.join(map(str, p.replica_nodes))}\t"
                f"Isr: {','.join(map(str, p.isr_nodes))}"
            )
    return code


def _delete(conn: KafkaConnection, names: list[str], *, if_exists: bool) -> int:
    resp = conn.call(
        DeleteTopicsRequest(
            topics=tuple(DeleteTopicState(name=TopicName(n), topic_id=None) for n in names),
            timeout=_TIMEOUT,
        )
    )
    code = 0
    for r in resp.responses:
        if r.error_code == ErrorCode.unknown_topic_or_partition and if_exists:
            continue
        if r.error_code != ErrorCode.none:
            print(f"Error deleting {r.name}: {r.error_code.name.upper()}: {r.error_message or ''}")
            code = 1
        else:
            print(f"Deleted topic {r.name}.")
    return code


def _alter(bootstrap: str, args: argparse.Namespace) -> int:
    props = _configs(args.config)
    if props is None:
        return 2
    deletes = [k.strip() for k in args.delete_config]
    if args.partitions is None and not props and not deletes:
        print(
            "loglake topics: alter needs --partitions, --config or --delete-config", file=sys.stderr
        )
        return 2
    try:
        with Admin(bootstrap, client_id="loglake-topics", config=client_config_of(args)) as admin:
            try:
                admin.partitions([args.name])
            except ToolError:
                if args.if_exists:
                    return 0
                raise
            if args.partitions is not None:
                admin.create_partitions(args.name, args.partitions)
                print(f"Altered topic {args.name}: {args.partitions} partition(s).")
            if props or deletes:
                admin.alter_configs(RESOURCE_TOPIC, args.name, set_=props, delete=deletes)
                print(f"Completed updating config for topic {args.name}.")
    except ToolError as exc:
        print(f"Error altering {args.name}: {exc}", file=sys.stderr)
        return 1 if exc.retriable else 2
    return 0


def run(args: argparse.Namespace) -> int:
    bootstrap = bootstrap_of(args)
    try:
        if args.action == "alter":
            return _alter(bootstrap, args)
        with KafkaConnection(bootstrap, config=client_config_of(args)) as conn:
            if args.action == "create":
                return _create(conn, args)
            if args.action == "list":
                return _list(conn)
            if args.action == "describe":
                return _describe(conn, list(args.names), if_exists=args.if_exists)
            return _delete(conn, list(args.names), if_exists=args.if_exists)
    except LoglakeError as exc:
        print(f"loglake topics: {exc}", file=sys.stderr)
        return 2
