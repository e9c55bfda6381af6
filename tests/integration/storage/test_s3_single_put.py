"""``ObjectStore(single_put_small=True)`` (the broker's tier store): on S3 (moto) an object
smaller than one part is one PUT (loglake's own, unsigned payload with a CRC32C), its ETag the
body's MD5, not a multipart upload of one part (three requests, an ETag ending in ``-1``),
from bytes and from a file alike; a larger file still goes up in parts. Read back with
boto3."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from logstore.objectstore import LakeLocation, ObjectStore, StorageSettings
from tests.fixtures.s3 import S3Bucket

pytestmark = pytest.mark.integration


def test_small_objects_are_one_put_and_large_ones_multipart(s3: S3Bucket, tmp_path: Path) -> None:
    root = LakeLocation.parse(s3.uri("p"))
    settings = StorageSettings.from_environment()
    plain = ObjectStore(root, settings=settings)
    single = ObjectStore(root, settings=settings, single_put_small=True)
    small = os.urandom(1000)
    big = tmp_path / "big"
    big.write_bytes(os.urandom(12 << 20))
    segment = tmp_path / "segment"
    segment.write_bytes(os.urandom(4 << 20))
    plain.write("a", small)
    single.write("b", small)
    single.write_file("c", big)
    assert single.write_file("d", segment) == 4 << 20

    def etag(key: str) -> str:
        return str(s3.client.head_object(Bucket=s3.name, Key=f"p/{key}")["ETag"]).strip('"')

    assert etag("a").endswith("-1")  # a multipart upload of one part
    assert etag("b") == hashlib.md5(small).hexdigest()  # one PUT: the MD5
    assert etag("c").endswith("-2")  # 12 MiB: two parts of a multipart upload
    assert etag("d") == hashlib.md5(segment.read_bytes()).hexdigest()  # 4 MiB: one PUT
    assert s3.get("p/d") == segment.read_bytes()
    assert s3.get("p/b") == small
    assert s3.get("p/c") == big.read_bytes()
    assert single.read_range("c", offset=5 << 20, length=100) == big.read_bytes()[5 << 20 :][:100]
