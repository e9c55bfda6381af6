"""conf/pipeline.toml is a typed schema: unknown sections and keys are refused naming the
nearest valid one, and every value is checked for its type, range, choices and rules, through
a real job entry point (``jobs/<job>.py main``: exit 2 and a message naming the key, the
value and what was expected) before the job imports Spark. Nothing is coerced."""

from __future__ import annotations

from pathlib import Path

import pytest

from logstore.errors import InvalidConfigError
from pipelines.config import SECTIONS, FreeForm, read_pipeline_toml
from pipelines.ingest import load_config
from tests.fixtures.jobs import load_job

ROOT = Path(__file__).resolve().parents[3]


def test_the_shipped_config_is_valid() -> None:
    data = read_pipeline_toml(ROOT / "conf" / "pipeline.toml")
    # ... and names every fixed key of the schema (commented out keys aside), so the file
    # documents them all.
    text = (ROOT / "conf" / "pipeline.toml").read_text()
    for section, spec in SECTIONS.items():
        assert f"[{section}]" in text
        if not isinstance(spec, FreeForm):
            for key in spec:
                assert f"{key} = " in text, f"[{section}] {key} not in conf/pipeline.toml"
    assert data["ingest"]["fail_on_corrupt"] is False


BAD = [
    # the three cases of issue 20: a truthy string, a string iterated as letters, a negative size
    ('[ingest]\nfail_on_corrupt = "false"\n',
     '[ingest] fail_on_corrupt = "false": expected a boolean (true or false, unquoted), '
     "got a string"),
    ('[ingest]\ntopics = "orders"\n', '[ingest] topics = "orders": expected a list, got a string'),
    ("[ingest]\nmax_partition_bytes = -5\n",
     "[ingest] max_partition_bytes = -5: expected an integer >= 1"),
    # one per type rule
    ("[compact]\nbuckets = 1.5\n", "[compact] buckets = 1.5: expected an integer, got a number"),
    ("[compact]\nbuckets = 70000\n", "[compact] buckets = 70000: expected an integer in 1..65536"),
    ("[compact]\nbuckets = true\n", "[compact] buckets = true: expected an integer, got a boolean"),
    ('[retention]\nvacuum_hours = "7"\n',
     '[retention] vacuum_hours = "7": expected a number, got a string'),
    ("[retention]\nvacuum_hours = -0.5\n", "vacuum_hours = -0.5: expected a number >= 0"),
    ("[retention]\nvacuum_hours = inf\n", "vacuum_hours = inf: expected a finite number"),
    ("[quality]\nmax_future_skew_s = nan\n", "max_future_skew_s = nan: expected a finite number"),
    ('[quality]\ndocs = "yes"\n', '[quality] docs = "yes": expected a boolean'),
    ("[quality]\nmax_quarantined_batches = -1\n", "expected an integer >= 0"),
    ("[ingest]\nlake_group = 5\n", "[ingest] lake_group = 5: expected a string, got an integer"),
    ('[ingest]\nlake_group = ""\n', 'lake_group = "": expected a non-empty string'),
    ('[ingest]\ncompression = "brotli"\n',
     '[ingest] compression = "brotli": expected one of snappy, zstd, lz4, gzip, none'),
    ('[ingest]\nisolation = "committed"\n',
     "expected one of read_committed, read_uncommitted"),
    ('[ingest]\non_divergence = "ignore"\n', "expected one of fail, rewind"),
    ('[ingest]\ntopics = ["orders", 3]\n',
     '[ingest] topics = ["orders", 3]: expected a list of strings; 3 is not one'),
    ('[compact]\ntopics = ["a b"]\n', "expected a list, each element a Kafka topic name"),
    ('[ingest]\nbootstrap_servers = "localhost"\n', "expected host:port[,host:port...]"),
    ('[ingest]\nbootstrap_servers = "h:1,h:99999"\n', "expected host:port[,host:port...]"),
    ('[retention]\nrecords = "3w"\n', "expected forever, topic or an age like 30d, 12h, 90m"),
    ('[compact]\ndefault_strategy = "latest"\n', "expected a compaction strategy"),
    ('[paths]\nlog_dirs = "/tmp/logs"\n', '[paths] log_dirs = "/tmp/logs": expected a list'),
    ('[paths]\nlake = ""\n', "expected a non-empty string"),
    ('[spark]\nmaster = ["local"]\n', "expected a string, got a list"),
    # free-form sections: keys and values by rule
    ('[compact.strategy]\norders = "hdr:v"\n',
     "[compact.strategy] 'orders' = \"hdr:v\": expected a compaction strategy"),
    ('[compact.strategy]\n"bad topic" = "offset"\n', "each key must be a Kafka topic name"),
    ('[compact.deletion_vectors]\norders = "no"\n',
     '[compact.deletion_vectors] \'orders\' = "no": expected a boolean'),
    ("[compact]\ndefault_deletion_vectors = 0\n", "expected a boolean"),
    ('[spark.conf]\n"spark.x" = ["a"]\n', "expected a string, a number or a boolean, got a list"),
    ("[spark.conf]\nsub = {a = 1}\n", "expected a string, a number or a boolean, got a table"),
    # unknown sections and keys, tables
    ("[ingest]\nfail_on_corupt = true\n",
     "unknown key 'fail_on_corupt' in [ingest]; did you mean 'fail_on_corrupt'?"),
    ("[ingst]\ntopics = []\n", "unknown section [ingst]; did you mean 'ingest'?"),
    ("[paths]\nlake_dir = 'x'\n", "unknown key 'lake_dir' in [paths]; did you mean 'lake'?"),
    ("[spark]\nmastr = 'local[1]'\n", "did you mean 'master'?"),
    ("[ingest]\nxyzzy = 1\n", "unknown key 'xyzzy' in [ingest]"),
    ("paths = 3\n", "[paths] must be a table, got 3"),
    ("[ingest]\nverify = true\n", "[ingest] verify is no longer used"),
    ("[ingest\n", "config is not valid TOML"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "message"), BAD)
def test_a_bad_value_exits_2_naming_key_value_and_expectation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    conf = tmp_path / "pipeline.toml"
    conf.write_text(text)
    code = load_job("ingest").main(["--config", str(conf)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("ingest failed: ") and message in err, err
    assert str(conf) in err
    assert not (tmp_path / "lake").exists()


@pytest.mark.parametrize("job", ["build_lookups", "compact", "quality", "retention", "maintain"])
def test_every_job_checks_the_whole_file(
    job: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One file, one truth: a mistake in [quality] fails ingest too, and [ingest] fails
    maintain."""
    conf = tmp_path / "pipeline.toml"
    conf.write_text('[ingest]\ntopics = "orders"\n')
    assert load_job(job).main(["--config", str(conf)]) == 2
    assert f'{job} failed: [ingest] topics = "orders": expected a list' in capsys.readouterr().err


@pytest.mark.parametrize(
    ("job", "argv", "message"),
    [
        ("ingest", ["--bootstrap-server", "nohost"], "argument --bootstrap-server: 'nohost': "
         "expected host:port[,host:port...]"),
        ("retention", ["--bootstrap-server", "h:0"], "expected host:port"),
        ("maintain", ["--vacuum-hours", "-1"], "argument --vacuum-hours: '-1': expected a "
         "number >= 0 (as [retention] vacuum_hours)"),
        ("maintain", ["--vacuum-hours", "soon"], "'soon': expected a number >= 0"),
        ("ingest", ["--on-divergence", "ignore"], "invalid choice: 'ignore'"),
    ],
)  # fmt: skip
def test_command_line_values_get_the_same_checks(
    job: str, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        load_job(job).main(["--config", str(ROOT / "conf" / "pipeline.toml"), *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_good_values_keep_their_types(tmp_path: Path) -> None:
    conf = tmp_path / "pipeline.toml"
    conf.write_text(
        '[spark.conf]\n"spark.sql.shuffle.partitions" = 3\n"spark.sql.ansi.enabled" = false\n'
        '"anything.else" = "x"\n'
        '[ingest]\ntopics = ["orders", "__consumer_offsets"]\nfail_on_corrupt = true\n'
        'progress_interval_s = 0.5\nbootstrap_servers = "127.0.0.1:9092,[::1]:9093"\n'
        '[compact.strategy]\norders = "header:version"\n[retention]\nrecords = "30d"\n'
    )
    config = load_config(conf, log_dirs=["logs"], lake="lake")
    assert config.spark_conf == {
        "spark.sql.shuffle.partitions": "3",
        "spark.sql.ansi.enabled": "false",  # Spark's spelling, not Python's "False"
        "anything.else": "x",
    }
    assert config.topics == ("orders", "__consumer_offsets")
    assert config.fail_on_corrupt is True and config.progress_interval_s == 0.5


def test_ingest_lake_group_keys(tmp_path: Path) -> None:
    conf = tmp_path / "pipeline.toml"
    conf.write_text('[ingest]\nbootstrap_servers = "h:1"\nlake_group = "lg"\n')
    config = load_config(conf, log_dirs=["logs"], lake="lake")
    assert (config.bootstrap_servers, config.lake_group) == ("h:1", "lg")
    over = load_config(conf, log_dirs=["logs"], lake="lake", bootstrap_servers="h:2")
    assert over.bootstrap_servers == "h:2"
    shipped = load_config(ROOT / "conf" / "pipeline.toml", log_dirs=["logs"], lake="lake")
    assert (shipped.bootstrap_servers, shipped.lake_group) == ("", "loglake-ingest")
    conf.write_text('[ingest]\nlake_grup = "x"\n')
    with pytest.raises(InvalidConfigError, match="did you mean 'lake_group'"):
        load_config(conf, log_dirs=["logs"], lake="lake")
