"""Delta engine of loglake: Spark tasks' Arrow data to Delta tables, exactly once.

Executors write Parquet files through the table's store (local disk or ``s3://``,
``pipelines.delta.files``), the driver commits them in one Delta transaction with delta-rs and
app transactions for idempotence (``pipelines.delta.direct`` + ``commit``); leases in the
store let the next write remove the files of a dead one (``pipelines.delta.staging``).
Reading: ``pipelines.delta.sql``; ``format("delta")`` without Delta's jars:
``pipelines.delta.source``.
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
]
