"""The pipeline configuration's schema: every section and key ``conf/pipeline.toml`` may hold,
with the type, range and choices of its value.

Every job reads the same file (``--config``), each its own sections, so a typo would
otherwise be ignored by all of them and the job would run on a default the user did not
choose. :func:`check_config` refuses any section or key not listed here, naming the nearest
valid one, the way the broker refuses an unknown ``broker.properties`` key, and every value
that is not what its :class:`Key` says, naming the key, the value and what was expected.
Nothing is coerced: TOML has types, and ``fail_on_corrupt = "false"`` (a string, truthy in
Python) or ``topics = "orders"`` (a string, six one-letter topics when iterated) are what a
user did not mean. The same :class:`Key` checks a value given on the command line
(:func:`option_type`).

A section whose keys are free-form (``[spark.conf]``: Spark settings; ``[compact.strategy]``:
topic = strategy) is a :class:`FreeForm`: its keys and values are checked by rule.

The check runs before a job imports Spark, Delta or the decoder (``pipelines.jobrun``), so a
bad file costs a fraction of a second and exits 2.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import re
import sys
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from logstore.errors import InvalidConfigError, InvalidTopicError, LoglakeError
from logstore.objectstore import LakeLocation, StorageSettings
from logstore.storage.files import parse_partition_dir, validate_topic
from logstore.tools.client_config import (
    KAFKA_CLIENT_KEYS,
    ClientConfig,
    client_config,
    read_client_properties,
)
from pipelines.exit_codes import EXIT_USAGE, epilog

__all__ = [
    "DECODE_ON_ERROR",
    "EXIT_MISSING_TOPICS",
    "ISOLATION_LEVELS",
    "ON_DIVERGENCE",
    "PARQUET_CODECS",
    "SECTIONS",
    "FreeForm",
    "JobSettings",
    "Key",
    "MissingTopicsError",
    "check_config",
    "check_log_dirs",
    "check_topics",
    "job_parser",
    "job_settings",
    "kafka_client_config",
    "log_dir_topics",
    "option_type",
    "read_pipeline_toml",
    "storage_settings",
]

# Exit code of every job that takes topic names when one of them is in none of the log dirs
# (argparse's own code for bad arguments: the names are arguments, from the file or the
# command line). --allow-missing-topics makes it a warning.
EXIT_MISSING_TOPICS = EXIT_USAGE
# [ingest] on_divergence / --on-divergence (pipelines.divergence); here so that the job's
# argument parser needs no Delta or Arrow import.
ON_DIVERGENCE = ("fail", "rewind")
# [ingest] isolation: Kafka's isolation.level values, as a consumer's.
ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
# Parquet codecs of the tables' data files (the jobs' `compression` keys).
PARQUET_CODECS = ("snappy", "zstd", "lz4", "gzip", "none")

Kind = Literal["string", "integer", "number", "boolean", "list", "table", "scalar"]

_KIND_TEXT = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean (true or false, unquoted)",
    "list": "a list",
    "table": "a table",
    "scalar": "a string, a number or a boolean",
}


def _is_kind(value: Any, kind: Kind) -> bool:
    # bool is an int in Python; TOML keeps them apart and so does this check.
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "list":
        return isinstance(value, list)
    if kind == "table":
        return isinstance(value, dict)
    return isinstance(value, str | int | float | bool)


def _topic_rule(value: str) -> str | None:
    try:
        validate_topic(value)
    except InvalidTopicError as exc:
        return f"a Kafka topic name ({exc.message})"
    return None


def _strategy_rule(value: str) -> str | None:
    # pipelines.compaction.model.parse_strategy's grammar, checked without importing it.
    if value in ("offset", "timestamp") or (value.startswith("header:") and len(value) > 7):
        return None
    return "a compaction strategy: offset, timestamp or header:<name>"


_AGE = re.compile(r"(forever|topic|0*[1-9][0-9]*[dhm])")


def _records_rule(value: str) -> str | None:
    # pipelines.retention.job.parse_records_retention's grammar.
    if _AGE.fullmatch(value.strip()):
        return None
    return "forever, topic or an age like 30d, 12h, 90m"


_HOST_PORT = re.compile(r"[^\s,]+:([0-9]{1,5})")


def _servers_rule(value: str) -> str | None:
    if value == "" or all(
        (m := _HOST_PORT.fullmatch(part.strip())) and 0 < int(m.group(1)) < 65536
        for part in value.split(",")
    ):
        return None
    return 'host:port[,host:port...] (or "" for none)'


def _not_empty(value: str) -> str | None:
    return None if value.strip() else "a non-empty string"


def _tier_rule(value: str) -> str | None:
    """``[paths] remote_log_storage``: "" (no tier) or where a cluster's tier is."""
    if value == "":
        return None
    try:
        LakeLocation.parse(value)
    except InvalidConfigError as exc:
        return f's3://bucket/prefix or a directory (or "" for none): {exc.message}'
    return None


# [decode] on_error: a record that does not decode goes to <lake>/dead_letters, or fails the run.
DECODE_ON_ERROR = ("dead_letter", "fail")


def _url_rule(value: str) -> str | None:
    if value == "" or re.fullmatch(r"https?://[^\s/]+(/\S*)?", value):
        return None
    return 'an http:// or https:// URL (or "" for none)'


def _cdc_order_rule(value: str) -> str | None:
    # "offset", or a dotted field path of the Debezium envelope (e.g. source.lsn)
    if re.fullmatch(r"offset|[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", value):
        return None
    return "offset, or a field path of the envelope such as source.lsn"


@dataclass(frozen=True)
class Key:
    """What one key's value must be.

    ``kind``: its TOML type (``number`` takes integers and floats, ``scalar`` any of string,
    number, boolean). ``item``: a list's element type, whose rules are ``choices`` and
    ``rule``. ``minimum``/``maximum``: inclusive bounds of a number. ``choices``: the strings
    allowed. ``rule``: any further check of a string, returning what was expected, or None
    when the value is fine."""

    kind: Kind
    item: Kind | None = None
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None
    rule: Callable[[str], str | None] | None = None

    def problem(self, value: Any) -> str | None:
        """What was expected when ``value`` does not fit, else None."""
        if not _is_kind(value, self.kind):
            return f"{_KIND_TEXT[self.kind]}, got {_type_name(value)}"
        if self.kind == "list":
            assert self.item is not None
            for element in value:
                if not _is_kind(element, self.item):
                    return f"a list of {_KIND_TEXT[self.item][2:]}s; {_toml(element)} is not one"
                found = self._scalar_problem(element)
                if found is not None:
                    return f"a list, each element {found}; {_toml(element)} is not"
            return None
        return self._scalar_problem(value)

    def _scalar_problem(self, value: Any) -> str | None:
        if isinstance(value, float) and not math.isfinite(value):
            return "a finite number"  # TOML allows inf and nan; no setting means them
        if self.choices is not None and value not in self.choices:
            return "one of " + ", ".join(self.choices)
        if (self.minimum is not None and value < self.minimum) or (
            self.maximum is not None and value > self.maximum
        ):
            return self.expected()
        if self.rule is not None and isinstance(value, str):
            return self.rule(value)
        return None

    def expected(self) -> str:
        """The value's description for ``--help`` and messages."""
        if self.choices is not None:
            return "one of " + ", ".join(self.choices)
        text = _KIND_TEXT[self.kind]
        if self.minimum is not None or self.maximum is not None:
            text += " " + _range_text(self.minimum, self.maximum)
        return text


def _toml(value: Any) -> str:
    """``value`` as TOML writes it (``true``, ``"text"``, ``["a", 1]``, ``inf``), for
    messages."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # inf, -inf, nan (JSON would say Infinity)
    return json.dumps(value, default=str)


def _type_name(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             list: "a list", dict: "a table"}  # fmt: skip
    return names.get(type(value), type(value).__name__)


def _range_text(low: float | None, high: float | None) -> str:
    def num(x: float) -> str:
        return str(int(x)) if float(x).is_integer() else str(x)

    if low is not None and high is not None:
        return f"in {num(low)}..{num(high)}"
    return f">= {num(low)}" if low is not None else f"<= {num(high)}"  # type: ignore[arg-type]


@dataclass(frozen=True)
class FreeForm:
    """A section whose keys are not fixed: ``key`` checks each key's name (None: any name),
    ``value`` each value."""

    value: Key
    key: Callable[[str], str | None] | None = None
    what: str = "key"


_KAFKA_FILE_KEY = "command_config"


def _kafka_key_rule(key: str) -> str | None:
    if key == _KAFKA_FILE_KEY or key in KAFKA_CLIENT_KEYS:
        return None
    near = difflib.get_close_matches(key, [_KAFKA_FILE_KEY, *sorted(KAFKA_CLIENT_KEYS)], n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return (
        f'{_KAFKA_FILE_KEY!r} or a Kafka client property, quoted ("security.protocol" ='
        f' "SASL_SSL"){hint}'
    )


_TOPICS = Key("list", item="string", rule=_topic_rule)
_CODEC = Key("string", choices=PARQUET_CODECS)
_ROWS = Key("integer", minimum=1)
_STRATEGY = Key("string", rule=_strategy_rule)

# section -> its keys (a FreeForm: keys checked by rule). Sub-tables are sections of their
# own, by dotted name ("spark.conf"). Every job reads its own sections; the file is checked
# whole, so a mistake in another job's section fails every job (one file, one truth).
SECTIONS: dict[str, dict[str, Key] | FreeForm] = {
    "paths": {
        "log_dirs": Key("list", item="string", rule=_not_empty),
        "lake": Key("string", rule=_not_empty),
        # the cluster's tiered storage (pipelines.sources.tier), read with bootstrap_servers
        "remote_log_storage": Key("string", rule=_tier_rule),
    },
    "spark": {
        "app_name": Key("string", rule=_not_empty),
        "master": Key("string", rule=_not_empty),
    },
    "spark.conf": FreeForm(Key("scalar"), what="Spark setting"),
    "ingest": {
        "topics": _TOPICS,
        "fail_on_corrupt": Key("boolean"),
        "max_partition_bytes": Key("integer", minimum=1),
        "compression": _CODEC,
        "max_rows_per_file": _ROWS,
        "progress_interval_s": Key("number", minimum=0),
        "on_divergence": Key("string", choices=ON_DIVERGENCE),
        "isolation": Key("string", choices=ISOLATION_LEVELS),
        "bootstrap_servers": Key("string", rule=_servers_rule),
        "lake_group": Key("string", rule=_not_empty),
    },
    "compact": {
        "topics": _TOPICS,
        "default_strategy": _STRATEGY,
        "buckets": Key("integer", minimum=1, maximum=65536),
        "compression": _CODEC,
        "max_rows_per_file": _ROWS,
        "default_deletion_vectors": Key("boolean"),
    },
    "compact.strategy": FreeForm(_STRATEGY, key=_topic_rule, what="topic"),
    # per-topic override of default_deletion_vectors (readers without the DV reader feature)
    "compact.deletion_vectors": FreeForm(Key("boolean"), key=_topic_rule, what="topic"),
    "retention": {
        "broker_config": Key("string", rule=_not_empty),
        "records": Key("string", rule=_records_rule),
        "vacuum_hours": Key("number", minimum=0),
        "zorder": Key("boolean"),
        "delete_records_chunk": Key("integer", minimum=1),
    },
    # [decode]: jobs/decode.py, typed tables (pipelines.typed.config)
    "decode": {
        "schema_registry_url": Key("string", rule=_url_rule),
        "topics": _TOPICS,
        "on_error": Key("string", choices=DECODE_ON_ERROR),
        "compression": _CODEC,
        "max_rows_per_file": _ROWS,
        "max_dead_letter_rate": Key("number", minimum=0, maximum=1),
    },
    "decode.subject": FreeForm(Key("string", rule=_not_empty), key=_topic_rule, what="topic"),
    "decode.cdc": FreeForm(Key("string", rule=_cdc_order_rule), key=_topic_rule, what="topic"),
    "quality": {
        "max_future_skew_s": Key("number", minimum=0),
        "max_past_skew_s": Key("number", minimum=0),
        "max_quarantined_batches": Key("integer", minimum=0),
        "docs": Key("boolean"),
        # [[quality.actions]]: users' GX Actions, each a table (class = "module.Class", its
        # fields); their shape is checked by pipelines.quality.config
        "actions": Key("list", item="table"),
    },
    # [kafka]: the jobs' connection to the broker (kafka_client_config below)
    "kafka": FreeForm(Key("scalar"), key=_kafka_key_rule, what="client property"),
    # [storage]: how to reach an s3:// lake beyond the AWS environment (storage_settings below)
    "storage": {
        "endpoint_url": Key("string", rule=_url_rule),
        "access_key_id": Key("string"),
        "secret_access_key": Key("string"),
        "session_token": Key("string"),
        "region": Key("string", rule=_not_empty),
        "allow_http": Key("boolean"),
        "connect_timeout_s": Key("number", minimum=0, maximum=300),
        "request_timeout_s": Key("number", minimum=0, maximum=3600),
        "max_attempts": Key("integer", minimum=1, maximum=20),
    },
    "storage.options": FreeForm(Key("scalar", rule=_not_empty), what="object_store option"),
}


# Keys that existed once: refused with what to do instead.
RETIRED: dict[tuple[str, str], str] = {
    ("ingest", "verify"): "[ingest] verify is no longer used: ingest decodes every batch it "
    "ingests and quarantines the ones it cannot decode; remove the key",
}


def _nearest(word: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, sorted(candidates), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def check_config(data: Mapping[str, Any], path: str) -> None:
    """Raise :class:`InvalidConfigError` for the first unknown section or key of ``data``, or
    value that its :class:`Key` refuses."""
    for section, table in data.items():
        if section not in SECTIONS:
            top = {s for s in SECTIONS if "." not in s}
            raise InvalidConfigError(
                f"unknown section [{section}]" + _nearest(section, top), path=path
            )
        _check_table(section, table, path)
    kafka_client_config(data, path)  # [kafka]'s values and files, checked as a whole


def _check_table(name: str, table: Any, path: str) -> None:
    if not isinstance(table, Mapping):
        raise InvalidConfigError(f"[{name}] must be a table, got {_toml(table)}", path=path)
    spec = SECTIONS[name]
    for key, value in table.items():
        if f"{name}.{key}" in SECTIONS:
            _check_table(f"{name}.{key}", value, path)
        elif isinstance(spec, FreeForm):
            bad_key = spec.key(key) if spec.key is not None else None
            if bad_key is not None:
                raise InvalidConfigError(f"[{name}] {key!r}: each key must be {bad_key}", path=path)
            _check_value(f"[{name}] {key!r}", value, spec.value, path)
        elif (name, key) in RETIRED:
            raise InvalidConfigError(RETIRED[(name, key)], path=path)
        elif key not in spec:
            raise InvalidConfigError(
                f"unknown key {key!r} in [{name}]" + _nearest(key, spec), path=path
            )
        else:
            _check_value(f"[{name}] {key}", value, spec[key], path)


def _check_value(where: str, value: Any, key: Key, path: str | None) -> None:
    problem = key.problem(value)
    if problem is not None:
        raise InvalidConfigError(f"{where} = {_toml(value)}: expected {problem}", path=path)


def option_type(section: str, key: str) -> Callable[[str], Any]:
    """An argparse ``type=`` for an option that overrides ``[section] key``: the string from
    the command line parsed as the key's kind and checked by the same :class:`Key`, so a
    value the file may not hold is refused on the command line too (exit 2, naming it)."""
    spec = SECTIONS[section]
    assert isinstance(spec, dict)
    rules = spec[key]

    def parse(text: str) -> Any:
        value: Any = text
        try:
            if rules.kind == "integer":
                value = int(text)
            elif rules.kind == "number":
                value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected {rules.expected()} (as [{section}] {key})"
            ) from None
        problem = rules.problem(value)
        if problem is not None:
            raise argparse.ArgumentTypeError(f"{text!r}: expected {problem} (as [{section}] {key})")
        return value

    parse.__name__ = f"[{section}] {key}"
    return parse


def read_pipeline_toml(path: str | Path) -> dict[str, Any]:
    """Parse a pipeline TOML file and :func:`check_config` it; errors
    (:class:`InvalidConfigError`) name the file."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidConfigError("config file not found", path=str(p)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidConfigError(f"config cannot be read: {exc}", path=str(p)) from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidConfigError(f"config is not valid TOML: {exc}", path=str(p)) from None
    check_config(data, str(p))
    return data


@dataclass(frozen=True)
class JobSettings:
    """What every job takes from ``[paths]`` and ``[spark]`` (after command-line overrides)."""

    log_dirs: tuple[str, ...]
    lake: str
    app_name: str
    master: str | None
    spark_conf: dict[str, str]


def job_settings(
    data: Mapping[str, Any],
    path: str | Path,
    job: str,
    *,
    log_dirs: Iterable[str] | None = None,
    lake: str | None = None,
    need_log_dirs: bool = True,
) -> JobSettings:
    """``[paths]`` and ``[spark]`` of a pipeline TOML for job ``job``; paths made absolute
    (relative to the current directory, as on a command line). The Spark application is
    named ``<[spark] app_name>-<job>`` (``loglake-ingest``, ``loglake-compact``, ...)."""
    paths = data.get("paths", {})
    spark = data.get("spark", {})
    dirs = list(log_dirs) if log_dirs else paths.get("log_dirs", [])
    lake_dir = lake or paths.get("lake")
    if not lake_dir or (need_log_dirs and not dirs):
        what = "log_dirs and lake" if need_log_dirs else "lake"
        flags = "--log-dirs/--lake" if need_log_dirs else "--lake"
        raise InvalidConfigError(f"[paths] {what} must be set (or {flags})", path=str(path))
    return JobSettings(
        log_dirs=tuple(str(Path(d).absolute()) for d in dirs),
        lake=LakeLocation.parse(lake_dir).uri,  # local: absolute; s3://... as given
        app_name=f"{spark.get('app_name', 'loglake')}-{job}",
        master=spark.get("master"),
        spark_conf={str(k): _spark_value(v) for k, v in spark.get("conf", {}).items()},
    )


def check_log_dirs(log_dirs: Iterable[str], *, from_command_line: bool, config: str | Path) -> None:
    """Every log dir a job is about to read must be a directory: else
    :class:`InvalidConfigError` (exit 2: a wrong path, which no retry fixes, unlike a log dir
    that goes away during a run), one line naming it and where it came from (``--log-dirs``
    when ``from_command_line``, else ``[paths] log_dirs`` of ``config``). Jobs call it right
    after loading their config; loading one does not look at the disk."""
    key = "--log-dirs" if from_command_line else "[paths] log_dirs"
    for d in log_dirs:
        if not os.path.isdir(d):
            problem = "is not a directory" if os.path.exists(d) else "does not exist"
            raise InvalidConfigError(f"log dir {problem}: {d} (from {key})", path=str(config))


def _spark_value(value: Any) -> str:
    # Spark reads booleans as "true"/"false"; str(True) would be "True".
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


class MissingTopicsError(LoglakeError):
    """Topics named in the configuration or on the command line are in none of the log dirs."""


def log_dir_topics(log_dirs: Iterable[str]) -> set[str]:
    """The topics with at least one partition directory (``<topic>-<n>``) in ``log_dirs``.

    Kafka's ``-delete``/``-future``/``-stray`` directories do not count. A log dir that does
    not exist is an error (:class:`LoglakeError`, "log dir does not exist").
    """
    found: set[str] = set()
    for d in log_dirs:
        if not os.path.isdir(d):
            raise LoglakeError("log dir does not exist", path=str(d))
        for entry in os.scandir(d):
            parsed = parse_partition_dir(entry.name)
            if parsed is not None and entry.is_dir():
                found.add(parsed[0])
    return found


def _stderr_warning(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def check_topics(
    named: Mapping[str, Iterable[str]],
    log_dirs: Iterable[str],
    *,
    allow_missing: bool = False,
    also_present: Iterable[str] = (),
    warn: Callable[[str], None] = _stderr_warning,
) -> list[str]:
    """Report the topics of ``named`` (``{where they were named: topics}``, e.g.
    ``{"[ingest] topics": [...], "--topic": [...]}``) that are in none of ``log_dirs``.

    Raises :class:`MissingTopicsError` listing them (the jobs exit
    :data:`EXIT_MISSING_TOPICS`), or with ``allow_missing`` passes each to ``warn`` (stderr by
    default). Topics of ``also_present`` count as present too (the compaction job: topics
    already in the lake's ``records``). Returns the missing topics, sorted. Nothing named:
    nothing to check, no error.
    """
    wanted = {source: sorted(set(topics)) for source, topics in named.items()}
    if not any(wanted.values()):
        return []
    dirs = list(log_dirs)
    present = log_dir_topics(dirs) | set(also_present)
    missing: dict[str, list[str]] = {}
    for source, topics in wanted.items():
        for topic in topics:
            if topic not in present:
                missing.setdefault(topic, []).append(source)
    if not missing:
        return []
    where = ", ".join(dirs)
    lines = [
        f"topic {topic!r} ({' and '.join(sources)}) is in none of the log dirs ({where})"
        for topic, sources in sorted(missing.items())
    ]
    if not allow_missing:
        raise MissingTopicsError(
            "; ".join(lines) + " (--allow-missing-topics: a warning instead of an error)"
        )
    for line in lines:
        warn(line)
    return sorted(missing)


def job_parser(
    prog: str,
    doc: str,
    *,
    log_dirs_help: str = "broker log dir (repeatable); overrides [paths]",
    spark: bool = True,
    topics: bool = False,
    exit_codes: Mapping[int, str] | None = None,
) -> argparse.ArgumentParser:
    """A job's argument parser with what every job takes: ``--config``, ``--log-dirs``,
    ``--lake``, ``--verbose`` for the jobs that run Spark, and ``--allow-missing-topics`` for
    the jobs that take topic names (``topics``: see :func:`check_topics`). The description is
    the second paragraph of the job's docstring, the epilog the rest, then the exit codes
    (:func:`pipelines.exit_codes.epilog`: 0-2 and those of ``exit_codes``, with the job's
    detail of each)."""
    parts = doc.split("\n\n")
    parser = argparse.ArgumentParser(
        prog=prog,
        description=parts[1] if len(parts) > 1 else parts[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join([*parts[2:], epilog(dict(exit_codes or {}))]),
    )
    parser.add_argument("--config", required=True, help="pipeline TOML, e.g. conf/pipeline.toml")
    parser.add_argument("--log-dirs", action="append", help=log_dirs_help)
    parser.add_argument("--lake", help="lake directory holding the tables; overrides [paths] lake")
    if spark:
        parser.add_argument(
            "--verbose", action="store_true", help="Spark's own INFO log lines on stderr too"
        )
    if topics:
        parser.add_argument(
            "--allow-missing-topics",
            action="store_true",
            help="a topic named in the config or on the command line that is in none of the "
            f"log dirs: a warning on stderr instead of an error (exit {EXIT_MISSING_TOPICS})",
        )
    return parser


# -- [kafka]: the jobs' Kafka client properties ------------------------------------------------
#
# Every job that talks to the broker (ingest's lake-group commit, retention's DeleteRecords)
# connects with these, as Kafka's tools do with --command-config: ``command_config`` names a
# client.properties file, and Kafka's client keys may also be written here (quoted: TOML would
# read security.protocol unquoted as a table), overriding the file's. Validated as the tools'
# files are (logstore.tools.client_config), when the job reads its config: exit 2 before Spark.


def kafka_client_config(data: Mapping[str, Any], path: str | Path) -> ClientConfig | None:
    """The validated ``[kafka]`` section of a checked pipeline TOML (None: no section, the
    jobs connect in PLAINTEXT); :class:`InvalidConfigError` naming the file."""
    section = data.get("kafka")
    if not section:
        return None
    props: dict[str, str] = {}
    if _KAFKA_FILE_KEY in section:
        try:
            props.update(read_client_properties(Path(str(section[_KAFKA_FILE_KEY])).absolute()))
        except InvalidConfigError as exc:
            raise InvalidConfigError(
                f"[kafka] command_config: {exc.message}", path=str(path)
            ) from None
    for key, value in section.items():
        if key != _KAFKA_FILE_KEY:
            props[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return client_config(props, source=f"{path} [kafka]")


# -- [storage]: how the jobs reach an s3:// lake ------------------------------------------------
#
# The standard AWS environment first (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...), then these keys
# for what the environment cannot say (timeouts, tries, a second endpoint for the lake only).
# The job runner installs the result as the run's settings (logstore.objectstore
# use_job_settings), so every lake call of the run uses them.


def storage_settings(data: Mapping[str, Any], path: str | Path) -> StorageSettings:
    """The run's object-store settings: the environment, then ``[storage]`` of a checked
    pipeline TOML; :class:`InvalidConfigError` naming the file (e.g. a timeout of 0)."""
    section = data.get("storage", {})
    try:
        return StorageSettings.from_environment(section)
    except InvalidConfigError as exc:  # its message names the key ("storage <key> must ...")
        raise InvalidConfigError(exc.message, path=str(path)) from None
