"""``meta.properties``: which cluster and node a log directory belongs to (Kafka's
``MetaProperties``, as ``kafka-storage format`` writes it).

Format (Java properties, version 1)::

    cluster.id=<id>       # the cluster's id, served in Metadata
    directory.id=<id>     # this directory's random id (KIP-858), 22 base64url characters
    node.id=<n>           # the node that owns the directory
    version=1

Version 0 (ZooKeeper-era Kafka) names the node ``broker.id``; both versions are read.

Why: a log directory copied from another cluster, or another node's directory, must not be
served as if it were this node's: its offsets and ids would silently mix with ours. Kafka
refuses to start then (``InconsistentClusterIdException``, "Stored node id ... doesn't match");
:func:`ensure_meta_properties` raises :class:`InconsistentClusterIdError` naming the file.

A directory without the file (new, or written by loglake before it kept one) gets one. The
cluster id is the one the other directories agree on; with none at all it is loglake's old
fixed id when a directory already holds partitions (clients keep seeing the id they saw) and a
random Kafka-style id for a new broker.

Crash behaviour: each file is written atomically; a crash between two directories leaves some
without the file, which the next start writes with the same cluster id. Called once at
start-up, before the logs load, by the broker only (tools reading a log dir never write it).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from logstore.errors import LoglakeError
from logstore.storage.files import parse_partition_dir, write_atomically
from logstore.storage.partition_metadata import (
    LEGACY_TOPIC_ID_NAMESPACE,
    format_topic_id,
    new_topic_id,
)
from logstore.storage.properties import format_properties, parse_properties

__all__ = [
    "LEGACY_CLUSTER_ID",
    "META_PROPERTIES_FILE",
    "InconsistentClusterIdError",
    "ensure_meta_properties",
]

META_PROPERTIES_FILE: Final = "meta.properties"

# the id every loglake broker served before meta.properties existed
LEGACY_CLUSTER_ID: Final = "loglake-" + uuid.uuid5(LEGACY_TOPIC_ID_NAMESPACE, "cluster").hex[:14]


class InconsistentClusterIdError(LoglakeError):
    """A log directory belongs to another cluster or another node (Kafka's
    ``InconsistentClusterIdException`` / stored node id mismatch), or its
    ``meta.properties`` is unreadable."""


def _read(path: Path) -> dict[str, str] | None:
    try:
        text = path.read_text(encoding="latin-1")
    except FileNotFoundError:
        return None
    props = parse_properties(text, source=str(path))
    version = props.get("version")
    if version not in ("0", "1"):
        raise InconsistentClusterIdError(
            f"unsupported meta.properties version {version!r} (expected 0 or 1)", path=str(path)
        )
    node_key = "node.id" if version == "1" else "broker.id"
    if not props.get("cluster.id") or node_key not in props:
        raise InconsistentClusterIdError(
            f"meta.properties version {version} needs cluster.id and {node_key}", path=str(path)
        )
    try:
        int(props[node_key])
    except ValueError:
        raise InconsistentClusterIdError(
            f"{node_key}={props[node_key]!r} is not an integer", path=str(path)
        ) from None
    props["node.id"] = props[node_key]
    return props


def _holds_partitions(d: Path) -> bool:
    return any(e.is_dir() and parse_partition_dir(e.name) for e in d.iterdir())


def ensure_meta_properties(log_dirs: Sequence[Path], *, node_id: int) -> str:
    """Check every directory's ``meta.properties`` against ``node_id`` and each other,
    write it where it is missing, and return the cluster id.

    :class:`InconsistentClusterIdError` when two directories name different clusters, or a
    directory names another node; nothing is written then."""
    found: dict[Path, dict[str, str]] = {}
    for d in log_dirs:
        props = _read(d / META_PROPERTIES_FILE)
        if props is not None:
            found[d] = props
    cluster_id: str | None = None
    first: Path | None = None
    for d, props in found.items():
        path = d / META_PROPERTIES_FILE
        if int(props["node.id"]) != node_id:
            raise InconsistentClusterIdError(
                f"stored node id {props['node.id']} doesn't match the configured node.id"
                f" {node_id}; if this directory was moved here from another node, set node.id"
                " to its id",
                path=str(path),
            )
        if cluster_id is None:
            cluster_id, first = props["cluster.id"], path
        elif props["cluster.id"] != cluster_id:
            raise InconsistentClusterIdError(
                f"the cluster ID {props['cluster.id']} doesn't match the stored cluster ID"
                f" {cluster_id} in {first}: this log directory belongs to another cluster",
                path=str(path),
            )
    if cluster_id is None:
        legacy = any(_holds_partitions(d) for d in log_dirs)
        cluster_id = LEGACY_CLUSTER_ID if legacy else format_topic_id(new_topic_id())
    for d in log_dirs:
        if d not in found:
            text = "#\n" + format_properties(
                {
                    "cluster.id": cluster_id,
                    "directory.id": format_topic_id(new_topic_id()),
                    "node.id": str(node_id),
                    "version": "1",
                }
            )
            write_atomically(d / META_PROPERTIES_FILE, text.encode("latin-1"))
    return cluster_id
