"""The object-store layer against a real S3 server (moto) and local disk, the same tests."""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from logstore.errors import ObjectNotFoundError, ObjectStoreError, ObjectStoreUnavailableError
from logstore.objectstore import ObjectStore, StorageSettings, open_store
from logstore.objectstore import store as store_module
from tests.fixtures.s3 import S3Bucket


@pytest.fixture(params=["s3", "local"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "s3":
        bucket: S3Bucket = request.getfixturevalue("s3")
        return open_store(bucket.uri("lake"))
    return open_store(tmp_path / "lake")


def test_read_write_list_delete(store: ObjectStore) -> None:
    store.write("t/_delta_log/00000.json", b"{}\n")
    store.write("t/part-0.parquet", b"x" * 1000)
    store.write("u/a", b"a")
    store.write("t/part-0.parquet", b"y" * 10)  # replaced whole
    assert store.read("t/part-0.parquet") == b"y" * 10
    assert store.exists("u/a") and not store.exists("u/b")
    assert store.size("t/_delta_log/00000.json") == 3
    assert [(o.path, o.size) for o in store.list("t")] == [
        ("t/_delta_log/00000.json", 3),
        ("t/part-0.parquet", 10),
    ]
    assert [o.path for o in store.list()] == [
        "t/_delta_log/00000.json",
        "t/part-0.parquet",
        "u/a",
    ]
    assert [o.path for o in store.list("t", recursive=False)] == ["t/part-0.parquet"]
    assert store.list("nothing/here") == []
    store.delete("u/a")
    assert not store.exists("u/a")
    store.delete("u/a", missing_ok=True)
    with pytest.raises(ObjectNotFoundError, match="u/a"):
        store.delete("u/a")


def test_write_file_streams_in_chunks(
    store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "_COPY_CHUNK", 1000)  # several chunks, a partial last
    source = tmp_path / "00000000000000000000.log"
    data = bytes(range(256)) * 41
    source.write_bytes(data)
    assert store.write_file("seg/a.log", source) == len(data)
    assert store.read("seg/a.log") == data
    source.write_bytes(b"shorter")
    assert store.write_file("seg/a.log", source) == 7  # replaced whole
    assert store.read("seg/a.log") == b"shorter"
    with pytest.raises(FileNotFoundError):  # a file that went is an error, not an empty object
        store.write_file("seg/b.log", tmp_path / "gone.log")
    assert not store.exists("seg/b.log")


def test_move(store: ObjectStore) -> None:
    store.write("scratch/w1/dv/a.bin", b"dv-a")
    store.write("dv/b.bin", b"old")
    store.move("scratch/w1/dv/a.bin", "dv/a.bin")  # into a new "directory"
    store.write("scratch/w1/dv/b.bin", b"dv-b")
    store.move("scratch/w1/dv/b.bin", "dv/b.bin")  # replaces the target
    assert [(o.path, store.read(o.path)) for o in store.list()] == [
        ("dv/a.bin", b"dv-a"),
        ("dv/b.bin", b"dv-b"),
    ]
    with pytest.raises(ObjectNotFoundError, match=r"scratch/w1/dv/a\.bin"):
        store.move("scratch/w1/dv/a.bin", "dv/c.bin")


def test_ranged_reads(store: ObjectStore) -> None:
    data = bytes(range(256)) * 64
    store.write("seg/00000000000000000000.log", data)
    assert (
        store.read_range("seg/00000000000000000000.log", offset=1000, length=300)
        == (data[1000:1300])
    )
    assert (
        store.read_range("seg/00000000000000000000.log", offset=len(data) - 5, length=50)
        == (data[-5:])
    )
    assert store.read_range("seg/00000000000000000000.log", offset=7, length=0) == b""


def test_ranged_reads_into_a_buffer(store: ObjectStore) -> None:
    """``read_range_into`` fills only the view it is given, the count read; fewer bytes at
    the object's end, none past it."""
    data = bytes(range(256)) * 64
    store.write("seg/a.log", data)
    area = bytearray(b"\xee" * 500)
    view = memoryview(area)
    assert store.read_range_into("seg/a.log", offset=1000, into=view[100:400]) == 300
    assert area[100:400] == data[1000:1300]
    assert area[:100] == b"\xee" * 100 and area[400:] == b"\xee" * 100  # nothing outside
    assert store.read_range_into("seg/a.log", offset=len(data) - 5, into=view[:50]) == 5
    assert area[:5] == data[-5:]
    assert store.read_range_into("seg/a.log", offset=len(data), into=view[:50]) == 0
    assert store.read_range_into("seg/a.log", offset=len(data) + 7, into=view[:50]) == 0
    assert store.read_range_into("seg/a.log", offset=7, into=view[:0]) == 0
    big = np.zeros(len(data) + 10, np.uint8)  # the tier reader's buffers: numpy's
    assert store.read_range_into("seg/a.log", offset=0, into=big.data) == len(data)
    assert big[: len(data)].tobytes() == data and not big[len(data) :].any()
    with pytest.raises(ObjectStoreError, match="offset >= 0"):
        store.read_range_into("seg/a.log", offset=-1, into=view)


def test_put_if_absent_keeps_the_first(store: ObjectStore) -> None:
    assert store.put_if_absent("t/_delta_log/00001.json", b"first") is True
    assert store.put_if_absent("t/_delta_log/00001.json", b"second") is False
    assert store.read("t/_delta_log/00001.json") == b"first"


def test_put_if_absent_race_threads(store: ObjectStore) -> None:
    """Eight threads race for each of ten keys: exactly one wins each, its bytes stay."""
    results: dict[int, list[tuple[int, bool]]] = {k: [] for k in range(10)}
    barrier = threading.Barrier(8)

    def racer(who: int) -> None:
        barrier.wait()
        for k in range(10):
            won = store.put_if_absent(f"race/{k:05d}.json", f"writer-{who}".encode())
            results[k].append((who, won))

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, outcome in results.items():
        winners = [who for who, won in outcome if won]
        assert len(winners) == 1, (k, outcome)
        assert store.read(f"race/{k:05d}.json") == f"writer-{winners[0]}".encode()


def _race_process(uri: str, overrides: dict[str, str], who: int, start: float, out: object) -> None:
    store = open_store(uri, settings=StorageSettings.from_overrides(overrides))
    time.sleep(max(0.0, start - time.time()))
    wins = [k for k in range(20) if store.put_if_absent(f"p/{k:05d}", f"proc-{who}".encode())]
    out.put((who, wins))  # type: ignore[attr-defined]


def test_put_if_absent_race_processes(store: ObjectStore) -> None:
    """Four processes (their own clients) race for twenty keys: each key has one winner."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    start = time.time() + 3.0
    procs = [
        ctx.Process(
            target=_race_process,
            args=(store.root.uri, store.settings.to_overrides(), i, start, queue),
        )
        for i in range(4)
    ]
    for p in procs:
        p.start()
    outcome = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    owners: dict[int, int] = {}
    for who, wins in outcome.items():
        for k in wins:
            assert k not in owners, f"key {k} won by {owners[k]} and {who}"
            owners[k] = who
    assert sorted(owners) == list(range(20))
    for k, who in owners.items():
        assert store.read(f"p/{k:05d}") == f"proc-{who}".encode()


def test_object_deleted_between_list_and_read(store: ObjectStore) -> None:
    store.write("t/a.parquet", b"a")
    store.write("t/b.parquet", b"b")
    listed = store.list("t")
    store.delete("t/b.parquet")  # behind the reader's back
    assert store.read(listed[0].path) == b"a"
    with pytest.raises(ObjectNotFoundError) as err:
        store.read(listed[1].path)
    assert err.value.path == store.uri("t/b.parquet")
    assert "t/b.parquet" in str(err.value)
    with pytest.raises(ObjectNotFoundError, match=r"t/b\.parquet"):
        store.read_range(listed[1].path, offset=0, length=1)
    with pytest.raises(ObjectNotFoundError, match=r"t/b\.parquet"):
        store.read_range_into(listed[1].path, offset=0, into=memoryview(bytearray(1)))
    with pytest.raises(ObjectNotFoundError, match=r"t/b\.parquet"):
        store.size(listed[1].path)


@pytest.mark.parametrize("op", ["read", "read_range_into", "write", "put_if_absent", "list"])
def test_server_stopped_mid_run(s3: S3Bucket, op: str) -> None:
    """The store goes away: a clear error naming the object after bounded retries, no hang;
    after a restart the same store works again and nothing was half-written."""
    store = open_store(
        s3.uri("lake"),
        settings=StorageSettings.from_environment(
            {"max_attempts": 3, "connect_timeout_s": 1.0, "request_timeout_s": 5.0}
        ),
    )
    store.write("t/a", b"before")
    s3.server.stop()
    calls = {
        "read": lambda: store.read("t/a"),
        "read_range_into": lambda: store.read_range_into(
            "t/a", offset=0, into=memoryview(bytearray(6))
        ),
        "write": lambda: store.write("t/b", b"during"),
        "put_if_absent": lambda: store.put_if_absent("t/b", b"during"),
        "list": lambda: store.list("t"),
    }
    began = time.monotonic()
    with pytest.raises(ObjectStoreUnavailableError, match="after 3 attempts") as err:
        calls[op]()
    elapsed = time.monotonic() - began
    assert err.value.path is not None and err.value.path.startswith(s3.uri("lake/t"))
    print(f"{op}: unreachable store reported after {elapsed:.2f} s")
    s3.server.start()
    assert store.read("t/a") == b"before"
    assert s3.keys("lake/") == ["lake/t/a"]
    assert store.put_if_absent("t/b", b"after") is True
    assert s3.get("lake/t/b") == b"after"
