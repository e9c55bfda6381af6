"""The pipeline configuration's schema: which sections and keys ``conf/pipeline.toml`` may hold.

Every job reads the same file (``--config``), each its own sections, so a typo would
otherwise be ignored by all of them and the job would run on a default the user did not
choose. :func:`check_keys` refuses any section or key not listed here, naming the nearest
valid one, the way the broker refuses an unknown ``broker.properties`` key.

A section whose keys are free-form (``[spark.conf]``: Spark settings; per-topic tables such
as ``[compact.strategy]``) is listed with ``None``: its own keys are not checked, its
existence is.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from logstore.errors import LoglakeError
from logstore.storage.files import parse_partition_dir

__all__ = [
    "EXIT_MISSING_TOPICS",
    "ON_DIVERGENCE",
    "PARQUET_CODECS",
    "SECTIONS",
    "JobSettings",
    "MissingTopicsError",
    "check_keys",
    "check_topics",
    "job_parser",
    "job_settings",
    "log_dir_topics",
    "read_pipeline_toml",
]

# Exit code of every job that takes topic names when one of them is in none of the log dirs
# (argparse's own code for bad arguments: the names are arguments, from the file or the
# command line). --allow-missing-topics makes it a warning.
EXIT_MISSING_TOPICS = 2
# [ingest] on_divergence / --on-divergence (pipelines.divergence); here so that the job's
# argument parser needs no Delta or Arrow import.
ON_DIVERGENCE = ("fail", "rewind")

# section -> its keys (None: free-form keys). Sub-tables are sections of their own, by
# dotted name ("spark.conf").
SECTIONS: dict[str, frozenset[str] | None] = {
    "paths": frozenset({"log_dirs", "lake"}),
    "spark": frozenset({"app_name", "master"}),
    "spark.conf": None,
    "ingest": frozenset(
        {
            "topics",
            "fail_on_corrupt",
            "max_partition_bytes",
            "compression",
            "max_rows_per_file",
            "progress_interval_s",
            "on_divergence",
            "isolation",
            "bootstrap_servers",
            "lake_group",
        }
    ),
    "compact": frozenset(
        {"topics", "default_strategy", "buckets", "compression", "max_rows_per_file"}
    ),
    "compact.strategy": None,  # topic = strategy
    "retention": frozenset(
        {"broker_config", "records", "vacuum_hours", "zorder", "delete_records_chunk"}
    ),
    "quality": frozenset(
        {"max_future_skew_s", "max_past_skew_s", "max_quarantined_batches", "docs", "actions"}
    ),
}


# Keys that existed once: refused with what to do instead.
RETIRED: dict[tuple[str, str], str] = {
    ("ingest", "verify"): "[ingest] verify is no longer used: ingest decodes every batch it "
    "ingests and quarantines the ones it cannot decode; remove the key",
}


def _nearest(word: str, candidates: set[str] | frozenset[str]) -> str:
    close = difflib.get_close_matches(word, sorted(candidates), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def check_keys(data: Mapping[str, Any], path: str) -> None:
    """Raise :class:`LoglakeError` for the first unknown section or key of ``data``."""
    for section, table in data.items():
        if section not in SECTIONS:
            top = {s for s in SECTIONS if "." not in s}
            raise LoglakeError(f"unknown section [{section}]" + _nearest(section, top), path=path)
        _check_table(section, table, path)


def _check_table(name: str, table: Any, path: str) -> None:
    if not isinstance(table, Mapping):
        raise LoglakeError(f"[{name}] must be a table", path=path)
    keys = SECTIONS[name]
    if keys is None:
        return
    for key, value in table.items():
        if f"{name}.{key}" in SECTIONS:
            _check_table(f"{name}.{key}", value, path)
        elif (name, key) in RETIRED:
            raise LoglakeError(RETIRED[(name, key)], path=path)
        elif key not in keys:
            raise LoglakeError(f"unknown key {key!r} in [{name}]" + _nearest(key, keys), path=path)


def read_pipeline_toml(path: str | Path) -> dict[str, Any]:
    """Parse a pipeline TOML file and :func:`check_keys` it; errors name the file."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LoglakeError("config file not found", path=str(p)) from None
    except tomllib.TOMLDecodeError as exc:
        raise LoglakeError(f"config is not valid TOML: {exc}", path=str(p)) from None
    check_keys(data, str(p))
    return data


# Parquet codecs of the tables' data files (the jobs' `compression` keys).
PARQUET_CODECS = ("snappy", "zstd", "lz4", "gzip", "none")


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
    if isinstance(dirs, str):
        dirs = [dirs]
    lake_dir = lake or paths.get("lake")
    if not lake_dir or (need_log_dirs and not dirs):
        what = "log_dirs and lake" if need_log_dirs else "lake"
        flags = "--log-dirs/--lake" if need_log_dirs else "--lake"
        raise LoglakeError(f"[paths] {what} must be set (or {flags})", path=str(path))
    return JobSettings(
        log_dirs=tuple(str(Path(d).absolute()) for d in dirs),
        lake=str(Path(lake_dir).absolute()),
        app_name=f"{spark.get('app_name', 'loglake')}-{job}",
        master=spark.get("master"),
        spark_conf={str(k): str(v) for k, v in spark.get("conf", {}).items()},
    )


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
) -> argparse.ArgumentParser:
    """A job's argument parser with what every job takes: ``--config``, ``--log-dirs``,
    ``--lake``, ``--verbose`` for the jobs that run Spark, and ``--allow-missing-topics`` for
    the jobs that take topic names (``topics``: see :func:`check_topics`). The description is
    the second paragraph of the job's docstring, the epilog the rest (exit codes and
    output)."""
    parts = doc.split("\n\n")
    parser = argparse.ArgumentParser(
        prog=prog,
        description=parts[1] if len(parts) > 1 else parts[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(parts[2:]),
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
