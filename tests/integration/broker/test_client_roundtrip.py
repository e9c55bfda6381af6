"""Every real client produces with every codec, acks 0/1/all and idempotence; everything is
consumed back (by the same client, and by decoding the segment files independently) and
compared byte for byte: keys, values, headers, timestamps, offsets."""

from __future__ import annotations

import pytest

from tests.integration.broker.clients import (
    CODECS,
    CONSUMERS,
    PRODUCERS,
    by_partition,
    expected,
    make_records,
    new_topic,
    read_log,
)

pytestmark = pytest.mark.integration

CLIENTS = tuple(PRODUCERS)

CASES = (
    # every codec with acks=all and idempotence (the production setting)
    [(client, codec, "all", True) for client in CLIENTS for codec in CODECS]
    # acks 0 and 1 without idempotence (idempotence requires acks=all)
    + [(client, "lz4", acks, False) for client in CLIENTS for acks in ("0", "1")]
    + [(client, "none", "all", False) for client in CLIENTS]
)


@pytest.mark.parametrize(("client", "codec", "acks", "idempotent"), CASES)
def test_produce_consume_roundtrip(broker, client, codec, acks, idempotent):
    topic = new_topic(broker.bootstrap, partitions=2, prefix=f"rt-{client}-{codec}-{acks}")
    records = make_records(
        300,
        partitions=2,
        seed=len(client) * 100 + CODECS.index(codec) * 10 + len(acks),
        null_headers=client != "kafka-python",
    )
    PRODUCERS[client](
        broker.bootstrap, topic, records, codec=codec, acks=acks, idempotent=idempotent
    )
    want = expected(records)
    counts = {p: len(v) for p, v in want.items()}

    got = by_partition(CONSUMERS[client](broker.bootstrap, topic, counts))
    assert got == want

    for p in want:
        on_disk, codecs = read_log(broker.log_dir, topic, p)
        assert on_disk == want[p]
        # The broker stores the producer's batches unchanged: the codec is the producer's.
        assert set(codecs) == {codec}


@pytest.mark.parametrize("consumer", CLIENTS)
def test_cross_client_consume(broker, consumer):
    """Batches written by librdkafka read back identically by every other client."""
    topic = new_topic(broker.bootstrap, partitions=1, prefix=f"cross-{consumer}")
    records = make_records(200, partitions=1, seed=7)
    PRODUCERS["confluent"](
        broker.bootstrap, topic, records, codec="zstd", acks="all", idempotent=True
    )
    want = expected(records)
    got = by_partition(CONSUMERS[consumer](broker.bootstrap, topic, {0: 200}))
    assert got == want
