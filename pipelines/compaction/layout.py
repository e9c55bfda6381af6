"""Names of a compacted topic's tables: paths, columns, the partition column, app ids; and
the few file operations the tasks do on lake paths (:func:`open_input`, :func:`open_parquet`,
:func:`open_output`, :func:`file_size`, :func:`join`), which take a local path or an
object-store URI alike.

A leaf module (no loglake imports but the records schema, ``plan.VERSION``, the object-store
layer and the staging directory's name): the steps of a
run (``snapshot``, ``stage``, ``merge``, ``commit``, ``runs``, ``setup``) and the orchestration
(``table``) all name the same things. The table's layout is described in
:mod:`pipelines.compaction.table`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from logstore.objectstore import LakeLocation, StorageSettings
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
    "file_size",
    "join",
    "open_input",
    "open_output",
    "open_parquet",
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
    """The topic table's location: a local path, or a URI (``s3://...``) as the lake is."""
    return LakeLocation.parse(lake).join("topics", topic).uri


def tombstones_path(lake: str | Path, topic: str) -> str:
    return LakeLocation.parse(lake).join("topic_tombstones", topic).uri


def join(root: str, *parts: str) -> str:
    """``root`` (a local path or a URI) joined with relative ``parts`` (``/`` separated)."""
    return LakeLocation.parse(root).join(*parts).uri


# One filesystem per process and store (executors reuse theirs), made with this process's
# storage settings (StorageSettings.default(): the job's, installed by run_job on the driver and
# by start_task(settings=...) in each task from its plan; an executor does not have the
# driver's environment) and made anew when those change.
_FILESYSTEMS: dict[tuple[str, str], tuple[StorageSettings, pafs.FileSystem]] = {}


def _fs(path: str) -> tuple[pafs.FileSystem, str, bool]:
    loc = LakeLocation.parse(path)
    key = (loc.scheme, loc.authority)
    settings = StorageSettings.default()
    hit = _FILESYSTEMS.get(key)
    if hit is None or hit[0] != settings:
        hit = _FILESYSTEMS[key] = (settings, settings.filesystem(loc))
    return hit[1], loc.fs_path, loc.is_local


def open_input(path: str) -> pa.NativeFile:
    """A file of the lake for reading: memory-mapped on local disk (the readers decode pages
    from the page cache), a random-access object-store file elsewhere."""
    fs, fs_path, local = _fs(path)
    return pa.memory_map(fs_path) if local else fs.open_input_file(fs_path)


def open_parquet(path: str) -> pq.ParquetFile:
    """A Parquet file of the lake for reading some of its columns.

    On local disk memory-mapped, without pre-buffering: the reader decodes the pages straight
    from the page cache. Pre-buffering would copy every column chunk into a fresh buffer first,
    which a task's process faults in page by page (measured: 5 records files of 0.9M records,
    0.6-1.0 s of system time for their non-key columns, memory-mapped 0.05 s; a 625k-row table
    file of 100-byte values, about half the CPU).

    On an object store pre-buffered: the reader coalesces the column chunks it reads into a
    few ranged GETs (holes up to 8 KiB, ranges up to 32 MiB; Arrow's defaults) instead of one
    GET per column chunk. Measured on moto (which reads the whole object for every ranged
    GET), a bucket file of 625k rows of 100-byte values, its keys read then 10% of its rows
    taken (``merge._CurrentRows``): 11 GETs -> 5, 2.0 s -> 0.8 s; fewer requests are fewer
    round trips on a real store as well.
    """
    source = open_input(path)
    return pq.ParquetFile(source, pre_buffer=not isinstance(source, pa.MemoryMappedFile))


def open_output(path: str) -> pa.NativeFile:
    """A new file of the lake for writing (its directory made on local disk)."""
    fs, fs_path, local = _fs(path)
    if local:
        Path(fs_path).parent.mkdir(parents=True, exist_ok=True)
        return pa.OSFile(fs_path, "wb")
    return fs.open_output_stream(fs_path)


def file_size(path: str) -> int:
    fs, fs_path, _local = _fs(path)
    return int(fs.get_file_info(fs_path).size or 0)


# <table>/_loglake_staging/: the runs' leases and scratch (pipelines.compaction.runs)
STAGING = STAGING_DIR
