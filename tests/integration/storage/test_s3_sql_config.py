"""``loglake sql --config`` and ``register_lake_views(settings=...)`` reach a lake on S3 (moto)
through a pipeline TOML's ``[storage]`` and ``[paths] lake`` alone: no ``AWS_*`` variable is
set, so without the file nothing would say where the store is. The table is written by delta-rs
with its own storage options, independently of the code under test."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import SparkSession

from logstore.cli import main
from pipelines.config import read_pipeline_toml, storage_settings
from pipelines.delta.sql import register_lake_views
from tests.fixtures.s3 import ACCESS_KEY, REGION, SECRET_KEY, S3Bucket

pytestmark = pytest.mark.integration


@pytest.fixture
def s3_conf(s3: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A lake with ``records`` (two partitions of topic ``a``, 50 rows) and a lookup table on
    the bucket; a pipeline TOML that names both; an environment without ``AWS_*``."""
    lake = s3.uri("viaconf")
    options = {
        "AWS_ENDPOINT_URL": s3.server.endpoint, "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": REGION, "conditional_put": "etag",
    }  # fmt: skip
    rows = pa.table({"partition": [i % 2 for i in range(50)], "offset": list(range(50))})
    write_deltalake(f"{lake}/records", rows, storage_options=options)
    lookups = pa.table({"topic": ["a"], "max_timestamp": [1_700_000_000_123]})
    write_deltalake(f"{lake}/time_lookup", lookups, storage_options=options)
    conf = tmp_path / "pipeline.toml"
    conf.write_text(
        f'[paths]\nlake = "{lake}"\n'
        f'[storage]\nendpoint_url = "{s3.server.endpoint}"\n'
        f'access_key_id = "{ACCESS_KEY}"\nsecret_access_key = "{SECRET_KEY}"\n'
        f'region = "{REGION}"\nmax_attempts = 1\nconnect_timeout_s = 2\n',
        encoding="utf-8",
    )
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return conf, lake


def test_loglake_sql_reads_storage_and_lake_from_the_config(
    s3_conf: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    conf, lake = s3_conf
    query = (
        'SELECT "partition", count(*) AS n, sum("offset") AS s FROM records GROUP BY 1 ORDER BY 1'
    )
    assert main(["sql", "--config", str(conf), "--format", "csv", query]) == 0
    out, err = capsys.readouterr()
    assert list(csv.DictReader(io.StringIO(out))) == [
        {"partition": "0", "n": "25", "s": str(sum(range(0, 50, 2)))},
        {"partition": "1", "n": "25", "s": str(sum(range(1, 50, 2)))},
    ], err
    # --lake wins over [paths] lake; [storage] still comes from the file
    assert main(["sql", "--config", str(conf), "--lake", lake, "--history", "records"]) == 0
    assert "WRITE" in capsys.readouterr().out
    # a bad [storage] value is a usage error naming the key and the file
    bad = conf.with_name("bad.toml")
    bad.write_text(conf.read_text() + "request_timeout_s = 0\n", encoding="utf-8")
    assert main(["sql", "--config", str(bad), "SELECT 1"]) == 2
    err = capsys.readouterr().err
    assert "request_timeout_s" in err and str(bad) in err
    # no lake at all
    assert main(["sql", "SELECT 1"]) == 2
    assert "no lake" in capsys.readouterr().err


def test_register_lake_views_with_the_configs_storage_settings(
    spark: SparkSession, s3_conf: tuple[Path, str]
) -> None:
    conf, lake = s3_conf
    settings = storage_settings(read_pipeline_toml(conf), conf)
    views = register_lake_views(spark, lake, settings=settings)
    assert sorted(views) == ["records", "time_lookup"]
    got = spark.sql("SELECT `partition`, count(*), sum(`offset`) FROM records GROUP BY 1").collect()
    assert sorted(tuple(r) for r in got) == [(0, 25, 600), (1, 25, 625)]
    (row,) = spark.sql("SELECT max_timestamp, max_timestamp_ms FROM time_lookup").collect()
    assert row[1] == 1_700_000_000_123 and row[0].year == 2023
