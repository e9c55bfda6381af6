"""logstore.storage: Kafka-format log directories — segments, indexes, logs, recovery.

One module per on-disk concept: ``files`` (names, topic validation), ``index`` (``.index`` /
``.timeindex``), ``txn_index`` (``.txnindex``: aborted transactions), ``segment`` (one ``.log``
+ indexes), ``loader`` (clean-up and recovery at open), ``producer_snapshot`` (``.snapshot``
files), ``producer_loader`` (producer state and ``.txnindex`` rebuilt at open), ``log`` (a
partition: append, read as file slices, truncation, retention), ``checkpoints`` (Kafka's text
checkpoints, leader epochs), ``topic_config`` (per-topic overrides in the log dir),
``topic_config_defs`` (every Kafka 4.x topic config: types, rules, broker synonyms),
``config`` (``LogConfig``, the implemented ones as one value),
``properties`` (Java properties text: topic overrides and the broker config), ``log_manager``
(all partitions, locks, checkpoints, clean shutdown), ``scheduler`` and ``dirlock``.
``partition`` (the leader's rules: ``append_as_leader``, ``read`` by isolation level,
``write_txn_marker``), ``append_rules`` (timestamp window, recompression) and
``producer_state`` (idempotence, open transactions) are what the broker serves requests
through.
"""

from __future__ import annotations

from logstore.storage.config import LogConfig
from logstore.storage.files import (
    parse_partition_dir,
    partition_dir,
    segment_path,
    validate_topic,
)
from logstore.storage.index import OffsetIndex, TimeIndex
from logstore.storage.log import AppendInfo, FetchSlice, Log
from logstore.storage.log_manager import LogManager
from logstore.storage.segment import LogSegment

__all__ = [
    "AppendInfo",
    "FetchSlice",
    "Log",
    "LogConfig",
    "LogManager",
    "LogSegment",
    "OffsetIndex",
    "TimeIndex",
    "parse_partition_dir",
    "partition_dir",
    "segment_path",
    "validate_topic",
]
