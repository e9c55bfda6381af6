"""Kafka's text checkpoints and the leader epoch cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from logstore.storage.checkpoints import (
    CorruptCheckpointError,
    LeaderEpochCache,
    read_leader_epoch_checkpoint,
    read_offset_checkpoint,
    write_leader_epoch_checkpoint,
    write_offset_checkpoint,
)


def test_offset_checkpoint_exact_text_and_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "recovery-point-offset-checkpoint"
    write_offset_checkpoint(path, {("orders", 1): 99, ("orders", 0): 1234, ("a-b", 7): 0})
    assert path.read_text() == "0\n3\na-b 7 0\norders 0 1234\norders 1 99\n"
    assert read_offset_checkpoint(path) == {("orders", 0): 1234, ("orders", 1): 99, ("a-b", 7): 0}
    assert not (tmp_path / "recovery-point-offset-checkpoint.tmp").exists()


def test_missing_and_empty_checkpoints_read_as_empty(tmp_path: Path) -> None:
    assert read_offset_checkpoint(tmp_path / "nope") == {}
    (tmp_path / "empty").write_text("")
    assert read_offset_checkpoint(tmp_path / "empty") == {}
    (tmp_path / "zero").write_text("0\n0\n")
    assert read_offset_checkpoint(tmp_path / "zero") == {}


@pytest.mark.parametrize(
    "text",
    [
        "1\n0\n",
        "0\n2\nt 0 5\n",
        "0\nx\n",
        "0\n1\nt 0\n",
        "0\n1\nt zero 5\n",
        "0\n1\nt 0 5 6\n",
        "0\n",
    ],
)
def test_malformed_checkpoints_raise(tmp_path: Path, text: str) -> None:
    path = tmp_path / "cp"
    path.write_text(text)
    with pytest.raises(CorruptCheckpointError) as info:
        read_offset_checkpoint(path)
    assert info.value.path == str(path)


def test_real_kafka_checkpoints_parse(kafka_real: Path) -> None:
    data = kafka_real / "cdc-lakehouse-pipeline" / "kafka-data"
    rp = read_offset_checkpoint(data / "recovery-point-offset-checkpoint")
    hw = read_offset_checkpoint(data / "replication-offset-checkpoint")
    assert rp and set(rp) == set(hw)
    lines = (data / "recovery-point-offset-checkpoint").read_text().splitlines()
    assert len(rp) == int(lines[1])
    assert read_offset_checkpoint(data / "log-start-offset-checkpoint") == {}
    assert read_offset_checkpoint(data / "cleaner-offset-checkpoint") == {}
    epochs = read_leader_epoch_checkpoint(
        data / "__consumer_offsets-49" / "leader-epoch-checkpoint"
    )
    assert epochs == [(0, 0)]  # "0\n1\n0 0\n": epoch 0 from offset 0


def test_leader_epoch_checkpoint_text(tmp_path: Path) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    write_leader_epoch_checkpoint(path, [(0, 0), (3, 120)])
    assert path.read_text() == "0\n2\n0 0\n3 120\n"
    assert read_leader_epoch_checkpoint(path) == [(0, 0), (3, 120)]


def test_leader_epoch_cache_assign_and_truncate(tmp_path: Path) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    cache = LeaderEpochCache(path)
    cache.assign(0, 0)
    cache.assign(0, 10)  # same epoch: no new entry
    cache.assign(2, 50)
    cache.assign(5, 90)
    assert cache.entries() == [(0, 0), (2, 50), (5, 90)]
    assert LeaderEpochCache(path).entries() == [(0, 0), (2, 50), (5, 90)]
    assert cache.end_offset_for(3, 200) == (2, 90)
    assert cache.end_offset_for(9, 200) == (5, 200)
    cache.truncate_from_end(60)
    assert cache.entries() == [(0, 0), (2, 50)]
    cache.truncate_from_start(55)
    assert cache.entries() == [(2, 55)]
    assert read_leader_epoch_checkpoint(path) == [(2, 55)]


def test_leader_epoch_cache_rejects_unordered_file(tmp_path: Path) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    path.write_text("0\n2\n3 10\n1 20\n")
    with pytest.raises(CorruptCheckpointError):
        LeaderEpochCache(path)
