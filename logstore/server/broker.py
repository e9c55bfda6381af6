"""The broker: configuration, log manager, partitions, group coordinator and the reactor.

:class:`Broker` owns everything a handler reaches through ``ctx.broker``:

- ``log_manager`` (``logstore.storage.log_manager.LogManager``) over ``log.dirs``;
- the topic table, derived from the log manager's logs (a topic's partition count is its
  highest partition + 1) plus per-topic config overrides persisted with
  ``logstore.storage.topic_config`` in every log dir;
- one :class:`~logstore.storage.partition.Partition` per partition, loaded on first use:
  the log, its producer state and the lock that makes producer-state check -> append ->
  update atomic; the log's rules (``append_as_leader``, ``read``) live there;
- ``purgatory``: Fetch long-polls waiting for data, woken by appends;
- ``authorizer``: ACL decisions (``logstore.server.security.authorizer``; None: off);
- ``group_coordinator``: the consumer-group coordinator (``logstore.server.group``);
- ``txn_coordinator``: the transaction coordinator (``logstore.server.txn``), whose markers
  go to the partitions (``Partition.write_txn_marker``) and, for ``__consumer_offsets``, to
  the group coordinator; its timers (timed-out transactions, expired ids, markers to retry)
  run on the log manager's scheduler.

Imports are plain: a handler or coordinator module that fails to import makes
``import logstore.server.broker`` fail, so the broker refuses to start with the error rather
than run without some APIs (``loglake broker`` exits 1 and prints it).

Lifecycle: ``Broker(config)`` opens and recovers the logs (taking each dir's ``.lock``),
:meth:`start` starts the coordinators (the transaction coordinator completes the
transactions its log left in PrepareCommit/PrepareAbort) and begins listening,
:meth:`shutdown` stops accepting, answers what is in flight, stops the coordinators, then
``LogManager.shutdown()`` flushes, writes the checkpoints and the clean-shutdown marker. A
SIGKILL skips all of that; the next start recovers (storage).

A full disk: partitions go offline for appends (produce answers ``KAFKA_STORAGE_ERROR``),
fetches keep serving what is there, and a partition comes back by itself once there is room
(``logstore.storage.log``). Starting on a full disk works: a partition whose indexes cannot be
preallocated (or rebuilt) opens offline. :meth:`shutdown` logs what it could not persist and
returns False; it never raises for a storage error.

Thread-safety: topic creation and deletion take ``admin_lock``; partition appends take
their partition's lock; everything else is read-mostly and safe under the GIL.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from logstore.errors import (
    InvalidConfigError,
    InvalidProducerEpochError,
    InvalidTopicError,
    LoglakeError,
    TransactionCoordinatorFencedError,
)
from logstore.server.config import BrokerConfig
from logstore.server.dispatch import Dispatcher
from logstore.server.group.coordinator import GroupCoordinator
from logstore.server.group.offset_store import OFFSETS_TOPIC
from logstore.server.memory_pool import MemoryPool
from logstore.server.metrics import BrokerMetrics
from logstore.server.purgatory import Purgatory
from logstore.server.security.acls import FILE_NAME as ACL_FILE
from logstore.server.security.authorizer import Authorizer
from logstore.server.security.sasl import SaslSessions
from logstore.server.security.scram import FILE_NAME as SCRAM_FILE
from logstore.server.security.scram import ScramCredentials
from logstore.server.socket_server import SocketServer
from logstore.server.topics import TopicExistsError
from logstore.server.txn.coordinator import TransactionCoordinator, TxnConfig
from logstore.server.txn.producer_ids import next_producer_id
from logstore.server.txn.state_log import TxnStateLog
from logstore.storage.config import LogConfig
from logstore.storage.files import validate_topic
from logstore.storage.log_manager import LogManager
from logstore.storage.meta_properties import ensure_meta_properties
from logstore.storage.partition import Partition
from logstore.storage.scheduler import ScheduledTask
from logstore.storage.topic_config import (
    delete_topic_config,
    read_topic_configs,
    topic_config_path,
)
from logstore.storage.topic_config_defs import validate_topic_properties
from logstore.tier import RemoteLogManager, TierConfig

__all__ = ["Broker", "TopicExistsError"]

log = logging.getLogger("logstore.server.broker")


class Broker:
    """A single-node Kafka-protocol broker over ``logstore.storage``."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.node_id = config.node_id
        self.default_log_config = LogConfig.from_properties(config.topic_defaults())
        for d in config.log_dirs:
            d.mkdir(parents=True, exist_ok=True)
        # before any log loads: a directory of another cluster or node is refused untouched
        self.cluster_id = ensure_meta_properties(config.log_dirs, node_id=self.node_id)
        # before the logs open (a bad super.users or ACL file stops the start, holding no lock)
        # authorizer.class.name: ACLs (CreateAcls...), durable beside the first log dir's logs;
        # None: every request is allowed, and the ACL APIs answer SECURITY_DISABLED
        self.authorizer: Authorizer | None = Authorizer.from_config(
            self.config, path=self.config.log_dirs[0] / ACL_FILE
        )
        flush_check = min(config.get_int("log.flush.scheduler.interval.ms"), config.flush_ms, 1000)
        checkpoint_ms = min(
            config.get_int("log.flush.offset.checkpoint.interval.ms"),
            config.get_int("replica.high.watermark.checkpoint.interval.ms"),
        )
        self.topic_overrides: dict[str, dict[str, str]] = {}
        for d in config.log_dirs:
            for topic, props in read_topic_configs(d).items():
                # the files obey the rules CreateTopics and AlterConfigs apply (a hand-edited
                # file with an unknown key or a bad value stops the start, naming the file)
                try:
                    validate_topic_properties(props)
                except InvalidConfigError as exc:
                    raise InvalidConfigError(
                        f"{topic_config_path(d, topic)}: {exc.message}"
                    ) from exc
                self.topic_overrides.setdefault(topic, {}).update(props)
        self.log_manager = LogManager(
            [str(d) for d in config.log_dirs],
            default_config=self.default_log_config,
            flush_check_interval_ms=max(flush_check, 10),
            retention_check_interval_ms=config.get_int("log.retention.check.interval.ms"),
            checkpoint_interval_ms=checkpoint_ms,
        )
        # Single node: every appended record is committed, including those recovered after
        # a crash beyond the last high-watermark checkpoint.
        for lg in self.log_manager.all_logs():
            lg.high_watermark = lg.log_end_offset
        self.admin_lock = threading.RLock()
        self._partitions: dict[tuple[str, int], Partition] = {}
        self._partitions_lock = threading.Lock()
        self.purgatory = Purgatory("fetch")
        # remote.log.storage.system.enable: tiered storage (KIP-405; None: off)
        self.tier: RemoteLogManager | None = None
        tier_config = TierConfig.from_broker(config)
        if tier_config is not None:
            self.tier = RemoteLogManager(self.log_manager, tier_config, broker_id=self.node_id)
            self.log_manager.retention_owner = self.tier.is_tiered
        self.group_coordinator: GroupCoordinator | None = None
        self.txn_coordinator: TransactionCoordinator | None = None
        self._txn_tasks: list[ScheduledTask] = []
        self._server: SocketServer | None = None
        # metrics.listeners: request-path counters and /metrics (None: off, nothing counted)
        self.metrics: BrokerMetrics | None = None
        # schema.registry.listeners: the schema registry's HTTP server (None: off)
        self.registry: Any = None
        self._stopped = threading.Event()
        self.advertised_host = ""
        self.advertised_port = 0
        # listener name -> (host, port) Metadata gives clients of that listener
        self.advertised: dict[str, tuple[str, int]] = {}
        # SASL state of the connections of SASL listeners (logstore.server.security.sasl)
        # SCRAM users (AlterUserScramCredentials), durable beside the first log dir's logs
        self.scram_credentials = ScramCredentials(self.config.log_dirs[0] / SCRAM_FILE)
        self.sasl_sessions = SaslSessions(
            failure_delay_ms=self.config.get_int("connection.failed.authentication.delay.ms")
        )

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        self.group_coordinator = GroupCoordinator(self.log_manager, config=self.config, clock=None)
        self.group_coordinator.start()
        self._set_lake_bound(self.group_coordinator)
        self._start_txn_coordinator(self.group_coordinator)
        if self.tier is not None:
            self.tier.start()
        if self.config.metrics_listener is not None:
            self.metrics = BrokerMetrics(self)
        dispatcher = Dispatcher(self)
        self._server = SocketServer(
            self.config,
            dispatcher.dispatch,
            inline=dispatcher.try_inline,
            on_close=self.sasl_sessions.drop if self.config.sasl else None,
            authenticated=self.sasl_sessions.authenticated,
        )
        for listener in self.config.listeners:
            bound_host, bound_port = self._server.bound[listener.name]
            adv = self.config.advertised_listeners.get(listener.name)
            host = adv.host if adv is not None else bound_host
            # a port of 0 in advertised.listeners (tests override ports) means the bound one
            port = adv.port if adv is not None and adv.port else bound_port
            if listener.host in ("", "0.0.0.0") and adv is None:
                host = "127.0.0.1"
            self.advertised[listener.name] = (host, port)
        self.advertised_host, self.advertised_port = self.advertised[self.config.listener.name]
        self._start_metrics()
        self._start_registry()
        self._server.start()
        for ctl in self.config.controller_listeners:
            log.info(
                "controller listener %s://%s:%d accepted and not opened: this single node is"
                " its own KRaft controller and serves no quorum",
                ctl.name,
                ctl.host,
                ctl.port,
            )
        for name, (host, port) in self._server.bound.items():
            if name != self.config.listener.name:
                log.info(
                    "listener %s (%s) on %s:%d",
                    name,
                    self.config.security_protocols[name],
                    host,
                    port,
                )
        log.info(
            "loglake broker %d listening on %s:%d (log.dirs=%s)",
            self.node_id,
            self._server.host,
            self._server.port,
            ",".join(str(d) for d in self.config.log_dirs),
        )

    def _start_metrics(self) -> None:
        """``metrics.listeners``: serve /metrics before clients are served; OSError (the
        CLI exits 1) when the address cannot be bound."""
        listener = self.config.metrics_listener
        if self.metrics is None or listener is None:
            return
        try:
            host, port = self.metrics.start(listener.host, listener.port)
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"cannot serve metrics on {listener.host}:{listener.port} (metrics.listeners):"
                f" {exc.strerror or exc}",
            ) from exc
        log.info("metrics at http://%s:%d/metrics", host, port)

    def _start_registry(self) -> None:
        """``schema.registry.listeners``: load ``_schemas`` and serve the schema registry
        (``logstore.registry``); OSError (the CLI exits 1) when the address cannot be bound."""
        listener = self.config.registry_listener
        if listener is None:
            return
        # Imported only when on: fastavro, jsonschema and protobuf cost ~0.2 s of every start.
        from logstore.registry import start_registry  # noqa: PLC0415

        self.registry, host, port = start_registry(self, host=listener.host, port=listener.port)
        log.info("schema registry at %s://%s:%d", listener.name, host, port)

    def _set_lake_bound(self, groups: GroupCoordinator) -> None:
        """``log.retention.lake.group``: the periodic retention keeps what that group (the
        lake's ingest) has not committed past, within ``log.retention.lake.max.*``."""
        group = self.config.get_str("log.retention.lake.group")
        if not group:
            return
        max_bytes = self.config.get_int("log.retention.lake.max.bytes")
        max_ms = self.config.get_int("log.retention.lake.max.ms")
        self.log_manager.set_lake_bound(
            lambda topic, partition: groups.committed_offset(group, topic, partition),
            max_bytes=max_bytes,
            max_ms=max_ms,
        )
        log.info(
            "retention bounded by group %r (log.retention.lake.max.bytes=%d, max.ms=%d)",
            group,
            max_bytes,
            max_ms,
        )

    def _start_txn_coordinator(self, groups: GroupCoordinator) -> None:
        cfg = TxnConfig.from_broker_config(self.config)
        tc = TransactionCoordinator(
            TxnStateLog(
                self.log_manager,
                num_partitions=cfg.num_partitions,
                segment_bytes=cfg.segment_bytes,
            ),
            config=cfg,
            next_producer_id=next_producer_id,
            write_marker=self._write_txn_marker,
            offsets_partition_for=groups.offsets_partition_for,
        )
        tc.load()
        self.txn_coordinator = tc
        sched = self.log_manager.scheduler
        self._txn_tasks = [
            sched.schedule(
                "txn-abort-timed-out",
                tc.abort_timed_out,
                delay_ms=cfg.abort_timed_out_interval_ms,
                period_ms=cfg.abort_timed_out_interval_ms,
            ),
            sched.schedule(
                "txn-expire-ids",
                tc.expire_transactional_ids,
                delay_ms=cfg.remove_expired_interval_ms,
                period_ms=cfg.remove_expired_interval_ms,
            ),
            sched.schedule(
                "txn-complete-pending", tc.complete_pending, delay_ms=1000, period_ms=1000
            ),
        ]

    def _write_txn_marker(
        self,
        topic: str,
        partition: int,
        *,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
    ) -> bool:
        """The transaction coordinator's marker writer (see ``MarkerWriter``)."""
        groups = self.group_coordinator
        try:
            if groups is not None and topic == OFFSETS_TOPIC:
                groups.complete_txn(
                    partition,
                    producer_id=producer_id,
                    producer_epoch=producer_epoch,
                    commit=commit,
                    coordinator_epoch=coordinator_epoch,
                )
            else:
                part = self.partition(topic, partition)
                if part is None:
                    return False
                part.write_txn_marker(
                    producer_id, producer_epoch, commit=commit, coordinator_epoch=coordinator_epoch
                )
        except (InvalidProducerEpochError, TransactionCoordinatorFencedError) as exc:
            # The partition has moved on to a newer producer or coordinator epoch: this
            # marker is obsolete there and is dropped, as Kafka's marker channel does.
            log.warning("%s-%d: transaction marker dropped: %s", topic, partition, exc)
            return False
        # The last stable offset moved: READ_COMMITTED fetches waiting there may answer.
        self.purgatory.check_and_complete((topic, partition))
        return True

    @property
    def memory_pool(self) -> MemoryPool | None:
        """The reactor's request memory pool (None before :meth:`start`)."""
        return None if self._server is None else self._server.memory_pool

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("broker not started")
        return int(self._server.port)

    def shutdown(self) -> bool:
        """Stop accepting, finish in-flight requests, flush and checkpoint, release locks.

        Returns whether the log state was fully persisted (every clean-shutdown marker
        written); False after a storage error, which was logged (the next start recovers)."""
        if self._stopped.is_set():
            return True
        self._stopped.set()
        log.info("shutting down")
        if self._server is not None:
            self._server.stop_accepting()
        # Waiting fetches are answered now (with what they have) rather than at their
        # deadline, so that the in-flight wait below is short.
        self.purgatory.shutdown()
        if self._server is not None:
            self._server.shutdown(timeout_s=15.0)
        if self.metrics is not None:
            self.metrics.stop()
        if self.registry is not None:
            self.registry.stop()
        for task in self._txn_tasks:
            task.cancel()
        if self.tier is not None:
            self.tier.shutdown()
        if self.group_coordinator is not None:
            try:
                self.group_coordinator.shutdown()
            except Exception:
                log.exception("group coordinator shutdown failed")
        if self.log_manager.shutdown():
            log.info("shut down cleanly")
            return True
        log.error("shut down, but the log state was not fully persisted (see above)")
        return False

    # -- topics and partitions ---------------------------------------------------------

    def topics(self) -> dict[str, int]:
        """``{topic: partition count}`` of every topic in the log dirs."""
        out: dict[str, int] = {}
        for lg in self.log_manager.all_logs():
            out[lg.topic] = max(out.get(lg.topic, 0), lg.partition + 1)
        return out

    def partition_count(self, topic: str) -> int | None:
        return self.topics().get(topic)

    def topic_config(self, topic: str) -> LogConfig:
        return LogConfig.from_properties(
            self.topic_overrides.get(topic, {}), defaults=self.default_log_config
        )

    def loaded_partition(self, topic: str, partition: int) -> Partition | None:
        """The partition's state if already loaded and live, else None; never loads it.

        No log lookup, no producer-state rebuild: a dict read, cheap enough for the
        network threads (the inline Fetch path) to call.
        """
        state = self._partitions.get((topic, partition))
        if state is None or state.deleted:
            return None
        return state

    def partition(self, topic: str, partition: int) -> Partition | None:
        """The partition's state, or None when the topic-partition does not exist."""
        key = (topic, partition)
        state = self._partitions.get(key)
        if state is not None and not state.deleted:
            return state
        lg = self.log_manager.get_log(topic, partition)
        if lg is None:
            return None
        with self._partitions_lock:
            state = self._partitions.get(key)
            if state is None or state.log is not lg:
                state = Partition.load(topic, partition, lg)
                self._partitions[key] = state
        return state

    def create_topic(self, topic: str, partitions: int, configs: dict[str, str]) -> None:
        """Create ``topic``; raises InvalidTopicError, TopicExistsError, InvalidConfigError."""
        validate_topic(topic)
        if partitions < 1:
            raise LoglakeError(f"{topic}: number of partitions must be >= 1, got {partitions}")
        with self.admin_lock:
            existing = self.topics()
            if topic in existing:
                raise TopicExistsError(f"topic {topic!r} already exists")
            # Kafka refuses names that collide once '.' and '_' are treated alike (metrics).
            norm = topic.replace(".", "_")
            for other in existing:
                if other.replace(".", "_") == norm:
                    raise InvalidTopicError(f"topic {topic!r} collides with existing {other!r}")
            cfg = LogConfig.from_properties(configs, defaults=self.default_log_config)
            if configs:
                self.log_manager.set_topic_config(topic, configs)
                self.topic_overrides[topic] = dict(configs)
            for p in range(partitions):
                self.log_manager.get_or_create_log(topic, p, cfg)

    def create_partitions(self, topic: str, count: int) -> None:
        """Raise ``topic``'s partition count to ``count`` (new, empty partitions with the
        topic's config); raises InvalidTopicError for an unknown topic, LoglakeError for a
        count that is not higher."""
        with self.admin_lock:
            current = self.partition_count(topic)
            if current is None:
                raise InvalidTopicError(f"unknown topic {topic!r}")
            if count <= current:
                raise LoglakeError(f"{topic}: {count} partitions is not more than {current}")
            cfg = self.topic_config(topic)
            for p in range(current, count):
                self.log_manager.get_or_create_log(topic, p, cfg)

    def delete_topic(self, topic: str) -> None:
        with self.admin_lock:
            n = self.partition_count(topic)
            if n is None:
                raise InvalidTopicError(f"unknown topic {topic!r}")
            topic_id = self.log_manager.topic_id(topic)
            for p in range(n):
                with self._partitions_lock:
                    self._partitions.pop((topic, p), None)
                if self.log_manager.get_log(topic, p) is not None:
                    self.log_manager.delete_log(topic, p)
                self.purgatory.check_and_complete((topic, p))
            for d in self.config.log_dirs:
                delete_topic_config(d, topic)
            self.topic_overrides.pop(topic, None)
            if self.tier is not None and topic_id is not None:
                # its remote data goes too, as in Kafka (after the logs: a crash between
                # leaves remote segments of an unknown topic id, which the tier also deletes)
                self.tier.mark_deleted(topic, topic_id, n)

    def set_topic_overrides(self, topic: str, props: dict[str, str]) -> None:
        """Replace ``topic``'s overrides, persist them, and apply them to its logs."""
        with self.admin_lock:
            self.log_manager.set_topic_config(topic, props)
            self.topic_overrides[topic] = dict(props)

    def auto_create(self, topic: str) -> bool:
        """Create ``topic`` with ``num.partitions`` if auto-creation is on; True if it exists."""
        if not self.config.get_bool("auto.create.topics.enable"):
            return False
        with contextlib.suppress(TopicExistsError):
            self.create_topic(topic, self.config.get_int("num.partitions"), {})
        return True
