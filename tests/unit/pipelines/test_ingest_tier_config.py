"""``[paths] remote_log_storage`` / ``--remote-log-storage``: validated like the other keys,
read by ingest with a broker (its ``__remote_log_metadata``), with or without log dirs;
refused without a broker."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.ingest import main
from logstore.errors import InvalidConfigError
from pipelines.config import read_pipeline_toml
from pipelines.ingest import load_config


def _conf(tmp_path: Path, paths: str, ingest: str = 'bootstrap_servers = "127.0.0.1:9092"') -> Path:
    conf = tmp_path / "pipeline.toml"
    conf.write_text(f'[paths]\nlake = "{tmp_path / "lake"}"\n{paths}\n[ingest]\n{ingest}\n')
    return conf


def test_the_tier_is_read_with_a_broker_and_no_log_dirs(tmp_path: Path) -> None:
    conf = _conf(tmp_path, 'log_dirs = []\nremote_log_storage = "s3://bucket/tiered"')
    assert load_config(conf).remote_log_storage == "s3://bucket/tiered"
    over = load_config(conf, remote_log_storage="s3://other/p")
    assert over.remote_log_storage == "s3://other/p"
    assert load_config(_conf(tmp_path, "log_dirs = []")).remote_log_storage == ""


def test_the_tier_with_log_dirs_is_read_with_a_broker(tmp_path: Path) -> None:
    # below the log dirs' start (pipelines.ingest, step 1)
    paths = 'log_dirs = ["/tmp/x"]\nremote_log_storage = "s3://b/p"'
    config = load_config(_conf(tmp_path, paths, 'bootstrap_servers = "h:1"'))
    assert config.log_dirs == ("/tmp/x",)
    assert config.remote_log_storage == "s3://b/p"


def test_the_tier_without_a_broker_is_refused(tmp_path: Path) -> None:
    # the live segments are read from the cluster's __remote_log_metadata
    paths = 'log_dirs = ["/tmp/x"]\nremote_log_storage = "s3://b/p"'
    with pytest.raises(InvalidConfigError, match="remote_log_storage is read with"):
        load_config(_conf(tmp_path, paths, 'bootstrap_servers = ""'))


def test_a_location_that_is_none_is_refused_naming_the_key(tmp_path: Path) -> None:
    conf = _conf(tmp_path, 'log_dirs = []\nremote_log_storage = "ftp://b/p"')
    with pytest.raises(InvalidConfigError, match="remote_log_storage") as err:
        read_pipeline_toml(conf)
    assert "s3://bucket/prefix" in str(err.value)
    conf = _conf(tmp_path, 'log_dirs = []\nremote_log_store = "s3://b/p"')
    with pytest.raises(InvalidConfigError, match="remote_log_storage"):  # the nearest key
        read_pipeline_toml(conf)


def test_the_option_is_checked_before_spark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = _conf(tmp_path, "log_dirs = []")
    with pytest.raises(SystemExit) as exit_:
        main(["--config", str(conf), "--remote-log-storage", "s3://b/../x"])
    assert exit_.value.code == 2
    assert "--remote-log-storage" in capsys.readouterr().err
