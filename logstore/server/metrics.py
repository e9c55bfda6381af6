"""Broker metrics in Prometheus text format at ``http://<metrics.listeners>/metrics``.

Off unless ``metrics.listeners=http://HOST:PORT`` is set (port 0: chosen by the OS, logged).
Built on ``prometheus_client``: its registry renders the exposition and its own HTTP server
(``start_http_server``: a WSGI server in a daemon thread) serves it, bound to the given host
and port, stopped by :meth:`BrokerMetrics.stop` on broker shutdown.

Names follow what Kafka's JMX exporter rules produce for the same MBeans, so dashboards built
for Kafka find them (``kafka.network:type=RequestMetrics,name=Requests,request=Produce`` ->
``kafka_network_requestmetrics_requests_total{request="Produce"}``); times in seconds and
sizes in bytes, as Prometheus wants. What Kafka has no MBean for is ``loglake_...``.

Counted on the request path (cheap: a cached label child per API/topic, one lock each):

- ``kafka_network_requestmetrics_requests_total{request}``: requests answered, per API
  (Kafka's request names: ``Produce``, ``Fetch``, ``OffsetCommit``...); acks=0 produce
  requests count too;
- ``kafka_network_requestmetrics_errors_total{request,error}``: error codes in responses, per
  API and Kafka error name (``UNKNOWN_TOPIC_OR_PARTITION``...), one per partition/entity
  that carries it, as Kafka's ``errorCounts``; ``NONE`` is not counted;
- ``kafka_network_requestmetrics_totaltime_seconds{request}``: histogram of the time from
  the request's last byte read to its response handed to the network thread;
- ``kafka_server_brokertopicmetrics_bytesin_total{topic}`` / ``..._messagesin_total{topic}``:
  record batch bytes and records appended by Produce (duplicates of an idempotent retry not
  counted); ``kafka_server_brokertopicmetrics_bytesout_total{topic}``: record bytes sent by
  Fetch.

Computed at scrape time by :class:`_BrokerCollector`, never on the request path:

- ``kafka_log_log_size_bytes``, ``kafka_log_log_logstartoffset``,
  ``kafka_log_log_logendoffset`` ``{topic,partition}``; ``loglake_log_offline{topic,partition}``
  (1 while a storage error keeps it offline for appends) and
  ``loglake_log_storage_errors_total{topic,partition}`` (disk errors since start);
- ``kafka_consumergroup_lag{group,topic,partition}``: log end offset - committed offset, for
  every committed offset of every group (the kafka-exporter name); the group named by
  ``log.retention.lake.group`` also as ``loglake_lake_group_lag{group,topic,partition}``
  (whether the lake keeps up with the topics it ingests);
- ``kafka_network_socketserver_memorypoolused_bytes`` and, when bounded,
  ``kafka_network_socketserver_memorypoolavailable_bytes`` (``queued.max.request.bytes``).

Thread-safety: the request-path methods are called from any handler or network thread;
``prometheus_client`` values are locked. A scrape reads the logs' offsets without their
locks (ints read under the GIL: a scrape may see an append half-way, never a torn value).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Iterator
from typing import Any, Final

from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from logstore.server.apis import field_specs

__all__ = ["BrokerMetrics", "error_counts"]

log = logging.getLogger("logstore.server.metrics")

# Request latency buckets, seconds: 0.25 ms .. 30 s (a long-poll Fetch waits up to its
# max.wait.ms, 500 ms by default for librdkafka, and is counted too).
_LATENCY_BUCKETS: Final = (
    0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 30.0,
)  # fmt: skip


def _request_name(api_key: int) -> str:
    """Kafka's request name of ``api_key`` (``produce`` -> ``Produce``)."""
    snake = api_key_map.get(api_key)
    if snake is None:
        return f"Unknown{api_key}"
    return "".join(w.capitalize() for w in snake.split("_"))


_ERROR_NAMES: Final[dict[int, str]] = {int(e): e.name.upper() for e in ErrorCode}


def error_counts(response: Any, out: dict[int, int] | None = None) -> dict[int, int]:
    """``{error code: count}`` of every non-zero ``error_code`` in a kio response, walking
    its nested entities (Kafka's ``AbstractResponse.errorCounts``)."""
    if out is None:
        out = {}
    for name, _nullable, holds_entities in field_specs(type(response)):
        value = getattr(response, name)
        if name == "error_code":
            code = int(value)
            if code:
                out[code] = out.get(code, 0) + 1
        elif holds_entities and value is not None:
            if isinstance(value, tuple):
                for item in value:
                    if dataclasses.is_dataclass(item):
                        error_counts(item, out)
            elif dataclasses.is_dataclass(value):
                error_counts(value, out)
    return out


class BrokerMetrics:
    """The broker's metrics: request-path counters plus the scrape-time collector."""

    def __init__(self, broker: Any) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._requests = Counter(
            "kafka_network_requestmetrics_requests",
            "Requests answered, per API",
            ["request"],
            registry=r,
        )
        self._errors = Counter(
            "kafka_network_requestmetrics_errors",
            "Error codes in responses, per API and error (NONE not counted)",
            ["request", "error"],
            registry=r,
        )
        self._latency = Histogram(
            "kafka_network_requestmetrics_totaltime_seconds",
            "Time from a request's last byte read to its response being handed over",
            ["request"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self._bytes_in = Counter(
            "kafka_server_brokertopicmetrics_bytesin",
            "Record batch bytes appended by Produce, per topic",
            ["topic"],
            registry=r,
        )
        self._messages_in = Counter(
            "kafka_server_brokertopicmetrics_messagesin",
            "Records appended by Produce, per topic",
            ["topic"],
            registry=r,
        )
        self._bytes_out = Counter(
            "kafka_server_brokertopicmetrics_bytesout",
            "Record bytes sent by Fetch, per topic",
            ["topic"],
            registry=r,
        )
        r.register(_BrokerCollector(broker))
        # label children cached: labels() takes a lock and builds a tuple on every call
        self._per_api: dict[int, tuple[str, Any, Any]] = {}
        self._per_topic_in: dict[str, tuple[Any, Any]] = {}
        self._per_topic_out: dict[str, Any] = {}
        self._server: Any = None
        self._thread: Any = None

    # -- request path -------------------------------------------------------------------

    def request_done(self, api_key: int, received_ns: int, response: Any) -> None:
        """One request answered: its count, latency and the error codes of ``response``
        (a kio response; anything else, e.g. an encoded Fetch, counts no errors here)."""
        per = self._per_api.get(api_key)
        if per is None:
            name = _request_name(api_key)
            per = self._per_api[api_key] = (
                name,
                self._requests.labels(name),
                self._latency.labels(name),
            )
        name, requests, latency = per
        requests.inc()
        latency.observe((time.monotonic_ns() - received_ns) / 1e9)
        if dataclasses.is_dataclass(response):
            for code, n in error_counts(response).items():
                self.count_errors(api_key, code, n)

    def count_errors(self, api_key: int, code: int, n: int = 1) -> None:
        name = _request_name(api_key)
        self._errors.labels(name, _ERROR_NAMES.get(code, str(code))).inc(n)

    def produced(self, topic: str, nbytes: int, records: int) -> None:
        per = self._per_topic_in.get(topic)
        if per is None:
            per = self._per_topic_in[topic] = (
                self._bytes_in.labels(topic),
                self._messages_in.labels(topic),
            )
        per[0].inc(nbytes)
        per[1].inc(records)

    def fetched(self, topic: str, nbytes: int) -> None:
        child = self._per_topic_out.get(topic)
        if child is None:
            child = self._per_topic_out[topic] = self._bytes_out.labels(topic)
        child.inc(nbytes)

    # -- HTTP server ---------------------------------------------------------------------

    def start(self, host: str, port: int) -> tuple[str, int]:
        """Serve ``/metrics`` on ``host:port`` (daemon thread); the bound address."""
        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        bound = self._server.server_address
        return str(bound[0]), int(bound[1])

    def stop(self) -> None:
        """Stop the HTTP server and close its socket (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


class _BrokerCollector(Collector):
    """Log, group-lag and memory-pool gauges, read from the broker at scrape time."""

    def __init__(self, broker: Any) -> None:
        self._broker = broker

    def collect(self) -> Iterator[Metric]:
        broker = self._broker
        tp = ["topic", "partition"]
        size = GaugeMetricFamily(
            "kafka_log_log_size_bytes", "Bytes in a partition's log", labels=tp
        )
        start = GaugeMetricFamily(
            "kafka_log_log_logstartoffset", "A partition's log start offset", labels=tp
        )
        end = GaugeMetricFamily(
            "kafka_log_log_logendoffset", "A partition's log end offset", labels=tp
        )
        offline = GaugeMetricFamily(
            "loglake_log_offline", "1 while a storage error keeps the log offline", labels=tp
        )
        disk_errors = CounterMetricFamily(
            "loglake_log_storage_errors", "Storage (disk) errors of a partition's log", labels=tp
        )
        ends: dict[tuple[str, int], int] = {}
        for lg in broker.log_manager.all_logs():
            labels = [lg.topic, str(lg.partition)]
            leo = lg.log_end_offset
            ends[lg.topic, lg.partition] = leo
            size.add_metric(labels, lg.size)
            start.add_metric(labels, lg.log_start_offset)
            end.add_metric(labels, leo)
            offline.add_metric(labels, 0 if lg.offline_reason is None else 1)
            disk_errors.add_metric(labels, lg.storage_errors)
        yield from (size, start, end, offline, disk_errors)
        yield from self._lag(ends)
        yield from self._memory_pool()

    def _lag(self, ends: dict[tuple[str, int], int]) -> Iterable[Metric]:
        groups = self._broker.group_coordinator
        if groups is None:
            return
        gtp = ["group", "topic", "partition"]
        lag = GaugeMetricFamily(
            "kafka_consumergroup_lag", "Log end offset - committed offset", labels=gtp
        )
        lake_group = self._broker.config.get_str("log.retention.lake.group")
        lake = GaugeMetricFamily(
            "loglake_lake_group_lag",
            "Log end offset - the lake group's (log.retention.lake.group) committed offset",
            labels=gtp,
        )
        for group, offsets in groups.all_committed_offsets().items():
            for (topic, partition), committed in offsets.items():
                leo = ends.get((topic, partition))
                if leo is None:
                    continue  # a commit for a partition this broker does not have
                labels = [group, topic, str(partition)]
                value = max(leo - committed, 0)
                lag.add_metric(labels, value)
                if group == lake_group:
                    lake.add_metric(labels, value)
        yield lag
        if lake_group:
            yield lake

    def _memory_pool(self) -> Iterable[Metric]:
        pool = self._broker.memory_pool
        if pool is None:
            return
        yield GaugeMetricFamily(
            "kafka_network_socketserver_memorypoolused_bytes",
            "Request memory in use (queued.max.request.bytes pool)",
            value=pool.used,
        )
        if pool.capacity is not None:
            yield GaugeMetricFamily(
                "kafka_network_socketserver_memorypoolavailable_bytes",
                "Request memory still free in the pool",
                value=max(pool.capacity - pool.used, 0),
            )
