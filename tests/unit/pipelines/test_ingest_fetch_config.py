"""``[paths] log_dirs = []`` is allowed for ingest only with a broker to Fetch from."""

from __future__ import annotations

from pathlib import Path

import pytest

from logstore.errors import InvalidConfigError
from pipelines.ingest import load_config


def _conf(tmp_path: Path, ingest: str) -> Path:
    conf = tmp_path / "pipeline.toml"
    conf.write_text(f'[paths]\nlog_dirs = []\nlake = "{tmp_path / "lake"}"\n[ingest]\n{ingest}')
    return conf


def test_no_log_dirs_with_a_bootstrap_server(tmp_path: Path) -> None:
    config = load_config(_conf(tmp_path, 'bootstrap_servers = "127.0.0.1:9092"\n'))
    assert config.log_dirs == () and config.bootstrap_servers == "127.0.0.1:9092"
    config = load_config(_conf(tmp_path, ""), bootstrap_servers="127.0.0.1:1")
    assert config.log_dirs == () and config.bootstrap_servers == "127.0.0.1:1"


def test_no_log_dirs_and_no_broker_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigError, match="log_dirs and lake must be set"):
        load_config(_conf(tmp_path, ""))
