"""Leases (``pipelines.delta.staging``) on local disk and on a real S3 server (moto): a driver
killed with SIGKILL (a real process, ``tests/fixtures/staging_writer.py``) leaves its files
until its lease expired by the store's clock, then the reaper removes exactly the files no
commit added; a live driver's files are never removed; a driver whose lease was taken over
never commits. Files are listed independently of the code under test (``os.walk`` / boto3)
and tables read back with deltalake."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from deltalake import DeltaTable, QueryBuilder

from logstore.objectstore import ObjectStore, StorageSettings, delta_target, open_store
from pipelines.delta.staging import (
    LEASE_TTL_ENV,
    STAGING_DIR,
    Lease,
    LeaseLostError,
    check_lease,
    lease_ttl_s,
    reap_crashed_writes,
)
from tests.conftest import ROOT
from tests.fixtures.s3 import S3Bucket
from tests.fixtures.staging_writer import write_rows

TTL = 3.0  # the writers' lease; the reaper's margin is then 2 s (its lower bound)


@dataclass
class Table:
    """A table location and an independent view of the keys below it."""

    uri: str
    bucket: S3Bucket | None
    local: Path | None

    def listing(self) -> list[str]:
        if self.bucket is not None:
            prefix = self.uri.removeprefix(f"s3://{self.bucket.name}/") + "/"
            return [k[len(prefix) :] for k in self.bucket.keys(prefix)]
        assert self.local is not None
        return sorted(
            str(Path(d, n).relative_to(self.local))
            for d, _, names in os.walk(self.local)
            for n in names
        )

    def data(self, write_id: str) -> list[str]:
        return [k for k in self.listing() if f"-{write_id}-" in k and k.endswith(".parquet")]

    def rows(self) -> list[int]:
        uri, options = delta_target(self.uri)
        dt = DeltaTable(uri, storage_options=options or None)
        got = QueryBuilder().register("t", dt).execute("select n from t").read_all()
        return sorted(got.column("n").to_pylist())


@pytest.fixture(params=["local", "s3"])
def table(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Table]:
    if request.param == "local":
        yield Table(str(tmp_path / "t"), None, tmp_path / "t")
    else:
        bucket: S3Bucket = request.getfixturevalue("s3")
        yield Table(bucket.uri("lake", "t"), bucket, None)


def _writer(table: Table, write_id: str, *flags: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fixtures.staging_writer", table.uri, write_id, *flags],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
        env={**os.environ, LEASE_TTL_ENV: str(TTL)},
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("ready "), line
    return proc


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()  # SIGKILL: no clean-up of any kind
    proc.wait()


def test_a_killed_drivers_files_go_once_its_lease_expired_committed_ones_stay(
    table: Table,
) -> None:
    killed = "9" * 32
    _stop(_writer(table, killed, "--commit-first"))
    uri, options = _target(table)
    committed = set(DeltaTable(uri, storage_options=options).file_uris())
    staged = table.data(killed)
    assert len(staged) == 4 and f"{STAGING_DIR}/{killed}.json" in table.listing()
    # right after the kill the lease has not expired by the store's clock: nothing goes
    assert reap_crashed_writes(table.uri) == 0
    assert table.data(killed) == staged
    time.sleep(TTL + 2.0 + 1.5)  # ttl + margin + S3's whole-second Last-Modified
    assert reap_crashed_writes(table.uri) == 2  # the two uncommitted files
    left = table.data(killed)
    assert len(left) == 2 and {k.rsplit("/", 1)[-1] for k in left} == {
        u.rsplit("/", 1)[-1] for u in committed
    }
    assert table.rows() == list(range(10))
    assert f"{STAGING_DIR}/{killed}.json" not in table.listing()
    assert f"{STAGING_DIR}/{killed}.takeover" in table.listing()  # the tombstone stays
    assert reap_crashed_writes(table.uri) == 0  # idempotent


def test_a_live_drivers_files_are_never_reaped(table: Table) -> None:
    live = "a" * 32
    writer = _writer(table, live)
    try:
        staged = table.data(live)
        assert len(staged) == 2
        for _ in range(3):  # well past ttl + margin: the heartbeat keeps the lease
            time.sleep(TTL + 2.0)
            assert reap_crashed_writes(table.uri) == 0
        assert table.data(live) == staged
        check_lease(table.uri, live)  # its tasks may go on writing
    finally:
        _stop(writer)
    time.sleep(TTL + 2.0 + 1.5)
    assert reap_crashed_writes(table.uri) == 2
    assert table.data(live) == []
    with pytest.raises(LeaseLostError, match="gone or taken over"):
        check_lease(table.uri, live)  # a task of the dead driver writes nothing


def test_a_taken_over_lease_refuses_the_commit(table: Table) -> None:
    """A driver paused past its lease (here: its heartbeat never ran, the lease expired) finds
    the reaper's takeover and refuses to commit; its files were removed."""
    write_id = "b" * 32
    lease = Lease(_store(table), write_id, ttl_s=TTL)
    assert lease.store.put_if_absent(f"{STAGING_DIR}/{write_id}.json", lease._body())
    write_rows(table.uri, write_id, 0, 0, 4)
    time.sleep(TTL + 2.0 + 1.5)
    assert reap_crashed_writes(table.uri) == 2
    lease._renewed_at = time.monotonic()  # as if it had just renewed: the takeover decides
    with pytest.raises(LeaseLostError, match="took the lease over"):
        lease.check()


def test_a_lease_not_renewed_for_half_its_ttl_refuses_the_commit(
    s3: S3Bucket,
) -> None:
    """The store away: renewals fail, and the driver stops trusting its lease after ttl / 2
    by its own clock, long before any reaper (ttl + margin by the store's clock) acts."""
    lease = Lease.take(s3.uri("t"), "c" * 32, ttl_s=2.0)
    try:
        lease.check()
        s3.server.stop()
        time.sleep(1.2)
        with pytest.raises(LeaseLostError, match="last renewal"):
            lease.check()
    finally:
        s3.server.start()
        lease.release()
    # (pyarrow leaves an empty "directory" marker where it deleted the last object)
    assert [k for k in s3.keys("t/") if not k.endswith("/")] == []


def test_release_deletes_the_lease_and_a_reused_write_id_is_refused(table: Table) -> None:
    lease = Lease.take(table.uri, "d" * 32, ttl_s=30.0)
    assert f"{STAGING_DIR}/{'d' * 32}.json" in table.listing()
    with pytest.raises(Exception, match="already has a lease"):
        Lease.take(table.uri, "d" * 32, ttl_s=30.0)
    lease.check()
    lease.release()
    assert [k for k in table.listing() if not k.endswith("/")] == []


def test_lease_ttl_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LEASE_TTL_ENV, raising=False)
    assert lease_ttl_s() == 60.0
    monkeypatch.setenv(LEASE_TTL_ENV, "2.5")
    assert lease_ttl_s() == 2.5
    for bad in ("0", "-1", "x", "4000"):
        monkeypatch.setenv(LEASE_TTL_ENV, bad)
        with pytest.raises(Exception, match=LEASE_TTL_ENV):
            lease_ttl_s()


def _target(table: Table) -> tuple[str, dict[str, str] | None]:
    uri, options = delta_target(table.uri)
    return uri, options or None


def _store(table: Table) -> ObjectStore:
    return open_store(table.uri, settings=StorageSettings.from_environment())
