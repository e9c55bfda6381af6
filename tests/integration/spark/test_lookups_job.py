"""jobs/build_lookups.py: Delta tables written, read back with deltalake, incremental re-runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from logstore.protocol.records import build_batch
from pipelines.decode.reference import reference_decode
from pipelines.lookups import LOOKUP_SCHEMAS, build_lookups, build_offset_lookup, build_time_lookup
from pipelines.sources import read_segments
from pipelines.sources.synthetic import write_batches, write_high_watermarks
from tests.fixtures.jobs import load_job

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]


def batches(start: int, n: int) -> list[bytearray]:
    return [
        build_batch([(b"k", b"v" * i, [], 1_700_000_000_000 + (start + i) * 10) for i in range(3)])
        for _ in range(n)
    ]


def expected_rows(log_dir: Path) -> list[tuple[str, int, int, int, int]]:
    out = []
    for part in sorted(log_dir.glob("*-*")):
        topic, _, p = part.name.rpartition("-")
        for seg in sorted(part.glob("*.log")):
            data = seg.read_bytes()
            rows, _, _ = reference_decode(data)
            positions = sorted({r["batch_position"] for r in rows})
            for pos in positions:
                offs = [r["offset"] for r in rows if r["batch_position"] == pos]
                out.append((topic, int(p), pos, min(offs), max(offs)))
    return sorted(out)


def test_build_lookups_job_is_incremental(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log_dir, lake = tmp_path / "logs", tmp_path / "lake"
    write_batches(log_dir, "a", 0, batches(0, 30), segment_bytes=2000, index_interval_bytes=200)
    write_batches(log_dir, "b", 3, batches(0, 5))
    config = tmp_path / "pipeline.toml"
    config.write_text(f'[paths]\nlog_dirs = ["{log_dir}"]\nlake = "{lake}"\n')
    job = load_job("build_lookups")

    assert job.main(["--config", str(config)]) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first["rows"] == {"offset_lookup": 35, "time_lookup": 35}
    assert first["index_problems"] == 0
    table = DeltaTable(str(lake / "offset_lookup")).to_pyarrow_table()
    got = sorted(
        zip(
            *(
                table.column(c).to_pylist()
                for c in ["topic", "partition", "position", "first_offset", "last_offset"]
            ),
            strict=True,
        )
    )
    assert got == expected_rows(log_dir)

    assert job.main(["--config", str(config)]) == 0  # nothing new: no-op
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["rows"] == {"offset_lookup": 0, "time_lookup": 0}

    write_batches(log_dir, "a", 0, batches(100, 4), segment_bytes=2000, index_interval_bytes=200)
    assert job.main(["--config", str(config)]) == 0
    third = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert third["rows"] == {"offset_lookup": 4, "time_lookup": 4}
    assert third["progress"]["offset_lookup"] == {"offset_lookup:a-0": 102}
    times = DeltaTable(str(lake / "time_lookup")).to_pyarrow_table()
    assert times.num_rows == 39
    assert sorted(times.column("first_offset").to_pylist()) == sorted(
        [r[3] for r in expected_rows(log_dir)]
    )


def _columns(table: Any, names: list[str]) -> list[tuple[Any, ...]]:
    return sorted(zip(*(table.column(c).to_pylist() for c in names), strict=True))


def test_tables_written_through_the_data_source_sink_keep_working(
    spark: Any, tmp_path: Path
) -> None:
    """Tables of earlier releases (logsegments source -> Delta sink, same app ids) take the
    direct tasks' appends: same schema and partitioning, progress continues, no duplicates."""
    log_dir, lake = tmp_path / "logs", tmp_path / "lake"
    write_batches(log_dir, "a", 0, batches(0, 12), segment_bytes=1500, index_interval_bytes=200)
    write_batches(log_dir, "b", 1, batches(0, 4))
    # the earlier release's run, stopped at offset 15 of a-0 (b-1 all of it)
    old = read_segments(spark, str(log_dir), kind="batches", until={"a": {0: 15}})
    for table, build in (
        ("offset_lookup", build_offset_lookup),
        ("time_lookup", build_time_lookup),
    ):
        df = build(old)
        ends = df.groupBy("topic", "partition").agg({"last_offset": "max"}).collect()
        apps = {f"{table}:{r[0]}-{r[1]}": int(r[2]) + 1 for r in ends}
        assert apps == {f"{table}:a-0": 15, f"{table}:b-1": 12}
        write_deltalake(
            str(lake / table),
            df.toArrow().cast(LOOKUP_SCHEMAS[table]),
            partition_by=["topic"],
            commit_properties=CommitProperties(
                app_transactions=[Transaction(app, v) for app, v in apps.items()]
            ),
        )
    before = {t: DeltaTable(str(lake / t)) for t in ("offset_lookup", "time_lookup")}

    summary = build_lookups(spark, log_dirs=[str(log_dir)], lake=str(lake))
    assert summary.rows == {"offset_lookup": 7, "time_lookup": 7}  # 12 batches of a-0, 5 done
    assert summary.progress["offset_lookup"] == {"offset_lookup:a-0": 36}
    assert summary.index_problems == []
    for table, dt_before in before.items():
        dt = DeltaTable(str(lake / table))
        assert dt.version() == dt_before.version() + 1
        assert dt.schema().to_arrow().names == dt_before.schema().to_arrow().names
        assert dt.schema().to_arrow().names == LOOKUP_SCHEMAS[table].names
        assert dt.metadata().partition_columns == ["topic"]
        got = dt.to_pyarrow_table()
        rows = _columns(got, ["topic", "partition", "position", "first_offset", "last_offset"])
        assert rows == expected_rows(log_dir)  # every batch exactly once
        assert dt.transaction_version(f"{table}:a-0") == 36
        assert dt.transaction_version(f"{table}:b-1") == 12
    # the same rows, column for column, as the data source path gives for the whole log
    new = DeltaTable(str(lake / "offset_lookup")).to_pyarrow_table()
    reference = build_offset_lookup(read_segments(spark, str(log_dir), kind="batches"))
    ref = reference.toArrow()
    names = LOOKUP_SCHEMAS["offset_lookup"].names
    assert _columns(new, names) == _columns(ref, names)


def _spark_submit(job: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    site = Path(sys.executable).parent.parent / "lib" / "python3.11" / "site-packages"
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    cmd = [
        str(site / "pyspark" / "bin" / "spark-submit"),
        "--properties-file",
        str(ROOT / "conf" / "spark-defaults.conf"),
        "--master",
        "local[2]",
        "--conf",
        "spark.ui.enabled=false",
        str(ROOT / "jobs" / job),
        *args,
    ]
    return subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=600, start_new_session=True,
        check=False,
    )  # fmt: skip


def test_spark_submit_jobs_print_no_traceback_after_success(tmp_path: Path) -> None:
    """The ingest and lookups jobs as users run them: exit 0, their summaries, and on the
    console neither a traceback (Spark's Python workers) nor Spark's INFO lines nor warnings
    of loglake's own making."""
    log_dir, lake = tmp_path / "logs", tmp_path / "lake"
    _, end_a = write_batches(
        log_dir, "a", 0, batches(0, 20), segment_bytes=1500, index_interval_bytes=200
    )
    _, end_b = write_batches(log_dir, "b", 2, batches(0, 3))
    write_high_watermarks(log_dir, {("a", 0): end_a, ("b", 2): end_b})
    args = ["--config", str(ROOT / "conf" / "pipeline.toml"), "--log-dirs", str(log_dir),
            "--lake", str(lake)]  # fmt: skip
    outputs = {}
    for job in ("ingest.py", "build_lookups.py"):
        done = _spark_submit(job, args)
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-3000:]
        outputs[job] = (json.loads(done.stdout.strip().splitlines()[-1]), out)
    ingest, _ = outputs["ingest.py"]
    assert ingest["records"] == 3 * (20 + 3) and ingest["committed"] is True
    lookups, _ = outputs["build_lookups.py"]
    assert lookups["rows"] == {"offset_lookup": 23, "time_lookup": 23}
    assert lookups["index_problems"] == 0
    table = DeltaTable(str(lake / "time_lookup")).to_pyarrow_table()
    rows = _columns(table, ["topic", "partition", "position", "first_offset", "last_offset"])
    assert rows == expected_rows(log_dir)
    for job, (_, out) in outputs.items():
        assert "Traceback" not in out, (job, out[-3000:])
        # only the three lines SparkContext prints before it applies spark.log.level
        info = [line for line in out.splitlines() if " INFO " in line]
        assert len(info) <= 3, (job, info)
        assert "DataSourceManager" not in out, (job, out[-3000:])


def test_internal_topics_are_indexed_only_when_named(spark: Any, tmp_path: Path) -> None:
    """As ingest: ``__consumer_offsets`` (groups' and ingest's own lake-group commits, written
    on every run) would otherwise change the lookups on runs that brought no new data."""
    log_dir = tmp_path / "logs"
    write_batches(log_dir, "a", 0, batches(0, 3))
    write_batches(log_dir, "__consumer_offsets", 7, batches(0, 2))
    lake = tmp_path / "lake"
    summary = build_lookups(spark, log_dirs=[str(log_dir)], lake=str(lake), check=False)
    assert summary.rows == {"offset_lookup": 3, "time_lookup": 3}
    got = DeltaTable(str(lake / "offset_lookup")).to_pyarrow_table()
    assert set(got.column("topic").to_pylist()) == {"a"}
    # a new commit in the internal topic: nothing to add
    write_batches(log_dir, "__consumer_offsets", 7, batches(2, 1))
    again = build_lookups(spark, log_dirs=[str(log_dir)], lake=str(lake), check=False)
    assert again.rows == {"offset_lookup": 0, "time_lookup": 0}
    named = tmp_path / "named"
    only = build_lookups(
        spark, log_dirs=[str(log_dir)], lake=str(named), topics=["__consumer_offsets"], check=False
    )
    assert only.rows == {"offset_lookup": 3, "time_lookup": 3}
    got = DeltaTable(str(named / "offset_lookup")).to_pyarrow_table()
    assert set(got.column("topic").to_pylist()) == {"__consumer_offsets"}


def test_index_files_that_disagree_with_the_log_exit_6(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through the job runner: a broker .index entry that points inside a batch is listed on
    stderr and the job exits 6 (EXIT_INDEX_MISMATCH, not retried); the tables are written."""
    log_dir, lake = tmp_path / "logs", tmp_path / "lake"
    write_batches(log_dir, "a", 0, batches(0, 10), index_interval_bytes=200)
    index = log_dir / "a-0" / "00000000000000000000.index"
    entry = bytearray(index.read_bytes()[:8])
    assert len(entry) == 8 and int.from_bytes(entry[4:], "big") > 0
    entry[4:] = (int.from_bytes(entry[4:], "big") + 1).to_bytes(4, "big")
    with index.open("r+b") as fh:
        fh.write(entry)
    config = tmp_path / "pipeline.toml"
    config.write_text(f'[paths]\nlog_dirs = ["{log_dir}"]\nlake = "{lake}"\n')

    assert load_job("build_lookups").main(["--config", str(config)]) == 6
    out, err = capsys.readouterr()
    assert "index entry 0" in err and "position is not a batch start" in err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["index_problems"] == 1 and summary["rows"]["offset_lookup"] == 10
    assert DeltaTable(str(lake / "offset_lookup")).version() == 0
