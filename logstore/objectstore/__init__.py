"""The lake's storage layer: where the lake is, how to reach it, and the operations on it.

Every job reaches the lake's files through this package, on local disk and on object storage
alike (S3 tested; GCS and Azure by settings): :class:`LakeLocation` parses and joins
locations, :class:`StorageSettings` turns the standard AWS environment (plus the optional
``[storage]`` settings) into delta-rs ``storage_options`` and a pyarrow filesystem, and
:class:`ObjectStore` reads, writes, lists, deletes and puts-if-absent with bounded retries and
errors from the ``logstore.errors`` tree.
"""

from __future__ import annotations

from logstore.objectstore.location import REMOTE_SCHEMES, LakeLocation, Scheme, check_relative
from logstore.objectstore.settings import (
    OVERRIDE_KEYS,
    StorageSettings,
    delta_target,
    use_job_settings,
)
from logstore.objectstore.store import ObjectInfo, ObjectStore, open_store

__all__ = [
    "OVERRIDE_KEYS",
    "REMOTE_SCHEMES",
    "LakeLocation",
    "ObjectInfo",
    "ObjectStore",
    "Scheme",
    "StorageSettings",
    "check_relative",
    "delta_target",
    "open_store",
    "use_job_settings",
]
