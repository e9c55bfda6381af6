"""aiokafka over mTLS (the client matrix's last gap): a client certificate from the test CA
produces and consumes byte for byte on an SSL listener that requires one; a certificate from
another CA is refused while the good client is served."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AkPartition
from aiokafka.errors import KafkaConnectionError
from aiokafka.helpers import create_ssl_context

from tests.fixtures.tls import make_pki, secure_listeners
from tests.integration.broker.clients import new_topic

pytestmark = pytest.mark.integration


def test_aiokafka_mtls_roundtrip_and_a_foreign_certificate(broker_factory, tmp_path):
    pki = make_pki(tmp_path / "pki")
    b = broker_factory(
        extra_listeners=("SASL_SSL", "SSL"), **secure_listeners(pki, plain_users={"x": "y"})
    )
    topic = new_topic(b.bootstrap, partitions=1, prefix="ak-mtls")
    values = [f"mtls-{i}".encode() * (i % 7 + 1) for i in range(300)]

    def conf(cert, key) -> dict:
        return {
            "bootstrap_servers": f"127.0.0.1:{b.ports['SSL']}",
            "security_protocol": "SSL",
            "ssl_context": create_ssl_context(
                cafile=str(pki.ca), certfile=str(cert), keyfile=str(key)
            ),
        }

    async def roundtrip(expect: int) -> list[bytes]:
        common = conf(pki.client_cert, pki.client_key)
        producer = AIOKafkaProducer(acks="all", **common)
        await producer.start()
        try:
            for v in values:
                await producer.send(topic, v, partition=0)
            await producer.flush()
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(**common)
        await consumer.start()
        got: list[bytes] = []
        try:
            tp = AkPartition(topic, 0)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            while len(got) < expect:
                batch = await consumer.getmany(tp, timeout_ms=10_000)
                if not batch:
                    break
                got.extend(m.value for m in batch[tp])
        finally:
            await consumer.stop()
        return got

    async def foreign() -> None:
        producer = AIOKafkaProducer(request_timeout_ms=5000, **conf(pki.rogue_cert, pki.rogue_key))
        try:
            await producer.start()
        finally:
            await producer.stop()

    assert asyncio.run(roundtrip(len(values))) == values
    with pytest.raises(KafkaConnectionError):
        asyncio.run(foreign())
    assert asyncio.run(roundtrip(2 * len(values))) == values + values
