"""offset_lookup / time_lookup through Spark agree with the storage engine's own answers.

The same segments are asked through ``logstore.storage.log.Log`` (``.index`` lookups via
``read`` and ListOffsets via ``offset_for_timestamp``) and through the lookup tables.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from logstore.protocol.batch import Codec
from logstore.protocol.records import build_batch
from logstore.storage.config import LogConfig
from logstore.storage.files import partition_dir
from logstore.storage.log import Log
from pipelines.lookups import (
    build_offset_lookup,
    build_time_lookup,
    check_index_files,
    check_indexes,
    locate,
    offsets_for_times,
)
from pipelines.sources import read_segments
from pipelines.sources.synthetic import write_batches

pytestmark = pytest.mark.integration
BASE_TS = 1_700_000_000_000
SEGMENT_BYTES = 12_000


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = random.Random(7)
    d = tmp_path_factory.mktemp("lookups") / "logs"
    for partition in range(2):
        batches = []
        for b in range(120):
            # Timestamps jump around inside and across batches (CreateTime is the producer's).
            recs = [
                (
                    b"k%d" % i,
                    b"x" * rng.randint(0, 200),
                    [],
                    BASE_TS + b * 1000 + rng.randint(-1500, 1500),
                )
                for i in range(rng.randint(1, 12))
            ]
            batches.append(build_batch(recs, codec=Codec.LZ4 if b % 2 else Codec.NONE))
        write_batches(d, "clicks", partition, batches, segment_bytes=SEGMENT_BYTES,
                      index_interval_bytes=1024)  # fmt: skip
    return d


def open_log(log_dir: Path, partition: int) -> Log:
    config = LogConfig(segment_bytes=SEGMENT_BYTES, index_interval_bytes=1024)
    return Log.open(partition_dir(log_dir, "clicks", partition), config, clean_shutdown=True)


@pytest.fixture(scope="module")
def lookups(spark: Any, log_dir: Path) -> tuple[Any, Any, Any]:
    batches = read_segments(spark, str(log_dir), kind="batches").cache()
    return batches, build_offset_lookup(batches).cache(), build_time_lookup(batches).cache()


def test_locate_agrees_with_log_read(log_dir: Path, lookups: tuple[Any, Any, Any]) -> None:
    _, offset_lookup, _ = lookups
    for partition in range(2):
        log = open_log(log_dir, partition)
        try:
            assert len(log.segments) > 2
            end = log.log_end_offset
            for offset in [
                0,
                end // 2,
                end - 1,
                *random.Random(partition).sample(range(1, end - 1), 3),
            ]:
                fetched = log.read(offset, 1)
                loc = locate(offset_lookup, "clicks", partition, offset)
                assert loc is not None
                assert (loc.file, loc.position) == (str(fetched.path), fetched.position)
                assert loc.first_offset <= offset <= loc.last_offset
            assert locate(offset_lookup, "clicks", partition, end) is None
        finally:
            log.close()


def test_offsets_for_times_agree_with_list_offsets(
    log_dir: Path, lookups: tuple[Any, Any, Any]
) -> None:
    _, _, time_lookup = lookups
    rng = random.Random(3)
    probes = [BASE_TS - 10_000, BASE_TS, BASE_TS + 60_000, BASE_TS + 200_000]
    probes += [BASE_TS + rng.randint(0, 120_000) for _ in range(3)]
    logs = [open_log(log_dir, p) for p in range(2)]
    try:
        answers = []
        for ts in probes:
            got = offsets_for_times(time_lookup, "clicks", ts)
            assert got == {p: logs[p].offset_for_timestamp(ts) for p in range(2)}
            answers.append(got)
        assert (
            answers[0] == {0: answers[0][0], 1: answers[0][1]} and None not in answers[0].values()
        )
        assert answers[3] == {0: None, 1: None}  # later than every record
    finally:
        for log in logs:
            log.close()


def test_index_files_agree_with_data(
    spark: Any, tmp_path: Path, log_dir: Path, lookups: tuple[Any, Any, Any]
) -> None:
    batches, _, _ = lookups
    assert check_indexes(batches) == []
    assert check_index_files(spark, [str(log_dir)]) == []  # the job's path: plain Spark tasks
    # Damage one .index entry of a copy: the check names the file and the entry.
    copy = tmp_path / "logs"
    shutil.copytree(log_dir, copy)
    index = sorted((copy / "clicks-0").glob("*.index"))[0]
    raw = np.fromfile(index, dtype=">i4")
    assert raw.size >= 4
    raw[3] += 5  # entry 1's position no longer a batch start
    raw.tofile(index)
    problems = check_indexes(read_segments(spark, str(copy), kind="batches"))
    assert [(Path(p.file).with_suffix(".index"), p.kind, p.entry) for p in problems] == [
        (index, "index", 1)
    ]
    assert problems[0].problem == "position is not a batch start"
    assert check_index_files(spark, [str(copy)]) == problems
    assert check_index_files(spark, [str(copy)], topics=["other"]) == []
