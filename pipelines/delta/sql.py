"""Reading Delta tables: Spark DataFrames and temp views over a snapshot; SQL without Spark.

``read_delta`` pins one snapshot (latest or ``version``) with delta-rs and hands Spark exactly
that snapshot's data files (Hive-style partition directories under the table root, partition
columns typed by the table schema), so Spark never lists the directory and never sees files
of uncommitted or removed writes. Tables using reader features that plain Parquet reading
cannot honour (deletion vectors, column mapping) are read through delta-rs into Arrow instead.

``query_delta`` runs SQL with delta-rs's DataFusion engine (``deltalake.QueryBuilder``), no
Spark needed, e.g.::

    query_delta("SELECT topic, count(*) AS n FROM records GROUP BY topic",
                {"records": "/lake/records"})

A view is a snapshot: it does not see commits made after ``register_delta_view``.

``register_lake_views(spark, lake)`` registers every table of a lake as a temporary view named
as ``loglake sql`` names it (``pipelines.catalog``): through Delta's own reader when the session
has it, else through ``read_delta`` (Spark's Parquet reader over the pinned snapshot: partition
pruning, column pruning and Parquet filter pushdown, safe for a view queried many times, which
the Python data source's file pruning is not, see ``pipelines.delta.source``). The lookup
tables' ``max_timestamp`` is shown there as a timestamp, the raw milliseconds as
``max_timestamp_ms``.

On an object store (``s3://...``, :mod:`logstore.objectstore`) delta-rs opens the tables with the
storage options of the environment (or of ``settings=``, e.g. a pipeline TOML's ``[storage]``);
Spark, lacking Hadoop's S3 connector offline, reads them through the Python data source
(``pipelines.delta.source``, handed the same settings), whose executors read the Parquet files
through pyarrow's filesystem. A session with native Delta is expected to have ``s3a://``
configured and reads them itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from logstore.objectstore import LakeLocation, StorageSettings, delta_target
from pipelines.catalog import find_tables, parse_versions, view_columns
from pipelines.delta.commit import load_table
from pipelines.delta.errors import DeltaSinkError
from pipelines.delta.source import FORMAT, STORAGE_OPTION_PREFIX, needs_delta_reader

__all__ = ["query_delta", "read_delta", "register_delta_view", "register_lake_views"]

# Beyond this many milliseconds a Spark timestamp (microseconds in a long) would overflow.
_MAX_MS = 9_000_000_000_000_000


def _open(
    path: str | Path, version: int | None, settings: StorageSettings | None = None
) -> DeltaTable:
    uri, options = delta_target(path, settings=settings)
    dt = DeltaTable(uri, storage_options=options) if options else load_table(uri)
    if dt is not None and version is not None:
        dt.load_as_version(version)
    if dt is None:
        raise DeltaSinkError("no Delta table here", path=str(path))
    return dt


def read_delta(
    spark: SparkSession,
    path: str | Path,
    *,
    version: int | None = None,
    settings: StorageSettings | None = None,
) -> DataFrame:
    """The table at ``path`` (latest snapshot, or ``version``) as a Spark DataFrame
    (``settings``: how to reach an object store; default the job's or the environment's)."""
    location = LakeLocation.parse(path)
    if not location.is_local:
        return _read_remote(spark, location, version, settings)
    root = location.uri
    dt = _open(root, version)
    arrow_schema = pa.schema(dt.schema().to_arrow())
    spark_schema = from_arrow_schema(arrow_schema, prefer_timestamp_ntz=True)
    names = [f.name for f in spark_schema.fields]
    if needs_delta_reader(dt):
        # DataFusion honours column mapping and deletion vectors (to_pyarrow_table reads a
        # column-mapped table's columns as NULLs in deltalake 1.6)
        names_sql = ", ".join('"' + n.replace('"', '""') + '"' for n in arrow_schema.names)
        reader = QueryBuilder().register("t", dt).execute(f"SELECT {names_sql} FROM t")
        table = pa.table(reader.read_all()).cast(arrow_schema)
        return spark.createDataFrame(table, schema=spark_schema)
    files = dt.file_uris()
    if not files:
        return spark.createDataFrame([], schema=spark_schema)
    df = spark.read.schema(spark_schema).option("basePath", root).parquet(*files)
    return df.select(*names)


def _read_remote(
    spark: SparkSession,
    location: LakeLocation,
    version: int | None,
    settings: StorageSettings | None = None,
) -> DataFrame:
    """A table on an object store, through ``format("delta")`` (the Python data source unless
    the session has native Delta), with this process's storage settings as options: Spark's
    Python workers inherit the JVM's environment, not this process's."""
    from pipelines.delta.source import register_delta_source  # noqa: PLC0415

    _open(location.uri, version, settings)  # a missing table or version: as locally
    reader = spark.read.format(FORMAT)
    if register_delta_source(spark):
        resolved = settings if settings is not None else StorageSettings.default()
        for key, value in resolved.to_overrides().items():
            reader = reader.option(STORAGE_OPTION_PREFIX + key, value)
    if version is not None:
        reader = reader.option("versionAsOf", str(version))
    return reader.load(location.uri)


def register_delta_view(
    spark: SparkSession, name: str, path: str | Path, *, version: int | None = None
) -> DataFrame:
    """Register temporary view ``name`` over the table's current (or ``version``) snapshot."""
    df = read_delta(spark, path, version=version)
    df.createOrReplaceTempView(name)
    return df


def query_delta(sql: str, tables: Mapping[str, str | Path]) -> pa.Table:
    """Run ``sql`` with delta-rs's DataFusion over ``tables`` (view name -> table path)."""
    qb = QueryBuilder()
    for view, path in tables.items():
        qb = qb.register(view, _open(path, None))
    return pa.table(qb.execute(sql).read_all())


def register_lake_views(
    spark: SparkSession,
    lake: str | Path,
    *,
    versions: Mapping[str, int] | None = None,
    settings: StorageSettings | None = None,
) -> dict[str, DataFrame]:
    """Register every Delta table under ``lake`` as a temporary view, in one call.

    ``settings``: how to reach a lake on an object store (e.g. ``pipelines.config.
    storage_settings`` of a pipeline TOML, its ``[storage]`` over the AWS environment); default:
    the job's, else the environment's.

    Names as ``loglake sql`` gives them (``records``, ``quarantine``, ``offset_lookup``,
    ``time_lookup``, ``topics/<name>`` as ``topics_<name>``, ...); ``versions`` pins tables to
    a version (``{"records": 3}``), the others are at their latest version of this call (call
    again to see later commits; with native Delta they follow the table).
    Returns the views' DataFrames by name.
    """
    from pipelines.session import delta_spark_available  # noqa: PLC0415

    native = delta_spark_available(spark)
    tables = find_tables(lake, settings=settings)
    pinned = parse_versions(
        [f"{k}={v}" for k, v in (versions or {}).items()], tables, flag="versions"
    )
    out: dict[str, DataFrame] = {}
    for table in tables:
        version = pinned.get(table.name)
        if native:
            reader = spark.read.format("delta")
            if version is not None:
                reader = reader.option("versionAsOf", str(version))
            df = reader.load(str(table.path))
        else:
            df = read_delta(spark, table.path, version=version, settings=settings)
        columns = view_columns(table.name, _arrow_schema(df))
        if columns is not None:
            exprs: list[Any] = []
            for kind, col in columns:
                q = f"`{col}`"
                if kind == "ts":
                    exprs.append(
                        f"CASE WHEN abs({q}) < {_MAX_MS} THEN timestamp_millis({q}) END AS {q}"
                    )
                elif kind == "ms":
                    exprs.append(f"{q} AS `{col}_ms`")
                else:
                    exprs.append(q)
            df = df.selectExpr(*exprs)
        df.createOrReplaceTempView(table.name)
        out[table.name] = df
    return out


def _arrow_schema(df: DataFrame) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema  # noqa: PLC0415

    return to_arrow_schema(df.schema, timezone="UTC")
