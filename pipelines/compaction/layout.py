"""Names of a compacted topic's tables: paths, columns, the partition column, app ids.

A leaf module (no loglake imports but the records schema and ``plan.VERSION``): the steps of a
run (``snapshot``, ``stage``, ``merge``, ``commit``, ``runs``, ``setup``) and the orchestration
(``table``) all name the same things. The table's layout is described in
:mod:`pipelines.compaction.table`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from pipelines.compaction.plan import VERSION
from pipelines.delta.staging import STAGING_DIR
from pipelines.sources import RECORDS_ARROW_SCHEMA

__all__ = [
    "APP_PREFIX",
    "BUCKET",
    "CDC_SCHEMA",
    "CHANGE_DATA",
    "CHANGE_TYPE",
    "CONF_BUCKETS",
    "CONF_STRATEGY",
    "INPUT_COLUMNS",
    "SRC",
    "STAGING",
    "TABLE_SCHEMA",
    "VERSION",
    "Log",
    "app_id",
    "table_path",
    "tombstones_path",
]

APP_PREFIX = "loglake-compact"
BUCKET = "bucket"
CHANGE_DATA = "_change_data"
CHANGE_TYPE = "_change_type"
CONF_STRATEGY = "loglake.compaction.strategy"
CONF_BUCKETS = "loglake.compaction.buckets"
Log = Callable[[str], None]

TABLE_SCHEMA = pa.schema(
    [
        pa.field("partition", pa.int32()),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", RECORDS_ARROW_SCHEMA.field("headers").type),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestamp_type", pa.int32()),
        pa.field(VERSION, pa.int64()),
        pa.field(BUCKET, pa.int32()),
    ]
)
SRC = "_src"  # in the shuffle: 0 a new record, 1 a live row, 2 a tombstone row (--full)
CDC_SCHEMA = TABLE_SCHEMA.append(pa.field(CHANGE_TYPE, pa.string()))
INPUT_COLUMNS = [f.name for f in TABLE_SCHEMA if f.name != VERSION]


def app_id(topic: str, partition: int) -> str:
    """The app-transaction id carrying the table's progress for ``topic``/``partition``."""
    return f"{APP_PREFIX}/{topic}/{partition}"


def table_path(lake: str | Path, topic: str) -> str:
    return str(Path(lake) / "topics" / topic)


def tombstones_path(lake: str | Path, topic: str) -> str:
    return str(Path(lake) / "topic_tombstones" / topic)


# <table>/_loglake_staging/: the runs' leases and scratch (pipelines.compaction.runs)
STAGING = STAGING_DIR
