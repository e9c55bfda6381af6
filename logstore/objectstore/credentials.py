"""AWS credentials for the requests loglake signs itself: the standard chain, without botocore.

Why: :mod:`logstore.objectstore._s3put` (loglake's conditional PUT: leases and its own
commits) signs its requests itself, while pyarrow (the AWS SDK for C++) and delta-rs
(``object_store``/``aws-config``) find credentials on their own along the same standard chain.
Signing only with explicit keys made an instance role or a profile work for their requests and
fail for ours. botocore is a test-only dependency, so the chain is read here, with the standard
library, in the SDKs' order (first that answers wins):

1. Explicit keys: ``[storage] access_key_id`` / ``secret_access_key`` (``session_token``), or
   ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (``AWS_SESSION_TOKEN``) from the
   environment (:class:`~logstore.objectstore.settings.StorageSettings` holds both).
2. Shared files: profile ``AWS_PROFILE`` (else ``AWS_DEFAULT_PROFILE``, else ``default``);
   ``aws_access_key_id`` / ``aws_secret_access_key`` / ``aws_session_token`` from the
   credentials file (``AWS_SHARED_CREDENTIALS_FILE``, default ``~/.aws/credentials``, section
   ``[name]``), else the config file (``AWS_CONFIG_FILE``, default ``~/.aws/config``, section
   ``[profile name]``, ``[default]`` for the default). Not read: ``credential_process``,
   ``sso_*``, ``role_arn`` (assume-role needs STS); a profile holding only those gives no keys
   here, and the chain goes on.
3. Container credentials (ECS, EKS Pod Identity): ``AWS_CONTAINER_CREDENTIALS_RELATIVE_URI``
   (on ``http://169.254.170.2``) or ``AWS_CONTAINER_CREDENTIALS_FULL_URI``, with the
   ``Authorization`` header from ``AWS_CONTAINER_AUTHORIZATION_TOKEN`` or the file named by
   ``AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE`` (read at every fetch: it rotates).
4. EC2 instance metadata, IMDSv2 only: ``PUT /latest/api/token`` (a 6-hour token), then
   ``GET /latest/meta-data/iam/security-credentials/`` (the role) and ``.../<role>``; endpoint
   ``AWS_EC2_METADATA_SERVICE_ENDPOINT`` (default ``http://169.254.169.254``); skipped when
   ``AWS_EC2_METADATA_DISABLED=true``. One attempt, 1 s timeout (botocore's defaults), so a
   machine off EC2 loses at most about a second, once per process.

Temporary credentials (3 and 4, or files with a token and no expiry: those never refresh) carry
their ``Expiration``; :class:`CredentialChain` resolves again when less than
:data:`REFRESH_BEFORE_S` remain (botocore refreshes 10-15 minutes ahead). A failed refresh
keeps the old credentials while they are valid and raises once they have expired. Nothing
found anywhere: ``None`` (the request goes unsigned, as before; a public bucket or a local
store without auth answers it), and the chain is walked again :data:`NONE_RETRY_S` later, not
before (an instance metadata probe costs up to a second). A malformed answer or file raises
:class:`~logstore.errors.ObjectStoreError`, naming the source.

pyarrow and delta-rs are given keys only when they are explicit (1): along 2-4 they resolve the
same credentials themselves, and refresh them themselves.
"""

from __future__ import annotations

import configparser
import datetime as dt
import http.client
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from logstore.errors import ObjectStoreError

__all__ = [
    "NONE_RETRY_S",
    "REFRESH_BEFORE_S",
    "CredentialChain",
    "Credentials",
    "default_chain",
]

REFRESH_BEFORE_S = 600.0
NONE_RETRY_S = 300.0  # nothing found: asked again after this long (a role attached later)
_ECS_HOST = "http://169.254.170.2"
_IMDS_ENDPOINT = "http://169.254.169.254"
_IMDS_TOKEN_TTL_S = "21600"
_METADATA_TIMEOUT_S = 1.0


@dataclass(frozen=True, slots=True)
class Credentials:
    """One set of keys; ``expires_at`` (epoch seconds) ``None`` for long-lived ones;
    ``source`` names where they came from (for messages, never the keys)."""

    access_key_id: str
    secret_access_key: str
    session_token: str | None = None
    expires_at: float | None = None
    source: str = "explicit"


class CredentialChain:
    """The chain of the module docstring over ``environ`` (default ``os.environ``, read at each
    resolution), caching what it found until it nears expiry. Thread-safe; ``clock`` is
    ``time.time`` (tests move it)."""

    def __init__(
        self,
        *,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._environ = environ
        self._clock = clock
        self._lock = threading.Lock()
        self._cached: Credentials | None = None
        self._resolved = False
        self._retry_none_at = 0.0

    def get(self) -> Credentials | None:
        """The current credentials (resolved on first use, refreshed near expiry)."""
        with self._lock:
            now = self._clock()
            cached = self._cached
            if self._still_good(now):
                return cached
            try:
                self._cached = resolve(os.environ if self._environ is None else self._environ)
            except (OSError, ObjectStoreError):
                if cached is not None and cached.expires_at is not None and cached.expires_at > now:
                    return cached  # an advisory refresh failed: the old ones still work
                raise
            self._resolved = True
            self._retry_none_at = now + NONE_RETRY_S
            return self._cached

    def _still_good(self, now: float) -> bool:
        cached = self._cached
        if not self._resolved:
            return False
        if cached is None:
            return now < self._retry_none_at
        return cached.expires_at is None or cached.expires_at - now > REFRESH_BEFORE_S


_DEFAULT = CredentialChain()


def default_chain() -> CredentialChain:
    """The process's chain over ``os.environ`` (one cache for every signer in the process)."""
    return _DEFAULT


def resolve(env: Mapping[str, str]) -> Credentials | None:
    """One pass down the chain (no cache): environment keys, shared files, container,
    instance metadata."""
    key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if key and secret:
        return Credentials(key, secret, env.get("AWS_SESSION_TOKEN") or None, source="environment")
    found = _from_files(env)
    if found is not None:
        return found
    if env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") or env.get(
        "AWS_CONTAINER_CREDENTIALS_FULL_URI"
    ):
        return _from_container(env)
    if env.get("AWS_EC2_METADATA_DISABLED", "").strip().lower() == "true":
        return None
    return _from_imds(env)


def _from_files(env: Mapping[str, str]) -> Credentials | None:
    profile = env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") or "default"
    home = Path(env.get("HOME") or Path.home())
    creds_file = Path(env.get("AWS_SHARED_CREDENTIALS_FILE") or home / ".aws" / "credentials")
    config_file = Path(env.get("AWS_CONFIG_FILE") or home / ".aws" / "config")
    config_section = profile if profile == "default" else f"profile {profile}"
    for path, section in ((creds_file, profile), (config_file, config_section)):
        values = _ini_section(path, section)
        key, secret = values.get("aws_access_key_id"), values.get("aws_secret_access_key")
        if key and secret:
            token = values.get("aws_session_token") or None
            return Credentials(key, secret, token, source=f"{path} [{section}]")
    return None


def _ini_section(path: Path, section: str) -> dict[str, str]:
    parser = configparser.RawConfigParser()
    try:
        with path.open(encoding="utf-8") as f:
            parser.read_file(f)
    except FileNotFoundError:
        return {}
    except (OSError, configparser.Error) as exc:
        raise ObjectStoreError(f"cannot read AWS shared file: {exc}", path=str(path)) from None
    if not parser.has_section(section):
        return {}
    return {k.lower(): v.strip() for k, v in parser.items(section)}


def _from_container(env: Mapping[str, str]) -> Credentials:
    relative = env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
    url = _ECS_HOST + relative if relative else env["AWS_CONTAINER_CREDENTIALS_FULL_URI"]
    headers: dict[str, str] = {}
    token = env.get("AWS_CONTAINER_AUTHORIZATION_TOKEN")
    token_file = env.get("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE")
    if token_file:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ObjectStoreError(
                f"cannot read the container credentials token: {exc}", path=token_file
            ) from None
    if token:
        headers["Authorization"] = token
    status, body = _http("GET", url, headers)
    if status != 200:
        raise ObjectStoreError(f"container credentials: HTTP {status}", path=url)
    return _parse_temporary(body, source=f"container credentials {url}")


def _from_imds(env: Mapping[str, str]) -> Credentials | None:
    base = (env.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or _IMDS_ENDPOINT).rstrip("/")
    try:
        ttl = {"X-aws-ec2-metadata-token-ttl-seconds": _IMDS_TOKEN_TTL_S}
        status, token = _http("PUT", f"{base}/latest/api/token", ttl)
    except OSError:
        return None  # no instance metadata here: not on EC2 (or IMDS turned off)
    if status != 200:
        return None
    headers = {"X-aws-ec2-metadata-token": token.decode()}
    roles_url = f"{base}/latest/meta-data/iam/security-credentials/"
    status, body = _http("GET", roles_url, headers)
    if status == 404:
        return None  # an instance without a role
    if status != 200 or not body.strip():
        raise ObjectStoreError(f"instance metadata: HTTP {status} listing roles", path=roles_url)
    role = body.decode().split()[0]
    status, body = _http("GET", roles_url + role, headers)
    if status != 200:
        raise ObjectStoreError(f"instance metadata: HTTP {status}", path=roles_url + role)
    return _parse_temporary(body, source=f"instance metadata role {role}")


def _parse_temporary(body: bytes, *, source: str) -> Credentials:
    try:
        doc = json.loads(body)
        expires = doc.get("Expiration")
        expires_at = (
            dt.datetime.fromisoformat(expires.replace("Z", "+00:00")).timestamp()
            if expires
            else None
        )
        return Credentials(
            str(doc["AccessKeyId"]),
            str(doc["SecretAccessKey"]),
            str(doc["Token"]) if doc.get("Token") else None,
            expires_at,
            source,
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ObjectStoreError(f"{source}: malformed answer ({exc!r})") from None


def _http(method: str, url: str, headers: Mapping[str, str]) -> tuple[int, bytes]:
    parts = urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.netloc, timeout=_METADATA_TIMEOUT_S)
    try:
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        conn.request(method, path or "/", headers=dict(headers))
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()
