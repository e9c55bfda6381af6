"""The DataFrames the quality suites validate: Spark transforms, no I/O.

Great Expectations checks columns of one DataFrame. Rules that span tables (offsets against
the log's bounds, gaps against the batches around them, lookups against records, a compacted
table against the latest record per key) are computed here with Spark into a column each, so
that a built-in expectation can state the rule on that column (decision: derived columns and
built-in expectations, not custom expectations: Data Docs render them, and the logic stays
plain Spark that is tested on its own).

Offsets below the log start (:func:`records_checked`, rule ``offset_at_or_after_log_start``).
The lake keeps rows the log has since deleted (``[retention] records = "forever"``, the
default: the broker's retention deletes only what the lake holds), so a row below the
partition's current log start is not wrong in itself. The rule: a row's offset must be at or
after its partition's ``lower_bound``, which is

1. the log start offset, when the offset is at or after it;
2. else the first offset of the ``retention_log`` rows of the log (``source = "log"``) of the
   partition, when the offset is in ``[min(segment_base_offset), max(end_offset))`` of those
   rows: the retention job removed those segments, after ingest (it deletes nothing the lake
   does not hold, unless ``--force``d, and then the lake has no rows there);
3. else the lake's own lower bound of the partition, when the offset is at or after it: the
   first offset of the partition's first batch in ``offset_lookup`` (the lookups job reads
   every batch as it is written, so the log held every offset from there up; this explains
   what the broker's own periodic retention or an operator's DeleteRecords removed);
4. else the log start offset: the row is below everything the log is known to have held (a
   log whose start had moved before the lake first read it, or a row the log never had), and
   the rule fails.

Without ``retention_log`` or ``offset_lookup`` the corresponding explanation is absent.

Gap classification (:func:`offset_gaps`). A partition's expected offsets are
``[log_start, progress)`` (progress: the next offset ingest reads). Offsets missing from
``records`` in that range, and between records below the log start, form gaps. Each gap is
cut into pieces, one row per piece and explanation:

1. below the log start offset: ``retention`` (the broker deleted those segments);
2. inside a control batch (``offset_lookup.is_control``): ``transaction_marker``;
3. inside a transactional data batch of an aborted transaction: ``aborted_transaction``
   (a ``read_committed`` ingest leaves those records out). The rule is read_committed ingest's
   (:mod:`pipelines.sources.transactions`): a transactional data batch of producer ``P``
   belongs to the transaction ended by ``P``'s next COMMIT or ABORT marker after it
   (``offset_lookup.producer_id`` and ``marker``); aborted when that marker is an ABORT;
4. inside a quarantined batch (``quarantine`` rows with offsets): ``quarantine``;
5. inside a sound data batch that holds fewer records than its offset range: ``compaction``
   (the cleaner removed records but kept the batch's offsets);
6. inside a sound data batch that holds every offset of its range: ``unexplained`` — the log
   has those records, the table does not (a committed, open or non-transactional batch, or
   one of a transaction whose marker the lookups have not reached);
7. in no batch of ``offset_lookup`` below its progress: ``compaction`` (the cleaner removed
   whole batches); at or past the lookups' progress: ``unexplained`` (nothing to tell).

Open transactions are never in a gap: a ``read_committed`` ingest stops a partition at its
last stable offset (the first offset of its earliest open transaction), so its progress,
the end of the expected range, is at or below it. Aborted transactions are judged from
``offset_lookup`` alone, not from the segment files: the lookups job reads every batch once,
as it is written, with the reader ingest uses (so both agree on which batches are sound),
and its rows outlive the segments retention deletes — a quality run needs neither a second
pass over the log (every byte read again) nor segments still being there, and a gap
is tied to its marker exactly (per producer, by offset) with a window over the transactional
batches inside gaps plus the markers (O(transactions), not O(batches)). A lookups table of an
earlier release has no ``marker`` until the lookups job next runs (it adds the column); its
rows from before stay null there, so gaps of aborted transactions in them stay unexplained
until the table is rebuilt (see :mod:`pipelines.lookups`).

Cost: a gap is joined with the batches of its partition that overlap it (an equi-join on the
partition plus a range condition): gaps are few (one per transaction, compaction hole or
retention), batches many, so the join is about gaps x batches of a partition.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as sf

from pipelines.quality.bounds import PartitionBounds

__all__ = [
    "EXPLAINED",
    "bounds_frame",
    "compacted_check",
    "local_frame",
    "lookup_agreement",
    "lookup_progress_frame",
    "lower_bounds",
    "offset_gaps",
    "records_checked",
    "typed_check",
]

EXPLAINED = ("retention", "transaction_marker", "aborted_transaction", "quarantine", "compaction")

_BOUNDS_SCHEMA = "topic string, partition int, log_start long, high_watermark long, progress long"


def local_frame(spark: SparkSession, rows: Sequence[tuple[Any, ...]], schema: str) -> DataFrame:
    """A small DataFrame of driver-side ``rows`` (``schema``: ``name type, ...`` with types
    ``string``, ``int``, ``long``), sent to the JVM as Arrow.

    Why not ``spark.createDataFrame(rows)``: rows of Python objects reach Spark as a pickled
    RDD that Python workers turn into rows, and nothing else in a quality run needs a Python
    worker: starting them cost seconds per run."""
    fields = [pa.field(name, _ARROW[kind]) for name, kind in
              (column.split() for column in schema.split(","))]  # fmt: skip
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(fields)
    arrays = [pa.array(c, f.type) for c, f in zip(columns, fields, strict=True)]
    table = pa.table(arrays, schema=pa.schema(fields))
    return spark.createDataFrame(table)


_ARROW = {"string": pa.string(), "int": pa.int32(), "long": pa.int64()}


def bounds_frame(spark: SparkSession, bounds: Sequence[PartitionBounds]) -> DataFrame:
    """The bounds as a small DataFrame (one row per partition)."""
    rows = [(b.topic, b.partition, b.log_start, b.high_watermark, b.progress) for b in bounds]
    return local_frame(spark, rows, _BOUNDS_SCHEMA)


def _ingest_time(records: DataFrame) -> Column:
    """A record's ingest time: the write time of the Parquet file holding it (Spark's
    ``_metadata.file_modification_time``); null when the table was read without Parquet files
    (then the skew rule has nothing to check)."""
    try:
        records.select("_metadata.file_modification_time").schema  # noqa: B018
    except AnalysisException:
        return sf.lit(None).cast("timestamp")
    return sf.col("_metadata.file_modification_time")


def lower_bounds(
    bounds: DataFrame, retention_log: DataFrame | None, offset_lookup: DataFrame | None
) -> DataFrame:
    """Per partition of ``bounds``: topic, partition, ``log_start``, ``upper`` (the high
    watermark, or the ingest progress where the broker wrote none: ingest never reads past the
    watermark), ``retained_from``/``retained_to`` (the offsets the log's retention removed,
    from ``retention_log``) and ``seen_from`` (the lake's lower bound: the first offset in
    ``offset_lookup``); null where there is nothing to tell. Small: one row per partition."""
    limits = bounds.select(
        "topic",
        "partition",
        "log_start",
        sf.coalesce("high_watermark", "progress").alias("upper"),
    )
    if retention_log is not None:
        retained = (
            retention_log.where(sf.col("source") == "log")
            .groupBy("topic", "partition")
            .agg(
                sf.min("segment_base_offset").alias("retained_from"),
                sf.max("end_offset").alias("retained_to"),
            )
        )
        limits = limits.join(retained, ["topic", "partition"], "left")
    else:
        limits = limits.withColumns(
            {"retained_from": sf.lit(None).cast("long"), "retained_to": sf.lit(None).cast("long")}
        )
    if offset_lookup is not None:
        seen = offset_lookup.groupBy("topic", "partition").agg(
            sf.min("first_offset").alias("seen_from")
        )
        limits = limits.join(seen, ["topic", "partition"], "left")
    else:
        limits = limits.withColumn("seen_from", sf.lit(None).cast("long"))
    return limits


def records_checked(
    records: DataFrame,
    bounds: DataFrame,
    retention_log: DataFrame | None = None,
    offset_lookup: DataFrame | None = None,
) -> DataFrame:
    """``records`` narrowed to what the ``records`` suite checks, one row per record:
    topic, partition, offset, timestamp_type, codec, ``skew_s`` (timestamp minus ingest time,
    seconds), the partition's ``log_start`` and ``upper`` (see :func:`lower_bounds`), and
    ``lower_bound``: the offset the row must be at or after (see the module doc) with
    ``lower_bound_from`` saying which bound that is (``log_start``, ``retention_log``,
    ``offset_lookup``)."""
    skew = (
        sf.unix_micros(sf.col("timestamp").cast("timestamp"))
        - sf.unix_micros(_ingest_time(records))
    ) / sf.lit(1e6)
    narrow = records.select(
        "topic", "partition", "offset", "timestamp_type", "codec", skew.alias("skew_s")
    )
    limits = lower_bounds(bounds, retention_log, offset_lookup)
    offset = sf.col("offset")
    retained = (offset >= sf.col("retained_from")) & (offset < sf.col("retained_to"))
    source = (
        sf.when(sf.col("log_start").isNull(), sf.lit(None))
        .when(offset >= sf.col("log_start"), "log_start")
        .when(retained, "retention_log")
        .when(offset >= sf.col("seen_from"), "offset_lookup")
        .otherwise("log_start")
    )
    bound = (
        sf.when(sf.col("lower_bound_from") == "retention_log", sf.col("retained_from"))
        .when(sf.col("lower_bound_from") == "offset_lookup", sf.col("seen_from"))
        .otherwise(sf.col("log_start"))
    )
    return (
        narrow.join(sf.broadcast(limits), ["topic", "partition"], "left")
        .withColumn("lower_bound_from", source)
        .withColumn("lower_bound", bound)
        .drop("retained_from", "retained_to", "seen_from")
    )


def _gaps(records: DataFrame, bounds: DataFrame) -> DataFrame:
    """Missing offset ranges ``[gap_start, gap_end)`` per partition (see the module doc)."""
    w = Window.partitionBy("topic", "partition").orderBy("offset")
    inner = (
        records.select("topic", "partition", "offset")
        .withColumn("prev", sf.lag("offset").over(w))
        .where(sf.col("offset") - sf.col("prev") > 1)
        .select("topic", "partition", (sf.col("prev") + 1).alias("gap_start"),
                sf.col("offset").alias("gap_end"))
    )  # fmt: skip
    ends = records.groupBy("topic", "partition").agg(
        sf.min("offset").alias("first"), sf.max("offset").alias("last")
    )
    edges = bounds.join(ends, ["topic", "partition"], "left")
    leading = edges.select(
        "topic",
        "partition",
        sf.col("log_start").alias("gap_start"),
        sf.coalesce("first", "progress").alias("gap_end"),
    )
    trailing = edges.where(sf.col("last").isNotNull()).select(
        "topic", "partition", (sf.col("last") + 1).alias("gap_start"),
        sf.col("progress").alias("gap_end"),
    )  # fmt: skip
    return (
        inner.unionByName(leading)
        .unionByName(trailing)
        .where(sf.col("gap_end").isNotNull() & (sf.col("gap_end") > sf.col("gap_start")))
    )


def _overlap(lo: Column, hi: Column) -> Column:
    """Offsets of ``[lo, hi)`` that are in ``[piece_start, gap_end)`` (0 when disjoint)."""
    return sf.greatest(
        sf.lit(0),
        sf.least(hi, sf.col("gap_end")) - sf.greatest(lo, sf.col("piece_start")),
    )


def _aborted_batches(offset_lookup: DataFrame, gaps: DataFrame) -> DataFrame | None:
    """(topic, partition, first_offset, ``aborted`` True) of the transactional data batches
    of ``offset_lookup`` that overlap a gap and whose producer's next COMMIT/ABORT marker is
    an ABORT; None when the table has no ``marker`` column (an earlier release's)."""
    if not {"marker", "producer_id", "is_transactional"} <= set(offset_lookup.columns):
        return None
    in_gaps = (
        offset_lookup.where(sf.col("is_transactional") & ~sf.col("is_control"))
        .select("topic", "partition", "producer_id", "first_offset", "last_offset")
        .join(gaps.select("topic", "partition", "piece_start", "gap_end"),
              ["topic", "partition"])
        .where((sf.col("first_offset") < sf.col("gap_end"))
               & (sf.col("last_offset") >= sf.col("piece_start")))
        .select("topic", "partition", "producer_id", "first_offset",
                sf.lit(None).cast("string").alias("marker"))
        .distinct()
    )  # fmt: skip
    markers = offset_lookup.where(
        sf.col("is_control") & sf.col("marker").isin("commit", "abort")
    ).select("topic", "partition", "producer_id", "first_offset", "marker")
    after = (
        Window.partitionBy("topic", "partition", "producer_id")
        .orderBy("first_offset")
        .rowsBetween(1, Window.unboundedFollowing)
    )
    return (
        in_gaps.unionByName(markers)
        .withColumn("next_marker", sf.first("marker", ignorenulls=True).over(after))
        .where(sf.col("marker").isNull() & (sf.col("next_marker") == "abort"))
        .select("topic", "partition", "first_offset", sf.lit(True).alias("aborted"))
        .distinct()
    )


def offset_gaps(
    records: DataFrame,
    bounds: DataFrame,
    offset_lookup: DataFrame | None,
    quarantine: DataFrame | None,
    lookup_progress: DataFrame | None = None,
) -> DataFrame:
    """One row per (gap, explanation): topic, partition, gap_start, gap_end, ``gap`` (text),
    ``explanation`` and ``offsets`` (how many of the gap's offsets it explains).

    ``lookup_progress`` (topic, partition, next_offset) is how far ``offset_lookup`` was built;
    without it the lookups are taken to cover the whole progress range.
    """
    spark = records.sparkSession
    gaps = (
        _gaps(records, bounds)
        .join(bounds.select("topic", "partition", "log_start"), ["topic", "partition"])
        .withColumn("piece_start", sf.greatest("gap_start", "log_start"))
        .withColumn(
            "gap",
            sf.format_string("%s/%d [%d, %d)", "topic", "partition", "gap_start", "gap_end"),
        )
    )
    retention = gaps.select(
        "topic", "partition", "gap_start", "gap_end", "gap",
        sf.lit("retention").alias("explanation"),
        (sf.least("gap_end", "log_start") - sf.col("gap_start")).alias("offsets"),
    ).where(sf.col("offsets") > 0)  # fmt: skip

    intervals: list[DataFrame] = []
    if offset_lookup is not None:
        size = sf.col("last_offset") - sf.col("first_offset") + 1
        aborted = _aborted_batches(offset_lookup, gaps)
        if aborted is None:
            offset_lookup = offset_lookup.withColumn("aborted", sf.lit(False))
        else:
            offset_lookup = offset_lookup.join(
                sf.broadcast(aborted), ["topic", "partition", "first_offset"], "left"
            )
        kind = (
            sf.when(sf.col("is_control"), "transaction_marker")
            .when(sf.coalesce("aborted", sf.lit(False)), "aborted_transaction")
            .when(sf.col("record_count") < size, "compaction")
            .otherwise("unexplained")
        )
        intervals.append(
            offset_lookup.select(
                "topic", "partition", sf.col("first_offset").alias("lo"),
                (sf.col("last_offset") + 1).alias("hi"), kind.alias("kind"),
            )
        )  # fmt: skip
    if quarantine is not None:
        intervals.append(
            quarantine.where(sf.col("base_offset").isNotNull() & sf.col("last_offset").isNotNull())
            .select("topic", "partition", sf.col("base_offset").alias("lo"),
                    (sf.col("last_offset") + 1).alias("hi"), sf.lit("quarantine").alias("kind"))
        )  # fmt: skip
    keys = ["topic", "partition", "gap_start", "gap_end", "gap"]
    if intervals:
        batches = intervals[0]
        for more in intervals[1:]:
            batches = batches.unionByName(more)
        pieces = (
            gaps.join(batches, ["topic", "partition"])
            .where((sf.col("lo") < sf.col("gap_end")) & (sf.col("hi") > sf.col("piece_start")))
            .groupBy(*keys, sf.col("kind").alias("explanation"))
            .agg(sf.sum(_overlap(sf.col("lo"), sf.col("hi"))).alias("offsets"))
            .where(sf.col("offsets") > 0)
        )
    else:
        pieces = local_frame(
            spark, [], "topic string, partition int, gap_start long, gap_end long, gap string, "
            "explanation string, offsets long",
        )  # fmt: skip
    covered = pieces.groupBy(*keys).agg(sf.sum("offsets").alias("covered"))
    rest = (
        gaps.join(covered, keys, "left")
        .withColumn(
            "offsets",
            sf.col("gap_end") - sf.col("piece_start") - sf.coalesce("covered", sf.lit(0)),
        )
        .where(sf.col("offsets") > 0)
    )
    if offset_lookup is None:
        uncovered = rest.select(*keys, sf.lit("unexplained").alias("explanation"), "offsets")
    else:
        # Offsets in no batch: removed from the log by the cleaner, as far as the lookups
        # were built; past that the lookups cannot tell.
        built = (
            lookup_progress.select("topic", "partition", sf.col("next_offset").alias("built"))
            if lookup_progress is not None
            else bounds.select("topic", "partition", sf.col("progress").alias("built"))
        )
        uncovered = (
            rest.join(built, ["topic", "partition"], "left")
            .withColumn("built", sf.coalesce("built", sf.lit(0)))
            .withColumn(
                "explanation",
                sf.when(sf.col("gap_end") <= sf.col("built"), "compaction").otherwise(
                    "unexplained"
                ),
            )
            .select(*keys, "explanation", "offsets")
        )
    return retention.unionByName(pieces).unionByName(uncovered)


def lookup_agreement(records: DataFrame, offset_lookup: DataFrame) -> DataFrame:
    """One row per batch of ``records`` (by segment and position): its first and last offset
    and record count, with the ``offset_lookup`` row of that batch (null columns: none).

    Records read through Fetch (no log dirs) have no segment nor position (-1): each goes to
    the ``offset_lookup`` row whose offsets hold it (one row per such batch; a record in no
    batch of the table is a row of its own, with null lookup columns)."""
    return _by_position(records.where(sf.col("batch_position") >= 0), offset_lookup).unionByName(
        _by_offsets(records.where(sf.col("batch_position") < 0), offset_lookup)
    )


def _by_offsets(records: DataFrame, offset_lookup: DataFrame) -> DataFrame:
    lookup = offset_lookup.select(
        sf.col("topic").alias("l_topic"), sf.col("partition").alias("l_partition"),
        sf.col("first_offset").alias("lookup_first_offset"),
        sf.col("last_offset").alias("lookup_last_offset"),
        sf.col("record_count").alias("lookup_record_count"),
    )  # fmt: skip
    held = (
        (sf.col("topic") == sf.col("l_topic"))
        & (sf.col("partition") == sf.col("l_partition"))
        & sf.col("offset").between(sf.col("lookup_first_offset"), sf.col("lookup_last_offset"))
    )
    joined = records.select("topic", "partition", "offset").join(lookup, held, "left")
    batch = sf.coalesce("lookup_first_offset", "offset")  # a record in no batch: a row of its own
    rows = joined.groupBy(
        "topic", "partition", batch.alias("batch"),
        "lookup_first_offset", "lookup_last_offset", "lookup_record_count",
    ).agg(
        sf.min("offset").alias("first_offset"), sf.max("offset").alias("last_offset"),
        sf.count(sf.lit(1)).alias("records"),
    )  # fmt: skip
    none = sf.lit(-1).cast("long")
    return rows.select(
        "topic", "partition", none.alias("segment"), none.alias("position"),
        "first_offset", "last_offset", "records",
        "lookup_first_offset", "lookup_last_offset", "lookup_record_count",
    )  # fmt: skip


def _by_position(records: DataFrame, offset_lookup: DataFrame) -> DataFrame:
    batches = records.groupBy(
        "topic", "partition", sf.col("segment_base_offset").alias("segment"),
        sf.col("batch_position").alias("position"),
    ).agg(
        sf.min("offset").alias("first_offset"), sf.max("offset").alias("last_offset"),
        sf.count(sf.lit(1)).alias("records"),
    )  # fmt: skip
    lookup = offset_lookup.select(
        "topic", "partition", "segment", "position",
        sf.col("first_offset").alias("lookup_first_offset"),
        sf.col("last_offset").alias("lookup_last_offset"),
        sf.col("record_count").alias("lookup_record_count"),
    )  # fmt: skip
    return batches.join(lookup, ["topic", "partition", "segment", "position"], "left")


def compacted_check(table: DataFrame, records: DataFrame, topic: str) -> DataFrame:
    """A compacted topic table's rows (partition, key, offset) with the latest record of that
    key in ``records``: ``latest_offset`` and ``latest_is_tombstone`` (null: key not there)."""
    latest = (
        records.where((sf.col("topic") == topic) & sf.col("key").isNotNull())
        .groupBy("partition", "key")
        .agg(
            sf.max("offset").alias("latest_offset"),
            sf.max_by(sf.col("value").isNull(), sf.col("offset")).alias("latest_is_tombstone"),
        )
    )
    return table.select("partition", "key", "offset").join(latest, ["partition", "key"], "left")


def lookup_progress_frame(spark: SparkSession, apps: Mapping[str, int]) -> DataFrame:
    """``offset_lookup``'s app transactions (``offset_lookup:<topic>-<partition>``) as rows."""
    rows = []
    for app, version in apps.items():
        name, _, tp = app.partition(":")
        topic, _, part = tp.rpartition("-")
        if name == "offset_lookup" and topic and part.isdigit():
            rows.append((topic, int(part), int(version)))
    return local_frame(spark, rows, "topic string, partition int, next_offset long")


def typed_check(
    table: DataFrame, records: DataFrame, dead_letters: DataFrame | None, topic: str,
    progress: Mapping[int, int],
) -> DataFrame:  # fmt: skip
    """A typed table's rows (``partition``, ``key`` from ``_kafka``) with the topic's
    ``dead_letter_rate``: its dead letters per record of ``records`` below the table's progress
    (``progress``: partition -> next offset); one row of nulls but the rate when the table is
    empty, so that the rate is checked anyway."""
    spark = table.sparkSession
    bounds = local_frame(spark, list(progress.items()), "partition int, next_offset long")
    decoded = (
        records.where(sf.col("topic") == topic).join(bounds, "partition")
        .where(sf.col("offset") < sf.col("next_offset")).count()
    )  # fmt: skip
    dead = dead_letters.where(sf.col("topic") == topic).count() if dead_letters is not None else 0
    rate = dead / decoded if decoded else 0.0
    rows = table.select(
        sf.col("_kafka.partition").alias("partition"), sf.col("_kafka.key").alias("key")
    )
    empty = local_frame(spark, [(None,)], "partition int").withColumn(
        "key", sf.lit(None).cast("binary")
    )
    return (rows if not rows.isEmpty() else empty).withColumn("dead_letter_rate", sf.lit(rate))
