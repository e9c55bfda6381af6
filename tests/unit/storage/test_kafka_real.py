"""Segments written by real Apache Kafka brokers load, recover and read back.

The fixtures are read-only: every test copies what it opens into ``tmp_path`` first.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from logstore.protocol.batch import iter_batches
from logstore.protocol.records import decode_batch
from logstore.storage.checkpoints import read_offset_checkpoint
from logstore.storage.log import Log, LogConfig
from logstore.storage.log_manager import LogManager


def _copy_segment(src: Path, dest_dir: Path, name: str | None = None) -> Path:
    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / (name or src.name)
    shutil.copyfile(src, target)
    os.chmod(target, 0o644)
    return target


def _records(log: Log) -> list[tuple[int, bytes | None, bytes | None]]:
    out = []
    for seg in log.segments:
        data = seg.path.read_bytes()
        for pos, _ in iter_batches(data):
            _, recs = decode_batch(data, pos)
            out += [(r.offset, r.key, r.value) for r in recs]
    return out


def test_kaspar_customers_segment(kafka_real: Path, tmp_path: Path) -> None:
    src = kafka_real / "kaspar" / "resources" / "00000000000000000000.log"
    _copy_segment(src, tmp_path / "Customers-0")
    log = Log.open(tmp_path / "Customers-0", LogConfig())
    assert log.load_result.truncated_bytes == 0
    assert log.log_end_offset == 10
    recs = _records(log)
    assert [o for o, _, _ in recs] == list(range(10))
    assert all(isinstance(json.loads(v or b""), dict) for _, _, v in recs)
    assert log.segments[0].path.read_bytes() == src.read_bytes()  # untouched
    fs = log.read(4, 1)
    assert (fs.position, fs.length, fs.first_offset) == (0, 940, 0)
    log.close()


def test_kafka_log_parser_segment_index_and_lookup(kafka_real: Path, tmp_path: Path) -> None:
    src = kafka_real / "kafka-log-parser" / "tests" / "00000000000000000000.log"
    _copy_segment(src, tmp_path / "changes-0")
    cfg = LogConfig(index_interval_bytes=100)
    log = Log.open(tmp_path / "changes-0", cfg)
    assert log.log_end_offset == 4
    recs = _records(log)
    assert [o for o, _, _ in recs] == [0, 1, 2, 3]
    assert all(k is not None for _, k, _ in recs)
    sizes = [h.size for _, h in iter_batches(src.read_bytes())]
    assert sum(sizes) == 9382 and len(sizes) == 4
    # rebuilt index: an entry for every batch after the first (each is > 100 bytes)
    assert log.segments[0].offset_index.entries() == [(i, sum(sizes[:i])) for i in range(1, 4)]
    for off in range(4):
        fs = log.read(off, 1)
        assert (fs.position, fs.length, fs.first_offset) == (sum(sizes[:off]), sizes[off], off)
    log.close()


def test_name_and_base_offset_mismatch(kafka_real: Path, tmp_path: Path) -> None:
    """fakeBroker/someTopic-0 has 00..0.log and 00..100.log holding the same batch at offset 0.

    The batch in segment 100 lies below its segment's base offset, so recovery treats it as
    invalid and truncates that segment; the log keeps one record and ends at 100.
    """
    src = kafka_real / "kaspar" / "kaspar" / "src" / "test" / "resources" / "fakeBroker"
    shutil.copytree(src / "someTopic-0", tmp_path / "someTopic-0")
    for p in (tmp_path / "someTopic-0").iterdir():
        os.chmod(p, 0o644)
    log = Log.open(tmp_path / "someTopic-0", LogConfig())
    assert [s.base_offset for s in log.segments] == [0, 100]
    assert log.segments[0].size == 75 and log.segments[1].size == 0
    assert log.load_result.truncated_bytes == 75
    assert log.log_end_offset == 100
    assert [o for o, _, _ in _records(log)] == [0]
    assert (
        log.append(
            bytearray(src.joinpath("someTopic-0", "00000000000000000000.log").read_bytes())
        ).first_offset
        == 100
    )
    log.close()


def test_cdc_kraft_log_dir_loads_with_log_manager(kafka_real: Path, tmp_path: Path) -> None:
    src = kafka_real / "cdc-lakehouse-pipeline" / "kafka-data"
    d = tmp_path / "kafka-data"
    shutil.copytree(src, d)
    for p in d.rglob("*"):
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    mgr = LogManager(d, default_config=LogConfig(), background=False)
    try:
        assert mgr.had_clean_shutdown[d.resolve()] is False
        logs = {(lg.topic, lg.partition): lg for lg in mgr.all_logs()}
        assert set(logs) == {
            ("__cluster_metadata", 0),
            ("__consumer_offsets", 49),
            ("connect_configs", 0),
        }
        meta = logs[("__cluster_metadata", 0)]
        assert meta.load_result.truncated_bytes == 0
        data = meta.segments[0].path.read_bytes()
        headers = [h for _, h in iter_batches(data)]
        assert meta.log_end_offset == headers[-1].last_offset + 1 == 5834
        assert sum(h.size for h in headers) == len(data) == 420384
        # the high watermark comes from Kafka's replication-offset-checkpoint
        kafka_hw = read_offset_checkpoint(src / "replication-offset-checkpoint")
        offsets = logs[("__consumer_offsets", 49)]
        assert offsets.log_end_offset == 1
        assert offsets.high_watermark == kafka_hw[("__consumer_offsets", 49)] == 1
        # connect_configs had HW 1 in Kafka but its .log was not copied: clamped to the end
        assert kafka_hw[("connect_configs", 0)] == 1
        assert logs[("connect_configs", 0)].log_end_offset == 0
        assert logs[("connect_configs", 0)].high_watermark == 0
        # rebuilt indexes pass their checks and agree with a header scan
        seg = meta.segments[0]
        seg.sanity_check()
        for entry in seg.offset_index.entries():
            loc = seg.translate_offset(entry.offset)
            assert loc is not None and loc.position == entry.position
    finally:
        mgr.shutdown()
    assert (d / ".kafka_cleanshutdown").exists()
    assert (d / "recovery-point-offset-checkpoint").read_text().splitlines()[2:] == [
        "__cluster_metadata 0 5834",
        "__consumer_offsets 49 1",
        "connect_configs 0 0",
    ]
