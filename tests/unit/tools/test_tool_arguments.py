"""The operators' tools' argument parsing (no broker): Kafka's formats for reset specs,
``--add-config``, offset JSON and ``--time``; ``--bootstrap-server`` anywhere; ``--version``."""

from __future__ import annotations

import datetime
import subprocess
import sys

import pytest

from logstore import __version__
from logstore.cli import build_parser
from logstore.tools.admin import ToolError, bootstrap_of, table
from logstore.tools.configs import parse_add_config
from logstore.tools.delete_records import parse_offset_json
from logstore.tools.get_offsets import parse_time
from logstore.tools.groups import parse_duration, parse_topic_partitions


def test_add_config_is_split_as_kafka_splits_it() -> None:
    assert parse_add_config("retention.ms=1000,cleanup.policy=[delete,compact],x=a=b") == {
        "retention.ms": "1000",
        "cleanup.policy": "delete,compact",
        "x": "a=b",
    }
    for bad in ("retention.ms", "=1", "a=[1,2", "a=1,,b=2"):
        with pytest.raises(ToolError, match="key=val"):
            parse_add_config(bad)


def test_offset_json() -> None:
    text = '{"partitions": [{"topic": "t", "partition": 1, "offset": -1}], "version": 1}'
    assert parse_offset_json(text) == {("t", 1): -1}
    for bad, message in [
        ("[]", '"partitions"'),
        ('{"partitions": {}}', '"partitions"'),
        ('{"partitions": [1]}', "expected an object"),
        ('{"partitions": [{"topic": "", "partition": 0, "offset": 0}]}', "'topic'"),
        ('{"partitions": [{"topic": "t", "partition": true, "offset": 0}]}', "'partition'"),
        ('{"partitions": [{"topic": "t", "partition": 0, "offset": -2}]}', "'offset'"),
        ('{"partitions": [{"topic": "t", "partition": 0, "offset": 1.5}]}', "'offset'"),
        (
            '{"partitions": [{"topic": "t", "partition": 0, "offset": 1},'
            ' {"topic": "t", "partition": 0, "offset": 2}]}',
            "duplicate topic partitions: t-0",
        ),
        ('{"partitions": []}', "no partitions"),
    ]:
        with pytest.raises(ToolError, match=message) as info:
            parse_offset_json(bad)
        assert not info.value.retriable


def test_reset_spec_parts() -> None:
    assert parse_topic_partitions("orders") == ("orders", None)
    assert parse_topic_partitions("orders:0,3") == ("orders", [0, 3])
    for bad in (":0", "orders:", "orders:a", "orders:-1"):
        with pytest.raises(ToolError):
            parse_topic_partitions(bad)
    assert parse_duration("PT1H30M") == datetime.timedelta(hours=1, minutes=30)
    assert parse_duration("P2DT0.5S") == datetime.timedelta(days=2, seconds=0.5)
    assert parse_duration("-PT10M") == -datetime.timedelta(minutes=10)
    for bad in ("P", "PT", "1H", "5h", "PT1X", ""):
        with pytest.raises(ToolError, match="ISO 8601 duration"):
            parse_duration(bad)


def test_get_offsets_time() -> None:
    assert [parse_time(t) for t in ("latest", "earliest", "max-timestamp")] == [-1, -2, -3]
    assert [parse_time(t) for t in ("-1", "-2", "-3", "0", "1700000000000")] == [
        -1, -2, -3, 0, 1_700_000_000_000,
    ]  # fmt: skip
    for bad in ("-4", "yesterday", "1.5"):
        with pytest.raises(ToolError, match="Malformed time argument"):
            parse_time(bad)


def test_bootstrap_server_anywhere_on_the_line() -> None:
    parser = build_parser()
    for argv in (
        ["--bootstrap-server", "h:1", "groups", "--list"],
        ["groups", "--bootstrap-server", "h:1", "--list"],
        ["groups", "--list", "--bootstrap-server", "h:1"],
        ["--bootstrap-server", "h:1", "topics", "list"],
        ["topics", "--bootstrap-server", "h:1", "list"],
        ["topics", "list", "--bootstrap-server", "h:1"],
        ["topics", "alter", "t", "--partitions", "2", "--bootstrap-server", "h:1"],
        ["configs", "--describe", "--topic", "t", "--bootstrap-server", "h:1"],
        ["acls", "--list", "--bootstrap-server", "h:1"],
        ["get-offsets", "--bootstrap-server=h:1"],
        ["delete-records", "--offset-json-file", "f", "--bootstrap-server", "h:1"],
    ):
        assert bootstrap_of(parser.parse_args(argv)) == "h:1", argv
    assert bootstrap_of(parser.parse_args(["groups", "--list"])) == "127.0.0.1:9092"


def test_table_pads_columns() -> None:
    assert table([("GROUP", "LAG"), ("a-long-group", 5)]) == ["GROUP        LAG", "a-long-group 5"]


def loglake(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "logstore.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_version_and_unreachable_broker() -> None:
    out = loglake("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"loglake {__version__}"
    for args in (
        ("--bootstrap-server", "127.0.0.1:1", "groups", "--list"),
        ("configs", "--describe", "--topic", "t", "--bootstrap-server", "127.0.0.1:1"),
        ("get-offsets", "--bootstrap-server", "127.0.0.1:1"),
        ("acls", "--list", "--bootstrap-server", "127.0.0.1:1"),
    ):
        out = loglake(*args)
        assert out.returncode == 2 and "cannot connect to 127.0.0.1:1" in out.stderr, args
        assert "Traceback" not in out.stderr
    # argument rules are checked before any connection
    out = loglake("groups", "--describe", "--bootstrap-server", "127.0.0.1:1")
    assert out.returncode == 2 and "--group is required" in out.stderr
    out = loglake("groups", "--list", "--to-earliest", "--bootstrap-server", "127.0.0.1:1")
    assert out.returncode == 2 and "go with --reset-offsets" in out.stderr
    out = loglake("configs", "--alter", "--topic", "t", "--bootstrap-server", "127.0.0.1:1")
    assert out.returncode == 2 and "--alter needs --add-config" in out.stderr
    out = loglake("acls", "--add", "--topic", "t", "--bootstrap-server", "127.0.0.1:1")
    assert out.returncode == 2 and "--add needs --allow-principal" in out.stderr
    out = loglake("acls", "--add", "--allow-principal", "alice", "--topic", "t")
    assert out.returncode == 2 and "expected Type:name" in out.stderr
    out = loglake("acls", "--list", "--resource-pattern-type", "glob", "--bootstrap-server", "x:1")
    assert out.returncode == 2 and "expected one of any, literal, match, prefixed" in out.stderr
