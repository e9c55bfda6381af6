"""Topic names, partition directories and segment file names."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from logstore.errors import InvalidTopicError
from logstore.storage.files import (
    offset_from_file_name,
    parse_partition_dir,
    partition_dir,
    segment_file_name,
    segment_path,
    validate_topic,
)


@pytest.mark.parametrize(
    "name", ["a", "orders", "my.topic_1-x", "A" * 249, "..a", "-", "__consumer_offsets"]
)
def test_valid_topics_pass_unchanged(name: str) -> None:
    assert validate_topic(name) == name


@pytest.mark.parametrize(
    "name",
    ["", ".", "..", "A" * 250, "a/b", "../etc", "a b", "a\0b", "tópico", "a\\b", "x:y", "a\nb"],
)
def test_invalid_topics_raise(name: str) -> None:
    with pytest.raises(InvalidTopicError):
        validate_topic(name)


def test_partition_dir_is_inside_log_dir(tmp_path: Path) -> None:
    d = partition_dir(tmp_path, "orders", 3)
    assert d == tmp_path.resolve() / "orders-3"
    assert d.parent == tmp_path.resolve()


@pytest.mark.parametrize("topic", ["..", "../x", "/etc/passwd", "a/../../b"])
def test_partition_dir_rejects_escapes(tmp_path: Path, topic: str) -> None:
    with pytest.raises(InvalidTopicError):
        partition_dir(tmp_path, topic, 0)


def test_partition_dir_rejects_symlink_escape(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "logs"
    root.mkdir()
    os.symlink(outside, root / "evil-0")
    with pytest.raises(InvalidTopicError):
        partition_dir(root, "evil", 0)


@pytest.mark.parametrize("partition", [-1, 2**31, True, "1"])
def test_partition_dir_rejects_bad_partition(tmp_path: Path, partition: object) -> None:
    with pytest.raises(InvalidTopicError):
        partition_dir(tmp_path, "t", partition)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("orders-0", ("orders", 0)),
        ("my-topic-12", ("my-topic", 12)),
        ("__consumer_offsets-49", ("__consumer_offsets", 49)),
        ("orders", None),
        ("orders-", None),
        ("orders-01", None),
        ("orders-1.abc-delete", None),
        ("orders-1-future", None),
        ("-0", None),
        ("..-0", None),
        ("t-99999999999", None),
    ],
)
def test_parse_partition_dir(name: str, expected: tuple[str, int] | None) -> None:
    assert parse_partition_dir(name) == expected


def test_segment_names_are_20_digits(tmp_path: Path) -> None:
    assert segment_file_name(0, ".log") == "00000000000000000000.log"
    assert segment_file_name(1234, ".timeindex") == "00000000000000001234.timeindex"
    assert segment_path(tmp_path, 7, ".index") == tmp_path / "00000000000000000007.index"
    assert offset_from_file_name("00000000000000000042.log.deleted") == (42, ".log.deleted")
    assert offset_from_file_name("leader-epoch-checkpoint") is None
    with pytest.raises(ValueError):
        segment_file_name(-1, ".log")
    with pytest.raises(ValueError):
        segment_file_name(1, "/x")
