"""503 SlowDown: retried with backoff, then a clear error. A real HTTP proxy in front of the
moto server (:class:`tests.fixtures.s3.S3Proxy`) answers S3's throttling reply to the first
requests and forwards the rest."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from logstore.errors import ObjectStoreUnavailableError
from logstore.objectstore import ObjectStore, StorageSettings, open_store
from tests.fixtures.s3 import S3Bucket, S3Proxy, Throttle


@pytest.fixture
def throttle() -> Throttle:
    return Throttle()


@pytest.fixture
def proxy(s3: S3Bucket, throttle: Throttle) -> Iterator[S3Proxy]:
    p = S3Proxy(s3.server.endpoint, reply=throttle)
    yield p
    p.close()


def _store(s3: S3Bucket, proxy: S3Proxy, attempts: int) -> ObjectStore:
    settings = StorageSettings.from_environment(
        {"endpoint_url": proxy.endpoint, "max_attempts": attempts}
    )
    return open_store(s3.uri("lake"), settings=settings)


def _do(store: ObjectStore, op: str) -> None:
    if op == "read":
        assert store.read("t/a") == b"stored"
    elif op == "read_range_into":
        buf = bytearray(10)
        assert store.read_range_into("t/a", offset=1, into=memoryview(buf)) == 5
        assert bytes(buf[:5]) == b"tored"
    elif op == "write":
        store.write("t/b", b"first")
    else:
        assert store.put_if_absent("t/b", b"first") is True


@pytest.mark.parametrize("op", ["put_if_absent", "write", "read", "read_range_into"])
def test_slow_down_is_retried(s3: S3Bucket, proxy: S3Proxy, throttle: Throttle, op: str) -> None:
    store = _store(s3, proxy, attempts=4)
    s3.put("lake/t/a", b"stored")
    throttle.left = 2
    _do(store, op)
    if not op.startswith("read"):
        assert s3.get("lake/t/b") == b"first"
    assert throttle.throttled == 2 and len(proxy.requests) > 2


@pytest.mark.parametrize("op", ["put_if_absent", "write", "read", "read_range_into"])
def test_endless_slow_down_ends_in_a_clear_error(
    s3: S3Bucket, proxy: S3Proxy, throttle: Throttle, op: str
) -> None:
    store = _store(s3, proxy, attempts=3)
    s3.put("lake/t/a", b"stored")
    throttle.left = 10**9
    with pytest.raises(ObjectStoreUnavailableError, match="after 3 attempts") as err:
        _do(store, op)
    assert err.value.path == s3.uri("lake/t/" + ("a" if op.startswith("read") else "b"))
    # bounded: our 3 attempts, each at most pyarrow's 3 tries of a request
    assert 3 <= len(proxy.requests) <= 9 * 3
    assert s3.keys("lake/") == ["lake/t/a"]
