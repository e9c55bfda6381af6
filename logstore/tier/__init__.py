"""Tiered storage (KIP-405): the broker copies closed segments to object storage in the Aiven
tiered-storage plugin's layout and keeps their list in ``__remote_log_metadata``.

:mod:`~logstore.tier.metadata` (Kafka's metadata records), :mod:`~logstore.tier.layout` (object
keys, indexes, manifest), :mod:`~logstore.tier.manager` (copy, retention, remote reads).
"""

from __future__ import annotations

from logstore.tier.manager import RemoteLogManager, TierConfig
from logstore.tier.metadata import METADATA_TOPIC

__all__ = ["METADATA_TOPIC", "RemoteLogManager", "TierConfig"]
