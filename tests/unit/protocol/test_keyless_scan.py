"""first_keyless_record: the key-length walk compacted topics use at produce time."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore.errors import CorruptRecordError
from logstore.protocol.batch import Codec, compute_crc
from logstore.protocol.records import build_batch, first_keyless_record

keys = st.one_of(st.none(), st.binary(max_size=200))
values = st.one_of(st.none(), st.binary(max_size=300))
headers = st.lists(st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=5))))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(keys, values, headers, st.integers(-(2**40), 2**40)), min_size=1, max_size=30
    ),
    st.sampled_from(list(Codec)),
)
def test_finds_the_first_null_key(records: list, codec: Codec) -> None:
    batch = build_batch(records, codec=codec, base_offset=100)
    want = next((i for i, r in enumerate(records) if r[0] is None), None)
    assert first_keyless_record(batch) == want
    # at a position inside a larger buffer too
    assert first_keyless_record(bytes(7) + batch, 7) == want


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=1, max_size=40), st.integers(0, 200))
def test_damage_raises_only_corrupt_record_error(junk: bytes, where: int) -> None:
    batch = build_batch([(b"k", b"v" * 50), (b"k2", None)], codec=Codec.NONE)
    where = 61 + where % (len(batch) - 61)
    broken = bytearray(batch)
    broken[where : where + len(junk)] = junk
    del broken[len(batch) :]
    # a valid CRC over the damage, so that the walk itself meets it
    struct.pack_into(">I", broken, 17, compute_crc(broken, 0, len(broken)))
    with contextlib.suppress(CorruptRecordError):
        index = first_keyless_record(broken)
        assert index is None or index >= 0


def test_crc_is_checked_first() -> None:
    batch = build_batch([(None, b"v")])
    batch[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="CRC"):
        first_keyless_record(batch)
