"""AWS Signature Version 4 for the requests loglake signs itself (S3's conditional PUT, STS's
``AssumeRole``): one signer, standard library only (botocore is a test-only dependency).

Format (AWS "Create a signed AWS API request"): the canonical request is method, URI path,
canonical query (the caller passes it already sorted and encoded), the signed headers as
``name:value`` lines (lower-case names, sorted), their names joined by ``;``, and the payload's
SHA-256; the string to sign is ``AWS4-HMAC-SHA256``, the time, the scope
``<day>/<region>/<service>/aws4_request`` and the canonical request's SHA-256; the key is
derived by HMAC-chaining ``AWS4<secret>`` over day, region, service and ``aws4_request``.
Every header passed in is signed (``host`` must be among them). Tests compare the result with
botocore's ``SigV4Auth``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
from collections.abc import MutableMapping

__all__ = ["sign_v4"]


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def sign_v4(
    headers: MutableMapping[str, str],
    *,
    method: str,
    path: str,
    payload_hash: str,
    access_key_id: str,
    secret_access_key: str,
    session_token: str | None,
    region: str,
    service: str,
    query: str = "",
    now: dt.datetime | None = None,
) -> None:
    """Add ``x-amz-date``, ``x-amz-security-token`` (temporary keys) and ``authorization`` to
    ``headers`` (lower-case names, ``host`` included), signing all of them."""
    when = now or dt.datetime.now(dt.UTC)
    amz_date = when.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    headers["x-amz-date"] = amz_date
    if session_token:
        headers["x-amz-security-token"] = session_token
    names = sorted(headers)
    signed = ";".join(names)
    canonical = "\n".join(
        [
            method,
            path,
            query,
            "".join(f"{k}:{headers[k].strip()}\n" for k in names),
            signed,
            payload_hash,
        ]
    )
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = _hmac(("AWS4" + secret_access_key).encode(), day)
    for part in (region, service, "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key_id}/{scope}, "
        f"SignedHeaders={signed}, Signature={signature}"
    )
