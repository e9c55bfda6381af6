"""The broker refuses to start when one of its modules fails to import.

No mock: a copy of the ``logstore`` package is put first on ``PYTHONPATH`` (shadowing the
installed one), one module of the copy is broken the way real modules break (a dependency
that is not installed, an exception at import), and the real ``loglake broker`` command runs
on it. Before, the registry skipped such a module (the group coordinator's APIs simply went
missing from ApiVersions, with one log line); now the process exits 1 and says which module
failed and why. The unbroken copy starting normally proves the shadowing itself works.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.broker import free_port

ROOT = Path(__file__).resolve().parents[3]


def _shadow(tmp_path: Path, broken: str | None, code: str) -> Path:
    shadow = tmp_path / "shadow"
    shutil.copytree(
        ROOT / "logstore", shadow / "logstore", ignore=shutil.ignore_patterns("__pycache__")
    )
    if broken is not None:
        target = shadow / broken
        target.write_text(target.read_text() + "\n" + code)  # after `from __future__`
    return shadow


def _run_broker(tmp_path: Path, shadow: Path) -> subprocess.Popen[str]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "logstore.cli",
        "broker",
        "--override",
        f"listeners=PLAINTEXT://127.0.0.1:{port}",
        "--override",
        f"log.dirs={tmp_path / 'logs'}",
    ]
    env = {**os.environ, "PYTHONPATH": str(shadow), "PYTHONDONTWRITEBYTECODE": "1"}
    # cwd outside the checkout: `python -m` puts the cwd first on sys.path
    return subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.parametrize(
    ("module", "code", "expected"),
    [
        (
            "logstore/server/group/handlers.py",
            "raise RuntimeError('group handlers deliberately broken')\n",
            "RuntimeError: group handlers deliberately broken",
        ),
        (
            "logstore/server/handlers/list_offsets.py",
            "import loglake_dependency_that_is_not_installed  # noqa\n",
            "No module named 'loglake_dependency_that_is_not_installed'",
        ),
    ],
)
def test_broker_refuses_to_start_when_a_module_fails_to_import(
    tmp_path: Path, module: str, code: str, expected: str
) -> None:
    proc = _run_broker(tmp_path, _shadow(tmp_path, module, code))
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, (proc.returncode, out, err)
    assert "loglake broker started" not in out
    first = err.splitlines()[0] if err else ""
    assert first.startswith("loglake broker: cannot start: a broker module failed to import")
    assert expected in first
    # the message names the broken module's file, in the shadow copy
    assert str(tmp_path / "shadow" / module) in first


def test_the_unbroken_shadow_copy_starts(tmp_path: Path) -> None:
    proc = _run_broker(tmp_path, _shadow(tmp_path, None, ""))
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        line = ""
        while time.monotonic() < deadline and proc.poll() is None:
            line = proc.stdout.readline()
            if line.startswith("loglake broker started on"):
                break
        assert line.startswith("loglake broker started on"), line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
