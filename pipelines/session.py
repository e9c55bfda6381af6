"""The SparkSession builder of loglake jobs and the Delta engine switch.

``get_spark`` builds (or returns the already running) session from ``conf/spark-defaults.conf``.
Precedence, lowest first: Spark's built-in defaults, ``conf/spark-defaults.conf``, whatever
``spark-submit`` was given (``--conf``, ``--master``, ``SPARK_CONF_DIR``), the ``master`` and
``conf`` arguments. Under ``spark-submit`` the launcher's JVM is already up, so keys it set are
left alone instead of being overwritten by this file.

The Delta engine is chosen by one key, ``spark.loglake.delta.engine`` (``auto``, ``delta-rs``,
``delta-spark``), see ``delta_engine``. Thread-safety: SparkSession creation is process-global;
call ``get_spark`` from the driver's main thread.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession

from logstore.errors import InvalidConfigError, LoglakeError

__all__ = [
    "DEFAULTS_FILE",
    "DELTA_ENGINE_KEY",
    "DELTA_EXTENSION",
    "DeltaEngine",
    "delta_engine",
    "delta_spark_available",
    "get_spark",
    "jvm_class_loadable",
    "read_spark_defaults",
    "spark_conf",
]

DeltaEngine = Literal["delta-rs", "delta-spark"]

ROOT = Path(__file__).resolve().parent.parent
DEFAULTS_FILE = ROOT / "conf" / "spark-defaults.conf"
DELTA_ENGINE_KEY = "spark.loglake.delta.engine"
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
_DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
_ENGINES = ("auto", "delta-rs", "delta-spark")


def read_spark_defaults(path: Path | str = DEFAULTS_FILE) -> dict[str, str]:
    """Parse a file in Spark's ``spark-defaults.conf`` syntax: ``key value`` per line.

    The key ends at the first whitespace; the rest of the line (stripped) is the value; blank
    lines and lines starting with ``#`` are ignored. A missing file is an empty mapping, a line
    without a value is an error naming the file and line.
    """
    p = Path(path)
    if not p.is_file():
        return {}
    out: dict[str, str] = {}
    for lineno, raw in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        if len(parts) != 2:
            raise InvalidConfigError(
                f"line {lineno}: expected 'key value', got {line!r}", path=str(p)
            )
        out[parts[0]] = parts[1].strip()
    return out


def _launcher_conf() -> SparkConf | None:
    """The conf spark-submit gave this driver, or None when we are not under spark-submit."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return None
    # Before the gateway is up a SparkConf is a plain dict and would see none of spark-submit's
    # settings (--master included), so conf/spark-defaults.conf would silently override them.
    SparkContext._ensure_initialized()
    return SparkConf(loadDefaults=True)


def get_spark(
    app_name: str,
    *,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    defaults_file: Path | str | None = None,
    delta_reader: bool = True,
) -> SparkSession:
    """Build or get the SparkSession for ``app_name`` (see the module docstring for precedence).

    When the engine switch says ``delta-spark``, Delta's extension and catalog are configured
    too (the jars must come from the launcher, e.g. ``--packages``). Without native Delta,
    ``format("delta")`` is made readable by ``pipelines.delta.source``. If a session is already
    running in this process, Spark returns it; static settings then keep their first values.

    ``delta_reader=False`` (the jobs, which read tables with :func:`pipelines.delta.read_delta`)
    leaves that reader unregistered: registering any Python data source makes Spark run its
    one-off lookup of installed data sources in a worker of pyspark's own daemon, which
    ``spark.python.daemon.module`` does not reach and which now and then prints a
    ``BrokenPipeError`` traceback on the console after its answer was read.
    """
    settings = read_spark_defaults(DEFAULTS_FILE if defaults_file is None else defaults_file)
    launched = _launcher_conf()
    if launched is not None:
        settings = {k: v for k, v in settings.items() if not launched.contains(k)}
        if launched.contains("spark.master"):
            settings.pop("spark.master", None)
    if master is not None:
        settings["spark.master"] = master
    if conf:
        settings.update({str(k): str(v) for k, v in conf.items()})
    engine = settings.get(DELTA_ENGINE_KEY) or (
        launched.get(DELTA_ENGINE_KEY, "auto") if launched is not None else "auto"
    )
    if engine not in _ENGINES:
        raise InvalidConfigError(f"{DELTA_ENGINE_KEY} must be one of {_ENGINES}, got {engine!r}")
    if engine == "delta-spark":
        settings.setdefault("spark.sql.extensions", DELTA_EXTENSION)
        settings.setdefault("spark.sql.catalog.spark_catalog", _DELTA_CATALOG)
    builder = SparkSession.builder.appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    if delta_reader:
        # format("delta") without Delta's jars: loglake's reader (nothing where native Delta is).
        from pipelines.delta.source import register_delta_source  # noqa: PLC0415

        register_delta_source(session)
    return session


def spark_conf(conf: Mapping[str, str], *, verbose: bool = False) -> dict[str, str]:
    """A job's ``[spark.conf]`` settings, with Spark's INFO log lines on when ``verbose``
    (``conf/spark-defaults.conf`` sets ``spark.log.level`` to WARN)."""
    out = {str(k): str(v) for k, v in conf.items()}
    if verbose:
        out["spark.log.level"] = "INFO"
    return out


def jvm_class_loadable(spark: SparkSession, name: str) -> bool | None:
    """Whether the driver JVM can load class ``name`` (None: no py4j, e.g. Spark Connect)."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        return None
    try:
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(name, False, loader)
    except Exception:  # py4j wraps ClassNotFoundException in Py4JJavaError
        return False
    return True


def delta_spark_available(spark: SparkSession) -> bool:
    """True when the session has Delta's SQL extension configured and its class is loadable."""
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    if DELTA_EXTENSION not in [e.strip() for e in extensions.split(",")]:
        return False
    # Spark Connect cannot probe classes: trust the configuration there.
    return jvm_class_loadable(spark, DELTA_EXTENSION) is not False


def delta_engine(spark: SparkSession) -> DeltaEngine:
    """The Delta engine this session's writes use, from ``spark.loglake.delta.engine``.

    ``auto`` picks ``delta-spark`` only when ``delta_spark_available``; an explicit
    ``delta-spark`` without the jars is an error that says so.
    """
    engine = spark.conf.get(DELTA_ENGINE_KEY, "auto") or "auto"
    if engine not in _ENGINES:
        raise InvalidConfigError(f"{DELTA_ENGINE_KEY} must be one of {_ENGINES}, got {engine!r}")
    if engine == "delta-rs":
        return "delta-rs"
    available = delta_spark_available(spark)
    if engine == "delta-spark":
        if not available:
            raise LoglakeError(
                f"{DELTA_ENGINE_KEY}=delta-spark but {DELTA_EXTENSION} is not loadable in this "
                "session: add Delta's jars (e.g. --packages io.delta:delta-spark_2.13:4.x) or "
                "set the engine to auto / delta-rs"
            )
        return "delta-spark"
    return "delta-spark" if available else "delta-rs"
