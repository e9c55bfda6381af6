"""Driver-side commit logic of the Delta sink against real delta-rs tables (no Spark)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from deltalake.transaction import CommitProperties, Transaction

from pipelines.delta.commit import (
    RemovedFile,
    commit_files,
    create_table,
    ensure_table,
    merge_schema,
    read_app_transactions,
)
from pipelines.delta.errors import (
    ConcurrentWriteError,
    SchemaMismatchError,
    StaleTransactionError,
)
from pipelines.delta.files import PartitionedFileWriter, WrittenFile

SCHEMA = pa.schema([("n", pa.int64()), ("p", pa.string())])


def _files(root: Path, rows: list[tuple[int, str]], write_id: str) -> list[WrittenFile]:
    w = PartitionedFileWriter(root, write_id=write_id, task_id=0, attempt=0, partition_by=["p"])
    w.write(pa.table({"n": [r[0] for r in rows], "p": [r[1] for r in rows]}, schema=SCHEMA))
    return w.close()


def _rows(root: Path) -> list[tuple[int, str]]:
    df = pl.read_delta(str(root)).sort("n")
    return list(zip(df["n"].to_list(), df["p"].to_list(), strict=True))


def test_create_then_append_with_app_transactions(tmp_path: Path) -> None:
    r1 = commit_files(
        tmp_path,
        _files(tmp_path, [(1, "a"), (2, "b")], "w1"),
        schema=SCHEMA,
        partition_by=["p"],
        app_transactions={"app/0": 3},
    )
    assert (r1.version, r1.committed, r1.num_rows, r1.num_files) == (0, True, 2, 2)
    r2 = commit_files(
        tmp_path,
        _files(tmp_path, [(3, "a")], "w2"),
        schema=SCHEMA,
        partition_by=["p"],
        app_transactions={"app/0": 5, "app/1": 1},
    )
    assert (r2.version, r2.committed) == (1, True)
    assert _rows(tmp_path) == [(1, "a"), (2, "b"), (3, "a")]
    dt = DeltaTable(str(tmp_path))
    assert dt.transaction_version("app/0") == 5
    assert read_app_transactions(tmp_path) == {"app/0": 5, "app/1": 1}


def test_same_versions_are_a_no_op_and_lower_is_refused(tmp_path: Path) -> None:
    commit_files(
        tmp_path,
        _files(tmp_path, [(1, "a")], "w1"),
        schema=SCHEMA,
        partition_by=["p"],
        app_transactions={"app": 10},
    )
    again = commit_files(
        tmp_path,
        _files(tmp_path, [(1, "a")], "w2"),
        schema=SCHEMA,
        partition_by=["p"],
        app_transactions={"app": 10},
    )
    assert again.committed is False and again.version == 0
    with pytest.raises(StaleTransactionError, match="backwards"):
        commit_files(tmp_path, [], schema=SCHEMA, partition_by=["p"], app_transactions={"app": 9})
    assert DeltaTable(str(tmp_path)).version() == 0
    assert _rows(tmp_path) == [(1, "a")]


def test_expected_versions_detect_progress_moved_by_another_run(tmp_path: Path) -> None:
    commit_files(tmp_path, [], schema=SCHEMA, partition_by=["p"], app_transactions={"app": 4})
    # another run read 0 (absent) and now wants to commit 7: the table says 4
    with pytest.raises(StaleTransactionError, match="moved under this write"):
        commit_files(
            tmp_path,
            [],
            schema=SCHEMA,
            partition_by=["p"],
            app_transactions={"app": 7},
            expected_versions={"app": None},
        )
    ok = commit_files(
        tmp_path,
        [],
        schema=SCHEMA,
        partition_by=["p"],
        app_transactions={"app": 7},
        expected_versions={"app": 4},
    )
    assert ok.committed and read_app_transactions(tmp_path) == {"app": 7}


def test_schema_and_partition_mismatch_are_refused(tmp_path: Path) -> None:
    commit_files(tmp_path, _files(tmp_path, [(1, "a")], "w1"), schema=SCHEMA, partition_by=["p"])
    other = pa.schema([("n", pa.int32()), ("p", pa.string())])
    with pytest.raises(SchemaMismatchError, match="schema mismatch"):
        commit_files(tmp_path, [], schema=other, partition_by=["p"])
    with pytest.raises(SchemaMismatchError, match="partition columns"):
        commit_files(tmp_path, [], schema=SCHEMA, partition_by=[])


def test_commit_after_another_writer_keeps_both(tmp_path: Path) -> None:
    commit_files(tmp_path, _files(tmp_path, [(1, "a")], "w1"), schema=SCHEMA, partition_by=["p"])
    mine = _files(tmp_path, [(2, "a")], "w2")
    theirs = _files(tmp_path, [(3, "b")], "w3")

    def race(attempt: int) -> None:
        if attempt == 1:  # another writer commits after our files were written
            commit_files(
                tmp_path, theirs, schema=SCHEMA, partition_by=["p"], app_transactions={"other": 1}
            )

    result = commit_files(
        tmp_path,
        mine,
        schema=SCHEMA,
        partition_by=["p"],
        app_transactions={"mine": 1},
        before_attempt=race,
    )
    assert result.committed and result.version == 2
    assert _rows(tmp_path) == [(1, "a"), (2, "a"), (3, "b")]
    assert read_app_transactions(tmp_path) == {"mine": 1, "other": 1}


def test_conflict_inside_the_commit_window_is_retried(tmp_path: Path, monkeypatch) -> None:
    """A writer that wins between our snapshot and our log write: delta-rs fails, we retry."""
    commit_files(tmp_path, [], schema=SCHEMA, partition_by=["p"])
    mine = _files(tmp_path, [(2, "a")], "w2")
    theirs = _files(tmp_path, [(3, "b")], "w3")
    original = DeltaTable.create_write_transaction
    calls = {"n": 0}

    def racing(self, actions, mode, schema, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 1:
            other = DeltaTable(str(tmp_path))
            from deltalake.transaction import AddAction

            adds = [
                AddAction(f.path, f.size, f.partition_values, f.modification_time, True, f.stats)
                for f in theirs
            ]
            original(
                other,
                adds,
                "append",
                SCHEMA,
                partition_by=["p"],
                commit_properties=CommitProperties(app_transactions=[Transaction("x", 1)]),
            )
        return original(self, actions, mode, schema, *args, **kwargs)

    monkeypatch.setattr(DeltaTable, "create_write_transaction", racing)
    result = commit_files(tmp_path, mine, schema=SCHEMA, partition_by=["p"])
    assert result.attempts == 2 and result.version == 2
    assert _rows(tmp_path) == [(2, "a"), (3, "b")]


def test_overwrite_by_predicate_refuses_a_moved_table(tmp_path: Path) -> None:
    commit_files(
        tmp_path, _files(tmp_path, [(1, "a"), (2, "b")], "w1"), schema=SCHEMA, partition_by=["p"]
    )
    dt = DeltaTable(str(tmp_path))
    acts = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    removes = [
        RemovedFile(a["path"], a["size_bytes"], {"p": a["partition.p"]})
        for a in acts
        if a["partition.p"] == "a"
    ]
    commit_files(tmp_path, _files(tmp_path, [(3, "a")], "w2"), schema=SCHEMA, partition_by=["p"])
    with pytest.raises(ConcurrentWriteError, match="re-run"):
        commit_files(
            tmp_path,
            _files(tmp_path, [(9, "a")], "w3"),
            schema=SCHEMA,
            partition_by=["p"],
            mode="overwrite",
            predicate="p = 'a'",
            removes=removes,
            read_version=0,
        )
    ok = commit_files(
        tmp_path,
        _files(tmp_path, [(9, "a")], "w4"),
        schema=SCHEMA,
        partition_by=["p"],
        mode="overwrite",
        predicate="p = 'a'",
        removes=removes,
        read_version=1,
    )
    # version 1's file of p=a (row 3) was not chosen: a caller picks removes at read_version
    assert ok.num_removed == 1 and _rows(tmp_path) == [(2, "b"), (3, "a"), (9, "a")]


def test_read_app_transactions_reads_checkpoints(tmp_path: Path) -> None:
    for i in range(3):
        commit_files(
            tmp_path,
            [],
            schema=SCHEMA,
            partition_by=["p"],
            app_transactions={f"app/{i % 2}": i + 1},
        )
    DeltaTable(str(tmp_path)).create_checkpoint()
    commit_files(tmp_path, [], schema=SCHEMA, partition_by=["p"], app_transactions={"app/1": 9})
    assert read_app_transactions(tmp_path) == {"app/0": 3, "app/1": 9}
    dt = DeltaTable(str(tmp_path))
    assert {a: dt.transaction_version(a) for a in ("app/0", "app/1")} == {"app/0": 3, "app/1": 9}
    assert read_app_transactions(tmp_path / "missing") == {}


def test_rewind_apps_may_go_back_only_from_the_expected_version(tmp_path: Path) -> None:
    base = {"schema": SCHEMA, "partition_by": ["p"]}
    commit_files(tmp_path, _files(tmp_path, [(1, "a")], "w1"), **base, app_transactions={"x": 10})
    with pytest.raises(StaleTransactionError, match="needs the expected versions"):
        commit_files(tmp_path, [], **base, app_transactions={"x": 4}, rewind_apps={"x"})
    with pytest.raises(StaleTransactionError, match="moved under this write"):
        commit_files(
            tmp_path, [], **base, app_transactions={"x": 4}, expected_versions={"x": 9},
            rewind_apps={"x"},
        )  # fmt: skip
    with pytest.raises(StaleTransactionError, match="backwards"):  # only the named apps
        commit_files(
            tmp_path, [], **base, app_transactions={"x": 4}, expected_versions={"x": 10},
            rewind_apps={"y"},
        )  # fmt: skip
    back = commit_files(
        tmp_path, [], **base, app_transactions={"x": 4}, expected_versions={"x": 10},
        rewind_apps={"x"}, commit_info={"loglakeIngest": '{"k": 1}'},
    )  # fmt: skip
    assert back.committed and DeltaTable(str(tmp_path)).transaction_version("x") == 4
    assert DeltaTable(str(tmp_path)).history(1)[0]["loglakeIngest"] == '{"k": 1}'
    # a rewind to the version the table already has is still a commit, never a no-op
    same = commit_files(
        tmp_path, [], **base, app_transactions={"x": 4}, expected_versions={"x": 4},
        rewind_apps={"x"},
    )  # fmt: skip
    assert same.committed and same.version == 2


def test_create_table_is_the_one_table_creation(tmp_path: Path) -> None:
    """Compaction's tables (a description, Delta properties), ``ensure_table`` and a first
    commit all create through ``create_table``: read back by delta-rs and polars."""
    create_table(
        tmp_path / "t",
        SCHEMA,
        ["p"],
        description='{"strategy": "offset"}',
        configuration={"delta.enableChangeDataFeed": "true"},
    )
    dt = DeltaTable(str(tmp_path / "t"))
    assert dt.version() == 0 and dt.metadata().partition_columns == ["p"]
    assert dt.metadata().description == '{"strategy": "offset"}'
    assert dt.metadata().configuration == {"delta.enableChangeDataFeed": "true"}
    assert pl.read_delta(str(tmp_path / "t")).height == 0
    with pytest.raises(DeltaError):  # a racing creator lost: the table is there
        create_table(tmp_path / "t", SCHEMA, ["p"])
    assert not ensure_table(tmp_path / "t", SCHEMA, ["p"])  # there already, schema checked
    assert ensure_table(tmp_path / "u", SCHEMA, [])
    assert DeltaTable(str(tmp_path / "u")).metadata().partition_columns == []


def test_merge_schema_adds_columns_and_nested_fields_in_one_commit(tmp_path: Path) -> None:
    """What the typed tables' schema growth needs (``pipelines/typed``): new top-level columns
    and new fields inside a struct, no rows written; the old rows read back with nulls."""
    v1 = pa.schema([("n", pa.int64()), ("s", pa.struct([("a", pa.int32())]))])
    root = tmp_path / "typed"
    commit_files(root, [], schema=v1)
    w = PartitionedFileWriter(root, write_id="w1", task_id=0, attempt=0, partition_by=[])
    w.write(pa.table({"n": [1], "s": [{"a": 7}]}, schema=v1))
    commit_files(root, w.close(), schema=v1)
    v2 = pa.schema(
        [("n", pa.int64()), ("s", pa.struct([("a", pa.int32()), ("b", pa.string())])),
         ("m", pa.string())]
    )  # fmt: skip
    assert merge_schema(root, v2) == 2
    dt = DeltaTable(str(root))
    assert pa.schema(dt.schema().to_arrow()).names == ["n", "s", "m"]
    assert pl.read_delta(str(root)).to_dicts() == [{"n": 1, "s": {"a": 7, "b": None}, "m": None}]
