"""Per-topic config overrides stored in the log directory, so the directory describes itself.

File: ``<log_dir>/topic-configs/<topic>.properties``, Java properties text (ISO-8859-1 with
``\\uXXXX`` escapes for anything else, as ``java.util.Properties.store`` writes; read and
written by :mod:`logstore.storage.properties`, which parses the broker config too), one
``key=value`` line per override of a Kafka topic-level config (``segment.bytes``,
``cleanup.policy``, ...). Only the overrides are stored; defaults come from the broker.

Writes are atomic (tmp, fsync, rename, directory fsync). Spark jobs read these files to know a
topic's cleanup policy and retention. Topic names are validated before they become file names,
so nothing here can write outside ``<log_dir>/topic-configs``. Thread-safe for distinct topics.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from logstore.errors import LoglakeError
from logstore.storage.files import fsync_dir, validate_topic, write_atomically
from logstore.storage.properties import format_properties, parse_properties

__all__ = [
    "TOPIC_CONFIG_DIR",
    "delete_topic_config",
    "format_properties",
    "is_compacted",
    "parse_properties",
    "read_topic_config",
    "read_topic_configs",
    "topic_config_path",
    "write_topic_config",
]

TOPIC_CONFIG_DIR = "topic-configs"
_SUFFIX = ".properties"


def is_compacted(props: Mapping[str, str]) -> bool:
    """Whether a topic's configs (a ``.properties`` file's, or DescribeConfigs') make it a
    compacted topic: ``cleanup.policy`` lists ``compact`` (alone or with ``delete``)."""
    return "compact" in {p.strip() for p in props.get("cleanup.policy", "").split(",")}


def topic_config_path(log_dir: str | os.PathLike[str], topic: str) -> Path:
    """``<log_dir>/topic-configs/<topic>.properties`` (topic validated first)."""
    return Path(log_dir) / TOPIC_CONFIG_DIR / (validate_topic(topic) + _SUFFIX)


def write_topic_config(
    log_dir: str | os.PathLike[str], topic: str, props: Mapping[str, str]
) -> None:
    """Replace ``topic``'s overrides with ``props`` atomically."""
    path = topic_config_path(log_dir, topic)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, format_properties(props).encode("ascii"))


def read_topic_config(log_dir: str | os.PathLike[str], topic: str) -> dict[str, str]:
    """``topic``'s overrides; ``{}`` when it has none."""
    try:
        text = topic_config_path(log_dir, topic).read_bytes().decode("latin-1")
    except FileNotFoundError:
        return {}
    return parse_properties(text, source=str(topic_config_path(log_dir, topic)))


def read_topic_configs(log_dir: str | os.PathLike[str]) -> dict[str, dict[str, str]]:
    """``{topic: overrides}`` for every valid ``<topic>.properties`` file in the log dir."""
    root = Path(log_dir) / TOPIC_CONFIG_DIR
    out: dict[str, dict[str, str]] = {}
    if not root.is_dir():
        return out
    for entry in sorted(root.iterdir()):
        if not entry.name.endswith(_SUFFIX) or not entry.is_file():
            continue
        topic = entry.name[: -len(_SUFFIX)]
        try:
            validate_topic(topic)
        except LoglakeError:
            continue
        out[topic] = parse_properties(entry.read_bytes().decode("latin-1"), source=str(entry))
    return out


def delete_topic_config(log_dir: str | os.PathLike[str], topic: str) -> None:
    """Remove ``topic``'s overrides file (no error if absent)."""
    path = topic_config_path(log_dir, topic)
    try:
        path.unlink()
    except FileNotFoundError:
        return
    fsync_dir(path.parent)
