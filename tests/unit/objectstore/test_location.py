"""LakeLocation and StorageSettings: parsing, joining, and what delta-rs/pyarrow are given."""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs
import pytest

from logstore.errors import InvalidConfigError
from logstore.objectstore import LakeLocation, StorageSettings


def test_s3_location_parses_and_joins() -> None:
    loc = LakeLocation.parse("s3://bucket/some/prefix/")
    assert (loc.scheme, loc.bucket, loc.key, loc.is_local) == ("s3", "bucket", "some/prefix", False)
    child = loc.join("records", "_delta_log/00.json")
    assert child.uri == "s3://bucket/some/prefix/records/_delta_log/00.json"
    assert child.fs_path == "bucket/some/prefix/records/_delta_log/00.json"
    assert child.relative_to(loc) == "records/_delta_log/00.json"
    assert LakeLocation.parse("s3a://bucket").join("t").uri == "s3://bucket/t"


def test_local_forms(tmp_path: Path) -> None:
    for text in (str(tmp_path), f"file://{tmp_path}", tmp_path):
        loc = LakeLocation.parse(text)
        assert loc.is_local and loc.uri == str(tmp_path) and loc.local_path == tmp_path
    assert LakeLocation.parse(tmp_path).join("a/b").local_path == tmp_path / "a" / "b"


def test_azure_and_gcs_locations() -> None:
    az = LakeLocation.parse("abfss://lake@acct.dfs.core.windows.net/p")
    assert (az.bucket, az.fs_path, az.uri) == (
        "lake",
        "lake/p",
        "abfss://lake@acct.dfs.core.windows.net/p",
    )
    assert LakeLocation.parse("gs://b/x").join("y").uri == "gs://b/x/y"


@pytest.mark.parametrize(
    "text",
    [
        "s3://b/a/../x",
        "s3://b/./x",
        "s3://b/a//x",
        "/data/../etc",
        "s3://",
        "ftp://host/x",
        "abfss://nocontainer/x",
        "s3://b/x?versionId=1",
        "",
    ],
)
def test_bad_locations_refused(text: str) -> None:
    with pytest.raises(InvalidConfigError):
        LakeLocation.parse(text)


@pytest.mark.parametrize("child", ["../x", "/abs", "a/../../b", "a/./b", "a\\b"])
def test_join_refuses_escapes(child: str) -> None:
    with pytest.raises(InvalidConfigError):
        LakeLocation.parse("s3://b/lake").join(child)


def test_settings_from_environment_and_overrides() -> None:
    env = {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_ACCESS_KEY_ID": "id",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_SESSION_TOKEN": "tok",
        "AWS_REGION": "eu-west-3",
    }
    s = StorageSettings.from_environment({"max_attempts": 2}, environ=env)
    loc = LakeLocation.parse("s3://b/lake")
    assert s.delta_options(loc) == {
        "AWS_REGION": "eu-west-3",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "id",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_SESSION_TOKEN": "tok",
        "conditional_put": "etag",
        "timeout": "30s",
        "connect_timeout": "5s",
    }
    fs = s.filesystem(loc)
    assert isinstance(fs, pafs.S3FileSystem) and fs.region == "eu-west-3"
    assert s.delta_options(LakeLocation.parse("/tmp/x")) == {}
    assert StorageSettings.from_overrides(s.to_overrides()) == s
    over = StorageSettings.from_environment({"region": "us-west-2"}, environ=env)
    assert over.delta_options(loc)["AWS_REGION"] == "us-west-2"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"endpoint": "http://x"}, "did you mean 'endpoint_url'"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": 2.5}, "must be an integer"),
        ({"connect_timeout_s": "soon"}, "connect_timeout_s"),
        ({"allow_http": "maybe"}, "true or false"),
        ({"endpoint_url": "127.0.0.1:9000"}, "http://host"),
        ({"options": ["x"]}, "table of string keys"),
    ],
)
def test_settings_refuse_bad_values(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidConfigError, match=message):
        StorageSettings.from_environment(overrides, environ={})
