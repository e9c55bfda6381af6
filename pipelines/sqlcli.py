"""``loglake sql``: SQL over the lake's Delta tables with delta-rs's DataFusion, no Spark.

Every Delta table under ``--lake`` is registered by name (:mod:`pipelines.catalog`):
``records``, ``quarantine``, ``offset_lookup``, ``time_lookup`` and any other, e.g.
``<lake>/topics/orders`` as ``topics_orders``. With a query it prints the result and exits;
without one it reads statements from stdin (a prompt with line editing when stdin is a
terminal): SQL ends with ``;``, and meta commands start with a dot (``.help``).

Output formats (``--format``): ``table`` (aligned, for people: binary shown as UTF-8 text when
it is valid printable UTF-8, else as ``0x`` hex, cut to ``--max-width``; NULL as ``NULL``;
timestamps in UTC), ``csv`` (header row; binary as base64, timestamps ISO-8601, nested values
as JSON) and ``json`` (one JSON object per row, same conventions as CSV).

Time travel, per table (DataFusion has no ``VERSION AS OF`` syntax, so a table is pinned
before the query and keeps its plain name in the SQL): ``--as-of-version records=3`` reads
``records`` at version 3, ``--as-of-timestamp records=2026-11-27T14:00:00Z`` at the last
version committed at or before that instant (ISO-8601; no zone means UTC; before the first
commit is an error). Both repeat, one table each; the other tables stay at their latest. The
names leave ``--version`` to ``loglake --version``. In the prompt, ``.version records 3`` or
``.version records 2026-11-27T14:00:00Z`` does the same (``.version records``: back to latest).

History: ``--history TABLE`` (or ``.history TABLE`` in the prompt) lists the versions still in
the table's log, newest first: version, timestamp, operation, its parameters and metrics (JSON),
in the chosen ``--format``.

The lake and its store: ``--lake`` (a directory or ``s3://bucket/prefix``), else ``[paths]
lake`` of ``--config`` (a pipeline TOML, ``conf/pipeline.toml``). An object store is reached
with the standard AWS environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...), overridden
by the ``[storage]`` keys of ``--config``, as every job reaches it
(:func:`pipelines.config.storage_settings`); the file is checked whole, as the jobs check it.

Exit codes: 0 success, 1 a query failed (bad SQL, unknown table or column; the message says
which), 2 bad usage (no such lake directory, no lake given, a bad ``--config``, ``--as-of-*``
or ``--history``).

This module imports only the standard library at import time (``loglake --help`` stays fast
and the broker's CLI never loads Arrow); the work is in :func:`run`.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import QueryBuilder

    from logstore.objectstore import StorageSettings
    from pipelines.catalog import LakeTable, Pin

__all__ = ["add_arguments", "format_value", "run"]

FORMATS = ("table", "csv", "json")
_HELP = """\
meta commands:
  .tables              list the tables
  .schema [TABLE]      columns and types of TABLE (or of every table)
  .format table|csv|json
  .version TABLE [N|TIMESTAMP]
                       pin TABLE to version N, or as of an ISO-8601 timestamp
                       (no N: back to latest)
  .history TABLE       TABLE's versions: version, timestamp, operation, parameters
  .help                this text
  .quit                leave (so does end of input)
SQL statements end with ';' and may span lines."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "SQL over the lake's Delta tables (DataFusion through delta-rs, no Spark). "
        "Without QUERY: an interactive prompt reading statements from stdin."
    )
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (
        "tables: every Delta table under --lake, by its path below the lake ('/' -> '_'):\n"
        "  records, quarantine, offset_lookup, time_lookup, topics_<name>, ...\n"
        "  offset_lookup/time_lookup show max_timestamp as a UTC timestamp and the raw\n"
        "  milliseconds as max_timestamp_ms.\n\n"
        + _HELP
        + "\n\ntime travel: --as-of-version TABLE=N, --as-of-timestamp TABLE=TIMESTAMP (ISO-8601,"
        "\n  UTC unless a zone is given: the last version committed at or before it).\n"
        "\nexit codes: 0 success, 1 a query failed, 2 bad usage (lake, --config, --as-of-*,"
        "\n  --history)."
    )
    parser.add_argument(
        "query", nargs="?", help="one SQL statement (omit for the prompt; not with --history)"
    )
    parser.add_argument(
        "--lake",
        help="the lake: a directory, or s3://bucket/prefix (default: [paths] lake of --config)",
    )
    parser.add_argument(
        "--config",
        metavar="TOML",
        help="a pipeline TOML (conf/pipeline.toml): its [storage] keys over the AWS_* "
        "environment reach an object store, its [paths] lake is the lake unless --lake",
    )
    parser.add_argument(
        "--format", choices=FORMATS, default="table", help="output format (default: table)"
    )
    parser.add_argument(
        "--as-of-version",
        action="append",
        default=[],
        metavar="TABLE=N",
        help="read TABLE at version N (time travel); repeatable",
    )
    parser.add_argument(
        "--as-of-timestamp",
        action="append",
        default=[],
        metavar="TABLE=TIMESTAMP",
        help="read TABLE as of an ISO-8601 instant (the last version committed at or before "
        "it); repeatable",
    )
    parser.add_argument(
        "--history", metavar="TABLE", help="list TABLE's versions (its Delta history) and exit"
    )
    parser.add_argument(
        "--max-width",
        type=int,
        default=40,
        metavar="N",
        help="table format: cut longer cells to N characters (default 40; 0: no limit)",
    )


def run(args: argparse.Namespace) -> int:
    from logstore.errors import InvalidConfigError, LoglakeError  # noqa: PLC0415
    from pipelines.catalog import find_tables, parse_timestamps, parse_versions  # noqa: PLC0415

    try:
        lake, settings = _lake_and_settings(args.lake, args.config)
        tables = find_tables(lake, settings=settings)
        versions: dict[str, Pin] = {**parse_versions(args.as_of_version, tables)}
        for name, when in parse_timestamps(args.as_of_timestamp, tables).items():
            if name in versions:
                raise InvalidConfigError(f"table {name!r} is pinned twice (--as-of-version and "
                                   "--as-of-timestamp): choose one")  # fmt: skip
            versions[name] = when
        session = _Session(
            tables, versions, args.format, args.max_width, sys.stdout, settings=settings
        )
        if args.history is not None:
            if args.query is not None:
                raise InvalidConfigError("--history takes no QUERY (it lists the table's versions)")
            return 0 if session.history(args.history) else 2
        session.builder()  # opens every table now: a missing version is a usage error
    except LoglakeError as exc:
        print(f"loglake sql: error: {exc}", file=sys.stderr)
        return 2
    if args.query is not None:
        return 0 if session.execute(args.query) else 1
    return session.repl(sys.stdin)


def _lake_and_settings(lake: str | None, config: str | None) -> tuple[str, StorageSettings | None]:
    """The lake (``--lake``, else ``[paths] lake`` of ``config``) and the object-store settings
    (``[storage]`` of ``config`` over the environment; None without ``config``: the
    environment's, read when a table opens)."""
    from logstore.errors import InvalidConfigError  # noqa: PLC0415
    from pipelines.config import read_pipeline_toml, storage_settings  # noqa: PLC0415

    settings = None
    if config is not None:
        data = read_pipeline_toml(config)
        settings = storage_settings(data, config)
        lake = lake or data.get("paths", {}).get("lake")
    if not lake:
        where = f"{config} has no [paths] lake" if config else "no --config"
        raise InvalidConfigError(f"no lake: give --lake DIR|s3://..., or --config ({where})")
    return lake, settings


class _Session:
    """Tables, pinned versions and output settings of one ``loglake sql`` run."""

    def __init__(
        self,
        tables: list[LakeTable],
        versions: dict[str, Pin],
        fmt: str,
        max_width: int,
        out: TextIO,
        *,
        settings: StorageSettings | None = None,
    ) -> None:
        self.settings = settings
        self.tables = tables
        self.versions = versions
        self.fmt = fmt
        self.max_width = max_width
        self.out = out
        self._qb: QueryBuilder | None = None

    def builder(self) -> QueryBuilder:
        from pipelines.catalog import lake_query_builder  # noqa: PLC0415

        if self._qb is None:
            self._qb = lake_query_builder(self.tables, self.versions, settings=self.settings)
        return self._qb

    def execute(self, sql: str) -> bool:
        """Run one statement and print its result; False (message on stderr) on failure."""
        from logstore.errors import LoglakeError  # noqa: PLC0415
        from pipelines.catalog import run_query  # noqa: PLC0415

        try:
            reader = run_query(self.builder(), sql)
            _print_result(reader, self.fmt, self.max_width, self.out)
        except LoglakeError as exc:
            print(f"loglake sql: error: {exc}", file=sys.stderr)
            return False
        except Exception as exc:  # errors raised while the engine streams the result
            print(f"loglake sql: error: {str(exc).strip()}", file=sys.stderr)
            return False
        return True

    def repl(self, stdin: TextIO) -> int:
        interactive = stdin.isatty()
        if interactive:
            import readline  # noqa: F401, PLC0415 (line editing and history for input())

            print(
                f"loglake sql: {len(self.tables)} table{'s' if len(self.tables) != 1 else ''}; "
                ".help for commands, .quit to leave",
                file=sys.stderr,
            )
        failed = False
        pending: list[str] = []
        while True:
            prompt = ("...> " if pending else "sql> ") if interactive else ""
            try:
                line = input(prompt) if interactive else stdin.readline()
            except EOFError:
                break
            except KeyboardInterrupt:
                pending = []
                print(file=sys.stderr)
                continue
            if not interactive:
                if line == "":
                    break
                line = line.rstrip("\n")
            if not pending and line.strip().startswith("."):
                result = self.meta(line.strip())
                if result is None:
                    break
                failed |= not result
                continue
            pending.append(line)
            text = "\n".join(pending).strip()
            if text.endswith(";"):
                pending = []
                if text.rstrip(";").strip():
                    failed |= not self.execute(text.rstrip(";"))
        if pending and "\n".join(pending).strip():
            failed |= not self.execute("\n".join(pending))
        return 1 if failed else 0

    def meta(self, line: str) -> bool | None:
        """Run a meta command; None means quit, False a failed command."""
        words = line.split()
        cmd, rest = words[0].lower(), words[1:]
        if cmd in (".quit", ".exit", ".q"):
            return None
        if cmd == ".help":
            print(_HELP, file=self.out)
            return True
        if cmd == ".tables":
            for t in self.tables:
                pin = _pin_text(self.versions[t.name]) if t.name in self.versions else ""
                print(f"{t.name}{pin}", file=self.out)
            return True
        if cmd == ".history":
            if len(rest) != 1:
                print("loglake sql: error: .history TABLE", file=sys.stderr)
                return False
            return self.history(rest[0])
        if cmd == ".schema":
            return self._schema(rest)
        if cmd == ".format":
            if len(rest) != 1 or rest[0] not in FORMATS:
                print(f"loglake sql: error: .format takes one of {FORMATS}", file=sys.stderr)
                return False
            self.fmt = rest[0]
            return True
        if cmd == ".version":
            return self._version(rest)
        print(f"loglake sql: error: unknown command {cmd!r} (.help lists them)", file=sys.stderr)
        return False

    def _schema(self, rest: list[str]) -> bool:
        from logstore.errors import LoglakeError  # noqa: PLC0415
        from pipelines.catalog import run_query  # noqa: PLC0415

        names = [t.name for t in self.tables]
        wanted = [r.lower() for r in rest] or names
        unknown = [w for w in wanted if w not in names]
        if unknown:
            print(f"loglake sql: error: no table {unknown[0]!r} (.tables lists them)",
                  file=sys.stderr)  # fmt: skip
            return False
        try:
            for name in wanted:
                schema = run_query(self.builder(), f'SELECT * FROM "{name}" LIMIT 0').schema
                print(f"{name}:", file=self.out)
                for field in schema:
                    print(f"  {field.name}  {_type_name(field.type)}", file=self.out)
        except LoglakeError as exc:
            print(f"loglake sql: error: {exc}", file=sys.stderr)
            return False
        return True

    def history(self, name: str) -> bool:
        """Print table ``name``'s history; False (message on stderr) when there is no such
        table or it cannot be read."""
        import pyarrow as pa  # noqa: PLC0415

        from logstore.errors import LoglakeError  # noqa: PLC0415
        from pipelines.catalog import table_history  # noqa: PLC0415

        found = [t for t in self.tables if t.name == name.lower()]
        try:
            if not found:
                names = ", ".join(t.name for t in self.tables) or "none"
                raise LoglakeError(f"no table {name!r} in the lake (tables: {names})")
            history = table_history(found[0], settings=self.settings)
        except LoglakeError as exc:
            print(f"loglake sql: error: {exc}", file=sys.stderr)
            return False
        reader = pa.RecordBatchReader.from_batches(history.schema, history.to_batches())
        _print_result(reader, self.fmt, self.max_width, self.out)
        return True

    def _version(self, rest: list[str]) -> bool:
        from logstore.errors import LoglakeError  # noqa: PLC0415
        from pipelines.catalog import parse_timestamps, parse_versions  # noqa: PLC0415

        if len(rest) not in (1, 2):
            print("loglake sql: error: .version TABLE [N|TIMESTAMP]", file=sys.stderr)
            return False
        try:
            if len(rest) == 2:
                spec = [f"{rest[0]}={rest[1]}"]
                pins: dict[str, Pin] = {
                    **(parse_versions(spec, self.tables, flag=".version")
                       if rest[1].isdigit()
                       else parse_timestamps(spec, self.tables, flag=".version"))
                }  # fmt: skip
                self.versions.update(pins)
            else:
                self.versions.pop(rest[0].lower(), None)
            self._qb = None
            self.builder()
        except LoglakeError as exc:
            self.versions.pop(rest[0].lower(), None)
            self._qb = None
            print(f"loglake sql: error: {exc}", file=sys.stderr)
            return False
        return True


def _pin_text(pin: Pin) -> str:
    if isinstance(pin, int):
        return f"  (version {pin})"
    return f"  (as of {pin.isoformat()})"


def _type_name(t: pa.DataType) -> str:
    import pyarrow as pa  # noqa: PLC0415

    if pa.types.is_string_view(t):
        return "string"
    if pa.types.is_binary_view(t):
        return "binary"
    return str(t)


# ---- output -------------------------------------------------------------------------------


def format_value(value: Any, *, max_width: int = 40) -> str:
    """A cell of the ``table`` format (see the module docstring)."""
    import datetime as dt  # noqa: PLC0415

    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        text = _readable_bytes(value)
    elif isinstance(value, dt.datetime):
        text = _timestamp(value)
    elif isinstance(value, (list, dict)):
        text = _nested(value)
    elif isinstance(value, bool):
        text = "true" if value else "false"
    else:
        text = str(value)
    if max_width > 0 and len(text) > max_width:
        text = text[: max(1, max_width - 1)] + "…"
    return text


def _readable_bytes(value: bytes) -> str:
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + value.hex()
    if text.isprintable():
        return text
    return "0x" + value.hex()


def _timestamp(value: Any) -> str:
    text: str = value.strftime("%Y-%m-%d %H:%M:%S")
    if value.microsecond:
        us = f"{value.microsecond:06d}"
        text += "." + (us[:3] if us.endswith("000") else us)
    if value.tzinfo is not None:
        text += "Z" if value.utcoffset().total_seconds() == 0 else value.strftime("%z")
    return text


def _nested(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_nested(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_nested(v)}" for k, v in value.items()) + "}"
    return format_value(value, max_width=0)


def _jsonable(value: Any) -> Any:
    import base64  # noqa: PLC0415
    import datetime as dt  # noqa: PLC0415
    import decimal  # noqa: PLC0415

    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dt.datetime):
        text = value.isoformat()
        return text.removesuffix("+00:00") + "Z" if value.tzinfo is not None else text
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


def _print_result(reader: pa.RecordBatchReader, fmt: str, max_width: int, out: TextIO) -> None:
    import csv  # noqa: PLC0415
    import json  # noqa: PLC0415

    import pyarrow as pa  # noqa: PLC0415

    names = reader.schema.names
    if fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(names)
        for batch in reader:
            for row in zip(*(c.to_pylist() for c in batch.columns), strict=True):
                writer.writerow(["" if v is None else _csv_cell(v) for v in row])
        return
    if fmt == "json":
        for batch in reader:
            for row in zip(*(c.to_pylist() for c in batch.columns), strict=True):
                out.write(json.dumps(dict(zip(names, map(_jsonable, row), strict=True))))
                out.write("\n")
        return
    schema = reader.schema
    right = [pa.types.is_integer(f.type) or pa.types.is_floating(f.type)
             or pa.types.is_decimal(f.type) for f in schema]  # fmt: skip
    cells: list[list[str]] = []
    for batch in reader:
        cols = [
            [format_value(v, max_width=max_width) for v in c.to_pylist()] for c in batch.columns
        ]
        cells.extend(map(list, zip(*cols, strict=True)))
    widths = [len(n) for n in names]
    for cells_row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, cells_row, strict=True)]

    def line(row: list[str]) -> str:
        parts = [
            c.rjust(w) if r else c.ljust(w) for c, w, r in zip(row, widths, right, strict=True)
        ]
        return "| " + " | ".join(parts) + " |"

    rule = "+-" + "-+-".join("-" * w for w in widths) + "-+"
    print(rule, file=out)
    print(line(list(names)), file=out)
    print(rule, file=out)
    for cells_row in cells:
        print(line(cells_row), file=out)
    print(rule, file=out)
    print(f"({len(cells)} row{'s' if len(cells) != 1 else ''})", file=out)


def _csv_cell(value: Any) -> str:
    import json  # noqa: PLC0415

    v = _jsonable(value)
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)
