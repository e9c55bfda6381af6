import subprocess
import sys


def test_help_lists_subcommands() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "logstore.cli", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "dump-log" in out
