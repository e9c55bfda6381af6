"""``logstore.failpoints``: a named step kills the process (SIGKILL) only when armed."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from logstore.failpoints import FAILPOINT_ENV, armed

_ROOT = Path(__file__).resolve().parents[3]
_SCRIPT = """
import sys
from logstore.failpoints import failpoint
print("before", flush=True)
failpoint("unit.step", before=lambda: print("flushed", flush=True))
print("after", flush=True)
"""


def _run(env_value: str | None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin"}
    if env_value is not None:
        env[FAILPOINT_ENV] = env_value
    return subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        check=False,
        cwd=_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("value", ["unit.step", "other.step,unit.step", " unit.step "])
def test_an_armed_step_kills_the_process_after_its_before_hook(value: str) -> None:
    proc = _run(value)
    assert proc.returncode == -signal.SIGKILL
    assert proc.stdout.split() == ["before", "flushed"]


@pytest.mark.parametrize("value", [None, "", "unit", "unit.step2", "other.step"])
def test_an_unarmed_step_does_nothing(value: str | None) -> None:
    proc = _run(value)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["before", "after"]


def test_armed_reads_the_environment_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FAILPOINT_ENV, raising=False)
    assert not armed("a.b")
    monkeypatch.setenv(FAILPOINT_ENV, "a.b,c.d")
    assert armed("a.b") and armed("c.d") and not armed("a")
