"""The maintenance run: records retention, then maintenance of every loglake table.

See :mod:`pipelines.maintenance.tables` for each step. The per-topic retention of ``[retention]
records = "topic"`` comes from the log dirs' topic configs over the broker defaults (the same
resolution as the log retention job); a topic in ``records`` that no log dir knows any more
gets the broker defaults.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from logstore.errors import InvalidConfigError
from logstore.storage.config import LogConfig
from logstore.storage.topic_config import read_topic_configs
from pipelines.maintenance.tables import find_tables, maintain_table, plan_table, records_retention
from pipelines.retention.job import (
    RetentionConfig,
    append_retention_log,
    broker_defaults,
    parse_records_retention,
)

__all__ = ["MaintenanceSummary", "run_maintenance", "topic_retention"]

Log = Callable[[str], None]


@dataclass
class MaintenanceSummary:
    """What a run did, or with ``dry_run`` would do: then ``deleted_*`` count what records
    retention would delete, ``retention_rows`` lists it, and ``tables`` holds each table's
    :class:`~pipelines.maintenance.tables.TablePlan`."""

    records_retention: str = "forever"
    dry_run: bool = False
    retention_rows: list[dict[str, Any]] = field(default_factory=list)
    deleted_rows: int = 0
    deleted_partitions: int = 0
    records_version: int | None = None
    tables: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        if self.dry_run:
            return self._describe_plan()
        files = ", ".join(
            f"{_name(t['path'])} {t['files_before']}->{t['files_after']} files" for t in self.tables
        )
        return (
            f"maintenance summary: records retention {self.records_retention}: "
            f"{self.deleted_rows} rows deleted; tables: {files or 'none'}; "
            f"errors={len(self.errors)} seconds={self.seconds:.1f}"
        )

    def _describe_plan(self) -> str:
        lines = [
            f"maintenance dry run (nothing changed): records retention "
            f"{self.records_retention}: would delete {self.deleted_rows} rows in "
            f"{self.deleted_partitions} topic-partitions",
            *(
                f"  {r['topic']}/{r['partition']}: offsets {r['segment_base_offset']}.."
                f"{r['end_offset'] - 1} ({r['rows']} rows, {r['rule']})"
                for r in self.retention_rows
            ),
        ]
        for t in self.tables:
            files = [*t["vacuum_files"], *t["vacuum_orphans"]]
            lines += [
                f"{t['path']} (version {t['version']}, {t['files']} files):",
                f"  optimize ({t['optimize']}): would rewrite {len(t['optimize_files'])} files",
                *(f"    {f}" for f in t["optimize_files"]),
                f"  vacuum: would remove {len(files)} files",
                *(f"    {f}" for f in files),
                f"  checkpoint: would write one at version {t['checkpoint_version']}",
            ]
        lines += [f"error: {e}" for e in self.errors]
        return "\n".join(lines)


def _name(uri: str) -> str:
    """A table's name: the last part of its path or URI."""
    return uri.rstrip("/").rsplit("/", 1)[-1]


def topic_retention(
    log_dirs: Iterable[str], defaults: LogConfig, topics: Iterable[str]
) -> dict[str, int]:
    """Each topic's ``retention.ms`` (-1 when it has no ``delete`` policy: kept forever)."""
    overrides: dict[str, dict[str, str]] = {}
    for d in log_dirs:
        if Path(d).is_dir():
            for topic, props in read_topic_configs(d).items():
                overrides.setdefault(topic, {}).update(props)
    out: dict[str, int] = {}
    for topic in topics:
        cfg = LogConfig.from_properties(overrides.get(topic, {}), defaults=defaults)
        out[topic] = cfg.retention_ms if cfg.delete else -1
    return out


_RETENTION_KEYS: tuple[str, ...] = ("retention.ms", "cleanup.policy")


def broker_topic_retention(config: RetentionConfig, topics: Iterable[str]) -> dict[str, int]:
    """:func:`topic_retention` without log dirs: each topic's ``retention.ms`` and
    ``cleanup.policy`` in force on ``[ingest] bootstrap_servers`` (DescribeConfigs, the broker's
    defaults included); a topic the cluster no longer has gets the ``broker_config`` defaults,
    as a log dir without its configs would give it."""
    from pipelines.sources.fetch import cluster_topics, topic_configs  # noqa: PLC0415

    bootstrap, kafka = config.bootstrap_servers, config.kafka
    wanted = sorted(set(topics))
    present = set(cluster_topics(bootstrap, config=kafka)) & set(wanted)
    described = topic_configs(bootstrap, present, config=kafka, effective=True)
    defaults = broker_defaults(config.broker_config)
    out: dict[str, int] = {}
    for topic in wanted:
        props = described.get(topic, {})
        keys: dict[str, str] = {k: props[k] for k in _RETENTION_KEYS if k in props}
        cfg = LogConfig.from_properties(keys, defaults=defaults)
        out[topic] = cfg.retention_ms if cfg.delete else -1
    return out


def run_maintenance(
    config: RetentionConfig,
    *,
    tables: Iterable[str] | None = None,
    records: bool = True,
    now_ms: int | None = None,
    log: Log = lambda _m: None,
    dry_run: bool = False,
) -> MaintenanceSummary:
    """Records retention (unless ``records`` is False), then maintenance of ``tables`` (names
    under the lake; default every table found). ``dry_run``: plan both, change nothing (no
    commit, no file removed, nothing appended to ``retention_log``)."""
    started = time.monotonic()
    summary = MaintenanceSummary(records_retention=config.records_retention, dry_run=dry_run)
    setting = parse_records_retention(config.records_retention)
    if records and setting == "topic" and not config.log_dirs and not config.bootstrap_servers:
        raise InvalidConfigError(
            '[retention] records = "topic" reads each topic\'s retention.ms from the log dirs '
            "or, with log_dirs = [], from [ingest] bootstrap_servers (DescribeConfigs), and "
            'neither is set: set one, or give an age (e.g. "30d") or "forever"'
        )
    if records and setting != "forever":
        from pipelines.delta.commit import load_table  # noqa: PLC0415

        path = config.records_path
        dt = load_table(path)
        topics = sorted({v["topic"] for v in dt.partitions() if "topic" in v}) if dt else []
        if setting == "topic" and config.log_dirs:
            retention = topic_retention(
                config.log_dirs, broker_defaults(config.broker_config), topics
            )
        elif setting == "topic":
            retention = broker_topic_retention(config, topics)
        else:
            retention = dict.fromkeys(topics, int(setting))
        rows, version, deleted = records_retention(path, retention, now_ms=now_ms, dry_run=dry_run)
        summary.deleted_rows = deleted
        summary.deleted_partitions = len(rows)
        summary.records_version = version
        if dry_run:
            summary.retention_rows = rows
        else:
            append_retention_log(config.retention_log_path, rows)
            log(f"records retention ({config.records_retention}): {deleted} rows deleted")
    wanted = set(tables) if tables else None
    found = find_tables(config.lake)
    if wanted is not None:
        missing = wanted - {_name(t.uri) for t in found}
        summary.errors.extend(f"{name}: no such table under {config.lake}" for name in missing)
    for table in found:
        name = _name(table.uri)
        if wanted is not None and name not in wanted:
            continue
        if dry_run:
            plan = plan_table(table, vacuum_hours=config.vacuum_hours, zorder=config.zorder)
            summary.tables.append(plan.to_json())
            continue
        report = maintain_table(table, vacuum_hours=config.vacuum_hours, zorder=config.zorder)
        summary.tables.append(report.to_json())
        summary.errors.extend(f"{name}: {e}" for e in report.errors)
        log(
            f"{name}: files {report.files_before} -> {report.files_after}, "
            f"version {report.version_before} -> {report.version_after}"
        )
    summary.seconds = time.monotonic() - started
    return summary
