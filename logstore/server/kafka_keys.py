"""Apache Kafka 4.x broker keys that loglake accepts and does not use (logged once as ignored).

A ``server.properties`` written for Kafka (its stock KRaft file, an operator's tuned file)
must start loglake as it is: Kafka's keys that mean nothing here — the KRaft quorum, the
share-group coordinator, replication, quotas, security settings of listeners loglake does not
open, JVM-side tuning — are accepted with a single log line naming them. Keys neither Kafka's
nor loglake's are still refused (:class:`~logstore.server.config.BrokerConfig`), naming the
nearest valid key: a typo must not start a broker that silently ignores it.

Kafka's keys that loglake *does* read are in ``BROKER_CONFIG_DEFS`` and are validated there,
not listed here. The names below come from Kafka 4.x's ``KafkaConfig`` definitions
(``ServerConfigs``, ``KRaftConfigs``, ``QuorumConfig``, ``SocketServerConfigs``,
``ReplicationConfigs``, ``GroupCoordinatorConfig``, ``ShareGroupConfig``,
``TransactionLogConfig``, ``QuotaConfig``, ``RemoteLogManagerConfig``, ``CleanerConfig``,
``ServerLogConfigs``, ``MetricConfigs``, ``BrokerSecurityConfigs``). Data only; immutable.
"""

from __future__ import annotations

from typing import Final

__all__ = ["KAFKA_IGNORED_KEYS", "KAFKA_IGNORED_PREFIXES", "is_ignored_kafka_key"]

KAFKA_IGNORED_KEYS: Final[frozenset[str]] = frozenset(
    """
    controller.quorum.voters controller.quorum.bootstrap.servers
    controller.quorum.election.timeout.ms controller.quorum.fetch.timeout.ms
    controller.quorum.election.backoff.max.ms controller.quorum.append.linger.ms
    controller.quorum.request.timeout.ms controller.quorum.retry.backoff.ms
    controller.quorum.auto.join.enable controller.socket.timeout.ms
    controller.quorum.fetch.snapshot.max.bytes
    metadata.log.dir metadata.log.segment.bytes metadata.log.segment.ms
    metadata.log.max.record.bytes.between.snapshots metadata.log.max.snapshot.interval.ms
    metadata.max.retention.bytes metadata.max.retention.ms metadata.max.idle.interval.ms
    metadata.snapshot.max.new.record.bytes initial.broker.registration.timeout.ms
    broker.heartbeat.interval.ms broker.session.timeout.ms broker.rack
    security.inter.broker.protocol
    num.recovery.threads.per.data.dir num.replica.fetchers num.replica.alter.log.dirs.threads
    num.background.threads background.threads
    offsets.topic.replication.factor offsets.topic.compression.codec offsets.load.buffer.size
    share.coordinator.state.topic.replication.factor share.coordinator.state.topic.min.isr
    share.coordinator.state.topic.num.partitions share.coordinator.state.topic.segment.bytes
    share.coordinator.state.topic.prune.interval.ms share.coordinator.state.topic.compression.codec
    share.coordinator.snapshot.update.records.per.snapshot share.coordinator.threads
    share.coordinator.load.buffer.size share.coordinator.write.timeout.ms
    share.coordinator.append.linger.ms share.coordinator.cold.partition.snapshot.interval.ms
    share.coordinator.snapshot.interval.ms
    group.share.enable group.share.max.size group.share.partition.max.record.locks
    group.share.record.lock.duration.ms group.share.min.record.lock.duration.ms
    group.share.max.record.lock.duration.ms group.share.delivery.count.limit
    group.share.session.timeout.ms group.share.min.session.timeout.ms
    group.share.max.session.timeout.ms group.share.heartbeat.interval.ms
    group.share.min.heartbeat.interval.ms group.share.max.heartbeat.interval.ms
    group.share.max.groups group.share.assignors group.share.persister.class.name
    share.fetch.purgatory.purge.interval.requests
    group.coordinator.rebalance.protocols group.coordinator.threads
    group.coordinator.append.linger.ms group.consumer.session.timeout.ms
    group.consumer.min.session.timeout.ms group.consumer.max.session.timeout.ms
    group.consumer.heartbeat.interval.ms group.consumer.min.heartbeat.interval.ms
    group.consumer.max.heartbeat.interval.ms group.consumer.max.size group.consumer.assignors
    group.consumer.migration.policy group.streams.session.timeout.ms
    group.streams.heartbeat.interval.ms group.streams.max.size group.streams.num.standby.replicas
    offsets.topic.segment.bytes.unused offsets.topic.retention.ms
    transaction.state.log.load.buffer.size transaction.partition.verification.enable
    transaction.two.phase.commit.enable producer.id.expiration.ms
    producer.id.expiration.check.interval.ms
    replica.lag.time.max.ms replica.socket.timeout.ms replica.socket.receive.buffer.bytes
    replica.fetch.max.bytes replica.fetch.wait.max.ms replica.fetch.min.bytes
    replica.fetch.response.max.bytes replica.fetch.backoff.ms replica.selector.class
    fetch.purgatory.purge.interval.requests producer.purgatory.purge.interval.requests
    delete.records.purgatory.purge.interval.requests auto.leader.rebalance.enable
    leader.imbalance.per.broker.percentage leader.imbalance.check.interval.seconds
    unstable.api.versions.enable unstable.feature.versions.enable
    fetch.max.bytes request.timeout.ms
    connection.failed.authentication.delay.ms connections.max.reauth.ms
    max.connection.creation.rate max.connections.per.ip.overrides
    socket.connection.setup.timeout.ms socket.connection.setup.timeout.max.ms
    log.cleaner.enable log.cleaner.threads log.cleaner.io.max.bytes.per.second
    log.cleaner.dedupe.buffer.size log.cleaner.io.buffer.size
    log.cleaner.io.buffer.load.factor log.cleaner.backoff.ms
    log.dir.failure.timeout.ms log.initial.task.delay.ms
    create.topic.policy.class.name alter.config.policy.class.name
    compression.gzip.buffer.size
    remote.log.storage.system.enable remote.log.storage.manager.class.name
    remote.log.storage.manager.class.path remote.log.metadata.manager.class.name
    remote.log.metadata.manager.class.path remote.log.metadata.manager.listener.name
    remote.log.index.file.cache.total.size.bytes remote.log.manager.thread.pool.size
    remote.log.manager.task.interval.ms remote.log.reader.threads
    remote.log.reader.max.pending.tasks remote.log.manager.copy.max.bytes.per.second
    remote.log.manager.fetch.max.bytes.per.second remote.fetch.max.wait.ms
    remote.list.offsets.request.timeout.ms log.local.retention.ms log.local.retention.bytes
    quota.window.num quota.window.size.seconds replication.quota.window.num
    replication.quota.window.size.seconds alter.log.dirs.replication.quota.window.num
    alter.log.dirs.replication.quota.window.size.seconds controller.quota.window.num
    controller.quota.window.size.seconds client.quota.callback.class
    metric.reporters metrics.num.samples metrics.sample.window.ms metrics.recording.level
    kafka.metrics.reporters kafka.metrics.polling.interval.secs auto.include.jmx.reporter
    authorizer.class.name super.users allow.everyone.if.no.acl.found principal.builder.class
    sasl.enabled.mechanisms sasl.mechanism.inter.broker.protocol sasl.mechanism.controller.protocol
    sasl.kerberos.service.name sasl.jaas.config ssl.client.auth ssl.keystore.location
    ssl.keystore.password ssl.key.password ssl.keystore.type ssl.truststore.location
    ssl.truststore.password ssl.truststore.type ssl.endpoint.identification.algorithm
    ssl.protocol ssl.enabled.protocols ssl.cipher.suites ssl.principal.mapping.rules
    delegation.token.secret.key delegation.token.max.lifetime.ms
    delegation.token.expiry.time.ms delegation.token.expiry.check.interval.ms
    early.start.listeners telemetry.max.bytes
    config.providers reserved.broker.max.id
    """.split()
)

# Kafka's per-listener and per-mechanism key families (``listener.name.<name>.<key>``, ...)
KAFKA_IGNORED_PREFIXES: Final[tuple[str, ...]] = (
    "listener.name.",
    "ssl.",
    "sasl.",
    "config.providers.",
)


def is_ignored_kafka_key(key: str) -> bool:
    """True for a Kafka broker key loglake accepts and ignores."""
    return key in KAFKA_IGNORED_KEYS or key.startswith(KAFKA_IGNORED_PREFIXES)
