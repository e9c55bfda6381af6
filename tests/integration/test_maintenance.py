"""Table maintenance and records retention on real Delta tables (delta-rs), read back with polars.

Tables are built by many small appends (one file each, partitioned by topic and date, with
ingest-style app transactions). After optimize/vacuum/checkpoint/clean-up: the same rows, the
same progress, the whole version history listed, fewer files. Records retention removes whole
past days only, in one commit, and logs per Kafka partition what went. Maintenance while
another writer appends: nothing lost, no error.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import subprocess
import sys
import threading
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from logstore.errors import InvalidConfigError
from logstore.storage.topic_config import write_topic_config
from pipelines.ingest import read_progress
from pipelines.maintenance.job import run_maintenance
from pipelines.maintenance.tables import maintain_table, records_retention
from pipelines.retention.job import RetentionConfig

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NOW = int(datetime.datetime(2026, 11, 24, 12, tzinfo=datetime.UTC).timestamp() * 1000)
DAY = 86_400_000


def _append(path: Path, topic: str, partition: int, start: int, *, n: int, day: int) -> None:
    date = datetime.date(2026, 11, 24) - datetime.timedelta(days=day)
    table = pa.table(
        {
            "topic": [topic] * n,
            "partition": pa.array([partition] * n, pa.int32()),
            "offset": pa.array(range(start, start + n), pa.int64()),
            "value": [f"{topic}/{partition}/{o}".encode() for o in range(start, start + n)],
            "date": pa.array([date] * n, pa.date32()),
        }
    )
    write_deltalake(
        str(path),
        table,
        mode="append",
        partition_by=["topic", "date"],
        commit_properties=CommitProperties(
            app_transactions=[Transaction(f"loglake-ingest/{topic}/{partition}", start + n)]
        ),
    )


def _build(path: Path) -> None:
    # per (topic, partition): 4 days, 2 appends a day; offsets grow with time
    for topic in ("orders", "clicks"):
        for partition in (0, 1):
            offset = 0
            for day in (3, 2, 1, 0):
                for _ in range(2):
                    _append(path, topic, partition, offset, n=25, day=day)
                    offset += 25


def _rows(path: Path) -> list[tuple]:
    return sorted(pl.read_delta(str(path)).select("topic", "partition", "offset", "value").rows())


@pytest.mark.parametrize("zorder", [False, True])
def test_maintenance_keeps_rows_progress_and_history(tmp_path: Path, zorder: bool) -> None:
    path = tmp_path / "records"
    _build(path)
    rows, progress = _rows(path), read_progress(path)
    versions = DeltaTable(str(path)).version()
    files = len(DeltaTable(str(path)).file_uris())
    assert files == 32
    report = maintain_table(path, vacuum_hours=0, zorder=zorder)
    assert not report.errors
    assert report.checkpoint and report.log_cleaned
    assert report.files_before == files and report.files_after == 8  # one per topic and day
    assert report.vacuumed_files == files  # the compacted originals, unreferenced now
    assert len([f for f in path.rglob("*.parquet") if "_delta_log" not in f.parts]) == 8
    assert _rows(path) == rows
    assert read_progress(path) == progress
    history = DeltaTable(str(path)).history()
    assert {h["version"] for h in history} >= set(range(versions + 1))
    assert (path / "_delta_log" / f"{report.version_after:020d}.checkpoint.parquet").exists()
    again = maintain_table(path, vacuum_hours=0)  # nothing left to do: no new data files
    assert again.files_after == 8 and _rows(path) == rows


def test_every_earlier_version_reads_back_within_the_vacuum_horizon(tmp_path: Path) -> None:
    """With the default horizon (168 h) vacuum keeps the compacted originals: every version
    before maintenance still reads back exactly as it did (time travel), and the current
    version is the same rows in fewer files."""
    path = tmp_path / "records"
    _build(path)
    last = DeltaTable(str(path)).version()
    before = {v: _rows_at(path, v) for v in range(last + 1)}
    report = maintain_table(path, vacuum_hours=168)
    assert not report.errors and report.vacuumed_files == 0
    assert report.files_after < report.files_before
    assert report.version_after > last
    assert {v: _rows_at(path, v) for v in range(last + 1)} == before
    assert _rows(path) == before[last]


def _rows_at(path: Path, version: int) -> list[tuple]:
    frame = pl.read_delta(str(path), version=version)
    return sorted(frame.select("topic", "partition", "offset", "value").rows())


def test_records_retention_deletes_whole_past_days(tmp_path: Path) -> None:
    path = tmp_path / "records"
    _build(path)
    before = pl.read_delta(str(path))
    # 1.5 days: the cutoff is 2026-11-23 00:00 UTC; days 2026-11-21 and -22 go, -23 stays
    rows, version, deleted = records_retention(
        path, {"orders": int(1.5 * DAY), "clicks": -1}, now_ms=NOW
    )
    after = pl.read_delta(str(path))
    gone = before.filter(
        (pl.col("topic") == "orders") & (pl.col("date") < datetime.date(2026, 11, 23))
    )
    assert deleted == gone.height == 2 * 100
    assert sorted(after.rows()) == sorted(before.join(gone, on=before.columns, how="anti").rows())
    assert version == DeltaTable(str(path)).version()
    assert [(r["topic"], r["partition"], r["segment_base_offset"], r["end_offset"], r["rows"])
            for r in rows] == [("orders", 0, 0, 100, 100), ("orders", 1, 0, 100, 100)]  # fmt: skip
    assert records_retention(path, {"orders": int(1.5 * DAY)}, now_ms=NOW)[2] == 0  # idempotent


def test_run_maintenance_topic_mode_and_retention_log(tmp_path: Path) -> None:
    lake, logs = tmp_path / "lake", tmp_path / "logs"
    _build(lake / "records")
    write_topic_config(logs, "orders", {"retention.ms": str(2 * DAY + DAY // 4)})
    write_topic_config(logs, "clicks", {"retention.ms": "1", "cleanup.policy": "compact"})
    props = tmp_path / "broker.properties"
    props.write_text("log.retention.hours=1\n")
    cfg = RetentionConfig(
        log_dirs=(str(logs),),
        lake=str(lake),
        broker_config=str(props),
        records_retention="topic",
        vacuum_hours=0,
    )
    summary = run_maintenance(cfg, now_ms=NOW)
    assert not summary.errors
    # orders: cutoff 2026-11-22 06:00 -> 2026-11-21 goes; clicks is compact-only: kept
    assert summary.deleted_rows == 2 * 50
    log = pl.read_delta(str(lake / "retention_log"))
    assert sorted(log.select("topic", "partition", "rows", "source").rows()) == [
        ("orders", 0, 50, "records"),
        ("orders", 1, 50, "records"),
    ]
    names = {Path(t["path"]).name for t in summary.tables}
    assert names == {"records", "retention_log"}


def test_topic_mode_without_log_dirs_asks_the_broker(tmp_path: Path, broker_factory) -> None:
    """``log_dirs = []`` (no shared disk): the topics' retention.ms and cleanup.policy in force
    come from [ingest] bootstrap_servers (DescribeConfigs), with the same result as the log
    dir's configs above; a topic gone from the cluster gets broker_config's defaults."""
    b = broker_factory()
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    futures = admin.create_topics(
        [NewTopic("orders", 1, 1, config={"retention.ms": str(2 * DAY + DAY // 4)}),
         NewTopic("clicks", 1, 1, config={"retention.ms": "1", "cleanup.policy": "compact"})]
    )  # fmt: skip
    for f in futures.values():
        f.result(30)
    lake = tmp_path / "lake"
    _build(lake / "records")
    _append(lake / "records", "gone", 0, 0, n=10, day=3)  # no such topic on the cluster
    props = tmp_path / "broker.properties"
    props.write_text(f"log.retention.ms={2 * DAY}\n")  # "gone": its 2026-11-21 rows go
    cfg = RetentionConfig(
        log_dirs=(),
        lake=str(lake),
        broker_config=str(props),
        records_retention="topic",
        vacuum_hours=0,
        bootstrap_servers=b.bootstrap,
    )
    summary = run_maintenance(cfg, now_ms=NOW)
    assert not summary.errors
    assert summary.deleted_rows == 2 * 50 + 10
    log = pl.read_delta(str(lake / "retention_log"))
    assert sorted(log.select("topic", "partition", "rows").rows()) == [
        ("gone", 0, 10), ("orders", 0, 50), ("orders", 1, 50)
    ]  # fmt: skip
    # neither log dirs nor a broker: refused before anything changes (exit 2's error)
    with pytest.raises(InvalidConfigError, match="neither is set"):
        run_maintenance(dataclasses.replace(cfg, bootstrap_servers=""), now_ms=NOW)


def test_maintenance_while_another_writer_appends(tmp_path: Path) -> None:
    path = tmp_path / "records"
    _build(path)
    stop = threading.Event()
    errors: list[BaseException] = []
    written = [0]

    def writer() -> None:
        offset = 1000
        try:
            while not stop.is_set() and written[0] < 40:
                _append(path, "orders", 5, offset, n=5, day=0)
                offset += 5
                written[0] += 1
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=writer)
    t.start()
    try:
        reports = [maintain_table(path, vacuum_hours=0) for _ in range(3)]
    finally:
        stop.set()
        t.join(60)
    assert not errors, errors
    assert all(not r.errors for r in reports), [r.errors for r in reports]
    got = pl.read_delta(str(path)).filter(pl.col("partition") == 5)["offset"].sort().to_list()
    assert got == list(range(1000, 1000 + 5 * written[0]))
    assert read_progress(path)[("orders", 5)] == 1000 + 5 * written[0]


def test_maintain_cli(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    _build(lake / "records")
    toml = tmp_path / "p.toml"
    toml.write_text(
        f'[paths]\nlog_dirs = ["{tmp_path}/logs"]\nlake = "{lake}"\n'
        '[retention]\nrecords = "forever"\nvacuum_hours = 0\n'
    )
    run = subprocess.run(
        [sys.executable, "jobs/maintain.py", "--config", str(toml)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["deleted_rows"] == 0
    assert [(t["files_before"], t["files_after"]) for t in summary["tables"]] == [(32, 8)]
    toml.write_text(toml.read_text() + "vacum_hours = 1\n")
    bad = subprocess.run(
        [sys.executable, "jobs/maintain.py", "--config", str(toml)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert bad.returncode == 2  # a configuration error: not retried
    assert "'vacum_hours' in [retention]; did you mean 'vacuum_hours'" in bad.stderr


def _disk(path: Path) -> dict[str, int]:
    """Every file under the table directory (data, deletion vectors, log), with its size."""
    return {p.relative_to(path).as_posix(): p.stat().st_size for p in path.rglob("*")
            if p.is_file()}  # fmt: skip


def test_dry_run_lists_what_maintenance_would_do_and_changes_nothing(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    path = lake / "records"
    _build(path)
    DeltaTable(str(path)).optimize.compact()  # 32 files -> 8; the 32 wait for vacuum
    for offset in (200, 210):  # two small files in one partition (orders, today)
        _append(path, "orders", 0, offset, n=10, day=0)
    today = f"topic=orders/date={datetime.date(2026, 11, 24)}/"
    cfg = RetentionConfig(
        log_dirs=(str(tmp_path / "logs"),),
        lake=str(lake),
        broker_config=str(ROOT / "conf" / "broker.properties"),
        records_retention="2d",
        vacuum_hours=0,
    )
    version, disk, rows = DeltaTable(str(path)).version(), _disk(path), _rows(path)

    plan = run_maintenance(cfg, now_ms=NOW, dry_run=True)
    assert (DeltaTable(str(path)).version(), _disk(path), _rows(path)) == (version, disk, rows)
    assert not (lake / "retention_log").exists() and not plan.errors
    # records retention: 2026-11-21 (older than date(NOW - 2 d)) of each topic-partition
    assert plan.deleted_rows == 4 * 50 and plan.records_version is None
    assert sorted((r["topic"], r["partition"], r["segment_base_offset"], r["end_offset"],
                   r["rows"]) for r in plan.retention_rows) == [
        ("clicks", 0, 0, 50, 50), ("clicks", 1, 0, 50, 50),
        ("orders", 0, 0, 50, 50), ("orders", 1, 0, 50, 50),
    ]  # fmt: skip
    [table] = plan.tables
    assert (table["version"], table["files"]) == (version, 10)
    # optimize: the partition with three small files; a partition's lone file stays
    assert len(table["optimize_files"]) == 3
    assert all(f.startswith(today) for f in table["optimize_files"])
    assert len(table["vacuum_files"]) == 32 and table["vacuum_orphans"] == []
    assert set(table["vacuum_files"]) <= set(disk)
    assert table["checkpoint_version"] == version + 1
    listing = plan.describe()
    assert "dry run (nothing changed)" in listing and "would delete 200 rows" in listing
    assert "would rewrite 3 files" in listing and "would remove 32 files" in listing
    assert all(f in listing for f in [*table["optimize_files"], *table["vacuum_files"]])

    # the job's --dry-run prints the same listing and the same JSON, and changes nothing
    toml = tmp_path / "p.toml"
    toml.write_text(
        f'[paths]\nlog_dirs = ["{tmp_path}/logs"]\nlake = "{lake}"\n'
        '[retention]\nrecords = "forever"\nvacuum_hours = 0\n'
    )
    run = subprocess.run(
        [sys.executable, "jobs/maintain.py", "--config", str(toml), "--dry-run"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["dry_run"] is True
    assert summary["tables"][0]["optimize_files"] == table["optimize_files"]
    assert summary["tables"][0]["vacuum_files"] == table["vacuum_files"]
    assert "would rewrite 3 files" in run.stderr and table["vacuum_files"][0] in run.stderr
    assert (DeltaTable(str(path)).version(), _disk(path)) == (version, disk)

    # what a real run then does is what the plan said: optimize rewrites exactly those files,
    # vacuum removes the listed files (and the ones optimize just replaced)
    report = maintain_table(path, vacuum_hours=0)
    assert not report.errors
    gone = set(disk) - set(_disk(path))
    data_gone = {f for f in gone if not f.startswith("_delta_log/")}
    assert data_gone == set(table["vacuum_files"]) | set(table["optimize_files"])
    assert _rows(path) == rows
    deleted, _, count = records_retention(path, {"orders": 2 * DAY, "clicks": 2 * DAY}, now_ms=NOW)
    assert count == plan.deleted_rows
    assert sorted((r["topic"], r["partition"], r["segment_base_offset"], r["end_offset"])
                  for r in deleted) == sorted(
        (r["topic"], r["partition"], r["segment_base_offset"], r["end_offset"])
        for r in plan.retention_rows
    )  # fmt: skip
