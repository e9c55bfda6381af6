"""Broker metrics pieces without a broker: the ``metrics.listeners`` key and the error
counts walked out of real kio responses (the integration test scrapes a real broker)."""

from __future__ import annotations

import datetime

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.produce.v9.response import (
    PartitionProduceResponse,
    ProduceResponse,
    TopicProduceResponse,
)
from kio.static.primitive import i32, i64

from logstore.server.config import BrokerConfig, ConfigError
from logstore.server.metrics import error_counts


def test_metrics_listener_parsed_and_off_by_default() -> None:
    assert BrokerConfig({}).metrics_listener is None
    c = BrokerConfig({"metrics.listeners": "http://127.0.0.1:9308"})
    assert c.metrics_listener is not None
    assert (c.metrics_listener.host, c.metrics_listener.port) == ("127.0.0.1", 9308)
    any_host = BrokerConfig({"metrics.listeners": "http://:0"}).metrics_listener
    assert any_host is not None
    assert (any_host.host, any_host.port) == ("0.0.0.0", 0)


@pytest.mark.parametrize(
    "value", ["127.0.0.1:9308", "PLAINTEXT://127.0.0.1:9308", "http://host", "http://h:70000"]
)
def test_metrics_listener_refused(value: str) -> None:
    with pytest.raises(ConfigError, match=r"metrics\.listeners"):
        BrokerConfig({"metrics.listeners": value})


def _partition(index: int, code: ErrorCode) -> PartitionProduceResponse:
    return PartitionProduceResponse(
        index=i32(index),
        error_code=code,
        base_offset=i64(-1),
        log_append_time=None,
        log_start_offset=i64(-1),
        record_errors=(),
        error_message=None,
    )


def test_error_counts_walk_nested_partitions() -> None:
    codes = [ErrorCode.none, ErrorCode.corrupt_message, ErrorCode.corrupt_message]
    response = ProduceResponse(
        responses=(
            TopicProduceResponse(
                name="a", partition_responses=tuple(_partition(i, c) for i, c in enumerate(codes))
            ),
            TopicProduceResponse(
                name="b", partition_responses=(_partition(0, ErrorCode.not_leader_or_follower),)
            ),
        ),
        throttle_time=datetime.timedelta(0),
    )
    assert error_counts(response) == {
        int(ErrorCode.corrupt_message): 2,
        int(ErrorCode.not_leader_or_follower): 1,
    }
