"""Writes on S3 (moto): an object smaller than one part (10 MiB) is one PUT, its ETag the
body's MD5, not a multipart upload of one part (create, part, complete: three requests, an
ETag ending in ``-1``); a larger file still goes up in parts. Counted with a recording proxy
before the S3 server: a small Delta append sends one PUT per data file and one conditional
PUT (``If-None-Match: *``) for its commit, which keeps its put-if-absent answer. Read back
with boto3 and deltalake."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from logstore.objectstore import LakeLocation, ObjectStore, StorageSettings, delta_target
from pipelines.delta.direct import append_table
from tests.fixtures.s3 import S3Bucket, S3Proxy

pytestmark = pytest.mark.integration

MULTIPART = {"CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload"}


@pytest.fixture
def proxy(s3: S3Bucket) -> Iterator[S3Proxy]:
    p = S3Proxy(s3.server.endpoint)
    yield p
    p.close()


def test_small_objects_are_one_put_and_large_ones_multipart(s3: S3Bucket, tmp_path: Path) -> None:
    store = ObjectStore(LakeLocation.parse(s3.uri("p")), settings=StorageSettings.default())
    small = os.urandom(1000)
    big = tmp_path / "big"
    big.write_bytes(os.urandom(12 << 20))
    store.write("b", small)
    store.write("empty", b"")
    store.write_file("c", big)

    def etag(key: str) -> str:
        return str(s3.client.head_object(Bucket=s3.name, Key=f"p/{key}")["ETag"]).strip('"')

    assert etag("b") == hashlib.md5(small).hexdigest()  # one PUT: the MD5
    assert etag("empty") == hashlib.md5(b"").hexdigest()  # an empty object is written too
    assert etag("c").endswith("-2")  # 12 MiB: two parts of a multipart upload
    assert s3.get("p/b") == small
    assert s3.get("p/empty") == b""
    assert s3.get("p/c") == big.read_bytes()
    assert store.read_range("c", offset=5 << 20, length=100) == big.read_bytes()[5 << 20 :][:100]


def test_a_small_delta_append_is_one_put_per_file_and_a_conditional_commit(
    s3: S3Bucket, proxy: S3Proxy
) -> None:
    settings = StorageSettings.from_environment({"endpoint_url": proxy.endpoint})
    schema = pa.schema([("p", pa.string()), ("x", pa.int64())])
    rows = pa.table({"p": ["a", "b", "a"], "x": [1, 2, 3]}, schema=schema)
    result = append_table(s3.uri("t"), rows, schema=schema, partition_by=["p"], settings=settings)
    assert result.committed

    puts = [r for r in proxy.requests if r.kind == "PutObject"]
    assert not MULTIPART & set(proxy.kinds()), proxy.kinds()
    data = sorted(r.path for r in puts if r.path.endswith(".parquet"))
    assert [p.rsplit("/", 2)[-2] for p in data] == ["p=a", "p=b"]  # one PUT per file
    (commit,) = [r for r in puts if "/_delta_log/" in r.path]
    assert commit.path.endswith("/t/_delta_log/00000000000000000000.json")
    assert commit.if_none_match == "*"  # put-if-absent
    assert len(puts) == 3
    uri, options = delta_target(s3.uri("t"))
    got = DeltaTable(uri, storage_options=options).to_pyarrow_table()
    assert sorted(got.column("x").to_pylist()) == [1, 2, 3]

    # the commit keeps its put-if-absent answer: a second writer of version 0 is refused
    store = ObjectStore(LakeLocation.parse(s3.uri("t")), settings=settings)
    before = s3.get("t/_delta_log/00000000000000000000.json")
    assert store.put_if_absent("_delta_log/00000000000000000000.json", b"{}\n") is False
    assert s3.get("t/_delta_log/00000000000000000000.json") == before
    assert store.put_if_absent("_delta_log/00000000000000000001.json", b"{}\n") is True


def test_the_tiers_unsigned_puts_are_one_put_each(
    s3: S3Bucket, proxy: S3Proxy, tmp_path: Path
) -> None:
    """``unsigned_put_small`` (the broker's tier store): an object under one part, from bytes
    or from a file, is one PUT of loglake's own (its headers: ``tests/unit/objectstore/
    test_credentials.py``), stored whole; a larger file is still pyarrow's multipart upload."""
    settings = StorageSettings.from_environment({"endpoint_url": proxy.endpoint})
    store = ObjectStore(LakeLocation.parse(s3.uri("q")), settings=settings, unsigned_put_small=True)
    segment, big = tmp_path / "segment", tmp_path / "big"
    segment.write_bytes(os.urandom(4 << 20))
    big.write_bytes(os.urandom(12 << 20))
    manifest = os.urandom(1000)
    store.write("m", manifest)
    assert store.write_file("s", segment) == 4 << 20
    puts = [r.path for r in proxy.requests if r.kind == "PutObject"]
    assert sorted(puts) == [f"/{s3.name}/q/m", f"/{s3.name}/q/s"], proxy.kinds()
    assert not MULTIPART & set(proxy.kinds())
    store.write_file("b", big)
    assert set(proxy.kinds()) >= MULTIPART
    assert s3.get("q/m") == manifest
    assert s3.get("q/s") == segment.read_bytes()
    assert s3.get("q/b") == big.read_bytes()
