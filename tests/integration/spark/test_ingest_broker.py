"""End to end: real Kafka clients produce to the loglake broker; ingest lands every record once.

confluent-kafka (librdkafka) produces with every codec, headers, null keys and tombstones,
idempotently for some codecs; the broker writes the segments and, on a clean stop, its
checkpoints (high watermarks included). The ``records`` table, read back with deltalake and
polars, must equal what the delivery reports acknowledged, byte for byte.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import polars as pl
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from pipelines.ingest import IngestConfig, run_ingest

pytestmark = pytest.mark.integration

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def _produce(bootstrap: str, topic: str, start: int, n: int) -> list[tuple[Any, ...]]:
    acked: list[tuple[Any, ...]] = []
    errors: list[Any] = []

    def on_delivery(headers: list[tuple[str, bytes | None]], err: Any, msg: Any) -> None:
        # delivery reports do not carry headers back: use the ones this message was sent with
        if err is not None:
            errors.append(err)
            return
        acked.append(
            (msg.partition(), msg.offset(), msg.timestamp()[1], msg.key(), msg.value(), headers)
        )

    for c, codec in enumerate(CODECS):
        producer = ck.Producer(
            {
                "bootstrap.servers": bootstrap,
                "compression.type": codec,
                "linger.ms": 5,
                "enable.idempotence": c % 2 == 0,
            }
        )
        for i in range(start, start + n):
            headers = [("trace", f"t{i}".encode()), ("empty", None)] if i % 3 == 0 else []
            producer.produce(
                topic,
                key=None if i % 4 == 0 else f"key-{codec}-{i}".encode(),
                value=None if i % 7 == 3 else f"{codec}:{i}:".encode() * (i % 11),
                headers=headers or None,
                on_delivery=functools.partial(on_delivery, headers),
            )
        assert producer.flush(60) == 0
    assert not errors, errors
    return acked


def _table_rows(records: Path) -> list[tuple[Any, ...]]:
    cols = ["partition", "offset", "timestamp", "key", "value", "headers"]
    t = DeltaTable(str(records)).to_pyarrow_table().select(cols).to_pylist()
    via_rs = sorted(
        (
            r["partition"],
            r["offset"],
            int(r["timestamp"].timestamp() * 1000),
            r["key"],
            r["value"],
            [(h["key"], h["value"]) for h in r["headers"]],
        )
        for r in t
    )
    via_pl = sorted(
        (
            r["partition"],
            r["offset"],
            int(r["timestamp"].timestamp() * 1000),
            r["key"],
            r["value"],
            [(h["key"], h["value"]) for h in r["headers"]],
        )
        for r in pl.read_delta(str(records)).select(cols).to_dicts()
    )
    assert via_rs == via_pl
    return via_rs


def test_records_produced_through_the_broker_land_exactly_once(
    spark: SparkSession, tmp_path: Path, broker_factory: Any
) -> None:
    broker = broker_factory()
    lake = tmp_path / "lake"
    config = IngestConfig(log_dirs=(str(broker.log_dir),), lake=str(lake), progress_interval_s=0)
    first = _produce(broker.bootstrap, "orders", 0, 25)
    assert broker.stop() == 0  # clean shutdown: checkpoints, high watermarks
    s1 = run_ingest(spark, config, log=lambda _m: None)
    assert s1.records == len(first) == 25 * len(CODECS)
    assert _table_rows(lake / "records") == sorted(first)
    codecs = set(pl.read_delta(str(lake / "records"))["codec"].to_list())
    assert codecs == set(CODECS)

    broker.start()
    second = _produce(broker.bootstrap, "orders", 100, 6)
    assert broker.stop() == 0
    s2 = run_ingest(spark, config, log=lambda _m: None)
    assert s2.records == len(second)
    assert _table_rows(lake / "records") == sorted(first + second)
    assert run_ingest(spark, config, log=lambda _m: None).records == 0
