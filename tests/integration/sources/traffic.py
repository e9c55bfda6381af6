"""Traffic for the Fetch tests: every codec, transactions with aborts, tombstones, headers."""

from __future__ import annotations

import confluent_kafka as ck

from tests.integration.broker.clients import ck_produce, make_records, new_topic

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
PARTITIONS = 3


def _txn_produce(bootstrap: str, topic: str) -> tuple[int, int]:
    """Committed and aborted transactions on every partition: (committed, aborted) counts."""
    p = ck.Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"fetch-{topic}",
            "compression.type": "lz4",
            "linger.ms": 5,
        }
    )
    p.init_transactions(30)
    committed = aborted = 0
    for round_ in range(4):
        p.begin_transaction()
        for i in range(30):
            p.produce(
                topic, key=b"t%d" % i, value=None if i % 9 == 0 else b"txn-%d-%d" % (round_, i),
                partition=i % PARTITIONS, headers=[("round", b"%d" % round_)],
            )  # fmt: skip
        p.flush(30)
        if round_ % 2:
            p.abort_transaction(30)
            aborted += 30
        else:
            p.commit_transaction(30)
            committed += 30
    return committed, aborted


def produce_all(bootstrap: str, **configs: str) -> tuple[str, int]:
    """A new topic (``configs``: its settings) holding every kind of batch; ``(topic, records
    a read_committed read sees)``."""
    topic = new_topic(bootstrap, partitions=PARTITIONS, prefix="fetchsrc", **configs)
    n = 0
    for seed, codec in enumerate(CODECS):
        records = make_records(150, partitions=PARTITIONS, seed=seed)
        ck_produce(bootstrap, topic, records, codec=codec, acks="all", idempotent=True,
                   flush_every=25)  # fmt: skip
        n += len(records)
    committed, _aborted = _txn_produce(bootstrap, topic)
    ck_produce(bootstrap, topic, make_records(60, partitions=PARTITIONS, seed=99),
               codec="zstd", acks="all", idempotent=False)  # fmt: skip
    return topic, n + committed + 60
