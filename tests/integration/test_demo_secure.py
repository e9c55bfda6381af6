"""``make demo --secure``'s broker and producers (the stages before Airflow, which
tests/integration/test_demo.py runs whole): the broker's only listener is SASL_PLAINTEXT, the
demo user is made with ``loglake users``, the producers and the watermark consumer log in with
``client.properties`` (read back by confluent-kafka), and the pipeline TOML the DAGs get names
it in ``[kafka]``; a client without the login gets nothing."""

from __future__ import annotations

from pathlib import Path

import confluent_kafka as ck
import pytest

from pipelines.demo import TOPICS, Demo
from pipelines.ingest import load_config

pytestmark = pytest.mark.integration


def test_secure_demo_broker_and_producers(tmp_path: Path) -> None:
    demo = Demo(work=tmp_path / "demo", records=40, secure=True)
    demo.work.mkdir()
    try:
        demo.start_broker()
        demo.produce()
        demo.write_config()
        props = demo.client_properties.read_text()
        assert "security.protocol=SASL_PLAINTEXT" in props and 'username="demo"' in props
        assert set(demo.sent) == set(TOPICS) and demo.sent["orders"] == 40
        low, high = demo.watermarks("clicks")  # over SASL, as the demo's own consumer
        assert (low, high) == (0, demo.sent["clicks"])
        config = load_config(demo.config)
        assert config.kafka is not None and config.kafka.sasl_mechanism == "SCRAM-SHA-512"
        assert config.kafka.username == "demo"
        # without the login: the broker answers nothing but ApiVersions and SASL
        c = ck.Consumer({"bootstrap.servers": demo.bootstrap, "group.id": "x"})
        with pytest.raises(ck.KafkaException):
            c.get_watermark_offsets(ck.TopicPartition("clicks", 0), timeout=5)
        c.close()
    finally:
        demo.stop_broker()
