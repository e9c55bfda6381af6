"""The broker's configuration keys: every key loglake reads, with its type, default, range
and meaning (:data:`BROKER_CONFIG_DEFS`), and the broker-wide ``log.*`` defaults' topic-level
names (:data:`TOPIC_KEY_FOR_BROKER_KEY`).

A table, no logic: :mod:`logstore.server.config` parses and validates a ``server.properties``
against it (and re-exports these names, their public home before this split).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from logstore.storage.config import BROKER_KEYS

__all__ = [
    "BROKER_CONFIG_DEFS",
    "INT_MAX",
    "LONG_MAX",
    "TOPIC_KEY_FOR_BROKER_KEY",
    "ConfigDef",
]

LONG_MAX: Final = 9_223_372_036_854_775_807
INT_MAX: Final = 2_147_483_647


@dataclass(frozen=True, slots=True)
class ConfigDef:
    name: str
    type: str  # "int" | "long" | "double" | "bool" | "string" | "list" | "password"
    default: str | None
    doc: str
    low: int | None = None
    high: int | None = None
    choices: tuple[str, ...] | None = None


def _d(
    name: str,
    type_: str,
    default: str | None,
    doc: str,
    *,
    low: int | None = None,
    high: int | None = None,
    choices: tuple[str, ...] | None = None,
) -> ConfigDef:
    return ConfigDef(name, type_, default, doc, low, high, choices)


BROKER_CONFIG_DEFS: Final[dict[str, ConfigDef]] = {
    d.name: d
    for d in (
        _d("node.id", "int", "0", "id of this broker in Metadata responses", low=0),
        _d("broker.id", "int", None, "older name of node.id; must agree with it if set", low=0),
        _d(
            "listeners",
            "list",
            "PLAINTEXT://127.0.0.1:9092",
            "where to listen: NAME://host:port,... (port 0 = chosen by the OS); a controller"
            " listener (controller.listener.names) may be listed too and is not opened",
        ),
        _d(
            "advertised.listeners", "list", None, "what Metadata tells clients (default: listeners)"
        ),
        _d(
            "metrics.listeners",
            "string",
            "",
            "serve Prometheus metrics at http://HOST:PORT/metrics (port 0: chosen by the OS;"
            " empty: off)",
        ),
        _d(
            "schema.registry.listeners",
            "string",
            "",
            "serve a Confluent-compatible schema registry at http://HOST:PORT or, with TLS"
            " (schema.registry.ssl.* over the broker's ssl.*), https://HOST:PORT (port 0:"
            " chosen by the OS; empty: off); schemas kept in the compacted topic _schemas",
        ),
        _d(
            "schema.registry.authentication.method",
            "string",
            "NONE",
            "NONE, or BASIC: every registry request needs HTTP basic auth of a broker user"
            " (PLAIN users of the SASL listeners' JAAS configs, SCRAM users); 401 otherwise",
            choices=("NONE", "BASIC"),
        ),
        _d("log.dirs", "list", None, "log directories (comma-separated); default log.dir"),
        _d("log.dir", "string", "/tmp/loglake-logs", "log directory when log.dirs is not set"),
        _d("num.network.threads", "int", "3", "network processor threads", low=1, high=64),
        _d("num.io.threads", "int", "8", "request handler threads", low=1, high=256),
        _d(
            "queued.max.requests",
            "int",
            "500",
            "requests queued for the handlers before processors stop reading sockets",
            low=1,
        ),
        # KIP-72. Kafka's default is -1 (no bound); ours bounds request memory by default:
        # 128 MiB is 128 produce requests of a client's usual 1 MiB at once, and a single
        # 100 MiB (socket.request.max.bytes) request is still served by the pool's one
        # overdraw, so request buffers never exceed 228 MiB with the defaults.
        _d(
            "queued.max.request.bytes",
            "long",
            "134217728",
            "bytes of requests being received or queued before processors stop reading"
            " sockets (<= 0: no bound, as Kafka's default -1)",
            low=-1,
        ),
        _d("socket.request.max.bytes", "int", "104857600", "largest request frame", low=1),
        _d(
            "socket.request.read.timeout.ms",
            "long",
            "30000",
            "loglake: close a connection that began a request and did not send it whole"
            " within this (ms)",
            low=1,
        ),
        # Kafka's defaults are 102400; here -1 (the OS's autotuned buffers): a fixed 100 KB
        # send buffer caps a zero-copy fetch at ~200 MB/s on loopback (tests/perf).
        _d(
            "socket.send.buffer.bytes",
            "int",
            "-1",
            "SO_SNDBUF; -1 = OS autotuning (Kafka: 102400)",
            low=-1,
        ),
        _d(
            "socket.receive.buffer.bytes",
            "int",
            "-1",
            "SO_RCVBUF; -1 = OS autotuning (Kafka: 102400)",
            low=-1,
        ),
        # Kafka's default is 50. A burst of connections faster than the acceptor takes them
        # overflows the kernel's accept queue, and every dropped SYN costs its client a 1 s,
        # 3 s, 7 s ... retransmission: 2,000 connections took 35 s with 50. The acceptor
        # costs ~20 us a connection, but a Python thread can wait several GIL switch
        # intervals on a busy host (1024 still overflowed once at load 15 on 2 cores).
        # Linux caps the value at net.core.somaxconn (4096 since 5.4).
        _d(
            "socket.listen.backlog.size",
            "int",
            "4096",
            "listen() backlog (Kafka: 50; capped by net.core.somaxconn)",
            low=1,
        ),
        _d("max.connections", "int", str(INT_MAX), "open client connections at most", low=0),
        _d("max.connections.per.ip", "int", str(INT_MAX), "connections per client IP", low=0),
        _d("connections.max.idle.ms", "long", "600000", "close idle connections after", low=1),
        _d(
            "connections.max.reauth.ms",
            "long",
            "0",
            "SASL session lifetime (KIP-368): past it, a request other than re-authentication"
            " closes the connection (0: sessions never expire)",
            low=0,
        ),
        _d(
            "sasl.server.max.receive.size",
            "int",
            "524288",
            "largest frame a connection of a SASL listener may send before it has"
            " authenticated (a larger one closes it)",
            low=1,
        ),
        _d(
            "connection.failed.authentication.delay.ms",
            "int",
            "100",
            "delay of the answer to a failed SASL authentication, doubled per repeated failure"
            " from one host (at most 16 times)",
            low=0,
        ),
        # ACLs (logstore.server.security.authorizer): Kafka's keys and semantics
        _d(
            "authorizer.class.name",
            "string",
            "",
            "org.apache.kafka.metadata.authorizer.StandardAuthorizer turns ACLs on (empty: off;"
            " Kafka 4 removed kafka.security.authorizer.AclAuthorizer, refused here too)",
            choices=("", "org.apache.kafka.metadata.authorizer.StandardAuthorizer"),
        ),
        _d("super.users", "string", "", "principals allowed everything: User:alice;User:bob"),
        _d(
            "allow.everyone.if.no.acl.found",
            "bool",
            "false",
            "allow an action on a resource that no ACL names (with the authorizer on)",
        ),
        _d("message.max.bytes", "int", "1048588", "largest record batch accepted", low=0),
        _d("num.partitions", "int", "1", "partitions of an auto-created topic", low=1),
        _d("default.replication.factor", "int", "1", "single node: must be 1", low=1, high=1),
        _d("auto.create.topics.enable", "bool", "true", "create topics on first Metadata/Produce"),
        _d("delete.topic.enable", "bool", "true", "allow DeleteTopics"),
        _d("log.segment.bytes", "int", "1073741824", "segment size before a roll", low=14),
        _d(
            "log.roll.ms", "long", None, "segment age before a roll (default log.roll.hours)", low=1
        ),
        _d("log.roll.hours", "int", "168", "segment age before a roll, hours", low=1),
        _d("log.index.interval.bytes", "int", "4096", "bytes between offset-index entries", low=0),
        _d("log.index.size.max.bytes", "int", "10485760", "index file size", low=4),
        _d(
            "log.flush.interval.messages",
            "long",
            str(LONG_MAX),
            "fsync after this many messages",
            low=1,
        ),
        _d("log.flush.interval.ms", "long", None, "fsync a log older than this (ms)", low=0),
        _d(
            "log.flush.scheduler.interval.ms",
            "long",
            str(LONG_MAX),
            "how often the flusher checks logs",
            low=1,
        ),
        _d(
            "log.flush.offset.checkpoint.interval.ms",
            "int",
            "60000",
            "how often recovery points are checkpointed",
            low=1,
        ),
        _d(
            "log.flush.start.offset.checkpoint.interval.ms",
            "int",
            "60000",
            "how often log start offsets are checkpointed",
            low=1,
        ),
        _d(
            "replica.high.watermark.checkpoint.interval.ms",
            "long",
            "5000",
            "how often high watermarks are checkpointed",
            low=1,
        ),
        _d("log.retention.ms", "long", None, "delete segments older than (-1: never)", low=-1),
        _d("log.retention.minutes", "int", None, "retention in minutes", low=-1),
        _d("log.retention.hours", "int", "168", "retention in hours", low=-1),
        _d("log.retention.bytes", "long", "-1", "delete oldest segments above (-1: never)", low=-1),
        _d(
            "log.retention.check.interval.ms",
            "long",
            "300000",
            "how often retention runs",
            low=1,
        ),
        # loglake's lake bound on the periodic retention (logstore.storage.retention)
        _d(
            "log.retention.lake.group",
            "string",
            "",
            "consumer group whose committed offsets bound time/size retention (empty: off)",
        ),
        _d(
            "log.retention.lake.max.bytes",
            "long",
            "-1",
            "a partition log larger than this is retained as in Kafka, lake or not (-1: never)",
            low=-1,
        ),
        _d(
            "log.retention.lake.max.ms",
            "long",
            "604800000",
            "a lake group commit older than this no longer bounds retention (-1: never)",
            low=-1,
        ),
        _d(
            "log.cleanup.policy",
            "list",
            "delete",
            "delete and/or compact",
            choices=("delete", "compact"),
        ),
        _d("log.segment.delete.delay.ms", "long", "60000", "delay before removing .deleted", low=0),
        _d(
            "log.cleaner.min.compaction.lag.ms",
            "long",
            "0",
            "records younger than this are not compacted",
            low=0,
        ),
        _d(
            "log.cleaner.delete.retention.ms",
            "long",
            "86400000",
            "how long tombstones survive compaction",
            low=0,
        ),
        _d(
            "log.message.timestamp.type",
            "string",
            "CreateTime",
            "CreateTime or LogAppendTime",
            choices=("CreateTime", "LogAppendTime"),
        ),
        # Group coordinator keys (read by logstore.server.group.config.GroupConfig; the
        # defaults agree with it: one offsets partition and a short initial rebalance delay
        # suit a single broker).
        _d("offsets.topic.num.partitions", "int", "1", "__consumer_offsets partitions", low=1),
        _d(
            "offsets.topic.segment.bytes",
            "int",
            "104857600",
            "__consumer_offsets segment size",
            low=14,
        ),
        _d("offsets.retention.minutes", "int", "10080", "committed offsets kept (minutes)", low=1),
        _d(
            "offsets.commit.timeout.ms",
            "int",
            "5000",
            "how long an offset commit may wait",
            low=1,
        ),
        _d(
            "group.initial.rebalance.delay.ms",
            "int",
            "100",
            "wait for more members of a new group",
            low=0,
        ),
        _d("group.min.session.timeout.ms", "int", "6000", "smallest session timeout", low=0),
        _d("group.max.session.timeout.ms", "int", "1800000", "largest session timeout", low=0),
        _d("group.max.size", "int", str(INT_MAX), "members per group at most", low=1),
        _d(
            "offsets.retention.check.interval.ms",
            "long",
            "600000",
            "how often expired offsets are removed",
            low=1,
        ),
        _d("offset.metadata.max.bytes", "int", "4096", "largest commit metadata string", low=0),
        _d(
            "group.coordinator.tick.interval.ms",
            "int",
            "50",
            "loglake: period of the coordinator's timer (0: driven by the broker)",
            low=0,
        ),
        _d(
            "group.new.member.join.timeout.ms",
            "int",
            "300000",
            "how long a new member's first join may wait",
            low=1,
        ),
        # Transaction coordinator keys (read by logstore.server.txn.coordinator.TxnConfig;
        # Kafka's defaults, except one __transaction_state partition, as for the offsets).
        _d(
            "transaction.max.timeout.ms",
            "int",
            "900000",
            "largest transaction.timeout.ms a producer may ask for",
            low=1,
        ),
        _d(
            "transactional.id.expiration.ms",
            "int",
            "604800000",
            "forget a transactional id idle (no transaction) this long",
            low=1,
        ),
        _d(
            "transaction.abort.timed.out.transaction.cleanup.interval.ms",
            "int",
            "10000",
            "how often transactions past their timeout are aborted",
            low=1,
        ),
        _d(
            "transaction.remove.expired.transaction.cleanup.interval.ms",
            "int",
            "3600000",
            "how often expired transactional ids are removed",
            low=1,
        ),
        _d(
            "transaction.state.log.num.partitions",
            "int",
            "1",
            "__transaction_state partitions (Kafka: 50)",
            low=1,
        ),
        _d(
            "transaction.state.log.segment.bytes",
            "int",
            "104857600",
            "__transaction_state segment size",
            low=14,
        ),
        _d(
            "transaction.state.log.replication.factor",
            "int",
            "1",
            "single node: must be 1",
            low=1,
            high=1,
        ),
        _d("transaction.state.log.min.isr", "int", "1", "single node: must be 1", low=1, high=1),
        # KRaft: a single node is its own controller (see conf/broker.properties)
        _d(
            "process.roles",
            "list",
            "broker,controller",
            "KRaft roles; loglake is always both (must include broker)",
            choices=("broker", "controller"),
        ),
        _d(
            "controller.listener.names",
            "list",
            "CONTROLLER",
            "listeners of the KRaft controller: accepted, never opened (no quorum to serve)",
        ),
        _d(
            "listener.security.protocol.map",
            "list",
            "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
            "listener name -> security protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)",
        ),
        _d(
            "inter.broker.listener.name",
            "string",
            None,
            "single node: no inter-broker traffic; must name a client listener if set",
        ),
        # broker defaults of topic configs (Kafka's synonyms; see topic_config_defs)
        _d("log.roll.jitter.ms", "long", None, "segment.jitter.ms default", low=0),
        _d("log.roll.jitter.hours", "int", "0", "segment.jitter.ms default, hours", low=0),
        _d(
            "log.cleaner.max.compaction.lag.ms",
            "long",
            str(LONG_MAX),
            "max.compaction.lag.ms default",
            low=1,
        ),
        _d("log.cleaner.min.cleanable.ratio", "double", "0.5", "min.cleanable.dirty.ratio default"),
        _d(
            "log.cleaner.enable",
            "bool",
            "true",
            "clean compacted topics: read by jobs/compact.py --log and the loglake_log_cleaning DAG"
            " (the broker runs no cleaner thread of its own)",
        ),
        _d("log.preallocate", "bool", "false", "preallocate default"),
        _d(
            "log.message.timestamp.before.max.ms",
            "long",
            str(LONG_MAX),
            "message.timestamp.before.max.ms default",
            low=0,
        ),
        _d(
            "log.message.timestamp.after.max.ms",
            "long",
            "3600000",
            "message.timestamp.after.max.ms default",
            low=0,
        ),
        _d("compression.type", "string", "producer", "compression.type default"),
        _d("compression.gzip.level", "int", "-1", "compression.gzip.level default"),
        _d("compression.lz4.level", "int", "9", "compression.lz4.level default"),
        _d("compression.zstd.level", "int", "3", "compression.zstd.level default"),
        _d("min.insync.replicas", "int", "1", "no-op on one node (topic default)", low=1),
        _d("unclean.leader.election.enable", "bool", "false", "no-op on one node (topic default)"),
        # --- tiered storage (KIP-405; logstore.tier): Kafka's broker keys, then the Aiven
        # tiered-storage plugin's rsm.config.* keys (its object layout; see logstore.tier.layout)
        _d(
            "remote.log.storage.system.enable",
            "bool",
            "false",
            "tier closed segments of topics with remote.storage.enable=true to object storage",
        ),
        _d(
            "remote.log.manager.task.interval.ms",
            "long",
            "30000",
            "how often the tier thread looks for segments to copy and remote segments to expire",
            low=1,
        ),
        _d(
            "log.local.retention.ms",
            "long",
            "-2",
            "local.retention.ms default (-2: retention.ms)",
            low=-2,
        ),
        _d(
            "log.local.retention.bytes",
            "long",
            "-2",
            "local.retention.bytes default (-2: retention.bytes)",
            low=-2,
        ),
        _d(
            "rlmm.config.remote.log.metadata.topic.num.partitions",
            "int",
            "50",
            "__remote_log_metadata partitions (Kafka's default)",
            low=1,
        ),
        _d("rsm.config.storage.s3.bucket.name", "string", "", "the tier's S3 bucket"),
        _d(
            "rsm.config.storage.s3.endpoint.url",
            "string",
            "",
            "S3 endpoint (empty: AWS_ENDPOINT_URL, else AWS)",
        ),
        _d("rsm.config.storage.s3.region", "string", "", "S3 region (empty: AWS_REGION)"),
        _d(
            "rsm.config.storage.s3.path.style.access.enabled",
            "bool",
            "true",
            "path-style requests (the only style used with an endpoint URL)",
        ),
        _d(
            "rsm.config.storage.aws.access.key.id",
            "password",
            None,
            "S3 access key id (default: AWS_ACCESS_KEY_ID)",
        ),
        _d(
            "rsm.config.storage.aws.secret.access.key",
            "password",
            None,
            "S3 secret key (default: AWS_SECRET_ACCESS_KEY)",
        ),
        _d("rsm.config.key.prefix", "string", "", "prefix of every object key (e.g. tiered/)"),
        _d(
            "rsm.config.chunk.size",
            "int",
            "4194304",
            "chunk size of the .log objects' chunk index, bytes",
            low=1,
        ),
        _d(
            "rsm.config.compression.enabled",
            "bool",
            "false",
            "each .log chunk one zstd frame (the plugin's compression; read either way)",
        ),
        _d(
            "rsm.config.encryption.enabled",
            "bool",
            "false",
            "the plugin's encryption: not supported, must be false",
        ),
        _d(
            "rsm.config.fetch.chunk.cache.size",
            "long",
            "67108864",
            "bytes of remote .log chunks cached for fetches",
            low=0,
        ),
    )
}

# Broker default -> topic-level key (Kafka's ServerTopicConfigSynonyms, from the registry;
# unit-scaled keys such as log.retention.hours included).
TOPIC_KEY_FOR_BROKER_KEY: Final[dict[str, str]] = {k: t for k, (t, _) in BROKER_KEYS.items()}
