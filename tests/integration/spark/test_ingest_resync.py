"""Ingest over a segment with a corrupt batchLength in the middle (real Spark, real Delta).

Records are appended through the storage engine (``logstore.storage.Log``, as the broker
does), then one batch's length is overwritten on disk with an impossible value. Ingest must
read every sound batch after it, quarantine the unreadable bytes (file, position, size), say
which offsets and bytes it skipped, move progress past them, and neither duplicate nor
re-quarantine on later runs; ``--fail-on-corrupt`` exits 3 with nothing committed. Tables are
read back with deltalake and polars.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from jobs.ingest import main as ingest_main
from logstore.protocol.batch import Codec, iter_batches
from logstore.protocol.records import build_batch
from logstore.storage.checkpoints import write_offset_checkpoint
from logstore.storage.config import LogConfig
from logstore.storage.log import Log
from pipelines.ingest import IngestConfig, read_progress, run_ingest, schedule_tasks
from pipelines.sources.plan import parse_options, plan_ranges
from pipelines.sources.synthetic import write_high_watermarks, write_partition

pytestmark = pytest.mark.integration

BASE_MS = 1_714_600_000_000
BIG = 0x7FFFFFF0
CODECS = [Codec.NONE, Codec.LZ4, Codec.ZSTD, Codec.SNAPPY, Codec.GZIP]


def _items(seed: int, n: int) -> list[Any]:
    return [
        (f"k{seed + i}".encode(), bytes([(seed + i) % 256]) * ((seed + i) % 70), (), BASE_MS + i)
        for i in range(n)
    ]


def _produce(log: Log, batches: int, per_batch: int, first: int) -> list[tuple[int, bytes]]:
    """Append ``batches`` batches; returns ``(offset, key)`` of every record."""
    out = []
    for b in range(batches):
        seed = first + b * per_batch
        items = _items(seed, per_batch)
        info = log.append(build_batch(items, codec=CODECS[b % len(CODECS)]))
        out.extend((info.first_offset + i, it[0]) for i, it in enumerate(items))
    log.high_watermark = log.log_end_offset
    log.flush()
    return out


def _checkpoint(root: Path, log: Log, tp: tuple[str, int]) -> None:
    write_offset_checkpoint(root / "replication-offset-checkpoint", {tp: log.high_watermark})
    write_offset_checkpoint(root / "log-start-offset-checkpoint", {tp: log.log_start_offset})


def _set_length(seg: Path, position: int, length: int) -> None:
    with seg.open("r+b") as f:
        f.seek(position + 8)
        f.write(length.to_bytes(4, "big"))


def _lake_records(lake: Path) -> list[tuple[int, bytes]]:
    table = DeltaTable(str(lake / "records")).to_pyarrow_table(columns=["offset", "key"])
    rows = sorted(zip(table["offset"].to_pylist(), table["key"].to_pylist(), strict=True))
    polars = pl.read_delta(str(lake / "records")).select("offset", "key").sort("offset")
    assert rows == list(polars.iter_rows())
    return rows


def _quiet(_msg: str) -> None:
    pass


def _config(log_dir: Path, lake: Path, **kw: Any) -> IngestConfig:
    return IngestConfig(log_dirs=(str(log_dir),), lake=str(lake), progress_interval_s=0, **kw)


def test_corrupt_length_mid_segment_skips_only_that_batch(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, lake = tmp_path / "logs", tmp_path / "lake"
    tp = ("c", 0)
    log = Log.open(root / "c-0", LogConfig(segment_bytes=1 << 20, index_interval_bytes=1024))
    try:
        rows = _produce(log, 40, 25, 0)
        _checkpoint(root, log, tp)
        (seg,) = (root / "c-0").glob("*.log")
        frames = list(iter_batches(seg.read_bytes()))
        position, victim = frames[13]
        assert victim.codec is not Codec.NONE  # a compressed batch's length
        _set_length(seg, position, BIG)
        lost = range(victim.base_offset, victim.next_offset)
        good = [r for r in rows if r[0] not in lost]

        conf = tmp_path / "pipeline.toml"
        conf.write_text(f'[paths]\nlog_dirs = ["{root}"]\nlake = "{lake}"\n')
        # --fail-on-corrupt: exit 3, the damage quarantined, nothing committed
        assert ingest_main(["--config", str(conf), "--fail-on-corrupt"]) == 3
        assert "2147483632" in capsys.readouterr().err
        assert read_progress(lake / "records") == {}
        assert not list((lake / "records").rglob("*.parquet"))
        assert pl.read_delta(str(lake / "quarantine")).height == 1

        # a normal run: every sound batch after the damage, and a summary that says so
        assert ingest_main(["--config", str(conf)]) == 0
        out, err = capsys.readouterr()
        summary = json.loads(out.strip().splitlines()[-1])
        assert (summary["records"], summary["corrupt_batches"]) == (len(good), 1)
        assert (summary["skipped_offsets"], summary["skipped_bytes"]) == (25, victim.size)
        assert summary["skipped"] == [
            {
                "topic": "c",
                "partition": 0,
                "file": str(seg.resolve()),
                "position": position,
                "bytes": victim.size,
                "from_offset": victim.base_offset,
                "to_offset": victim.next_offset,
                "batches": 1,
                "error": summary["skipped"][0]["error"],
            }
        ]
        assert "SKIPPED c/0: offsets [325, 350) (25 offsets)" in err
        assert "skipped_offsets=25" in err
        assert _lake_records(lake) == good
        assert read_progress(lake / "records") == {tp: 1000}
        q = pl.read_delta(str(lake / "quarantine")).to_dicts()
        assert [(r["file"], r["position"], r["size"]) for r in q] == [
            (str(seg.resolve()), position, victim.size)
        ]
        assert "impossible batchLength 2147483632" in q[0]["error"]

        # a re-run is a no-op
        s = run_ingest(spark, _config(root, lake), log=_quiet)
        assert (s.records, s.committed, s.quarantined, s.corrupt_batches, s.skipped) == (
            0, False, 0, 0, [],
        )  # fmt: skip
        # new records in the same (damaged) active segment: it is read again, the damage
        # below progress is neither counted nor quarantined again, nothing is duplicated
        more = _produce(log, 3, 25, 5000)
        _checkpoint(root, log, tp)
        s = run_ingest(spark, _config(root, lake), log=_quiet)
        assert (s.records, s.quarantined, s.corrupt_batches, s.skipped) == (75, 0, 0, [])
        assert _lake_records(lake) == good + more
        assert pl.read_delta(str(lake / "quarantine")).height == 1
    finally:
        log.close()


def test_damage_across_tasks_and_a_torn_tail(spark: SparkSession, tmp_path: Path) -> None:
    """Many small tasks (ranges cut at .index entries): damage where a range starts, damage
    running from one range into the next, and a torn last batch below the high watermark."""
    root, lake = tmp_path / "logs", tmp_path / "lake"
    records = [(f"k{i}".encode(), bytes(i % 50), [], BASE_MS + i) for i in range(3000)]
    end = write_partition(
        root, "d", 0, records, batch_records=20, codecs=CODECS, index_interval_bytes=512
    )
    write_high_watermarks(root, {("d", 0): end})
    (seg,) = (root / "d-0").glob("*.log")
    frames = [(p, h.size, h.base_offset, h.next_offset) for p, h in iter_batches(seg.read_bytes())]
    last = frames[-1]
    with seg.open("r+b") as f:
        f.truncate(last[0] + last[1] - 7)  # the last batch torn, its offsets below the HW
    # The tasks run_ingest will cut (its planning: pieces of an eighth of max_partition_bytes)
    cfg = _config(root, lake, max_partition_bytes=8_000)
    ranges = plan_ranges(
        parse_options({"path": str(root), "maxPartitionBytes": "1000", "startingOffsets": "{}"})
    )
    tasks = schedule_tasks(ranges, spark.sparkContext.defaultParallelism, 8_000, 1_000)
    starts = [t[0].start for t in tasks if t[0].start > 0]
    assert len(starts) >= 4
    where = {f[0]: i for i, f in enumerate(frames)}
    a, b = where[starts[0]], where[starts[2]]
    _set_length(seg, frames[a][0], BIG)  # a task starts on it
    _set_length(seg, frames[b - 1][0], BIG)  # a run from the end of one task ...
    _set_length(seg, frames[b][0], BIG)  # ... into the next
    lost = [(frames[a][2], frames[a][3]), (frames[b - 1][2], frames[b][3]), (last[2], last[3])]

    s = run_ingest(spark, cfg, log=_quiet)
    expected = [(o, f"k{o}".encode()) for o in range(3000) if not any(x <= o < y for x, y in lost)]
    assert _lake_records(lake) == expected
    assert [(k.position, k.from_offset, k.to_offset) for k in s.skipped] == [
        (frames[a][0], *lost[0]),
        (frames[b - 1][0], *lost[1]),
        (last[0], *lost[2]),
    ]
    assert s.skipped_offsets == sum(y - x for x, y in lost) == 80
    assert s.skipped_bytes == frames[a][1] + frames[b - 1][1] + frames[b][1] + last[1] - 7
    assert read_progress(lake / "records") == {("d", 0): end}
    q = pl.read_delta(str(lake / "quarantine")).sort("position")
    assert q.select("position", "size").rows() == [
        (frames[a][0], frames[a][1]),
        (frames[b - 1][0], frames[b - 1][1]),
        (frames[b][0], frames[b][1]),
        (last[0], last[1] - 7),
    ]
    again = run_ingest(spark, cfg, log=_quiet)
    assert (again.records, again.committed, again.quarantined, again.skipped) == (0, False, 0, [])
