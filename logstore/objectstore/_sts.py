"""AWS STS's ``AssumeRole`` and ``AssumeRoleWithWebIdentity`` as bytes: the request to send and
the credentials in the answer (sans-IO: :mod:`logstore.objectstore.credentials` sends it).

Format (STS Query API, version ``2011-06-15``): a ``POST /`` with a form-encoded body
(``Action=...&Version=2011-06-15&RoleArn=...&RoleSessionName=...``), answered with XML:
``<AssumeRoleResponse><AssumeRoleResult><Credentials>`` holding ``AccessKeyId``,
``SecretAccessKey``, ``SessionToken`` and ``Expiration`` (ISO 8601), or an
``<ErrorResponse><Error><Code>/<Message>``. ``AssumeRole`` is signed (SigV4, service ``sts``)
with the source credentials; ``AssumeRoleWithWebIdentity`` is not signed (the token is the
proof), as botocore sends it.

Endpoint, as botocore (1.36+) picks it: ``AWS_ENDPOINT_URL_STS``, else ``AWS_ENDPOINT_URL``,
else the regional ``https://sts.<region>.amazonaws.com``. Not read: an ``endpoint_url`` in a
profile's ``services`` section.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit

from logstore.errors import ObjectStoreError
from logstore.objectstore._sigv4 import sign_v4

__all__ = ["StsAnswer", "StsRequest", "assume_role", "parse_answer", "sts_endpoint", "web_identity"]

_VERSION = "2011-06-15"
_FORM = "application/x-www-form-urlencoded; charset=utf-8"


@dataclass(frozen=True, slots=True)
class StsRequest:
    """One request to send: ``POST url`` with ``headers`` and ``body``."""

    url: str
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)
class StsAnswer:
    """The temporary credentials of an answer; ``expires_at`` in epoch seconds."""

    access_key_id: str
    secret_access_key: str
    session_token: str
    expires_at: float


def sts_endpoint(env: Mapping[str, str], region: str) -> str:
    """Where STS is, for ``env`` (see the module docstring)."""
    url = env.get("AWS_ENDPOINT_URL_STS") or env.get("AWS_ENDPOINT_URL")
    return (url or f"https://sts.{region}.amazonaws.com").rstrip("/")


def _form(params: Mapping[str, str | None]) -> bytes:
    return urlencode({k: v for k, v in params.items() if v is not None}).encode()


def assume_role(
    *,
    endpoint: str,
    region: str,
    access_key_id: str,
    secret_access_key: str,
    session_token: str | None,
    role_arn: str,
    session_name: str,
    external_id: str | None = None,
    duration_s: int | None = None,
    now: dt.datetime | None = None,
) -> StsRequest:
    """``AssumeRole`` signed with the source credentials."""
    body = _form(
        {
            "Action": "AssumeRole",
            "Version": _VERSION,
            "RoleArn": role_arn,
            "RoleSessionName": session_name,
            "ExternalId": external_id,
            "DurationSeconds": None if duration_s is None else str(duration_s),
        }
    )
    parts = urlsplit(endpoint)
    headers = {"host": parts.netloc, "content-type": _FORM}
    sign_v4(
        headers,
        method="POST",
        path=parts.path or "/",
        payload_hash=hashlib.sha256(body).hexdigest(),
        access_key_id=access_key_id,
        secret_access_key=secret_access_key,
        session_token=session_token,
        region=region,
        service="sts",
        now=now,
    )
    headers.pop("host")  # http.client sends it
    return StsRequest(endpoint + "/", headers, body)


def web_identity(
    *, endpoint: str, role_arn: str, session_name: str, token: str, duration_s: int | None = None
) -> StsRequest:
    """``AssumeRoleWithWebIdentity`` (unsigned)."""
    body = _form(
        {
            "Action": "AssumeRoleWithWebIdentity",
            "Version": _VERSION,
            "RoleArn": role_arn,
            "RoleSessionName": session_name,
            "WebIdentityToken": token,
            "DurationSeconds": None if duration_s is None else str(duration_s),
        }
    )
    return StsRequest(endpoint + "/", {"content-type": _FORM}, body)


def _strip(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def parse_answer(status: int, body: bytes, *, source: str) -> StsAnswer:
    """The credentials of a 200 answer; any other answer, or one without the four fields, is
    an :class:`~logstore.errors.ObjectStoreError` naming ``source`` and STS's code and message
    (STS never echoes a secret or a token in them)."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        root = None
    fields = {} if root is None else {_strip(e.tag): (e.text or "").strip() for e in root.iter()}
    if status != 200:
        code = fields.get("Code", "")
        message = fields.get("Message", "") or body[:200].decode("utf-8", "replace")
        raise ObjectStoreError(f"{source}: STS answered HTTP {status} {code}: {message}")
    try:
        expires = dt.datetime.fromisoformat(fields["Expiration"].replace("Z", "+00:00"))
        return StsAnswer(
            fields["AccessKeyId"],
            fields["SecretAccessKey"],
            fields["SessionToken"],
            expires.timestamp(),
        )
    except (KeyError, ValueError) as exc:
        raise ObjectStoreError(f"{source}: malformed STS answer (no {exc})") from None
