"""One S3 request pyarrow cannot make: ``PutObject`` with ``If-None-Match: *`` (put-if-absent).

Why this exists (measured here, 2026-11-27, pyarrow 26, deltalake 1.6.6, moto 5.2.5):
pyarrow's ``S3FileSystem`` has no conditional write; deltalake's ``DeltaFileSystemHandler``
(its object store as a pyarrow handler) exposes plain open/copy/move/delete only, no put mode
(its ``copy_file``/``move_file`` also hold the GIL while they wait for the store); fsspec/s3fs
and obstore are not installed; boto3 is a test-only dependency. The request is a single
signed HTTP PUT, so it is made here with the standard library: AWS Signature Version 4
(:mod:`logstore.objectstore._sigv4`; ``UNSIGNED-PAYLOAD`` is not used: the body's SHA-256 is
signed), path-style addressing with a custom endpoint, virtual-hosted on AWS. Credentials:
:func:`credentials_for` (explicit keys, else the standard AWS chain of
:mod:`logstore.objectstore.credentials`).

Answers: 200 -> written; 412 ``PreconditionFailed`` -> the key exists; 409
``ConditionalRequestConflict`` (a concurrent conditional write in flight), 500, 503
``SlowDown`` -> transient, retried by the caller; anything else -> an error with S3's code.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import http.client
from urllib.parse import quote, urlsplit

from logstore.objectstore._sigv4 import sign_v4
from logstore.objectstore.credentials import Credentials, default_chain
from logstore.objectstore.settings import StorageSettings

__all__ = ["credentials_for", "put_if_absent_s3"]

TRANSIENT_STATUS = frozenset({409, 500, 502, 503, 504})


def credentials_for(settings: StorageSettings) -> Credentials | None:
    """What loglake signs with: the settings' explicit keys (``[storage]`` or the
    environment's ``AWS_ACCESS_KEY_ID``...), else the standard chain
    (:mod:`logstore.objectstore.credentials`: shared files, container, instance metadata)."""
    if settings.access_key_id and settings.secret_access_key:
        return Credentials(
            settings.access_key_id, settings.secret_access_key, settings.session_token
        )
    return default_chain().get()


def put_if_absent_s3(
    settings: StorageSettings, bucket: str, key: str, data: bytes
) -> tuple[int, str]:
    """PUT ``data`` at ``bucket/key`` unless it exists. Returns (HTTP status, response body);
    raises ``OSError`` when the endpoint cannot be reached or times out."""
    if settings.endpoint_url:
        parts = urlsplit(settings.endpoint_url)
        secure = parts.scheme == "https"
        host = parts.netloc
        path = f"/{quote(bucket, safe='')}/{quote(key, safe='/~')}"
    else:
        secure = True
        host = f"{bucket}.s3.{settings.region}.amazonaws.com"
        path = f"/{quote(key, safe='/~')}"
    payload_hash = hashlib.sha256(data).hexdigest()
    headers = {"host": host, "if-none-match": "*", "x-amz-content-sha256": payload_hash}
    creds = credentials_for(settings)
    if creds is not None:
        sign_v4(
            headers,
            method="PUT",
            path=path,
            payload_hash=payload_hash,
            access_key_id=creds.access_key_id,
            secret_access_key=creds.secret_access_key,
            session_token=creds.session_token,
            region=settings.region,
            service="s3",
        )
    else:
        headers["x-amz-date"] = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    cls = http.client.HTTPSConnection if secure else http.client.HTTPConnection
    conn = cls(host, timeout=settings.request_timeout_s)
    try:
        conn.request("PUT", path, body=data, headers=headers)
        response = conn.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    finally:
        conn.close()
