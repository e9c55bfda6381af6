"""Vectorised decoding of Kafka RecordBatch v2 segment bytes into Arrow columns.

- :mod:`pipelines.decode.batches`: headers of a whole range as numpy columns + CRC checks;
- :mod:`pipelines.decode.records`: records to Arrow without a Python object per record;
- :mod:`pipelines.decode.reference`: the slow, plain reference decoder (tests, benchmarks);
- :mod:`pipelines.decode.codecs`: per-batch decompression (gzip, snappy both framings, lz4,
  zstd).
"""

from __future__ import annotations

from pipelines.decode.batches import BatchScan, scan_batches, verify_batches
from pipelines.decode.records import (
    DECODED_SCHEMA,
    HEADERS_TYPE,
    BatchError,
    DecodedRecords,
    decode_records,
)

__all__ = [
    "DECODED_SCHEMA",
    "HEADERS_TYPE",
    "BatchError",
    "BatchScan",
    "DecodedRecords",
    "decode_records",
    "scan_batches",
    "verify_batches",
]
