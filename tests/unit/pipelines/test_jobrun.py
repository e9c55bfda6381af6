"""``pipelines.jobrun``: what the jobs' code really raises maps to the documented exit codes
(``pipelines.exit_codes``). Each error comes from the real function a job calls with a bad
input (a broker config, a source option, a log dir, a held lock, damaged bytes), not from a
hand-made instance, so a change of the error tree that moves one to another code fails here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from logstore.errors import LoglakeError
from logstore.protocol.batch import validate_batch
from logstore.server.config import BrokerConfig
from logstore.server.group.config import GroupConfig
from logstore.storage.dirlock import DirLock
from pipelines.config import check_log_dirs
from pipelines.exit_codes import EXIT_CORRUPT, EXIT_FAILED, EXIT_USAGE
from pipelines.jobrun import exit_code_for, run_job
from pipelines.logdir import as_partition_dir, partition_dirs
from pipelines.quality.config import load_quality_config
from pipelines.retention.job import load_retention_config
from pipelines.sources.plan import parse_options


def _raised(call: Callable[[], object]) -> BaseException:
    with pytest.raises(Exception) as info:
        call()
    return info.value


def _bad_broker_config(tmp: Path) -> object:
    (tmp / "broker.properties").write_text("num.partitions=zero\n")
    return BrokerConfig.load(tmp / "broker.properties")


def _unknown_broker_key(tmp: Path) -> object:
    (tmp / "broker.properties").write_text("num.partition=1\n")
    return BrokerConfig.load(tmp / "broker.properties")


def _held_lock(tmp: Path) -> object:
    DirLock(tmp).acquire()  # held by this "broker" until the test ends
    DirLock(tmp).acquire()
    return None


def _damaged_batch(tmp: Path) -> object:
    return validate_batch(memoryview(bytes(12) + b"\x00\x00\x00\x31" + bytes(61)))


def _retention_value(tmp: Path) -> object:
    (tmp / "p.toml").write_text("[retention]\nvacuum_hours = -1\n")
    return load_retention_config(str(tmp / "p.toml"))


def _log_dir_in_config(tmp: Path) -> object:
    (tmp / "p.toml").write_text(f'[paths]\nlog_dirs = ["{tmp / "nope"}"]\nlake = "{tmp}"\n')
    config = load_retention_config(str(tmp / "p.toml"))
    check_log_dirs(config.log_dirs, from_command_line=False, config=tmp / "p.toml")
    return config


def _quality_value(tmp: Path) -> object:
    (tmp / "p.toml").write_text('[quality]\ndocs = "yes"\n')
    return load_quality_config(tmp / "p.toml")


CASES: list[tuple[str, Callable[[Path], object], int]] = [
    ("broker config value", _bad_broker_config, EXIT_USAGE),
    ("broker config key", _unknown_broker_key, EXIT_USAGE),
    ("group config", lambda tmp: GroupConfig(offsets_topic_num_partitions=0), EXIT_USAGE),
    ("source option", lambda tmp: parse_options({"path": str(tmp), "kind": "rows"}), EXIT_USAGE),
    ("not a partition dir", lambda tmp: as_partition_dir(tmp / "orders"), EXIT_USAGE),
    ("retention value", _retention_value, EXIT_USAGE),
    ("quality value", _quality_value, EXIT_USAGE),
    ("log dir in the config", _log_dir_in_config, EXIT_USAGE),
    ("log dir gone during a run", lambda tmp: partition_dirs(tmp / "nope"), EXIT_FAILED),
    ("log dir locked", _held_lock, EXIT_FAILED),
    ("damaged batch", _damaged_batch, EXIT_CORRUPT),
]


@pytest.mark.parametrize(("what", "call", "code"), CASES, ids=[c[0] for c in CASES])
def test_what_the_code_raises_maps_to_its_exit_code(
    tmp_path: Path, what: str, call: Callable[[Path], object], code: int
) -> None:
    exc = _raised(lambda: call(tmp_path))
    assert isinstance(exc, LoglakeError), (what, type(exc), exc)
    assert exit_code_for(exc) == code, (what, type(exc).__mro__)


def test_run_job_prints_one_line_and_returns_the_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def body() -> int:
        _bad_broker_config(tmp_path)
        return 0

    assert run_job("retention", None, body) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("retention failed: num.partitions='zero'")
    assert run_job("retention", None, lambda: 0) == 0


def test_run_job_lets_a_bug_propagate() -> None:
    def body() -> int:
        return {"a": 1}["b"]

    with pytest.raises(KeyError):
        run_job("retention", None, body)
    assert exit_code_for(KeyError("b")) is None
