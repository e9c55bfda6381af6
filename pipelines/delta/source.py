"""``format("delta")`` without Delta's jars: a Spark 4 Python data source reading a snapshot.

``spark.read.format("delta").load(path)`` and ``CREATE TEMPORARY VIEW t USING delta OPTIONS
(path '...')`` work on a session that lacks delta-spark once :func:`register_delta_source` has
run (``pipelines.session.get_spark`` does it when the session has no native Delta; a session
with ``io.delta.sql.DeltaSparkSessionExtension`` keeps Delta's own reader: nothing is
registered there).

Where things run: ``schema()`` and ``reader()`` run in Python workers on the driver host;
``pushFilters()`` then ``partitions()`` run once while Spark plans the scan: the snapshot
(delta-rs) is pinned there, and its files are kept or skipped; ``read()`` runs on the
executors, one call per input partition, reading Parquet with pyarrow and yielding Arrow
record batches (no per-row Python objects).

What the scan does:

- **Snapshot**: the latest version, or ``versionAsOf`` / ``timestampAsOf`` (Delta's option
  names). Only the snapshot's files are read, never a directory listing.
- **Input partitions**: one per data file; with option ``maxPartitionBytes`` (bytes), files
  are packed in snapshot order into partitions of at most that size.
- **Columns**: Spark 4.2's Python data source API has no column pruning (the reader is not told
  which columns a query uses; Spark drops the others after the scan). Give a schema to read
  fewer: ``spark.read.format("delta").schema("topic string, offset long").load(path)`` reads
  only those columns from the Parquet files.
- **Tables plain Parquet reading cannot honour** (deletion vectors in use, column mapping):
  read through delta-rs (DataFusion) in one input partition, so the result is still correct.

**File pruning is opt-in** (option ``pruneFiles`` = ``true``, and the session must have
``spark.sql.python.filterPushdown.enabled`` = ``true``), because of how Spark 4.2 plans Python
data sources: the file list planned with one query's pushed filters is cached on the relation
(``PythonDataSourceV2.readInfo``) and reused by the next query over the *same* DataFrame or
view that pushes no filter, which would then silently miss the pruned files
(``df.where("topic = 'a'").count(); df.count()`` returns the first count twice). Pruning is
therefore only for a DataFrame planned once. With it:

- **Partition pruning** (exact): filters on partition columns (``=``, ``<=>``, ``<``, ``<=``,
  ``>``, ``>=``, ``IN``, ``IS [NOT] NULL``, ``LIKE 'a%'`` / ``'%a'`` / ``'%a%'``, ``NOT`` of
  those) are evaluated on each file's partition values with SQL's three-valued logic; a file
  whose values fail is not read, and Spark does not evaluate those filters again.
- **Data skipping** (inexact): the same comparisons, ``IN`` and ``IS [NOT] NULL`` on other
  columns are checked against the files' Delta statistics (min, max, null count); a file that
  cannot hold a matching row is skipped. Spark still evaluates these filters on the rows that
  are read. Statistics are used for integer, date, timestamp (widened by 1 ms: Delta stores them
  at millisecond precision), boolean and string columns (a string maximum of 32 characters or
  more may be truncated and is not used). Files without statistics are always read.

Views that analysts reuse (``pipelines.delta.sql.register_lake_views``) get pruning from
Spark's own Parquet reader instead (``read_delta``).

**Object storage**: ``load("s3://bucket/lake/records")`` (or ``gs://``, ``abfss://``) opens the
snapshot with delta-rs and reads the Parquet files on the executors through pyarrow's
filesystem (:mod:`logstore.objectstore`); no Hadoop S3 connector is needed. The settings are this
Python worker's environment (``AWS_ENDPOINT_URL``, keys, region), or options
``storage.<key>`` (the ``[storage]`` keys of :data:`logstore.objectstore.OVERRIDE_KEYS`), which
``read_delta`` passes; the reader carries the resolved settings to the executors.

Options (strings, case-insensitive): ``path``, ``versionAsOf``, ``timestampAsOf`` (ISO-8601),
``maxPartitionBytes``, ``pruneFiles``, ``storage.*``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringContains,
    StringEndsWith,
    StringStartsWith,
)
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from logstore.objectstore import LakeLocation, StorageSettings
from pipelines.delta.errors import DeltaSinkError

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import SparkSession

__all__ = [
    "FORMAT",
    "PUSHDOWN_KEY",
    "STORAGE_OPTION_PREFIX",
    "DeltaFilesPartition",
    "DeltaPruningReader",
    "DeltaSnapshotReader",
    "DeltaSnapshotSource",
    "needs_delta_reader",
    "register_delta_source",
]

FORMAT = "delta"
PUSHDOWN_KEY = "spark.sql.python.filterPushdown.enabled"
# options named storage.<key> carry logstore.objectstore settings (StorageSettings.to_overrides)
STORAGE_OPTION_PREFIX = "storage."
# A string statistic this long may be a truncated prefix (Delta writers cut at 32 characters).
_STRING_STAT_LIMIT = 32
_IN_LIMIT = 100
_COMPARISONS = (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)


def _settings(options: dict[str, str]) -> StorageSettings:
    """The ``storage.*`` options as settings, else this process's default."""
    given = {
        k[len(STORAGE_OPTION_PREFIX) :]: v
        for k, v in options.items()
        if k.startswith(STORAGE_OPTION_PREFIX)
    }
    return StorageSettings.from_overrides(given) if given else StorageSettings.default()


def _open(root: str, options: dict[str, str]) -> DeltaTable:
    from deltalake import DeltaTable  # noqa: PLC0415
    from deltalake.exceptions import DeltaError, TableNotFoundError  # noqa: PLC0415

    location = LakeLocation.parse(root)
    storage = _settings(options).delta_options(location) if not location.is_local else None

    version = options.get("versionasof")
    timestamp = options.get("timestampasof")
    if version is not None and timestamp is not None:
        raise DeltaSinkError("give versionAsOf or timestampAsOf, not both", path=root)
    try:
        table = DeltaTable(root, storage_options=storage)
        if version is not None:
            if not version.strip().isdigit():
                raise DeltaSinkError(f"versionAsOf must be a version number, got {version!r}")
            latest = table.version()
            if int(version) > latest:
                raise DeltaSinkError(
                    f"versionAsOf {version}: the table's latest version is {latest}", path=root
                )
            table.load_as_version(int(version))
        elif timestamp is not None:
            table.load_as_version(timestamp)
    except TableNotFoundError:
        raise DeltaSinkError("no Delta table here (no _delta_log)", path=root) from None
    except DeltaError as exc:
        raise DeltaSinkError(f"cannot read the Delta table: {exc}", path=root) from None
    return table


def needs_delta_reader(table: DeltaTable) -> bool:
    """True when plain Parquet reading would be wrong: column mapping, or deletion vectors."""
    config = table.metadata().configuration
    if config.get("delta.columnMapping.mode", "none") not in ("none", None):
        return True
    features = table.protocol().reader_features or []
    return "deletionVectors" in features and pa.table(table.deletion_vectors()).num_rows > 0


def _root(options: dict[str, str]) -> str:
    path = options.get("path")
    if not path:
        raise DeltaSinkError("format('delta') needs a path: .load(<table dir>)")
    if "://" in path:
        return LakeLocation.parse(path).uri
    return str(Path(path.removeprefix("file:").removeprefix("//")).absolute())


class DeltaSnapshotSource(DataSource):
    """``format("delta")``: one snapshot of a Delta table (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def _options(self) -> dict[str, str]:
        return {k.lower(): v for k, v in self.options.items()}

    def schema(self) -> StructType:
        options = self._options()
        table = _open(_root(options), options)
        return from_arrow_schema(pa.schema(table.schema().to_arrow()), prefer_timestamp_ntz=True)

    def reader(self, schema: StructType) -> DataSourceReader:
        options = self._options()
        root = _root(options)
        table = _open(root, options)
        max_bytes = options.get("maxpartitionbytes")
        if max_bytes is not None and not max_bytes.strip().isdigit():
            raise DeltaSinkError(f"maxPartitionBytes must be a byte count, got {max_bytes!r}")
        prune = options.get("prunefiles", "false").strip().lower()
        if prune not in ("true", "false"):
            raise DeltaSinkError(f"pruneFiles must be true or false, got {prune!r}")
        cls = DeltaPruningReader if prune == "true" else DeltaSnapshotReader
        remote = not LakeLocation.parse(root).is_local
        return cls(
            storage=_settings(options).to_overrides() if remote else {},
            root=root,
            version=table.version(),
            schema=schema,
            partition_columns=list(table.metadata().partition_columns),
            via_delta_rs=needs_delta_reader(table),
            max_partition_bytes=int(max_bytes) if max_bytes else None,
        )


@dataclass
class DeltaFilesPartition(InputPartition):
    """Data files of the snapshot one task reads: absolute paths and their partition values."""

    files: list[str]
    partition_values: list[dict[str, Any]]
    via_delta_rs: bool = False

    def __post_init__(self) -> None:
        super().__init__(None)


@dataclass
class DeltaSnapshotReader(DataSourceReader):
    """Plans on the driver (filters, files), reads on the executors. Picklable and small."""

    root: str
    version: int
    schema: StructType
    partition_columns: list[str]
    via_delta_rs: bool
    max_partition_bytes: int | None = None
    filters: list[Filter] = field(default_factory=list)
    # resolved object-store settings (StorageSettings.to_overrides); empty on local disk
    storage: dict[str, str] = field(default_factory=dict)

    def _pinned(self) -> dict[str, str]:
        opts = {STORAGE_OPTION_PREFIX + k: v for k, v in self.storage.items()}
        return {"versionasof": str(self.version), **opts}

    # ---- planning (driver) ----

    def _push(self, filters: list[Filter]) -> Iterable[Filter]:
        names = set(self.schema.fieldNames())
        for f in filters:
            col = _column(f)
            if col is not None and col in names and not self.via_delta_rs:
                self.filters.append(f)
                if col in self.partition_columns and _exact(f):
                    continue  # decided per file, exactly: Spark need not look again
            yield f

    def partitions(self) -> Sequence[InputPartition]:
        table = _open(self.root, self._pinned())
        if self.via_delta_rs:
            return [DeltaFilesPartition([], [], via_delta_rs=True)]
        actions = pa.table(table.get_add_actions(flatten=True))
        if actions.num_rows == 0:
            return [InputPartition(None)]
        keep = self._file_mask(actions)
        kept = actions.filter(keep)
        paths = kept.column("path").to_pylist()
        sizes = kept.column("size_bytes").to_pylist()
        parts = {
            c: kept.column(f"partition.{c}").to_pylist()
            for c in self.partition_columns
            if f"partition.{c}" in kept.column_names
        }
        uris = {p: _absolute(self.root, p) for p in paths}
        if not paths:
            return [InputPartition(None)]
        out: list[InputPartition] = []
        group: list[int] = []
        group_bytes = 0
        limit = self.max_partition_bytes
        for i, size in enumerate(sizes):
            if group and (limit is None or group_bytes + size > limit):
                out.append(self._partition(group, paths, parts, uris))
                group, group_bytes = [], 0
            group.append(i)
            group_bytes += size
        out.append(self._partition(group, paths, parts, uris))
        return out

    def _partition(
        self,
        group: list[int],
        paths: list[str],
        parts: dict[str, list[Any]],
        uris: dict[str, str],
    ) -> DeltaFilesPartition:
        return DeltaFilesPartition(
            [uris[paths[i]] for i in group],
            [{c: values[i] for c, values in parts.items()} for i in group],
        )

    def _file_mask(self, actions: pa.Table) -> pa.Array:
        arrow = to_arrow_schema(self.schema, timezone="UTC")
        keep = pa.array([True] * actions.num_rows)
        for f in self.filters:
            col = _column(f)
            assert col is not None  # only such filters are kept
            ftype = arrow.field(col).type
            if col in self.partition_columns:
                mask = _partition_mask(f, actions, col, ftype)
            else:
                mask = _stats_mask(f, actions, col, ftype)
            keep = pc.and_(keep, mask)
        return keep

    # ---- reading (executors) ----

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from pipelines.worker import start_task  # noqa: PLC0415

        start_task()
        target = to_arrow_schema(self.schema, timezone="UTC")
        if not isinstance(partition, DeltaFilesPartition):
            return
        if partition.via_delta_rs:
            yield from self._read_via_delta_rs(target)
            return
        location = LakeLocation.parse(self.root)
        fs = StorageSettings.from_overrides(self.storage).filesystem(location)
        for path, values in zip(partition.files, partition.partition_values, strict=True):
            yield from _read_file(fs, path, values, target)

    def _read_via_delta_rs(self, target: pa.Schema) -> Iterator[pa.RecordBatch]:
        from deltalake import QueryBuilder  # noqa: PLC0415

        table = _open(self.root, self._pinned())
        cols = ", ".join('"' + n.replace('"', '""') + '"' for n in target.names)
        reader = QueryBuilder().register("t", table).execute(f"SELECT {cols} FROM t")
        for batch in pa.RecordBatchReader.from_stream(reader):
            yield _conform(batch, {}, target)


def _absolute(root: str, path: str) -> str:
    """A data file's path for the executors' filesystem: an absolute local path, or the
    ``bucket/key`` path of pyarrow's object-store filesystems."""
    from urllib.parse import unquote, urlparse  # noqa: PLC0415

    location = LakeLocation.parse(root)
    if "://" in path:
        parsed = urlparse(path)
        if parsed.scheme == "file" and location.is_local:
            return unquote(parsed.path)
        if parsed.scheme != location.scheme:
            raise DeltaSinkError(f"a data file outside the table's store: {path!r}", path=root)
        return LakeLocation.parse(unquote(path)).fs_path
    if location.is_local:
        return str(Path(root) / unquote(path))
    return f"{location.fs_path}/{unquote(path)}"


def _read_file(
    fs: Any, path: str, values: dict[str, Any], target: pa.Schema
) -> Iterator[pa.RecordBatch]:
    import pyarrow.parquet as pq  # noqa: PLC0415

    pf = pq.ParquetFile(path, filesystem=fs)
    present = set(pf.schema_arrow.names)
    columns = [n for n in target.names if n in present and n not in values]
    if not columns and pf.metadata.num_rows:
        # no column of the file is wanted (e.g. only partition columns, or count(*))
        n = pf.metadata.num_rows
        yield _conform(pa.record_batch([pa.nulls(n)], names=["__rows"]), values, target)
        return
    for batch in pf.iter_batches(columns=columns, batch_size=65536):
        yield _conform(batch, values, target)


def _conform(batch: pa.RecordBatch, values: dict[str, Any], target: pa.Schema) -> pa.RecordBatch:
    """``batch`` as ``target`` wants it: partition values filled in, missing columns null,
    types cast (a file written before a type change or by another writer)."""
    n = batch.num_rows
    names = batch.schema.names
    arrays = []
    for f in target:
        if f.name in values:
            arrays.append(pa.repeat(pa.scalar(values[f.name]).cast(f.type), n))
        elif f.name in names:
            col = batch.column(names.index(f.name))
            arrays.append(col if col.type == f.type else col.cast(f.type))
        else:
            arrays.append(pa.nulls(n, f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=target)


@dataclass
class DeltaPruningReader(DeltaSnapshotReader):
    """``pruneFiles``: the same reader, told the query's filters (see the module docstring).

    A separate class because Spark refuses any reader implementing ``pushFilters`` on a
    session without Python filter pushdown, and the default reader must work everywhere."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:  # noqa: N802 (Spark API)
        return self._push(filters)


# ---- filters --------------------------------------------------------------------------------


def _column(f: Filter) -> str | None:
    """The top-level column a filter is about (None: nested, or unknown)."""
    if isinstance(f, Not):
        return _column(f.child)
    attr = getattr(f, "attribute", None)
    if isinstance(attr, tuple) and len(attr) == 1:
        return str(attr[0])
    return None


def _exact(f: Filter) -> bool:
    if isinstance(f, Not):
        return _exact(f.child)
    return isinstance(
        f,
        (
            *_COMPARISONS,
            EqualNullSafe,
            In,
            IsNull,
            IsNotNull,
            StringStartsWith,
            StringEndsWith,
            StringContains,
        ),
    )


def _literal(value: Any, ftype: pa.DataType) -> pa.Scalar | None:
    """``value`` as a scalar of the column's type, or None when it does not convert exactly."""
    if pa.types.is_timestamp(ftype) and isinstance(value, dt.datetime) and value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC) if ftype.tz else value
    try:
        return pa.scalar(value, type=ftype)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        return None


def _partition_mask(f: Filter, actions: pa.Table, col: str, ftype: pa.DataType) -> pa.Array:
    """Files whose partition value satisfies ``f`` (SQL's three-valued logic: NULL fails)."""
    name = f"partition.{col}"
    n = actions.num_rows
    if name not in actions.column_names:
        return pa.array([True] * n)
    values = actions.column(name)
    try:
        values = values.cast(ftype)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return pa.array([True] * n)
    result = _three_valued(f, values, ftype)
    if result is None:
        return pa.array([True] * n)
    return pc.fill_null(result, False)


def _three_valued(f: Filter, values: Any, ftype: pa.DataType) -> Any:
    if isinstance(f, Not):
        inner = _three_valued(f.child, values, ftype)
        return None if inner is None else pc.invert(inner)
    if isinstance(f, IsNull):
        return pc.is_null(values)
    if isinstance(f, IsNotNull):
        return pc.is_valid(values)
    if isinstance(f, EqualNullSafe):
        if f.value is None:
            return pc.is_null(values)
        lit = _literal(f.value, ftype)
        return None if lit is None else pc.fill_null(pc.equal(values, lit), False)
    if isinstance(f, In):
        lits = [_literal(v, ftype) for v in f.value if v is not None]
        if any(lit is None for lit in lits):
            return None
        hit = pc.is_in(values, value_set=pa.array([lit.as_py() for lit in lits], ftype))
        hit = pc.if_else(pc.is_null(values), pa.scalar(None, pa.bool_()), hit)
        if any(v is None for v in f.value):  # x IN (.., NULL) is NULL where it is not true
            hit = pc.if_else(hit, True, pa.scalar(None, pa.bool_()))
        return hit
    if isinstance(f, (StringStartsWith, StringEndsWith, StringContains)):
        if not pa.types.is_string(ftype):
            return None
        fn = {
            StringStartsWith: pc.starts_with,
            StringEndsWith: pc.ends_with,
            StringContains: pc.match_substring,
        }[type(f)]
        return fn(values, pattern=f.value)
    if isinstance(f, _COMPARISONS):
        lit = _literal(f.value, ftype)
        if lit is None:
            return None
        fn = {
            EqualTo: pc.equal,
            GreaterThan: pc.greater,
            GreaterThanOrEqual: pc.greater_equal,
            LessThan: pc.less,
            LessThanOrEqual: pc.less_equal,
        }[type(f)]
        return fn(values, lit)
    return None


def _stats_usable(ftype: pa.DataType) -> bool:
    return (
        pa.types.is_integer(ftype)
        or pa.types.is_date(ftype)
        or pa.types.is_timestamp(ftype)
        or pa.types.is_boolean(ftype)
        or pa.types.is_string(ftype)
    )


def _stats_mask(f: Filter, actions: pa.Table, col: str, ftype: pa.DataType) -> pa.Array:
    """Files that may hold a row satisfying ``f``, from their statistics (unknown: kept)."""
    n = actions.num_rows
    keep_all = pa.array([True] * n)
    if isinstance(f, IsNull) or (isinstance(f, EqualNullSafe) and f.value is None):
        nulls = _stat(actions, f"null_count.{col}", pa.int64())
        return keep_all if nulls is None else pc.fill_null(pc.greater(nulls, 0), True)
    if isinstance(f, IsNotNull):
        nulls = _stat(actions, f"null_count.{col}", pa.int64())
        rows = _stat(actions, "num_records", pa.int64())
        if nulls is None or rows is None:
            return keep_all
        return pc.fill_null(pc.less(nulls, rows), True)
    if not _stats_usable(ftype):
        return keep_all
    lo = _stat(actions, f"min.{col}", ftype)
    hi = _stat(actions, f"max.{col}", ftype)
    if lo is None or hi is None:
        return keep_all
    if pa.types.is_timestamp(ftype):  # statistics are milliseconds: widen by one
        one_ms = pa.scalar(dt.timedelta(milliseconds=1), pa.duration(ftype.unit))
        lo = pc.subtract(lo, one_ms)
        hi = pc.add(hi, one_ms)
    if pa.types.is_string(ftype):  # a long maximum may be a truncated prefix: unknown
        hi = pc.if_else(
            pc.greater_equal(pc.utf8_length(hi), _STRING_STAT_LIMIT), pa.scalar(None, ftype), hi
        )

    def may_equal(lit: pa.Scalar) -> Any:
        return pc.and_kleene(pc.less_equal(lo, lit), pc.greater_equal(hi, lit))

    if isinstance(f, (EqualTo, EqualNullSafe)):
        lit = _literal(f.value, ftype)
        mask = None if lit is None else may_equal(lit)
    elif isinstance(f, In):
        lits = [_literal(v, ftype) for v in f.value if v is not None]
        if not lits or len(lits) > _IN_LIMIT or any(lit is None for lit in lits):
            return keep_all if lits or not f.value else pa.array([False] * n)
        mask = may_equal(lits[0])
        for lit in lits[1:]:
            mask = pc.or_kleene(mask, may_equal(lit))
    elif isinstance(f, _COMPARISONS):
        lit = _literal(f.value, ftype)
        if lit is None:
            return keep_all
        mask = {
            GreaterThan: lambda: pc.greater(hi, lit),
            GreaterThanOrEqual: lambda: pc.greater_equal(hi, lit),
            LessThan: lambda: pc.less(lo, lit),
            LessThanOrEqual: lambda: pc.less_equal(lo, lit),
        }[type(f)]()
    else:
        return keep_all
    return keep_all if mask is None else pc.fill_null(mask, True)


def _stat(actions: pa.Table, name: str, ftype: pa.DataType) -> pa.ChunkedArray | None:
    if name not in actions.column_names:
        return None
    try:
        return actions.column(name).cast(ftype)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


# ---- registration ---------------------------------------------------------------------------

_registered: set[int] = set()


def register_delta_source(spark: SparkSession) -> bool:
    """Make ``format("delta")`` readable on ``spark`` with this source, unless the session has
    Delta's own reader (``pipelines.session.delta_spark_available``). Returns whether this
    source is the one answering."""
    from pipelines.session import delta_spark_available  # noqa: PLC0415

    if delta_spark_available(spark):
        return False
    if id(spark) not in _registered:
        spark.dataSource.register(DeltaSnapshotSource)
        _registered.add(id(spark))
    return True
