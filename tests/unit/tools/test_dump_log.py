"""``loglake dump-log``: the real CLI (subprocess) on real Kafka files and on broken ones."""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kafka.record.default_records import DefaultRecordBatch

from logstore.protocol.batch import Codec
from logstore.protocol.control import ControlType, build_control_batch
from logstore.protocol.records import build_batch

KASPAR = "kaspar/resources/00000000000000000000.log"
PARSER = "kafka-log-parser/tests/00000000000000000000.log"
PARSER_COPY = (
    "kafka-log-parser/internal/parser/tests/bp.nsi.v3.changes.fre/00000000000000000000.log"
)
FAKE_0 = "kaspar/kaspar/src/test/resources/fakeBroker/someTopic-0/00000000000000000000.log"
FAKE_100 = "kaspar/kaspar/src/test/resources/fakeBroker/someTopic-0/00000000000000000100.log"
OFFSETS = "cdc-lakehouse-pipeline/kafka-data/__consumer_offsets-49/00000000000000000000.log"
METADATA = "cdc-lakehouse-pipeline/kafka-data/__cluster_metadata-0/00000000000000000000.log"

BATCH_FIELDS = {
    "file", "position", "base_offset", "last_offset", "count", "magic", "codec", "crc",
    "crc_valid", "is_control", "is_transactional", "producer_id", "producer_epoch",
    "base_sequence", "partition_leader_epoch", "max_timestamp",
}  # fmt: skip


def dump(*args: str | Path, expect: int | None = 0) -> tuple[int, str, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "logstore.cli", "dump-log", *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    if expect is not None:
        assert proc.returncode == expect, proc.stdout + proc.stderr
    return proc.returncode, proc.stdout, proc.stderr


def dump_json(*args: str | Path, expect: int = 0) -> list[dict[str, Any]]:
    _, out, _ = dump("--json", *args, expect=expect)
    return [json.loads(line) for line in out.splitlines()]


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


# -- real Kafka files -------------------------------------------------------------------------


def test_kaspar_customers_batch(kafka_real: Path) -> None:
    (batch,) = dump_json("--print-data-log", "--files", kafka_real / KASPAR)
    assert set(batch) == BATCH_FIELDS | {"records"}
    assert {k: batch[k] for k in BATCH_FIELDS - {"file"}} == {
        "position": 0,
        "base_offset": 0,
        "last_offset": 9,
        "count": 10,
        "magic": 2,
        "codec": "none",
        "crc": 671865921,
        "crc_valid": True,
        "is_control": False,
        "is_transactional": False,
        "producer_id": -1,
        "producer_epoch": -1,
        "base_sequence": -1,
        "partition_leader_epoch": 0,
        "max_timestamp": 1601322741543,
    }
    records = batch["records"]
    assert [r["offset"] for r in records] == list(range(10))
    assert all(r["key"] is None and r["headers"] == [] for r in records)
    names = [json.loads(base64.b64decode(r["value"]))["name"] for r in records]
    assert names[0] == "Bruce Wayne" and names[1] == "Harry Potter" and names[9] == "Peter Parker"
    assert records[0]["timestamp"] == 1601322741466
    assert records[9]["timestamp"] == 1601322741543


@pytest.mark.parametrize("rel", [PARSER, PARSER_COPY])
def test_kafka_log_parser_four_keyed_batches(kafka_real: Path, rel: str) -> None:
    batches = dump_json("--print-data-log", "--files", kafka_real / rel)
    assert [(b["position"], b["base_offset"], b["last_offset"], b["count"]) for b in batches] == [
        (0, 0, 0, 1),
        (2183, 1, 1, 1),
        (4386, 2, 2, 1),
        (7179, 3, 3, 1),
    ]
    assert [b["max_timestamp"] for b in batches] == [
        1743046364054, 1743046386367, 1743046663295, 1743047989031,
    ]  # fmt: skip
    keys = {base64.b64decode(b["records"][0]["key"]) for b in batches}
    assert keys == {b"11648c51-49de-3a40-bcdd-d1cd1764dcc1::FRE_IP_fd500"}
    sizes = [len(base64.b64decode(b["records"][0]["value"])) for b in batches]
    assert sizes == [2063, 2083, 2673, 2083]


def test_file_name_base_offset_mismatch_is_a_warning(kafka_real: Path) -> None:
    objs = dump_json("--files", kafka_real / FAKE_0, kafka_real / FAKE_100)
    assert [o.get("warning", "batch")[:41] for o in objs] == [
        "batch",
        "file name says base offset 100, but the f",
        "batch",
    ]
    assert objs[1]["file"].endswith("00000000000000000100.log")
    assert objs[0]["base_offset"] == objs[2]["base_offset"] == 0
    _, text, _ = dump("--print-data-log", "--files", kafka_real / FAKE_100)
    assert "WARNING:" in text and "payload: key,val" in text


def test_consumer_offsets_matches_its_high_watermark(kafka_real: Path) -> None:
    (batch,) = dump_json("--print-data-log", "--files", kafka_real / OFFSETS)
    # replication-offset-checkpoint says __consumer_offsets 49 -> 1
    assert (batch["base_offset"], batch["last_offset"], batch["crc_valid"]) == (0, 0, True)
    (record,) = batch["records"]
    assert base64.b64decode(record["key"]) == b"\x00\x02\x00\x011"


def test_kraft_metadata_log(kafka_real: Path) -> None:
    batches = dump_json("--files", kafka_real / METADATA)
    assert len(batches) == 5743
    assert sum(b["count"] for b in batches) == 5834
    assert batches[-1]["base_offset"] == batches[-1]["last_offset"] == 5833
    assert batches[-1]["position"] == 420312
    assert [b["position"] for b in batches if b["is_control"]] == [0]
    assert all(b["crc_valid"] and b["partition_leader_epoch"] == 1 for b in batches)
    offsets = [(b["base_offset"], b["last_offset"]) for b in batches]
    assert all(nxt[0] == cur[1] + 1 for cur, nxt in itertools.pairwise(offsets))
    _, text, _ = dump("--print-data-log", "--files", kafka_real / METADATA)
    assert "controlType: LEADER_CHANGE(2)" in text.splitlines()[3]


def test_every_fixture_equals_kafka_python_reader(kafka_real: Path) -> None:
    """Every .log under kafka-real, checked against kafka-python's decoder."""
    logs = sorted(kafka_real.rglob("*.log"))
    assert len(logs) == 7
    objs = dump_json("--print-data-log", "--files", *logs)
    batches = [o for o in objs if "base_offset" in o]
    assert [o for o in objs if "error" in o] == []
    expected = []
    for log in logs:
        data = log.read_bytes()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack_from(">i", data, pos + 8)
            ref = DefaultRecordBatch(data[pos : pos + 12 + length])
            assert ref.validate_crc()
            expected.append(
                {
                    "file": str(log),
                    "position": pos,
                    "base_offset": ref.base_offset,
                    "last_offset": ref.last_offset,
                    "crc": ref.crc,
                    "records": [
                        [r.offset, r.timestamp, b64(r.key), b64(r.value)]
                        for r in ref
                        # kafka-python's ControlRecord keeps key/value like any record
                    ],
                }
            )
            pos += ref.size_in_bytes
    got = [
        {
            "file": b["file"],
            "position": b["position"],
            "base_offset": b["base_offset"],
            "last_offset": b["last_offset"],
            "crc": b["crc"],
            "records": [[r["offset"], r["timestamp"], r["key"], r["value"]] for r in b["records"]],
        }
        for b in batches
    ]
    assert got == expected


def test_text_output_looks_like_kafka(kafka_real: Path) -> None:
    _, text, _ = dump("--files", kafka_real / KASPAR)
    lines = text.splitlines()
    assert lines[0] == f"Dumping {kafka_real / KASPAR}"
    assert lines[1] == "Log starting offset: 0"
    assert lines[2].startswith("baseOffset: 0 lastOffset: 9 count: 10 baseSequence: -1 ")
    assert "compresscodec: none crc: 671865921 isvalid: true" in lines[2]
    assert len(lines) == 3
    _, text, _ = dump("--print-data-log", "--files", kafka_real / KASPAR)
    record_lines = [line for line in text.splitlines() if line.startswith("| offset:")]
    assert len(record_lines) == 10
    assert record_lines[0].startswith("| offset: 0 CreateTime: 1601322741466 keySize: -1 ")
    assert '"name": "Bruce Wayne"' in record_lines[0]


# -- broken .log files ------------------------------------------------------------------------


def copy(kafka_real: Path, rel: str, tmp_path: Path) -> Path:
    dst = tmp_path / Path(rel).name
    shutil.copyfile(kafka_real / rel, dst)
    dst.chmod(0o644)
    return dst


@pytest.mark.parametrize("cut", [1, 60, 100])
def test_torn_tail(kafka_real: Path, tmp_path: Path, cut: int) -> None:
    log = copy(kafka_real, PARSER, tmp_path)
    data = log.read_bytes()
    log.write_bytes(data[: 7179 + cut])
    objs = dump_json("--files", log, expect=1)
    assert [o["base_offset"] for o in objs[:-1]] == [0, 1, 2]
    error = objs[-1]
    assert set(error) == {"file", "position", "error"}
    assert error["file"] == str(log) and error["position"] == 7179
    assert "torn" in error["error"] and f"{cut} bytes" in error["error"]
    _, text, _ = dump("--files", log, expect=1)
    assert text.splitlines()[-1].startswith(f"ERROR: {log} at position 7179: torn batch")


def test_bit_flip_in_a_middle_batch(kafka_real: Path, tmp_path: Path) -> None:
    log = copy(kafka_real, PARSER, tmp_path)
    data = bytearray(log.read_bytes())
    data[2183 + 500] ^= 0x10  # inside the record value of the second batch
    log.write_bytes(data)
    objs = dump_json("--print-data-log", "--files", log, expect=1)
    assert [(o.get("base_offset"), o.get("crc_valid"), "error" in o) for o in objs] == [
        (0, True, False),
        (1, False, False),
        (None, None, True),
        (2, True, False),
        (3, True, False),
    ]
    assert objs[2]["position"] == 2183 and "CRC mismatch" in objs[2]["error"]
    # the records are still shown, as Kafka's tool does (isvalid: false)
    assert objs[1]["records"][0]["offset"] == 1


def test_garbage_tail(kafka_real: Path, tmp_path: Path) -> None:
    log = copy(kafka_real, KASPAR, tmp_path)
    log.write_bytes(log.read_bytes() + b"\x00" * 200)
    objs = dump_json("--files", log, expect=1)
    assert objs[0]["last_offset"] == 9
    assert objs[1]["position"] == 940 and "batchLength 0" in objs[1]["error"]


def test_magic_1_message_set_is_rejected(tmp_path: Path) -> None:
    log = tmp_path / "00000000000000000000.log"
    # offset, size, crc, magic 1, attributes, timestamp, null key, value "x"
    body = struct.pack(">bbqi", 1, 0, 1000, -1) + struct.pack(">i", 1) + b"x"
    log.write_bytes(struct.pack(">qiI", 0, len(body) + 4, 0) + body)
    (error,) = dump_json("--files", log, expect=1)
    assert error["position"] == 0 and "magic 1" in error["error"]


def test_corrupt_compressed_batch(tmp_path: Path) -> None:
    good = build_batch([(b"k", b"v" * 500, [], 5)], codec=Codec.LZ4)
    bad = bytearray(build_batch([(b"k", b"w" * 500, [], 6)], base_offset=1, codec=Codec.GZIP))
    bad[70:80] = b"\xff" * 10
    log = tmp_path / "00000000000000000000.log"
    log.write_bytes(bytes(good) + bytes(bad))
    objs = dump_json("--print-data-log", "--files", log, expect=1)
    assert objs[0]["codec"] == "lz4" and objs[0]["records"][0]["value"] == b64(b"v" * 500)
    assert objs[1]["codec"] == "gzip" and objs[1]["records"] is None
    assert objs[2]["position"] == len(good) and "gzip" in objs[2]["error"]


def test_control_and_transactional_batches(tmp_path: Path) -> None:
    data = build_batch(
        [(b"k", b"v")], is_transactional=True, producer_id=9, producer_epoch=1, base_sequence=0
    ) + build_control_batch(
        ControlType.COMMIT,
        producer_id=9,
        producer_epoch=1,
        coordinator_epoch=4,
        timestamp=77,
        base_offset=1,
    )
    log = tmp_path / "00000000000000000000.log"
    log.write_bytes(bytes(data))
    objs = dump_json("--files", log)
    assert [(o["is_transactional"], o["is_control"], o["producer_id"]) for o in objs] == [
        (True, False, 9),
        (True, True, 9),
    ]
    _, text, _ = dump("--print-data-log", "--files", log)
    assert "endTxnMarker: COMMIT coordinatorEpoch: 4" in text


def test_missing_unknown_and_empty_files(tmp_path: Path) -> None:
    empty = tmp_path / "00000000000000000000.log"
    empty.write_bytes(b"")
    other = tmp_path / "notes.txt"
    other.write_text("hi")
    objs = dump_json("--files", empty, other, expect=0)
    assert [o.get("warning", "")[:20] for o in objs] == ["ignoring unknown fil"]
    objs = dump_json("--files", tmp_path / "00000000000000000042.log", expect=1)
    assert objs[0]["position"] is None and "cannot read" in objs[0]["error"]


# -- indexes ----------------------------------------------------------------------------------


def make_segment(tmp_path: Path, base: int = 100) -> tuple[Path, list[tuple[int, int, int, int]]]:
    """A .log of 5 batches; returns (path, [(position, base_offset, last_offset, max_ts)])."""
    log = tmp_path / f"{base:020d}.log"
    data = bytearray()
    layout = []
    offset = base
    for i, n in enumerate([3, 1, 4, 2, 5]):
        batch = build_batch(
            [(b"k%d" % j, b"v" * 100, [], 1000 * i + j) for j in range(n)], base_offset=offset
        )
        layout.append((len(data), offset, offset + n - 1, 1000 * i + n - 1))
        data += batch
        offset += n
    log.write_bytes(bytes(data))
    return log, layout


def write_index(path: Path, entries: list[tuple[int, int]], *, fmt: str, zeros: int = 0) -> None:
    entry = struct.Struct(fmt)
    path.write_bytes(b"".join(entry.pack(*e) for e in entries) + bytes(entry.size * zeros))


def test_offset_index_entries_and_untrimmed_tail(tmp_path: Path) -> None:
    log, layout = make_segment(tmp_path)
    index = log.with_suffix(".index")
    # Kafka maps each indexed batch's last offset (relative) to the batch's position
    write_index(index, [(layout[1][2] - 100, layout[1][0]), (layout[3][2] - 100, layout[3][0])],
                fmt=">ii", zeros=50)  # fmt: skip
    objs = dump_json("--files", index)
    assert objs[:2] == [
        {"offset": layout[1][2], "position": layout[1][0]},
        {"offset": layout[3][2], "position": layout[3][0]},
    ]
    assert "50 zero entries after 2 entries" in objs[2]["warning"]
    assert len(objs) == 3
    passed = dump_json("--index-sanity-check", "--files", index)
    assert passed[-1] == {"file": str(index), "sanity_check": "passed", "entries": 2}
    _, text, _ = dump("--files", index)
    assert f"offset: {layout[1][2]} position: {layout[1][0]}" in text.splitlines()


def test_offset_index_first_entry_may_be_zero(tmp_path: Path) -> None:
    log, layout = make_segment(tmp_path, base=0)
    index = log.with_suffix(".index")
    # a first entry of (0, 0) is real (a one-record first batch at offset 0 would give it)
    write_index(index, [(0, 0), (layout[2][2], layout[2][0])], fmt=">ii")
    objs = dump_json("--files", index)
    assert objs[0] == {"offset": 0, "position": 0}
    assert "mismatch: index offset 0, log offset 2" in objs[1]["warning"]
    assert objs[2] == {"offset": layout[2][2], "position": layout[2][0]}
    assert len(objs) == 3


def test_offset_index_pointing_inside_a_batch_fails(tmp_path: Path) -> None:
    log, layout = make_segment(tmp_path)
    index = log.with_suffix(".index")
    write_index(index, [(layout[1][2] - 100, layout[1][0] + 5)], fmt=">ii")
    objs = dump_json("--index-sanity-check", "--files", index, expect=1)
    assert "is not the start of a batch" in objs[0]["error"]
    write_index(index, [(layout[1][1] - 101, layout[1][0])], fmt=">ii")  # offset before batch
    objs = dump_json("--index-sanity-check", "--files", index, expect=1)
    assert "points at a batch starting at offset 103" in objs[0]["error"]
    write_index(index, [(900, layout[4][0])], fmt=">ii")
    objs = dump_json("--index-sanity-check", "--files", index, expect=1)
    assert "beyond the log's last offset 114" in objs[0]["error"]


def test_offset_index_sanity_failures(tmp_path: Path) -> None:
    log, layout = make_segment(tmp_path)
    index = log.with_suffix(".index")
    write_index(index, [(layout[3][2] - 100, layout[3][0]), (layout[1][2] - 100, layout[1][0])],
                fmt=">ii")  # fmt: skip
    objs = dump_json("--index-sanity-check", "--files", index, expect=1)
    assert [o.get("error", "")[:8] for o in objs] == ["entry 1 "]
    assert "does not follow" in objs[0]["error"]
    index.write_bytes(struct.pack(">ii", layout[1][2] - 100, layout[1][0]) + b"\x01\x02\x03")
    objs = dump_json("--index-sanity-check", "--files", index, expect=1)
    assert "not a multiple of the entry size 8" in objs[0]["error"]
    objs = dump_json("--files", index)  # plain dump: a warning, the whole entries are shown
    assert "ignoring the last 3 bytes" in objs[0]["warning"]
    assert objs[1] == {"offset": layout[1][2], "position": layout[1][0]}


def test_time_index(tmp_path: Path) -> None:
    log, layout = make_segment(tmp_path)
    tindex = log.with_suffix(".timeindex")
    entries = [(layout[i][3], layout[i][2] - 100) for i in (0, 2, 4)]
    write_index(tindex, entries, fmt=">qi", zeros=3)
    objs = dump_json("--files", tindex)
    assert objs[:3] == [{"timestamp": ts, "offset": rel + 100} for ts, rel in entries]
    assert "3 zero entries" in objs[3]["warning"]
    assert dump_json("--index-sanity-check", "--files", tindex)[-1]["sanity_check"] == "passed"
    write_index(tindex, [entries[1], entries[0]], fmt=">qi")
    objs = dump_json("--index-sanity-check", "--files", tindex, expect=1)
    assert "goes back" in objs[0]["error"]
    write_index(tindex, [(layout[1][3] + 5, layout[1][2] - 100)], fmt=">qi")
    objs = dump_json("--files", tindex)
    assert objs[0] == {"timestamp": 1005, "offset": 103}
    assert "the batch's max timestamp is 1000" in objs[1]["warning"]


def test_index_without_log_and_bad_name(tmp_path: Path) -> None:
    index = tmp_path / "00000000000000000007.index"
    write_index(index, [(1, 0), (5, 4096)], fmt=">ii")
    assert dump_json("--files", index) == [
        {"offset": 8, "position": 0},
        {"offset": 12, "position": 4096},
    ]
    bad = tmp_path / "segment.index"
    bad.write_bytes(b"")
    objs = dump_json("--files", bad, expect=1)
    assert "no 20-digit base offset" in objs[0]["error"]


def test_deleted_suffix_and_txn_index(tmp_path: Path) -> None:
    log, layout = make_segment(tmp_path)
    deleted = log.with_name(log.name + ".deleted")
    log.rename(deleted)
    assert [o["base_offset"] for o in dump_json("--files", deleted)] == [o[1] for o in layout]
    txn = tmp_path / "00000000000000000100.txnindex"
    txn.write_bytes(struct.pack(">hqqqq", 0, 42, 100, 104, 105))
    assert dump_json("--files", txn) == [
        {"version": 0, "producer_id": 42, "first_offset": 100, "last_offset": 104,
         "last_stable_offset": 105}
    ]  # fmt: skip


def test_indexes_written_by_the_storage_engine(tmp_path: Path) -> None:
    """The broker's own index writer (logstore.storage.index) and this reader agree."""
    from logstore.storage.index import OffsetIndex, TimeIndex

    log, layout = make_segment(tmp_path, base=0)
    offset_index = OffsetIndex(log.with_suffix(".index"), 0, max_index_size=4096)
    time_index = TimeIndex(log.with_suffix(".timeindex"), 0, max_index_size=4096)
    for position, _, last, max_ts in layout[1::2]:
        offset_index.append(last, position)
        time_index.maybe_append(max_ts, last)
    offset_index.flush()
    time_index.flush()
    files = [log.with_suffix(".index"), log.with_suffix(".timeindex")]
    # still preallocated (an unclean shutdown): the zero tail is reported, entries are right
    objs = dump_json("--files", *files)
    assert objs == [
        {"offset": layout[1][2], "position": layout[1][0]},
        {"offset": layout[3][2], "position": layout[3][0]},
        objs[2],
        {"timestamp": layout[1][3], "offset": layout[1][2]},
        {"timestamp": layout[3][3], "offset": layout[3][2]},
        objs[5],
    ]
    assert "510 zero entries after 2" in objs[2]["warning"]
    assert "339 zero entries after 2" in objs[5]["warning"]
    expected = list(offset_index.entries())
    offset_index.close()
    time_index.close()
    assert [(o["offset"], o["position"]) for o in dump_json("--files", files[0])] == [
        tuple(e) for e in expected
    ]
    passed = dump_json("--index-sanity-check", "--files", *files)
    assert [o.get("sanity_check") for o in passed] == ["passed", "passed"]
