"""``jobs/<x>.py --help`` and argument errors answer without loading Spark, Delta or the
decoder: each job imports them only once its arguments are parsed (measured: 0.95-1.4 s of
CPU per ``--help`` before, ~0.2 s after).

Each case runs the job as a script in a fresh interpreter (as ``python jobs/x.py`` does) and
reports which heavy modules ended up in ``sys.modules``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
JOBS = ["ingest", "build_lookups", "compact", "quality", "retention", "maintain", "decode"]
HEAVY = ["pyspark", "deltalake", "great_expectations", "numba", "pandas", "polars"]

# Runs the script at argv[1] as __main__ with the rest as its arguments, then prints the exit
# code and the heavy modules loaded as the last line of stdout.
_WRAPPER = """
import json, runpy, sys
heavy = json.loads(sys.argv[1])
sys.argv = sys.argv[2:]
code = 0
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "loaded": [m for m in heavy if m in sys.modules]}))
"""


def run_job(job: str, *args: str) -> tuple[dict[str, object], str]:
    proc = subprocess.run(
        [sys.executable, "-c", _WRAPPER, json.dumps(HEAVY), str(ROOT / "jobs" / f"{job}.py"),
         *args],
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    *output, last = proc.stdout.splitlines()
    return json.loads(last), "\n".join(output) + proc.stderr


@pytest.mark.parametrize("job", JOBS)
def test_help_loads_no_spark_delta_or_decoder(job: str) -> None:
    result, output = run_job(job, "--help")
    assert result == {"code": 0, "loaded": []}
    assert f"jobs/{job}.py" in output and "Exit codes:" in output


@pytest.mark.parametrize("job", JOBS)
def test_an_argument_error_loads_no_spark_delta_or_decoder(job: str) -> None:
    result, output = run_job(job, "--config", "conf/pipeline.toml", "--no-such-option")
    assert result == {"code": 2, "loaded": []}
    assert "unrecognized arguments: --no-such-option" in output


@pytest.mark.parametrize("job", JOBS)
def test_a_bad_config_value_loads_no_spark_delta_or_decoder(job: str, tmp_path: Path) -> None:
    """The config file is checked whole before the job imports its pipeline modules."""
    conf = tmp_path / "pipeline.toml"
    conf.write_text('[ingest]\nfail_on_corrupt = "false"\n')
    result, output = run_job(job, "--config", str(conf))
    assert result == {"code": 2, "loaded": []}
    assert '[ingest] fail_on_corrupt = "false": expected a boolean' in output


def test_the_wrapper_sees_what_a_job_loads(tmp_path: Path) -> None:
    """The check itself can fail: a job that goes past its arguments and its config (here: a
    valid config naming a log dir that does not exist) has loaded its pipeline modules by
    then."""
    conf = tmp_path / "pipeline.toml"
    conf.write_text(
        f'[paths]\nlog_dirs = ["{tmp_path / "none"}"]\nlake = "{tmp_path / "lake"}"\n'
        '[ingest]\ntopics = ["orders"]\n'
    )
    result, output = run_job("ingest", "--config", str(conf))
    assert result["code"] == 2  # a wrong path: a configuration error
    assert "pyspark" in result["loaded"]  # type: ignore[operator]
    assert "ingest failed: log dir does not exist" in output
