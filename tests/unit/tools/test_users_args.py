"""``loglake users`` arguments as kafka-configs takes them; bad ones exit 2 before any
connection (the bootstrap server named here listens nowhere)."""

from __future__ import annotations

import pytest

from logstore.cli import main
from logstore.tools.admin import ToolError
from logstore.tools.users import parse_scram_configs


def test_add_config_forms() -> None:
    assert parse_scram_configs(
        "SCRAM-SHA-256=[iterations=8192,password=a=b],SCRAM-SHA-512=[password=pw]"
    ) == [("SCRAM-SHA-256", 8192, "a=b"), ("SCRAM-SHA-512", 4096, "pw")]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("PLAIN=[password=x]", "not a SCRAM mechanism"),
        ("SCRAM-SHA-512=[iterations=8192]", "a password is required"),
        ("SCRAM-SHA-512=[iterations=100,password=x]", "in [4096, 16384]"),
        ("SCRAM-SHA-512=[iterations=99999,password=x]", "in [4096, 16384]"),
        ("SCRAM-SHA-512=[salt=x,password=x]", "expected [iterations=<n>,password=<p>]"),
        ("SCRAM-SHA-512", "key=val"),
    ],
)
def test_bad_add_config(text: str, message: str) -> None:
    with pytest.raises(ToolError) as info:
        parse_scram_configs(text)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--alter", "--add-config", "SCRAM-SHA-512=[password=x]"], "--alter needs --entity-name"),
        (["--alter", "--entity-name", "a"], "needs --add-config and/or --delete-config"),
        (["--alter", "--user", "a", "--delete-config", "SCRAM-SHA-1"], "not a SCRAM mechanism"),
        (["--alter", "--user", "a", "--entity-name", "b", "--delete-config", "SCRAM-SHA-512"],
         "different users"),
        (["--describe", "--delete-config", "SCRAM-SHA-512"], "go with --alter"),
        (["--alter", "--user", "a", "--add-config", "SCRAM-SHA-512=[password=x]",
          "--delete-config", "SCRAM-SHA-512"], "both added and deleted: SCRAM-SHA-512"),
    ],
)  # fmt: skip
def test_bad_arguments_exit_2(argv: list[str], message: str, capsys) -> None:
    code = main(["users", "--bootstrap-server", "127.0.0.1:1", *argv])
    assert code == 2
    assert message in capsys.readouterr().err
