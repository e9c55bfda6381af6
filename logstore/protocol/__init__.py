"""logstore.protocol: Kafka's RecordBatch v2 format, sans-IO (bytes in, values out).

No sockets, files or threads: every function takes ``bytes``/``memoryview`` and returns values
(or writes into a buffer the caller owns). ``batch`` reads, validates and stamps headers without
copying; ``records`` is the reference record decoder/builder; ``codecs`` the compression codecs;
``varint`` zigzag varints; ``control`` transaction markers.
"""

from __future__ import annotations

from logstore.protocol.batch import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    BatchHeader,
    Codec,
    TimestampType,
    compute_crc,
    iter_batches,
    read_header,
    set_log_append_time,
    stamp_batch,
    validate_batch,
)
from logstore.protocol.codecs import MAX_DECOMPRESSED_SIZE, compress, decompress
from logstore.protocol.control import (
    ControlRecord,
    ControlType,
    build_control_batch,
    decode_control_record,
)
from logstore.protocol.records import Record, build_batch, decode_batch, decode_records
from logstore.protocol.varint import (
    decode_varint,
    decode_varlong,
    encode_varint,
    encode_varlong,
)

__all__ = [
    "HEADER_SIZE",
    "LOG_OVERHEAD",
    "MAGIC",
    "MAX_DECOMPRESSED_SIZE",
    "BatchHeader",
    "Codec",
    "ControlRecord",
    "ControlType",
    "Record",
    "TimestampType",
    "build_batch",
    "build_control_batch",
    "compress",
    "compute_crc",
    "decode_batch",
    "decode_control_record",
    "decode_records",
    "decode_varint",
    "decode_varlong",
    "decompress",
    "encode_varint",
    "encode_varlong",
    "iter_batches",
    "read_header",
    "set_log_append_time",
    "stamp_batch",
    "validate_batch",
]
