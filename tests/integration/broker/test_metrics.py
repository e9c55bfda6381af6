"""The broker's Prometheus metrics (``metrics.listeners``): a real broker, real
confluent-kafka traffic, ``/metrics`` scraped over HTTP and parsed with
``prometheus_client.parser``; the values checked against the log files and the commits."""

from __future__ import annotations

import socket
import subprocess
import urllib.request
from collections import Counter

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.broker import ROOT, BrokerProcess, free_port, wait_for
from tests.integration.broker.clients import ck_consume, ck_produce, make_records, new_topic

GROUP = "metrics-app"
LAKE = "metrics-lake"
N = 400

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name, frozenset(s.labels.items())] = s.value
    return out


def _get(samples: Samples, name: str, **labels: str | int) -> float:
    key = (name, frozenset((k, str(v)) for k, v in labels.items()))
    assert key in samples, f"{name}{labels} not scraped"
    return samples[key]


def _commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = [ck.TopicPartition(topic, p, o) for p, o in offsets.items()]
        c.commit(offsets=tps, asynchronous=False)
    finally:
        c.close()


@pytest.mark.timeout(180)
def test_metrics_match_traffic_logs_and_commits(broker_factory) -> None:
    port = free_port()
    b = broker_factory(
        **{"metrics.listeners": f"http://127.0.0.1:{port}", "log.retention.lake.group": LAKE}
    )
    topic = new_topic(b.bootstrap, partitions=2, prefix="metrics")
    records = make_records(N, partitions=2, seed=11)
    per_partition = Counter(r.partition for r in records)
    ck_produce(b.bootstrap, topic, records, codec="lz4", acks="all", idempotent=True)
    got = ck_consume(b.bootstrap, topic, dict(per_partition))
    assert len(got) == N
    _commit(b.bootstrap, GROUP, topic, {0: 10, 1: 5})
    _commit(b.bootstrap, LAKE, topic, {0: 3})
    # one failing request: deleting a topic that does not exist
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    with pytest.raises(ck.KafkaException):
        admin.delete_topics(["no-such-topic"])["no-such-topic"].result(timeout=30)

    s = _scrape(port)

    produce_requests = _get(s, "kafka_network_requestmetrics_requests_total", request="Produce")
    assert produce_requests >= 1
    # every answered request is in its API's latency histogram once
    assert (
        _get(s, "kafka_network_requestmetrics_totaltime_seconds_count", request="Produce")
        == produce_requests
    )
    assert _get(s, "kafka_network_requestmetrics_requests_total", request="Fetch") >= 1
    assert _get(s, "kafka_network_requestmetrics_requests_total", request="OffsetCommit") == 2
    assert _get(s, "kafka_network_requestmetrics_requests_total", request="DeleteTopics") == 1
    assert (
        _get(
            s,
            "kafka_network_requestmetrics_errors_total",
            request="DeleteTopics",
            error="UNKNOWN_TOPIC_OR_PARTITION",
        )
        == 1
    )
    assert not any(
        name == "kafka_network_requestmetrics_errors_total" and ("request", "Produce") in labels
        for name, labels in s
    )

    # bytes in = the batches stored (the partitions' .log files), records in = produced
    log_bytes = {
        p: sum(f.stat().st_size for f in (b.log_dir / f"{topic}-{p}").glob("*.log")) for p in (0, 1)
    }
    assert _get(s, "kafka_server_brokertopicmetrics_bytesin_total", topic=topic) == sum(
        log_bytes.values()
    )
    assert _get(s, "kafka_server_brokertopicmetrics_messagesin_total", topic=topic) == N
    # the consumer read everything once: at least the stored bytes went out
    assert _get(s, "kafka_server_brokertopicmetrics_bytesout_total", topic=topic) >= sum(
        log_bytes.values()
    )

    for p in (0, 1):
        end = _get(s, "kafka_log_log_logendoffset", topic=topic, partition=p)
        assert end == per_partition[p]
        assert _get(s, "kafka_log_log_logstartoffset", topic=topic, partition=p) == 0
        assert _get(s, "kafka_log_log_size_bytes", topic=topic, partition=p) == log_bytes[p]
        assert _get(s, "loglake_log_offline", topic=topic, partition=p) == 0
        assert _get(s, "loglake_log_storage_errors_total", topic=topic, partition=p) == 0
    lag = "kafka_consumergroup_lag"
    assert _get(s, lag, group=GROUP, topic=topic, partition=0) == per_partition[0] - 10
    assert _get(s, lag, group=GROUP, topic=topic, partition=1) == per_partition[1] - 5
    assert _get(s, lag, group=LAKE, topic=topic, partition=0) == per_partition[0] - 3
    assert _get(s, "loglake_lake_group_lag", group=LAKE, topic=topic, partition=0) == (
        per_partition[0] - 3
    )
    assert not any(
        name == "loglake_lake_group_lag" and ("group", GROUP) in labels for name, labels in s
    )
    # once nothing is in flight the request pool is empty, all of it available (a client's
    # periodic metadata request may be in flight at one scrape)
    pool = "kafka_network_socketserver_memorypool"
    wait_for(lambda: _get(_scrape(port), pool + "used_bytes") == 0, 30)
    assert _get(_scrape(port), pool + "available_bytes") == 134217728

    # the HTTP server goes with the broker
    assert b.stop() == 0
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def test_metrics_off_by_default(broker_factory) -> None:
    b = broker_factory()
    assert "metrics at http" not in b.log_text()


def test_metrics_port_taken_refuses_to_start(tmp_path) -> None:
    # The CLI itself (the fixture would take "Address already in use" for its Kafka port).
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        cmd = BrokerProcess(tmp_path, **{"metrics.listeners": f"http://127.0.0.1:{port}"}).command()
        proc = subprocess.run(
            cmd, check=False, cwd=ROOT, capture_output=True, text=True, timeout=120
        )
    assert proc.returncode == 1, proc.stderr
    assert f"cannot serve metrics on 127.0.0.1:{port} (metrics.listeners)" in proc.stderr
    assert "loglake broker started" not in proc.stdout
