"""Spark sources of loglake: ``logsegments`` reads Kafka segment directories.

See :mod:`pipelines.sources.datasource` for the options and :mod:`pipelines.sources.schema`
for the row shapes.
"""

from __future__ import annotations

from pipelines.sources.datasource import (
    FORMAT,
    LogSegmentsDataSource,
    read_segments,
    register,
)
from pipelines.sources.plan import UNDECODABLE_BATCH
from pipelines.sources.schema import (
    BATCHES_ARROW_SCHEMA,
    BATCHES_SCHEMA,
    RECORDS_ARROW_SCHEMA,
    RECORDS_SCHEMA,
)

__all__ = [
    "BATCHES_ARROW_SCHEMA",
    "BATCHES_SCHEMA",
    "FORMAT",
    "RECORDS_ARROW_SCHEMA",
    "RECORDS_SCHEMA",
    "UNDECODABLE_BATCH",
    "LogSegmentsDataSource",
    "read_segments",
    "register",
]
