"""IAM Identity Center (SSO) profiles: the cached login token and the portal's
``GetRoleCredentials`` request (sans-IO: :mod:`logstore.objectstore.credentials` sends it).

As botocore's ``SSOProvider``: a profile is an SSO one when it has ``sso_role_name`` or
``sso_account_id``; it needs both, plus ``sso_start_url`` and ``sso_region``, in the profile or
in the ``[sso-session <name>]`` section its ``sso_session`` names (a key in both must agree).
The token is the one ``aws sso login`` cached in ``~/.aws/sso/cache/<sha1>.json`` (sha1 of the
session name, or of the start URL for a legacy profile without ``sso_session``): JSON with
``accessToken`` and ``expiresAt`` (ISO 8601). The portal is ``GET
https://portal.sso.<sso_region>.amazonaws.com/federation/credentials?role_name=&account_id=``
(``AWS_ENDPOINT_URL_SSO`` moves it) with the header ``x-amz-sso_bearer_token``, answering
``{"roleCredentials": {"accessKeyId", "secretAccessKey", "sessionToken", "expiration"}}``
(``expiration`` in epoch milliseconds).

Not done, unlike botocore: refreshing the login token through SSO OIDC ``CreateToken`` with
its ``refreshToken`` (that writes the CLI's cache); an expired token is a clear error asking
for ``aws sso login``, and a token near expiry is used as it is.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

from logstore.errors import ObjectStoreError

__all__ = ["SsoRequest", "is_sso_profile", "parse_role_credentials", "role_credentials_request"]


@dataclass(frozen=True, slots=True)
class SsoRequest:
    """``GET url`` with ``headers`` (the bearer token: never put in a message)."""

    url: str
    headers: dict[str, str]


def is_sso_profile(profile: Mapping[str, str]) -> bool:
    return "sso_role_name" in profile or "sso_account_id" in profile


def role_credentials_request(
    *,
    env: Mapping[str, str],
    profile: Mapping[str, str],
    name: str,
    sessions: Mapping[str, Mapping[str, str]],
    home: Path,
    now: float,
) -> SsoRequest:
    """The portal request for SSO profile ``name`` (``sessions``: the config file's
    ``sso-session`` sections by name); raises on missing keys or a missing/expired token."""
    where = f"AWS profile {name!r} (SSO)"
    config = dict(profile)
    session_name = profile.get("sso_session")
    if session_name is not None:
        if session_name not in sessions:
            raise ObjectStoreError(f"{where}: sso-session {session_name!r} does not exist")
        for key, value in sessions[session_name].items():
            if key in config and config[key] != value:
                raise ObjectStoreError(f"{where}: {key} differs from sso-session {session_name!r}")
            config[key] = value
    required = ("sso_role_name", "sso_account_id", "sso_start_url", "sso_region")
    missing = [k for k in required if not config.get(k)]
    if missing:
        raise ObjectStoreError(f"{where}: missing {', '.join(missing)}")
    key = hashlib.sha1(
        (session_name or config["sso_start_url"]).encode(), usedforsecurity=False
    ).hexdigest()
    cache = home / ".aws" / "sso" / "cache" / f"{key}.json"
    login = f"run aws sso login --profile {name}"
    try:
        doc = json.loads(cache.read_text(encoding="utf-8"))
        token = str(doc["accessToken"])
        expires = dt.datetime.fromisoformat(str(doc["expiresAt"]).replace("Z", "+00:00"))
    except FileNotFoundError:
        raise ObjectStoreError(f"{where}: no cached SSO token: {login}", path=str(cache)) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ObjectStoreError(
            f"{where}: unreadable SSO token cache ({type(exc).__name__}): {login}", path=str(cache)
        ) from None
    if expires.tzinfo is None:
        expires = expires.replace(tzinfo=dt.UTC)
    if expires.timestamp() <= now:
        raise ObjectStoreError(f"{where}: the SSO token has expired: {login}", path=str(cache))
    base = (
        env.get("AWS_ENDPOINT_URL_SSO")
        or f"https://portal.sso.{config['sso_region']}.amazonaws.com"
    )
    query = urlencode(
        {"role_name": config["sso_role_name"], "account_id": config["sso_account_id"]}
    )
    return SsoRequest(
        f"{base.rstrip('/')}/federation/credentials?{query}",
        {"x-amz-sso_bearer_token": token},
    )


def parse_role_credentials(status: int, body: bytes, *, source: str) -> tuple[str, str, str, float]:
    """(access key id, secret, session token, expiry in epoch seconds) of a portal answer."""
    if status != 200:
        try:
            message = json.loads(body).get("message", "")
        except (ValueError, AttributeError):
            message = ""
        hint = " (the SSO token was refused: aws sso login)" if status in (401, 403) else ""
        raise ObjectStoreError(f"{source}: SSO portal answered HTTP {status} {message}{hint}")
    try:
        creds = json.loads(body)["roleCredentials"]
        return (
            str(creds["accessKeyId"]),
            str(creds["secretAccessKey"]),
            str(creds["sessionToken"]),
            float(creds["expiration"]) / 1000.0,
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ObjectStoreError(f"{source}: malformed SSO portal answer ({exc!r})") from None
