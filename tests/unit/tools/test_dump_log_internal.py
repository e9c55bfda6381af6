"""``loglake dump-log`` on producer snapshots and on Kafka's internal topics' records
(``--offsets-decoder``, ``--transaction-log-decoder``): a real Kafka ``__consumer_offsets``
file, and records written with the broker's own encoders."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from logstore.protocol.records import build_batch
from logstore.server.group.schemas import (
    GroupValue,
    MemberValue,
    OffsetValue,
    encode_group_key,
    encode_group_value,
    encode_offset_key,
    encode_offset_value,
)
from logstore.server.txn.schemas import TxnLogValue, TxnState, encode_txn_key, encode_txn_value
from logstore.storage.producer_snapshot import SnapshotEntry, write_snapshot
from tests.unit.tools.test_dump_log import OFFSETS, dump, dump_json


def subscription_v1(topics: list[str]) -> bytes:
    """ConsumerProtocolSubscription v1: topics, null userData, ownedPartitions t:[0]."""
    out = struct.pack(">hi", 1, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    out += struct.pack(">i", -1)  # userData null
    out += struct.pack(">i", 1) + struct.pack(">h", 1) + b"t" + struct.pack(">ii", 1, 0)
    return out


def assignment_v0(topic: str, partitions: list[int]) -> bytes:
    out = struct.pack(">hi", 0, 1) + struct.pack(">h", len(topic)) + topic.encode()
    out += struct.pack(">i", len(partitions)) + b"".join(struct.pack(">i", p) for p in partitions)
    return out + struct.pack(">i", 3) + b"abc"  # userData


def test_real_consumer_offsets_group_record(kafka_real: Path) -> None:
    _, out, _ = dump("--offsets-decoder", "--files", kafka_real / OFFSETS)
    (line,) = [line for line in out.splitlines() if line.startswith("| offset: 0 ")]
    key, payload = line.split(" key: ", 1)[1].split(" payload: ", 1)
    assert key == '{"type":"2","data":{"group":"1"}}'
    value = json.loads(payload)
    assert value["version"] == "3"
    data = value["data"]
    assert (data["protocolType"], data["generation"], data["protocol"]) == (
        "connect",
        1,
        "sessioned",
    )
    assert data["currentStateTimestamp"] == 1785707911158
    (member,) = data["members"]
    assert member["clientId"] == "connect-172.18.0.5:8083" and member["clientHost"] == "/172.18.0.5"
    assert (member["rebalanceTimeout"], member["sessionTimeout"]) == (60000, 10000)
    assert member["groupInstanceId"] is None
    assert isinstance(member["subscription"], str)  # not the consumer protocol: base64 kept
    # --json keeps the raw bytes and adds the decoded strings
    (batch,) = dump_json("--offsets-decoder", "--files", kafka_real / OFFSETS)
    (record,) = batch["records"]
    assert record["decoded_key"] == key and record["decoded_payload"] == payload


def test_offsets_decoder_on_broker_encoded_records(tmp_path: Path) -> None:
    member = MemberValue(
        "m-1", None, "client-1", "/10.0.0.1", 30000, 10000, subscription_v1(["orders"]),
        assignment_v0("orders", [0, 2]),
    )  # fmt: skip
    records = [
        (encode_offset_key("g", "orders", 2), encode_offset_value(OffsetValue(42, "meta", 1000))),
        (encode_offset_key("g", "orders", 1), None),  # a tombstone: the offset was deleted
        (
            encode_group_key("g"),
            encode_group_value(GroupValue("consumer", 3, "range", "m-1", 7, (member,))),
        ),
        (struct.pack(">h", 9) + b"future", b"x"),  # a record type this tool does not know
        (encode_offset_key("g", "orders", 0), b"\x00\x03\x00"),  # truncated value
    ]
    log = tmp_path / "00000000000000000000.log"
    log.write_bytes(build_batch(records, base_timestamp=1000))
    code, out, _ = dump("--offsets-decoder", "--files", log)
    lines = [line.split(" key: ", 1)[1] for line in out.splitlines() if line.startswith("| ")]
    assert lines[0] == (
        '{"type":"1","data":{"group":"g","topic":"orders","partition":2}} payload: '
        '{"version":"3","data":{"offset":42,"leaderEpoch":-1,"metadata":"meta","commitTimestamp":1000}}'
    )
    assert lines[1].endswith(" payload: <DELETE>")
    group = json.loads(lines[2].split(" payload: ", 1)[1])["data"]
    (m,) = group["members"]
    assert m["subscription"] == {
        "topics": ["orders"],
        "userData": None,
        "ownedPartitions": [{"topic": "t", "partitions": [0]}],
    }
    assert m["assignment"] == {
        "assignedPartitions": [{"topic": "orders", "partitions": [0, 2]}],
        "userData": "YWJj",
    }
    assert lines[3] == "Unknown record type 9 at offset 3, skipping."
    assert lines[4].startswith("Error at offset 4, skipping. ") and "truncated" in lines[4]
    assert code == 0  # records Kafka's tool skips are not errors of the file


def test_transaction_log_decoder(tmp_path: Path) -> None:
    ongoing = TxnLogValue(7, 1, 60000, TxnState.ONGOING, (("orders", (0, 3)),), 2000, 1500)
    log = tmp_path / "00000000000000000000.log"
    log.write_bytes(
        build_batch(
            [(encode_txn_key("tx-1"), encode_txn_value(ongoing)), (encode_txn_key("tx-2"), None)],
            base_timestamp=1000,
        )
    )
    _, out, _ = dump("--transaction-log-decoder", "--files", log)
    lines = [line.split(" key: ", 1)[1] for line in out.splitlines() if line.startswith("| ")]
    key, payload = lines[0].split(" payload: ")
    assert key == '{"type":"0","data":{"transactionalId":"tx-1"}}'
    assert json.loads(payload) == {
        "version": "0",
        "data": {
            "producerId": 7,
            "producerEpoch": 1,
            "transactionTimeoutMs": 60000,
            "transactionStatus": 1,
            "transactionPartitions": [{"topic": "orders", "partitionIds": [0, 3]}],
            "transactionLastUpdateTimestampMs": 2000,
            "transactionStartTimestampMs": 1500,
        },
    }
    assert lines[1] == '{"type":"0","data":{"transactionalId":"tx-2"}} payload: <DELETE>'
    code, _, err = dump(
        "--offsets-decoder", "--transaction-log-decoder", "--files", log, expect=None
    )
    assert code == 2 and "not allowed with argument" in err


def test_producer_snapshot(tmp_path: Path) -> None:
    path = write_snapshot(
        tmp_path,
        120,
        [
            SnapshotEntry(5, 0, 9, 109, 4, 1700, -1, -1),  # idempotent: seqs 5-9, offsets 105-109
            SnapshotEntry(6, 2, 0, 110, 0, 1800, 3, 110),  # an open transaction from 110
            SnapshotEntry(8, 1, -1, -1, 0, 1900, 4, -1),  # only markers so far
        ],
    )
    assert path.name == "00000000000000000120.snapshot"
    _, out, _ = dump("--files", path)
    assert out.splitlines()[1:] == [
        "producerId: 5 producerEpoch: 0 coordinatorEpoch: -1 currentTxnFirstOffset:"
        " OptionalLong.empty lastTimestamp: 1700 firstSequence: 5 lastSequence: 9"
        " lastOffset: 109 offsetDelta: 4 timestamp: 1700",
        "producerId: 6 producerEpoch: 2 coordinatorEpoch: 3 currentTxnFirstOffset:"
        " OptionalLong[110] lastTimestamp: 1800 firstSequence: 0 lastSequence: 0"
        " lastOffset: 110 offsetDelta: 0 timestamp: 1800",
        "producerId: 8 producerEpoch: 1 coordinatorEpoch: 4 currentTxnFirstOffset:"
        " OptionalLong.empty lastTimestamp: 1900",
    ]
    objs = dump_json("--files", path)
    assert [o["current_txn_first_offset"] for o in objs] == [None, 110, None]
    assert objs[0]["first_sequence"] == 5 and objs[2]["first_sequence"] == -1

    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # the CRC no longer matches
    path.write_bytes(bytes(data))
    (err,) = dump_json("--files", path, expect=1)
    assert "CRC" in err["error"] and err["file"] == str(path)
    path.write_bytes(bytes(data[:7]))  # torn
    (err,) = dump_json("--files", path, expect=1)
    assert "shorter than its" in err["error"]
