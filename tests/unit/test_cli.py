from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from logstore.storage.dirlock import DirLock


def test_help_lists_subcommands() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "logstore.cli", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "dump-log" in out


# --- the exit codes each --help lists, exercised for real (loglake topics 0 and 1 need a broker:
# tests/integration/broker/test_fetch_and_tools.py::test_topics_tool; broker 0 is the SIGTERM
# shutdown of tests/integration/broker/test_crash_recovery.py; broker 3 needs a disk that fails
# at shutdown and is not exercised here)


def _loglake(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "logstore.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _broker_args(log_dir: Path, port: int = 0) -> list[str]:
    return [
        "broker",
        "--override",
        f"log.dirs={log_dir}",
        "--override",
        f"listeners=PLAINTEXT://127.0.0.1:{port}",
    ]


def test_broker_exits_2_on_bad_arguments_and_on_a_bad_config(tmp_path: Path) -> None:
    out = _loglake(*_broker_args(tmp_path), "--no-such-flag")
    assert out.returncode == 2 and "unrecognized arguments: --no-such-flag" in out.stderr
    out = _loglake(*_broker_args(tmp_path), "--override", "log.retention.hours=soon")
    assert out.returncode == 2 and "log.retention.hours" in out.stderr
    assert "configuration error" in out.stderr


def test_broker_exits_1_when_its_log_dir_is_locked(tmp_path: Path) -> None:
    with DirLock(tmp_path):  # as another broker holding the directory would
        out = _loglake(*_broker_args(tmp_path))
    assert out.returncode == 1, out.stderr
    assert "in use by another process" in out.stderr


def test_broker_exits_1_when_its_listener_cannot_bind(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        out = _loglake(*_broker_args(tmp_path / "logs", taken.getsockname()[1]))
    assert out.returncode == 1, out.stderr
    assert "cannot listen on" in out.stderr and "loglake broker started" not in out.stdout


def test_topics_exits_2_on_bad_arguments_and_without_a_broker(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from logstore.cli import main

    with pytest.raises(SystemExit) as info:
        main(["topics", "frobnicate"])
    assert info.value.code == 2
    assert main(["topics", "--bootstrap-server", "no-port", "list"]) == 2
    assert "expected host:port" in capsys.readouterr().err
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    assert main(["topics", "--bootstrap-server", f"127.0.0.1:{port}", "list"]) == 2
    assert "cannot connect" in capsys.readouterr().err


def test_dump_log_exits_0_on_a_good_segment_1_on_a_torn_one_2_on_bad_arguments(
    kafka_real: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from logstore.cli import main

    segment = kafka_real / "kafka-log-parser" / "tests" / "00000000000000000000.log"
    assert main(["dump-log", "--files", str(segment)]) == 0
    assert "baseOffset: 0" in capsys.readouterr().out
    torn = tmp_path / segment.name
    data = segment.read_bytes()
    torn.write_bytes(data[: len(data) - 7])  # the last batch cut short
    assert main(["dump-log", "--files", str(torn)]) == 1
    assert "ERROR" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main(["dump-log"])  # --files is required
    assert info.value.code == 2
