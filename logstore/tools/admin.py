"""The operators' tools' Kafka client: requests routed to the broker that must answer them.

A tool speaks only the Kafka protocol (kio's request types over
:class:`~logstore.tools.connection.KafkaConnection`), so it works against loglake and against
any Kafka cluster. :class:`Admin` connects to ``--bootstrap-server``, learns the brokers and
partition leaders from Metadata, and sends each request where Kafka wants it: group requests
to the group's coordinator (FindCoordinator), ListOffsets and DeleteRecords to each
partition's leader, the rest to the bootstrap broker. One connection per broker, opened on
first use and closed by :meth:`Admin.close`.

Errors: :class:`ToolError` says whether the tool exits ``2`` or ``1``: ``2`` when what the
operator named cannot be used as asked (an unknown group, topic or partition, an invalid
config or offset: retrying changes nothing), ``1`` for the rest of the broker's refusals (a
coordinator loading, a group still active: may pass later; ``retriable``). Requests are not
retried here.
"""

from __future__ import annotations

import argparse
import datetime
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from kio.schema.create_partitions.v3.request import CreatePartitionsRequest, CreatePartitionsTopic
from kio.schema.delete_groups.v2.request import DeleteGroupsRequest
from kio.schema.delete_records.v2.request import (
    DeleteRecordsPartition,
    DeleteRecordsRequest,
    DeleteRecordsTopic,
)
from kio.schema.describe_configs.v4.request import DescribeConfigsRequest, DescribeConfigsResource
from kio.schema.describe_groups.v5.request import DescribeGroupsRequest
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v3.request import FindCoordinatorRequest
from kio.schema.incremental_alter_configs.v1.request import (
    AlterableConfig,
    AlterConfigsResource,
    IncrementalAlterConfigsRequest,
)
from kio.schema.list_groups.v4.request import ListGroupsRequest
from kio.schema.list_offsets.v7.request import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.offset_commit.v8.request import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.offset_fetch.v7.request import OffsetFetchRequest
from kio.schema.types import BrokerId, GroupId, TopicName
from kio.static.primitive import i8, i32, i64

from logstore.errors import LoglakeError
from logstore.tools.client_config import ClientConfig, load_client_config
from logstore.tools.connection import KafkaConnection

__all__ = [
    "DEFAULT_BOOTSTRAP",
    "EARLIEST",
    "LATEST",
    "MAX_TIMESTAMP",
    "RESOURCE_BROKER",
    "RESOURCE_TOPIC",
    "Admin",
    "ToolError",
    "add_bootstrap_argument",
    "bootstrap_of",
    "client_config_of",
    "error_name",
    "raise_for",
    "table",
]

LATEST: Final = -1
EARLIEST: Final = -2
MAX_TIMESTAMP: Final = -3
RESOURCE_TOPIC: Final = 2
RESOURCE_BROKER: Final = 4
_OP_SET: Final = 0
_OP_DELETE: Final = 1
_TIMEOUT: Any = datetime.timedelta(seconds=30)

# Refusals about what the operator named: retrying the same command changes nothing.
_USAGE_ERRORS: Final = frozenset(
    {
        ErrorCode.group_id_not_found,
        ErrorCode.invalid_group_id,
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.invalid_topic_exception,
        ErrorCode.invalid_config,
        ErrorCode.invalid_request,
        ErrorCode.invalid_partitions,
        ErrorCode.offset_out_of_range,
        ErrorCode.policy_violation,
        ErrorCode.topic_already_exists,
        ErrorCode.unsupported_version,
    }
)


class ToolError(LoglakeError):
    """A tool cannot do what it was asked. ``retriable``: the same command may succeed later
    (the tools exit 1), else retrying changes nothing (they exit 2)."""

    def __init__(self, message: str, *, retriable: bool = False) -> None:
        super().__init__(message)
        self.retriable = retriable


def error_name(code: ErrorCode) -> str:
    """Kafka's name of an error code, as its tools print it (``GROUP_ID_NOT_FOUND``)."""
    return code.name.upper()


def raise_for(code: ErrorCode, what: str, message: str | None = None) -> None:
    """Raise :class:`ToolError` for a non-zero error code (exit code as the module says)."""
    if code == ErrorCode.none:
        return
    detail = f": {message}" if message else ""
    retriable = code not in _USAGE_ERRORS
    raise ToolError(f"{what}: {error_name(code)}{detail}", retriable=retriable)


class Admin:
    """Routes the tools' requests (see the module docstring). Not thread-safe.

    ``config``: the client properties every connection uses (``--command-config``; None:
    PLAINTEXT)."""

    def __init__(
        self,
        bootstrap: str,
        *,
        client_id: str = "loglake-admin",
        config: ClientConfig | None = None,
    ) -> None:
        self._client_id = client_id
        self._config = config
        self._bootstrap = KafkaConnection(bootstrap, client_id=client_id, config=config)
        self._conns: dict[int, KafkaConnection] = {}
        self._brokers: dict[int, str] = {}

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._bootstrap.close()

    def call(self, request: Any) -> Any:
        """Send ``request`` to the bootstrap broker."""
        return self._bootstrap.call(request)

    def _node(self, node_id: int, address: str | None = None) -> KafkaConnection:
        if address is not None:
            self._brokers[node_id] = address
        conn = self._conns.get(node_id)
        if conn is None:
            if node_id not in self._brokers:
                self.metadata([])
            address = self._brokers.get(node_id)
            if address is None:
                raise ToolError(
                    f"broker {node_id} is not in the cluster's metadata", retriable=True
                )
            conn = self._conns[node_id] = KafkaConnection(
                address, client_id=self._client_id, config=self._config
            )
        return conn

    # -- metadata -----------------------------------------------------------------------------

    def metadata(self, topics: Iterable[str] | None) -> Any:
        """Metadata of ``topics`` (None: every topic); remembers the brokers' addresses."""
        names = None if topics is None else tuple(topics)
        resp = self.call(
            MetadataRequest(
                topics=None
                if names is None
                else tuple(MetadataRequestTopic(topic_id=None, name=TopicName(n)) for n in names),
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            )
        )
        for b in resp.brokers:
            self._brokers[int(b.node_id)] = f"{b.host}:{b.port}"
        return resp

    def partitions(self, topics: Iterable[str]) -> dict[str, dict[int, int]]:
        """``{topic: {partition: leader id}}``; ToolError (2) for an unknown topic."""
        out: dict[str, dict[int, int]] = {}
        names = list(dict.fromkeys(topics))
        if not names:
            return out
        for t in self.metadata(names).topics:
            raise_for(t.error_code, f"topic {t.name}")
            out[str(t.name)] = {int(p.partition_index): int(p.leader_id) for p in t.partitions}
        return out

    def all_topics(self) -> list[str]:
        return sorted(str(t.name) for t in self.metadata(None).topics if not t.is_internal)

    # -- offsets ------------------------------------------------------------------------------

    def list_offsets(self, spec: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """``{(topic, partition): offset}`` for ``{(topic, partition): timestamp}`` (-1 latest,
        -2 earliest, -3 max timestamp, else the first offset at or after that time; -1 when no
        record is that recent); a partition's error is raised as :class:`ToolError`."""
        out: dict[tuple[str, int], int] = {}
        for (topic, part), (error, offset) in self.list_offsets_results(spec).items():
            raise_for(error, f"offsets of {topic}-{part}")
            out[(topic, part)] = offset
        return out

    def list_offsets_results(
        self, spec: Mapping[tuple[str, int], int]
    ) -> dict[tuple[str, int], tuple[ErrorCode, int]]:
        """As :meth:`list_offsets`, each partition's error code beside its offset. Each
        partition's leader is asked; a partition the metadata lacks gets
        UNKNOWN_TOPIC_OR_PARTITION."""
        leaders = self.partitions(t for t, _p in spec)
        by_leader: dict[int, dict[str, list[tuple[int, int]]]] = {}
        out: dict[tuple[str, int], tuple[ErrorCode, int]] = {}
        for (topic, part), ts in spec.items():
            leader = leaders[topic].get(part)
            if leader is None:
                out[(topic, part)] = (ErrorCode.unknown_topic_or_partition, -1)
                continue
            by_leader.setdefault(leader, {}).setdefault(topic, []).append((part, ts))
        for leader, topics in by_leader.items():
            resp = self._node(leader).call(
                ListOffsetsRequest(
                    replica_id=BrokerId(-1),
                    isolation_level=i8(0),
                    topics=tuple(
                        ListOffsetsTopic(
                            name=TopicName(topic),
                            partitions=tuple(
                                ListOffsetsPartition(
                                    partition_index=i32(p),
                                    current_leader_epoch=i32(-1),
                                    timestamp=i64(ts),
                                )
                                for p, ts in parts
                            ),
                        )
                        for topic, parts in topics.items()
                    ),
                )
            )
            for t in resp.topics:
                for p in t.partitions:
                    out[(str(t.name), int(p.partition_index))] = (p.error_code, int(p.offset))
        return out

    def delete_records(
        self, offsets: Mapping[tuple[str, int], int]
    ) -> dict[tuple[str, int], tuple[ErrorCode, int]]:
        """``{(topic, partition): (error code, low watermark)}`` (-1 on an error)."""
        leaders = self.partitions(t for t, _p in offsets)
        by_leader: dict[int, dict[str, list[tuple[int, int]]]] = {}
        out: dict[tuple[str, int], tuple[ErrorCode, int]] = {}
        for (topic, part), offset in offsets.items():
            leader = leaders[topic].get(part)
            if leader is None:
                out[(topic, part)] = (ErrorCode.unknown_topic_or_partition, -1)
                continue
            by_leader.setdefault(leader, {}).setdefault(topic, []).append((part, offset))
        for leader, topics in by_leader.items():
            resp = self._node(leader).call(
                DeleteRecordsRequest(
                    topics=tuple(
                        DeleteRecordsTopic(
                            name=TopicName(topic),
                            partitions=tuple(
                                DeleteRecordsPartition(partition_index=i32(p), offset=i64(o))
                                for p, o in parts
                            ),
                        )
                        for topic, parts in topics.items()
                    ),
                    timeout=_TIMEOUT,
                )
            )
            for t in resp.topics:
                for p in t.partitions:
                    key = (str(t.name), int(p.partition_index))
                    out[key] = (p.error_code, int(p.low_watermark))
        return out

    # -- groups -------------------------------------------------------------------------------

    def coordinator_id(self, group: str) -> str:
        """``host:port (id)`` of the group's coordinator, as Kafka's tool prints it."""
        resp = self._find_coordinator(group)
        return f"{resp.host}:{resp.port} ({resp.node_id})"

    def _find_coordinator(self, group: str) -> Any:
        resp = self.call(FindCoordinatorRequest(key=group, key_type=i8(0)))
        raise_for(resp.error_code, f"coordinator of group {group}", resp.error_message)
        return resp

    def coordinator(self, group: str) -> KafkaConnection:
        resp = self._find_coordinator(group)
        return self._node(int(resp.node_id), f"{resp.host}:{resp.port}")

    def list_groups(self) -> list[tuple[str, str, str]]:
        """``(group, protocol type, state)`` of every group of every broker, sorted."""
        self.metadata([])
        out: set[tuple[str, str, str]] = set()
        for node in sorted(self._brokers):
            resp = self._node(node).call(ListGroupsRequest(states_filter=()))
            raise_for(resp.error_code, f"groups of broker {node}")
            out.update((str(g.group_id), g.protocol_type, g.group_state) for g in resp.groups)
        return sorted(out)

    def describe_group(self, group: str) -> Any:
        """DescribeGroups' answer for one group (state ``Dead`` when it does not exist)."""
        resp = self.coordinator(group).call(
            DescribeGroupsRequest(groups=(GroupId(group),), include_authorized_operations=False)
        )
        described = resp.groups[0]
        raise_for(described.error_code, f"group {group}")
        return described

    def committed(self, group: str) -> dict[tuple[str, int], int]:
        """The group's committed offsets (partitions without a commit left out)."""
        resp = self.coordinator(group).call(
            OffsetFetchRequest(group_id=GroupId(group), topics=None, require_stable=True)
        )
        raise_for(resp.error_code, f"offsets of group {group}")
        out: dict[tuple[str, int], int] = {}
        for t in resp.topics:
            for p in t.partitions:
                raise_for(p.error_code, f"offset of group {group} on {t.name}-{p.partition_index}")
                if int(p.committed_offset) >= 0:
                    out[(str(t.name), int(p.partition_index))] = int(p.committed_offset)
        return out

    def commit(self, group: str, offsets: Mapping[tuple[str, int], int]) -> None:
        """Commit ``offsets`` for an inactive group, as AdminClient.alterConsumerGroupOffsets
        does: generation -1 and no member id (the coordinator refuses it for a live group)."""
        topics: dict[str, list[tuple[int, int]]] = {}
        for (topic, part), offset in sorted(offsets.items()):
            topics.setdefault(topic, []).append((part, offset))
        resp = self.coordinator(group).call(
            OffsetCommitRequest(
                group_id=GroupId(group),
                generation_id_or_member_epoch=i32(-1),
                member_id="",
                group_instance_id=None,
                topics=tuple(
                    OffsetCommitRequestTopic(
                        name=TopicName(topic),
                        partitions=tuple(
                            OffsetCommitRequestPartition(
                                partition_index=i32(p),
                                committed_offset=i64(o),
                                committed_leader_epoch=i32(-1),
                                committed_metadata="",
                            )
                            for p, o in parts
                        ),
                    )
                    for topic, parts in topics.items()
                ),
            )
        )
        for t in resp.topics:
            for p in t.partitions:
                raise_for(p.error_code, f"commit of group {group} on {t.name}-{p.partition_index}")

    def delete_group(self, group: str) -> ErrorCode:
        resp = self.coordinator(group).call(DeleteGroupsRequest(groups_names=(GroupId(group),)))
        return ErrorCode(resp.results[0].error_code)

    # -- configs and partitions ---------------------------------------------------------------

    def describe_configs(self, resource_type: int, name: str) -> Any:
        resp = self.call(
            DescribeConfigsRequest(
                resources=(
                    DescribeConfigsResource(
                        resource_type=i8(resource_type),
                        resource_name=name,
                        configuration_keys=None,
                    ),
                ),
                include_synonyms=True,
                include_documentation=False,
            )
        )
        result = resp.results[0]
        raise_for(result.error_code, f"configs of {name}", result.error_message)
        return result

    def alter_configs(
        self, resource_type: int, name: str, *, set_: Mapping[str, str], delete: Iterable[str]
    ) -> None:
        """IncrementalAlterConfigs: SET each of ``set_``, DELETE each of ``delete``; the
        broker validates keys and values (its refusal is raised as :class:`ToolError`)."""
        ops = [
            AlterableConfig(name=k, config_operation=i8(_OP_SET), value=v) for k, v in set_.items()
        ] + [AlterableConfig(name=k, config_operation=i8(_OP_DELETE), value=None) for k in delete]
        resp = self.call(
            IncrementalAlterConfigsRequest(
                resources=(
                    AlterConfigsResource(
                        resource_type=i8(resource_type), resource_name=name, configs=tuple(ops)
                    ),
                ),
                validate_only=False,
            )
        )
        result = resp.responses[0]
        raise_for(result.error_code, f"configs of {name}", result.error_message)

    def create_partitions(self, topic: str, count: int) -> None:
        resp = self.call(
            CreatePartitionsRequest(
                topics=(
                    CreatePartitionsTopic(
                        name=TopicName(topic), count=i32(count), assignments=None
                    ),
                ),
                timeout=_TIMEOUT,
                validate_only=False,
            )
        )
        result = resp.results[0]
        raise_for(result.error_code, f"partitions of {topic}", result.error_message)


DEFAULT_BOOTSTRAP: Final = "127.0.0.1:9092"


def add_bootstrap_argument(parser: argparse.ArgumentParser) -> None:
    """``--bootstrap-server`` and ``--command-config``, accepted on any parser level of the
    line (``loglake --bootstrap-server B groups --list`` and ``loglake groups --list
    --bootstrap-server B``): each level declares them with a suppressed default, so the level
    that got one sets it and :func:`bootstrap_of` / :func:`client_config_of` supply the
    default when none did."""
    parser.add_argument(
        "--bootstrap-server",
        default=argparse.SUPPRESS,
        metavar="HOST:PORT",
        help=f"the broker to connect to (default {DEFAULT_BOOTSTRAP})",
    )
    parser.add_argument(
        "--command-config",
        default=argparse.SUPPRESS,
        metavar="FILE",
        help="Kafka client properties (security.protocol, sasl.mechanism, sasl.jaas.config,"
        " ssl.truststore.location, ...) for the connection to the broker",
    )


def bootstrap_of(args: argparse.Namespace) -> str:
    return str(getattr(args, "bootstrap_server", DEFAULT_BOOTSTRAP))


def client_config_of(args: argparse.Namespace) -> ClientConfig | None:
    """The validated ``--command-config`` file, None when not given (PLAINTEXT);
    :class:`~logstore.tools.client_config.ClientConfigError` (the tools exit 2) when bad."""
    path = getattr(args, "command_config", None)
    return None if path is None else load_client_config(path)


def table(rows: Sequence[Sequence[object]]) -> list[str]:
    """Left-aligned columns as Kafka's tools print them: each as wide as its widest cell."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    return [" ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
