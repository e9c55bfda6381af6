"""The one Delta log reader (``pipelines.delta.log``) against delta-rs, on local disk and on a
real S3 server (moto): tables written by delta-rs itself (appends with app transactions, an
overwrite that removes files, a checkpoint, commits after it); at every version the reader's
live files are delta-rs's, its app-transaction versions are delta-rs's ``transaction_version``,
and the listing, referenced files and commit infos match what was written."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import CommitProperties, Transaction

from pipelines.delta.log import DeltaLog
from tests.fixtures.s3 import S3Bucket


def _write(uri: str, options: dict[str, str], n: int, *, mode: str, app: str, version: int) -> None:
    write_deltalake(
        uri,
        pa.table({"k": list(range(n * 10, n * 10 + 10)), "p": [n % 2] * 10}),
        partition_by=["p"],
        mode=mode,  # type: ignore[arg-type]
        storage_options=options or None,
        commit_properties=CommitProperties(
            app_transactions=[Transaction(app, version)], custom_metadata={"loglakeRun": str(n)}
        ),
    )


@pytest.fixture(params=["local", "s3"])
def table_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "t")
    s3: S3Bucket = request.getfixturevalue("s3")
    return s3.uri("lake", "t")


def _build(uri: str) -> tuple[DeltaLog, list[set[str]]]:
    """Versions 0-2 appends, 3 an overwrite (removes), checkpoint at 3, 4-5 appends; returns
    the log and every version's live files as delta-rs sees them."""
    log = DeltaLog(uri)
    options = log.storage_options
    _write(uri, options, 0, mode="append", app="a", version=1)
    _write(uri, options, 1, mode="append", app="b", version=1)
    _write(uri, options, 2, mode="append", app="a", version=2)
    _write(uri, options, 3, mode="overwrite", app="b", version=5)
    DeltaTable(uri, storage_options=options or None).create_checkpoint()
    _write(uri, options, 4, mode="append", app="a", version=3)
    _write(uri, options, 5, mode="append", app="c", version=9)
    live = []
    for v in range(6):
        dt = DeltaTable(uri, version=v, storage_options=options or None)
        live.append({unquote(p) for p in pa.table(dt.get_add_actions()).column("path").to_pylist()})
    return log, live


def test_snapshots_and_transactions_match_delta_rs(table_uri: str) -> None:
    log, live = _build(table_uri)
    listing = log.listing()
    assert sorted(listing.commits) == list(range(6))
    assert sorted(listing.checkpoints) == [3]
    assert listing.latest == 5
    for v in range(6):
        adds = log.live_adds(v, listing)
        assert {unquote(a["path"]) for a in adds} == live[v], v
        assert all(isinstance(a["partitionValues"], dict) for a in adds)
        assert all(a["deletionVector"] is None for a in adds if "deletionVector" in a)
    dt = log.table()
    assert dt is not None and dt.version() == 5
    txns = log.app_transactions()
    assert txns == {"a": 3, "b": 5, "c": 9}
    assert txns == {app: dt.transaction_version(app) for app in txns}
    # every file any version names, removed ones too (the overwrite removed versions 0-2's)
    assert log.referenced_files() == set().union(*live)
    infos = list(log.commit_infos())
    assert [i["version"] for i in infos] == [5, 4, 3, 2, 1, 0]
    assert [i["loglakeRun"] for i in infos] == ["5", "4", "3", "2", "1", "0"]


def test_an_absent_table_reads_as_empty(tmp_path: Path) -> None:
    log = DeltaLog(tmp_path / "none")
    assert log.table() is None
    assert log.listing().latest is None
    assert log.app_transactions() == {}
    assert log.referenced_files() == set()
    assert list(log.commit_infos()) == []
