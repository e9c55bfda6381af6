"""``write_delta``: the one call jobs use to write a DataFrame to a Delta table.

Two engines behind one API, chosen by ``pipelines.session.delta_engine`` (the switch
``spark.loglake.delta.engine`` in ``conf/spark-defaults.conf``):

- ``delta-rs`` (the embedded default): the ``loglake_delta`` Python data source
  (``pipelines.delta.datasource``), committing with ``deltalake``.
- ``delta-spark``: ``df.write.format("delta")`` natively; kept thin. Delta's own idempotent
  writes (``txnAppId``/``txnVersion``) carry one app transaction per write, so this path
  accepts at most one, and cannot report the committed version's counts.

The driver checks what it can before any task runs (schema, stale app transactions, a write
that is already applied is skipped without a Spark job); the commit re-checks against the
version it writes. Errors raised by the commit are raised again here with their own class
(``SchemaMismatchError``, ``StaleTransactionError``, ``ConcurrentWriteError``, ...).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

import pyarrow as pa
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

from pipelines.delta.commit import (
    CommitResult,
    check_app_transactions,
    check_schema,
    load_table,
)
from pipelines.delta.datasource import FORMAT, DeltaRsDataSource
from pipelines.delta.direct import run_in_job_group
from pipelines.delta.errors import DeltaSinkError, error_class, first_error_line
from pipelines.delta.files import cleanup_write_files, partition_value_string
from pipelines.delta.staging import reap_crashed_writes, release_run_marker, write_run_marker
from pipelines.session import delta_engine

__all__ = ["CHECK_COLUMN", "register_sink", "write_delta"]

CHECK_COLUMN = "__loglake_replace_where_ok"
_registered: set[int] = set()


def register_sink(spark: SparkSession) -> None:
    """Register the ``loglake_delta`` data source with ``spark`` (once per session)."""
    key = id(spark)
    if key not in _registered:
        spark.dataSource.register(DeltaRsDataSource)
        _registered.add(key)


def write_delta(
    df: DataFrame,
    path: str | Path,
    *,
    mode: Literal["append", "overwrite"] = "append",
    partition_by: Sequence[str] | None = None,
    predicate: str | None = None,
    app_transactions: Mapping[str, int] | None = None,
    expected_versions: Mapping[str, int | None] | None = None,
    compression: str = "zstd",
    max_rows_per_file: int | None = None,
) -> CommitResult:
    """Write ``df`` to the Delta table at ``path`` (a local directory) in one commit.

    ``mode="overwrite"`` replaces the table's data; with ``predicate`` (a Spark SQL boolean
    expression over partition columns only) it replaces just the files whose partition matches
    ("replace where"), and every new row must match it too. ``partition_by`` names the
    partition columns (Hive-style directories). ``app_transactions`` (app id -> version) are
    committed in the same transaction: a write whose versions are all already in the table
    is a no-op, a lower version is refused. ``expected_versions`` (app id -> the version the
    caller read, None = absent) makes the commit fail if someone else advanced them meanwhile.
    """
    if mode not in ("append", "overwrite"):
        raise DeltaSinkError(f"mode must be 'append' or 'overwrite', got {mode!r}")
    if predicate is not None and mode != "overwrite":
        raise DeltaSinkError("a predicate (replace where) needs mode='overwrite'")
    parts = list(partition_by or [])
    apps = {str(k): int(v) for k, v in (app_transactions or {}).items()}
    root = str(Path(str(path).removeprefix("file://")).absolute())
    spark = df.sparkSession
    if delta_engine(spark) == "delta-spark":
        return _write_delta_spark(
            df, root, mode=mode, partition_by=parts, predicate=predicate, app_transactions=apps
        )

    schema = to_arrow_schema(df.schema, timezone="UTC")
    dt = load_table(root)
    if dt is not None:
        check_schema(dt, schema, parts)
        if not check_app_transactions(dt, apps, expected_versions):
            return CommitResult(root, dt.version(), False, mode, 0, 0, 0, 0, 0, apps)
    tmp = Path(tempfile.mkdtemp(prefix="loglake-delta-"))
    try:
        result_file = tmp / "result.json"
        options: dict[str, str] = {
            "mode": mode,
            "partitionBy": json.dumps(parts),
            "appTransactions": json.dumps(apps),
            "resultFile": str(result_file),
            "compression": compression,
        }
        if max_rows_per_file is not None:
            options["maxRowsPerFile"] = str(max_rows_per_file)
        if expected_versions is not None:
            options["expectedVersions"] = json.dumps(dict(expected_versions))
        if predicate is not None:
            removes_file = tmp / "removes.json"
            removes_file.write_text(json.dumps(_replace_where_files(spark, root, predicate, parts)))
            options.update(
                predicate=predicate, removesFile=str(removes_file), checkColumn=CHECK_COLUMN
            )
            df = df.withColumn(CHECK_COLUMN, sf.expr(f"coalesce(({predicate}), false)"))
        write_id = uuid.uuid4().hex
        options["writeId"] = write_id
        register_sink(spark)
        run_error: Exception | None = None
        # files of earlier writes whose driver died go; this driver's own marker (see
        # pipelines.delta.staging) stays until the sink committed or aborted
        reap_crashed_writes(root)
        write_run_marker(root, write_id)
        try:
            run_in_job_group(
                spark,
                f"loglake-delta-{write_id}",
                lambda: df.write.format(FORMAT).mode("append").options(**options).save(root),
            )
        except Exception as exc:  # the commit worker's own error, if any, is in the result file
            run_error = exc
            # The sink's abort() may run while a killed task is still closing a file: remove
            # the write's files again now that every task has stopped (none was committed).
            cleanup_write_files(root, write_id, prune_dirs=True)
        release_run_marker(root, write_id)
        outcome = json.loads(result_file.read_text()) if result_file.exists() else {}
        if "error" in outcome:
            err = outcome["error"]
            raise error_class(err["type"])(err["message"]) from run_error
        if run_error is not None:
            raise DeltaSinkError(
                f"write to {root} failed, nothing committed: {first_error_line(run_error)}",
                path=root,
            ) from run_error
        if "result" not in outcome:
            raise DeltaSinkError("the Delta sink reported no result", path=root)
        return CommitResult.from_json(outcome["result"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _replace_where_files(
    spark: SparkSession, root: str, predicate: str, partition_by: list[str]
) -> dict[str, object]:
    """The snapshot's files whose partition values match ``predicate``, and that snapshot."""
    dt = load_table(root)
    if dt is None:
        return {"read_version": None, "removes": []}
    table_parts = list(dt.metadata().partition_columns)
    if not table_parts:
        raise DeltaSinkError(
            "overwrite by predicate needs a partitioned table (the predicate may only use "
            "partition columns)",
            path=root,
        )
    actions = pa.table(dt.get_add_actions(flatten=True))
    arrow_schema = pa.schema(dt.schema().to_arrow())
    cols = {
        "path": actions.column("path"),
        "size_bytes": actions.column("size_bytes"),
    }
    for c in table_parts:
        cols[c] = actions.column(f"partition.{c}").cast(arrow_schema.field(c).type)
    files = pa.table(cols)
    spark_schema = from_arrow_schema(files.schema, prefer_timestamp_ntz=False)
    sdf = spark.createDataFrame(files.to_pylist(), schema=spark_schema)
    try:
        matched = sdf.filter(sf.expr(f"coalesce(({predicate}), false)")).collect()
    except AnalysisException as exc:
        raise DeltaSinkError(
            f"replace-where predicate {predicate!r} may only use partition columns "
            f"{table_parts}: {first_error_line(exc)}",
            path=root,
        ) from exc
    removes = [
        {
            "path": r["path"],
            "size": r["size_bytes"],
            "partition_values": {c: partition_value_string(r[c]) for c in table_parts},
        }
        for r in matched
    ]
    return {"read_version": dt.version(), "removes": removes}


def _write_delta_spark(
    df: DataFrame,
    root: str,
    *,
    mode: str,
    partition_by: list[str],
    predicate: str | None,
    app_transactions: dict[str, int],
) -> CommitResult:
    """The native path: Delta's own writer. At most one app transaction (Delta's txnAppId)."""
    if len(app_transactions) > 1:
        raise DeltaSinkError(
            "delta-spark writes carry one app transaction (txnAppId/txnVersion); this write has "
            f"{len(app_transactions)}: use the delta-rs engine",
            path=root,
        )
    writer = df.write.format("delta").mode(mode)
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    if predicate is not None:
        writer = writer.option("replaceWhere", predicate)
    for app, version in app_transactions.items():
        writer = writer.option("txnAppId", app).option("txnVersion", str(version))
    writer.save(root)
    dt = load_table(root)
    version = dt.version() if dt is not None else -1
    return CommitResult(root, version, True, mode, 0, 0, 0, 0, 1, dict(app_transactions))
