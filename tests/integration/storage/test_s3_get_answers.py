"""The tier's ranged GET (:mod:`logstore.objectstore._s3get`) against a hostile server.

A real HTTP server on 127.0.0.1 that answers every request with bytes this test chooses (a
raw socket, so it can lie in its headers and cut its body): a server that ignores ``Range``
and sends the whole object, a ``Content-Range`` elsewhere, larger than asked or empty, an
error answer whose declared length is 10 GB, a 206 cut short. Each ends in a clear error
naming the object and no claim of bytes read; what is worth another try (a cut answer) is
tried again up to ``max_attempts`` and then reported. The well-behaved answers are tested
against the S3 server in ``test_object_store.py``.
"""

from __future__ import annotations

import pytest

from logstore.errors import ObjectStoreError, ObjectStoreUnavailableError
from logstore.objectstore import StorageSettings, open_store
from logstore.objectstore._s3put import ERROR_BODY_MAX
from tests.fixtures.hostile import HostileServer, http_answer
from tests.fixtures.s3 import S3Bucket

pytestmark = pytest.mark.integration

OBJECT = bytes(range(256)) * 4096  # 1 MiB: what a server ignoring Range would send


def _read(s3: S3Bucket, server: HostileServer, *, offset: int = 1000, size: int = 100) -> int:
    settings = StorageSettings.from_environment(
        {"endpoint_url": server.endpoint, "max_attempts": 2, "request_timeout_s": 10.0}
    )
    store = open_store(s3.uri("lake"), settings=settings)
    return store.read_range_into("seg/a.log", offset=offset, into=memoryview(bytearray(size)))


def test_the_range_is_asked_for_and_a_well_formed_206_is_read(
    s3: S3Bucket, hostile: HostileServer
) -> None:
    """The control: the same server answering what S3 answers is read, and the request names
    the range and is signed."""
    body = OBJECT[1000:1100]
    hostile.answer = http_answer(
        "206 Partial Content",
        {"Content-Range": f"bytes 1000-1099/{len(OBJECT)}", "Content-Length": "100"},
        body,
    )
    assert _read(s3, hostile) == 100
    request = hostile.requests[0].lower()
    assert request.startswith(b"get /") and b"range: bytes=1000-1099" in request
    assert b"authorization: aws4-hmac-sha256" in request


def test_a_server_ignoring_range_is_refused_after_reading_only_the_start(
    s3: S3Bucket, hostile: HostileServer
) -> None:
    """200 with a declared 10 GB whole object, 1 MiB of it sent: refused as a server that
    ignores Range, reading at most ERROR_BODY_MAX (reading it all would wait for 10 GB and
    then fail as a cut answer, retried as if transient)."""
    hostile.answer = http_answer("200 OK", {"Content-Length": str(10 << 30)}, OBJECT)
    assert len(OBJECT) > ERROR_BODY_MAX
    with pytest.raises(ObjectStoreError, match=r"HTTP 200.*ignores Range") as err:
        _read(s3, hostile)
    assert not isinstance(err.value, ObjectStoreUnavailableError)
    assert err.value.path == s3.uri("lake/seg/a.log")
    assert len(hostile.requests) == 1  # not retried: it would answer the same


@pytest.mark.parametrize(
    ("content_range", "why"),
    [
        ("bytes 0-99/1048576", "starts elsewhere"),
        ("bytes 1000-1199/1048576", "more than asked"),
        ("bytes 1000-998/1048576", "ends before it starts"),
        ("bytes=1000-1099", "malformed"),
    ],
)
def test_a_206_whose_content_range_is_not_the_range_asked_for_is_refused(
    s3: S3Bucket, hostile: HostileServer, content_range: str, why: str
) -> None:
    hostile.answer = http_answer(
        "206 Partial Content",
        {"Content-Range": content_range, "Content-Length": "100"},
        OBJECT[1000:1100],
    )
    with pytest.raises(ObjectStoreError, match="Content-Range") as err:
        _read(s3, hostile)
    assert not isinstance(err.value, ObjectStoreUnavailableError), why
    assert err.value.path == s3.uri("lake/seg/a.log")


def test_a_206_cut_short_is_tried_again_then_reported(s3: S3Bucket, hostile: HostileServer) -> None:
    hostile.answer = http_answer(
        "206 Partial Content",
        {"Content-Range": f"bytes 1000-1099/{len(OBJECT)}", "Content-Length": "100"},
        OBJECT[1000:1040],
    )
    with pytest.raises(ObjectStoreUnavailableError, match="after 2 attempts") as err:
        _read(s3, hostile)
    assert "40 of 100" in str(err.value.__cause__) or "40 of 100" in str(err.value)
    assert len(hostile.requests) == 2


def test_an_error_answer_declaring_10_gb_is_reported_with_its_code(
    s3: S3Bucket, hostile: HostileServer
) -> None:
    """403 with S3's error document at the front of a declared 10 GB body: the code is
    reported after reading at most ERROR_BODY_MAX."""
    document = b"<?xml version='1.0'?><Error><Code>AccessDenied</Code></Error>"
    padding = b" " * (2 * ERROR_BODY_MAX)
    hostile.answer = http_answer(
        "403 Forbidden", {"Content-Length": str(10 << 30)}, document + padding
    )
    with pytest.raises(ObjectStoreError, match="HTTP 403 AccessDenied") as err:
        _read(s3, hostile)
    assert not isinstance(err.value, ObjectStoreUnavailableError)


def test_a_put_answered_with_an_error_declaring_10_gb_is_reported_with_its_code(
    s3: S3Bucket, hostile: HostileServer
) -> None:
    """The PUTs (``_s3put``) read their answer with the same cap: a 403 whose body declares
    10 GB is reported with its code, not read to its declared end."""
    document = b"<?xml version='1.0'?><Error><Code>AccessDenied</Code></Error>"
    padding = b" " * (2 * ERROR_BODY_MAX)
    hostile.answer = http_answer(
        "403 Forbidden", {"Content-Length": str(10 << 30)}, document + padding
    )
    settings = StorageSettings.from_environment(
        {"endpoint_url": hostile.endpoint, "max_attempts": 2, "request_timeout_s": 10.0}
    )
    store = open_store(s3.uri("lake"), settings=settings)
    with pytest.raises(ObjectStoreError, match="AccessDenied") as err:
        store.put_if_absent("seg/a.json", b"{}")
    assert not isinstance(err.value, ObjectStoreUnavailableError)
    assert hostile.requests[0].lower().startswith(b"put /")
