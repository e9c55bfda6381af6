"""The standard AWS credential chain for loglake's own signed requests.

Environment and shared files are real files read by the chain. The container and instance
metadata endpoints are small local HTTP servers in the test (nothing real fits: they exist only
inside ECS/EC2), answering as AWS documents them; the IMDS one refuses any GET without the token
of its PUT (IMDSv2). A moved clock drives expiry and refresh. The signature of the conditional
PUT is checked against botocore's own SigV4 (test-only dependency), for keys found in a file.
Hostile endpoints (a 10 MB credentials document, an oversized STS answer, a container endpoint
trickling its answer: :class:`~tests.fixtures.hostile.HostileServer`) and a credential_process
printing 100 MB each end in a clear error, having read at most ``ERROR_BODY_MAX`` + 1 bytes.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import hashlib
import http.server
import json
import re
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
from crc32c import crc32c

from logstore.errors import ObjectStoreError
from logstore.objectstore import StorageSettings
from logstore.objectstore import credentials as creds_mod
from logstore.objectstore._limits import ERROR_BODY_MAX
from logstore.objectstore._s3put import credentials_for, put_if_absent_s3, put_object_s3
from logstore.objectstore.credentials import (
    NONE_RETRY_S,
    REFRESH_BEFORE_S,
    CredentialChain,
    Credentials,
)
from tests.fixtures.hostile import HostileServer, http_answer

T0 = 1_800_000_000.0


class _Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def _iso(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Endpoint(http.server.ThreadingHTTPServer):
    """A local endpoint: ``answers`` maps (method, path) to a callable(headers) ->
    (status, body); every request is recorded in ``seen``."""

    def __init__(self) -> None:
        self.answers: dict[tuple[str, str], Any] = {}
        self.seen: list[tuple[str, str, dict[str, str], bytes]] = []
        self.fail = False
        super().__init__(("127.0.0.1", 0), _Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # else: the client hung up (a cap)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Endpoint

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.server.seen.append((self.command, self.path, headers, body))
        answer = self.server.answers.get((self.command, self.path))
        status, out = (500, b"down") if self.server.fail or answer is None else answer(headers)
        self.send_response(status)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_GET(self) -> None:
        self._answer()

    def do_PUT(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self._answer()

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[_Endpoint]:
    server = _Endpoint()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _temporary(key: str, expires: float) -> bytes:
    return json.dumps(
        {
            "AccessKeyId": key,
            "SecretAccessKey": f"{key}-secret",
            "Token": f"{key}-token",
            "Expiration": _iso(expires),
            "Code": "Success",
        }
    ).encode()


def test_environment_keys_come_first(tmp_path: Path) -> None:
    (tmp_path / "credentials").write_text(
        "[default]\naws_access_key_id = F\naws_secret_access_key = f\n"
    )
    env = {
        "AWS_ACCESS_KEY_ID": "E",
        "AWS_SECRET_ACCESS_KEY": "e",
        "AWS_SESSION_TOKEN": "t",
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials"),
    }
    got = CredentialChain(environ=env).get()
    assert got == Credentials("E", "e", "t", None, "environment")


def test_shared_files_profiles_and_their_order(tmp_path: Path) -> None:
    cred_file, config_file = tmp_path / "credentials", tmp_path / "config"
    cred_file.write_text(
        "[default]\naws_access_key_id = D\naws_secret_access_key = d\n"
        "[team]\naws_access_key_id = T\naws_secret_access_key = t\naws_session_token = tt\n"
    )
    config_file.write_text(
        "[default]\nregion = eu-west-1\n"
        "[profile team]\naws_access_key_id = X\naws_secret_access_key = x\n"
        "[profile conf-only]\naws_access_key_id = C\naws_secret_access_key = c\n"
        "[profile sso]\nsso_start_url = https://example.invalid\n"
    )
    base = {
        "AWS_SHARED_CREDENTIALS_FILE": str(cred_file),
        "AWS_CONFIG_FILE": str(config_file),
        "AWS_EC2_METADATA_DISABLED": "true",
        "HOME": str(tmp_path / "nohome"),
    }
    default = CredentialChain(environ=base).get()
    assert default is not None and (default.access_key_id, default.secret_access_key) == ("D", "d")
    # the credentials file wins over the config file for the same profile
    team = CredentialChain(environ={**base, "AWS_PROFILE": "team"}).get()
    assert team == Credentials("T", "t", "tt", None, f"{cred_file} [team]")
    # the config file's [profile name] section; AWS_DEFAULT_PROFILE when AWS_PROFILE is unset
    conf = CredentialChain(environ={**base, "AWS_DEFAULT_PROFILE": "conf-only"}).get()
    assert conf == Credentials("C", "c", None, None, f"{config_file} [profile conf-only]")
    # a profile with only a start URL is not an SSO credentials profile (as in botocore): no
    # keys, and the chain goes on (IMDS off: none)
    assert CredentialChain(environ={**base, "AWS_PROFILE": "sso"}).get() is None
    # ~/.aws of HOME when no file is named
    (tmp_path / "home" / ".aws").mkdir(parents=True)
    (tmp_path / "home" / ".aws" / "credentials").write_text(
        "[default]\naws_access_key_id = H\naws_secret_access_key = h\n"
    )
    home = CredentialChain(
        environ={"HOME": str(tmp_path / "home"), "AWS_EC2_METADATA_DISABLED": "true"}
    ).get()
    assert home is not None and home.access_key_id == "H"
    cred_file.write_text("[default\nbroken")
    with pytest.raises(ObjectStoreError, match="cannot read AWS shared file"):
        CredentialChain(environ=base).get()


def test_container_credentials_with_a_token_file_refresh_before_expiry(
    endpoint: _Endpoint, tmp_path: Path
) -> None:
    clock = _Clock()
    keys = iter(["ECS1", "ECS2"])
    endpoint.answers[("GET", "/v2/creds")] = lambda h: (
        (200, _temporary(next(keys), clock.now + 3600))
        if h.get("authorization") == "secret-token"
        else (401, b"no")
    )
    token_file = tmp_path / "token"
    token_file.write_text("secret-token\n")
    env = {
        "AWS_CONTAINER_CREDENTIALS_FULL_URI": f"{endpoint.url}/v2/creds",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": str(token_file),
        "HOME": str(tmp_path),
    }
    chain = CredentialChain(environ=env, clock=clock)
    first = chain.get()
    assert first is not None and first.access_key_id == "ECS1"
    assert (first.session_token, first.expires_at) == ("ECS1-token", T0 + 3600)
    clock.now += 3600 - REFRESH_BEFORE_S - 60  # still well before expiry: the cache answers
    assert chain.get() is first and len(endpoint.seen) == 1
    clock.now += 120  # within the refresh window
    second = chain.get()
    assert second is not None and second.access_key_id == "ECS2" and len(endpoint.seen) == 2
    # a failed refresh keeps the old credentials while they are valid, raises once expired
    clock.now = second.expires_at - 60  # type: ignore[operator]
    endpoint.fail = True
    assert chain.get() is second
    clock.now = second.expires_at + 1  # type: ignore[operator]
    with pytest.raises(ObjectStoreError, match="container credentials: HTTP 500"):
        chain.get()


def test_container_relative_uri_uses_the_ecs_address(monkeypatch: pytest.MonkeyPatch) -> None:
    urls: list[str] = []

    def fake_http(method: str, url: str, headers: Any, **_: Any) -> tuple[int, bytes]:
        urls.append(url)
        return 200, _temporary("REL", T0 + 3600)

    monkeypatch.setattr(creds_mod, "_http", fake_http)  # 169.254.170.2 exists only in ECS
    env = {"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "/v2/credentials/abc", "HOME": "/nonexistent"}
    got = CredentialChain(environ=env).get()
    assert got is not None and got.access_key_id == "REL"
    assert urls == ["http://169.254.170.2/v2/credentials/abc"]


def test_imds_v2_token_then_role_credentials_and_refresh(
    endpoint: _Endpoint, tmp_path: Path
) -> None:
    clock = _Clock()
    keys = iter(["ROLE1", "ROLE2"])

    def with_token(answer: Any) -> Any:
        return lambda h: answer(h) if h.get("x-aws-ec2-metadata-token") == "tok" else (401, b"")

    endpoint.answers[("PUT", "/latest/api/token")] = lambda h: (
        (200, b"tok") if h.get("x-aws-ec2-metadata-token-ttl-seconds") == "21600" else (400, b"")
    )
    roles = "/latest/meta-data/iam/security-credentials/"
    endpoint.answers[("GET", roles)] = with_token(lambda h: (200, b"loglake-role\n"))
    endpoint.answers[("GET", roles + "loglake-role")] = with_token(
        lambda h: (200, _temporary(next(keys), clock.now + 21600))
    )
    env = {"AWS_EC2_METADATA_SERVICE_ENDPOINT": endpoint.url, "HOME": str(tmp_path)}
    chain = CredentialChain(environ=env, clock=clock)
    first = chain.get()
    assert first is not None and first.access_key_id == "ROLE1"
    assert first.source == "instance metadata role loglake-role"
    assert [(m, p) for m, p, _, _ in endpoint.seen] == [
        ("PUT", "/latest/api/token"),
        ("GET", roles),
        ("GET", roles + "loglake-role"),
    ]
    clock.now += 21600 - REFRESH_BEFORE_S + 1
    second = chain.get()
    assert second is not None and second.access_key_id == "ROLE2" and len(endpoint.seen) == 6
    # an instance without a role: none; IMDS disabled: not even asked
    endpoint.answers[("GET", roles)] = with_token(lambda h: (404, b""))
    assert CredentialChain(environ=env).get() is None
    asked = len(endpoint.seen)
    assert CredentialChain(environ={**env, "AWS_EC2_METADATA_DISABLED": "true"}).get() is None
    assert len(endpoint.seen) == asked


def test_no_metadata_service_means_no_credentials(tmp_path: Path) -> None:
    # a closed port: what a machine off EC2 sees (connection refused or a timeout)
    server = _Endpoint()
    url = server.url
    server.shutdown()
    server.server_close()
    env = {"AWS_EC2_METADATA_SERVICE_ENDPOINT": url, "HOME": str(tmp_path)}
    clock = _Clock()
    chain = CredentialChain(environ=env, clock=clock)
    assert chain.get() is None
    # keys that appear later (a profile written, a role attached) are found after a while
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text(
        "[default]\naws_access_key_id = LATER\naws_secret_access_key = l\n"
    )
    assert chain.get() is None  # not walked again on every request
    clock.now += NONE_RETRY_S
    later = chain.get()
    assert later is not None and later.access_key_id == "LATER"


def test_the_conditional_put_signs_with_keys_from_a_profile(
    endpoint: _Endpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No keys in the settings: the PUT is signed with the profile's keys and token, and the
    signature is the one botocore computes for the same request."""
    botocore_auth = pytest.importorskip("botocore.auth")
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials as BotoCredentials

    endpoint.answers[("PUT", "/bucket/a/key.json")] = lambda h: (200, b"")
    (tmp_path / "credentials").write_text(
        "[lake]\naws_access_key_id = PROFILEKEY\naws_secret_access_key = profile-secret\n"
        "aws_session_token = profile-token\n"
    )
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_PROFILE", "lake")
    monkeypatch.setattr(creds_mod, "_DEFAULT", CredentialChain())
    settings = StorageSettings.from_environment({"endpoint_url": endpoint.url}, environ={})
    assert settings.access_key_id is None
    status, _ = put_if_absent_s3(settings, "bucket", "a/key.json", b'{"x": 1}')
    assert status == 200
    (_, path, headers, body) = endpoint.seen[-1]
    assert body == b'{"x": 1}' and headers["x-amz-security-token"] == "profile-token"
    assert "Credential=PROFILEKEY/" in headers["authorization"]
    when = dt.datetime.strptime(headers["x-amz-date"], "%Y%m%dT%H%M%SZ")
    monkeypatch.setattr(botocore_auth, "get_current_datetime", lambda: when)
    request = AWSRequest(
        method="PUT",
        url=f"{endpoint.url}{path}",
        data=body,
        headers={"If-None-Match": "*", "X-Amz-Content-SHA256": headers["x-amz-content-sha256"]},
    )
    boto = BotoCredentials("PROFILEKEY", "profile-secret", "profile-token")
    botocore_auth.S3SigV4Auth(boto, "s3", settings.region).add_auth(request)
    assert headers["authorization"] == request.headers["Authorization"]
    # explicit keys in the settings win over the chain
    explicit = StorageSettings.from_environment(
        {"access_key_id": "K", "secret_access_key": "S"}, environ={}
    )
    assert credentials_for(explicit) == Credentials("K", "S")


def _process_script(tmp_path: Path, body: str) -> str:
    """A credential_process helper: a Python script in the test's tmp dir; returns the
    profile's command line (the interpreter, then the script, whose path has a space)."""
    script = tmp_path / "cred helper.py"
    script.write_text("import json, sys, pathlib\n" + body)
    return f'{sys.executable} "{script}" --role lake'


def test_credential_process_runs_without_a_shell_and_refreshes(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    command = _process_script(
        tmp_path,
        f"runs = pathlib.Path({str(runs)!r})\n"
        "n = len(runs.read_text()) if runs.exists() else 0\n"
        "runs.write_text('x' * (n + 1))\n"
        "assert sys.argv[1:] == ['--role', 'lake'], sys.argv\n"
        "print(json.dumps({'Version': 1, 'AccessKeyId': f'PROC{n}', 'SecretAccessKey': 's',\n"
        "                  'SessionToken': 't', 'Expiration': '2027-01-15T10:00:00Z'}))\n",
    )
    config = tmp_path / "config"
    config.write_text(
        f"[profile proc]\ncredential_process = {command}\n"
        "aws_access_key_id = CONFKEY\naws_secret_access_key = c\n"
    )
    env = {
        "AWS_CONFIG_FILE": str(config),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials"),
        "AWS_PROFILE": "proc",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    expires = dt.datetime(2027, 1, 15, 10, tzinfo=dt.UTC).timestamp()
    clock = _Clock()
    clock.now = expires - 3600
    chain = CredentialChain(environ=env, clock=clock)
    first = chain.get()
    # credential_process comes before the config file's keys of the same profile
    assert first == Credentials(
        "PROC0", "s", "t", expires, "credential_process of AWS profile 'proc'"
    )
    clock.now = expires - REFRESH_BEFORE_S + 1
    second = chain.get()
    assert second is not None and second.access_key_id == "PROC1"
    # the credentials file's keys come before credential_process
    (tmp_path / "credentials").write_text(
        "[proc]\naws_access_key_id = FILEKEY\naws_secret_access_key = f\n"
    )
    got = CredentialChain(environ=env).get()
    assert got is not None and got.access_key_id == "FILEKEY"
    assert runs.read_text() == "xx"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "sys.stderr.write('token expired, run login'); sys.exit(3)",
            "exited with 3: token expired",
        ),
        ("print('AccessKeyId=K SecretAccessKey=S3CRET')", "its output is not JSON"),
        (
            "print(json.dumps({'Version': 2, 'AccessKeyId': 'K', 'SecretAccessKey': 'S3CRET'}))",
            "Version 2 in its output, expected 1",
        ),
        (
            "print(json.dumps({'Version': 1, 'AccessKeyId': 'K', 'SessionToken': 'S3CRET'}))",
            "SecretAccessKey missing from its output",
        ),
        (
            "print(json.dumps({'Version': 1, 'AccessKeyId': 'K', 'SecretAccessKey': 'S3CRET',"
            " 'Expiration': 'tomorrow'}))",
            "Expiration 'tomorrow' is not ISO 8601",
        ),
    ],
)
def test_credential_process_failures_are_clear_and_keep_secrets_out(
    tmp_path: Path, body: str, message: str
) -> None:
    command = _process_script(tmp_path, body)
    config = tmp_path / "config"
    config.write_text(f"[default]\ncredential_process = {command} --secret S3CRET\n")
    env = {"AWS_CONFIG_FILE": str(config), "HOME": str(tmp_path)}
    with pytest.raises(ObjectStoreError, match="credential_process of AWS profile 'default'") as e:
        CredentialChain(environ=env).get()
    assert message in str(e.value) and "S3CRET" not in str(e.value)
    config.write_text("[default]\ncredential_process = /nonexistent/helper --x\n")
    with pytest.raises(ObjectStoreError, match="could not run it: FileNotFoundError"):
        CredentialChain(environ=env).get()


def test_profile_precedence_and_role_configuration_errors(tmp_path: Path) -> None:
    """botocore's order: environment keys, then an assume-role profile, then web identity,
    then the profile's own keys; a role profile's mistakes are named."""
    config = tmp_path / "config"
    config.write_text(
        "[profile both]\nrole_arn = arn:r\nsource_profile = a\ncredential_source = Environment\n"
        "[profile neither]\nrole_arn = arn:r\naws_access_key_id = K\naws_secret_access_key = k\n"
        "[profile loop1]\nrole_arn = arn:r\nsource_profile = loop2\n"
        "[profile loop2]\nrole_arn = arn:r\nsource_profile = loop1\n"
        "[profile missing]\nrole_arn = arn:r\nsource_profile = nowhere\n"
        "[profile badsource]\nrole_arn = arn:r\ncredential_source = Laptop\n"
        "[profile mfa]\nrole_arn = arn:r\nsource_profile = mfa\nmfa_serial = arn:mfa\n"
        "[profile badduration]\nrole_arn = arn:r\nsource_profile = badduration\n"
        "duration_seconds = 1h\naws_access_key_id = K\naws_secret_access_key = k\n"
        "[profile nokeys]\nrole_arn = arn:r\ncredential_source = Environment\n"
        "[profile irsa]\nweb_identity_token_file = /nonexistent/token\n"
        "[profile irsa-norole]\nweb_identity_token_file = /nonexistent/token\n"
    )
    base = {"AWS_CONFIG_FILE": str(config), "HOME": str(tmp_path)}
    cases = {
        "both": "role_arn needs exactly one of source_profile and credential_source",
        "neither": "role_arn needs exactly one of source_profile and credential_source",
        "loop1": "source_profile loop loop1 -> loop2",
        "missing": "source_profile 'nowhere' does not exist",
        "badsource": "credential_source 'Laptop' is not one of",
        "mfa": "mfa_serial needs a code typed in",
        "badduration": "duration_seconds '1h' is not an integer",
        "nokeys": "credential_source Environment gave no credentials to assume arn:r",
        "irsa-norole": "without a role: set AWS_ROLE_ARN",
    }
    for profile, message in cases.items():
        with pytest.raises(ObjectStoreError, match=re.escape(message)):
            CredentialChain(environ={**base, "AWS_PROFILE": profile}).get()
    with pytest.raises(ObjectStoreError, match="cannot read the web identity token") as e:
        CredentialChain(environ={**base, "AWS_PROFILE": "irsa", "AWS_ROLE_ARN": "arn:r"}).get()
    assert e.value.path == "/nonexistent/token"  # type: ignore[attr-defined]
    # environment keys come before every profile source
    env_keys = {"AWS_ACCESS_KEY_ID": "E", "AWS_SECRET_ACCESS_KEY": "e"}
    got = CredentialChain(environ={**base, **env_keys, "AWS_PROFILE": "both"}).get()
    assert got is not None and got.source == "environment"
    # web identity from the environment needs its role as well
    with pytest.raises(ObjectStoreError, match="without a role"):
        CredentialChain(environ={**base, "AWS_WEB_IDENTITY_TOKEN_FILE": "/x"}).get()


def test_sts_assume_role_signature_is_botocores(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one SigV4 signer, for STS: the same Authorization botocore computes."""
    botocore_auth = pytest.importorskip("botocore.auth")
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials as BotoCredentials

    from logstore.objectstore import _sts

    when = dt.datetime(2026, 11, 28, 4, 30, tzinfo=dt.UTC)
    request = _sts.assume_role(
        endpoint="https://sts.eu-west-1.amazonaws.com",
        region="eu-west-1",
        access_key_id="AKIASOURCE",
        secret_access_key="source-secret",
        session_token="source-token",
        role_arn="arn:aws:iam::1:role/r",
        session_name="s",
        external_id="x y",
        duration_s=900,
        now=when,
    )
    assert b"ExternalId=x+y" in request.body and b"DurationSeconds=900" in request.body
    boto_request = AWSRequest(
        method="POST",
        url=request.url,
        data=request.body,
        headers={"Content-Type": request.headers["content-type"]},
    )
    monkeypatch.setattr(botocore_auth, "get_current_datetime", lambda: when.replace(tzinfo=None))
    boto = BotoCredentials("AKIASOURCE", "source-secret", "source-token")
    botocore_auth.SigV4Auth(boto, "sts", "eu-west-1").add_auth(boto_request)
    assert request.headers["authorization"] == boto_request.headers["Authorization"]
    assert request.headers["x-amz-security-token"] == "source-token"


def test_sts_error_answers_name_the_source_and_code() -> None:
    from logstore.objectstore import _sts

    error = (
        b'<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error>'
        b"<Type>Sender</Type><Code>InvalidIdentityToken</Code>"
        b"<Message>Token expired</Message></Error></ErrorResponse>"
    )
    with pytest.raises(
        ObjectStoreError, match="web identity for r: STS answered HTTP 400 InvalidIdentityToken"
    ):
        _sts.parse_answer(400, error, source="web identity for r")
    with pytest.raises(ObjectStoreError, match="STS answered HTTP 503 : busy"):
        _sts.parse_answer(503, b"busy", source="x")
    with pytest.raises(ObjectStoreError, match="malformed STS answer"):
        _sts.parse_answer(200, b"<AssumeRoleResponse/>", source="x")


def test_sso_profile_trades_the_cached_token_at_the_portal(
    endpoint: _Endpoint, tmp_path: Path
) -> None:
    """The SSO portal is a local endpoint (moto does not serve it), answering as AWS documents
    ``GetRoleCredentials``; the token is the one ``aws sso login`` caches."""
    expires_ms = int((time.time() + 3600) * 1000)
    path = "/federation/credentials?role_name=LakeWriter&account_id=123456789012"
    endpoint.answers[("GET", path)] = lambda h: (
        (
            200,
            json.dumps(
                {
                    "roleCredentials": {
                        "accessKeyId": "SSOKEY",
                        "secretAccessKey": "sso-secret",
                        "sessionToken": "sso-token",
                        "expiration": expires_ms,
                    }
                }
            ).encode(),
        )
        if h.get("x-amz-sso_bearer_token") == "login-token"
        else (401, b'{"message": "Session token not found or invalid"}')
    )
    home = tmp_path / "home"
    (home / ".aws" / "sso" / "cache").mkdir(parents=True)
    (home / ".aws" / "config").write_text(
        "[profile dev]\nsso_session = corp\nsso_account_id = 123456789012\n"
        "sso_role_name = LakeWriter\n"
        "[sso-session corp]\nsso_start_url = https://corp.awsapps.com/start\n"
        "sso_region = eu-west-1\n"
        "[profile partial]\nsso_role_name = LakeWriter\n"
    )
    cache = home / ".aws" / "sso" / "cache" / (hashlib.sha1(b"corp").hexdigest() + ".json")
    env = {"HOME": str(home), "AWS_PROFILE": "dev", "AWS_ENDPOINT_URL_SSO": endpoint.url}
    with pytest.raises(ObjectStoreError, match="no cached SSO token: run aws sso login"):
        CredentialChain(environ=env).get()
    cache.write_text(json.dumps({"accessToken": "login-token", "expiresAt": _iso(time.time() - 1)}))
    with pytest.raises(ObjectStoreError, match="the SSO token has expired"):
        CredentialChain(environ=env).get()
    cache.write_text(
        json.dumps({"accessToken": "login-token", "expiresAt": _iso(time.time() + 600)})
    )
    got = CredentialChain(environ=env).get()
    assert got == Credentials(
        "SSOKEY", "sso-secret", "sso-token", expires_ms / 1000, "SSO of AWS profile 'dev'"
    )
    # a token the portal refuses: a clear error, the token not in it
    cache.write_text(json.dumps({"accessToken": "stale", "expiresAt": _iso(time.time() + 600)}))
    with pytest.raises(ObjectStoreError, match="HTTP 401 Session token not found") as e:
        CredentialChain(environ=env).get()
    assert "stale" not in str(e.value)
    with pytest.raises(ObjectStoreError, match="missing sso_account_id, sso_start_url"):
        CredentialChain(environ={**env, "AWS_PROFILE": "partial"}).get()


def _answer_web_identity(endpoint: _Endpoint, clock: _Clock) -> None:
    """``endpoint`` answers AssumeRoleWithWebIdentity with keys ``WEB<n>`` (n: requests seen),
    valid for an hour of ``clock``."""
    endpoint.answers[("POST", "/")] = lambda h: (
        200,
        (
            "<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult><Credentials>"
            f"<AccessKeyId>WEB{len(endpoint.seen)}</AccessKeyId><SecretAccessKey>s"
            "</SecretAccessKey><SessionToken>t</SessionToken>"
            f"<Expiration>{_iso(clock.now + 3600)}</Expiration></Credentials>"
            "</AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>"
        ).encode(),
    )


def test_web_identity_sends_the_rotated_token_at_each_refresh(
    endpoint: _Endpoint, tmp_path: Path
) -> None:
    """What AssumeRoleWithWebIdentity sends (moto's STS, in the integration test, does not
    check the token): the token file as it is at each refresh, the role and session name."""
    clock = _Clock()
    _answer_web_identity(endpoint, clock)
    token = tmp_path / "token"
    token.write_text("first-token\n")
    config = tmp_path / "config"
    config.write_text(
        f"[profile pod]\nweb_identity_token_file = {token}\nrole_arn = arn:profile-role\n"
        "role_session_name = from-profile\n"
    )
    env = {
        "AWS_CONFIG_FILE": str(config),
        "HOME": str(tmp_path),
        "AWS_PROFILE": "pod",
        "AWS_ROLE_ARN": "arn:env-role",  # the variable over the profile's key
        "AWS_ENDPOINT_URL_STS": endpoint.url,
    }
    chain = CredentialChain(environ=env, clock=clock)
    first = chain.get()
    assert first is not None and first.access_key_id == "WEB1"
    token.write_text("second-token\n")
    clock.now += 3600 - REFRESH_BEFORE_S + 1
    second = chain.get()
    assert second is not None and second.access_key_id == "WEB2"
    sent = [parse_qs(body.decode()) for _, _, _, body in endpoint.seen]
    assert [s["WebIdentityToken"] for s in sent] == [["first-token"], ["second-token"]]
    assert all(s["Action"] == ["AssumeRoleWithWebIdentity"] for s in sent)
    assert all(s["RoleArn"] == ["arn:env-role"] for s in sent)
    assert all(s["RoleSessionName"] == ["from-profile"] for s in sent)
    assert all("authorization" not in h for _, _, h, _ in endpoint.seen)


def test_an_unsigned_payload_put_signs_as_botocore_and_sends_the_crc32c(
    endpoint: _Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tier's single PUT (``unsigned_payload``): ``UNSIGNED-PAYLOAD`` in place of the
    body's SHA-256, the body's CRC32C (big-endian, base64) in a signed header; the signature
    is botocore's for the same request with payload signing off."""
    botocore_auth = pytest.importorskip("botocore.auth")
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials as BotoCredentials

    endpoint.answers[("PUT", "/bucket/t/0.log")] = lambda h: (200, b"")
    settings = StorageSettings.from_environment(
        {"endpoint_url": endpoint.url, "access_key_id": "K", "secret_access_key": "S"},
        environ={},
    )
    body = b"123456789" * 1000
    status, _ = put_object_s3(settings, "bucket", "t/0.log", body, unsigned_payload=True)
    assert status == 200
    (_, path, headers, got) = endpoint.seen[-1]
    assert got == body
    assert headers["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD"
    assert "if-none-match" not in headers
    crc = base64.b64decode(headers["x-amz-checksum-crc32c"])
    assert int.from_bytes(crc, "big") == crc32c(body)
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value (RFC 3720)
    when = dt.datetime.strptime(headers["x-amz-date"], "%Y%m%dT%H%M%SZ")
    monkeypatch.setattr(botocore_auth, "get_current_datetime", lambda: when)
    request = AWSRequest(
        method="PUT",
        url=f"{endpoint.url}{path}",
        data=body,
        headers={
            "X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD",
            "x-amz-checksum-crc32c": headers["x-amz-checksum-crc32c"],
        },
    )
    auth = botocore_auth.S3SigV4Auth(BotoCredentials("K", "S"), "s3", settings.region)
    monkeypatch.setattr(auth, "_should_sha256_sign_payload", lambda request: False)
    auth.add_auth(request)
    assert "x-amz-checksum-crc32c" in headers["authorization"]
    assert headers["authorization"] == request.headers["Authorization"]


@pytest.fixture
def silent() -> Iterator[str]:
    """An endpoint that accepts connections and never answers (a hung STS or SSO portal)."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def hold() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                held.append(server.accept()[0])

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


def test_a_silent_sts_times_out_and_a_refresh_keeps_the_valid_keys(
    endpoint: _Endpoint, silent: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """STS stops answering (connections accepted, no reply): a first resolution fails in the
    timeout with a clear error; a refresh ahead of expiry keeps the keys it has and fails
    once they expired; STS answering again gives new ones."""
    monkeypatch.setattr(creds_mod, "_STS_TIMEOUT_S", 0.5)
    clock = _Clock()
    _answer_web_identity(endpoint, clock)
    token = tmp_path / "token"
    token.write_text("a-token\n")
    env = {
        "HOME": str(tmp_path),
        "AWS_WEB_IDENTITY_TOKEN_FILE": str(token),
        "AWS_ROLE_ARN": "arn:role",
        "AWS_ENDPOINT_URL_STS": silent,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    with pytest.raises(ObjectStoreError, match="STS unreachable: timed out"):
        CredentialChain(environ=env, clock=clock).get()

    env["AWS_ENDPOINT_URL_STS"] = endpoint.url
    chain = CredentialChain(environ=env, clock=clock)
    first = chain.get()
    assert first is not None and first.access_key_id == "WEB1"
    env["AWS_ENDPOINT_URL_STS"] = silent  # the chain reads its environment at each resolution
    clock.now += 3600 - REFRESH_BEFORE_S + 1  # due for a refresh, still valid
    assert chain.get() == first
    clock.now += REFRESH_BEFORE_S  # expired
    with pytest.raises(ObjectStoreError, match="STS unreachable: timed out"):
        chain.get()
    env["AWS_ENDPOINT_URL_STS"] = endpoint.url
    again = chain.get()
    assert again is not None and again.access_key_id == "WEB2"


def test_a_hung_credential_process_is_killed_at_its_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``credential_process`` that never exits: a clear error at the timeout (botocore would
    wait forever), the helper killed, not left behind."""
    monkeypatch.setattr(creds_mod, "_PROCESS_TIMEOUT_S", 2.0)  # the helper starts
    pid_file = tmp_path / "pid"
    command = _process_script(
        tmp_path,
        f"import os, time\npathlib.Path({str(pid_file)!r}).write_text(str(os.getpid()))\n"
        "time.sleep(600)\n",
    )
    config = tmp_path / "config"
    config.write_text(f"[default]\ncredential_process = {command}\n")
    env = {"AWS_CONFIG_FILE": str(config), "HOME": str(tmp_path)}
    with pytest.raises(ObjectStoreError, match="could not run it: TimeoutExpired"):
        CredentialChain(environ=env).get()
    pid = int(pid_file.read_text())
    assert not Path(f"/proc/{pid}").exists()  # killed and reaped


def _padded(doc: dict[str, Any], size: int) -> bytes:
    """``doc`` as JSON, valid, with a ``Padding`` field making it about ``size`` bytes: read
    whole, it would parse and give keys; only a cap refuses it."""
    return json.dumps({**doc, "Padding": "x" * size}).encode()


def test_imds_answering_a_10_mb_credentials_document_is_refused(
    endpoint: _Endpoint, tmp_path: Path
) -> None:
    """The role's credentials are 10 MB of valid JSON: refused at the cap, naming the source
    and the limit, not read whole and not parsed."""
    endpoint.answers[("PUT", "/latest/api/token")] = lambda h: (200, b"tok")
    roles = "/latest/meta-data/iam/security-credentials/"
    endpoint.answers[("GET", roles)] = lambda h: (200, b"loglake-role\n")
    document = json.loads(_temporary("BIG", T0 + 3600))
    endpoint.answers[("GET", roles + "loglake-role")] = lambda h: (
        200,
        _padded(document, 10 << 20),
    )
    env = {"AWS_EC2_METADATA_SERVICE_ENDPOINT": endpoint.url, "HOME": str(tmp_path)}
    with pytest.raises(ObjectStoreError, match=f"instance metadata: answer over {ERROR_BODY_MAX}"):
        CredentialChain(environ=env).get()


def test_sts_assume_role_answering_an_oversized_body_is_refused(
    endpoint: _Endpoint, tmp_path: Path
) -> None:
    """AssumeRole's answer is a valid AssumeRoleResponse padded to 1 MiB: refused at the cap,
    the message naming the role and the limit."""
    padding = "<!--" + "x" * (1 << 20) + "-->"
    endpoint.answers[("POST", "/")] = lambda h: (
        200,
        (
            "<AssumeRoleResponse><AssumeRoleResult><Credentials><AccessKeyId>ROLE</AccessKeyId>"
            "<SecretAccessKey>s</SecretAccessKey><SessionToken>t</SessionToken>"
            f"<Expiration>{_iso(T0 + 3600)}</Expiration></Credentials>{padding}"
            "</AssumeRoleResult></AssumeRoleResponse>"
        ).encode(),
    )
    config = tmp_path / "config"
    config.write_text(
        "[profile base]\naws_access_key_id = K\naws_secret_access_key = k\n"
        "[profile writer]\nrole_arn = arn:aws:iam::1:role/w\nsource_profile = base\n"
    )
    env = {
        "AWS_CONFIG_FILE": str(config),
        "HOME": str(tmp_path),
        "AWS_PROFILE": "writer",
        "AWS_ENDPOINT_URL_STS": endpoint.url,
    }
    with pytest.raises(
        ObjectStoreError,
        match=re.escape("role arn:aws:iam::1:role/w of AWS profile 'writer'")
        + f".*: answer over {ERROR_BODY_MAX} bytes, refused",
    ):
        CredentialChain(environ=env).get()
    assert [(m, p) for m, p, _, _ in endpoint.seen] == [("POST", "/")]


@pytest.mark.parametrize("trickled", ["headers", "body"])
def test_a_container_endpoint_trickling_its_answer_ends_at_the_timeout(
    hostile: HostileServer, trickled: str
) -> None:
    """Ten bytes a second, from the status line (or from the body) on: each arrives well
    within the 1 s per-operation timeout, so only a deadline on the whole exchange ends it,
    with a clear error; the client hung up before the answer was all sent."""
    document = _temporary("SLOW", T0 + 3600)
    hostile.answer = http_answer("200 OK", {"Content-Length": str(len(document))}, document)
    hostile.trickle_s = 0.1
    hostile.trickle_from = 0 if trickled == "headers" else len(hostile.answer) - len(document)
    url = f"{hostile.endpoint}/v2/creds"
    env = {"AWS_CONTAINER_CREDENTIALS_FULL_URI": url, "HOME": "/nonexistent"}
    with pytest.raises(
        ObjectStoreError, match="container credentials: unreachable: timed out"
    ) as e:
        CredentialChain(environ=env).get()
    assert "no whole answer within 1 s" in str(e.value)
    assert e.value.path == url
    assert hostile.sent < len(hostile.answer)


def test_a_credential_process_printing_100_mb_is_killed_at_the_cap(tmp_path: Path) -> None:
    """The helper prints valid credentials JSON padded to 100 MB: refused at the cap, the
    helper killed mid-print (it never reaches its last line) and reaped."""
    pid_file, done = tmp_path / "pid", tmp_path / "done"
    doc = {"Version": 1, "AccessKeyId": "K", "SecretAccessKey": "S3CRET"}
    command = _process_script(
        tmp_path,
        f"import os\npathlib.Path({str(pid_file)!r}).write_text(str(os.getpid()))\n"
        f'head = json.dumps({doc!r})[:-1] + \', "Padding": "\'\n'
        "sys.stdout.write(head)\n"
        "for _ in range(100):\n"
        "    sys.stdout.write('x' * (1 << 20))\n"
        "sys.stdout.write('\"}')\n"
        "sys.stdout.flush()\n"
        f"pathlib.Path({str(done)!r}).write_text('printed it all')\n",
    )
    config = tmp_path / "config"
    config.write_text(f"[default]\ncredential_process = {command}\n")
    env = {"AWS_CONFIG_FILE": str(config), "HOME": str(tmp_path)}
    with pytest.raises(ObjectStoreError, match=f"output over {ERROR_BODY_MAX} bytes") as e:
        CredentialChain(environ=env).get()
    assert "credential_process of AWS profile 'default'" in str(e.value)
    assert "S3CRET" not in str(e.value)
    assert not done.exists()  # killed mid-print
    assert not Path(f"/proc/{int(pid_file.read_text())}").exists()  # and reaped


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "BadStatusLine"),
        (
            http_answer("200 OK", {"Content-Length": "4000"}, b'{"AccessKeyId": "K"'),
            "IncompleteRead",
        ),
    ],
)
def test_a_container_endpoint_answering_garbage_or_cut_short_is_a_clear_error(
    hostile: HostileServer, answer: bytes, why: str
) -> None:
    """Not HTTP, or a body cut short of its declared length: an error naming the source, not
    ``http.client``'s own exception escaping the chain."""
    hostile.answer = answer
    url = f"{hostile.endpoint}/v2/creds"
    env = {"AWS_CONTAINER_CREDENTIALS_FULL_URI": url, "HOME": "/nonexistent"}
    with pytest.raises(ObjectStoreError, match=f"container credentials: bad HTTP answer \\({why}"):
        CredentialChain(environ=env).get()
