"""The operators' tools (``loglake groups|configs|delete-records|get-offsets|topics alter``)
against the real broker, with the state made and checked by real Kafka clients
(confluent-kafka producer, consumer and AdminClient; kafka-python for DescribeLogDirs)."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource
from kafka import KafkaAdminClient
from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.static.constants import EntityType
from kio.static.primitive import i32

from logstore.tools.connection import KafkaConnection
from tests.fixtures.broker import ROOT, wait_for

BASE_TS = 1_600_000_000_000  # 2020-09-13: every record is older than an hour ago


def loglake(*args: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [sys.executable, "-m", "logstore.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in out.stderr, out.stderr
    return out


def make_topic(bootstrap: str, topic: str, *, partitions: int = 2, records: int = 10) -> None:
    """``records`` records per partition, record i of each with timestamp BASE_TS + i s."""
    out = loglake(
        "topics", "create", topic, "--partitions", str(partitions), "--bootstrap-server", bootstrap
    )
    assert out.returncode == 0, out.stdout + out.stderr
    producer = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for p in range(partitions):
        for i in range(records):
            producer.produce(topic, value=b"v%d" % i, partition=p, timestamp=BASE_TS + i * 1000)
    assert producer.flush(30) == 0


def commit(bootstrap: str, group: str, offsets: dict[tuple[str, int], int]) -> None:
    """A real consumer group member commits ``offsets`` and leaves (the group is Empty)."""
    consumer = ck.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    consumer.commit(
        offsets=[ck.TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False
    )
    consumer.close()


def committed(bootstrap: str, group: str, topic: str, partitions: int = 2) -> dict[int, int]:
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = consumer.committed([ck.TopicPartition(topic, p) for p in range(partitions)], 30)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in tps}


def rows(stdout: str, group: str) -> dict[tuple[str, int], list[str]]:
    """The table lines of ``stdout`` that start with ``group``, keyed by (topic, partition)."""
    out = {}
    for line in stdout.splitlines():
        cells = line.split()
        if cells and cells[0] == group:
            out[(cells[1], int(cells[2]))] = cells[3:]
    return out


def test_groups_describe_reset_delete(broker: Any) -> None:
    b, topic, group = broker.bootstrap, "ops-groups", "ops-g1"
    make_topic(b, topic)
    commit(b, group, {(topic, 0): 4, (topic, 1): 7})

    out = loglake("groups", "--list", "--bootstrap-server", b)
    assert out.returncode == 0 and group in out.stdout.split()

    # --bootstrap-server before the subcommand works too
    out = loglake("--bootstrap-server", b, "groups", "--describe", "--group", group)
    assert out.returncode == 0, out.stderr
    assert f"Consumer group '{group}' has no active members." in out.stdout
    assert "CURRENT-OFFSET" in out.stdout and "LOG-END-OFFSET" in out.stdout
    table = rows(out.stdout, group)
    assert table[(topic, 0)][:3] == ["4", "10", "6"] and table[(topic, 1)][:3] == ["7", "10", "3"]
    assert table[(topic, 0)][3:] == ["-", "-", "-"]  # no owner

    def reset(*spec: str) -> subprocess.CompletedProcess[str]:
        return loglake(
            "groups", "--bootstrap-server", b, "--reset-offsets", "--group", group, *spec
        )

    # a dry run (the default) prints the plan and commits nothing
    out = reset("--to-earliest", "--topic", topic)
    assert out.returncode == 0, out.stderr
    assert "NEW-OFFSET" in out.stdout and "--execute option is missing" in out.stderr
    assert {k: v[0] for k, v in rows(out.stdout, group).items()} == {
        (topic, 0): "0",
        (topic, 1): "0",
    }
    assert committed(b, group, topic) == {0: 4, 1: 7}
    out = reset("--to-earliest", "--topic", topic, "--dry-run")
    assert out.returncode == 0 and "--execute option is missing" not in out.stderr
    assert committed(b, group, topic) == {0: 4, 1: 7}

    expectations: list[tuple[tuple[str, ...], dict[int, int]]] = [
        (("--to-offset", "5", "--topic", f"{topic}:0"), {0: 5, 1: 7}),
        (("--shift-by", "-2", "--all-topics"), {0: 3, 1: 5}),
        (("--shift-by", "100", "--topic", topic), {0: 10, 1: 10}),  # clamped to the log end
        (("--to-offset", "-7", "--topic", topic), {0: 0, 1: 0}),  # clamped to the log start
        (("--to-datetime", "2020-09-13T12:26:45.000Z", "--topic", topic), {0: 5, 1: 5}),
        (("--by-duration", "PT1H", "--topic", f"{topic}:1"), {0: 5, 1: 10}),  # none that recent
        (("--to-latest", "--topic", f"{topic}:0"), {0: 10, 1: 10}),
        (("--to-earliest", "--all-topics"), {0: 0, 1: 0}),
        (("--to-current", "--all-topics"), {0: 0, 1: 0}),
    ]
    for spec, expected in expectations:
        out = reset(*spec, "--execute")
        assert out.returncode == 0, (spec, out.stdout, out.stderr)
        assert committed(b, group, topic) == expected, spec
    # BASE_TS + 5 s is 2020-09-13T12:26:45Z: offset 5 is the first record at or after it
    assert datetime.datetime.fromtimestamp((BASE_TS + 5000) / 1000, datetime.UTC).isoformat() == (
        "2020-09-13T12:26:45+00:00"
    )

    # bad reset specs and scopes: exit 2, a clear message, nothing committed
    for spec, message in [
        (("--to-datetime", "yesterday", "--topic", topic), "--to-datetime 'yesterday'"),
        (("--by-duration", "5h", "--topic", topic), "ISO 8601 duration"),
        (("--to-earliest",), "needs a scope"),
        (("--topic", topic), "needs one reset spec"),
        (("--to-earliest", "--topic", f"{topic}:x"), "TOPIC:PARTITION"),
        (("--to-earliest", "--topic", f"{topic}:9"), f"{topic}-9 does not exist"),
        (("--to-earliest", "--topic", "no-such-topic"), "UNKNOWN_TOPIC_OR_PARTITION"),
    ]:
        out = reset(*spec, "--execute")
        assert out.returncode == 2, (spec, out.stdout, out.stderr)
        assert message in out.stderr, (spec, out.stderr)
    out = loglake(
        "groups", "--bootstrap-server", b, "--reset-offsets", "--group", group, "--to-offset", "x"
    )
    assert out.returncode == 2 and "invalid int value" in out.stderr
    assert committed(b, group, topic) == {0: 0, 1: 0}

    out = loglake("groups", "--bootstrap-server", b, "--describe", "--group", "no-such-group")
    assert out.returncode == 2 and "Consumer group 'no-such-group' does not exist." in out.stderr

    out = loglake("groups", "--bootstrap-server", b, "--delete", "--group", group)
    assert out.returncode == 0, out.stderr
    assert f"Deletion of requested consumer groups ('{group}') was successful." in out.stdout
    assert committed(b, group, topic) == {0: ck.OFFSET_INVALID, 1: ck.OFFSET_INVALID}
    assert group not in loglake("groups", "--list", "--bootstrap-server", b).stdout.split()
    out = loglake("groups", "--bootstrap-server", b, "--delete", "--group", group)
    assert out.returncode == 2 and "GROUP_ID_NOT_FOUND" in out.stderr


def test_groups_with_a_live_member(broker: Any) -> None:
    b, topic, group = broker.bootstrap, "ops-live", "ops-live-g"
    make_topic(b, topic, partitions=2, records=3)
    consumer = ck.Consumer(
        {
            "bootstrap.servers": b,
            "group.id": group,
            "client.id": "ops-live-client",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe([topic])
        seen: list[Any] = []

        def consumed_all() -> bool:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                seen.append(msg)
            return len(seen) == 6

        wait_for(consumed_all)
        consumer.commit(asynchronous=False)
        out = loglake("groups", "--bootstrap-server", b, "--describe", "--group", group)
        assert out.returncode == 0, out.stderr
        table = rows(out.stdout, group)
        assert set(table) == {(topic, 0), (topic, 1)}
        for cells in table.values():
            assert cells[:3] == ["3", "3", "0"] and cells[5] == "ops-live-client"
        out = loglake("groups", "--bootstrap-server", b, "--describe", "--group", group, "--state")
        assert out.returncode == 0, out.stderr
        state = out.stdout.split()
        assert state[-3:] == ["range", "Stable", "1"] and f"({0})" in out.stdout
        out = loglake(
            "groups", "--bootstrap-server", b, "--describe", "--group", group, "--members"
        )
        assert out.returncode == 0, out.stderr
        member = [line.split() for line in out.stdout.splitlines() if line.startswith(group)]
        assert len(member) == 1 and member[0][0] == group
        assert member[0][2:] == ["/127.0.0.1", "ops-live-client", "2"]
        out = loglake(
            "groups", "--bootstrap-server", b, "--reset-offsets", "--group", group,
            "--to-earliest", "--all-topics", "--execute",
        )  # fmt: skip
        assert out.returncode == 1 and "current state is Stable" in out.stderr
        out = loglake("groups", "--bootstrap-server", b, "--delete", "--group", group)
        assert out.returncode == 1 and "NON_EMPTY_GROUP" in out.stderr
    finally:
        consumer.close()
    assert committed(b, group, topic) == {0: 3, 1: 3}


def test_configs_describe_and_alter(broker: Any) -> None:
    b, topic = broker.bootstrap, "ops-configs"
    make_topic(b, topic, partitions=1, records=1)
    admin = AdminClient({"bootstrap.servers": b})

    def client_view() -> dict[str, str]:
        res = ConfigResource(ConfigResource.Type.TOPIC, topic)
        entries = admin.describe_configs([res])[res].result(30)
        return {k: e.value for k, e in entries.items() if e.source == 1}  # DYNAMIC_TOPIC_CONFIG

    def configs(*args: str) -> subprocess.CompletedProcess[str]:
        return loglake("configs", "--bootstrap-server", b, *args)

    out = configs("--alter", "--entity-type", "topics", "--entity-name", topic,
                  "--add-config", "retention.ms=60000,cleanup.policy=[delete,compact]")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert f"Completed updating config for topic {topic}." in out.stdout
    assert client_view() == {"retention.ms": "60000", "cleanup.policy": "delete,compact"}
    out = configs("--describe", "--topic", topic)
    assert out.returncode == 0, out.stderr
    assert f"Dynamic configs for topic {topic} are:" in out.stdout
    assert (
        "  retention.ms=60000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=60000"
        in out.stdout
    )
    out = configs("--alter", "--topic", topic, "--delete-config", "retention.ms")
    assert out.returncode == 0, out.stderr
    assert client_view() == {"cleanup.policy": "delete,compact"}
    out = configs("--describe", "--entity-type", "topics", "--entity-name", topic, "--all")
    assert out.returncode == 0 and f"All configs for topic {topic} are:" in out.stdout
    assert "  retention.ms=" in out.stdout and "segment.bytes=" in out.stdout
    out = configs("--describe", "--entity-type", "brokers", "--entity-name", "0", "--all")
    assert out.returncode == 0 and "All configs for broker 0 are:" in out.stdout, out.stderr

    # the broker validates; its refusal comes back, exit 2, nothing changed
    out = configs("--alter", "--topic", topic, "--add-config", "retention.ms=soon")
    assert out.returncode == 2 and "INVALID_CONFIG" in out.stderr and "retention.ms" in out.stderr
    out = configs("--alter", "--topic", topic, "--add-config", "retention.msx=1")
    assert out.returncode == 2 and "retention.msx" in out.stderr, out.stderr
    out = configs("--alter", "--topic", topic, "--add-config", "retention.ms")
    assert out.returncode == 2 and '"key=val"' in out.stderr
    out = configs("--describe", "--entity-type", "topics")
    assert out.returncode == 2 and "--entity-name is required" in out.stderr
    out = configs("--describe", "--topic", "no-such-topic")
    assert out.returncode == 2 and "UNKNOWN_TOPIC_OR_PARTITION" in out.stderr
    assert client_view() == {"cleanup.policy": "delete,compact"}


def test_delete_records_and_get_offsets(broker: Any, tmp_path: Path) -> None:
    b, topic = broker.bootstrap, "ops-records"
    make_topic(b, topic)

    def offsets(*args: str) -> subprocess.CompletedProcess[str]:
        return loglake("get-offsets", "--bootstrap-server", b, "--topic", topic, *args)

    assert offsets().stdout.splitlines() == [f"{topic}:0:10", f"{topic}:1:10"]
    assert offsets("--time", "-2").stdout.splitlines() == [f"{topic}:0:0", f"{topic}:1:0"]
    out = offsets("--time", str(BASE_TS + 3500), "--partitions", "1")
    assert out.returncode == 0 and out.stdout.splitlines() == [f"{topic}:1:4"]
    assert offsets("--time", str(BASE_TS + 60_000)).stdout == ""  # no record that recent
    out = offsets("--time", "max-timestamp", "--partitions", "0")
    assert out.stdout.splitlines() == [f"{topic}:0:9"]
    out = offsets("--time", "yesterday")
    assert out.returncode == 2 and "Malformed time argument yesterday" in out.stderr
    out = loglake("get-offsets", "--bootstrap-server", b, "--topic", "no-such-.*")
    assert out.returncode == 2 and "Could not match any topic-partitions" in out.stderr
    consumer = ck.Consumer({"bootstrap.servers": b, "group.id": "ops-records-probe"})
    found = consumer.offsets_for_times([ck.TopicPartition(topic, 1, BASE_TS + 3500)], 30)
    assert found[0].offset == 4  # what get-offsets printed

    spec = tmp_path / "offsets.json"
    spec.write_text(json.dumps({"partitions": [{"topic": topic, "partition": 0, "offset": 3},
                                               {"topic": topic, "partition": 1, "offset": -1}],
                                "version": 1}))  # fmt: skip
    out = loglake("delete-records", "--offset-json-file", str(spec), "--bootstrap-server", b)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Records delete operation completed:" in out.stdout
    assert f"partition: {topic}-0\tlow_watermark: 3" in out.stdout
    assert f"partition: {topic}-1\tlow_watermark: 10" in out.stdout
    assert consumer.get_watermark_offsets(ck.TopicPartition(topic, 0), 30) == (3, 10)
    assert consumer.get_watermark_offsets(ck.TopicPartition(topic, 1), 30) == (10, 10)
    consumer.close()
    assert offsets("--time", "earliest").stdout.splitlines() == [f"{topic}:0:3", f"{topic}:1:10"]

    for text, message in [
        ("{not json", "not valid JSON"),
        ('{"partitions": [{"topic": "t", "partition": -1, "offset": 1}]}', "'partition'"),
        ('{"partitions": [{"topic": "t", "partition": 0, "offset": "1"}]}', "'offset'"),
        ('{"partitions": [], "version": 2}', "unsupported version 2"),
    ]:
        spec.write_text(text)
        out = loglake("delete-records", "--offset-json-file", str(spec), "--bootstrap-server", b)
        assert out.returncode == 2 and message in out.stderr, (text, out.stderr)
    spec.write_text(json.dumps({"partitions": [{"topic": topic, "partition": 0, "offset": 99}]}))
    out = loglake("delete-records", "--offset-json-file", str(spec), "--bootstrap-server", b)
    assert out.returncode == 2 and f"partition: {topic}-0\terror: OFFSET_OUT_OF_RANGE" in out.stdout
    out = loglake("delete-records", "--offset-json-file", str(tmp_path / "missing.json"))
    assert out.returncode == 2 and "cannot read" in out.stderr


def test_topics_alter_and_if_exists(broker: Any) -> None:
    b, topic = broker.bootstrap, "ops-alter"

    def topics(*args: str) -> subprocess.CompletedProcess[str]:
        return loglake("topics", *args, "--bootstrap-server", b)  # after the action, too

    assert topics("create", topic, "--partitions", "1").returncode == 0
    out = topics("create", topic, "--if-not-exists")
    assert out.returncode == 0 and out.stdout == ""
    out = topics("alter", topic, "--partitions", "3", "--config", "retention.ms=120000")
    assert out.returncode == 0, out.stderr
    admin = AdminClient({"bootstrap.servers": b})
    assert len(admin.list_topics(topic, timeout=30).topics[topic].partitions) == 3
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    assert admin.describe_configs([res])[res].result(30)["retention.ms"].value == "120000"
    out = topics("alter", topic, "--partitions", "2")
    assert out.returncode == 2 and "INVALID_PARTITIONS" in out.stderr
    out = topics("alter", topic, "--config", "retention.ms=later")
    assert out.returncode == 2 and "INVALID_CONFIG" in out.stderr
    out = topics("alter", "ops-missing", "--partitions", "2")
    assert out.returncode == 2 and "UNKNOWN_TOPIC_OR_PARTITION" in out.stderr
    for action in (("alter", "ops-missing", "--partitions", "2"), ("delete", "ops-missing"),
                   ("describe", "ops-missing")):  # fmt: skip
        out = topics(*action, "--if-exists")
        assert out.returncode == 0 and out.stdout == "", (action, out.stderr)
    assert topics("delete", topic).returncode == 0


def test_describe_log_dirs(broker: Any) -> None:
    b, topic = broker.bootstrap, "ops-logdirs"
    make_topic(b, topic, partitions=2, records=5)
    client = KafkaAdminClient(bootstrap_servers=b)
    try:
        everything = client.describe_log_dirs()
        only_ours = client.describe_log_dirs(topic_partitions={topic: [1]})
    finally:
        client.close()
    assert [r["broker"] for r in everything] == [0]
    (log_dir,) = everything[0]["log_dirs"]
    assert log_dir["error_code"] == 0
    assert Path(log_dir["log_dir"]) == Path(broker.log_dir).resolve()
    volume = os.statvfs(broker.log_dir)
    assert log_dir["total_bytes"] == volume.f_blocks * volume.f_frsize
    assert 0 < log_dir["usable_bytes"] <= log_dir["total_bytes"]
    (ours,) = [t for t in log_dir["topics"] if t["name"] == topic]
    on_disk = {
        p: sum(f.stat().st_size for f in (Path(broker.log_dir) / f"{topic}-{p}").glob("*.log"))
        for p in (0, 1)
    }
    assert {p["partition_index"]: p["partition_size"] for p in ours["partitions"]} == on_disk
    assert all(p["offset_lag"] == 0 and p["is_future_key"] is False for p in ours["partitions"])
    assert all(size > 0 for size in on_disk.values())
    (filtered,) = only_ours[0]["log_dirs"]
    assert [
        (t["name"], [p["partition_index"] for p in t["partitions"]]) for t in filtered["topics"]
    ] == [(topic, [1])]


def test_dump_log_of_internal_topics_and_snapshots(broker_factory: Any) -> None:
    """A real broker's ``.snapshot``, ``__consumer_offsets`` and ``__transaction_state``
    files, written for real clients' work, decoded as kafka-dump-log decodes them."""
    b = broker_factory()
    topic = "ops-dump"
    make_topic(b.bootstrap, topic, partitions=1, records=0)
    idempotent = ck.Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True})
    for i in range(5):
        idempotent.produce(topic, value=b"i%d" % i, partition=0)
    assert idempotent.flush(30) == 0
    txn = ck.Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "ops-txn"})
    txn.init_transactions(30)
    txn.begin_transaction()
    txn.produce(topic, value=b"t", partition=0)
    txn.commit_transaction(30)
    member = ck.Consumer(
        {
            "bootstrap.servers": b.bootstrap,
            "group.id": "ops-dump-g",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    member.subscribe([topic])
    seen: list[Any] = []

    def read_all() -> bool:
        msg = member.poll(0.2)
        if msg is not None and msg.error() is None:
            seen.append(msg)
        return len(seen) == 6

    wait_for(read_all)
    member.commit(asynchronous=False)  # offset 6: after the last record read
    member.close()
    del idempotent, txn  # librdkafka clients gone before the broker stops
    assert b.stop() == 0  # a clean shutdown writes a producer snapshot at the log end
    logs = Path(b.log_dir)

    snapshots = sorted((logs / f"{topic}-0").glob("*.snapshot"))
    assert snapshots, sorted(p.name for p in (logs / f"{topic}-0").iterdir())
    out = loglake("dump-log", "--files", str(snapshots[-1]))
    assert out.returncode == 0, out.stdout + out.stderr
    producers = [line for line in out.stdout.splitlines() if line.startswith("producerId: ")]
    assert len(producers) == 2
    idem = next(line for line in producers if "lastSequence: 4 " in line)
    words = idem.split()
    fields = dict(zip(words[::2], words[1::2], strict=True))
    assert fields["lastOffset:"] == "4" and fields["currentTxnFirstOffset:"] == "OptionalLong.empty"
    # the producer's last batch: librdkafka decides how the five records were batched
    delta = int(fields["offsetDelta:"])
    assert int(fields["firstSequence:"]) == 4 - delta and fields["producerEpoch:"] == "0"
    out = loglake("dump-log", "--json", "--files", str(snapshots[-1]))
    entries = [json.loads(line) for line in out.stdout.splitlines()]
    # offsets 0-4 idempotent, 5 the transaction's record, 6 its COMMIT marker (a marker is no
    # producer batch: it ends the open transaction and records the coordinator epoch)
    assert sorted(e["last_offset"] for e in entries) == [4, 5]
    (txn_entry,) = [e for e in entries if e["last_offset"] == 5]
    assert txn_entry["current_txn_first_offset"] is None and txn_entry["coordinator_epoch"] >= 0

    offsets_logs = sorted(logs.glob("__consumer_offsets-*/*.log"))
    out = loglake("dump-log", "--offsets-decoder", "--files", *map(str, offsets_logs))
    assert out.returncode == 0, out.stderr
    commit_key = (
        f'key: {{"type":"1","data":{{"group":"ops-dump-g","topic":"{topic}","partition":0}}}}'
    )
    line = next(line for line in out.stdout.splitlines() if commit_key in line)
    payload = json.loads(line.split(" payload: ", 1)[1])
    assert payload["data"]["offset"] == 6 and payload["version"] in ("1", "3")
    # the group's metadata, its member's subscription and assignment decoded (consumer protocol)
    group_key = 'key: {"type":"2","data":{"group":"ops-dump-g"}} payload: {'
    groups = [
        json.loads(line.split(" payload: ", 1)[1])["data"]
        for line in out.stdout.splitlines()
        if group_key in line
    ]
    (member_json,) = next(g["members"] for g in groups if g["members"])
    assert member_json["subscription"]["topics"] == [topic]
    assert member_json["assignment"]["assignedPartitions"] == [{"topic": topic, "partitions": [0]}]
    assert groups[0]["protocolType"] == "consumer"

    txn_logs = sorted(logs.glob("__transaction_state-*/*.log"))
    out = loglake("dump-log", "--transaction-log-decoder", "--files", *map(str, txn_logs))
    assert out.returncode == 0, out.stderr
    states = [
        json.loads(line.split(" payload: ", 1)[1])["data"]
        for line in out.stdout.splitlines()
        if 'key: {"type":"0","data":{"transactionalId":"ops-txn"}}' in line
    ]
    # Empty (init), Ongoing with the partition, PrepareCommit, CompleteCommit
    assert [s["transactionStatus"] for s in states] == [0, 1, 2, 4]
    assert states[1]["transactionPartitions"] == [{"topic": topic, "partitionIds": [0]}]


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_describe_log_dirs_versions(broker: Any, version: int) -> None:
    """Every version served answers with the same dirs and sizes; volume bytes from v4."""
    topic = "ops-logdirs-versions"
    if not (Path(broker.log_dir) / f"{topic}-0").is_dir():
        make_topic(broker.bootstrap, topic, partitions=2, records=5)
    request_mod = load_payload_module(35, version, EntityType.request)
    topics = (request_mod.DescribableLogDirTopic(topic=topic, partitions=(i32(0),)),)
    with KafkaConnection(broker.bootstrap) as conn:
        resp = conn.call(request_mod.DescribeLogDirsRequest(topics=topics))
    (result,) = resp.results
    assert result.error_code == ErrorCode.none
    assert [(t.name, [int(p.partition_index) for p in t.partitions]) for t in result.topics] == [
        (topic, [0])
    ]
    size = (Path(broker.log_dir) / f"{topic}-0" / "00000000000000000000.log").stat().st_size
    assert int(result.topics[0].partitions[0].partition_size) == size
    if version >= 4:
        assert int(result.total_bytes) > 0 and int(result.usable_bytes) > 0
    else:
        assert not hasattr(result, "total_bytes")
