"""ListTransactions / DescribeTransactions over a real coordinator and state log, with a
clock the test sets: the duration filter's boundary, Prepare* states (a marker that cannot be
written), expired ids, and the handlers' answers (kio-encoded and decoded back), including
COORDINATOR_NOT_AVAILABLE, which the real broker cannot be caught in over the wire (its
coordinator is loaded before its listener opens)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from logstore.server.context import RequestContext
from logstore.server.handlers import describe_transactions, list_transactions
from logstore.server.txn.coordinator import TxnConfig
from logstore.server.txn.schemas import TxnState
from tests.unit.server.txn.test_txn_coordinator import T0, Env


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path / "logs", TxnConfig(max_timeout_ms=60_000, id_expiration_ms=3_600_000))
    yield e
    e.close()


def _init(env: Env, txn: str) -> tuple[int, int]:
    err, pid, epoch = env.tc.init_producer_id(txn, 10_000)
    assert err is ErrorCode.none
    return pid, epoch


def _call(coordinator: Any, api_key: int, version: int, **body: Any) -> Any:
    """One request through the handler; the response after a kio write/read round trip."""
    mod = {65: describe_transactions, 66: list_transactions}[api_key]
    request = load_request_schema(api_key, version)(**body)
    ctx = RequestContext(
        broker=SimpleNamespace(txn_coordinator=coordinator),
        config=None,  # type: ignore[arg-type]
        api_key=api_key,
        api_version=version,
        correlation_id=1,
        client_id="unit",
        connection_id="c-1",
        client_host="127.0.0.1",
    )
    response = mod.handle(ctx, request)
    cls = load_response_schema(api_key, version)
    assert type(response) is cls
    buf = io.BytesIO()
    entity_writer(cls)(buf, response)
    decoded, _size = entity_reader(cls)(buf.getvalue(), 0)
    return decoded


def test_state_names_are_kafkas() -> None:
    names = [s.kafka_name for s in TxnState]
    assert names == [
        "Empty",
        "Ongoing",
        "PrepareCommit",
        "PrepareAbort",
        "CompleteCommit",
        "CompleteAbort",
        "Dead",
        "PrepareEpochFence",
    ]
    assert all(TxnState.from_kafka_name(n) is s for n, s in zip(names, TxnState, strict=True))
    assert TxnState.from_kafka_name("ongoing") is None  # case-sensitive, as Kafka


def test_list_filters_and_the_duration_boundary(env: Env) -> None:
    pid_o, epoch_o = _init(env, "open")
    pid_c, epoch_c = _init(env, "done")
    pid_e, _ = _init(env, "idle")
    env.now = T0 + 100
    env.tc.add_partitions("open", pid_o, epoch_o, [("t", 0)])
    env.tc.add_partitions("done", pid_c, epoch_c, [("t", 1)])
    assert env.tc.end_txn("done", pid_c, epoch_c, commit=True) is ErrorCode.none
    env.now = T0 + 1100
    assert env.tc.list_transactions() == [
        ("done", pid_c, TxnState.COMPLETE_COMMIT),
        ("idle", pid_e, TxnState.EMPTY),
        ("open", pid_o, TxnState.ONGOING),
    ]
    assert env.tc.list_transactions(states=frozenset({TxnState.ONGOING})) == [
        ("open", pid_o, TxnState.ONGOING)
    ]
    assert env.tc.list_transactions(producer_ids=frozenset({pid_c, 999_999})) == [
        ("done", pid_c, TxnState.COMPLETE_COMMIT)
    ]
    # Started 1000 ms ago: "longer than 999" yes, "longer than 1000" no (Kafka's <=).
    ongoing = frozenset({TxnState.ONGOING})
    assert [t for t, _, _ in env.tc.list_transactions(states=ongoing, min_duration_ms=999)] == [
        "open"
    ]
    assert env.tc.list_transactions(states=ongoing, min_duration_ms=1000) == []
    # The start of a completed transaction is kept; an id that never began one has start
    # -1, so Kafka's comparison lets it through any duration.
    assert [t for t, _, _ in env.tc.list_transactions(min_duration_ms=1000)] == ["idle"]
    assert [t for t, _, _ in env.tc.list_transactions(min_duration_ms=999)] == [
        "done",
        "idle",
        "open",
    ]

    resp = _call(env.tc, 66, 1, state_filters=("Ongoing", "Nope"), duration_filter=999)
    assert resp.error_code is ErrorCode.none
    assert resp.unknown_state_filters == ("Nope",)
    assert [
        (s.transactional_id, s.producer_id, s.transaction_state) for s in resp.transaction_states
    ] == [("open", pid_o, "Ongoing")]
    resp = _call(env.tc, 66, 0, state_filters=("Nope",))
    assert resp.transaction_states == () and resp.unknown_state_filters == ("Nope",)


def test_prepare_states_show_the_partitions_still_without_markers(env: Env) -> None:
    pid, epoch = _init(env, "tx")
    env.now = T0 + 5
    env.tc.add_partitions("tx", pid, epoch, [("t", 0), ("u", 2), ("t", 1)])
    env.markers.fail = True
    assert env.tc.end_txn("tx", pid, epoch, commit=False) is ErrorCode.none
    (d,) = _call(env.tc, 65, 0, transactional_ids=("tx",)).transaction_states
    assert d.error_code is ErrorCode.none
    assert (d.transaction_state, d.producer_id, d.producer_epoch) == ("PrepareAbort", pid, epoch)
    assert [(t.topic, t.partitions) for t in d.topics] == [("t", (0, 1)), ("u", (2,))]
    assert round(d.transaction_start_time.timestamp() * 1000) == T0 + 5
    assert d.transaction_timeout.total_seconds() == 10.0
    resp = _call(env.tc, 66, 0, state_filters=("PrepareAbort",))
    assert [s.transactional_id for s in resp.transaction_states] == ["tx"]
    env.markers.fail = False
    assert env.tc.complete_pending() == 1
    (d,) = _call(env.tc, 65, 0, transactional_ids=("tx",)).transaction_states
    assert (d.transaction_state, d.topics) == ("CompleteAbort", ())


def test_expired_and_unknown_ids_are_not_found(env: Env) -> None:
    _init(env, "old")
    env.now += 3_600_000
    assert env.tc.expire_transactional_ids() == 1
    states = _call(env.tc, 65, 0, transactional_ids=("old", "", "never")).transaction_states
    assert [s.error_code for s in states] == [
        ErrorCode.transactional_id_not_found,
        ErrorCode.invalid_request,
        ErrorCode.transactional_id_not_found,
    ]
    assert env.tc.list_transactions() == []


def test_no_coordinator_answers_coordinator_not_available() -> None:
    resp = _call(None, 66, 1, state_filters=("Ongoing",))
    assert resp.error_code is ErrorCode.coordinator_not_available
    assert resp.transaction_states == ()
    states = _call(None, 65, 0, transactional_ids=("a", "b")).transaction_states
    assert [(s.transactional_id, s.error_code) for s in states] == [
        ("a", ErrorCode.coordinator_not_available),
        ("b", ErrorCode.coordinator_not_available),
    ]
