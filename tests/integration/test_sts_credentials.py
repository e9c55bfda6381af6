"""The chain's STS sources against a real STS (moto's server, the same process as the test's S3:
one moto server serves every service): EKS web identity and assume-role profiles (a source
profile's keys, a chained role). The credentials STS returns are the ones that sign loglake's
own conditional PUT: an :class:`~tests.fixtures.s3.S3Proxy` before the server records each
request's ``Authorization`` (the access key id in it, the scope's service), and the object is
read back with boto3. moto does not check signatures, so the signature itself is compared with
botocore's in the unit tests; here the point is which keys sign, and that STS answers.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from logstore.errors import ObjectStoreError
from logstore.objectstore import StorageSettings
from logstore.objectstore import credentials as creds_mod
from logstore.objectstore._s3put import put_if_absent_s3
from logstore.objectstore.credentials import REFRESH_BEFORE_S, CredentialChain, Credentials
from tests.fixtures.s3 import S3Bucket, S3Proxy

ROLE = "arn:aws:iam::123456789012:role/loglake-writer"
_KEY_ID = re.compile(r"Credential=([^/]+)/\d{8}/[^/]+/([^/]+)/aws4_request")


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def proxy(s3: S3Bucket) -> Iterator[S3Proxy]:
    recorder = S3Proxy(s3.server.endpoint)
    yield recorder
    recorder.close()


@pytest.fixture
def no_keys(s3: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The environment of a pod or a laptop without keys: none in the environment, an empty
    home, no instance metadata; returns the home."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    (home / ".aws").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    return home


def _signers(proxy: S3Proxy) -> list[tuple[str, str]]:
    """(access key id, service) of each request the proxy saw."""
    out = []
    for request in proxy.requests:
        match = _KEY_ID.search(request.authorization or "")
        assert match is not None, request
        out.append((match[1], match[2]))
    return out


def _put_signed_by(
    chain: CredentialChain, s3: S3Bucket, monkeypatch: pytest.MonkeyPatch, key: str
) -> str:
    """loglake's conditional PUT through a recording proxy, with ``chain`` as the process's
    chain: the access key id that signed it (the object is checked with boto3)."""
    monkeypatch.setattr(creds_mod, "_DEFAULT", chain)
    recorder = S3Proxy(s3.server.endpoint)
    try:
        settings = StorageSettings.from_environment({"endpoint_url": recorder.endpoint}, environ={})
        assert settings.access_key_id is None
        status, body = put_if_absent_s3(settings, s3.name, key, b"lease")
        assert status == 200, body
        assert s3.get(key) == b"lease"
        [(signer, service)] = _signers(recorder)
        assert service == "s3"
        return signer
    finally:
        recorder.close()


def test_web_identity_credentials_sign_the_put_and_refresh_from_the_token_file(
    s3: S3Bucket, proxy: S3Proxy, no_keys: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = tmp_path / "token"
    token.write_text("eyJhbGciOiJSUzI1NiJ9.pod-token.sig\n")
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
    monkeypatch.setenv("AWS_ROLE_ARN", ROLE)
    monkeypatch.setenv("AWS_ROLE_SESSION_NAME", "ingest-pod")
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", proxy.endpoint)
    clock = _Clock(time.time())
    chain = CredentialChain(clock=clock)
    first = chain.get()
    assert first is not None and first.source == f"web identity for {ROLE}"
    assert first.session_token and first.expires_at is not None
    assert first.expires_at == pytest.approx(clock.now + 3600, abs=120)
    # AssumeRoleWithWebIdentity is not signed: the token is the proof
    assert [(r.method, r.authorization) for r in proxy.requests] == [("POST", None)]
    assert _put_signed_by(chain, s3, monkeypatch, "web/a") == first.access_key_id
    # near expiry: STS again, new keys
    clock.now = first.expires_at - REFRESH_BEFORE_S + 1
    second = chain.get()
    assert second is not None and second.access_key_id != first.access_key_id
    assert len(proxy.requests) == 2
    # the token file is read at every refresh: gone, the valid keys are kept, then a clear error
    token.unlink()
    clock.now = second.expires_at - 60  # type: ignore[operator]
    assert chain.get() is second
    clock.now = second.expires_at + 1  # type: ignore[operator]
    with pytest.raises(ObjectStoreError, match="cannot read the web identity token"):
        chain.get()


def test_assume_role_profile_signs_sts_with_the_source_keys_and_the_put_with_the_role(
    s3: S3Bucket, proxy: S3Proxy, no_keys: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (no_keys / ".aws" / "credentials").write_text(
        "[base]\naws_access_key_id = AKIABASEKEY\naws_secret_access_key = base-secret\n"
    )
    (no_keys / ".aws" / "config").write_text(
        f"[profile writer]\nrole_arn = {ROLE}\nsource_profile = base\n"
        "external_id = lake-42\nduration_seconds = 900\nrole_session_name = loglake-writer\n"
        "[profile chained]\nrole_arn = arn:aws:iam::123456789012:role/lake-admin\n"
        "source_profile = writer\n"
        "[profile badsession]\nrole_arn = arn:aws:iam::123456789012:role/x\n"
        f"source_profile = base\nrole_session_name = {'s' * 70}\n"
        f"[profile self]\nrole_arn = {ROLE}\nsource_profile = self\n"
        "aws_access_key_id = AKIASELFKEY\naws_secret_access_key = self-secret\n"
    )
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", proxy.endpoint)
    monkeypatch.setenv("AWS_PROFILE", "writer")
    now = time.time()
    chain = CredentialChain()
    role = chain.get()
    assert role is not None and role.access_key_id != "AKIABASEKEY" and role.session_token
    assert role.source.startswith(f"role {ROLE} of AWS profile 'writer'")
    assert role.expires_at == pytest.approx(now + 900, abs=120)  # duration_seconds honoured
    assert _signers(proxy) == [("AKIABASEKEY", "sts")]
    assert _put_signed_by(chain, s3, monkeypatch, "role/a") == role.access_key_id

    # a chained role: the first role's temporary keys sign the second AssumeRole
    monkeypatch.setenv("AWS_PROFILE", "chained")
    chained = CredentialChain().get()
    assert chained is not None
    (_, first_hop), (second_signer, _) = _signers(proxy)[1:]
    assert first_hop == "sts" and second_signer.startswith("ASIA")
    assert chained.access_key_id not in (second_signer, "AKIABASEKEY")

    # a role profile that is its own source: its keys sign AssumeRole
    monkeypatch.setenv("AWS_PROFILE", "self")
    own = CredentialChain().get()
    assert own is not None and own.access_key_id.startswith("ASIA")
    assert _signers(proxy)[-1] == ("AKIASELFKEY", "sts")

    # STS refusing: a clear error naming the profile and STS's code
    monkeypatch.setenv("AWS_PROFILE", "badsession")
    with pytest.raises(ObjectStoreError, match=r"'badsession'.*STS answered HTTP 400") as info:
        CredentialChain().get()
    assert "base-secret" not in str(info.value)


def test_credentials_from_sts_are_what_the_chain_caches(
    s3: S3Bucket, no_keys: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With AWS_ENDPOINT_URL only (as the s3 fixture sets it), STS is found there too."""
    token = tmp_path / "token"
    token.write_text("pod-token")
    monkeypatch.delenv("AWS_ENDPOINT_URL_STS", raising=False)
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
    monkeypatch.setenv("AWS_ROLE_ARN", ROLE)
    chain = CredentialChain()
    got = chain.get()
    assert isinstance(got, Credentials) and chain.get() is got
    assert got.access_key_id.startswith("ASIA")
