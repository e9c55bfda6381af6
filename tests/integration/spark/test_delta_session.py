"""The session builder: conf/spark-defaults.conf, the Delta engine switch and its detection."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from logstore.errors import LoglakeError
from pipelines.session import (
    DEFAULTS_FILE,
    DELTA_ENGINE_KEY,
    DELTA_EXTENSION,
    delta_engine,
    delta_spark_available,
    jvm_class_loadable,
    read_spark_defaults,
)

pytestmark = pytest.mark.integration


def test_defaults_file_parses_and_sets_utc_and_arrow() -> None:
    conf = read_spark_defaults(DEFAULTS_FILE)
    assert conf["spark.sql.session.timeZone"] == "UTC"
    assert conf["spark.sql.execution.arrow.pyspark.enabled"] == "true"
    assert conf[DELTA_ENGINE_KEY] == "auto"


def test_defaults_file_errors_name_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "spark-defaults.conf"
    bad.write_text("# comment\n\nspark.a  1\nspark.lonely\n")
    with pytest.raises(LoglakeError, match="line 4"):
        read_spark_defaults(bad)
    assert read_spark_defaults(tmp_path / "missing.conf") == {}


def test_fixture_session_and_engine_detection(spark: SparkSession) -> None:
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.ui.enabled") == "false"
    assert spark.sparkContext.master == "local[2]"
    # the probe really asks the driver JVM: Spark's own class loads, Delta's does not (no jars)
    assert jvm_class_loadable(spark, "org.apache.spark.sql.SparkSession") is True
    assert jvm_class_loadable(spark, DELTA_EXTENSION) is False
    assert not delta_spark_available(spark)
    assert delta_engine(spark) == "delta-rs"
    try:
        spark.conf.set(DELTA_ENGINE_KEY, "delta-spark")
        with pytest.raises(LoglakeError, match="not loadable"):
            delta_engine(spark)
        spark.conf.set(DELTA_ENGINE_KEY, "delta-rs")
        assert delta_engine(spark) == "delta-rs"
        spark.conf.set(DELTA_ENGINE_KEY, "bogus")
        with pytest.raises(LoglakeError, match="must be one of"):
            delta_engine(spark)
    finally:
        spark.conf.set(DELTA_ENGINE_KEY, "auto")
