"""Delta sink of loglake: Spark DataFrames to Delta tables, exactly once.

The embedded default binds delta-rs (``deltalake``) to Spark through Spark 4's Python Data
Source API: executors write Parquet files, the driver commits them in one Delta transaction
with app transactions for idempotence. With Delta's jars on the session, ``delta-spark`` is
used natively instead (``pipelines.session.delta_engine``). Reading: ``pipelines.delta.sql``;
``format("delta")`` without Delta's jars: ``pipelines.delta.source``.
"""

from __future__ import annotations

from pipelines.delta.commit import CommitResult, read_app_transactions
from pipelines.delta.errors import (
    ConcurrentWriteError,
    DeltaSinkError,
    SchemaMismatchError,
    StaleTransactionError,
)
from pipelines.delta.sql import (
    query_delta,
    read_delta,
    register_delta_view,
    register_lake_views,
)
from pipelines.delta.writer import write_delta

__all__ = [
    "CommitResult",
    "ConcurrentWriteError",
    "DeltaSinkError",
    "SchemaMismatchError",
    "StaleTransactionError",
    "query_delta",
    "read_app_transactions",
    "read_delta",
    "register_delta_view",
    "register_lake_views",
    "write_delta",
]
