"""Driver side of the Delta sink: one Delta transaction for all files of a write, with delta-rs.

Invariants a commit keeps (delta-rs alone does not):

- **Schema**: the data's columns, types and partition columns equal the table's (nullability
  aside); delta-rs would accept any schema silently.
- **App transactions** (``txn`` actions, Delta's idempotent-write mechanism): a requested
  ``(app_id, version)`` never moves an app's version backwards (a stale re-run is refused with
  ``StaleTransactionError``); a write whose every requested version is already the table's is a
  no-op (``committed=False``). With ``expected_versions`` (the versions a run read before it
  started), the commit also refuses when another run advanced any of those apps in between.
- **Conflicts**: every attempt commits with delta-rs retries off, against the snapshot it just
  checked, so the checks above hold for the version actually written. When another writer won
  the race, a blind append or a full overwrite re-reads the table and tries again (both are
  equivalent to running after the winner); an overwrite by predicate, whose removed files were
  chosen from an older snapshot, fails with ``ConcurrentWriteError``.

Tables are created in one place, :func:`create_table` (version 0, with its first files, its
Delta properties and description): :func:`ensure_table`, a first commit and compaction's
tables (:mod:`pipelines.compaction.setup`) all go through it; :func:`merge_schema` grows a
table's schema (the typed tables).

Where: a table is a local directory or an object-store prefix (``s3://bucket/prefix/table``);
every function takes either form (or a :class:`~logstore.objectstore.LakeLocation`) and
reaches delta-rs with the ``storage_options`` of :class:`~logstore.objectstore.StorageSettings`
(``settings``; the standard AWS environment when not given). On S3 those carry
``conditional_put="etag"``: delta-rs writes each ``_delta_log`` entry with ``If-None-Match: *``,
so two writers racing for one version get one winner and one ``CommitFailedError`` (handled
as a conflict below), never an unsafe copy-then-delete rename.

Thread-safety: functions here share no state; concurrent calls race only through the table's
log, which is what the conflict handling is for. Crash behaviour: a commit is one atomic
``_delta_log`` entry; a crash before it leaves only unreferenced data files.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import (
    AddAction,
    CommitProperties,
    RemoveAction,
    Transaction,
    create_table_with_add_actions,
)

from logstore.objectstore import LakeLocation, StorageSettings, delta_target
from pipelines.delta.errors import (
    ConcurrentWriteError,
    DeltaSinkError,
    SchemaMismatchError,
    StaleTransactionError,
    first_error_line,
)
from pipelines.delta.files import WrittenFile, table_location
from pipelines.delta.log import DeltaLog

__all__ = [
    "CommitResult",
    "Mode",
    "RemovedFile",
    "check_app_transactions",
    "check_schema",
    "commit_files",
    "create_table",
    "ensure_table",
    "load_table",
    "merge_schema",
    "open_table",
    "read_app_transactions",
]

Mode = Literal["append", "overwrite"]


@dataclass(frozen=True)
class RemovedFile:
    """A file of the snapshot that an overwrite by predicate removes (``add.path`` form)."""

    path: str
    size: int | None
    partition_values: dict[str, str | None]


@dataclass(frozen=True)
class CommitResult:
    """The outcome of one write.

    ``version`` is the table version this write created, or the current version when the write
    was a no-op (``committed`` False: every app transaction was already there).
    """

    table_path: str
    version: int
    committed: bool
    mode: str
    num_files: int
    num_rows: int
    num_bytes: int
    num_removed: int = 0
    attempts: int = 1
    app_transactions: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CommitResult:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def load_table(
    path: str | Path | LakeLocation, *, settings: StorageSettings | None = None
) -> DeltaTable | None:
    """The table at ``path`` (a local path or an object-store URI) at its latest version, or
    None when there is no Delta table; ``DeltaSinkError`` when the store cannot be read."""
    log = DeltaLog(table_location(path), settings=settings)
    try:
        return log.table()
    except DeltaError as exc:  # the store unreachable, refusing, or the log unreadable
        raise DeltaSinkError(
            f"cannot read the Delta table: {first_error_line(exc)}", path=log.uri
        ) from exc


def open_table(
    path: str | Path | LakeLocation, *, settings: StorageSettings | None = None
) -> DeltaTable:
    """The table at ``path`` at its latest version, which must exist (:func:`load_table` with
    the store's settings); ``DeltaSinkError`` when it does not or the store cannot be read."""
    dt = load_table(path, settings=settings)
    if dt is None:
        raise DeltaSinkError("no Delta table there", path=table_location(path).uri)
    return dt


def create_table(
    path: str | Path | LakeLocation,
    schema: pa.Schema,
    partition_by: Sequence[str] = (),
    *,
    adds: Sequence[AddAction] = (),
    description: str | None = None,
    configuration: Mapping[str, str] | None = None,
    commit_properties: CommitProperties | None = None,
    settings: StorageSettings | None = None,
) -> None:
    """Create the Delta table at ``path`` (version 0), with ``adds`` as its first files: the one
    place loglake creates a table. Raises ``DeltaError`` when a table is already there (a racing
    creator won: callers read the winner's table). ``configuration``: Delta table properties
    (e.g. ``delta.enableChangeDataFeed``); ``description``: the table's description (compaction
    keeps its settings there, delta-rs refusing properties it does not know)."""
    uri, options = delta_target(table_location(path), settings=settings)
    create_table_with_add_actions(
        uri,
        DeltaSchema.from_arrow(schema),
        list(adds),
        mode="error",
        partition_by=list(partition_by) or None,
        description=description,
        configuration=dict(configuration) if configuration else None,
        storage_options=options or None,
        commit_properties=commit_properties,
    )


def merge_schema(
    path: str | Path | LakeLocation,
    schema: pa.Schema,
    *,
    settings: StorageSettings | None = None,
) -> int:
    """Give the table at ``path`` the columns and nested struct fields of ``schema`` it lacks
    (types of existing columns stay): one commit without data, delta-rs's merge-schema append
    of zero rows, which evolves nested structs too (``alter.add_columns`` adds top-level
    columns only). Returns the table's new version."""
    uri, options = delta_target(table_location(path), settings=settings)
    write_deltalake(
        uri, schema.empty_table(), mode="append", schema_mode="merge", storage_options=options
    )
    dt = load_table(path, settings=settings)
    return dt.version() if dt is not None else -1


def ensure_table(
    path: str | Path | LakeLocation,
    schema: pa.Schema,
    partition_by: Sequence[str],
    *,
    settings: StorageSettings | None = None,
) -> bool:
    """Create an empty Delta table at ``path`` unless one is there; True when created.

    Every loglake table exists from its job's first run on, empty if nothing went there, so
    that queries and checks of it never fail on a missing table. A table already there must
    match ``schema`` and ``partition_by`` (``SchemaMismatchError`` otherwise). Two runs racing
    to create it: the loser finds the winner's table.
    """
    loc = table_location(path)
    dt = load_table(loc, settings=settings)
    if dt is None:
        try:
            create_table(loc, schema, partition_by, settings=settings)
            return True
        except DeltaError:
            dt = load_table(loc, settings=settings)
            if dt is None:
                raise
    check_schema(dt, schema, partition_by)
    return False


def check_schema(dt: DeltaTable, schema: pa.Schema, partition_by: Sequence[str]) -> None:
    """Raise ``SchemaMismatchError`` unless ``schema``/``partition_by`` match the table's."""
    table_fields = {f.name: f.type for f in dt.schema().fields}
    data_fields = {f.name: f.type for f in DeltaSchema.from_arrow(schema).fields}
    if list(table_fields) != list(data_fields) or any(
        str(table_fields[n]) != str(data_fields[n]) for n in table_fields
    ):
        raise SchemaMismatchError(
            f"schema mismatch: table has {_describe(table_fields)}, "
            f"data has {_describe(data_fields)}",
            path=dt.table_uri,
        )
    table_parts = list(dt.metadata().partition_columns)
    if list(partition_by) != table_parts:
        raise SchemaMismatchError(
            f"partition columns mismatch: table has {table_parts}, write has {list(partition_by)}",
            path=dt.table_uri,
        )


def _describe(fields: Mapping[str, Any]) -> str:
    return "[" + ", ".join(f"{n}: {t}" for n, t in fields.items()) + "]"


def check_app_transactions(
    dt: DeltaTable | None,
    requested: Mapping[str, int],
    expected: Mapping[str, int | None] | None = None,
    *,
    rewind: Collection[str] = (),
) -> bool:
    """Decide an app-transaction write against snapshot ``dt``: True = commit, False = no-op.

    Raises ``StaleTransactionError`` when a version would go backwards, or when ``expected``
    is given and an app's current version is neither the expected one nor the requested one
    (some other run moved it), or is the requested one for only some apps. Apps in ``rewind``
    may go backwards (a rewind of the lake; ``expected`` must then be given and still hold),
    and a write rewinding any app is never a no-op.
    """
    if not requested:
        return True
    current = {app: (dt.transaction_version(app) if dt is not None else None) for app in requested}
    where = dt.table_uri if dt is not None else None
    if rewind and expected is None:
        raise StaleTransactionError("a rewind needs the expected versions", path=where)
    if not rewind and all(current[a] == v for a, v in requested.items()):
        return False
    for app, version in requested.items():
        cur = current[app]
        if cur is not None and version < cur and app not in rewind:
            raise StaleTransactionError(
                f"app transaction {app!r} would go backwards: table has version {cur}, "
                f"this write carries {version} (a stale re-run?)",
                path=where,
            )
    if expected is not None:
        for app, version in requested.items():
            exp = expected.get(app)
            cur = current[app]
            if cur != exp:
                raise StaleTransactionError(
                    f"app transaction {app!r} moved under this write: expected version "
                    f"{exp}, table has {cur}, this write carries {version}; re-run",
                    path=where,
                )
    return True


def commit_files(
    table_path: str | Path | LakeLocation,
    files: Sequence[WrittenFile],
    *,
    schema: pa.Schema,
    partition_by: Sequence[str] = (),
    mode: Mode = "append",
    predicate: str | None = None,
    removes: Sequence[RemovedFile] | None = None,
    read_version: int | None = None,
    app_transactions: Mapping[str, int] | None = None,
    expected_versions: Mapping[str, int | None] | None = None,
    max_attempts: int = 20,
    before_attempt: Callable[[int], None] | None = None,
    commit_info: Mapping[str, str] | None = None,
    rewind_apps: Collection[str] = (),
    settings: StorageSettings | None = None,
) -> CommitResult:
    """Commit ``files`` to the table at ``table_path`` in one transaction (see module docstring).

    ``mode="overwrite"`` without ``predicate`` removes every file of the snapshot it commits
    against. With ``predicate`` (replace where), ``removes`` are the files to remove, chosen
    from snapshot ``read_version``; the commit fails if the table moved since. The table is
    created when absent. ``before_attempt(n)`` is called before attempt ``n`` (tests use it to
    inject a concurrent commit). ``commit_info``: extra ``commitInfo`` fields (strings) written
    in the same commit; ``rewind_apps``: app ids whose version may go down (see
    :func:`check_app_transactions`). ``settings``: how to reach an object store.
    """
    loc = table_location(table_path)
    resolved = settings if settings is not None else StorageSettings.default()
    root, _options = delta_target(loc, settings=resolved)
    apps = dict(app_transactions or {})
    txns = [Transaction(app, int(v)) for app, v in apps.items()]
    num_rows = sum(f.num_rows for f in files)
    num_bytes = sum(f.size for f in files)
    by_predicate = mode == "overwrite" and predicate is not None
    attempt = 0
    while True:
        attempt += 1
        if before_attempt is not None:
            before_attempt(attempt)
        dt = load_table(loc, settings=resolved)
        if dt is not None:
            check_schema(dt, schema, partition_by)
        if not check_app_transactions(dt, apps, expected_versions, rewind=rewind_apps):
            version = dt.version() if dt is not None else -1
            return CommitResult(root, version, False, mode, 0, 0, 0, 0, attempt, apps)
        if by_predicate and (dt.version() if dt is not None else None) != read_version:
            raise ConcurrentWriteError(
                f"overwrite where {predicate!r} chose its files at version {read_version}, "
                f"the table is now at {None if dt is None else dt.version()}; re-run the write",
                path=root,
            )
        adds = [
            AddAction(f.path, f.size, f.partition_values, f.modification_time, True, f.stats)
            for f in files
        ]
        props = CommitProperties(
            app_transactions=txns or None,
            max_commit_retries=0,
            custom_metadata={**_commit_info(mode, predicate), **(commit_info or {})},
        )
        try:
            if dt is None:
                create_table(
                    loc, schema, partition_by, adds=adds, commit_properties=props, settings=resolved
                )
                created = load_table(loc, settings=resolved)
                version = created.version() if created is not None else 0
                return CommitResult(
                    root, version, True, mode, len(files), num_rows, num_bytes, 0, attempt, apps
                )
            read = dt.version()
            actions: list[AddAction | RemoveAction] = list(adds)
            write_mode = mode
            num_removed = 0
            if by_predicate:
                now = int(time.time() * 1000)
                removals: list[AddAction | RemoveAction] = [
                    RemoveAction(r.path, True, now, r.size, r.partition_values)
                    for r in removes or ()
                ]
                actions = removals + actions
                num_removed = len(removes or ())
                write_mode = "append"  # delta-rs takes explicit removes only in append mode
            elif mode == "overwrite":
                num_removed = len(dt.file_uris())
            dt.create_write_transaction(
                actions,
                write_mode,
                schema,
                partition_by=list(partition_by) or None,
                commit_properties=props,
            )
        except (CommitFailedError, DeltaError) as exc:
            now_dt = load_table(loc, settings=resolved)
            moved = now_dt is not None and (dt is None or now_dt.version() > dt.version())
            if not moved:
                raise DeltaSinkError(f"commit failed: {exc}", path=root) from exc
            if by_predicate:
                raise ConcurrentWriteError(
                    f"another writer committed version {now_dt.version() if now_dt else '?'} "
                    f"while overwriting where {predicate!r}; re-run the write",
                    path=root,
                ) from exc
            if attempt >= max_attempts:
                raise ConcurrentWriteError(
                    f"gave up after {attempt} attempts: other writers keep committing", path=root
                ) from exc
            time.sleep(min(0.5, 0.01 * 2**attempt) * random.random())
            continue
        return CommitResult(
            root, read + 1, True, mode, len(files), num_rows, num_bytes, num_removed, attempt, apps
        )


def _commit_info(mode: str, predicate: str | None) -> dict[str, Any]:
    info: dict[str, Any] = {}
    if mode == "overwrite":
        info["isBlindAppend"] = False
        params: dict[str, Any] = {"mode": "Overwrite"}
        if predicate is not None:
            params["predicate"] = predicate
        info["operationParameters"] = params
    return info


def read_app_transactions(
    path: str | Path | LakeLocation, *, settings: StorageSettings | None = None
) -> dict[str, int]:
    """Every app id's latest transaction version in the table at ``path`` (empty: no table);
    see :meth:`pipelines.delta.log.DeltaLog.app_transactions`."""
    return DeltaLog(table_location(path), settings=settings).app_transactions()
