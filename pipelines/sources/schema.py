"""The two row shapes of the ``logsegments`` source, as Spark and as Arrow schemas.

``records`` (one row per record; the bronze ``records`` table of DESIGN.md plus ``date``):

==================== ============================ =========================================
column               type                         meaning
==================== ============================ =========================================
topic                string                       from the partition directory name
partition            int                          from the partition directory name
offset               long                         baseOffset + offsetDelta
timestamp            timestamp (UTC, from ms)     LogAppendTime: the batch's maxTimestamp;
                                                  else baseTimestamp + timestampDelta
timestamp_type       int                          0 CreateTime, 1 LogAppendTime
key, value           binary (null = null/tomb.)   the record's bytes, unchanged
headers              array<struct<key: string,    in record order
                     value: binary>>
producer_id ..       long, short, int, boolean,   the batch header's fields
leader_epoch         int
segment_base_offset  long                         from the segment file name
batch_position       long                         byte position of the batch in the file
codec                string                       none, gzip, snappy, lz4, zstd
date                 date                         UTC date of ``timestamp`` (partition col.)
==================== ============================ =========================================

``batches`` (one row per batch frame; headers and CRC only): see :data:`BATCHES_SCHEMA`.
Header fields are null on rows that report a frame that could not be read at all (``error``
set, e.g. a torn or impossible batch at ``position``). Timestamps there are raw
milliseconds (longs), as in Kafka's ListOffsets.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DateType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

__all__ = [
    "BATCHES_ARROW_SCHEMA",
    "BATCHES_SCHEMA",
    "RECORDS_ARROW_SCHEMA",
    "RECORDS_SCHEMA",
]

HEADER_SPARK_TYPE = ArrayType(
    StructType([StructField("key", StringType(), False), StructField("value", BinaryType(), True)]),
    containsNull=False,
)

RECORDS_SCHEMA = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("timestamp", TimestampType(), False),
        StructField("timestamp_type", IntegerType(), False),
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("headers", HEADER_SPARK_TYPE, False),
        StructField("producer_id", LongType(), False),
        StructField("producer_epoch", ShortType(), False),
        StructField("base_sequence", IntegerType(), False),
        StructField("is_transactional", BooleanType(), False),
        StructField("leader_epoch", IntegerType(), False),
        StructField("segment_base_offset", LongType(), False),
        StructField("batch_position", LongType(), False),
        StructField("codec", StringType(), False),
        StructField("date", DateType(), False),
    ]
)

BATCHES_SCHEMA = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("file", StringType(), False),  # absolute path of the .log file
        StructField("segment_base_offset", LongType(), False),
        StructField("position", LongType(), False),
        StructField("size", LongType(), True),
        StructField("base_offset", LongType(), True),
        StructField("last_offset", LongType(), True),
        StructField("record_count", IntegerType(), True),
        StructField("base_timestamp", LongType(), True),
        StructField("max_timestamp", LongType(), True),
        StructField("timestamp_type", IntegerType(), True),
        StructField("codec", StringType(), True),
        StructField("is_control", BooleanType(), True),
        StructField("is_transactional", BooleanType(), True),
        StructField("producer_id", LongType(), True),
        StructField("producer_epoch", ShortType(), True),
        StructField("base_sequence", IntegerType(), True),
        StructField("leader_epoch", IntegerType(), True),
        StructField("magic", IntegerType(), True),
        StructField("crc", LongType(), True),
        StructField("crc_valid", BooleanType(), False),
        StructField("error", StringType(), True),
    ]
)

RECORDS_ARROW_SCHEMA: pa.Schema = to_arrow_schema(RECORDS_SCHEMA, timezone="UTC")
BATCHES_ARROW_SCHEMA: pa.Schema = to_arrow_schema(BATCHES_SCHEMA, timezone="UTC")
