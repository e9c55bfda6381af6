"""AWS credentials for the requests loglake signs itself: the standard chain, without botocore.

Why: :mod:`logstore.objectstore._s3put` (loglake's conditional PUT: leases and its own
commits) signs its requests itself, while pyarrow (the AWS SDK for C++) and delta-rs
(``object_store``/``aws-config``) find credentials on their own along the same standard chain.
Signing only with explicit keys made an instance role or a profile work for their requests and
fail for ours. botocore is a test-only dependency, so the chain is read here, with the standard
library, in botocore's order (``create_credential_resolver``; first that answers wins):

1. Explicit keys: ``[storage] access_key_id`` / ``secret_access_key`` (``session_token``), or
   ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (``AWS_SESSION_TOKEN``) from the
   environment (:class:`~logstore.objectstore.settings.StorageSettings` holds both).
2. Assume role, when the profile (``AWS_PROFILE``, else ``AWS_DEFAULT_PROFILE``, else
   ``default``) has ``role_arn`` and no ``web_identity_token_file``: STS ``AssumeRole``
   (:mod:`logstore.objectstore._sts`), SigV4-signed with the credentials of exactly one of
   ``source_profile`` (its keys, web identity or ``credential_process``, the role's own profile
   included; a role profile without keys is assumed first: chained, loops refused) or
   ``credential_source`` (``Environment``, ``EcsContainer``, ``Ec2InstanceMetadata``;
   ``Environment`` can only fail here, as in botocore without an explicit session profile:
   environment keys come first in the chain), with ``role_session_name``, ``external_id``,
   ``duration_seconds``. ``mfa_serial`` is refused (it needs a code typed in).
3. Web identity (EKS IRSA): ``AWS_WEB_IDENTITY_TOKEN_FILE`` / ``AWS_ROLE_ARN`` /
   ``AWS_ROLE_SESSION_NAME``, each over the profile's ``web_identity_token_file`` /
   ``role_arn`` / ``role_session_name``: STS ``AssumeRoleWithWebIdentity`` (unsigned), the
   token file read again at every resolution (the kubelet rotates it).
4. SSO (IAM Identity Center: ``sso_role_name`` / ``sso_account_id``; ``sso_session`` or legacy):
   the token ``aws sso login`` cached, traded at the SSO portal for the role's credentials
   (:mod:`logstore.objectstore._sso`; the token is not refreshed here: expired, a clear error).
5. The profile's static keys in the credentials file (``AWS_SHARED_CREDENTIALS_FILE``, default
   ``~/.aws/credentials``, section ``[name]``).
6. ``credential_process`` of the profile: the command, split as by a shell (``shlex``, no shell
   runs it), prints ``{"Version": 1, "AccessKeyId", "SecretAccessKey", "SessionToken",
   "Expiration"}``; a non-zero exit, other output or missing keys raise, naming the profile and
   never the command line or the output.
7. The profile's static keys in the config file (``AWS_CONFIG_FILE``, default ``~/.aws/config``,
   section ``[profile name]``, ``[default]`` for the default). Keys of the same profile are
   merged credentials file over config file for 2-6, as botocore merges them.
8. Container credentials (ECS, EKS Pod Identity): ``AWS_CONTAINER_CREDENTIALS_RELATIVE_URI``
   (on ``http://169.254.170.2``) or ``AWS_CONTAINER_CREDENTIALS_FULL_URI``, with the
   ``Authorization`` header from ``AWS_CONTAINER_AUTHORIZATION_TOKEN`` or the file named by
   ``AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE`` (read at every fetch: it rotates).
9. EC2 instance metadata, IMDSv2 only: ``PUT /latest/api/token`` (a 6-hour token), then
   ``GET /latest/meta-data/iam/security-credentials/`` (the role) and ``.../<role>``; endpoint
   ``AWS_EC2_METADATA_SERVICE_ENDPOINT`` (default ``http://169.254.169.254``); skipped when
   ``AWS_EC2_METADATA_DISABLED=true``. One attempt, 1 s timeout (botocore's defaults; here
   for each whole exchange, see below), so a machine off EC2 loses at most about a second,
   once per process.

STS is ``AWS_ENDPOINT_URL_STS``, else ``AWS_ENDPOINT_URL``, else
``https://sts.<region>.amazonaws.com`` (region: ``AWS_REGION``, ``AWS_DEFAULT_REGION``, the
profile's ``region``, else ``us-east-1``); the session name defaults to
``loglake-session-<epoch>`` (botocore: ``botocore-session-<epoch>``). Not read: botocore's
legacy boto2 files, and a profile's ``services`` endpoints.

Temporary credentials (2, 3, 4, 6, 8 and 9; files with a token and no expiry never refresh)
carry their ``Expiration``; :class:`CredentialChain` resolves again when less than
:data:`REFRESH_BEFORE_S` remain (botocore refreshes 10-15 minutes ahead). A failed refresh
keeps the old credentials while they are valid and raises once they have expired. Nothing
found anywhere: ``None`` (the request goes unsigned, as before; a public bucket or a local
store without auth answers it), and the chain is walked again :data:`NONE_RETRY_S` later, not
before (an instance metadata probe costs up to a second). A malformed answer or file raises
:class:`~logstore.errors.ObjectStoreError`, naming the source.

pyarrow and delta-rs are given keys only when they are explicit (1): along 2-9 they resolve the
same credentials themselves, and refresh them themselves.

Bounded answers: every answer read here (instance metadata, the container endpoint, STS, the
SSO portal, a ``credential_process``'s stdout) is read up to
:data:`~logstore.objectstore._limits.ERROR_BODY_MAX` (64 KiB; a credentials document is under
4 KiB) plus one byte; more is refused with an error naming the source and the limit, never
parsed cut (a ``credential_process`` printing more is killed). Each HTTP exchange has a total
deadline (its timeout: 1 s for instance metadata and the container endpoint, 10 s for STS and
SSO), not only a per-socket-operation one: a peer sending a byte now and then would otherwise
hold a resolution, and the lock of :class:`CredentialChain` with it, forever.
"""

from __future__ import annotations

import configparser
import datetime as dt
import http.client
import io
import json
import os
import selectors
import shlex
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast
from urllib.parse import urlsplit

from logstore.errors import ObjectStoreError
from logstore.objectstore import _sso, _sts
from logstore.objectstore._limits import ERROR_BODY_MAX

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
_STS_TIMEOUT_S = 10.0
_PROCESS_TIMEOUT_S = 60.0  # botocore waits forever; a hung helper must not hang a lease
_REGION = "us-east-1"


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
    """One pass down the chain of the module docstring (no cache)."""
    found = _from_environment(env)
    if found is not None:
        return found
    name = env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") or "default"
    profiles = _Profiles(env)
    profile = profiles.get(name)
    if "role_arn" in profile and "web_identity_token_file" not in profile:
        return _assume_role(env, profiles, name, chain=())
    found = _from_web_identity(env, profile, name, use_env=True)
    if found is None:
        found = _from_profile(env, profiles, name)
    if found is not None:
        return found
    if env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") or env.get(
        "AWS_CONTAINER_CREDENTIALS_FULL_URI"
    ):
        return _from_container(env)
    if env.get("AWS_EC2_METADATA_DISABLED", "").strip().lower() == "true":
        return None
    return _from_imds(env)


def _from_environment(env: Mapping[str, str]) -> Credentials | None:
    key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if key and secret:
        return Credentials(key, secret, env.get("AWS_SESSION_TOKEN") or None, source="environment")
    return None


class _Profiles:
    """The shared files' profiles: ``[name]`` of the credentials file over ``[profile name]``
    (``[default]``) of the config file, key by key, as botocore merges them."""

    def __init__(self, env: Mapping[str, str]) -> None:
        home = self.home = Path(env.get("HOME") or Path.home())
        self.creds_file = Path(
            env.get("AWS_SHARED_CREDENTIALS_FILE") or home / ".aws" / "credentials"
        )
        self.config_file = Path(env.get("AWS_CONFIG_FILE") or home / ".aws" / "config")
        self._creds = _ini(self.creds_file)
        self._config = _ini(self.config_file)

    @staticmethod
    def config_section(name: str) -> str:
        return name if name == "default" else f"profile {name}"

    def in_credentials(self, name: str) -> dict[str, str]:
        return self._creds.get(name, {})

    def in_config(self, name: str) -> dict[str, str]:
        return self._config.get(self.config_section(name), {})

    def exists(self, name: str) -> bool:
        return name in self._creds or self.config_section(name) in self._config

    def get(self, name: str) -> dict[str, str]:
        return {**self.in_config(name), **self.in_credentials(name)}

    def sso_sessions(self) -> dict[str, dict[str, str]]:
        prefix = "sso-session "
        return {
            k[len(prefix) :].strip(): v for k, v in self._config.items() if k.startswith(prefix)
        }


def _static_keys(values: Mapping[str, str], source: str) -> Credentials | None:
    key, secret = values.get("aws_access_key_id"), values.get("aws_secret_access_key")
    if key and secret:
        return Credentials(key, secret, values.get("aws_session_token") or None, source=source)
    return None


def _from_profile(env: Mapping[str, str], profiles: _Profiles, name: str) -> Credentials | None:
    """A profile's own keys, botocore's order after web identity: SSO, the credentials file's
    keys, ``credential_process``, the config file's keys."""
    profile = profiles.get(name)
    if _sso.is_sso_profile(profile):
        return _from_sso(env, profiles, name)
    found = _static_keys(profiles.in_credentials(name), f"{profiles.creds_file} [{name}]")
    if found is None and profile.get("credential_process"):
        found = _from_process(profile["credential_process"], name)
    if found is None:
        section = profiles.config_section(name)
        found = _static_keys(profiles.in_config(name), f"{profiles.config_file} [{section}]")
    return found


def _from_sso(env: Mapping[str, str], profiles: _Profiles, name: str) -> Credentials:
    request = _sso.role_credentials_request(
        env=env,
        profile=profiles.get(name),
        name=name,
        sessions=profiles.sso_sessions(),
        home=profiles.home,
        now=time.time(),
    )
    source = f"SSO of AWS profile {name!r}"
    try:
        status, body = _http(
            "GET", request.url, request.headers, source=source, timeout=_STS_TIMEOUT_S
        )
    except OSError as exc:
        raise ObjectStoreError(f"{source}: portal unreachable: {exc}") from None
    key, secret, token, expires_at = _sso.parse_role_credentials(status, body, source=source)
    return Credentials(key, secret, token, expires_at, source)


def _ini(path: Path) -> dict[str, dict[str, str]]:
    parser = configparser.RawConfigParser()
    try:
        with path.open(encoding="utf-8") as f:
            parser.read_file(f)
    except FileNotFoundError:
        return {}
    except (OSError, configparser.Error) as exc:
        raise ObjectStoreError(f"cannot read AWS shared file: {exc}", path=str(path)) from None
    return {
        section: {k.lower(): v.strip() for k, v in parser.items(section)}
        for section in parser.sections()
    }


def _from_process(command: str, profile: str) -> Credentials:
    """``credential_process``: the command split as a shell would (no shell runs it), its JSON
    on stdout (at most :data:`ERROR_BODY_MAX` bytes, :func:`_run_capped`). Neither the command
    line (it may carry a secret) nor stdout is put in a message; stderr's first 500 characters
    are (botocore shows all of it)."""
    source = f"credential_process of AWS profile {profile!r}"
    try:
        args = shlex.split(command)
        returncode, stdout, stderr_bytes = _run_capped(args, source)
    except (ValueError, OSError, subprocess.TimeoutExpired) as exc:
        detail = f" ({exc.strerror})" if isinstance(exc, OSError) and exc.strerror else ""
        what = type(exc).__name__
        raise ObjectStoreError(f"{source}: could not run it: {what}{detail}") from None
    if returncode != 0:
        stderr = stderr_bytes.decode("utf-8", "replace").strip()[:500]
        raise ObjectStoreError(f"{source}: exited with {returncode}: {stderr}")
    try:
        doc = json.loads(stdout)
    except ValueError:
        raise ObjectStoreError(f"{source}: its output is not JSON") from None
    if not isinstance(doc, dict) or doc.get("Version") != 1:
        version = doc.get("Version") if isinstance(doc, dict) else None
        raise ObjectStoreError(f"{source}: Version {version!r} in its output, expected 1")
    missing = [k for k in ("AccessKeyId", "SecretAccessKey") if not doc.get(k)]
    if missing:
        raise ObjectStoreError(f"{source}: {', '.join(missing)} missing from its output")
    expires = doc.get("Expiration")
    try:
        expires_at = (
            dt.datetime.fromisoformat(str(expires).replace("Z", "+00:00")).timestamp()
            if expires
            else None
        )
    except ValueError:
        raise ObjectStoreError(f"{source}: Expiration {expires!r} is not ISO 8601") from None
    token = doc.get("SessionToken")
    return Credentials(
        str(doc["AccessKeyId"]),
        str(doc["SecretAccessKey"]),
        str(token) if token else None,
        expires_at,
        source,
    )


def _run_capped(args: list[str], source: str) -> tuple[int, bytes, bytes]:
    """Run ``args`` (stdin inherited, as botocore does): ``(exit status, stdout, stderr)``.
    Both pipes are drained as the child writes (a full pipe would block it); stdout over
    :data:`ERROR_BODY_MAX` raises :class:`ObjectStoreError` (the AWS CLI caps nothing; a
    helper printing without end must not fill this process's memory), stderr past that is
    read and dropped. Past :data:`_PROCESS_TIMEOUT_S` in all, ``subprocess.TimeoutExpired``.
    On any error the child is killed and reaped (``Popen.__exit__`` waits)."""
    deadline = time.monotonic() + _PROCESS_TIMEOUT_S
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as child:
        out, err = cast(io.BufferedReader, child.stdout), cast(io.BufferedReader, child.stderr)
        stdout, stderr = bytearray(), bytearray()
        kept = {out.fileno(): stdout, err.fileno(): stderr}
        try:
            with selectors.DefaultSelector() as selector:
                for pipe in (out, err):
                    selector.register(pipe, selectors.EVENT_READ)
                while selector.get_map():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise subprocess.TimeoutExpired(args, _PROCESS_TIMEOUT_S)
                    for key, _ in selector.select(left):
                        chunk = os.read(key.fd, ERROR_BODY_MAX)
                        if not chunk:
                            selector.unregister(key.fileobj)
                            continue
                        buf = kept[key.fd]
                        buf += chunk[: ERROR_BODY_MAX + 1 - len(buf)]
                        if buf is stdout and len(buf) > ERROR_BODY_MAX:
                            raise ObjectStoreError(
                                f"{source}: output over {ERROR_BODY_MAX} bytes, refused "
                                "(the helper was killed)"
                            )
            returncode = child.wait(max(deadline - time.monotonic(), 0.0))
        except BaseException:
            child.kill()
            raise
    return returncode, bytes(stdout), bytes(stderr)


def _region(env: Mapping[str, str], profile: Mapping[str, str]) -> str:
    return (
        env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or profile.get("region") or _REGION
    )


def _session_name(given: str | None) -> str:
    return given or f"loglake-session-{int(time.time())}"


def _call_sts(request: _sts.StsRequest, *, source: str) -> _sts.StsAnswer:
    try:
        status, body = _http(
            "POST",
            request.url,
            request.headers,
            source=source,
            body=request.body,
            timeout=_STS_TIMEOUT_S,
        )
    except OSError as exc:
        raise ObjectStoreError(f"{source}: STS unreachable: {exc}", path=request.url) from None
    return _sts.parse_answer(status, body, source=source)


def _temporary(answer: _sts.StsAnswer, source: str) -> Credentials:
    return Credentials(
        answer.access_key_id,
        answer.secret_access_key,
        answer.session_token,
        answer.expires_at,
        source,
    )


def _from_web_identity(
    env: Mapping[str, str], profile: Mapping[str, str], name: str, *, use_env: bool
) -> Credentials | None:
    """EKS IRSA: the token file (re-read at every resolution: the kubelet rotates it) traded at
    STS for the role's credentials; each variable over its profile key, as botocore does."""

    def pick(var: str, key: str) -> str | None:
        return (env.get(var) if use_env else None) or profile.get(key)

    token_file = pick("AWS_WEB_IDENTITY_TOKEN_FILE", "web_identity_token_file")
    if not token_file:
        return None
    role_arn = pick("AWS_ROLE_ARN", "role_arn")
    if not role_arn:
        raise ObjectStoreError(
            f"web identity token file {token_file} without a role: set AWS_ROLE_ARN "
            f"(or role_arn in AWS profile {name!r})"
        )
    token = _read_token(token_file, "the web identity token")
    source = f"web identity for {role_arn}"
    request = _sts.web_identity(
        endpoint=_sts.sts_endpoint(env, _region(env, profile)),
        role_arn=role_arn,
        session_name=_session_name(pick("AWS_ROLE_SESSION_NAME", "role_session_name")),
        token=token,
    )
    return _temporary(_call_sts(request, source=source), source)


def _assume_role(
    env: Mapping[str, str], profiles: _Profiles, name: str, *, chain: tuple[str, ...]
) -> Credentials:
    """A profile's ``role_arn``: the source credentials (``source_profile``, itself possibly a
    role: chained; or ``credential_source``) sign STS ``AssumeRole``."""
    profile = profiles.get(name)
    role_arn = profile["role_arn"]
    where = f"AWS profile {name!r}"
    source_profile, credential_source = (
        profile.get("source_profile"),
        profile.get("credential_source"),
    )
    if bool(source_profile) == bool(credential_source):
        raise ObjectStoreError(
            f"{where}: role_arn needs exactly one of source_profile and credential_source"
        )
    if profile.get("mfa_serial"):
        raise ObjectStoreError(f"{where}: mfa_serial needs a code typed in; not supported here")
    source: Credentials | None
    if source_profile:
        if source_profile in chain:
            raise ObjectStoreError(f"{where}: source_profile loop {' -> '.join((*chain, name))}")
        if not profiles.exists(source_profile):
            raise ObjectStoreError(f"{where}: source_profile {source_profile!r} does not exist")
        parent = profiles.get(source_profile)
        has_keys = _static_keys(parent, "") is not None
        if has_keys or "role_arn" not in parent or "web_identity_token_file" in parent:
            # botocore: a source profile with keys (the role's own profile too) gives them,
            # else its web identity, credential_process...; only a keyless role is assumed
            source = _from_web_identity(env, parent, source_profile, use_env=False)
            source = source or _from_profile(env, profiles, source_profile)
        elif source_profile == name:
            source = None  # a role profile naming itself needs keys of its own
        else:
            source = _assume_role(env, profiles, source_profile, chain=(*chain, name))
        what = f"source_profile {source_profile!r}"
    else:
        source = _from_credential_source(env, credential_source or "", where)
        what = f"credential_source {credential_source}"
    if source is None:
        raise ObjectStoreError(f"{where}: {what} gave no credentials to assume {role_arn}")
    duration = profile.get("duration_seconds")
    try:
        duration_s = int(duration) if duration else None
    except ValueError:
        raise ObjectStoreError(
            f"{where}: duration_seconds {duration!r} is not an integer"
        ) from None
    region = _region(env, profile)
    request = _sts.assume_role(
        endpoint=_sts.sts_endpoint(env, region),
        region=region,
        access_key_id=source.access_key_id,
        secret_access_key=source.secret_access_key,
        session_token=source.session_token,
        role_arn=role_arn,
        session_name=_session_name(profile.get("role_session_name")),
        external_id=profile.get("external_id") or None,
        duration_s=duration_s,
    )
    label = f"role {role_arn} of {where} (from {source.source})"
    answer = _call_sts(request, source=label)
    return _temporary(answer, label)


def _from_credential_source(env: Mapping[str, str], name: str, where: str) -> Credentials | None:
    if name == "Environment":
        return _from_environment(env)
    if name == "EcsContainer":
        if not (
            env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
            or env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI")
        ):
            return None
        return _from_container(env)
    if name == "Ec2InstanceMetadata":
        return _from_imds(env)
    raise ObjectStoreError(
        f"{where}: credential_source {name!r} is not one of Environment, EcsContainer, "
        "Ec2InstanceMetadata"
    )


def _read_token(path: str, what: str) -> str:
    """A token file's text (re-read at every fetch: these tokens rotate)."""
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ObjectStoreError(f"cannot read {what}: {exc.strerror or exc}", path=path) from None


def _from_container(env: Mapping[str, str]) -> Credentials:
    relative = env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
    url = _ECS_HOST + relative if relative else env["AWS_CONTAINER_CREDENTIALS_FULL_URI"]
    headers: dict[str, str] = {}
    token = env.get("AWS_CONTAINER_AUTHORIZATION_TOKEN")
    token_file = env.get("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE")
    if token_file:
        token = _read_token(token_file, "the container credentials token")
    if token:
        headers["Authorization"] = token
    try:
        status, body = _http("GET", url, headers, source="container credentials")
    except OSError as exc:
        raise ObjectStoreError(f"container credentials: unreachable: {exc}", path=url) from None
    if status != 200:
        raise ObjectStoreError(f"container credentials: HTTP {status}", path=url)
    return _parse_temporary(body, source=f"container credentials {url}")


def _from_imds(env: Mapping[str, str]) -> Credentials | None:
    base = (env.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or _IMDS_ENDPOINT).rstrip("/")
    try:
        ttl = {"X-aws-ec2-metadata-token-ttl-seconds": _IMDS_TOKEN_TTL_S}
        status, token = _http("PUT", f"{base}/latest/api/token", ttl, source="instance metadata")
    except OSError:
        return None  # no instance metadata here: not on EC2 (or IMDS turned off)
    if status != 200:
        return None
    headers = {"X-aws-ec2-metadata-token": token.decode()}
    roles_url = f"{base}/latest/meta-data/iam/security-credentials/"
    status, body = _imds_get(roles_url, headers)
    if status == 404:
        return None  # an instance without a role
    if status != 200 or not body.strip():
        raise ObjectStoreError(f"instance metadata: HTTP {status} listing roles", path=roles_url)
    role = body.decode().split()[0]
    status, body = _imds_get(roles_url + role, headers)
    if status != 200:
        raise ObjectStoreError(f"instance metadata: HTTP {status}", path=roles_url + role)
    return _parse_temporary(body, source=f"instance metadata role {role}")


def _imds_get(url: str, headers: Mapping[str, str]) -> tuple[int, bytes]:
    try:
        return _http("GET", url, headers, source="instance metadata")
    except OSError as exc:
        raise ObjectStoreError(f"instance metadata: unreachable: {exc}", path=url) from None


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


def _http(
    method: str,
    url: str,
    headers: Mapping[str, str],
    *,
    source: str,
    body: bytes | None = None,
    timeout: float = _METADATA_TIMEOUT_S,
) -> tuple[int, bytes]:
    """One HTTP exchange: ``(status, body)``. ``timeout`` bounds the whole exchange (connect,
    send, status line, headers, body), not each socket operation; past it ``TimeoutError``
    (an ``OSError``, as an unreachable endpoint). A body over :data:`ERROR_BODY_MAX` or an
    answer that is not HTTP or cut short raises :class:`ObjectStoreError` naming ``source``."""
    parts = urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    deadline = time.monotonic() + timeout
    conn = cls(parts.netloc, timeout=timeout)
    response: http.client.HTTPResponse | None = None
    try:
        conn.connect()
        conn.sock = cast(socket.socket, _DeadlineSocket(conn.sock, deadline))
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        conn.request(method, path or "/", body=body, headers=dict(headers))
        response = conn.getresponse()
        status, answer = response.status, response.read(ERROR_BODY_MAX + 1)
        if len(answer) <= ERROR_BODY_MAX and response.length:
            # read(amt) returns a body cut short of its Content-Length as it is: never parsed
            raise http.client.IncompleteRead(answer, response.length)
    except TimeoutError:
        raise TimeoutError(f"timed out: no whole answer within {timeout:g} s") from None
    except OSError:
        raise  # refused, reset (RemoteDisconnected too): unreachable, as the callers word it
    except http.client.HTTPException as exc:
        raise ObjectStoreError(f"{source}: bad HTTP answer ({exc!r})", path=url) from None
    finally:
        if response is not None:
            response.close()  # an answer cut at the cap: its socket closed now, not at GC
        conn.close()
    if len(answer) > ERROR_BODY_MAX:
        raise ObjectStoreError(f"{source}: answer over {ERROR_BODY_MAX} bytes, refused", path=url)
    return status, answer


class _DeadlineSocket:
    """A connected socket whose sends and receives wait at most until ``deadline``
    (``time.monotonic``): what :mod:`http.client` calls of its socket (``sendall``,
    ``makefile`` for the answer, ``close``). ``http.client``'s own timeout is per socket
    operation, so a peer trickling a byte at a time never trips it. As for a socket, the
    socket is closed when both it and the answer's file are (``http.client`` closes the
    connection before the body of an answer that ends with it is read)."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline
        self._files = 0
        self._closed = False

    def _arm(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        self._sock.settimeout(left)

    def sendall(self, data: bytes) -> None:
        self._arm()
        self._sock.sendall(data)

    def recv_into(self, buffer: memoryview, nbytes: int = 0, flags: int = 0) -> int:
        self._arm()
        return self._sock.recv_into(buffer, nbytes, flags)

    def makefile(self, mode: str) -> io.BufferedReader:
        if mode != "rb":
            raise ValueError(f"mode {mode!r}: only 'rb' is served")
        self._files += 1
        return io.BufferedReader(socket.SocketIO(cast(socket.socket, self), "rb"))

    def _decref_socketios(self) -> None:  # called by SocketIO.close()
        self._files -= 1
        if self._closed and not self._files:
            self._sock.close()

    def fileno(self) -> int:
        return self._sock.fileno()

    def close(self) -> None:
        self._closed = True
        if not self._files:
            self._sock.close()
