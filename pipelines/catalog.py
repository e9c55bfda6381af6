"""The lake's tables by name, and SQL over them with delta-rs's DataFusion (no Spark).

Every Delta table under a lake directory (a directory holding ``_delta_log``) is a table whose
SQL name is its path below the lake, lower-cased, with ``/`` and every character outside
``[a-z0-9_]`` turned into ``_``: ``<lake>/records`` is ``records``, ``<lake>/topics/orders``
is ``topics_orders``. Directories starting with ``_`` or ``.`` (``_quality``, ...) are not
searched, nor is a table's own directory below its root. Two paths that give the same name are
an error naming both.

Views change one thing against the stored tables: the lookup tables keep Kafka's raw
milliseconds in ``max_timestamp`` (what ``.timeindex`` holds; ListOffsets compares them), and a
view shows that column as a UTC timestamp, with the raw value beside it as
``max_timestamp_ms`` (:data:`TIMESTAMP_MS_COLUMNS`). Spark's views
(:func:`pipelines.delta.sql.register_lake_views`) do the same.

The lake may be a local directory or an object-store prefix (``s3://bucket/lake``, see
:mod:`logstore.objectstore`): there the search walks the store's common prefixes with the same
rules, and tables open with the storage options of the environment (or of ``settings``).

Time travel (:data:`Pin`): a table is read at its latest version, at a version number, or as
of a timestamp: the last version committed at or before it, by the commits' own timestamps
(what :func:`table_history` lists); a timestamp before the first commit is an error, as in
Spark's ``TIMESTAMP AS OF`` (delta-rs alone would silently give version 0).

This module imports neither Spark nor the Delta sink, so ``loglake sql`` starts quickly.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import DeltaError, TableNotFoundError

from logstore.errors import InvalidConfigError, LoglakeError
from logstore.objectstore import LakeLocation, StorageSettings, delta_target, open_store

__all__ = [
    "HISTORY_SCHEMA",
    "RAW_PREFIX",
    "TIMESTAMP_MS_COLUMNS",
    "LakeTable",
    "Pin",
    "QueryError",
    "find_tables",
    "lake_query_builder",
    "open_table",
    "parse_timestamp",
    "parse_timestamps",
    "parse_versions",
    "run_query",
    "table_history",
    "table_name",
    "view_columns",
]

# table -> integer millisecond columns shown as timestamps in views (raw value kept as <col>_ms)
TIMESTAMP_MS_COLUMNS: Mapping[str, tuple[str, ...]] = {
    "offset_lookup": ("max_timestamp",),
    "time_lookup": ("max_timestamp",),
}
# name under which a table whose view converts columns is registered raw in DataFusion
RAW_PREFIX = "__loglake_raw_"
# A table's time travel: a version number, or a timestamp (aware, any zone).
Pin = int | datetime.datetime
_NOT_NAME = re.compile(r"[^a-z0-9_]")


class QueryError(LoglakeError):
    """A query the engine refused (bad SQL, unknown table or column) or could not run."""


@dataclass(frozen=True, slots=True)
class LakeTable:
    """One Delta table of the lake: its SQL ``name`` and directory ``path`` (a ``Path`` on
    local disk, the table's URI, e.g. ``s3://bucket/lake/records``, on an object store)."""

    name: str
    path: Path | str


def table_name(relative: str | Path) -> str:
    """The SQL name of the table at ``relative`` (a path below the lake)."""
    parts = Path(relative).parts
    return "_".join(_NOT_NAME.sub("_", p.lower()) for p in parts)


def find_tables(lake: str | Path, *, settings: StorageSettings | None = None) -> list[LakeTable]:
    """Every Delta table under ``lake``, sorted by name (see the module docstring)."""
    location = LakeLocation.parse(lake)
    if not location.is_local:
        return _find_remote_tables(location, settings)
    root = location.local_path
    if not root.is_dir():
        raise LoglakeError("lake directory does not exist", path=str(root))
    found: dict[str, LakeTable] = {}
    for here, dirs, _files in os.walk(root):
        if "_delta_log" in dirs and Path(here) != root:
            rel = Path(here).relative_to(root)
            name = table_name(rel)
            if name in found:
                raise LoglakeError(
                    f"two tables would be called {name!r}: {found[name].path} and {here}; "
                    "rename one directory",
                    path=str(root),
                )
            found[name] = LakeTable(name, Path(here))
            dirs.clear()  # a table's own directories are partitions, not tables
            continue
        dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
    return sorted(found.values(), key=lambda t: t.name)


def _find_remote_tables(lake: LakeLocation, settings: StorageSettings | None) -> list[LakeTable]:
    """``find_tables`` on an object store: a breadth-first walk of common prefixes (one listing
    per directory, data files are never listed), the same naming and skipping rules."""
    store = open_store(lake, settings=settings)
    found: dict[str, LakeTable] = {}
    pending = [d for d in store.list_dirs() if not d.startswith(("_", "."))]
    while pending:
        rel = pending.pop(0)
        children = store.list_dirs(rel)
        if "_delta_log" in children:
            name = table_name(rel)
            uri = lake.join(rel).uri
            if name in found:
                raise LoglakeError(
                    f"two tables would be called {name!r}: {found[name].path} and {uri}; "
                    "rename one directory",
                    path=lake.uri,
                )
            found[name] = LakeTable(name, uri)
            continue
        pending += [f"{rel}/{d}" for d in children if not d.startswith(("_", "."))]
    return sorted(found.values(), key=lambda t: t.name)


def _split_spec(spec: str, tables: Sequence[LakeTable], flag: str, what: str) -> tuple[str, str]:
    names = {t.name for t in tables}
    name, sep, value = spec.partition("=")
    name = name.strip().lower()
    if not sep or not value.strip():
        raise InvalidConfigError(f"{flag} takes TABLE={what}, got {spec!r}")
    if name not in names:
        raise InvalidConfigError(
            f"{flag} names table {name!r}, which is not in the lake "
            f"(tables: {', '.join(sorted(names)) or 'none'})"
        )
    return name, value.strip()


def parse_versions(
    specs: Sequence[str], tables: Sequence[LakeTable], *, flag: str = "--as-of-version"
) -> dict[str, int]:
    """``["records=3", ...]`` -> ``{"records": 3}``; unknown tables and bad numbers refused
    (messages name ``flag``)."""
    out: dict[str, int] = {}
    for spec in specs:
        name, number = _split_spec(spec, tables, flag, "N")
        if not number.isdigit():
            raise InvalidConfigError(f"{flag} takes TABLE=N (N a version number), got {spec!r}")
        out[name] = int(number)
    return out


def parse_timestamp(text: str) -> datetime.datetime:
    """An ISO-8601 date or date-time (``2026-11-27``, ``2026-11-27T14:00:00Z``,
    ``...+01:00``); without a zone it is UTC."""
    try:
        when = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidConfigError(
            f"{text!r} is not an ISO-8601 timestamp (e.g. 2026-11-27T14:00:00Z)"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=datetime.UTC)


def parse_timestamps(
    specs: Sequence[str], tables: Sequence[LakeTable], *, flag: str = "--as-of-timestamp"
) -> dict[str, datetime.datetime]:
    """``["records=2026-11-27T14:00:00Z", ...]`` -> ``{"records": datetime}``."""
    out: dict[str, datetime.datetime] = {}
    for spec in specs:
        name, text = _split_spec(spec, tables, flag, "TIMESTAMP")
        out[name] = parse_timestamp(text)
    return out


def _commits(dt: DeltaTable) -> list[tuple[int, int]]:
    """(version, commit timestamp in ms) of the versions the log still holds, oldest first."""
    return sorted((int(h["version"]), int(h["timestamp"])) for h in dt.history())


def _version_as_of(table: LakeTable, dt: DeltaTable, when: datetime.datetime) -> int:
    ms = int(when.timestamp() * 1000)
    commits = _commits(dt)
    before = [v for v, ts in commits if ts <= ms]
    if not before:
        first = datetime.datetime.fromtimestamp(commits[0][1] / 1000, datetime.UTC)
        raise InvalidConfigError(
            f"table {table.name!r} has no version as of {when.isoformat()}: its first "
            f"version {commits[0][0]} was committed at {first.isoformat()}",
            path=str(table.path),
        )
    return max(before)


def open_table(
    table: LakeTable, pin: Pin | None = None, *, settings: StorageSettings | None = None
) -> DeltaTable:
    """The table's latest snapshot, or the one ``pin`` names (a version, or the last version
    committed at or before a timestamp); a clear error when that does not exist."""
    uri, options = delta_target(table.path, settings=settings)
    try:
        dt = DeltaTable(uri, storage_options=options or None)
        if isinstance(pin, datetime.datetime):
            pin = _version_as_of(table, dt, pin)
        if pin is not None:
            latest = dt.version()
            if not 0 <= pin <= latest:
                raise InvalidConfigError(
                    f"table {table.name!r} has versions 0..{latest}, not {pin}",
                    path=str(table.path),
                )
            dt.load_as_version(pin)
    except (TableNotFoundError, DeltaError, OSError) as exc:
        raise LoglakeError(
            f"cannot open table {table.name!r}"
            + (f" at version {pin}" if pin is not None else "")
            + f": {exc}",
            path=str(table.path),
        ) from exc
    return dt


HISTORY_SCHEMA = pa.schema(
    [
        ("version", pa.int64()),
        ("timestamp", pa.timestamp("ms", tz="UTC")),
        ("operation", pa.string()),
        ("parameters", pa.string()),  # JSON object
        ("metrics", pa.string()),  # JSON object
    ]
)


def table_history(table: LakeTable, *, settings: StorageSettings | None = None) -> pa.Table:
    """The table's versions still in its log, newest first (:data:`HISTORY_SCHEMA`): version,
    commit timestamp, operation (``WRITE``, ``MERGE``, ``DELETE``, ``OPTIMIZE``, ...), its
    parameters and metrics as JSON objects. Versions whose log entries were cleaned up
    (``delta.logRetentionDuration``) are not listed: they cannot be read either."""
    uri, options = delta_target(table.path, settings=settings)
    try:
        history = DeltaTable(uri, storage_options=options or None).history()
    except (TableNotFoundError, DeltaError, OSError) as exc:
        raise LoglakeError(
            f"cannot open table {table.name!r}: {exc}", path=str(table.path)
        ) from exc
    rows = sorted(history, key=lambda h: -int(h["version"]))
    return pa.table(
        {
            "version": [int(h["version"]) for h in rows],
            "timestamp": [int(h["timestamp"]) for h in rows],
            "operation": [str(h.get("operation", "")) for h in rows],
            "parameters": [json.dumps(h.get("operationParameters") or {}, sort_keys=True)
                           for h in rows],
            "metrics": [json.dumps(h.get("operationMetrics") or {}, sort_keys=True) for h in rows],
        },
        schema=HISTORY_SCHEMA,
    )  # fmt: skip


def view_columns(name: str, schema: pa.Schema) -> list[tuple[str, str]] | None:
    """How a view of table ``name`` with ``schema`` shows its columns: ``(kind, column)`` pairs,
    ``kind`` being ``col`` (as stored), ``ts`` (milliseconds shown as a timestamp) or ``ms``
    (the raw milliseconds of the column before it, named ``<column>_ms``); None when the view
    is the table itself."""
    wanted = set(TIMESTAMP_MS_COLUMNS.get(name, ()))
    convert = {f.name for f in schema if f.name in wanted and pa.types.is_integer(f.type)}
    if not convert:
        return None
    out: list[tuple[str, str]] = []
    for f in schema:
        if f.name in convert:
            out += [("ts", f.name), ("ms", f.name)]
        else:
            out.append(("col", f.name))
    return out


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def lake_query_builder(
    tables: Sequence[LakeTable],
    versions: Mapping[str, Pin] | None = None,
    *,
    settings: StorageSettings | None = None,
) -> QueryBuilder:
    """A DataFusion ``QueryBuilder`` with every table registered by name (``versions`` pins
    some to a version or a timestamp; the others are at their latest)."""
    qb = QueryBuilder()
    for table in tables:
        dt = open_table(table, (versions or {}).get(table.name), settings=settings)
        columns = view_columns(table.name, pa.schema(dt.schema().to_arrow()))
        if columns is None:
            qb = qb.register(table.name, dt)
            continue
        raw = RAW_PREFIX + table.name
        qb = qb.register(raw, dt)
        select = []
        for kind, col in columns:
            if kind == "ts":
                select.append(
                    f"arrow_cast(to_timestamp_millis({_quote(col)}), "
                    f"'Timestamp(Millisecond, Some(\"UTC\"))') AS {_quote(col)}"
                )
            elif kind == "ms":
                select.append(f"{_quote(col)} AS {_quote(col + '_ms')}")
            else:
                select.append(_quote(col))
        _execute(
            qb, f"CREATE VIEW {_quote(table.name)} AS SELECT {', '.join(select)} FROM {_quote(raw)}"
        )
    return qb


def _execute(qb: QueryBuilder, sql: str) -> pa.RecordBatchReader:
    try:
        return pa.RecordBatchReader.from_stream(qb.execute(sql))
    except DeltaError as exc:
        raise QueryError(_engine_message(exc)) from None
    except Exception as exc:  # DataFusion's own errors surface as plain exceptions too
        raise QueryError(_engine_message(exc)) from None


def _engine_message(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.replace("datafusion.public.", "")


def run_query(qb: QueryBuilder, sql: str) -> pa.RecordBatchReader:
    """Run ``sql`` and stream its result; ``QueryError`` (one line, no traceback) on failure."""
    if not sql.strip():
        raise QueryError("empty query")
    return _execute(qb, sql)
