"""The ``logsegments`` Spark data source (Spark 4 Python Data Source API) and its wrapper.

``spark.read.format("logsegments").load("/var/kafka-logs")`` after :func:`register` (or just
:func:`read_segments`). ``partitions()`` runs once on the driver and plans one input partition
per segment range (:func:`pipelines.sources.plan.plan_ranges`); ``read()`` runs on the
executors and yields ``pyarrow.RecordBatch``es built by :mod:`pipelines.sources.read`, so no
row passes through Python objects. Options (strings, case-insensitive):

================== ==================================================================
kind               ``records`` (default) or ``batches``
topics             comma-separated topic names (default: every topic)
startingOffsets    ``earliest`` (default) or JSON ``{"topic": {"0": 42}}``
until              ``highWatermark`` (default: ``replication-offset-checkpoint``),
                   ``latest`` (every whole batch), or JSON like startingOffsets
                   (exclusive end offsets; unlisted partitions use the default)
minTimestamp       milliseconds; records (batches: ``max_timestamp``) before it are skipped
maxTimestamp       milliseconds; records after it are skipped (``records`` only)
maxPartitionBytes  split segments larger than this at ``.index`` entries (128 MiB)
verify             ``batches`` only: ``crc`` (default, headers + CRC) or ``full`` (decode
                   the records too, so decompression/record damage is reported)
onDecodeError      ``records`` only: ``skip`` (default) leaves out batches whose
                   records cannot be decoded; ``fail`` raises ``CorruptRecordError``
                   (message starting with ``UNDECODABLE_BATCH``) for callers that
                   quarantine them (the ingest job)
================== ==================================================================
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from pipelines.sources.plan import SegmentRange, SourceOptions, parse_options, plan_ranges
from pipelines.sources.schema import BATCHES_SCHEMA, RECORDS_SCHEMA
from pipelines.worker import start_task

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["FORMAT", "LogSegmentsDataSource", "SegmentPartition", "read_segments", "register"]

FORMAT = "logsegments"


class SegmentPartition(InputPartition):
    """An input partition carrying one :class:`SegmentRange` (pickled to an executor)."""

    def __init__(self, segment_range: SegmentRange) -> None:
        super().__init__(segment_range)
        self.range = segment_range


class LogSegmentsReader(DataSourceReader):
    """Plans on the driver, decodes on the executors. Holds only the parsed options."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        ranges = plan_ranges(self.options)
        if not ranges:
            return [InputPartition(None)]  # Spark wants at least one; it reads nothing
        return [SegmentPartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # Imported here: the driver plans without loading the decoder (numba) at all.
        from pipelines.sources.read import read_range  # noqa: PLC0415

        start_task()  # no full GC of the worker's modules between tasks
        if not isinstance(partition, SegmentPartition):
            return iter(())
        return read_range(
            partition.range,
            kind=self.options.kind,
            min_timestamp=self.options.min_timestamp,
            max_timestamp=self.options.max_timestamp,
            verify=self.options.verify,
            on_decode_error=self.options.on_decode_error,
        )


class LogSegmentsDataSource(DataSource):
    """``format("logsegments")``: Kafka segment directories as records or batches."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return BATCHES_SCHEMA if self._options().kind == "batches" else RECORDS_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return LogSegmentsReader(self._options())

    def _options(self) -> SourceOptions:
        return parse_options(dict(self.options))


def _option_text(value: object) -> str:
    if isinstance(value, dict):
        return json.dumps({t: {str(p): o for p, o in parts.items()} for t, parts in value.items()})
    if isinstance(value, (list, tuple, set, frozenset)):
        return ",".join(str(v) for v in value)
    return str(value)


def register(spark: SparkSession) -> None:
    """Make ``format("logsegments")`` known to ``spark`` (idempotent)."""
    spark.dataSource.register(LogSegmentsDataSource)


def read_segments(spark: SparkSession, log_dir: str, **options: Any) -> DataFrame:
    """``spark.read.format("logsegments").options(**options).load(log_dir)``.

    Option values may be Python values: dicts become JSON, ints and bools strings.
    """
    register(spark)
    reader = spark.read.format(FORMAT)
    for key, value in options.items():
        reader = reader.option(key, _option_text(value))
    return reader.load(log_dir)
