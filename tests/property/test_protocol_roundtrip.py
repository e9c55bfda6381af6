"""Hypothesis: batches built here decode to the same records, for every codec, both ways
against kafka-python's independent encoder/decoder."""

from __future__ import annotations

import struct
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from logstore.protocol.batch import (
    Codec,
    TimestampType,
    iter_batches,
    read_header,
    set_log_append_time,
    stamp_batch,
    validate_batch,
)
from logstore.protocol.codecs import compress, decompress
from logstore.protocol.records import Record, build_batch, decode_batch
from logstore.protocol.varint import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    decode_varint,
    decode_varlong,
    encode_varint,
    encode_varlong,
)

SETTINGS = settings(max_examples=150, deadline=None)

payload = st.none() | st.binary(max_size=64) | st.sampled_from([b"", b"\x00", b"\xff" * 300])
header = st.tuples(st.text(max_size=12), st.none() | st.binary(max_size=16))
timestamps = st.integers(min_value=-(2**40), max_value=2**42)
row = st.tuples(payload, payload, st.lists(header, max_size=3), timestamps)
rows = st.lists(row, min_size=1, max_size=15)
codecs = st.sampled_from(list(Codec))


@SETTINGS
@given(
    rows=rows,
    codec=codecs,
    opts=st.fixed_dictionaries(
        {
            "base_offset": st.integers(min_value=0, max_value=2**62),
            "producer_id": st.integers(min_value=-1, max_value=2**62),
            "producer_epoch": st.integers(min_value=-1, max_value=2**15 - 1),
            "base_sequence": st.integers(min_value=-1, max_value=2**31 - 1),
            "is_transactional": st.booleans(),
            "leader_epoch": st.integers(min_value=-1, max_value=2**31 - 1),
        }
    ),
)
def test_build_decode_round_trip(
    rows: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]],
    codec: Codec,
    opts: dict[str, Any],
) -> None:
    base_offset = opts["base_offset"]
    producer_id, producer_epoch = opts["producer_id"], opts["producer_epoch"]
    base_sequence, is_transactional = opts["base_sequence"], opts["is_transactional"]
    leader_epoch = opts["leader_epoch"]
    buf = build_batch(
        rows,
        base_offset=base_offset,
        codec=codec,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        is_transactional=is_transactional,
        partition_leader_epoch=leader_epoch,
    )
    header, records = decode_batch(buf)
    assert header.codec is codec
    assert (header.base_offset, header.last_offset) == (base_offset, base_offset + len(rows) - 1)
    assert header.base_timestamp == rows[0][3]
    assert header.max_timestamp == max(ts for *_, ts in rows)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (
        producer_id,
        producer_epoch,
        base_sequence,
    )
    assert header.is_transactional is is_transactional
    assert header.partition_leader_epoch == leader_epoch
    assert records == [
        Record(base_offset + i, ts, key, value, tuple(headers))
        for i, (key, value, headers, ts) in enumerate(rows)
    ]
    assert validate_batch(buf, exact_count=True) == header
    assert list(iter_batches(bytes(buf) * 2)) == [(0, header), (len(buf), header)]

    # kafka-python, an independent decoder, reads the same records
    ref = DefaultRecordBatch(bytes(buf))
    assert ref.validate_crc()
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in ref] == [
        (base_offset + i, ts, key, value, headers)
        for i, (key, value, headers, ts) in enumerate(rows)
    ]


@SETTINGS
@given(rows=rows, codec=codecs, base_offset=st.integers(min_value=0, max_value=2**40))
def test_kafka_python_batches_decode_identically(
    rows: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]],
    codec: Codec,
    base_offset: int,
) -> None:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=int(codec),
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for i, (key, value, headers, ts) in enumerate(rows):
        builder.append(i, timestamp=ts, key=key, value=value, headers=headers)
    buf = builder.build()
    struct.pack_into(">q", buf, 0, base_offset)
    ref = DefaultRecordBatch(bytes(buf))
    header, records = decode_batch(buf)
    assert header.codec_id == ref.compression_type  # kafka-python skips codecs that do not pay
    assert header.crc == ref.crc and header.max_timestamp == ref.max_timestamp
    assert [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in records] == [
        (r.offset, r.timestamp, r.key, r.value, r.headers) for r in ref
    ]


@SETTINGS
@given(
    rows=rows,
    codec=codecs,
    new_base=st.integers(min_value=0, max_value=2**62),
    epoch=st.integers(min_value=0, max_value=2**31 - 1),
    append_time=st.integers(min_value=0, max_value=2**45),
)
def test_stamp_and_log_append_time_keep_the_batch_valid(
    rows: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]],
    codec: Codec,
    new_base: int,
    epoch: int,
    append_time: int,
) -> None:
    buf = build_batch(rows, codec=codec)
    crc = read_header(buf).crc
    stamp_batch(buf, 0, base_offset=new_base, partition_leader_epoch=epoch)
    assert validate_batch(buf).crc == crc  # outside the CRC
    set_log_append_time(buf, 0, append_time)
    header, records = decode_batch(buf)
    assert header.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert (header.base_offset, header.partition_leader_epoch) == (new_base, epoch)
    assert [r.timestamp for r in records] == [append_time] * len(rows)
    assert [r.offset for r in records] == [new_base + i for i in range(len(rows))]


@SETTINGS
@given(data=st.binary(max_size=5000), codec=codecs)
def test_codec_round_trip(data: bytes, codec: Codec) -> None:
    assert decompress(codec, compress(codec, data)) == data


@SETTINGS
@given(value=st.integers(min_value=INT32_MIN, max_value=INT32_MAX), prefix=st.binary(max_size=3))
def test_varint_round_trip(value: int, prefix: bytes) -> None:
    encoded = encode_varint(value)
    assert decode_varint(prefix + encoded + b"\x01", len(prefix)) == (
        value,
        len(prefix) + len(encoded),
    )


@SETTINGS
@given(value=st.integers(min_value=INT64_MIN, max_value=INT64_MAX))
def test_varlong_round_trip(value: int) -> None:
    encoded = encode_varlong(value)
    assert decode_varlong(encoded) == (value, len(encoded))
