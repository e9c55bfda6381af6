"""The ingest job: real segment files (logstore.storage) -> logsegments source -> Delta records.

Segments are written with ``Log.append`` over ``build_batch`` batches (every codec, headers,
null keys, tombstones, a transaction with its COMMIT marker); the ``records`` table is read
back with deltalake and polars and compared with what was appended, byte for byte.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from logstore.errors import LoglakeError
from logstore.protocol.batch import Codec, iter_batches
from logstore.protocol.control import ControlType, build_control_batch
from logstore.protocol.records import build_batch
from logstore.storage.checkpoints import write_offset_checkpoint
from logstore.storage.config import LogConfig
from logstore.storage.log import Log
from pipelines.delta import StaleTransactionError, read_app_transactions
from pipelines.ingest import (
    IngestConfig,
    app_id,
    load_config,
    read_progress,
    run_ingest,
    schedule_tasks,
)
from tests.fixtures.jobs import spark_submit

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
BASE_MS = int(dt.datetime(2024, 5, 1, 22, tzinfo=dt.UTC).timestamp() * 1000)
Row = tuple[str, int, int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]


class LogDir:
    """A broker-like log dir built with the storage engine; remembers every record appended."""

    def __init__(self, root: Path, *, segment_bytes: int = 2048) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.config = LogConfig(segment_bytes=segment_bytes)
        self.logs: dict[tuple[str, int], Log] = {}
        self.rows: list[Row] = []
        self.control_batches = 0

    def log(self, topic: str, partition: int) -> Log:
        key = (topic, partition)
        if key not in self.logs:
            self.logs[key] = Log.open(self.root / f"{topic}-{partition}", self.config)
        return self.logs[key]

    def produce(
        self, topic: str, partition: int, n: int, *, codec: Codec = Codec.NONE, seed: int = 0
    ) -> None:
        log = self.log(topic, partition)
        items = []
        for i in range(n):
            j = seed + i
            key = None if j % 4 == 0 else f"key-{j}".encode()
            value = None if j % 9 == 5 else bytes((j * 7 + k) % 256 for k in range(j % 50))
            headers = tuple(
                (f"h{h}", None if h == 1 else bytes([j % 256, h])) for h in range(j % 3)
            )
            items.append((key, value, headers, BASE_MS + j * 3_600_000))
        info = log.append(build_batch(items, codec=codec))
        for off, (key, value, headers, ts) in enumerate(items, start=info.first_offset):
            self.rows.append((topic, partition, off, ts, key, value, list(headers)))
        log.high_watermark = log.log_end_offset

    def transaction(self, topic: str, partition: int, n: int) -> None:
        log = self.log(topic, partition)
        items = [(f"tx-{i}".encode(), f"v-{i}".encode(), (), BASE_MS + i) for i in range(n)]
        info = log.append(
            build_batch(
                items, producer_id=42, producer_epoch=1, base_sequence=0, is_transactional=True
            )
        )
        for off, (key, value, _h, ts) in enumerate(items, start=info.first_offset):
            self.rows.append((topic, partition, off, ts, key, value, []))
        log.append(
            build_control_batch(
                ControlType.COMMIT, producer_id=42, producer_epoch=1, timestamp=BASE_MS + n
            )
        )
        self.control_batches += 1
        log.high_watermark = log.log_end_offset

    def checkpoint(self) -> None:
        for log in self.logs.values():
            log.flush()
        write_offset_checkpoint(
            self.root / "replication-offset-checkpoint",
            {k: log.high_watermark for k, log in self.logs.items()},
        )
        write_offset_checkpoint(
            self.root / "log-start-offset-checkpoint",
            {k: log.log_start_offset for k, log in self.logs.items()},
        )

    def close(self) -> None:
        for log in self.logs.values():
            log.close()
        self.logs.clear()


def _records(lake: Path) -> list[Row]:
    """The records table via deltalake, checked equal to polars' reading of it."""
    t = DeltaTable(str(lake / "records")).to_pyarrow_table()
    cols = ["topic", "partition", "offset", "timestamp", "key", "value", "headers"]
    rs = sorted(
        (
            r["topic"],
            r["partition"],
            r["offset"],
            int(r["timestamp"].timestamp() * 1000),
            r["key"],
            r["value"],
            [(h["key"], h["value"]) for h in r["headers"]],
        )
        for r in t.select(cols).to_pylist()
    )
    p = pl.read_delta(str(lake / "records")).select(cols)
    via_polars = sorted(
        (
            r["topic"],
            r["partition"],
            r["offset"],
            int(r["timestamp"].timestamp() * 1000),
            r["key"],
            r["value"],
            [(h["key"], h["value"]) for h in r["headers"]],
        )
        for r in p.to_dicts()
    )
    assert rs == via_polars
    return rs


def _config(log_dir: Path, lake: Path, **kw: object) -> IngestConfig:
    return IngestConfig(log_dirs=(str(log_dir),), lake=str(lake), progress_interval_s=0, **kw)


def _quiet(_msg: str) -> None:
    pass


@pytest.fixture
def logs(tmp_path: Path):  # type: ignore[no-untyped-def]
    d = LogDir(tmp_path / "logs")
    yield d
    d.close()


def test_ingest_is_exact_then_a_no_op_then_incremental(
    spark: SparkSession, tmp_path: Path, logs: LogDir
) -> None:
    lake = tmp_path / "lake"
    for codec in Codec:
        logs.produce("events", 0, 12, codec=codec, seed=int(codec) * 100)
    logs.produce("events", 1, 30, codec=Codec.LZ4, seed=7)
    logs.transaction("payments", 0, 5)
    logs.produce("payments", 0, 3, seed=3)
    logs.checkpoint()
    assert len(list((logs.root / "events-0").glob("*.log"))) > 1  # several segments

    s1 = run_ingest(spark, _config(logs.root, lake), log=_quiet)
    assert s1.committed and s1.records == len(logs.rows) == 12 * len(Codec) + 30 + 8
    assert s1.partitions == 3 and s1.control_batches == 1 and not s1.gaps
    assert _records(lake) == sorted(logs.rows)
    ends = {k: log.log_end_offset for k, log in logs.logs.items()}
    assert read_progress(lake / "records") == ends
    assert read_app_transactions(lake / "records") == {app_id(*k): v for k, v in ends.items()}
    version = DeltaTable(str(lake / "records")).version()
    dt_ = DeltaTable(str(lake / "records"))
    assert dt_.metadata().partition_columns == ["topic", "date"]
    table = pl.read_delta(str(lake / "records"))
    codecs = table.filter(pl.col("topic") == "events").group_by("partition", "codec").len()
    assert set(codecs.filter(pl.col("partition") == 0)["codec"]) == {c.label for c in Codec}
    tx = table.filter(pl.col("is_transactional"))
    assert tx.height == 5 and set(tx["producer_id"]) == {42} and set(tx["offset"]) == set(range(5))
    days = table.select((pl.col("timestamp").dt.date() == pl.col("date")).all()).item()
    assert days is True

    messages: list[str] = []
    s2 = run_ingest(spark, _config(logs.root, lake), log=messages.append)
    assert (s2.records, s2.committed) == (0, False)
    assert DeltaTable(str(lake / "records")).version() == version
    # every partition is at its high watermark: nothing planned, no Spark task
    assert any("reading 0 ranges" in m and "in 0 tasks" in m for m in messages), messages

    before = len(logs.rows)
    logs.produce("events", 1, 6, codec=Codec.ZSTD, seed=500)
    logs.produce("fresh", 0, 4, seed=900)
    logs.checkpoint()
    s3 = run_ingest(spark, _config(logs.root, lake), log=_quiet)
    assert s3.records == len(logs.rows) - before == 10 and s3.partitions == 2
    assert _records(lake) == sorted(logs.rows)
    assert DeltaTable(str(lake / "records")).version() == version + 1


def test_high_watermark_bounds_what_is_ingested(
    spark: SparkSession, tmp_path: Path, logs: LogDir
) -> None:
    lake = tmp_path / "lake"
    logs.produce("t", 0, 10)
    logs.checkpoint()
    logs.produce("t", 0, 5, seed=10)  # appended, but not yet below the checkpointed watermark
    logs.logs[("t", 0)].flush()
    s = run_ingest(spark, _config(logs.root, lake), log=_quiet)
    assert s.records == 10
    assert _records(lake) == sorted(logs.rows[:10])
    logs.checkpoint()
    assert run_ingest(spark, _config(logs.root, lake), log=_quiet).records == 5
    assert _records(lake) == sorted(logs.rows)


def test_internal_topics_are_ingested_only_when_named(
    spark: SparkSession, tmp_path: Path, logs: LogDir
) -> None:
    lake = tmp_path / "lake"
    logs.produce("app", 0, 4)
    logs.produce("__consumer_offsets", 0, 3, seed=50)
    logs.checkpoint()
    s = run_ingest(spark, _config(logs.root, lake), log=_quiet)
    assert s.records == 4
    assert {r[0] for r in _records(lake)} == {"app"}
    assert set(read_progress(lake / "records")) == {("app", 0)}
    named = run_ingest(spark, _config(logs.root, lake, topics=("__consumer_offsets",)), log=_quiet)
    assert named.records == 3
    assert _records(lake) == sorted(logs.rows)


def _flip_byte_in_batch(log_file: Path, batch_index: int) -> int:
    data = bytearray(log_file.read_bytes())
    position, header = list(iter_batches(data))[batch_index]
    data[position + header.size - 1] ^= 0xFF  # last record byte: CRC no longer matches
    log_file.write_bytes(bytes(data))
    return position


def test_corrupt_batch_goes_to_quarantine_and_the_rest_is_ingested(
    spark: SparkSession, tmp_path: Path, logs: LogDir
) -> None:
    lake = tmp_path / "lake"
    big = LogDir(tmp_path / "logs2", segment_bytes=1 << 20)
    try:
        for i in range(3):
            big.produce("c", 0, 4, seed=10 * i)
        big.checkpoint()
    finally:
        big.close()
    seg = next((big.root / "c-0").glob("*.log"))
    position = _flip_byte_in_batch(seg, 1)
    cfg = _config(big.root, lake)
    s = run_ingest(spark, cfg, log=_quiet)
    assert (s.corrupt_batches, s.quarantined, s.records) == (1, 1, 8)
    good = [r for r in big.rows if not 4 <= r[2] < 8]
    assert _records(lake) == sorted(good)
    q = pl.read_delta(str(lake / "quarantine"))
    assert q.height == 1
    row = q.to_dicts()[0]
    assert (row["topic"], row["partition"], row["position"]) == ("c", 0, position)
    assert Path(row["file"]) == seg.resolve() and "crc" in row["error"].lower()
    # a re-run reads nothing below its progress: the damage is not found (nor quarantined) again
    s2 = run_ingest(spark, cfg, log=_quiet)
    assert (s2.corrupt_batches, s2.quarantined, s2.records, s2.committed) == (0, 0, 0, False)
    assert pl.read_delta(str(lake / "quarantine")).height == 1
    assert _records(lake) == sorted(good)
    # strict mode fails, and does not move progress; the damage is quarantined once
    from logstore.errors import CorruptRecordError

    strict = tmp_path / "lake-strict"
    shutil.copytree(lake / "quarantine", strict / "quarantine")
    with pytest.raises(CorruptRecordError, match="damaged"):
        run_ingest(spark, _config(big.root, strict, fail_on_corrupt=True), log=_quiet)
    assert read_progress(strict / "records") == {}
    assert pl.read_delta(str(strict / "quarantine")).height == 1


def test_gap_from_retention_is_reported(spark: SparkSession, tmp_path: Path, logs: LogDir) -> None:
    lake = tmp_path / "lake"
    for i in range(6):
        logs.produce("g", 0, 10, seed=i * 10)
    logs.checkpoint()
    log = logs.logs[("g", 0)]
    start = log.delete_records(25)  # DeleteRecords: offsets below 25 are gone
    logs.checkpoint()
    messages: list[str] = []
    s = run_ingest(spark, _config(logs.root, lake), log=messages.append)
    assert [(g.topic, g.partition, g.from_offset, g.to_offset) for g in s.gaps] == [
        ("g", 0, 0, start)
    ]
    assert any("GAP g/0" in m for m in messages)
    assert _records(lake) == sorted(r for r in logs.rows if r[2] >= start)
    # reported once: the next run starts after it
    assert run_ingest(spark, _config(logs.root, lake), log=_quiet).gaps == []


def test_concurrent_run_is_a_no_op_or_refused(
    spark: SparkSession, tmp_path: Path, logs: LogDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose progress was read before another run committed: never duplicates."""
    import pipelines.ingest as ingest_mod

    lake = tmp_path / "lake"
    logs.produce("r", 0, 5)
    logs.checkpoint()
    run_ingest(spark, _config(logs.root, lake), log=_quiet)
    stale = read_progress(lake / "records")  # {("r", 0): 5}, as a slow second run read it
    logs.produce("r", 0, 5, seed=5)
    logs.checkpoint()
    run_ingest(spark, _config(logs.root, lake), log=_quiet)  # the other run lands first
    version = DeltaTable(str(lake / "records")).version()
    monkeypatch.setattr(ingest_mod, "read_progress", lambda _p: dict(stale))
    # same range [5, 10) as the run that landed: exactly its versions -> a no-op
    same = run_ingest(spark, _config(logs.root, lake), log=_quiet)
    assert (same.committed, same.records) == (False, 0)
    assert DeltaTable(str(lake / "records")).version() == version
    # more data since: [5, 15) would duplicate [5, 10) -> refused
    logs.produce("r", 0, 5, seed=10)
    logs.checkpoint()
    with pytest.raises(StaleTransactionError, match="moved under this write"):
        run_ingest(spark, _config(logs.root, lake), log=_quiet)
    monkeypatch.undo()
    assert _records(lake) == sorted(logs.rows[:10])
    assert run_ingest(spark, _config(logs.root, lake), log=_quiet).records == 5
    assert _records(lake) == sorted(logs.rows)


_SHUFFLE = {"spark.sql.shuffle.partitions": "2"}


def test_spark_submit_killed_before_commit_then_rerun_is_exact(
    tmp_path: Path, logs: LogDir
) -> None:
    lake = tmp_path / "lake"
    for codec in (Codec.NONE, Codec.GZIP, Codec.SNAPPY):
        logs.produce("k", 0, 8, codec=codec, seed=int(codec) * 10)
    logs.checkpoint()
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    args = [
        "--config",
        str(ROOT / "conf" / "pipeline.toml"),
        "--log-dirs",
        str(logs.root),
        "--lake",
        str(lake),
    ]
    killed = spark_submit(
        "ingest.py", args, env=env, failpoint="delta.before_commit", conf=_SHUFFLE
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    written = [p for p in (lake / "records").rglob("*.parquet")]
    assert written, "the killed run had written its data files"
    assert not DeltaTable.is_deltatable(str(lake / "records"))

    ok = spark_submit("ingest.py", args, env=env, conf=_SHUFFLE)
    assert ok.returncode == 0, ok.stderr[-3000:]
    summary = json.loads(ok.stdout.strip().splitlines()[-1])
    assert summary["records"] == len(logs.rows) == 24 and summary["committed"] is True
    # spark-submit merges the Python driver's stderr into its stdout
    assert "ingest summary: records=24" in ok.stdout + ok.stderr
    # every table of the ingest exists after a run, empty if nothing went there
    for table in ("quarantine", "diverged"):
        assert DeltaTable(str(lake / table)).file_uris() == [], table
    # Spark's INFO lines are off (conf/spark-defaults.conf spark.log.level): only the three
    # SparkContext prints before it applies the level remain; no traceback after success.
    info = [line for line in (ok.stdout + ok.stderr).splitlines() if " INFO " in line]
    assert len(info) <= 3, info
    assert "Traceback" not in ok.stdout + ok.stderr
    assert _records(lake) == sorted(logs.rows)
    # the killed run's files are on disk but in no snapshot
    live = {Path(u).resolve() for u in DeltaTable(str(lake / "records")).file_uris()}
    assert all(p.resolve() not in live for p in written)


def test_job_help_and_config_errors(tmp_path: Path) -> None:
    job = ROOT / "jobs" / "ingest.py"
    out = subprocess.run(
        [sys.executable, str(job), "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    for flag in ("--config", "--log-dirs", "--lake", "--fail-on-corrupt"):
        assert flag in out.stdout
    assert "exactly once" in out.stdout
    bad = subprocess.run(
        [sys.executable, str(job), "--config", str(tmp_path / "nope.toml")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 2 and "config file not found" in bad.stderr
    cfg = load_config(ROOT / "conf" / "pipeline.toml", log_dirs=["x"], lake="y")
    assert cfg.log_dirs == (str(Path("x").absolute()),) and cfg.lake == str(Path("y").absolute())
    assert cfg.compression == "snappy" and cfg.fail_on_corrupt is False
    for ingest, message in (
        ('verify = "full"', "verify is no longer used"),
        ('compression = "brotli9"', 'compression = "brotli9": expected one of snappy'),
    ):
        conf = tmp_path / "bad.toml"
        conf.write_text(f'[paths]\nlog_dirs = ["x"]\nlake = "y"\n[ingest]\n{ingest}\n')
        with pytest.raises(LoglakeError, match=message):
            load_config(conf)


def _break_records_keep_crc(log_file: Path, batch_index: int) -> int:
    """Make batch ``batch_index`` undecodable (first record has a negative length)
    while its CRC still matches (recomputed): only decoding can tell it is damaged."""
    from logstore.protocol.batch import compute_crc

    data = bytearray(log_file.read_bytes())
    position, header = list(iter_batches(data))[batch_index]
    data[position + 61] = 0x01  # zigzag varint -1: a negative record length
    crc = compute_crc(data, position, header.size)
    data[position + 17 : position + 21] = crc.to_bytes(4, "big")
    log_file.write_bytes(bytes(data))
    return position


def test_batch_with_valid_crc_but_undecodable_records_is_quarantined(
    spark: SparkSession, tmp_path: Path
) -> None:
    big = LogDir(tmp_path / "logs", segment_bytes=1 << 20)
    try:
        for i in range(3):
            big.produce("u", 0, 4, seed=10 * i + 1)  # seed 1: the first record has a key
        big.checkpoint()
    finally:
        big.close()
    seg = next((big.root / "u-0").glob("*.log"))
    position = _break_records_keep_crc(seg, 1)
    good = sorted(r for r in big.rows if not 4 <= r[2] < 8)
    lake = tmp_path / "lake"
    messages: list[str] = []
    s = run_ingest(spark, _config(big.root, lake), log=messages.append)
    assert (s.corrupt_batches, s.quarantined, s.records) == (1, 1, 8)
    assert s.progress == {app_id("u", 0): 12}
    assert any("1 damaged batches found" in m for m in messages)
    assert _records(lake) == good
    q = pl.read_delta(str(lake / "quarantine")).to_dicts()
    assert [(r["topic"], r["partition"], r["position"], r["crc_valid"]) for r in q] == [
        ("u", 0, position, True)
    ]
    assert "negative record length" in q[0]["error"]
    # the next run has nothing new: it does not decode what is below its progress again
    s2 = run_ingest(spark, _config(big.root, lake), log=_quiet)
    assert (s2.corrupt_batches, s2.quarantined, s2.records, s2.committed) == (0, 0, 0, False)
    assert pl.read_delta(str(lake / "quarantine")).height == 1
    assert _records(lake) == good


def test_undecodable_batch_with_fail_on_corrupt_keeps_progress(
    spark: SparkSession, tmp_path: Path
) -> None:
    from logstore.errors import CorruptRecordError

    big = LogDir(tmp_path / "logs", segment_bytes=1 << 20)
    try:
        for i in range(2):
            big.produce("v", 0, 4, seed=10 * i + 1)
        big.checkpoint()
    finally:
        big.close()
    _break_records_keep_crc(next((big.root / "v-0").glob("*.log")), 1)
    lake = tmp_path / "lake"
    with pytest.raises(CorruptRecordError, match="damaged"):
        run_ingest(spark, _config(big.root, lake, fail_on_corrupt=True), log=_quiet)
    assert read_progress(lake / "records") == {}
    assert pl.read_delta(str(lake / "quarantine")).height == 1


def test_records_table_equals_the_source_column_for_column(
    spark: SparkSession, tmp_path: Path, logs: LogDir
) -> None:
    """The direct pass (decode + write in the Python worker) lands what the source reads."""
    import re

    from pipelines.sources import RECORDS_SCHEMA, read_segments
    from pipelines.sources.plan import parse_options, plan_ranges

    for codec in (Codec.NONE, Codec.LZ4, Codec.ZSTD):
        for partition in (0, 1):
            for i in range(4):
                logs.produce("d", partition, 6, codec=codec, seed=int(codec) * 100 + i * 7)
    logs.checkpoint()
    lake = tmp_path / "lake"
    cfg = _config(logs.root, lake, max_partition_bytes=700, max_rows_per_file=5)
    s = run_ingest(spark, cfg, log=_quiet)
    assert s.records == len(logs.rows) == 144 and s.committed
    names = [f.name for f in RECORDS_SCHEMA.fields]
    table = DeltaTable(str(lake / "records")).to_pyarrow_table().select(names)
    source = read_segments(spark, str(logs.root), kind="records", maxPartitionBytes=700)
    expected = source.select(*names).toArrow()

    def key(r: dict[str, object]) -> tuple[object, ...]:
        return (r["topic"], r["partition"], r["offset"])

    assert sorted(table.to_pylist(), key=key) == sorted(expected.to_pylist(), key=key)
    # pieces of max_partition_bytes / 8 cut into tasks for the 2 cores; every task writes its
    # own files, split by topic and date
    ranges = plan_ranges(parse_options({"path": str(logs.root), "maxPartitionBytes": "87"}))
    packed = schedule_tasks(ranges, 2, 700, 87)
    assert len(packed) >= 2
    uris = DeltaTable(str(lake / "records")).file_uris()
    tasks = {int(m.group(1)) for u in uris if (m := re.search(r"/part-(\d{5})-", u))}
    assert tasks == set(range(len(packed)))
    assert all(re.search(r"/topic=d/date=\d{4}-\d{2}-\d{2}/part-", u) for u in uris)
    assert sum(pl.read_parquet(u).height for u in uris) == 144
    assert all(pl.read_parquet(u).height <= 5 for u in uris)


def test_fail_on_corrupt_leaves_no_data_files_then_a_normal_run_lands_the_rest(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The one pass writes files before it knows about damage: a refused run removes them."""
    from logstore.errors import CorruptRecordError

    big = LogDir(tmp_path / "logs", segment_bytes=1 << 20)
    try:
        for topic in ("w", "x"):
            for i in range(2):
                big.produce(topic, 0, 4, seed=10 * i + 1)
        big.checkpoint()
    finally:
        big.close()
    _break_records_keep_crc(next((big.root / "w-0").glob("*.log")), 1)
    lake = tmp_path / "lake"
    with pytest.raises(CorruptRecordError, match="damaged"):
        run_ingest(spark, _config(big.root, lake, fail_on_corrupt=True), log=_quiet)
    assert not list((lake / "records").rglob("*.parquet"))
    assert read_progress(lake / "records") == {}
    assert pl.read_delta(str(lake / "quarantine")).height == 1
    s = run_ingest(spark, _config(big.root, lake), log=_quiet)
    # the damaged batch is found again, but it is already in quarantine
    assert (s.corrupt_batches, s.quarantined, s.records) == (1, 0, 12)
    live = {Path(u).resolve() for u in DeltaTable(str(lake / "records")).file_uris()}
    on_disk = {p.resolve() for p in (lake / "records").rglob("*.parquet")}
    assert on_disk == live
    assert _records(lake) == sorted(r for r in big.rows if not (r[0] == "w" and r[2] >= 4))
