"""Per-topic overrides in <log_dir>/topic-configs and LogConfig parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from logstore.errors import InvalidConfigError, InvalidTopicError
from logstore.storage.config import LogConfig
from logstore.storage.topic_config import (
    delete_topic_config,
    format_properties,
    is_compacted,
    parse_properties,
    read_topic_config,
    read_topic_configs,
    write_topic_config,
)


def test_write_read_delete(tmp_path: Path) -> None:
    write_topic_config(tmp_path, "orders", {"cleanup.policy": "compact", "segment.bytes": "1024"})
    path = tmp_path / "topic-configs" / "orders.properties"
    assert path.read_text() == "cleanup.policy=compact\nsegment.bytes=1024\n"
    write_topic_config(tmp_path, "b", {})
    assert read_topic_configs(tmp_path) == {
        "b": {},
        "orders": {"cleanup.policy": "compact", "segment.bytes": "1024"},
    }
    delete_topic_config(tmp_path, "orders")
    assert read_topic_config(tmp_path, "orders") == {}
    delete_topic_config(tmp_path, "orders")  # absent: fine


def test_topic_names_cannot_escape(tmp_path: Path) -> None:
    with pytest.raises(InvalidTopicError):
        write_topic_config(tmp_path, "../evil", {"a": "b"})
    assert not (tmp_path / "evil.properties").exists()


def test_properties_escaping_round_trips() -> None:
    props = {
        "a key": "x=y:z",
        "uni": "caf\u00e9 \u2603 \U0001f600",
        "lead": " spaced",
        "nl": "a\nb\\c#",
    }
    text = format_properties(props)
    assert text.isascii()
    assert parse_properties(text) == props


def test_properties_parser_handles_java_syntax() -> None:
    text = "# comment\n! also\n  a = 1\nb:2\nc 3\nlong = one \\\n    two\nempty=\n"
    assert parse_properties(text) == {"a": "1", "b": "2", "c": "3", "long": "one two", "empty": ""}


def test_log_config_from_properties() -> None:
    cfg = LogConfig.from_properties(
        {
            "segment.bytes": "2048",
            "cleanup.policy": "compact, delete",
            "unknown.key": "x",
            "message.timestamp.type": "LogAppendTime",
            "retention.ms": "-1",
        }
    )
    assert cfg.segment_bytes == 2048
    assert cfg.compact and cfg.delete
    assert cfg.log_append_time
    assert cfg.retention_ms == -1
    assert cfg.index_interval_bytes == 4096  # Kafka's default kept
    over = LogConfig.from_properties({"segment.ms": "10"}, defaults=cfg)
    assert over.segment_ms == 10 and over.segment_bytes == 2048
    assert LogConfig().overrides() == {}
    assert over.overrides(cfg) == {"segment.ms": "10"}


@pytest.mark.parametrize(
    "props",
    [
        {"segment.bytes": "abc"},
        {"segment.bytes": "1"},
        {"cleanup.policy": "nope"},
        {"message.timestamp.type": "Wall"},
        {"retention.ms": "-5"},
    ],
)
def test_log_config_rejects_bad_values(props: dict[str, str]) -> None:
    with pytest.raises(InvalidConfigError):
        LogConfig.from_properties(props)


def test_broker_keys_finer_unit_wins() -> None:
    cfg = LogConfig.from_broker_properties(
        {"log.retention.hours": "1", "log.retention.ms": "5000", "log.segment.bytes": "4096"}
    )
    assert cfg.retention_ms == 5000 and cfg.segment_bytes == 4096
    assert LogConfig.from_broker_properties({"log.retention.hours": "2"}).retention_ms == 7_200_000


@pytest.mark.parametrize(
    ("policy", "compacted"),
    [("compact", True), ("delete,compact", True), (" compact , delete", True),
     ("delete", False), ("", False), (None, False), ("compaction", False)],
)  # fmt: skip
def test_is_compacted_reads_cleanup_policy_as_a_list(policy: str | None, compacted: bool) -> None:
    props = {} if policy is None else {"cleanup.policy": policy}
    assert is_compacted(props) is compacted
