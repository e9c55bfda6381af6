"""partition.metadata (topic ids, KIP-516) and meta.properties (cluster and node ids):
the files as Kafka writes them, and the log manager's ids across restart, delete, recreate."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from logstore.storage.log import LogConfig
from logstore.storage.log_manager import LogManager
from logstore.storage.meta_properties import (
    LEGACY_CLUSTER_ID,
    META_PROPERTIES_FILE,
    InconsistentClusterIdError,
    ensure_meta_properties,
)
from logstore.storage.partition_metadata import (
    PARTITION_METADATA_FILE,
    CorruptPartitionMetadataError,
    InconsistentTopicIdError,
    format_topic_id,
    legacy_topic_id,
    new_topic_id,
    parse_topic_id,
    read_partition_metadata,
    write_partition_metadata,
)
from logstore.storage.properties import parse_properties

CFG = LogConfig(segment_bytes=2000, index_interval_bytes=200, segment_index_bytes=4096)


def _cdc(kafka_real: Path) -> Path:
    return kafka_real / "cdc-lakehouse-pipeline" / "kafka-data"


def test_real_kafka_partition_metadata_files_read_and_write_back_byte_for_byte(
    kafka_real: Path, tmp_path: Path
) -> None:
    cdc = _cdc(kafka_real)
    ids = {d.name: read_partition_metadata(d) for d in sorted(cdc.iterdir()) if d.is_dir()}
    # Kafka's reserved id of __cluster_metadata (Uuid.METADATA_TOPIC_ID) is 1
    assert ids["__cluster_metadata-0"] == uuid.UUID(int=1)
    assert ids["__consumer_offsets-49"] is not None
    assert format_topic_id(ids["__consumer_offsets-49"]) == "9hVsiaPkRIGg1U40a9zTBg"
    for name, tid in ids.items():
        assert tid is not None
        out = tmp_path / name
        out.mkdir()
        write_partition_metadata(out, tid)
        original = (cdc / name / PARTITION_METADATA_FILE).read_bytes()
        assert (out / PARTITION_METADATA_FILE).read_bytes() == original


def test_topic_id_strings_round_trip_and_bad_ones_are_refused(tmp_path: Path) -> None:
    for _ in range(200):
        tid = new_topic_id()
        text = format_topic_id(tid)
        assert len(text) == 22 and not text.startswith("-")
        assert parse_topic_id(text) == tid
        assert tid not in (uuid.UUID(int=0), uuid.UUID(int=1))
    for bad in ("", "AAAA", "!" * 22, "A" * 23):
        with pytest.raises(ValueError):
            parse_topic_id(bad)
    for text in (
        "version: 1\ntopic_id: 9hVsiaPkRIGg1U40a9zTBg",
        "version: 0\n",
        "version: 0\ntopic_id: nope",
        "garbage",
    ):
        (tmp_path / PARTITION_METADATA_FILE).write_text(text)
        with pytest.raises(CorruptPartitionMetadataError) as info:
            read_partition_metadata(tmp_path)
        assert str(tmp_path / PARTITION_METADATA_FILE) in str(info.value)
    assert read_partition_metadata(tmp_path / "absent") is None


def test_ids_are_random_persisted_shared_by_partitions_and_new_after_recreate(
    tmp_path: Path,
) -> None:
    mgr = LogManager([tmp_path / "a", tmp_path / "b"], default_config=CFG, background=False)
    mgr.get_or_create_log("t", 0)
    tid = mgr.topic_id("t")
    assert tid is not None and tid != legacy_topic_id("t")
    mgr.get_or_create_log("t", 1)  # another partition (another dir): the same id
    mgr.get_or_create_log("u", 0)
    assert mgr.topic_id("u") not in (None, tid)
    on_disk = {
        p.parent.name: read_partition_metadata(p.parent)
        for p in tmp_path.glob(f"*/*/{PARTITION_METADATA_FILE}")
    }
    assert on_disk == {"t-0": tid, "t-1": tid, "u-0": mgr.topic_id("u")}
    mgr.shutdown()

    mgr = LogManager([tmp_path / "a", tmp_path / "b"], default_config=CFG, background=False)
    assert mgr.topic_id("t") == tid and mgr.topic_name(tid) == "t"
    mgr.delete_log("t", 0)
    assert mgr.topic_name(tid) == "t"  # t-1 is still there
    mgr.delete_log("t", 1)
    assert mgr.topic_id("t") is None and mgr.topic_name(tid) is None
    mgr.get_or_create_log("t", 0)
    new = mgr.topic_id("t")
    assert new is not None and new != tid and mgr.topic_name(tid) is None
    mgr.shutdown()


def test_an_older_loglake_dir_gets_the_id_it_had_and_the_file_written(tmp_path: Path) -> None:
    mgr = LogManager(tmp_path, default_config=CFG, background=False)
    mgr.get_or_create_log("old", 0)
    mgr.get_or_create_log("old", 1)
    mgr.shutdown()
    for f in tmp_path.glob(f"old-*/{PARTITION_METADATA_FILE}"):
        f.unlink()
    mgr = LogManager(tmp_path, default_config=CFG, background=False)
    assert mgr.topic_id("old") == legacy_topic_id("old")
    assert read_partition_metadata(tmp_path / "old-1") == legacy_topic_id("old")
    mgr.shutdown()


def test_a_partition_whose_id_disagrees_with_its_topic_is_refused(tmp_path: Path) -> None:
    mgr = LogManager(tmp_path, default_config=CFG, background=False)
    mgr.get_or_create_log("t", 0)
    mgr.get_or_create_log("t", 1)
    mgr.shutdown()
    stranger = new_topic_id()
    write_partition_metadata(tmp_path / "t-1", stranger)
    with pytest.raises(InconsistentTopicIdError) as info:
        LogManager(tmp_path, default_config=CFG, background=False)
    assert str(stranger) in str(info.value) and "t-1" in str(info.value)
    # nothing was lost: the files are as they were, and the lock was released
    assert read_partition_metadata(tmp_path / "t-1") == stranger
    shutil.copy(tmp_path / "t-0" / PARTITION_METADATA_FILE, tmp_path / "t-1")
    LogManager(tmp_path, default_config=CFG, background=False).shutdown()


def test_meta_properties_written_once_then_honoured(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    cluster = ensure_meta_properties([a, b], node_id=3)
    assert len(cluster) == 22  # a Kafka-style random id for a new broker
    props = parse_properties((a / META_PROPERTIES_FILE).read_text())
    assert props["cluster.id"] == cluster and props["node.id"] == "3"
    assert props["version"] == "1" and len(props["directory.id"]) == 22
    other = parse_properties((b / META_PROPERTIES_FILE).read_text())
    assert other["cluster.id"] == cluster and other["directory.id"] != props["directory.id"]
    assert ensure_meta_properties([a, b], node_id=3) == cluster
    # a directory of another node, or of another cluster: refused, nothing rewritten
    with pytest.raises(InconsistentClusterIdError, match="stored node id 3"):
        ensure_meta_properties([a, b], node_id=4)
    c = tmp_path / "c"
    c.mkdir()
    ensure_meta_properties([c], node_id=3)
    before = (c / META_PROPERTIES_FILE).read_bytes()
    with pytest.raises(InconsistentClusterIdError, match="belongs to another cluster"):
        ensure_meta_properties([a, c], node_id=3)
    assert (c / META_PROPERTIES_FILE).read_bytes() == before


def test_meta_properties_of_older_loglake_and_real_kafka_dirs(
    kafka_real: Path, tmp_path: Path
) -> None:
    old = tmp_path / "old"
    (old / "t-0").mkdir(parents=True)
    assert ensure_meta_properties([old], node_id=0) == LEGACY_CLUSTER_ID
    real = tmp_path / "real"
    shutil.copytree(_cdc(kafka_real), real)
    before = (real / META_PROPERTIES_FILE).read_bytes()
    # that broker wrote its id as Scala's Some(...): kept as Kafka would read it
    assert ensure_meta_properties([real], node_id=1) == "Some(4L6g3nShT-eMCtK--X86sw)"
    assert (real / META_PROPERTIES_FILE).read_bytes() == before
    with pytest.raises(InconsistentClusterIdError):
        ensure_meta_properties([real, old], node_id=1)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / META_PROPERTIES_FILE).write_text("version=7\n")
    with pytest.raises(InconsistentClusterIdError, match="version"):
        ensure_meta_properties([tmp_path / "bad"], node_id=0)
