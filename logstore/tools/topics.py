"""``loglake topics create|list|describe|delete`` over the Kafka protocol.

Like Kafka's ``kafka-topics.sh``, it talks to a broker (``--bootstrap-server``, default
``127.0.0.1:9092``) with CreateTopics, Metadata, DescribeConfigs and DeleteTopics, so it
works against loglake and against any Kafka broker::

    loglake topics create NAME [--partitions N] [--config key=value ...]
    loglake topics list
    loglake topics describe [NAME ...]
    loglake topics delete NAME [NAME ...]

Exit codes: 0 success, 1 a broker-side error (its Kafka error name is printed), 2 usage or
connection problems. Requests go through :class:`KafkaConnection`, a minimal blocking client
on kio's codecs (one request in flight, correlation ids checked).
"""

from __future__ import annotations

import argparse
import datetime
import io
import socket
import struct
import sys
from typing import Any

from kio.index import load_response_schema
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
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i8, i16, i32

from logstore.errors import LoglakeError

__all__ = ["KafkaConnection", "add_arguments", "run"]

_TIMEOUT: Any = datetime.timedelta(seconds=30)
_RESOURCE_TOPIC = i8(2)
_SOURCE_DYNAMIC_TOPIC = 1


class KafkaConnection:
    """A blocking connection sending kio requests and reading their responses."""

    def __init__(self, bootstrap: str, *, client_id: str = "loglake-topics", timeout: float = 30.0):
        host, sep, port = bootstrap.rpartition(":")
        if not sep or not port.isdigit():
            raise LoglakeError(f"--bootstrap-server {bootstrap!r}: expected host:port")
        try:
            self._sock = socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout)
        except OSError as exc:
            raise LoglakeError(f"cannot connect to {bootstrap}: {exc.strerror or exc}") from exc
        self._client_id = client_id.encode()
        self._correlation_id = 0

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> KafkaConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, request: Any) -> Any:
        self._correlation_id += 1
        head = struct.pack(
            ">hhih",
            request.__api_key__,
            request.__version__,
            self._correlation_id,
            len(self._client_id),
        )
        buf = io.BytesIO()
        buf.write(head + self._client_id + (b"\x00" if request.__flexible__ else b""))
        entity_writer(type(request))(buf, request)
        payload = buf.getvalue()
        try:
            self._sock.sendall(struct.pack(">i", len(payload)) + payload)
            (size,) = struct.unpack(">i", self._recv(4))
            frame = self._recv(size)
        except OSError as exc:
            raise LoglakeError(f"connection to the broker failed: {exc}") from exc
        (cid,) = struct.unpack_from(">i", frame, 0)
        if cid != self._correlation_id:
            raise LoglakeError(f"correlation id {cid} != {self._correlation_id}")
        cls = load_response_schema(request.__api_key__, request.__version__)
        pos = 4 + (1 if cls.__header_schema__.__flexible__ else 0)
        response, _size = entity_reader(cls)(frame, pos)
        return response

    def _recv(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self._sock.recv(n - len(out))
            if not chunk:
                raise LoglakeError("the broker closed the connection")
            out += chunk
        return bytes(out)


EPILOG = (
    "Exit codes: 0 success; 1 a broker-side error (its Kafka error name is printed, e.g."
    " TOPIC_ALREADY_EXISTS, UNKNOWN_TOPIC_OR_PARTITION); 2 bad arguments (a --config item"
    " without '=', a --bootstrap-server that is not host:port) or the broker cannot be reached"
    " or broke the connection; 130 interrupted."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.add_argument(
        "--bootstrap-server", default="127.0.0.1:9092", metavar="HOST:PORT", help="a broker"
    )
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = sub.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=-1, help="default: num.partitions")
    create.add_argument(
        "--config", action="append", default=[], metavar="KEY=VALUE", help="topic config"
    )
    sub.add_parser("list", help="list topics")
    describe = sub.add_parser("describe", help="partitions and config overrides")
    describe.add_argument("names", nargs="*", help="default: every topic")
    delete = sub.add_parser("delete", help="delete topics")
    delete.add_argument("names", nargs="+")


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
    configs = []
    for item in args.config:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"loglake topics: --config {item!r}: expected key=value", file=sys.stderr)
            return 2
        configs.append(CreatableTopicConfig(name=key.strip(), value=value.strip()))
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


def _describe(conn: KafkaConnection, names: list[str]) -> int:
    md = _metadata(conn, names or None)
    code = 0
    for t in sorted(md.topics, key=lambda t: t.name or ""):
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


def _delete(conn: KafkaConnection, names: list[str]) -> int:
    resp = conn.call(
        DeleteTopicsRequest(
            topics=tuple(DeleteTopicState(name=TopicName(n), topic_id=None) for n in names),
            timeout=_TIMEOUT,
        )
    )
    code = 0
    for r in resp.responses:
        if r.error_code != ErrorCode.none:
            print(f"Error deleting {r.name}: {r.error_code.name.upper()}: {r.error_message or ''}")
            code = 1
        else:
            print(f"Deleted topic {r.name}.")
    return code


def run(args: argparse.Namespace) -> int:
    try:
        with KafkaConnection(args.bootstrap_server) as conn:
            if args.action == "create":
                return _create(conn, args)
            if args.action == "list":
                return _list(conn)
            if args.action == "describe":
                return _describe(conn, list(args.names))
            return _delete(conn, list(args.names))
    except LoglakeError as exc:
        print(f"loglake topics: {exc}", file=sys.stderr)
        return 2
