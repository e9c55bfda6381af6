"""``pipelines.logdir``: the jobs' read-only view of a log dir, on a log dir the broker's own
storage wrote (``LogManager``: real segments, indexes and checkpoints), with the strays a
broker's directory holds next to it (Kafka's ``-delete``/``-future`` directories, files that
look like partitions, ``.deleted``/``.cleaned``/``.swap`` leftovers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from logstore.errors import InvalidTopicError, LoglakeError
from logstore.protocol.records import build_batch
from logstore.storage.config import LogConfig
from logstore.storage.log_manager import LogManager
from pipelines.logdir import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    LogDirNotFoundError,
    PartitionDir,
    as_partition_dir,
    log_segments,
    log_start_offset,
    merged_checkpoint,
    partition_dirs,
    read_checkpoint,
    segment_bases,
)

# a topic with dashes and dots, partition numbers that sort differently as text ("a-10" <
# "a-2") and as numbers
PARTITIONS = [("a", 0), ("a", 2), ("a", 10), ("my-topic.v1", 0), ("b", 1)]


def _broker_dirs(
    tmp_path: Path,
) -> tuple[list[Path], dict[tuple[str, int], tuple[int, ...]], dict[tuple[str, int], Path]]:
    # the log dir of each partition is the LogManager's choice: log_dir_of says which
    """Two log dirs written by the broker's LogManager: small segments, some records deleted
    (DeleteRecords) and a high watermark; checkpoints written at shutdown. Returns the dirs
    and, per partition, what the broker's own Log says: (log start, high watermark, log end
    offset: the recovery point after a clean shutdown, segment bases...) and which log dir
    holds it."""
    dirs = [tmp_path / "d0", tmp_path / "d1"]
    config = LogConfig.from_properties({"segment.bytes": "300"})
    mgr = LogManager(dirs, default_config=config, background=False)
    truth: dict[tuple[str, int], tuple[int, ...]] = {}
    where: dict[tuple[str, int], Path] = {}
    for i, (topic, partition) in enumerate(PARTITIONS):
        log = mgr.get_or_create_log(topic, partition, config)
        for n in range(8 + i):
            log.append(bytearray(build_batch([(b"k", bytes(100))], base_timestamp=1000 + n)))
        log.high_watermark = log.log_end_offset - 1
        if i % 2 == 0:
            log.delete_records(3)
    mgr.flush_dirty_logs()
    for log in mgr.all_logs():
        tp = (log.topic, log.partition)
        bases = tuple(s.base_offset for s in log.segments)
        truth[tp] = (log.log_start_offset, log.high_watermark, log.log_end_offset, *bases)
        found = mgr.log_dir_of(*tp)
        assert found is not None
        where[tp] = found
    assert mgr.shutdown()
    return dirs, truth, where


def _strays(d: Path, part: Path | None) -> None:
    (d / "a-0.0123456789abcdef-delete").mkdir()  # Kafka's directory of a deleted partition
    (d / "a-3-future").mkdir()
    (d / "a-01").mkdir()  # not a partition number as Kafka writes it
    (d / "-0").mkdir()  # no topic
    (d / "lost+found").mkdir()
    (d / "c-0").write_bytes(b"")  # a file, not a directory
    if part is None:
        return
    for name in ("00000000000000000000.log.deleted", "00000000000000000999.log.cleaned"):
        (part / name).write_bytes(b"")
    (part / "00000000000000000998.log.swap").write_bytes(b"")
    (part / "0000000000000000099.log").write_bytes(b"")  # 19 digits
    (part / "00000000000000000997.log.tmp").write_bytes(b"")


def test_partitions_segments_and_checkpoints_as_the_broker_wrote_them(tmp_path: Path) -> None:
    dirs, truth, where = _broker_dirs(tmp_path)
    for d in dirs:
        _strays(d, d / "a-0" if where["a", 0] == d else None)

    parts = [p for d in dirs for p in partition_dirs(d)]
    assert sorted(p.tp for p in parts) == sorted(PARTITIONS)
    for d in dirs:
        listed = partition_dirs(d)
        assert [p.tp for p in listed] == sorted(tp for tp in PARTITIONS if where[tp] == d)
        assert all(p.path == d / f"{p.topic}-{p.partition}" for p in listed)
        a_only = sorted(tp for tp in PARTITIONS if where[tp] == d and tp[0] == "a")
        assert [p.tp for p in partition_dirs(d, topics=["a", "zzz"])] == a_only

    hws = merged_checkpoint(dirs, REPLICATION_OFFSET_CHECKPOINT)
    starts = merged_checkpoint(dirs, LOG_START_OFFSET_CHECKPOINT)
    recovery = merged_checkpoint(dirs, RECOVERY_POINT_CHECKPOINT)
    assert hws is not None and starts is not None and recovery is not None
    for part in parts:
        start, hw, log_end, *bases = truth[part.tp]
        assert hws[part.tp] == hw
        assert recovery[part.tp] == log_end
        assert log_start_offset(part, starts) == start
        assert segment_bases(part.path) == bases  # strays ignored, sorted as numbers
        segments = log_segments(part.path)
        assert [s.base_offset for s in segments] == bases and len(bases) > 2
        for s in segments:
            assert s.path == part.path / f"{s.base_offset:020d}.log"
            assert s.path.is_file() and s.index_path.is_file() and s.time_index_path.is_file()
    for d in dirs:  # each log dir's checkpoint names its own partitions
        want = {tp: truth[tp][1] for tp in PARTITIONS if where[tp] == d}
        assert read_checkpoint(d, REPLICATION_OFFSET_CHECKPOINT) == want
    assert len(set(where.values())) == 2  # the broker used both log dirs


def test_log_start_is_the_first_segment_when_the_checkpoint_is_behind(tmp_path: Path) -> None:
    """The broker deleted segments after its last checkpoint: the first segment wins."""
    _, truth, where = _broker_dirs(tmp_path)
    part = as_partition_dir(where["a", 2] / "a-2")
    bases = truth["a", 2][3:]
    (part.path / f"{bases[0]:020d}.log").unlink()
    assert log_start_offset(part, {}) == bases[1]
    assert log_start_offset(part, {("a", 2): bases[1] + 1}) == bases[1] + 1


def test_missing_checkpoints_and_log_dirs(tmp_path: Path) -> None:
    (tmp_path / "t-0").mkdir()
    assert read_checkpoint(tmp_path, REPLICATION_OFFSET_CHECKPOINT) is None
    assert merged_checkpoint([tmp_path], LOG_START_OFFSET_CHECKPOINT) is None
    assert partition_dirs(tmp_path) == [PartitionDir("t", 0, tmp_path / "t-0")]
    assert segment_bases(tmp_path / "t-0") == []
    assert log_start_offset(partition_dirs(tmp_path)[0], {("t", 0): 7}) == 7
    with pytest.raises(LogDirNotFoundError, match="log dir does not exist") as exc:
        partition_dirs(tmp_path / "nope")
    assert isinstance(exc.value, LoglakeError) and exc.value.path == str(tmp_path / "nope")
    with pytest.raises(FileNotFoundError):  # a partition gone under a reader: the OS says so
        segment_bases(tmp_path / "gone-0")


@pytest.mark.parametrize("name", ["a-0.0123456789abcdef-delete", "a", "a-01", "-1", "t-2147483648"])
def test_as_partition_dir_refuses_what_is_not_one(tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidTopicError, match="not a <topic>-<partition> directory"):
        as_partition_dir(tmp_path / name)
    assert as_partition_dir(tmp_path / "my-topic-12") == PartitionDir(
        "my-topic", 12, tmp_path / "my-topic-12"
    )
