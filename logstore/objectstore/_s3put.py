"""The S3 PUTs loglake makes itself, with the standard library: ``PutObject`` with
``If-None-Match: *`` (put-if-absent), which pyarrow cannot make, and the broker tier's single
PUTs of objects under one part, which pyarrow makes at a price.

Why put-if-absent is here (measured here, 2026-11-27, pyarrow 26, deltalake 1.6.6, moto 5.2.5):
pyarrow's ``S3FileSystem`` has no conditional write; deltalake's ``DeltaFileSystemHandler``
(its object store as a pyarrow handler) exposes plain open/copy/move/delete only, no put mode
(its ``copy_file``/``move_file`` also hold the GIL while they wait for the store); fsspec/s3fs
and obstore are not installed; boto3 is a test-only dependency. The request is a single
signed HTTP PUT, so it is made here with the standard library: AWS Signature Version 4
(:mod:`logstore.objectstore._sigv4`) with the body's SHA-256 signed,
path-style addressing with a custom endpoint, virtual-hosted on AWS. Credentials:
:func:`credentials_for` (explicit keys, else the standard AWS chain of
:mod:`logstore.objectstore.credentials`).

Why the tier's uploads are here (``unsigned_payload``): through pyarrow (its AWS SDK) a 4 MiB
segment was copied from Python into an Arrow buffer, hashed for the signature (the SDK signs
the payload over http) and handed to curl on the SDK's threads: the upload thread and the
SDK's threads took about 0.23 of the 0.26 CPU-s that tiering added to the broker per 200k
1 KiB records produced (``/proc`` per thread, ``tests/perf/bench_tier.py``'s workload, load
11-14); with this PUT tiering adds about 0.15 CPU-s, the upload thread 0.02-0.03. The body is
the file's bytes read once, sent with ``UNSIGNED-PAYLOAD`` in place of its SHA-256 (S3 takes
it in the Authorization header's signature: AWS, "Signature Calculations for the Authorization
Header: Transferring Payload in a Single Chunk"; the SDKs sign the payload over http by
choice) and an ``x-amz-checksum-crc32c`` header, signed, which S3 checks against the body:
integrity without hashing the body for the signature, at CRC32C's speed (hardware, the GIL
released for large buffers).

Answers: 200 -> written; 412 ``PreconditionFailed`` -> the key exists; 409
``ConditionalRequestConflict`` (a concurrent conditional write in flight), 500, 503
``SlowDown`` -> transient, retried by the caller; anything else -> an error with S3's code.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import http.client
import re
from urllib.parse import quote, urlsplit

from crc32c import crc32c

from logstore.objectstore._limits import ERROR_BODY_MAX
from logstore.objectstore._sigv4 import sign_v4
from logstore.objectstore.credentials import Credentials, default_chain
from logstore.objectstore.settings import StorageSettings

__all__ = [
    "ERROR_BODY_MAX",
    "SINGLE_PUT_MAX_BYTES",
    "credentials_for",
    "error_code",
    "put_if_absent_s3",
    "put_object_s3",
    "request_target",
    "sign_request",
]

TRANSIENT_STATUS = frozenset({409, 500, 502, 503, 504})
# objects below this go up in one PUT (pyarrow's part size: larger ones are multipart uploads)
SINGLE_PUT_MAX_BYTES = 10 << 20
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"


def credentials_for(settings: StorageSettings) -> Credentials | None:
    """What loglake signs with: the settings' explicit keys (``[storage]`` or the
    environment's ``AWS_ACCESS_KEY_ID``...), else the standard chain
    (:mod:`logstore.objectstore.credentials`: shared files, container, instance metadata)."""
    if settings.access_key_id and settings.secret_access_key:
        return Credentials(
            settings.access_key_id, settings.secret_access_key, settings.session_token
        )
    return default_chain().get()


def error_code(body: str) -> str:
    """S3's error code in an error answer's XML body (else the body, on one line, cut)."""
    match = re.search(r"<Code>([^<]+)</Code>", body)
    return match.group(1) if match else " ".join(body.split())[:200]


def request_target(settings: StorageSettings, bucket: str, key: str) -> tuple[bool, str, str]:
    """``(https, host, path)`` of object ``bucket/key``: path-style addressing with a custom
    endpoint (``settings.endpoint_url``), virtual-hosted on AWS."""
    if settings.endpoint_url:
        parts = urlsplit(settings.endpoint_url)
        return (
            parts.scheme == "https",
            parts.netloc,
            f"/{quote(bucket, safe='')}/{quote(key, safe='/~')}",
        )
    return True, f"{bucket}.s3.{settings.region}.amazonaws.com", f"/{quote(key, safe='/~')}"


def sign_request(
    settings: StorageSettings,
    headers: dict[str, str],
    *,
    method: str,
    path: str,
    payload_hash: str,
) -> None:
    """Sign ``headers`` (``host`` among them) for one S3 request with :func:`credentials_for`
    (AWS Signature Version 4; anonymous, only dated, without credentials)."""
    headers["x-amz-content-sha256"] = payload_hash
    creds = credentials_for(settings)
    if creds is None:
        headers["x-amz-date"] = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        return
    sign_v4(
        headers,
        method=method,
        path=path,
        payload_hash=payload_hash,
        access_key_id=creds.access_key_id,
        secret_access_key=creds.secret_access_key,
        session_token=creds.session_token,
        region=settings.region,
        service="s3",
    )


def put_if_absent_s3(
    settings: StorageSettings, bucket: str, key: str, data: bytes
) -> tuple[int, str]:
    """PUT ``data`` at ``bucket/key`` unless it exists. Returns (HTTP status, response body);
    raises ``OSError`` when the endpoint cannot be reached or times out."""
    return put_object_s3(settings, bucket, key, data, if_none_match=True)


def put_object_s3(
    settings: StorageSettings,
    bucket: str,
    key: str,
    data: bytes,
    *,
    if_none_match: bool = False,
    unsigned_payload: bool = False,
) -> tuple[int, str]:
    """PUT ``data`` at ``bucket/key`` in one request: ``if_none_match`` unless the key exists;
    ``unsigned_payload``: the body's CRC32C sent and signed instead of its SHA-256 (module
    docstring). Returns (HTTP status, response body); raises ``OSError`` when the endpoint
    cannot be reached or times out."""
    secure, host, path = request_target(settings, bucket, key)
    headers = {"host": host}
    if if_none_match:
        headers["if-none-match"] = "*"
    if unsigned_payload:
        payload_hash = UNSIGNED_PAYLOAD
        crc = crc32c(data).to_bytes(4, "big")
        headers["x-amz-checksum-crc32c"] = base64.b64encode(crc).decode()
    else:
        payload_hash = hashlib.sha256(data).hexdigest()
    sign_request(settings, headers, method="PUT", path=path, payload_hash=payload_hash)
    cls = http.client.HTTPSConnection if secure else http.client.HTTPConnection
    conn = cls(host, timeout=settings.request_timeout_s)
    try:
        conn.request("PUT", path, body=data, headers=headers)
        response = conn.getresponse()
        return response.status, response.read(ERROR_BODY_MAX).decode("utf-8", "replace")
    finally:
        conn.close()
