"""pipelines.compaction.due: the cleaner's settings, each topic's own config over the broker
config's defaults, and whether cleaning runs at all (Kafka's keys and defaults)."""

from __future__ import annotations

from pathlib import Path

import pytest

from logstore.errors import InvalidConfigError
from logstore.storage.cleaner import CleanerSettings
from logstore.storage.topic_config import write_topic_config
from pipelines.compaction.due import (
    broker_config_path,
    cleaner_defaults,
    load_cleaner_defaults,
    topic_settings,
)

LONG_MAX = 2**63 - 1


def test_kafkas_defaults_without_a_broker_config(tmp_path: Path) -> None:
    defaults = load_cleaner_defaults(None)
    assert defaults.enabled is True
    config, settings = topic_settings(tmp_path, "t", defaults)
    assert settings == CleanerSettings()  # ratio 0.5, no max lag, no min lag, 24 h tombstones
    assert settings.max_compaction_lag_ms == LONG_MAX
    assert config.segment_bytes == 1024**3


def test_the_topic_config_wins_over_the_broker_defaults(tmp_path: Path) -> None:
    broker = tmp_path / "broker.properties"
    broker.write_text(
        "log.cleaner.min.cleanable.ratio=0.2\nlog.cleaner.max.compaction.lag.ms=60000\n"
        "log.cleaner.min.compaction.lag.ms=5000\nlog.segment.bytes=4096\n"
        "log.cleaner.delete.retention.ms=1000\nnum.partitions=3\n"
    )
    defaults = load_cleaner_defaults(broker)
    _, settings = topic_settings(tmp_path, "plain", defaults)
    assert (settings.min_cleanable_dirty_ratio, settings.max_compaction_lag_ms) == (0.2, 60000)
    assert (settings.min_compaction_lag_ms, settings.segment_bytes) == (5000, 4096)
    assert settings.delete_retention_ms == 1000
    write_topic_config(
        tmp_path, "own", {"min.cleanable.dirty.ratio": "0.9", "min.compaction.lag.ms": "7"}
    )
    _, own = topic_settings(tmp_path, "own", defaults)
    assert (own.min_cleanable_dirty_ratio, own.min_compaction_lag_ms) == (0.9, 7)
    assert (own.max_compaction_lag_ms, own.segment_bytes) == (60000, 4096)  # the broker's


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"log.cleaner.enable": "maybe"}, "log.cleaner.enable = 'maybe': must be true or false"),
        (
            {"log.cleaner.min.cleanable.ratio": "1.5"},
            "log.cleaner.min.cleanable.ratio='1.5': expected a value in [0, 1]",
        ),
        (
            {"log.cleaner.max.compaction.lag.ms": "0"},
            "log.cleaner.max.compaction.lag.ms='0': expected a value >= 1",
        ),
        (
            {"log.cleaner.max.compaction.lag.ms": "soon"},
            "log.cleaner.max.compaction.lag.ms='soon': expected an integer",
        ),
        ({"log.segment.bytes": "big"}, "log.segment.bytes='big': expected an integer"),
    ],
)
def test_bad_values_are_refused_naming_the_file(props: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidConfigError) as err:
        cleaner_defaults(props, source="conf/broker.properties")
    assert message in str(err.value) and "conf/broker.properties" in str(err.value)


def test_log_cleaner_enable(tmp_path: Path) -> None:
    assert cleaner_defaults({"log.cleaner.enable": "false"}).enabled is False
    assert cleaner_defaults({"log.cleaner.enable": " TRUE "}).enabled is True
    with pytest.raises(InvalidConfigError, match="cannot read the broker config"):
        load_cleaner_defaults(tmp_path / "missing.properties")


def test_which_broker_config(tmp_path: Path) -> None:
    toml = tmp_path / "pipeline.toml"
    toml.write_text('[retention]\nbroker_config = "/etc/loglake/broker.properties"\n')
    assert broker_config_path(toml, "/x.properties") == "/x.properties"
    assert broker_config_path(toml) == "/etc/loglake/broker.properties"
    toml.write_text("[paths]\n")
    assert broker_config_path(toml).endswith("conf/broker.properties")
