"""kill -9 of the broker in the middle of transactions (real confluent-kafka clients).

- mid-transaction: records of an open transaction are in the log when the broker dies; after
  the restart the transaction is still Ongoing (``__transaction_state``) and is aborted —
  by the next producer of its id, or by the broker at its timeout — and everything
  committed before is still there.
- between the decision and the markers (``LOGLAKE_FAILPOINT=txn.after_prepare``: the
  broker SIGKILLs itself right after appending PrepareCommit) and between the markers and
  CompleteCommit (``txn.after_markers``): the restarted broker writes the markers and
  completes the commit; the producer's retried ``commit_transaction`` succeeds and
  READ_COMMITTED consumers see the records.
"""

from __future__ import annotations

import time

import confluent_kafka as ck
import pytest

from logstore.failpoints import FAILPOINT_ENV
from tests.integration.broker.clients import new_topic
from tests.integration.broker.test_transactions import CONSUMERS, END, ck_read

pytestmark = pytest.mark.integration


def _producer(bootstrap: str, txn_id: str, **conf: object) -> ck.Producer:
    p = ck.Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 5, **conf}
    )
    p.init_transactions(30)
    return p


def _committed_txn(p: ck.Producer, topic: str, values: list[bytes]) -> None:
    p.begin_transaction()
    for v in values:
        p.produce(topic, value=v, partition=0)
    p.commit_transaction(30)


def _wait_for(b, text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while text not in b.log_text():
        if time.monotonic() > deadline:
            raise AssertionError(f"{text!r} not in the broker log:\n{b.log_tail()}")
        time.sleep(0.1)


def test_kill_mid_transaction_then_a_new_producer_aborts_it(broker_factory):
    b = broker_factory()
    topic = new_topic(b.bootstrap, partitions=1, prefix="crash-mid")
    txn_id = f"mid-{topic}"
    p = _producer(b.bootstrap, txn_id)
    _committed_txn(p, topic, [b"kept-%d" % i for i in range(5)])
    p.begin_transaction()
    for i in range(4):
        p.produce(topic, value=b"open-%d" % i, partition=0)
    p.flush(30)
    b.kill()
    b.start()
    assert "loaded 1 transactional ids {'ONGOING': 1}" in b.log_text()
    q = _producer(b.bootstrap, txn_id)  # fences p, aborts the open transaction
    _committed_txn(q, topic, [b"after", END])
    want = [b"kept-%d" % i for i in range(5)] + [b"after"]
    for name, read in CONSUMERS.items():
        assert read(b.bootstrap, topic, "read_committed") == want, name
    uncommitted = ck_read(b.bootstrap, topic, "read_uncommitted")
    assert uncommitted == want[:5] + [b"open-%d" % i for i in range(4)] + [b"after"]


def test_kill_mid_transaction_then_its_timeout_aborts_it(broker_factory):
    b = broker_factory(**{"transaction.abort.timed.out.transaction.cleanup.interval.ms": 200})
    topic = new_topic(b.bootstrap, partitions=1, prefix="crash-timeout")
    txn_id = f"to-{topic}"
    p = _producer(b.bootstrap, txn_id, **{"transaction.timeout.ms": 4000})
    _committed_txn(p, topic, [b"kept"])
    p.begin_transaction()
    p.produce(topic, value=b"open", partition=0)
    p.flush(30)
    b.kill()
    b.start()
    _wait_for(b, f"transaction '{txn_id}'")
    _wait_for(b, "timed out after 4000 ms: aborting")
    q = _producer(b.bootstrap, txn_id)
    _committed_txn(q, topic, [END])
    for name, read in CONSUMERS.items():
        assert read(b.bootstrap, topic, "read_committed") == [b"kept"], name


@pytest.mark.parametrize("failpoint", ["txn.after_prepare", "txn.after_markers"])
def test_kill_during_commit_completes_the_commit_on_restart(broker_factory, monkeypatch, failpoint):
    b = broker_factory()
    topic = new_topic(b.bootstrap, partitions=2, prefix="crash-commit")
    txn_id = f"commit-{topic}"
    p = _producer(b.bootstrap, txn_id)
    _committed_txn(p, topic, [b"first"])
    b.stop()
    monkeypatch.setenv(FAILPOINT_ENV, failpoint)
    b.start()
    monkeypatch.delenv(FAILPOINT_ENV)
    p.begin_transaction()
    for i in range(6):
        p.produce(topic, value=b"decided-%d" % i, partition=i % 2)
    p.flush(30)
    with pytest.raises(ck.KafkaException) as exc:
        p.commit_transaction(5)
    assert exc.value.args[0].retriable(), exc.value
    assert b.proc is not None and b.proc.wait(30) == -9
    assert f"failpoint {failpoint}: killing the process" in b.log_text()
    b.start()
    last_start = b.log_text().split("=== start")[-1]
    assert "loaded 1 transactional ids {'PREPARE_COMMIT': 1}" in last_start
    assert "completed 1 of 1 transactions decided before the restart" in last_start
    p.commit_transaction(30)  # the retry finds the transaction committed
    _committed_txn(p, topic, [END])
    want = [b"first"] + [b"decided-%d" % i for i in range(0, 6, 2)]
    for name, read in CONSUMERS.items():
        assert read(b.bootstrap, topic, "read_committed") == want, name
