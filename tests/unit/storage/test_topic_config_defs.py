"""The topic-config registry: Kafka 4.x's rules, broker synonyms, and the README's table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from logstore.errors import InvalidConfigError
from logstore.storage.cleaner import CleanerSettings
from logstore.storage.config import TOPIC_KEYS, LogConfig
from logstore.storage.topic_config import read_topic_config, write_topic_config
from logstore.storage.topic_config_defs import (
    TOPIC_CONFIGS,
    parse_topic_value,
    validate_topic_properties,
)

ROOT = Path(__file__).resolve().parents[3]
_ROW = re.compile(r"^\| `([a-z0-9.]+)` \| (\w+) \| `([^`]*)` \| (implemented|no-op) \|")


def _readme_rows() -> dict[str, tuple[str, str, str]]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Topic configs", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = _ROW.match(line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3), m.group(4))
    return rows


def test_readme_table_matches_the_registry_both_ways():
    rows = _readme_rows()
    assert set(rows) == set(TOPIC_CONFIGS)
    for key, (type_, default, status) in rows.items():
        d = TOPIC_CONFIGS[key]
        assert (type_, status) == (d.type, d.status), key
        shown = {"Long.MAX": str(2**63 - 1), '""': ""}.get(default, default)
        assert shown == d.default, key


def test_every_kafka_4_topic_config_is_known():
    kafka_4 = {
        "cleanup.policy", "compression.type", "compression.gzip.level", "compression.lz4.level",
        "compression.zstd.level", "delete.retention.ms", "file.delete.delay.ms",
        "flush.messages", "flush.ms", "follower.replication.throttled.replicas",
        "index.interval.bytes", "leader.replication.throttled.replicas",
        "local.retention.bytes", "local.retention.ms", "max.compaction.lag.ms",
        "max.message.bytes", "message.timestamp.after.max.ms",
        "message.timestamp.before.max.ms", "message.timestamp.type",
        "min.cleanable.dirty.ratio", "min.compaction.lag.ms", "min.insync.replicas",
        "preallocate", "remote.storage.enable", "remote.log.copy.disable",
        "remote.log.delete.on.disable", "retention.bytes", "retention.ms", "segment.bytes",
        "segment.index.bytes", "segment.jitter.ms", "segment.ms",
        "unclean.leader.election.enable",
    }  # fmt: skip
    assert kafka_4 <= set(TOPIC_CONFIGS)
    # what LogConfig carries is exactly the implemented part of the registry
    implemented = {k for k, d in TOPIC_CONFIGS.items() if d.status == "implemented"}
    assert set(TOPIC_KEYS) == implemented


def test_every_default_obeys_its_own_rule():
    for key, d in TOPIC_CONFIGS.items():
        parse_topic_value(key, d.default)
    assert LogConfig().to_properties() == {k: TOPIC_CONFIGS[k].default for k in TOPIC_KEYS}


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("min.cleanable.dirty.ratio", "1.5", "in [0, 1]"),
        ("min.cleanable.dirty.ratio", "half", "expected a number"),
        ("max.compaction.lag.ms", "0", ">= 1"),
        ("compression.type", "brotli", "one of uncompressed, zstd, lz4, snappy, gzip, producer"),
        ("compression.gzip.level", "0", "-1 or a value in [1, 9]"),
        ("compression.lz4.level", "18", "in [1, 17]"),
        ("compression.zstd.level", "23", "in [-131072, 22]"),
        ("preallocate", "yes", "true or false"),
        ("min.insync.replicas", "0", ">= 1"),
        ("segment.bytes", str(2**31), "out of range for a int"),
        ("cleanup.policy", "compact,shred", "'shred' is not one of compact, delete"),
        ("leader.replication.throttled.replicas", "0:1,x", "partitionId:brokerId"),
        ("message.timestamp.type", "Now", "one of CreateTime, LogAppendTime"),
        ("local.retention.ms", "-3", ">= -2"),
        ("compaction.strategy", "header:", "header:<name>"),
    ],
)
def test_bad_values_name_the_key_and_the_rule(key, value, fragment):
    with pytest.raises(InvalidConfigError) as exc:
        validate_topic_properties({key: value})
    assert key in exc.value.message and fragment in exc.value.message


def test_unknown_key_names_the_nearest_one():
    with pytest.raises(InvalidConfigError) as exc:
        parse_topic_value("min.cleanable.dirty.ration", "0.1")
    assert "unknown topic config 'min.cleanable.dirty.ration'" in exc.value.message
    assert "did you mean 'min.cleanable.dirty.ratio'?" in exc.value.message


def test_good_values_parse_to_kafka_types():
    got = validate_topic_properties(
        {
            "min.cleanable.dirty.ratio": "0.25",
            "preallocate": "TRUE",
            "leader.replication.throttled.replicas": "*",
            "follower.replication.throttled.replicas": "0:1, 1:1",
            "compression.gzip.level": "-1",
            "cleanup.policy": " compact , delete ",
        }
    )
    assert got == {
        "min.cleanable.dirty.ratio": 0.25,
        "preallocate": True,
        "leader.replication.throttled.replicas": "*",
        "follower.replication.throttled.replicas": "0:1,1:1",
        "compression.gzip.level": -1,
        "cleanup.policy": "compact,delete",
    }


def test_log_config_carries_the_implemented_keys_and_their_broker_synonyms():
    cfg = LogConfig.from_properties(
        {"min.cleanable.dirty.ratio": "0.2", "max.compaction.lag.ms": "5000", "x.unknown": "1"}
    )
    assert cfg.min_cleanable_dirty_ratio == 0.2 and cfg.max_compaction_lag_ms == 5000
    broker = LogConfig.from_broker_properties(
        {
            "log.roll.jitter.hours": "2",
            "log.cleaner.min.cleanable.ratio": "0.75",
            "log.preallocate": "true",
            "compression.type": "zstd",
            "log.message.timestamp.after.max.ms": "1000",
            # the finer unit wins, whatever the order
            "log.roll.ms": "5000",
            "log.roll.hours": "1",
            "log.retention.hours": "-1",
        }
    )
    assert broker.segment_jitter_ms == 7_200_000
    assert broker.min_cleanable_dirty_ratio == 0.75
    assert broker.preallocate and broker.compression_type == "zstd"
    assert broker.message_timestamp_after_max_ms == 1000
    assert broker.segment_ms == 5000 and broker.retention_ms == -1
    with pytest.raises(InvalidConfigError, match=r"min\.cleanable\.dirty\.ratio"):
        LogConfig(min_cleanable_dirty_ratio=2.0)


def test_random_segment_jitter_stays_below_its_bound():
    cfg = LogConfig(segment_jitter_ms=1000, segment_ms=300)
    draws = {cfg.random_segment_jitter() for _ in range(500)}
    assert draws <= set(range(300)) and len(draws) > 50
    assert LogConfig().random_segment_jitter() == 0


def test_the_cleaner_plans_with_the_topic_configs_ratio_and_max_lag(tmp_path):
    # what CreateTopics stored is what the log cleaner job's planning reads
    write_topic_config(
        tmp_path, "c", {"min.cleanable.dirty.ratio": "0.25", "max.compaction.lag.ms": "90000"}
    )
    settings = CleanerSettings.from_topic(
        LogConfig.from_properties(read_topic_config(tmp_path, "c"))
    )
    assert settings.min_cleanable_dirty_ratio == 0.25
    assert settings.max_compaction_lag_ms == 90_000
    assert CleanerSettings.from_topic(LogConfig()).min_cleanable_dirty_ratio == 0.5
