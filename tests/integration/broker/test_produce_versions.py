"""Produce v9-v11 on the wire (raw kio requests to the real broker), and v10's leader hint
(KIP-951) on the one path where a single node answers NOT_LEADER_OR_FOLLOWER."""

from __future__ import annotations

import datetime
import importlib
import io
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

from logstore.protocol.batch import iter_batches
from logstore.protocol.records import build_batch
from logstore.server.broker import Broker
from logstore.server.config import BrokerConfig
from logstore.server.context import RequestContext
from logstore.server.handlers import produce
from tests.integration.broker.clients import new_topic
from tests.integration.broker.rawclient import RawClient
from tests.integration.broker.test_kafka4_versions import _fetch

pytestmark = pytest.mark.integration


def _request(version: int, topic: str, records: bytes, *, partition: int = 0) -> Any:
    mod = importlib.import_module(f"kio.schema.produce.v{version}.request")
    return mod.ProduceRequest(
        transactional_id=None,
        acks=i16(-1),
        timeout=datetime.timedelta(seconds=10),
        topic_data=(
            mod.TopicProduceData(
                name=topic,
                partition_data=(mod.PartitionProduceData(index=i32(partition), records=records),),
            ),
        ),
    )


def _encoded(response: Any) -> bytes:
    buf = io.BytesIO()
    entity_writer(type(response))(buf, response)
    return buf.getvalue()


def test_produce_v9_to_v11_append_and_answer_alike(broker) -> None:
    assert produce.MAX_VERSION == 11
    topic = new_topic(broker.bootstrap, partitions=1, prefix="prodv")
    with RawClient(broker.bootstrap) as c:
        bodies = {}
        for n, v in enumerate(range(9, produce.MAX_VERSION + 1)):
            batch = bytes(build_batch([(b"k%d" % v, b"v" * 10)] * 3, base_timestamp=1000 + v))
            r = c.call(_request(v, topic, batch))
            (t,) = r.responses
            (p,) = t.partition_responses
            assert (t.name, p.index, p.error_code, p.base_offset) == (topic, 0, 0, 3 * n)
            if v >= 10:
                # success: no leader hint, no endpoints (Kafka sends them with NOT_LEADER only)
                assert (p.current_leader.leader_id, p.current_leader.leader_epoch) == (-1, -1)
                assert r.node_endpoints == ()
            # the same answer but for the offset: v10 and v11 are v9's flexible layout with
            # empty tag sections (the hints are tagged fields, absent on success)
            same = replace(t, partition_responses=(replace(p, base_offset=0),))
            bodies[v] = _encoded(replace(r, responses=(same,)))
        assert bodies[9] == bodies[10] == bodies[11]
        (t,) = _fetch(c, 12, topic, 1).responses
        (p,) = t.partitions
        batches = [h for _pos, h in iter_batches(bytes(p.records))]
        assert p.high_watermark == 9
        assert [b.base_offset for b in batches] == [0, 3, 6]


def test_v10_names_the_leader_when_a_log_is_closed_under_the_append(tmp_path: Path) -> None:
    config = BrokerConfig({"log.dirs": str(tmp_path / "logs"), "node.id": "7"})
    broker = Broker(config)
    try:
        broker.advertised_host, broker.advertised_port = "127.0.0.1", 19092
        broker.create_topic("closed", 1, {})
        part = broker.partition("closed", 0)
        assert part is not None
        part.log.close()  # what a topic deletion racing with the append does
        batch = bytes(build_batch([(b"k", b"v")], base_timestamp=1))
        answers = {}
        for v in (9, 10, 11):
            ctx = RequestContext(
                broker=broker,
                config=config,
                api_key=produce.API_KEY,
                api_version=v,
                correlation_id=v,
                client_id="test",
                connection_id="c",
                client_host="127.0.0.1",
            )
            r = produce.handle(ctx, _request(v, "closed", batch))
            (p,) = r.responses[0].partition_responses
            assert p.error_code == ErrorCode.not_leader_or_follower
            # the answer survives the wire (the tagged fields encode and decode)
            cls = type(r)
            decoded, _n = entity_reader(cls)(_encoded(r), 0)
            assert decoded == r
            answers[v] = r
        for v in (10, 11):
            (p,) = answers[v].responses[0].partition_responses
            assert (p.current_leader.leader_id, p.current_leader.leader_epoch) == (7, 0)
            (node,) = answers[v].node_endpoints
            assert (node.node_id, node.host, node.port, node.rack) == (7, "127.0.0.1", 19092, None)
        # the partition gone: Kafka's getCurrentLeader answers -1/-1 and no endpoint
        broker.delete_topic("closed")
        ctx = RequestContext(
            broker=broker,
            config=config,
            api_key=produce.API_KEY,
            api_version=10,
            correlation_id=1,
            client_id="test",
            connection_id="c",
            client_host="127.0.0.1",
        )
        endpoints: dict[int, Any] = {}
        leader = produce._current_leader(ctx, "closed", 0, endpoints)
        assert (leader.leader_id, leader.leader_epoch, endpoints) == (-1, -1, {})
    finally:
        broker.shutdown()
