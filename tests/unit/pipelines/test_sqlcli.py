"""``loglake sql`` against a real lake of Delta tables (written by delta-rs with the project's
own table schemas), run through the real CLI entry point; the prompt through a subprocess."""

from __future__ import annotations

import base64
import csv
import datetime as dt
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from logstore.cli import main
from pipelines.catalog import find_tables, table_name
from pipelines.sources.schema import RECORDS_ARROW_SCHEMA
from pipelines.sqlcli import format_value

ROOT = Path(__file__).resolve().parents[3]
T0 = dt.datetime(2024, 5, 1, 22, 0, 0, 123000, tzinfo=dt.UTC)
TIME_LOOKUP = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("max_timestamp", pa.int64()),
        ("first_offset", pa.int64()),
        ("last_offset", pa.int64()),
        ("segment", pa.int64()),
        ("file", pa.string()),
        ("position", pa.int64()),
        ("size", pa.int64()),
    ]
)
KEYS = [b"user-1", b"\xff\x00\x01", None]
VALUES = [b'{"a": 1}', b"x" * 100, None]


def _records(topic: str, start: int, n: int) -> pa.Table:
    rows = []
    for i in range(n):
        ts = T0 + dt.timedelta(hours=i)
        rows.append(
            {
                "topic": topic,
                "partition": 0,
                "offset": start + i,
                "timestamp": ts,
                "timestamp_type": 0,
                "key": KEYS[i % 3],
                "value": VALUES[i % 3],
                "headers": [{"key": "h", "value": b"v"}] if i % 2 else [],
                "producer_id": -1,
                "producer_epoch": -1,
                "base_sequence": -1,
                "is_transactional": False,
                "leader_epoch": 0,
                "segment_base_offset": 0,
                "batch_position": 0,
                "codec": "none",
                "date": ts.date(),
            }
        )
    return pa.Table.from_pylist(rows, schema=RECORDS_ARROW_SCHEMA)


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lake = tmp_path_factory.mktemp("lake")
    write_deltalake(lake / "records", _records("orders", 0, 3), partition_by=["topic", "date"])
    write_deltalake(
        lake / "records", _records("clicks", 0, 4), partition_by=["topic", "date"], mode="append"
    )
    lookup = pa.Table.from_pylist(
        [
            {"topic": "orders", "partition": 0, "max_timestamp": 1714600800123,
             "first_offset": 0, "last_offset": 2, "segment": 0, "file": "/l/orders-0/0.log",
             "position": 0, "size": 300},
        ],
        schema=TIME_LOOKUP,
    )  # fmt: skip
    write_deltalake(lake / "time_lookup", lookup, partition_by=["topic"])
    write_deltalake(lake / "topics" / "Orders.v2", pa.table({"k": ["a"], "n": [1]}))
    write_deltalake(lake / "_quality" / "hidden", pa.table({"x": [1]}))
    return lake


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["sql", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_tables_are_found_and_named(lake: Path) -> None:
    names = [t.name for t in find_tables(lake)]
    assert names == ["records", "time_lookup", "topics_orders_v2"]
    assert table_name("topics/my-topic.x") == "topics_my_topic_x"


def test_table_format_shows_bytes_timestamps_and_nulls(
    lake: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(
        capsys,
        "--lake", str(lake),
        'SELECT "offset", timestamp, key, value FROM records WHERE topic = \'orders\' '
        'ORDER BY "offset"',
    )  # fmt: skip
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[1].split("|")[1:-1] == [
        " offset ", " timestamp                ", " key      ", " " + "value".ljust(40) + " ",
    ]  # fmt: skip
    rows = [[c.strip() for c in ln.split("|")[1:-1]] for ln in lines[3:6]]
    assert rows == [
        ["0", "2024-05-01 22:00:00.123Z", "user-1", '{"a": 1}'],
        ["1", "2024-05-01 23:00:00.123Z", "0xff0001", "x" * 39 + "…"],
        ["2", "2024-05-02 00:00:00.123Z", "NULL", "NULL"],
    ]
    assert lines[-1] == "(3 rows)"


def test_csv_and_json_are_lossless(lake: Path, capsys: pytest.CaptureFixture[str]) -> None:
    query = 'SELECT "offset", timestamp, key, value, headers FROM records WHERE topic = \'clicks\' ORDER BY "offset"'  # noqa: E501
    code, out, _ = _run(capsys, "--lake", str(lake), "--format", "csv", query)
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["offset"] for r in rows] == ["0", "1", "2", "3"]
    assert [base64.b64decode(r["value"]) if r["value"] else None for r in rows] == [
        VALUES[i % 3] for i in range(4)
    ]
    assert rows[1]["key"] == base64.b64encode(b"\xff\x00\x01").decode()
    assert json.loads(rows[1]["headers"]) == [
        {"key": "h", "value": base64.b64encode(b"v").decode()}
    ]
    assert rows[0]["timestamp"] == "2024-05-01T22:00:00.123000Z"

    code, out, _ = _run(capsys, "--lake", str(lake), "--format", "json", query)
    assert code == 0
    objs = [json.loads(line) for line in out.splitlines()]
    assert [o["offset"] for o in objs] == [0, 1, 2, 3]
    assert objs[2]["key"] is None and objs[2]["value"] is None
    assert base64.b64decode(objs[0]["key"]) == b"user-1"
    assert objs[3]["headers"][0]["key"] == "h"


def test_time_travel_by_version(lake: Path, capsys: pytest.CaptureFixture[str]) -> None:
    q = "SELECT count(*) AS n FROM records"
    assert json.loads(_run(capsys, "--lake", str(lake), "--format", "json", q)[1]) == {"n": 7}
    code, out, _ = _run(capsys, "--lake", str(lake), "--format", "json", "--as-of-version",
                        "records=0", q)  # fmt: skip
    assert (code, json.loads(out)) == (0, {"n": 3})
    assert DeltaTable(str(lake / "records")).version() == 1  # the lake itself is unchanged


@pytest.fixture
def growing(tmp_path: Path) -> tuple[Path, list[int]]:
    """A lake whose ``t`` has versions 0, 1, 2 holding 1, 2, 3 rows, and a second table ``u``;
    returns it and ``t``'s commit timestamps (ms), oldest first."""
    lake = tmp_path / "lake"
    for i in range(3):
        write_deltalake(lake / "t", pa.table({"i": [i]}), mode="append")
        time.sleep(0.01)  # distinct commit timestamps (milliseconds) per version
    write_deltalake(lake / "u", pa.table({"i": [7]}))
    stamps = sorted((h["version"], h["timestamp"]) for h in DeltaTable(str(lake / "t")).history())
    assert [v for v, _ in stamps] == [0, 1, 2]
    assert stamps[0][1] < stamps[1][1] < stamps[2][1]
    return lake, [ts for _, ts in stamps]


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")


def test_time_travel_by_timestamp(
    growing: tuple[Path, list[int]], capsys: pytest.CaptureFixture[str]
) -> None:
    """As of an instant: the last version committed at or before it, per table."""
    lake, stamps = growing
    q = "SELECT (SELECT count(*) FROM t) AS t, (SELECT count(*) FROM u) AS u"
    for instant, rows in [
        (_iso(stamps[0]), 1),  # exactly version 0's commit
        (_iso(stamps[1] - 1), 1),  # just before version 1
        (_iso(stamps[1]), 2),
        (_iso(stamps[2] + 60_000), 3),  # after the last commit: the latest
    ]:
        code, out, err = _run(capsys, "--lake", str(lake), "--format", "json",
                              "--as-of-timestamp", f"t={instant}", q)  # fmt: skip
        assert (code, err) == (0, "")
        assert json.loads(out) == {"t": rows, "u": 1}, instant
    # a zone other than UTC names the same instant; no zone means UTC
    local = dt.datetime.fromtimestamp(stamps[1] / 1000, dt.timezone(dt.timedelta(hours=5)))
    naive = _iso(stamps[1]).removesuffix("+00:00")
    for instant in (local.isoformat(timespec="milliseconds"), naive):
        code, out, _ = _run(capsys, "--lake", str(lake), "--format", "json",
                            "--as-of-timestamp", f"t={instant}", q)  # fmt: skip
        assert json.loads(out)["t"] == 2
    # both pins on different tables; the same table twice is refused
    code, out, _ = _run(capsys, "--lake", str(lake), "--format", "json", "--as-of-version",
                        "t=0", "--as-of-timestamp", f"u={_iso(stamps[2] + 60_000)}", q)  # fmt: skip
    assert json.loads(out) == {"t": 1, "u": 1}
    code, _, err = _run(capsys, "--lake", str(lake), "--as-of-version", "t=0",
                        "--as-of-timestamp", f"t={_iso(stamps[2])}", q)  # fmt: skip
    assert code == 2 and "pinned twice" in err
    # before the first commit: an error, not version 0
    code, out, err = _run(capsys, "--lake", str(lake), "--as-of-timestamp",
                          f"t={_iso(stamps[0] - 1)}", q)  # fmt: skip
    assert (code, out) == (2, "")
    assert "has no version as of" in err and "first version 0 was committed at" in err
    code, _, err = _run(capsys, "--lake", str(lake), "--as-of-timestamp", "t=yesterday", q)
    assert code == 2 and "'yesterday' is not an ISO-8601 timestamp" in err


def test_history_lists_versions_operations_and_parameters(
    growing: tuple[Path, list[int]], capsys: pytest.CaptureFixture[str]
) -> None:
    lake, stamps = growing
    DeltaTable(str(lake / "t")).delete("i = 0")
    code, out, err = _run(capsys, "--lake", str(lake), "--format", "json", "--history", "t")
    assert (code, err) == (0, "")
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["version"] for r in rows] == [3, 2, 1, 0]
    assert [r["operation"] for r in rows] == ["DELETE", "WRITE", "WRITE", "WRITE"]
    assert json.loads(rows[0]["parameters"])["predicate"] == "i = 0"
    assert json.loads(rows[1]["parameters"])["mode"] == "Append"
    assert json.loads(rows[0]["metrics"])["num_deleted_rows"] == 1
    got = [dt.datetime.fromisoformat(r["timestamp"]) for r in rows[1:]]
    assert [int(g.timestamp() * 1000) for g in got] == list(reversed(stamps))
    # the table format, and the errors
    code, out, _ = _run(capsys, "--lake", str(lake), "--history", "t")
    header = [c.strip() for c in out.splitlines()[1].split("|")[1:-1]]
    assert code == 0 and header == ["version", "timestamp", "operation", "parameters", "metrics"]
    assert out.splitlines()[-1] == "(4 rows)"
    code, _, err = _run(capsys, "--lake", str(lake), "--history", "nope")
    assert code == 2 and "no table 'nope'" in err
    code, _, err = _run(capsys, "--lake", str(lake), "--history", "t", "SELECT 1")
    assert code == 2 and "--history takes no QUERY" in err


def test_lookup_timestamps_are_timestamps(lake: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(
        capsys, "--lake", str(lake), "--format", "json",
        "SELECT max_timestamp, max_timestamp_ms, arrow_typeof(max_timestamp) AS t "
        "FROM time_lookup",
    )  # fmt: skip
    assert code == 0
    assert json.loads(out) == {
        "max_timestamp": "2024-05-01T22:00:00.123000Z",
        "max_timestamp_ms": 1714600800123,
        "t": 'Timestamp(ms, "UTC")',
    }


@pytest.mark.parametrize(
    ("argv", "code", "needle"),
    [
        (["SELEC 1"], 1, "SELEC"),
        (["SELECT * FROM nope"], 1, "'nope' not found"),
        (["SELECT nope FROM records"], 1, "nope"),
        (["--as-of-version", "records=9", "SELECT 1"], 2, "versions 0..1"),
        (["--as-of-version", "ghost=1", "SELECT 1"], 2, "'ghost'"),
        (["--as-of-version", "records", "SELECT 1"], 2, "--as-of-version takes TABLE=N"),
        (["--as-of-timestamp", "records", "SELECT 1"], 2, "takes TABLE=TIMESTAMP"),
    ],
)
def test_errors_are_one_line_with_exit_codes(
    lake: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, needle: str
) -> None:
    got, out, err = _run(capsys, "--lake", str(lake), *argv)
    assert got == code
    assert out == ""
    assert err.startswith("loglake sql: error: ") and needle in err
    assert "Traceback" not in err


def test_missing_lake_is_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "--lake", str(tmp_path / "absent"), "SELECT 1")
    assert code == 2 and "lake directory does not exist" in err


def test_format_value_rules() -> None:
    assert format_value(b"caf\xc3\xa9") == "café"
    assert format_value(b"a\nb") == "0x610a62"  # valid UTF-8 but not printable
    assert format_value(b"\x00" * 30, max_width=10) == "0x0000000…"
    assert format_value(dt.datetime(2024, 1, 1, tzinfo=dt.UTC)) == "2024-01-01 00:00:00Z"
    assert format_value([{"key": "h", "value": b"\x01"}]) == "[{key: h, value: 0x01}]"


def test_prompt_reads_statements_and_meta_commands_from_stdin(lake: Path) -> None:
    script = "\n".join(
        [
            ".tables",
            ".schema time_lookup",
            "SELECT count(*) AS n",
            "FROM records;",
            ".history records",
            ".version records 0",
            ".format csv",
            "SELECT count(*) AS n FROM records;",
            "SELECT * FROM nope;",
            ".bogus",
            ".quit",
            "SELECT 'never run';",
        ]
    )
    proc = subprocess.run(
        [sys.executable, "-m", "logstore.cli", "sql", "--lake", str(lake)],
        input=script + "\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    out = proc.stdout.splitlines()
    assert out[:3] == ["records", "time_lookup", "topics_orders_v2"]
    assert out[3] == "time_lookup:"
    assert "  max_timestamp  timestamp[ms, tz=UTC]" in out
    assert "  max_timestamp_ms  int64" in out
    assert "| 7 |" in out  # the two-line statement, in the table format
    history = [[c.strip() for c in ln.split("|")[1:4]] for ln in out if "WRITE" in ln]
    assert [(v, op) for v, _, op in history] == [("1", "WRITE"), ("0", "WRITE")]
    assert out[-2:] == ["n", "3"]  # version 0, in CSV
    assert "never run" not in proc.stdout
    errors = proc.stderr.splitlines()
    assert len(errors) == 2 and "'nope' not found" in errors[0] and ".bogus" in errors[1]
    assert proc.returncode == 1  # a statement failed


def test_prompt_exit_zero_at_end_of_input(lake: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "logstore.cli", "sql", "--lake", str(lake), "--format", "json"],
        input="SELECT k, n FROM topics_orders_v2;\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, '{"k": "a", "n": 1}\n', "")


def test_column_mapped_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_deltalake(
        tmp_path / "mapped",
        pa.table({"a": [2, 1], "b": ["y", "x"]}),
        configuration={"delta.columnMapping.mode": "name"},
    )
    code, out, _ = _run(
        capsys, "--lake", str(tmp_path), "--format", "csv", "SELECT a, b FROM mapped ORDER BY a"
    )
    assert (code, out) == (0, "a,b\n1,x\n2,y\n")


def test_prompt_on_a_terminal(lake: Path) -> None:
    """On a terminal (a real pty): prompts, continuation lines, results, .quit."""
    import os
    import pty
    import select
    import time

    pid, fd = pty.fork()
    if pid == 0:  # the child: the real CLI on the pty
        os.chdir(ROOT)
        os.execv(sys.executable, [sys.executable, "-m", "logstore.cli", "sql", "--lake", str(lake)])
    seen = b""

    def until(marker: bytes) -> None:
        nonlocal seen
        deadline = time.monotonic() + 120
        while marker not in seen and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.5)[0]:
                try:
                    seen += os.read(fd, 4096)
                except OSError:
                    return

    try:
        until(b"sql> ")
        os.write(fd, b"SELECT count(*) AS n\n")
        until(b"...> ")
        os.write(fd, b"FROM records;\n")
        until(b"(1 row)")
        os.write(fd, b".quit\n")
        until(b"\x00")  # to end of output
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    text = seen.decode()
    assert "loglake sql: 3 tables; .help for commands" in text
    assert "| 7 |" in text
    assert os.waitstatus_to_exitcode(status) == 0
