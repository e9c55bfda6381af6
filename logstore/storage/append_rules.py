"""Topic rules applied to a producer's batches before they are appended (Kafka's LogValidator).

Two topic configs change what a produce request may append:

* ``message.timestamp.before.max.ms`` / ``message.timestamp.after.max.ms`` (KIP-937): with
  ``message.timestamp.type=CreateTime`` a batch whose timestamps fall outside
  ``[now - before, now + after]`` is refused whole with :class:`InvalidTimestampError`
  (INVALID_TIMESTAMP), nothing appended. Kafka checks every record; loglake checks each batch's
  ``baseTimestamp`` (the first record's, as every client writes it) and ``maxTimestamp`` from
  the header already parsed, so that no record is decoded on the produce path. A record
  timestamped *below* its batch's base timestamp (a negative delta, which a producer writes
  only when it sets explicit, decreasing timestamps within one batch) is therefore not
  refused by the ``before`` bound. -1 (no timestamp) is exempt, as in Kafka.
* ``compression.type``: ``producer`` keeps the producer's bytes (no work at all on that
  path); ``uncompressed`` or a codec makes the broker rewrite every batch whose codec differs
  (Kafka's ``BrokerCompressionType.targetCompression``), at the topic's
  ``compression.<codec>.level``. Only the records section is re-encoded: a v2 records section
  is the same bytes whatever the codec, so no record is decoded, and the header (producer id,
  epoch, sequence, timestamps, transactional flag) is kept; the CRC is recomputed.

Pure functions over the request's buffer; thread-safe.
"""

from __future__ import annotations

from typing import Final

from logstore.errors import InvalidTimestampError
from logstore.protocol.batch import (
    ATTRIBUTES_OFFSET,
    CODEC_MASK,
    CRC_OFFSET,
    HEADER_SIZE,
    LENGTH_OFFSET,
    LOG_OVERHEAD,
    NO_TIMESTAMP,
    BatchHeader,
    Codec,
    compute_crc,
)
from logstore.protocol.codecs import compress, decompress
from logstore.storage.config import LogConfig

__all__ = ["check_timestamps", "recompress", "target_codec"]

_TARGETS: Final[dict[str, Codec]] = {
    "uncompressed": Codec.NONE,
    "gzip": Codec.GZIP,
    "snappy": Codec.SNAPPY,
    "lz4": Codec.LZ4,
    "zstd": Codec.ZSTD,
}


def target_codec(config: LogConfig) -> Codec | None:
    """The codec every batch is stored with, or None for ``compression.type=producer``."""
    return _TARGETS.get(config.compression_type)


def check_timestamps(
    batches: list[tuple[int, BatchHeader]],
    *,
    config: LogConfig,
    now_ms: int,
    topic: str,
    partition: int,
) -> None:
    """Raise :class:`InvalidTimestampError` for the first batch outside the topic's window
    (see the module docstring). LogAppendTime topics are not checked: the broker stamps."""
    if config.message_timestamp_type != "CreateTime":
        return
    lo = now_ms - config.message_timestamp_before_max_ms
    hi = now_ms + config.message_timestamp_after_max_ms
    for _pos, h in batches:
        first, last = h.base_timestamp, h.max_timestamp
        if (first != NO_TIMESTAMP and not lo <= first <= hi) or (
            last != NO_TIMESTAMP and not lo <= last <= hi
        ):
            ts = first if first != NO_TIMESTAMP and not lo <= first <= hi else last
            raise InvalidTimestampError(
                f"{topic}-{partition}: timestamp {ts} of a batch of {h.records_count}"
                f" record(s) is out of range; it must be within [{lo}, {hi}]"
                " (message.timestamp.before.max.ms, message.timestamp.after.max.ms)"
            )


def _level(config: LogConfig, codec: Codec) -> int | None:
    if codec is Codec.GZIP:
        return None if config.compression_gzip_level == -1 else config.compression_gzip_level
    if codec is Codec.LZ4:
        return config.compression_lz4_level
    if codec is Codec.ZSTD:
        return config.compression_zstd_level
    return None


def recompress(
    records: bytearray, batches: list[tuple[int, BatchHeader]], *, config: LogConfig
) -> bytearray | None:
    """``records`` with every batch in the topic's codec, or None when nothing changes
    (``producer``, or every batch already in the target codec)."""
    codec = target_codec(config)
    if codec is None or all(h.attributes & CODEC_MASK == codec for _, h in batches):
        return None
    level = _level(config, codec)
    out = bytearray()
    for pos, h in batches:
        size = h.batch_length + LOG_OVERHEAD
        source = h.attributes & CODEC_MASK
        if source == codec:
            out += records[pos : pos + size]
            continue
        with memoryview(records) as view, view[pos + HEADER_SIZE : pos + size] as section:
            raw = decompress(source, section) if source else bytes(section)
        payload = compress(codec, raw, level=level) if codec is not Codec.NONE else raw
        start = len(out)
        out += records[pos : pos + HEADER_SIZE]
        out += payload
        new_size = HEADER_SIZE + len(payload)
        out[start + LENGTH_OFFSET : start + LENGTH_OFFSET + 4] = (new_size - LOG_OVERHEAD).to_bytes(
            4, "big", signed=True
        )
        attrs = (h.attributes & ~CODEC_MASK) | int(codec)
        out[start + ATTRIBUTES_OFFSET : start + ATTRIBUTES_OFFSET + 2] = attrs.to_bytes(
            2, "big", signed=True
        )
        crc = compute_crc(out, start, new_size)
        out[start + CRC_OFFSET : start + CRC_OFFSET + 4] = crc.to_bytes(4, "big")
    return out
