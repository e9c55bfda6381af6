"""The broker's own retention racing every job: nothing acknowledged is lost to the lake.

A real broker with size retention checked every second (``retention.bytes`` 256 KiB, 64 KiB
segments) and ``log.retention.lake.group`` set; a confluent-kafka producer (acks=all) running
throughout (:class:`tests.fixtures.traffic.Traffic`); ``jobs/ingest.py`` and
``jobs/build_lookups.py`` (their ``main``, in the shared Spark session) each run over and over
in its own thread, overlapping as the two DAGs' tasks do, while retention deletes segments
under them. Produce starts before the first ingest, so the partitions have no lake offset yet
and are held from their log start. Afterwards the ``records`` table, read back with delta-rs,
holds every acknowledged record exactly once, byte for byte; no run reported a gap, every run
exited 0, and retention did delete (what the lake had) meanwhile.
"""

from __future__ import annotations

import json
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from logstore.storage.checkpoints import read_offset_checkpoint
from tests.fixtures.broker import wait_for
from tests.fixtures.jobs import load_job
from tests.fixtures.traffic import Traffic

pytestmark = pytest.mark.integration

GROUP = "loglake-ingest"
TOPIC = "race"
PARTITIONS = 2
SEGMENT_BYTES = 64 << 10
RETENTION_BYTES = 256 << 10
RACE_SECONDS = 30


def _bases(log_dir: Path, partition: int) -> list[int]:
    return sorted(int(p.stem) for p in (log_dir / f"{TOPIC}-{partition}").glob("*.log"))


def _log_bytes(log_dir: Path, partition: int) -> int:
    return sum(f.stat().st_size for f in (log_dir / f"{TOPIC}-{partition}").glob("*.log"))


def _high_watermarks_reach(log_dir: Path, ends: dict[int, int]) -> bool:
    path = log_dir / "replication-offset-checkpoint"
    if not path.exists():
        return False
    hw = read_offset_checkpoint(path)
    return all(hw.get((TOPIC, p), -1) >= end for p, end in ends.items())


def _loop(
    job: Any, argv: list[str], stop: threading.Event, codes: list[int], raised: list[str]
) -> None:
    """Run ``job.main(argv)`` back to back until ``stop``; every exit code in ``codes``.

    A raise is a failed run too: -1 in ``codes`` and its traceback in ``raised``, which the
    assertions show (stderr's tail would hold the later runs' output, not the raise).
    """
    while not stop.is_set():
        try:
            codes.append(job.main(argv))
        except BaseException:
            codes.append(-1)
            raised.append(traceback.format_exc()[-4000:])


def test_every_acknowledged_record_reaches_the_lake_once_while_retention_races(
    spark: SparkSession, tmp_path: Path, broker_factory: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    b = broker_factory(
        **{
            "log.retention.check.interval.ms": "1000",
            "log.segment.delete.delay.ms": "0",
            "replica.high.watermark.checkpoint.interval.ms": "200",
            "log.flush.start.offset.checkpoint.interval.ms": "200",
            "log.retention.lake.group": GROUP,
        }
    )
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    configs = {"segment.bytes": str(SEGMENT_BYTES), "retention.bytes": str(RETENTION_BYTES)}
    new = NewTopic(TOPIC, num_partitions=PARTITIONS, replication_factor=1, config=configs)
    admin.create_topics([new])[TOPIC].result(timeout=30)
    lake = tmp_path / "lake"
    config = tmp_path / "pipeline.toml"
    config.write_text(
        f'[paths]\nlog_dirs = ["{b.log_dir}"]\nlake = "{lake}"\n'
        f'[ingest]\ntopics = ["{TOPIC}"]\nbootstrap_servers = "{b.bootstrap}"\n'
        f'lake_group = "{GROUP}"\nprogress_interval_s = 0\n'
    )
    argv = ["--config", str(config)]
    ingest, lookups = load_job("ingest"), load_job("build_lookups")
    codes: dict[str, list[int]] = {"ingest": [], "build_lookups": []}
    raised: list[str] = []
    stop = threading.Event()
    with Traffic(b.bootstrap, TOPIC, partitions=PARTITIONS, produce_interval_s=0.001) as bg:
        # 1. no lake offset yet: well past retention.bytes, nothing is deleted
        wait_for(lambda: all(len(_bases(b.log_dir, p)) >= 7 for p in range(PARTITIONS)), seconds=90)
        time.sleep(2.5)  # two more retention checks
        assert all(_bases(b.log_dir, p)[0] == 0 for p in range(PARTITIONS))
        # 2. both jobs again and again, overlapping, while retention deletes what the lake has
        threads = [
            threading.Thread(target=_loop, args=(ingest, argv, stop, codes["ingest"], raised)),
            threading.Thread(
                target=_loop, args=(lookups, argv, stop, codes["build_lookups"], raised)
            ),
        ]
        for t in threads:
            t.start()
        time.sleep(RACE_SECONDS)
        stop.set()
        for t in threads:
            t.join(300)
    produce_errors = [e for e in bg.errors if e.startswith("produce")]
    assert not produce_errors, produce_errors[:5]
    acked = dict(bg.acked)
    ends = {p: 1 + max(o for q, o in acked if q == p) for p in range(PARTITIONS)}
    wait_for(lambda: _high_watermarks_reach(b.log_dir, ends))
    # 3. one last run of each, after the producer stopped
    assert ingest.main(argv) == 0
    assert lookups.main(argv) == 0
    out, err = capfd.readouterr()
    replans = err.count("planning again")
    print(
        f"acked {len(acked)} records; runs: ingest {len(codes['ingest'])}, build_lookups "
        f"{len(codes['build_lookups'])}; re-planned attempts {replans}; log starts "
        f"{[_bases(b.log_dir, p)[0] for p in range(PARTITIONS)]}"
    )
    assert not raised, "\n".join(raised)
    assert codes["ingest"] and set(codes["ingest"]) == {0}, (codes, err[-3000:])
    problems = [line for line in err.splitlines() if " entry " in line]
    assert codes["build_lookups"] and set(codes["build_lookups"]) == {0}, (codes, problems[:20])
    assert "GAP " not in err and "the lake has not ingested" not in b.log_text()
    summaries = [json.loads(line) for line in out.splitlines() if line.startswith('{"records"')]
    assert summaries and all(s["gaps"] == [] for s in summaries)

    # every acknowledged record exactly once, byte for byte (read back with delta-rs)
    rows = DeltaTable(str(lake / "records")).to_pyarrow_table(
        columns=["topic", "partition", "offset", "value"]
    )
    keys = list(
        zip(rows.column("partition").to_pylist(), rows.column("offset").to_pylist(), strict=True)
    )
    assert set(rows.column("topic").to_pylist()) == {TOPIC}
    dupes = [k for k, n in Counter(keys).items() if n > 1]
    assert not dupes, dupes[:10]
    assert dict(zip(keys, rows.column("value").to_pylist(), strict=True)) == acked
    # retention ran under the jobs (the logs start past 0) and, the lake having everything,
    # brings every log back to retention.bytes (Kafka's rule leaves up to a segment more)
    assert all(_bases(b.log_dir, p)[0] > 0 for p in range(PARTITIONS))
    wait_for(
        lambda: all(
            _log_bytes(b.log_dir, p) <= RETENTION_BYTES + SEGMENT_BYTES for p in range(PARTITIONS)
        )
    )
    # lookups: no batch twice, and caught up to the end of each partition
    offsets = DeltaTable(str(lake / "offset_lookup")).to_pyarrow_table(
        columns=["topic", "partition", "first_offset", "last_offset"]
    )
    batches = list(
        zip(
            offsets.column("partition").to_pylist(),
            offsets.column("first_offset").to_pylist(),
            strict=True,
        )
    )
    assert len(batches) == len(set(batches))
    last: dict[int, int] = {}
    for p, o in zip(
        offsets.column("partition").to_pylist(),
        offsets.column("last_offset").to_pylist(),
        strict=True,
    ):
        last[p] = max(last.get(p, o), o)
    assert last == {p: ends[p] - 1 for p in range(PARTITIONS)}
