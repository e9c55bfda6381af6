"""The tier's keys: the broker's (validated by BrokerConfig, read by TierConfig) and the topic
keys' cross rules (Kafka's)."""

from __future__ import annotations

import re

import pytest

from logstore.errors import InvalidConfigError
from logstore.server.config import BrokerConfig, ConfigError
from logstore.storage.config import LogConfig
from logstore.storage.topic_config_defs import validate_topic_properties
from logstore.tier import TierConfig

ENV = {
    "AWS_ACCESS_KEY_ID": "env-key",
    "AWS_SECRET_ACCESS_KEY": "env-secret",
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
    "AWS_REGION": "eu-west-1",
}


def _tier(monkeypatch, **props):
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    return TierConfig.from_broker(BrokerConfig(props))


def test_off_by_default(monkeypatch):
    assert _tier(monkeypatch) is None


def test_the_plugins_keys_override_the_aws_environment(monkeypatch):
    cfg = _tier(
        monkeypatch,
        **{
            "remote.log.storage.system.enable": "true",
            "rsm.config.storage.s3.bucket.name": "b",
            "rsm.config.storage.s3.region": "us-west-2",
            "rsm.config.storage.aws.access.key.id": "plugin-key",
            "rsm.config.key.prefix": "tiered/",
            "rsm.config.chunk.size": "1000",
            "remote.log.manager.task.interval.ms": "500",
        },
    )
    assert cfg is not None
    assert (cfg.bucket, cfg.key_prefix, cfg.chunk_size, cfg.interval_ms) == (
        "b",
        "tiered/",
        1000,
        500,
    )
    assert cfg.settings.region == "us-west-2"
    assert cfg.settings.access_key_id == "plugin-key"
    assert cfg.settings.secret_access_key == "env-secret"
    assert cfg.settings.endpoint_url == "http://127.0.0.1:9000"
    assert cfg.metadata_partitions == 50


@pytest.mark.parametrize(
    ("props", "why"),
    [
        ({}, "bucket.name"),
        (
            {"rsm.config.storage.s3.bucket.name": "b", "rsm.config.encryption.enabled": "true"},
            "encryption",
        ),
    ],
)
def test_what_the_tier_cannot_do_is_refused_at_start(monkeypatch, props, why):
    with pytest.raises(InvalidConfigError, match=why):
        _tier(monkeypatch, **{"remote.log.storage.system.enable": "true", **props})


def test_compression_is_the_plugins_option(monkeypatch):
    base = {"remote.log.storage.system.enable": "true", "rsm.config.storage.s3.bucket.name": "b"}
    assert _tier(monkeypatch, **base).compression is False
    on = _tier(monkeypatch, **base, **{"rsm.config.compression.enabled": "true"})
    assert on.compression is True


def test_bad_values_and_typos_are_refused_naming_the_key():
    with pytest.raises(ConfigError, match=re.escape("rsm.config.chunk.size")):
        BrokerConfig({"rsm.config.chunk.size": "0"})
    with pytest.raises(ConfigError, match=re.escape("did you mean 'rsm.config.key.prefix'")):
        BrokerConfig({"rsm.config.key.prefx": "x"})
    with pytest.raises(ConfigError, match=re.escape("log.local.retention.ms")):
        BrokerConfig({"log.local.retention.ms": "-3"})


def test_topic_rules_are_kafkas():
    with pytest.raises(InvalidConfigError, match="compacted"):
        validate_topic_properties({"remote.storage.enable": "true", "cleanup.policy": "compact"})
    with pytest.raises(InvalidConfigError, match=re.escape("local.retention.ms")):
        validate_topic_properties({"local.retention.ms": "5000", "retention.ms": "1000"})
    with pytest.raises(InvalidConfigError, match=re.escape("local.retention.bytes")):
        validate_topic_properties({"local.retention.bytes": "-1", "retention.bytes": "1000"})
    validate_topic_properties({"local.retention.ms": "-2", "retention.ms": "1000"})
    validate_topic_properties({"local.retention.bytes": "10", "retention.bytes": "-1"})


def test_log_config_resolves_minus_two_and_never_tiers_a_compacted_topic():
    cfg = LogConfig.from_properties(
        {"remote.storage.enable": "true", "retention.ms": "1000", "local.retention.bytes": "5"}
    )
    assert cfg.tiered
    assert (cfg.effective_local_retention_ms, cfg.effective_local_retention_bytes) == (1000, 5)
    assert not LogConfig.from_properties(
        {"remote.storage.enable": "true", "cleanup.policy": "compact,delete"}
    ).tiered
    # the broker default of the topic key
    assert LogConfig.from_broker_properties({"log.local.retention.ms": "7"}).local_retention_ms == 7
