"""503 SlowDown: retried with backoff, then a clear error. A real HTTP proxy in front of the
moto server answers S3's throttling reply to the first requests and forwards the rest."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest

from logstore.errors import ObjectStoreUnavailableError
from logstore.objectstore import StorageSettings, open_store
from tests.fixtures.s3 import S3Bucket

SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


class ThrottlingProxy:
    """Answers 503 SlowDown to the first ``throttle`` requests, forwards later ones upstream."""

    def __init__(self, upstream: str, throttle: int) -> None:
        self.throttle = throttle
        self.seen = 0
        self.throttled = 0
        lock = threading.Lock()
        target = urlsplit(upstream).netloc
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                with lock:
                    proxy.seen += 1
                    slow = proxy.throttled < proxy.throttle
                    proxy.throttled += slow
                if slow:
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(SLOW_DOWN)))
                    self.end_headers()
                    self.wfile.write(SLOW_DOWN)
                    return
                conn = http.client.HTTPConnection(target, timeout=30)
                conn.request(self.command, self.path, body=body, headers=dict(self.headers))
                reply = conn.getresponse()
                data = reply.read()
                self.send_response(reply.status)
                skip = ("transfer-encoding", "connection")
                if self.command != "HEAD":  # a HEAD reply's length is the object's
                    skip += ("content-length",)
                    self.send_header("Content-Length", str(len(data)))
                for k, v in reply.getheaders():
                    if k.lower() not in skip:
                        self.send_header(k, v)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _handle  # noqa: N815

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy(s3: S3Bucket) -> Iterator[ThrottlingProxy]:
    p = ThrottlingProxy(s3.server.endpoint, throttle=0)
    yield p
    p.close()


def _store(s3: S3Bucket, proxy: ThrottlingProxy, attempts: int):  # type: ignore[no-untyped-def]
    settings = StorageSettings.from_environment(
        {"endpoint_url": proxy.endpoint, "max_attempts": attempts}
    )
    return open_store(s3.uri("lake"), settings=settings)


# (pyarrow's writes stream with chunked transfer encoding, which this small proxy does not
# forward; writes share the same retry path as reads in ObjectStore._retry)
@pytest.mark.parametrize("op", ["put_if_absent", "read"])
def test_slow_down_is_retried(s3: S3Bucket, proxy: ThrottlingProxy, op: str) -> None:
    store = _store(s3, proxy, attempts=4)
    s3.put("lake/t/a", b"stored")
    proxy.throttle = 2
    if op == "read":
        assert store.read("t/a") == b"stored"
    else:
        assert store.put_if_absent("t/b", b"first") is True
        assert s3.get("lake/t/b") == b"first"
    assert proxy.throttled == 2 and proxy.seen > 2


@pytest.mark.parametrize("op", ["put_if_absent", "read"])
def test_endless_slow_down_ends_in_a_clear_error(
    s3: S3Bucket, proxy: ThrottlingProxy, op: str
) -> None:
    store = _store(s3, proxy, attempts=3)
    s3.put("lake/t/a", b"stored")
    proxy.throttle = 10**9
    with pytest.raises(ObjectStoreUnavailableError, match="after 3 attempts") as err:
        if op == "read":
            store.read("t/a")
        else:
            store.put_if_absent("t/b", b"x")
    assert err.value.path == s3.uri("lake/t/" + ("a" if op == "read" else "b"))
    # bounded: our 3 attempts, each at most pyarrow's 3 tries of a request
    assert 3 <= proxy.seen <= 9 * 3
    assert s3.keys("lake/") == ["lake/t/a"]
