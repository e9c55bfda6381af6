"""Tiered storage (KIP-405): the broker copies closed segments to object storage in the Aiven
tiered-storage plugin's layout and keeps their list in ``__remote_log_metadata``.

:mod:`~logstore.tier.metadata` (Kafka's metadata records), :mod:`~logstore.tier.layout` (object
keys, indexes, manifest), :mod:`~logstore.tier.manager` (copy, retention, topic deletion),
:mod:`~logstore.tier.reads` (its remote reads), :mod:`~logstore.tier.reader` (the bytes of a
remote segment).
"""

from __future__ import annotations

from logstore.tier.manager import RemoteLogManager, TierConfig
from logstore.tier.metadata import METADATA_TOPIC

__all__ = ["METADATA_TOPIC", "RemoteLogManager", "TierConfig"]
