"""Hypothesis: random bytes and mutated valid batches into every decoder of logstore.protocol
raise nothing but LoglakeError subclasses (never IndexError, struct.error, zlib.error ...)."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from logstore.errors import LoglakeError
from logstore.protocol.batch import (
    Codec,
    compute_crc,
    iter_batches,
    read_header,
    validate_batch,
)
from logstore.protocol.codecs import compress, decompress
from logstore.protocol.control import decode_control_record
from logstore.protocol.records import build_batch, decode_batch
from logstore.protocol.varint import decode_unsigned_varint, decode_varint, decode_varlong

SETTINGS = settings(max_examples=200, deadline=None)


def only_loglake_errors(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Call ``fn``; a LoglakeError is fine, anything else fails the test."""
    with contextlib.suppress(LoglakeError):
        fn(*args, **kwargs)


def decode_all(data: bytes | bytearray) -> None:
    """Walk every batch like a reader would, decoding each."""
    for pos, _ in iter_batches(data, allow_torn_tail=True):
        decode_batch(data, pos)


@SETTINGS
@given(data=st.binary(max_size=400), pos=st.integers(min_value=0, max_value=80))
def test_random_bytes(data: bytes, pos: int) -> None:
    only_loglake_errors(read_header, data, pos)
    only_loglake_errors(validate_batch, data, pos)
    only_loglake_errors(decode_batch, data, pos)
    only_loglake_errors(list, iter_batches(data, pos))
    only_loglake_errors(decode_all, data)
    only_loglake_errors(decode_varint, data, pos)
    only_loglake_errors(decode_varlong, data, pos)
    only_loglake_errors(decode_unsigned_varint, data, pos)
    only_loglake_errors(decode_control_record, data[:4], data[4:])
    for codec_id in range(8):
        only_loglake_errors(decompress, codec_id, data, max_size=1 << 20)


@SETTINGS
@given(data=st.binary(min_size=1, max_size=300), codec=st.sampled_from(list(Codec)))
def test_random_records_section_behind_a_valid_header(data: bytes, codec: Codec) -> None:
    """A correct header and CRC around garbage: the record decoder itself must hold."""
    count = data[0] % 8
    buf = bytearray(build_batch([(b"k", b"v")] * max(count, 1), codec=codec)[:61]) + data[1:]
    struct.pack_into(">i", buf, 8, len(buf) - 12)
    struct.pack_into(">i", buf, 57, count)
    struct.pack_into(">I", buf, 17, compute_crc(buf, 0, len(buf)))
    only_loglake_errors(decode_batch, buf)


batches = st.builds(
    lambda rows, codec, base: bytes(build_batch(rows, codec=codec, base_offset=base)),
    st.lists(
        st.tuples(
            st.none() | st.binary(max_size=20),
            st.none() | st.binary(max_size=40),
            st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=5)), max_size=2),
            st.integers(min_value=-(2**35), max_value=2**35),
        ),
        min_size=1,
        max_size=6,
    ),
    st.sampled_from(list(Codec)),
    st.integers(min_value=0, max_value=2**40),
)


@SETTINGS
@given(
    batch=batches,
    flips=st.lists(
        st.tuples(st.integers(min_value=0, max_value=10_000), st.integers(1, 255)), max_size=4
    ),
    cut=st.integers(min_value=0, max_value=10_000),
    fix_crc=st.booleans(),
)
def test_mutated_valid_batches(
    batch: bytes, flips: list[tuple[int, int]], cut: int, fix_crc: bool
) -> None:
    buf = bytearray(batch + batch)
    for where, mask in flips:
        buf[where % len(buf)] ^= mask
    if fix_crc and len(buf) >= 61:
        # recompute the CRC over whatever batchLength now claims, so the mutation reaches
        # the record and codec decoders instead of stopping at the CRC check
        (length,) = struct.unpack_from(">i", buf, 8)
        if 49 <= length <= len(buf) - 12:
            struct.pack_into(">I", buf, 17, compute_crc(buf, 0, length + 12))
    torn = bytes(buf[: cut % (len(buf) + 1)])
    for data in (bytes(buf), torn):
        only_loglake_errors(validate_batch, data)
        only_loglake_errors(decode_batch, data)
        only_loglake_errors(decode_all, data)
        only_loglake_errors(list, iter_batches(data))


@SETTINGS
@given(
    data=st.binary(min_size=1, max_size=2000),
    codec=st.sampled_from([c for c in Codec if c is not Codec.NONE]),
    where=st.integers(min_value=0),
    mask=st.integers(1, 255),
    cut=st.integers(min_value=0),
)
def test_mutated_compressed_streams(
    data: bytes, codec: Codec, where: int, mask: int, cut: int
) -> None:
    packed = bytearray(compress(codec, data))
    packed[where % len(packed)] ^= mask
    only_loglake_errors(decompress, codec, packed, max_size=1 << 20)
    only_loglake_errors(decompress, codec, packed[: cut % len(packed)], max_size=1 << 20)
