"""logstore.protocol.codecs against kafka-python's codecs (an independent implementation)."""

from __future__ import annotations

import gzip
import os

import cramjam
import lz4.frame
import pytest
from kafka import codec as kp

from logstore.errors import CorruptRecordError, UnsupportedCodecError
from logstore.protocol.batch import Codec
from logstore.protocol.codecs import XERIAL_HEADER, compress, decompress
from pipelines.decode.codecs import LZ4_INDEPENDENT

DATA = os.urandom(3000) + b"loglake " * 20000  # > one 32 KiB xerial block, partly incompressible

KP_DECODE = {
    Codec.GZIP: kp.gzip_decode,
    Codec.SNAPPY: kp.snappy_decode,
    Codec.LZ4: kp.lz4_decode,
    Codec.ZSTD: kp.zstd_decode,
}
KP_ENCODE = {
    Codec.GZIP: kp.gzip_encode,
    Codec.SNAPPY: kp.snappy_encode,  # xerial framing
    Codec.LZ4: kp.lz4_encode,
    Codec.ZSTD: kp.zstd_encode,
}


@pytest.mark.parametrize("codec", list(Codec))
def test_round_trip(codec: Codec) -> None:
    packed = compress(codec, DATA)
    assert decompress(codec, packed) == DATA
    assert decompress(int(codec), memoryview(packed)) == DATA
    if codec is not Codec.NONE:
        assert len(packed) < len(DATA)


@pytest.mark.parametrize("codec", list(KP_DECODE))
def test_kafka_python_reads_ours(codec: Codec) -> None:
    assert KP_DECODE[codec](compress(codec, DATA)) == DATA


@pytest.mark.parametrize("codec", list(KP_ENCODE))
def test_we_read_kafka_pythons(codec: Codec) -> None:
    assert decompress(codec, KP_ENCODE[codec](DATA)) == DATA


def test_snappy_both_framings() -> None:
    xerial = compress(Codec.SNAPPY, DATA)
    assert xerial.startswith(XERIAL_HEADER)
    raw = bytes(cramjam.snappy.compress_raw(DATA))  # what librdkafka writes
    assert not raw.startswith(b"\x82SNAPPY")
    assert decompress(Codec.SNAPPY, raw) == DATA
    assert decompress(Codec.SNAPPY, xerial) == DATA


def test_lz4_frames_have_independent_blocks() -> None:
    """As Kafka's clients write them (FLG bit 5): more than one 64 KiB block here, each read
    by itself (before: linked blocks, liblz4's frame decoder on every read)."""
    packed = compress(Codec.LZ4, DATA)
    flg = packed[4]
    assert flg & LZ4_INDEPENDENT, hex(flg)
    assert len(DATA) > 2 * (64 << 10)
    assert lz4.frame.get_frame_info(packed)["block_linked"] is False
    assert decompress(Codec.LZ4, packed) == DATA


def test_gzip_concatenated_members() -> None:
    assert decompress(Codec.GZIP, gzip.compress(b"abc") + gzip.compress(b"def")) == b"abcdef"


@pytest.mark.parametrize("codec", list(Codec))
def test_decompressed_size_is_bounded(codec: Codec) -> None:
    bomb = compress(codec, bytes(10 << 20))  # 10 MiB of zeros: a few KiB compressed
    with pytest.raises(CorruptRecordError, match=r"more than|larger than"):
        decompress(codec, bomb, max_size=1 << 20)
    assert len(decompress(codec, bomb, max_size=10 << 20)) == 10 << 20


@pytest.mark.parametrize("codec", [c for c in Codec if c is not Codec.NONE])
@pytest.mark.parametrize("cut", ["empty", "truncated", "garbage"])
def test_bad_streams_are_corrupt(codec: Codec, cut: str) -> None:
    packed = compress(codec, DATA)
    data = {"empty": b"", "truncated": packed[: len(packed) // 2], "garbage": b"\x13" * 64}[cut]
    with pytest.raises(CorruptRecordError):
        decompress(codec, data)


@pytest.mark.parametrize("codec_id", [5, 6, 7, -1, 99])
def test_unknown_codec(codec_id: int) -> None:
    with pytest.raises(UnsupportedCodecError):
        decompress(codec_id, b"x")
    with pytest.raises(UnsupportedCodecError):
        compress(codec_id, b"x")
