"""Produce to a compacted topic with real clients: keyless records are refused as Kafka does
(INVALID_RECORD, "Compacted topic cannot accept message without key"), keyed ones are not."""

from __future__ import annotations

import confluent_kafka as ck
import pytest

from tests.integration.broker.clients import ck_consume, new_topic

pytestmark = pytest.mark.integration


def _produce(
    bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes | None]], codec: str
):
    errors: list[ck.KafkaError] = []
    p = ck.Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.codec": codec,
            "linger.ms": 50,
            "enable.idempotence": False,
            "retries": 0,
        }
    )

    def report(err: ck.KafkaError | None, _msg: ck.Message) -> None:
        if err is not None:
            errors.append(err)

    for key, value in records:
        p.produce(topic, key=key, value=value, partition=0, on_delivery=report)
    assert p.flush(30) == 0
    return errors


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_keyless_record_in_compacted_topic_is_refused(broker, codec: str) -> None:
    topic = new_topic(broker.bootstrap, partitions=1, prefix="cmp", **{"cleanup.policy": "compact"})
    keyed = [(b"k%d" % i, b"v" * 100) for i in range(50)] + [(b"gone", None)]
    assert _produce(broker.bootstrap, topic, keyed, codec) == []
    # one keyless record in the middle of a batch: the whole batch is refused
    mixed = [(b"a", b"1"), (None, b"no key"), (b"b", b"2")]
    errors = _produce(broker.bootstrap, topic, mixed, codec)
    assert errors and {e.code() for e in errors} == {ck.KafkaError.INVALID_RECORD}
    got = ck_consume(broker.bootstrap, topic, {0: len(keyed)})
    assert [(g.key, g.value) for g in got] == keyed


def test_keyless_records_elsewhere_are_accepted(broker) -> None:
    topic = new_topic(broker.bootstrap, partitions=1, prefix="del", **{"cleanup.policy": "delete"})
    assert _produce(broker.bootstrap, topic, [(None, b"x"), (b"k", b"y")], "lz4") == []
    assert [(g.key, g.value) for g in ck_consume(broker.bootstrap, topic, {0: 2})] == [
        (None, b"x"),
        (b"k", b"y"),
    ]
