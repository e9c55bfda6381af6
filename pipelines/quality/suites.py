"""The expectation suites, one per DataFrame of :mod:`pipelines.quality.checks`.

Each expectation carries a rule name in ``meta["rule"]`` (what ``quality_results`` and the
job's output call it) and a sentence in ``description`` (what Data Docs show).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import great_expectations as gx
from great_expectations import expectations as gxe

from pipelines.quality.checks import EXPLAINED
from pipelines.quality.config import QualityConfig

__all__ = [
    "CODECS",
    "TIMESTAMP_TYPES",
    "compacted_suite",
    "gaps_suite",
    "lookups_suite",
    "quarantine_suite",
    "records_suite",
    "typed_suite",
]

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
TIMESTAMP_TYPES = [0, 1]  # CreateTime, LogAppendTime


def _suite(name: str, rules: Iterable[tuple[str, str, Any]]) -> gx.ExpectationSuite:
    suite = gx.ExpectationSuite(name=name)
    for rule, description, expectation in rules:
        expectation.meta = {"rule": rule}
        expectation.description = description
        suite.add_expectation(expectation)
    return suite


def records_suite(config: QualityConfig) -> gx.ExpectationSuite:
    """``records`` (rows of ``checks.records_checked``)."""
    rules: list[tuple[str, str, Any]] = [
        (f"{c}_not_null", f"no record without a {c}", gxe.ExpectColumnValuesToNotBeNull(column=c))
        for c in ("topic", "partition", "offset")
    ]
    rules += [
        ("offset_unique", "(topic, partition, offset) is unique: no record twice",
         gxe.ExpectCompoundColumnsToBeUnique(column_list=["topic", "partition", "offset"])),
        ("partition_in_log_dirs", "every partition is in the broker's log dirs",
         gxe.ExpectColumnValuesToNotBeNull(column="log_start")),
        ("offset_at_or_after_log_start",
         "offset >= the partition's log start offset, or below it where the log held it: in "
         "segments its retention removed (retention_log) or at/after the lake's first offset "
         "of the partition (offset_lookup)",
         gxe.ExpectColumnPairValuesAToBeGreaterThanB(
             column_A="offset", column_B="lower_bound", or_equal=True)),
        ("offset_below_high_watermark", "offset < the partition's high watermark",
         gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A="upper", column_B="offset")),
        ("codec_in_domain", f"codec is one of {', '.join(CODECS)}",
         gxe.ExpectColumnValuesToBeInSet(column="codec", value_set=CODECS)),
        ("timestamp_type_in_domain", "timestamp_type is 0 (CreateTime) or 1 (LogAppendTime)",
         gxe.ExpectColumnValuesToBeInSet(column="timestamp_type", value_set=TIMESTAMP_TYPES)),
        ("timestamp_within_skew",
         "timestamp minus ingest time (s) within [-max_past_skew_s, max_future_skew_s]",
         gxe.ExpectColumnValuesToBeBetween(
             column="skew_s",
             min_value=None if config.max_past_skew_s is None else -config.max_past_skew_s,
             max_value=config.max_future_skew_s)),
    ]  # fmt: skip
    return _suite("records", rules)


def gaps_suite() -> gx.ExpectationSuite:
    """``records_gaps`` (rows of ``checks.offset_gaps``): every gap explained."""
    return _suite("records_gaps", [
        ("gaps_explained",
         f"every gap in a partition's offsets is explained ({', '.join(EXPLAINED)})",
         gxe.ExpectColumnValuesToBeInSet(column="explanation", value_set=list(EXPLAINED))),
    ])  # fmt: skip


def lookups_suite() -> gx.ExpectationSuite:
    """``lookups`` (rows of ``checks.lookup_agreement``)."""
    return _suite("lookups", [
        ("lookup_batch_present", "every batch of records has its offset_lookup row",
         gxe.ExpectColumnValuesToNotBeNull(column="lookup_first_offset")),
        ("lookup_first_offset_agrees", "the batch's first record is at or after its first offset",
         gxe.ExpectColumnPairValuesAToBeGreaterThanB(
             column_A="first_offset", column_B="lookup_first_offset", or_equal=True)),
        ("lookup_last_offset_agrees", "the batch's last record is at or before its last offset",
         gxe.ExpectColumnPairValuesAToBeGreaterThanB(
             column_A="lookup_last_offset", column_B="last_offset", or_equal=True)),
    ])  # fmt: skip


def quarantine_suite(config: QualityConfig) -> gx.ExpectationSuite:
    """``quarantine``: at most ``max_quarantined_batches`` rows."""
    return _suite("quarantine", [
        ("quarantine_under_threshold",
         f"at most {config.max_quarantined_batches} quarantined batches",
         gxe.ExpectTableRowCountToBeBetween(
             min_value=0, max_value=config.max_quarantined_batches)),
    ])  # fmt: skip


def compacted_suite(topic: str) -> gx.ExpectationSuite:
    """``topics/<topic>`` (rows of ``checks.compacted_check``)."""
    return _suite(f"topic_{topic}", [
        ("key_unique_per_partition", "one row per (partition, key)",
         gxe.ExpectCompoundColumnsToBeUnique(column_list=["partition", "key"])),
        ("no_tombstoned_key", "no key whose latest record is a tombstone",
         gxe.ExpectColumnValuesToBeInSet(column="latest_is_tombstone", value_set=[False])),
        ("offset_is_latest", "offset equals the latest offset of the key in records",
         gxe.ExpectColumnPairValuesToBeEqual(column_A="offset", column_B="latest_offset")),
    ])  # fmt: skip


def typed_suite(name: str, max_dead_letter_rate: float, *, upsert: bool) -> gx.ExpectationSuite:
    """``tables/<topic>`` (rows of ``checks.typed_check``): the topic's dead-letter rate, and
    for an upsert table (compacted or CDC topic) one row per key."""
    rules: list[tuple[str, str, Any]] = [
        ("dead_letter_rate", f"dead letters per record decoded <= {max_dead_letter_rate}",
         gxe.ExpectColumnValuesToBeBetween(column="dead_letter_rate", min_value=0,
                                           max_value=max_dead_letter_rate)),
    ]  # fmt: skip
    if upsert:
        unique = gxe.ExpectCompoundColumnsToBeUnique(column_list=["partition", "key"])
        rules.append(("key_unique", "one row per (partition, key)", unique))
    return _suite(f"typed_{name}", rules)
