"""The jobs' common arguments: named topics missing from the log dirs, and exit codes that
match each job's --help. No Spark here: every case below ends before a job starts a session."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from logstore.errors import LoglakeError
from pipelines import exit_codes
from pipelines.config import (
    EXIT_MISSING_TOPICS,
    MissingTopicsError,
    check_topics,
    job_parser,
    log_dir_topics,
)
from tests.fixtures.jobs import load_job

ROOT = Path(__file__).resolve().parents[3]
JOBS = ["ingest", "build_lookups", "compact", "quality", "retention", "maintain", "decode"]
# The jobs that take topic names ([ingest] topics, [compact] topics, --topic).
TOPIC_JOBS = ["ingest", "build_lookups", "compact", "quality", "retention"]


def log_dir_with(tmp_path: Path, *partition_dirs: str) -> Path:
    log_dir = tmp_path / "logs"
    log_dir.mkdir(parents=True)
    for name in partition_dirs:
        (log_dir / name).mkdir()
    return log_dir


# --------------------------------------------------------------- check_topics


def test_log_dir_topics_counts_partition_directories_only(tmp_path: Path) -> None:
    log_dir = log_dir_with(
        tmp_path, "orders-0", "orders-1", "__consumer_offsets-3", "gone-0.abc123-delete",
        "not a partition", "stray-x",
    )  # fmt: skip
    (log_dir / "file-0").write_text("a file, not a directory")
    assert log_dir_topics([str(log_dir)]) == {"orders", "__consumer_offsets"}


def test_a_missing_log_dir_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(LoglakeError, match="log dir does not exist"):
        check_topics({"[ingest] topics": ["orders"]}, [str(tmp_path / "none")])


def test_missing_topics_are_an_error_naming_topic_source_and_log_dirs(tmp_path: Path) -> None:
    log_dir = log_dir_with(tmp_path, "orders-0")
    named = {"[ingest] topics": ["orders", "ordres"], "--topic": ["ordres", "users"]}
    with pytest.raises(MissingTopicsError) as info:
        check_topics(named, [str(log_dir)])
    message = str(info.value)
    assert "'ordres' ([ingest] topics and --topic)" in message
    assert "'users' (--topic)" in message
    assert "'orders'" not in message
    assert str(log_dir) in message and "--allow-missing-topics" in message


def test_allow_missing_warns_once_per_topic(tmp_path: Path) -> None:
    log_dir = log_dir_with(tmp_path, "orders-0")
    warnings: list[str] = []
    missing = check_topics(
        {"[compact] topics": ["users", "orders"], "[compact.strategy]": ["users"]},
        [str(log_dir)],
        allow_missing=True,
        warn=warnings.append,
    )
    assert missing == ["users"]
    assert len(warnings) == 1 and "'users' ([compact] topics and [compact.strategy])" in warnings[0]


def test_topics_in_any_log_dir_count_and_nothing_named_checks_nothing(tmp_path: Path) -> None:
    a = log_dir_with(tmp_path / "a", "orders-0")
    b = log_dir_with(tmp_path / "b", "users-2")
    assert check_topics({"x": ["orders", "users"]}, [str(a), str(b)]) == []
    # Nothing named ("every topic"): nothing to check, not even that the log dirs exist.
    assert check_topics({"[ingest] topics": []}, [str(tmp_path / "none")]) == []


def test_job_parser_offers_the_flag_only_to_jobs_that_take_topics() -> None:
    doc = "usage\n\nWhat it does.\n\nExit codes: 0 done."
    with_topics = job_parser("x", doc, topics=True).parse_args(
        ["--config", "c", "--allow-missing-topics"]
    )
    assert with_topics.allow_missing_topics is True
    with pytest.raises(SystemExit) as info:
        job_parser("x", doc).parse_args(["--config", "c", "--allow-missing-topics"])
    assert info.value.code == 2


# ------------------------------------------------------------ the jobs themselves


def pipeline_toml(tmp_path: Path, log_dir: Path, extra: str) -> Path:
    conf = tmp_path / "pipeline.toml"
    conf.write_text(
        f'[paths]\nlog_dirs = ["{log_dir}"]\nlake = "{tmp_path / "lake"}"\n'
        f'[retention]\nbroker_config = "{ROOT / "conf" / "broker.properties"}"\n{extra}'
    )
    return conf


@pytest.mark.parametrize("job", TOPIC_JOBS)
def test_a_named_topic_missing_from_the_log_dirs_fails_the_job(
    job: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log_dir = log_dir_with(tmp_path, "orders-0")
    section = "compact" if job == "compact" else "ingest"
    conf = pipeline_toml(tmp_path, log_dir, f'[{section}]\ntopics = ["orders", "ordrs"]\n')
    code = load_job(job).main(["--config", str(conf)])
    err = capsys.readouterr().err
    assert code == EXIT_MISSING_TOPICS == 2
    assert f"topic 'ordrs' ([{section}] topics) is in none of the log dirs" in err
    assert not (tmp_path / "lake").exists()  # failed before doing anything


def test_compact_checks_its_command_line_topics_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log_dir = log_dir_with(tmp_path, "orders-0")
    conf = pipeline_toml(tmp_path, log_dir, '[compact.strategy]\nusers = "timestamp"\n')
    code = load_job("compact").main(["--config", str(conf), "--topic", "orders", "--topic", "x"])
    err = capsys.readouterr().err
    assert code == 2
    assert "'users' ([compact.strategy])" in err and "'x' (--topic)" in err


@pytest.mark.parametrize("job", JOBS)
def test_help_documents_the_exit_codes_the_job_returns(
    job: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every exit code a job's source returns (by its pipelines.exit_codes name), what the
    runner maps exceptions to (0-4 here: 3 and 4 only where the job can raise them), and
    argparse's 2 are described in its --help; the jobs taking topics describe
    --allow-missing-topics and its exit code."""
    module = load_job(job)
    with pytest.raises(SystemExit) as info:
        module.main(["--help"])
    assert info.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    documented = help_text[help_text.index("Exit codes") :]
    source = (ROOT / "jobs" / f"{job}.py").read_text()
    returned = {exit_codes.EXIT_OK, exit_codes.EXIT_FAILED, exit_codes.EXIT_USAGE}
    for node in ast.walk(ast.parse(source)):
        assert not returned_ints(node), f"jobs/{job}.py returns a bare number"
        if isinstance(node, ast.Return) and node.value is not None:
            returned |= {
                getattr(exit_codes, n.id)
                for n in ast.walk(node.value)
                if isinstance(n, ast.Name) and n.id.startswith("EXIT_")
            }
    assert returned <= {0, 1, 2} | set(module.EXIT_CODES)
    assert_documented(returned | set(module.EXIT_CODES), documented, job)
    for code in module.EXIT_CODES:
        assert exit_codes.MEANINGS[code] in documented
    if job in TOPIC_JOBS:
        assert "--allow-missing-topics" in help_text
        assert re.search(
            r"2 bad arguments or configuration .*; or (a topic|missing topics)", documented
        )
    if job == "ingest":
        assert {3, 4} <= set(module.EXIT_CODES)
    if job == "build_lookups":
        assert exit_codes.EXIT_INDEX_MISMATCH == 6 in module.EXIT_CODES


def returned_ints(node: ast.AST) -> set[int]:
    """The integer constants in ``node`` when it is a ``return`` statement."""
    if not isinstance(node, ast.Return) or node.value is None:
        return set()
    return {
        c.value
        for c in ast.walk(node.value)
        if isinstance(c, ast.Constant) and isinstance(c.value, int)
    }


def assert_documented(codes: set[int], documented: str, what: str) -> None:
    for code in sorted(codes):
        assert re.search(rf"\b{code} [a-z]", documented), f"exit {code} of {what} not in --help"


# The loglake subcommands (logstore/cli.py): each module's --help epilog against the exit
# codes its `-> int` functions return (run and the helpers whose result it returns).
LOGLAKE_COMMANDS = {
    "broker": "logstore/server/cli.py",
    "topics": "logstore/tools/topics.py",
    "dump-log": "logstore/tools/dump_log.py",
    "groups": "logstore/tools/groups.py",
    "configs": "logstore/tools/configs.py",
    "delete-records": "logstore/tools/delete_records.py",
    "get-offsets": "logstore/tools/get_offsets.py",
}


def loglake_exit_codes(module_path: str) -> set[int]:
    """Argparse's 2, what ``logstore.cli.main`` itself returns (130 on Ctrl-C), and every
    integer a ``-> int`` function of the subcommand's module returns or assigns to the
    ``code`` it returns."""
    codes = {2}
    for source in ((ROOT / "logstore" / "cli.py").read_text(), (ROOT / module_path).read_text()):
        for fn in ast.walk(ast.parse(source)):
            is_main = isinstance(fn, ast.FunctionDef) and fn.name == "main"
            if not isinstance(fn, ast.FunctionDef) or not (
                is_main or (isinstance(fn.returns, ast.Name) and fn.returns.id == "int")
            ):
                continue
            for node in ast.walk(fn):
                codes |= returned_ints(node)
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(
                    node.value, ast.Constant
                ):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    if any(isinstance(t, ast.Name) and t.id == "code" for t in targets):
                        assert isinstance(node.value.value, int)
                        codes.add(node.value.value)
    return codes


@pytest.mark.parametrize("command", sorted(LOGLAKE_COMMANDS))
def test_loglake_help_documents_the_exit_codes_the_command_returns(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from logstore.cli import main

    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    documented = help_text[help_text.index("Exit codes:") :]
    codes = loglake_exit_codes(LOGLAKE_COMMANDS[command])
    assert {0, 1, 2, 130} <= codes  # the scan found the returns
    assert_documented(codes, documented, f"loglake {command}")


@pytest.mark.parametrize("job", JOBS)
def test_bad_arguments_and_a_missing_config_exit_2(
    job: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    module = load_job(job)
    with pytest.raises(SystemExit) as info:
        module.main(["--config", "c.toml", "--no-such-flag"])
    assert info.value.code == 2
    assert module.main(["--config", str(tmp_path / "none.toml")]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_compact_counts_topics_already_in_records_as_present(tmp_path: Path) -> None:
    from tests.fixtures.compaction import Rec, append_records

    log_dir = log_dir_with(tmp_path, "orders-0")
    append_records(tmp_path / "lake", "users", [Rec(0, 0, 1, b"k", b"v", ())], {0: 1})
    compact = load_job("compact")
    ingested = compact.ingested_topics(str(tmp_path / "lake" / "records"))
    assert ingested == {"users"}
    assert compact.ingested_topics(str(tmp_path / "none" / "records")) == set()
    named = {"[compact] topics": ["users", "orders", "gone"]}
    warnings: list[str] = []
    assert check_topics(
        named, [str(log_dir)], allow_missing=True, also_present=ingested, warn=warnings.append
    ) == ["gone"]
    assert len(warnings) == 1


# Every job that reads log dirs; decode does not (its --log-dirs is unused, never checked),
# maintain only for [retention] records = "topic" (the topics' retention.ms).
LOG_DIR_JOBS = ["ingest", "build_lookups", "compact", "quality", "retention", "maintain"]


@pytest.mark.parametrize("job", LOG_DIR_JOBS)
def test_a_log_dir_that_does_not_exist_is_a_config_error(
    job: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wrong path: exit 2 (not retried), one line naming the path and where it came from."""
    missing = tmp_path / "no-such-logs"
    conf = pipeline_toml(tmp_path, missing, 'records = "topic"\n' if job == "maintain" else "")
    code = load_job(job).main(["--config", str(conf)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == exit_codes.EXIT_USAGE
    assert err == [
        f"{job} failed: log dir does not exist: {missing} (from [paths] log_dirs) [{conf}]"
    ]
    assert not (tmp_path / "lake").exists()  # failed before doing anything

    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    code = load_job(job).main(["--config", str(conf), "--log-dirs", str(a_file)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == exit_codes.EXIT_USAGE
    assert err == [f"{job} failed: log dir is not a directory: {a_file} (from --log-dirs) [{conf}]"]
