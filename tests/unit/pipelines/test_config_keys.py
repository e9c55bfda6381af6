"""conf/pipeline.toml: unknown sections and keys are refused, naming the nearest valid one."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from logstore.errors import LoglakeError
from pipelines.config import check_keys
from pipelines.ingest import load_config

ROOT = Path(__file__).resolve().parents[3]


def test_the_shipped_config_is_valid() -> None:
    data = tomllib.loads((ROOT / "conf" / "pipeline.toml").read_text())
    check_keys(data, "conf/pipeline.toml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[ingest]\nfail_on_corupt = true\n",
            "unknown key 'fail_on_corupt' in [ingest]; did you mean 'fail_on_corrupt'?",
        ),
        ("[ingst]\ntopics = []\n", "unknown section [ingst]; did you mean 'ingest'?"),
        ("[paths]\nlake_dir = 'x'\n", "unknown key 'lake_dir' in [paths]; did you mean 'lake'?"),
        ("[spark]\nmastr = 'local[1]'\n", "did you mean 'master'?"),
        ("[ingest]\nxyzzy = 1\n", "unknown key 'xyzzy' in [ingest]"),
        ("paths = 3\n", "[paths] must be a table"),
    ],
)
def test_unknown_keys_are_refused(tmp_path: Path, text: str, message: str) -> None:
    conf = tmp_path / "pipeline.toml"
    conf.write_text(text)
    with pytest.raises(LoglakeError) as info:
        load_config(conf, log_dirs=["logs"], lake="lake")
    assert message in str(info.value)
    assert str(conf) in str(info.value)


def test_free_form_sections_take_any_key(tmp_path: Path) -> None:
    conf = tmp_path / "pipeline.toml"
    conf.write_text('[spark.conf]\n"spark.sql.shuffle.partitions" = "3"\n"anything.else" = "x"\n')
    config = load_config(conf, log_dirs=["logs"], lake="lake")
    assert config.spark_conf == {"spark.sql.shuffle.partitions": "3", "anything.else": "x"}


def test_ingest_lake_group_keys(tmp_path: Path) -> None:
    conf = tmp_path / "pipeline.toml"
    conf.write_text('[ingest]\nbootstrap_servers = "h:1"\nlake_group = "lg"\n')
    config = load_config(conf, log_dirs=["logs"], lake="lake")
    assert (config.bootstrap_servers, config.lake_group) == ("h:1", "lg")
    over = load_config(conf, log_dirs=["logs"], lake="lake", bootstrap_servers="h:2")
    assert over.bootstrap_servers == "h:2"
    shipped = load_config(ROOT / "conf" / "pipeline.toml", log_dirs=["logs"], lake="lake")
    assert (shipped.bootstrap_servers, shipped.lake_group) == ("", "loglake-ingest")
    conf.write_text('[ingest]\nlake_group = ""\n')
    with pytest.raises(LoglakeError, match="lake_group must not be empty"):
        load_config(conf, log_dirs=["logs"], lake="lake")
    conf.write_text('[ingest]\nlake_grup = "x"\n')
    with pytest.raises(LoglakeError, match="did you mean 'lake_group'"):
        load_config(conf, log_dirs=["logs"], lake="lake")
