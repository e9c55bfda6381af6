"""Deletion vector file paths: the Z85 decoding the job's clean-up and maintenance's orphan
vacuum both use is the inverse of the encoding the job writes, and bad descriptors are told
apart from good ones."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipelines.delta.deletion_vectors import DV_PREFIX, dv_relative_path, z85_decode
from pipelines.delta.deletion_vectors import z85_encode as _z85


@given(st.binary(min_size=0, max_size=64).map(lambda b: b[: len(b) - len(b) % 4]))
def test_z85_decode_inverts_the_encoding(data: bytes) -> None:
    assert z85_decode(_z85(data)) == data


def test_dv_relative_path_of_a_file_vector() -> None:
    file_id = uuid.uuid4()
    descriptor = {"storageType": "u", "pathOrInlineDv": DV_PREFIX + _z85(file_id.bytes)}
    assert dv_relative_path(descriptor) == f"{DV_PREFIX}/deletion_vector_{file_id}.bin"


def test_inline_or_absent_vectors_have_no_file() -> None:
    assert dv_relative_path(None) is None
    assert (
        dv_relative_path(
            {
                "storageType": "i",
                "pathOrInlineDv": "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L",
            }
        )
        is None
    )


@pytest.mark.parametrize("bad", ["dv" + "~" * 20, "dv123", ""])
def test_a_bad_file_descriptor_raises(bad: str) -> None:
    with pytest.raises(ValueError):
        dv_relative_path({"storageType": "u", "pathOrInlineDv": bad})
